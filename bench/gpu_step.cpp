// Step time through cohort vs a plain LibTorch loop on the same model, in the same process with
// the same settings (TF32 matmuls on), on one GPU (scripts/gpu-check runs it):
//   ./bench_gpu_step [--models small,large,transformer] [--rounds R] [--steps S] [--device auto|cpu|cuda]
// Each model is trained three ways, in alternated rounds of S steps (so drift hits all alike; each
// way goes first in turn):
//   plain        a hand-written loop: zero_grad, forward, loss, backward, SGD step
//   cohort       the same loop on ctx.prepare_model(model) inside a trainer with scaling::cuda,
//                as a one-GPU user runs it (one rank: no gradient all-reduce)
//   cohort_nccl  the same, with the NCCL gradient path forced on (buckets as .grad, all-reduces of
//                a one-rank NCCL communicator on a side stream ordered by events): everything a
//                rank of a multi-GPU job does per step but the network (built with cohort::nccl)
// A round's time is taken between two device synchronisations; the figure is the median over
// rounds of the time per step. One JSON line per model: the three figures and the overheads, and
// the plain step's phases (forward with the loss, backward, optimizer step; each timed between
// two synchronisations, so their sum exceeds the step) for the scaling model's shares.
// Models: small = MLP 1024-256-256-10, batch 64; large = MLP 1024-4x4096-10, batch 256;
// transformer = 12 encoder layers, d 768, 12 heads, feed-forward 3072, vocabulary 8192 (98M
// parameters), batch 16, sequence 256, forward under autocast bfloat16.
// Without a GPU it runs on the CPU (default: the small MLP only; the figures then say nothing of
// the GPU goal and the JSON says "device":"cpu").
#include <cohort/cohort.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct mlpImpl : torch::nn::Module {
  mlpImpl(std::int64_t in, std::vector<std::int64_t> hidden, std::int64_t out) {
    auto width = in;
    for (std::size_t i = 0; i < hidden.size(); ++i) {
      layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(width, hidden[i])));
      width = hidden[i];
    }
    head = register_module("head", torch::nn::Linear(width, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return head(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(mlp);

struct transformerImpl : torch::nn::Module {
  static constexpr std::int64_t vocab = 8192, width = 768, heads = 12, feed_forward = 3072, depth = 12;
  transformerImpl()
      : embed(register_module("embed", torch::nn::Embedding(vocab, width))),
        encoder(register_module(
            "encoder", torch::nn::TransformerEncoder(
                           torch::nn::TransformerEncoderOptions(
                               torch::nn::TransformerEncoderLayerOptions(width, heads).dim_feedforward(feed_forward).dropout(0.0),
                               depth)))),
        head(register_module("head", torch::nn::Linear(width, vocab))) {}
  /// tokens: (sequence, batch) -> logits (sequence * batch, vocab)
  torch::Tensor forward(torch::Tensor tokens) { return head(encoder(embed(tokens))).reshape({-1, vocab}); }
  torch::nn::Embedding embed;
  torch::nn::TransformerEncoder encoder;
  torch::nn::Linear head;
};
TORCH_MODULE(transformer);

struct options {
  std::string device = "auto";  ///< auto: CUDA where LibTorch sees a GPU
  std::vector<std::string> models;
  int rounds = 15;
  int steps = 0;  ///< per round; 0: the model's default
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void synchronize(torch::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

/// One way of training a model: a step function over its own copy of the parameters.
struct variant {
  std::string name;
  std::function<void()> step;
  std::vector<double> ms_per_step;
};

torch::Tensor cross_entropy(torch::Tensor const& logits, torch::Tensor const& labels) {
  return torch::nn::functional::cross_entropy(logits, labels);
}

/// Builds the three variants of one model on `ctx` and times them in alternated rounds.
template <class Net>
nlohmann::json measure(cohort::context& ctx, std::string const& name, std::function<Net()> make, torch::Tensor x,
                       torch::Tensor y, bool bf16, int steps, int rounds) {
  auto const device = cohort::to_torch(ctx.device());
  x = x.to(device);
  y = y.to(device);
  auto make_on_device = [&] {
    torch::manual_seed(1);
    Net n = make();
    n->to(device);
    return n;
  };
  auto run_step = [x, y, bf16, dev = ctx.device()](auto& forward, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::Tensor l;
    {
      std::optional<cohort::autocast> guard;  // the forward in bfloat16 where asked
      if (bf16) guard.emplace(dev);
      l = cross_entropy(forward(x), y);
    }
    l.backward();
    opt.step();
  };
  auto sgd = [](std::vector<torch::Tensor> p) { return std::make_shared<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01).momentum(0.9)); };

  Net plain_net = make_on_device();
  auto plain_opt = sgd(plain_net->parameters());
  auto prepared = ctx.prepare_model(make_on_device());
  auto prepared_opt = sgd(prepared->parameters());
  std::vector<variant> variants;
  variants.push_back({"plain", [&] { run_step(plain_net, *plain_opt); }, {}});
  variants.push_back({"cohort", [&] { run_step(prepared, *prepared_opt); }, {}});
#if COHORT_WITH_NCCL
  Net nccl_net = make_on_device();
  auto nccl_opt = sgd(nccl_net->parameters());
  std::unique_ptr<cohort::detail::gradient_reducer> reducer;
  if (device.is_cuda()) {
    cohort::model_options knobs;
    reducer = std::make_unique<cohort::detail::gradient_reducer>(
        ctx.comm(), nccl_net->parameters(), knobs, cohort::reduce_on::training_thread, cohort::detail::make_device_buckets(ctx.comm(), device.index(), ctx.collective_timeout_ms()));
    variants.push_back({"cohort_nccl", [&] { run_step(nccl_net, *nccl_opt); }, {}});
  }
#endif
  for (auto& v : variants)
    for (int i = 0; i < 5; ++i) v.step();  // warm-up: allocator, cuBLAS handles, autotuning
  synchronize(device);
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < variants.size(); ++k) {
      auto& v = variants[(static_cast<std::size_t>(r) + k) % variants.size()];  // each goes first in turn
      synchronize(device);
      auto const t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) v.step();
      synchronize(device);
      v.ms_per_step.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
  // The plain step's phases, each between two device synchronisations (the scaling model's
  // backward and optimizer shares): zero_grad + forward + loss, backward, optimizer step.
  std::vector<double> forward_ms, backward_ms, optimizer_ms;
  for (int s = 0; s < std::max(steps, 5); ++s) {
    auto ms_since = [&](auto& t) {
      synchronize(device);
      auto const now = std::chrono::steady_clock::now();
      double const ms = std::chrono::duration<double, std::milli>(now - t).count();
      t = now;
      return ms;
    };
    synchronize(device);
    auto t = std::chrono::steady_clock::now();
    plain_opt->zero_grad();
    torch::Tensor l;
    {
      std::optional<cohort::autocast> guard;
      if (bf16) guard.emplace(ctx.device());
      l = cross_entropy(plain_net->forward(x), y);
    }
    forward_ms.push_back(ms_since(t));
    l.backward();
    backward_ms.push_back(ms_since(t));
    plain_opt->step();
    optimizer_ms.push_back(ms_since(t));
  }
  std::int64_t params = 0;
  for (auto const& p : plain_net->parameters()) params += p.numel();
  nlohmann::json out{{"model", name}, {"parameters", params}, {"device", ctx.device().str()}, {"steps_per_round", steps},
                     {"rounds", rounds}};
  double const plain_ms = median(variants[0].ms_per_step);
  for (auto const& v : variants) {
    out[v.name + "_ms"] = median(v.ms_per_step);
    if (v.name != "plain") out[v.name + "_overhead_pct"] = (median(v.ms_per_step) / plain_ms - 1) * 100;
  }
  out["plain_forward_ms"] = median(forward_ms);
  out["plain_backward_ms"] = median(backward_ms);
  out["plain_optimizer_ms"] = median(optimizer_ms);
  if (!out.contains("cohort_nccl_ms")) out["cohort_nccl"] = device.is_cuda() ? "not built (no cohort::nccl)" : "needs a GPU";
  return out;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw cohort::error(a + " needs a value: see the usage at the top of bench/gpu_step.cpp");
      return std::string(argv[++i]);
    };
    if (a == "--models") {
      std::istringstream in(value());
      for (std::string m; std::getline(in, m, ',');) o.models.push_back(m);
    } else if (a == "--rounds") {
      o.rounds = std::stoi(value());
    } else if (a == "--steps") {
      o.steps = std::stoi(value());
    } else if (a == "--device") {
      o.device = value();
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
        throw cohort::error("--device " + o.device + ": use auto, cpu or cuda");
    } else {
      throw cohort::error("unknown argument " + a + ": use --models small,large,transformer --rounds R --steps S --device auto|cpu|cuda");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  auto opts = parse(argc, argv);
  bool const gpu = opts.device == "cuda" || (opts.device == "auto" && torch::cuda::is_available());
  if (opts.models.empty()) opts.models = gpu ? std::vector<std::string>{"small", "large", "transformer"} : std::vector<std::string>{"small"};
  at::globalContext().setFloat32MatmulPrecision("high");  // TF32 matmuls, for both sides
  auto body = [&](cohort::context& ctx) {
    for (auto const& m : opts.models) {
      nlohmann::json r;
      if (m == "small") {
        r = measure<mlp>(ctx, "mlp 1024-256-256-10, batch 64", [] { return mlp(1024, std::vector<std::int64_t>{256, 256}, 10); },
                         torch::randn({64, 1024}), torch::randint(0, 10, {64}), false,
                         opts.steps > 0 ? opts.steps : 200, opts.rounds);
      } else if (m == "large") {
        r = measure<mlp>(ctx, "mlp 1024-4x4096-10, batch 256",
                         [] { return mlp(1024, std::vector<std::int64_t>{4096, 4096, 4096, 4096}, 10); },
                         torch::randn({256, 1024}), torch::randint(0, 10, {256}), false,
                         opts.steps > 0 ? opts.steps : 50, opts.rounds);
      } else if (m == "transformer") {
        auto tokens = torch::randint(0, transformerImpl::vocab, {257, 16});
        r = measure<transformer>(ctx, "transformer 98M bf16, batch 16, sequence 256", [] { return transformer(); },
                                 tokens.narrow(0, 0, 256), tokens.narrow(0, 1, 256).reshape({-1}),
                                 true, opts.steps > 0 ? opts.steps : 10, opts.rounds);
      } else {
        throw cohort::error("unknown model " + m + ": use small, large or transformer");
      }
      if (ctx.world_rank() == 0) std::printf("%s\n", r.dump().c_str());
      std::fflush(stdout);
    }
  };
  cohort::run_config run{.name = "", .storage_path = "/tmp/cohort_bench", .verbose = 0};
  auto report = [](auto const& result) {
    if (result.ok()) return 0;
    std::fprintf(stderr, "error: %s\n", result.error->c_str());
    return 1;
  };
  if (gpu) return report(cohort::trainer{body, cohort::scaling::cuda{}}.fit(nlohmann::json::object(), run));
  return report(cohort::trainer{body}.fit(nlohmann::json::object(), run));
}
