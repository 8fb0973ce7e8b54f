// Loader throughput and the data-wait share of a training step, with and without prefetch, on
// Fashion-MNIST (the dataset-fashion-mnist package's folder, or the one --data names).
//   mpirun -np 2 ./bench_data_loader [--smoke] [--data DIR] [google-benchmark flags]
//   loader/prefetch:P      batches of 64 from this rank's shuffled shard, nothing else (samples/s)
//   train_step/prefetch:P  the same batches feeding the reference CNN's training step; the counter
//                          data_wait_share is the share of step time spent waiting for data
#include <cohort/cohort.hpp>

#include <cstdio>
#include <cstdlib>

#include "fashion_mnist_net.hpp"
#include "mpi_bench.hpp"

namespace {

cohort::context* g_ctx = nullptr;
cohort::tensor_dataset g_train;

/// --data DIR, taken out of argv (before Google Benchmark reads it); else the package's folder.
std::filesystem::path take_data_flag(int& argc, char** argv) {
  std::filesystem::path dir = default_fashion_mnist_dir;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--data" && i + 1 < argc) dir = argv[++i];
    else argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = nullptr;
  return dir;
}

cohort::tensor_dataset load_train(std::filesystem::path const& dir) {
  auto images = cohort::data::read_idx(dir / "train-images-idx3-ubyte.gz");
  auto labels = cohort::data::read_idx(dir / "train-labels-idx1-ubyte.gz");
  auto n = images.dims[0];
  auto x = torch::from_blob(images.data.data(), {n, 1, 28, 28}, torch::kUInt8).to(torch::kFloat).div_(255.0);
  auto y = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kLong);
  return {x, y};
}

cohort::data_loader<cohort::tensor_dataset> make_loader(std::size_t prefetch) {
  return {g_train, [](std::size_t n, std::int64_t e) { return g_ctx->shard_indices(n, e); },
          {.batch_size = 64, .prefetch_batches = prefetch}};
}

int loader_batches() { return cohort_bench::full_or_smoke(400, 4); }
int step_batches() { return cohort_bench::full_or_smoke(60, 2); }

void loader(benchmark::State& state) {
  auto l = make_loader(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state)
    cohort_bench::timed_iteration(state, [&] {
      int k = 0;
      for (auto& b : l.epoch()) {
        benchmark::DoNotOptimize(b.inputs.data_ptr());
        if (++k == loader_batches()) break;
      }
    });
  state.SetItemsProcessed(state.iterations() * loader_batches() * 64);
}

void train_step(benchmark::State& state) {
  auto l = make_loader(static_cast<std::size_t>(state.range(0)));
  torch::manual_seed(0);
  fashion_net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  double wait = 0, total = 0;
  for (auto _ : state) {
    auto w0 = l.stats().wait_s;
    auto t0 = std::chrono::steady_clock::now();
    cohort_bench::timed_iteration(state, [&] {
      int k = 0;
      for (auto& b : l.epoch()) {
        opt.zero_grad();
        torch::cross_entropy_loss(net->forward(b.inputs), b.targets).backward();
        opt.step();
        if (++k == step_batches()) break;
      }
    });
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wait += l.stats().wait_s - w0;
  }
  double worst = wait / total;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  state.counters["data_wait_share"] = worst;
  state.SetItemsProcessed(state.iterations() * step_batches() * 64);
}

}  // namespace

int main(int argc, char** argv) {
  cohort_bench::take_mode_flags(argc, argv);
  auto const data_dir = take_data_flag(argc, argv);
  cohort::environment env{argc, argv};
  benchmark::Initialize(&argc, argv);
  g_train = load_train(data_dir);
  for (int p : {0, 4}) {
    benchmark::RegisterBenchmark("loader", loader)->ArgName("prefetch")->Arg(p)->Iterations(cohort_bench::full_or_smoke(5, 1))->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("train_step", train_step)->ArgName("prefetch")->Arg(p)->Iterations(cohort_bench::full_or_smoke(3, 1))->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  auto const result = cohort::trainer{[](cohort::context& ctx) {
                    g_ctx = &ctx;
                    cohort_bench::run_all();
                  },
                  cohort::sharding::shuffled{.seed = 1}}
      .fit(nlohmann::json::object(), {.name = "", .storage_path = "/tmp/cohort_bench", .verbose = 0});
  return cohort_bench::exit_status(result);
}
