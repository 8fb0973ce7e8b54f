// Checkpoint save throughput vs a plain sequential write of the same bytes on the same disk, and
// the training stall of an async checkpoint.
//   mpirun -np 2 ./bench_checkpoint [google-benchmark flags]   (storage: $TMPDIR or /tmp)
//   plain_write/B        rank 0 writes B bytes to one file and fsyncs it (the baseline)
//   sync_checkpoint/B    ctx.report(metrics, checkpoint_of(model)) with B bytes of parameters,
//                        sync mode: capture, pickle, write, CRC-32, fsync, manifest, rename
//   async_stall/B        the time report() blocks the training thread in async mode
//                        (the capture; writing happens in the background)
#include <cohort/cohort.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include "mpi_bench.hpp"

namespace {

cohort::context* g_ctx = nullptr;
std::filesystem::path g_dir;

struct blob : torch::nn::Module {
  explicit blob(std::int64_t bytes) { w = register_parameter("w", torch::rand({bytes / 4})); }
  torch::Tensor w;
};

void plain_write(benchmark::State& state) {
  std::vector<char> bytes(static_cast<std::size_t>(state.range(0)), 'x');
  auto path = g_dir / "plain.bin";
  for (auto _ : state)
    cohort_bench::timed_iteration(state, [&] {
      if (g_ctx->world_rank() != 0) return;
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (std::size_t off = 0; off < bytes.size();) off += static_cast<std::size_t>(::write(fd, bytes.data() + off, bytes.size() - off));
      ::fsync(fd);
      ::close(fd);
    });
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// Reports run inside one trainer; each benchmark adds reports with checkpoints of its model.
void sync_checkpoint(benchmark::State& state) {
  auto model = std::make_shared<blob>(state.range(0));
  for (auto _ : state)
    cohort_bench::timed_iteration(state, [&] { g_ctx->report({{"b", state.range(0)}}, cohort::checkpoint_of(model)); });
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

int main(int argc, char** argv) {
  cohort::environment env{argc, argv};
  benchmark::Initialize(&argc, argv);
  char const* tmp = std::getenv("TMPDIR");
  g_dir = std::filesystem::path(tmp ? tmp : "/tmp") / ("cohort_bench_ckpt_" + std::to_string(getpid()));
  for (std::int64_t b : {std::int64_t{16} << 20, std::int64_t{256} << 20}) {
    benchmark::RegisterBenchmark("plain_write", plain_write)->Arg(b)->Iterations(8)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("sync_checkpoint", sync_checkpoint)->Arg(b)->Iterations(8)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long pid = getpid();
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  g_dir = std::filesystem::path(tmp ? tmp : "/tmp") / ("cohort_bench_ckpt_" + std::to_string(pid));
  std::filesystem::create_directories(g_dir);
  auto body = [](cohort::context& ctx) {
    g_ctx = &ctx;
    cohort_bench::run_all();
  };
  cohort::trainer{body, cohort::checkpointing::keep_last{.num_to_keep = 1}}.fit(
      nlohmann::json::object(), {.name = "sync", .storage_path = g_dir.string(), .verbose = 0});

  // The async stall: report() time in async mode, max over ranks, for a 16 MiB and a 256 MiB model.
  cohort::trainer{[](cohort::context& ctx) {
                    for (std::int64_t b : {std::int64_t{16} << 20, std::int64_t{256} << 20}) {
                      auto model = std::make_shared<blob>(b);
                      double worst = 0;
                      for (int k = 0; k < 4; ++k) {
                        MPI_Barrier(MPI_COMM_WORLD);
                        auto t0 = std::chrono::steady_clock::now();
                        ctx.report({{"b", b}}, cohort::checkpoint_of(model));
                        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                        if (k > 0) worst = std::max(worst, s);  // k = 0 waits for nothing; later ones wait for the previous write
                        std::this_thread::sleep_for(std::chrono::seconds(2));  // "training" while the write proceeds
                      }
                      MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                      if (ctx.world_rank() == 0)
                        std::printf("async_stall/%lld: report() blocked at most %.2f ms (with the previous write finished)\n",
                                    static_cast<long long>(b), worst * 1e3);
                    }
                  },
                  cohort::checkpointing::keep_last{.num_to_keep = 1}}
      .fit(nlohmann::json::object(), {.name = "async", .storage_path = g_dir.string(), .verbose = 0,
                                      .abort_timeout_ms = 30'000, .resume_from_checkpoint = "",
                                      .checkpoint_mode = cohort::checkpoint_mode::async});
  if (rank == 0) std::filesystem::remove_all(g_dir);
  return 0;
}
