// The comparison's cohort side (bench/compare/run): the reference Fashion-MNIST CNN trained on the
// same data, batch per rank, optimizer and epochs as bench/compare/train_torch.py, either through
// cohort (mpirun -np N ./compare_cohort_cnn) or as a plain LibTorch loop in one process
// (./compare_cohort_cnn --plain), the C++ baseline. Rank 0 prints JSON lines on stdout:
//   {"event":"first_step","wall_s":...}   wall clock (Unix seconds) when the first step ended
//   {"event":"done","steady_samples_per_s":...,"test_accuracy":...,"ranks":...,"libtorch":"...",
//    "link_mb_per_s":...,"on_thread":...}   rank 0's estimate of its links' rate each way (0: none
//    told it), and whether its buckets were reduced on a communication thread at the end
// Flags: --data DIR --epochs N --max-train N --batch N (per rank) --warmup-steps N --prefetch N (batches the
// loader prepares ahead on its thread; 0: none, on the training thread) --storage DIR --plain
// --model cnn|mlp (mlp: 784->2048->2048->10 with ReLUs, 5.8 M parameters, 23 MB of gradients per
// step against the CNN's 1.7 MB: where the all-reduce, not the computation, sets the pace)
// --reduce-on automatic|thread|training (model_options::reduce_on: cohort::reduce_on::automatic,
// communication_thread or training_thread) --compression none|bf16|fp16 (model_options::compression:
// gradients travel as bfloat16 or float16, as DDP's bf16_compress_hook and fp16_compress_hook)
#include <cohort/cohort.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "fashion_mnist_net.hpp"

namespace {

struct settings {
  std::string data_dir = default_fashion_mnist_dir;
  int epochs = 1;
  std::int64_t max_train = 0;
  int batch = 64;
  int warmup_steps = 10;  // steps left out of the steady rate (first-touch allocations, thread pools)
  std::size_t prefetch = 4;  // as examples/fashion_mnist.cpp
  std::string storage = "compare_runs";
  bool plain = false;
  std::string model = "cnn";
  cohort::reduce_on reduce_on = cohort::reduce_on::automatic;
  cohort::gradient_compression compression = cohort::gradient_compression::none;
};

/// The communication-bound model: 784 -> 2048 -> 2048 -> 10, ReLUs (bench/compare/train_torch.py's MLP).
struct wide_mlpImpl : torch::nn::Module {
  wide_mlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(28 * 28, 2048))),
        fc2(register_module("fc2", torch::nn::Linear(2048, 2048))),
        fc3(register_module("fc3", torch::nn::Linear(2048, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x.flatten(1)))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(wide_mlp);

double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Counts steps and times the steady part: from the end of step `warmup` to the last step.
struct step_clock {
  int warmup;
  std::int64_t steps = 0;
  std::chrono::steady_clock::time_point steady_start{};
  double steady_s = 0;
  void after_step() {
    ++steps;
    auto now = std::chrono::steady_clock::now();
    if (steps == 1) std::printf("{\"event\":\"first_step\",\"wall_s\":%.6f}\n", wall_s()), std::fflush(stdout);
    if (steps == warmup) steady_start = now;
    if (steps > warmup) steady_s = std::chrono::duration<double>(now - steady_start).count();
  }
  double samples_per_s(int batch, int ranks) const {
    return steps > warmup && steady_s > 0 ? static_cast<double>((steps - warmup) * batch * ranks) / steady_s : 0.0;
  }
};

void print_done(double samples_per_s, double accuracy, int ranks, std::int64_t steps, bool on_thread = false) {
  std::printf("{\"event\":\"done\",\"steady_samples_per_s\":%.3f,\"test_accuracy\":%.4f,\"ranks\":%d,\"steps_per_rank\":%lld,\"libtorch\":\"%s\",\"link_mb_per_s\":%.1f,\"on_thread\":%s}\n",
              samples_per_s, accuracy, ranks, static_cast<long long>(steps), TORCH_VERSION,
              cohort::comm::detail::link_rate().load() / 1e6, on_thread ? "true" : "false");
}

/// The baseline: one process, a shuffled pass over the data per epoch, no cohort.
template <class Net>
int plain(settings const& s, cohort::tensor_dataset const& train, cohort::tensor_dataset const& test) {
  torch::manual_seed(0);
  Net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  step_clock clock{.warmup = s.warmup_steps};
  auto const n = train.inputs.size(0);
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    net->train();
    auto order = torch::randperm(n, torch::kLong);
    for (std::int64_t b = 0; b + s.batch <= n; b += s.batch) {
      auto idx = order.narrow(0, b, s.batch);
      opt.zero_grad();
      torch::cross_entropy_loss(net(train.inputs.index_select(0, idx)), train.targets.index_select(0, idx)).backward();
      opt.step();
      clock.after_step();
    }
  }
  double rate = clock.samples_per_s(s.batch, 1);
  double accuracy = static_cast<double>(count_correct(net, test, 0, test.inputs.size(0))) / static_cast<double>(test.inputs.size(0));
  print_done(rate, accuracy, 1, clock.steps);
  return 0;
}

