// A full training step through cohort's trainer and prepare_model vs a hand-written MPI loop on
// the same model (broadcast once, then per step: forward, backward, MPI_Allreduce of each
// gradient in place, divide by the world size, SGD step).
//   mpirun -np 2 ./bench_train_step [--smoke | --guard] [google-benchmark flags]
// Models: the reference Fashion-MNIST CNN (batch 64 per rank, 1x28x28) and a small MLP
// (batch 64, input 1024, two hidden layers of 256, 10 outputs).
// The ranks' agreement on control flow (detail::lockstep, one small all-reduce started at the
// first gradient hook of each backward and awaited before its first bucket) is measured twice:
// the cohort step against the same step with a reducer built without it, and one agreement alone.
#include <cohort/cohort.hpp>
#include <torch/version.h>

#include <cstdio>
#include <functional>
#include <memory>

#include "fashion_mnist_net.hpp"
#include "mpi_bench.hpp"

namespace {

cohort::context* g_ctx = nullptr;

struct mlpImpl : torch::nn::Module {
  mlpImpl()
      : l1(register_module("l1", torch::nn::Linear(1024, 256))),
        l2(register_module("l2", torch::nn::Linear(256, 256))),
        l3(register_module("l3", torch::nn::Linear(256, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return l3(torch::relu(l2(torch::relu(l1(x))))); }
  torch::nn::Linear l1, l2, l3;
};
TORCH_MODULE(mlp);

template <class Net>
struct workload {
  Net net;
  torch::Tensor x, y;
};

workload<fashion_net> make_cnn() {
  torch::manual_seed(1);
  return {fashion_net(), torch::randn({64, 1, 28, 28}), torch::randint(0, 10, {64})};
}
workload<mlp> make_mlp() {
  torch::manual_seed(1);
  return {mlp(), torch::randn({64, 1024}), torch::randint(0, 10, {64})};
}

constexpr int warmup_steps = 5;

/// One step of the hand-written MPI loop on a fresh `make()` workload (its parameters broadcast
/// from rank 0 first): forward, backward, MPI_Allreduce of each gradient, divide, SGD step.
template <class Make>
std::function<void()> handwritten_step(Make make) {
  auto w = std::make_shared<decltype(make())>(make());
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : w->net->parameters())
      MPI_Bcast(p.data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  auto opt = std::make_shared<torch::optim::SGD>(w->net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return [w, opt, size] {
    opt->zero_grad();
    torch::cross_entropy_loss(w->net->forward(w->x), w->y).backward();
    for (auto& p : w->net->parameters()) {
      MPI_Allreduce(MPI_IN_PLACE, p.grad().data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      p.grad().div_(size);
    }
    opt->step();
  };
}

/// One step through cohort on a fresh `make()` workload: prepare_model, then forward, backward
/// (gradients averaged by its hooks), SGD step. `agree`: the reducer takes part in the ranks'
/// agreement (as prepare_model builds it); false: the same reducer without it, to measure what
/// the agreement costs per step.
template <class Make>
std::function<void()> cohort_step(Make make, bool agree = true) {
  auto w = make();
  auto model = std::make_shared<decltype(g_ctx->prepare_model(w.net))>(g_ctx->prepare_model(w.net));
  if (!agree && model->reducer()) {
    auto const where = cohort::use_communication_thread(cohort::reduce_on::automatic, cohort::scaling::node_cores(),
                                                        g_ctx->local_world_size())
                           ? cohort::reduce_on::communication_thread
                           : cohort::reduce_on::training_thread;
    *model = std::decay_t<decltype(*model)>(model->module(), std::make_shared<cohort::detail::gradient_reducer>(
                                                                 g_ctx->comm(), model->reducer()->params(), cohort::model_options{}, where));
  }
  auto opt = std::make_shared<torch::optim::SGD>((*model)->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  return [model, opt, x = w.x, y = w.y] {
    opt->zero_grad();
    torch::cross_entropy_loss((*model)(x), y).backward();
    opt->step();
  };
}

template <class Make>
void handwritten(benchmark::State& state, Make make) {
  auto step = handwritten_step(make);
  for (int i = 0; i < warmup_steps; ++i) step();
  for (auto _ : state) cohort_bench::timed_iteration(state, step);
}

template <class Make>
void through_cohort(benchmark::State& state, Make make, bool agree = true) {
  auto step = cohort_step(make, agree);
  for (int i = 0; i < warmup_steps; ++i) step();
  for (auto _ : state) cohort_bench::timed_iteration(state, step);
}

/// --guard: the CNN's step through cohort against the hand-written loop's, 9 alternating rounds
/// of 5 steps each; the median of the rounds' ratios must stay <= 1.15 (docs/benchmarks.md:
/// cohort is faster than the hand-written loop on this model).
void guard_step() {
  auto hand = handwritten_step(make_cnn);
  auto through = cohort_step(make_cnn);
  for (int i = 0; i < warmup_steps; ++i) {
    hand();
    through();
  }
  std::vector<double> ratios;
  for (int round = 0; round < 9; ++round) {
    double const h = cohort_bench::slowest_seconds([&] { for (int i = 0; i < 5; ++i) hand(); });
    double const c = cohort_bench::slowest_seconds([&] { for (int i = 0; i < 5; ++i) through(); });
    ratios.push_back(c / h);
  }
  cohort_bench::check_guard("CNN step through cohort / hand-written MPI loop step (median of 9 alternating rounds)",
                            cohort_bench::median(ratios), true, 1.15);
}

/// One agreement of the ranks, as a backward makes it (started, then awaited).
void agreement(benchmark::State& state) {
  auto& steps = cohort::detail::context_access::lockstep(*g_ctx);
  for (auto _ : state)
    cohort_bench::timed_iteration(state, [&] {
      steps.start(cohort::detail::step::backward);
      steps.finish();
    });
}

}  // namespace

int main(int argc, char** argv) {
  cohort_bench::take_mode_flags(argc, argv);
  cohort::environment env{argc, argv};
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
  // Interleaved and repeated, so that drift on a shared machine hits both sides alike.
  static int const cnn_steps = cohort_bench::full_or_smoke(40, 2), mlp_steps = cohort_bench::full_or_smoke(400, 2),
                   agreements = cohort_bench::full_or_smoke(2000, 2);
  for (int rep = 0; rep < cohort_bench::full_or_smoke(3, 1); ++rep) {
    benchmark::RegisterBenchmark("cnn/handwritten", [](benchmark::State& s) { handwritten(s, make_cnn); })
        ->Iterations(cnn_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("cnn/cohort", [](benchmark::State& s) { through_cohort(s, make_cnn); })
        ->Iterations(cnn_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("cnn/cohort_without_agreement", [](benchmark::State& s) { through_cohort(s, make_cnn, false); })
        ->Iterations(cnn_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mlp/handwritten", [](benchmark::State& s) { handwritten(s, make_mlp); })
        ->Iterations(mlp_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mlp/cohort", [](benchmark::State& s) { through_cohort(s, make_mlp); })
        ->Iterations(mlp_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("mlp/cohort_without_agreement", [](benchmark::State& s) { through_cohort(s, make_mlp, false); })
        ->Iterations(mlp_steps)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("agreement", agreement)->Iterations(agreements)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  auto const result = cohort::trainer{[](cohort::context& ctx) {
    g_ctx = &ctx;
    if (cohort_bench::guard) return guard_step();
    std::map<std::string, std::vector<double>> runs;
    int rank = ctx.world_rank();
    if (rank == 0) {
      cohort_bench::recording_reporter rep;
      rep.on_run = [&](std::string const& name, double s) { runs[name].push_back(s); };
      benchmark::RunSpecifiedBenchmarks(&rep);
    } else {
      cohort_bench::silent_reporter rep;
      benchmark::RunSpecifiedBenchmarks(&rep);
    }
    if (rank != 0) return;
    std::printf("\nLibTorch %s, %d ranks\n", TORCH_VERSION, ctx.world_size());
    auto mean = [](std::vector<double> const& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0.0 : s / static_cast<double>(v.size());
    };
    double const agree = mean(runs["agreement/iterations:" + std::to_string(agreements) + "/manual_time"]);
    std::printf("\n| model | hand-written MPI step (ms) | cohort step (ms) | cohort overhead | cohort without the agreement (ms) "
                "| agreement's share of the step | one agreement alone, share of the cohort step |\n"
                "|---|---:|---:|---:|---:|---:|---:|\n");
    for (char const* m : {"cnn", "mlp"}) {
      std::string const iters = std::to_string(m[0] == 'c' ? cnn_steps : mlp_steps);
      double hw = mean(runs[std::string(m) + "/handwritten/iterations:" + iters + "/manual_time"]);
      double co = mean(runs[std::string(m) + "/cohort/iterations:" + iters + "/manual_time"]);
      double no = mean(runs[std::string(m) + "/cohort_without_agreement/iterations:" + iters + "/manual_time"]);
      std::printf("| %s | %.3f | %.3f | %+.1f%% | %.3f | %+.2f%% | %.3f%% |\n", m, hw * 1e3, co * 1e3,
                  hw > 0 ? (co / hw - 1) * 100 : 0.0, no * 1e3, no > 0 ? (co / no - 1) * 100 : 0.0,
                  co > 0 ? agree / co * 100 : 0.0);
    }
    std::printf("\none agreement (start + finish, slowest rank): %.1f us\n", agree * 1e6);
  }}.fit(nlohmann::json::object(), {.name = "", .storage_path = "/tmp/cohort_bench", .verbose = 0});
  return cohort_bench::exit_status(result);
}