/// Through cohort, on every rank of MPI_COMM_WORLD.
template <class Net>
int distributed(settings const& s, cohort::tensor_dataset const& train, cohort::tensor_dataset const& test) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  auto fn = [&](cohort::context& ctx) {
    torch::manual_seed(0);
    auto model = ctx.prepare_model(Net(), {.reduce_on = s.reduce_on, .compression = s.compression});
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto& loader = ctx.dataset_shard("train", {.batch_size = s.batch, .prefetch_batches = s.prefetch});
    step_clock clock{.warmup = s.warmup_steps};
    while (loader.state().epoch < s.epochs) {
      model->train();
      for (auto& b : loader.epoch()) {
        opt.zero_grad();
        torch::cross_entropy_loss(model(b.inputs), b.targets).backward();
        opt.step();
        if (ctx.world_rank() == 0) clock.after_step();
      }
      ctx.report({{"epoch", loader.state().epoch}});
    }
    if (ctx.world_rank() == 0) {
      double accuracy = static_cast<double>(count_correct(model, test, 0, test.inputs.size(0))) / static_cast<double>(test.inputs.size(0));
      print_done(clock.samples_per_s(s.batch, ctx.world_size()), accuracy, ctx.world_size(), clock.steps,
                 model.reducer() && model.reducer()->on_communication_thread());
    }
  };
  cohort::trainer trainer{fn, cohort::datasets{{"train", train}}, cohort::scaling::cpu{.num_workers = ranks},
                          cohort::sharding::shuffled{.seed = 42}};
  auto result = trainer.fit(nlohmann::json::object(), {.name = "compare", .storage_path = s.storage, .verbose = 0});
  return result.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--plain") {
      s.plain = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << "error: " << flag << " needs a value\n";
      return 2;
    }
    std::string value = argv[++i];
    if (flag == "--data") s.data_dir = value;
    else if (flag == "--epochs") s.epochs = std::stoi(value);
    else if (flag == "--max-train") s.max_train = std::stoll(value);
    else if (flag == "--batch") s.batch = std::stoi(value);
    else if (flag == "--warmup-steps") s.warmup_steps = std::stoi(value);
    else if (flag == "--storage") s.storage = value;
    else if (flag == "--prefetch") s.prefetch = std::stoul(value);
    else if (flag == "--model" && (value == "cnn" || value == "mlp")) s.model = value;
    else if (flag == "--reduce-on" && value == "automatic") s.reduce_on = cohort::reduce_on::automatic;
    else if (flag == "--reduce-on" && value == "thread") s.reduce_on = cohort::reduce_on::communication_thread;
    else if (flag == "--reduce-on" && value == "training") s.reduce_on = cohort::reduce_on::training_thread;
    else if (flag == "--compression" && value == "none") s.compression = cohort::gradient_compression::none;
    else if (flag == "--compression" && value == "bf16") s.compression = cohort::gradient_compression::bfloat16;
    else if (flag == "--compression" && value == "fp16") s.compression = cohort::gradient_compression::float16;
    else {
      std::cerr << "error: unknown flag " << flag << " " << value
                << ": use --data, --epochs, --max-train, --batch, --warmup-steps, --prefetch, --storage, --model cnn|mlp, "
                   "--reduce-on automatic|thread|training, --compression none|bf16|fp16 or --plain\n";
      return 2;
    }
  }
  cohort::environment env{argc, argv};
  auto train = first_n(load_fashion_mnist(s.data_dir, "train"), s.max_train);
  auto test = load_fashion_mnist(s.data_dir, "t10k");
  bool const mlp = s.model == "mlp";
  if (s.plain) return mlp ? plain<wide_mlp>(s, train, test) : plain<fashion_net>(s, train, test);
  return mlp ? distributed<wide_mlp>(s, train, test) : distributed<fashion_net>(s, train, test);
}
