// Checkpoint save throughput vs a plain sequential write of the same bytes on the same disk, and
// the training stall of an async checkpoint.
//   mpirun -np 2 ./bench_checkpoint [--smoke] [google-benchmark flags]   (storage: $TMPDIR or /tmp)
//   plain_write/B        rank 0 writes B bytes to one file (16 MiB per write()) and fsyncs it
//                        (the baseline)
//   sync_checkpoint/B    ctx.report(metrics, checkpoint_of(model)) with B bytes of parameters,
//                        sync mode: safetensors, XXH3, fsync, manifest, rename, keep_last{1}
//   alternated/B         the two above alternated, 15 pairs (16 MiB) or 9 (256 MiB), each after
//                        a sync and a pause (no earlier write-back or deletion in its time): the
//                        ratio of the medians, and the median of each pair's ratio (the two
//                        writes of a pair meet the disk in the same state)
//   async_stall/B        the time report() blocks the training thread in async mode, for a
//                        model that is not prepared (report() copies it; writing happens in
//                        the background)
//   training_stall       the reference Fashion-MNIST CNN trained (prepared model, SGD with
//                        momentum, batch 64 per rank) with an async checkpoint every 10 steps:
//                        report()'s time (median, mean, max; the slower rank's) against the
//                        mean step, also without the time the training thread waited for a
//                        core (/proc/thread-self/schedstat) and, ranks on one host, from the
//                        last rank's arrival; and the time of those steps against the same
//                        steps without checkpoints, alternated in one run
#include <cohort/cohort.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fashion_mnist_net.hpp"
#include "mpi_bench.hpp"

namespace {

cohort::context* g_ctx = nullptr;
std::filesystem::path g_dir;

struct blob : torch::nn::Module {
  explicit blob(std::int64_t bytes) { w = register_parameter("w", torch::rand({bytes / 4})); }
  torch::Tensor w;
};

/// Seconds the calling thread has spent runnable but waiting for a core (the second field of
/// Linux's /proc/thread-self/schedstat; 0 where it cannot be read): one pread() of a file kept
/// open per thread, a few microseconds.
double run_delay_seconds() {
  thread_local int const fd = ::open("/proc/thread-self/schedstat", O_RDONLY);
  char text[128] = {};
  if (fd < 0 || ::pread(fd, text, sizeof text - 1, 0) <= 0) return 0;
  unsigned long long on_cpu_ns = 0, waiting_ns = 0;
  return std::sscanf(text, "%llu %llu", &on_cpu_ns, &waiting_ns) == 2 ? static_cast<double>(waiting_ns) * 1e-9 : 0;
}

/// The median of `v` (the upper one of an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// "median M ms (m%), mean A ms (a%), max X ms (x%)" of the times `v_s`, as shares of `step_s`.
std::string spread(std::vector<double> const& v_s, double step_s) {
  std::string text;
  auto add = [&](char const* name, double s) {
    char part[64];
    std::snprintf(part, sizeof part, "%s%s %.3f ms (%.2f%%)", text.empty() ? "" : ", ", name, s * 1e3, 100 * s / step_s);
    text += part;
  };
  add("median", median(v_s));
  add("mean", std::accumulate(v_s.begin(), v_s.end(), 0.0) / static_cast<double>(v_s.size()));
  add("max", *std::max_element(v_s.begin(), v_s.end()));
  return text;
}

/// The baseline: rank 0 writes `bytes` to one file, in write()s of 16 MiB as a checkpoint does, and
/// fsyncs it.
void write_plain(std::span<char const> bytes) {
  if (g_ctx->world_rank() != 0) return;
  auto path = g_dir / "plain.bin";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (std::size_t off = 0; off < bytes.size();) {
    auto const w = ::write(fd, bytes.data() + off, std::min<std::size_t>(bytes.size() - off, std::size_t{1} << 24));
    if (w <= 0) {
      std::fprintf(stderr, "bench_checkpoint: writing %s failed: check free space in $TMPDIR\n", path.c_str());
      std::exit(1);
    }
    off += static_cast<std::size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
}

void plain_write(benchmark::State& state) {
  std::vector<char> bytes(static_cast<std::size_t>(state.range(0)), 'x');
  for (auto _ : state) cohort_bench::timed_iteration(state, [&] { write_plain(bytes); });
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

/// Lets the disk settle before a timed write: a sync and a pause on every rank, so that no
/// write-back or deletion of an earlier iteration (the checkpoints' background deletion, the
/// plain file's previous blocks) lands in the next one's time.
void settle_disk() {
  if (g_ctx->world_rank() == 0) {
    std::filesystem::remove(g_dir / "plain.bin");  // the plain write, like a checkpoint, makes a new file
    ::sync();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (g_ctx->world_rank() == 0) ::sync();
}

/// Plain writes and sync checkpoints of the same size, alternated (so both meet the disk in the
/// same state: this virtual disk's fsync times drift by 2x over a run), each after settle_disk(),
/// `pairs` of each; prints the ratio of the median times: checkpoint / plain throughput.
void alternated(std::int64_t size_bytes, int pairs) {
  auto model = std::make_shared<blob>(size_bytes);
  // The same bytes from the same memory: the model's parameters.
  std::span<char const> bytes(static_cast<char const*>(model->w.data_ptr()), static_cast<std::size_t>(size_bytes));
  std::vector<double> plain, checkpoint;
  for (int i = 0; i < pairs; ++i) {
    settle_disk();
    plain.push_back(cohort_bench::slowest_seconds([&] { write_plain(bytes); }));
    settle_disk();
    checkpoint.push_back(cohort_bench::slowest_seconds([&] { g_ctx->report({{"b", size_bytes}}, cohort::checkpoint_of(model)); }));
  }
  std::vector<double> pair_ratios;
  for (std::size_t i = 0; i < plain.size(); ++i) pair_ratios.push_back(plain[i] / checkpoint[i]);
  if (g_ctx->world_rank() == 0)
    std::printf("alternated/%lld: plain write %.1f ms, sync checkpoint %.1f ms (medians of %d each): checkpoint / plain throughput %.3f; median of the pairs' ratios %.3f\n",
                static_cast<long long>(size_bytes), median(plain) * 1e3, median(checkpoint) * 1e3, pairs,
                median(plain) / median(checkpoint), median(pair_ratios));
}

// Reports run inside one trainer; each benchmark adds reports with checkpoints of its model.
void sync_checkpoint(benchmark::State& state) {
  auto model = std::make_shared<blob>(state.range(0));
  for (auto _ : state)
    cohort_bench::timed_iteration(state, [&] { g_ctx->report({{"b", state.range(0)}}, cohort::checkpoint_of(model)); });
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

/// The model sizes measured: 16 and 256 MiB (--smoke: 1 MiB).
std::vector<std::int64_t> sizes_bytes() {
  return cohort_bench::full_or_smoke(std::vector<std::int64_t>{16ll << 20, 256ll << 20}, std::vector<std::int64_t>{1ll << 20});
}

int main(int argc, char** argv) {
  cohort_bench::take_mode_flags(argc, argv);
  cohort::environment env{argc, argv};
  benchmark::Initialize(&argc, argv);
  char const* tmp = std::getenv("TMPDIR");
  g_dir = std::filesystem::path(tmp ? tmp : "/tmp") / ("cohort_bench_ckpt_" + std::to_string(getpid()));
  int const iterations = cohort_bench::full_or_smoke(8, 2);
  for (std::int64_t b : sizes_bytes()) {
    benchmark::RegisterBenchmark("plain_write", plain_write)->Arg(b)->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("sync_checkpoint", sync_checkpoint)->Arg(b)->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMillisecond);
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
    if (cohort_bench::smoke) {
      alternated(std::int64_t{1} << 20, 1);
    } else {
      alternated(std::int64_t{16} << 20, 15);
      alternated(std::int64_t{256} << 20, 9);
    }
  };
  int status = cohort_bench::exit_status(cohort::trainer{body, cohort::checkpointing::keep_last{.num_to_keep = 1}}.fit(
      nlohmann::json::object(), {.name = "sync", .storage_path = g_dir.string(), .verbose = 0}));

  // The async stall: report() time in async mode, max over ranks, for a 16 MiB and a 256 MiB model.
  status |= cohort_bench::exit_status(cohort::trainer{[](cohort::context& ctx) {
                    for (std::int64_t b : sizes_bytes()) {
                      auto model = std::make_shared<blob>(b);
                      double worst = 0;
                      for (int k = 0; k < cohort_bench::full_or_smoke(4, 2); ++k) {
                        MPI_Barrier(MPI_COMM_WORLD);
                        auto t0 = std::chrono::steady_clock::now();
                        ctx.report({{"b", b}}, cohort::checkpoint_of(model));
                        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                        if (k > 0) worst = std::max(worst, s);  // k = 0 waits for nothing; later ones wait for the previous write
                        std::this_thread::sleep_for(cohort_bench::full_or_smoke(std::chrono::milliseconds(2000), std::chrono::milliseconds(100)));  // "training" while the write proceeds
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
                                      .checkpoint_mode = cohort::checkpoint_mode::async}));
  // The stall inside training: blocks of 10 steps, alternately ending in an async checkpoint
  // and not (the same steps otherwise), so both see the same machine.
  status |= cohort_bench::exit_status(cohort::trainer{[](cohort::context& ctx) {
                    torch::manual_seed(1);
                    auto model = ctx.prepare_model(fashion_net());
                    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
                    auto x = torch::randn({64, 1, 28, 28});
                    auto y = torch::randint(0, 10, {64});
                    auto step = [&] {
                      opt.zero_grad();
                      torch::cross_entropy_loss(model(x), y).backward();
                      opt.step();
                    };
                    for (int i = 0; i < 5; ++i) step();  // warm-up
                    int const block_steps = cohort_bench::full_or_smoke(10, 2), blocks = cohort_bench::full_or_smoke(20, 2);
                    // The ranks' report() windows compare on one host only (one steady clock).
                    bool const one_host = ctx.local_world_size() == ctx.world_size();
                    std::vector<double> stalls, held, after_last, with_s, without_s;
                    auto seconds = [](std::chrono::steady_clock::time_point t) {
                      return std::chrono::duration<double>(t.time_since_epoch()).count();
                    };
                    for (int b = 0; b < 2 * blocks; ++b) {
                      bool const checkpointed = b % 2 == 1;
                      // report()'s time; of it, not waiting for a core; when it began; when it ended
                      double times[4] = {0, 0, 0, 0};
                      double block_s = cohort_bench::slowest_seconds([&] {
                        for (int i = 0; i < block_steps; ++i) step();
                        if (!checkpointed) return;
                        // The run_delay reads inside the timed window: a preemption at the edge
                        // counts as report()'s own time, never the other way round.
                        auto const t0 = std::chrono::steady_clock::now();
                        double const waited_before = run_delay_seconds();
                        ctx.report({{"block", b}}, cohort::checkpoint_of(model, opt));
                        double const waited = run_delay_seconds() - waited_before;
                        auto const t1 = std::chrono::steady_clock::now();
                        times[0] = std::chrono::duration<double>(t1 - t0).count();
                        times[1] = times[0] - waited;
                        times[2] = seconds(t0);
                        times[3] = seconds(t1);
                      });
                      MPI_Allreduce(MPI_IN_PLACE, times, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                      (checkpointed ? with_s : without_s).push_back(block_s);
                      if (checkpointed) {
                        stalls.push_back(times[0]);
                        held.push_back(times[1]);
                        // From the last rank's arrival to the last rank's return: the waits for a
                        // rank that finished its steps later are left out (without a checkpoint
                        // the next gradient all-reduce waits for it as long).
                        after_last.push_back(times[3] - times[2]);
                      }
                    }
                    double const step_s = median(without_s) / block_steps;
                    if (ctx.world_rank() == 0)
                      std::printf("training_stall: step %.2f ms; report() with an async checkpoint (shares of a step): %s; not counting the time it "
                                  "waited for a core (preempted): %s; %d steps with a checkpoint / without: %.4f (medians of %d blocks each)\n",
                                  step_s * 1e3, spread(stalls, step_s).c_str(), spread(held, step_s).c_str(), block_steps,
                                  median(with_s) / median(without_s), blocks);
                    if (ctx.world_rank() == 0 && one_host)
                      std::printf("training_stall: report() from the last rank's arrival to the last return: %s\n",
                                  spread(after_last, step_s).c_str());
                  },
                  cohort::checkpointing::keep_last{.num_to_keep = 1}}
      .fit(nlohmann::json::object(), {.name = "training", .storage_path = g_dir.string(), .verbose = 0,
                                      .abort_timeout_ms = 30'000, .resume_from_checkpoint = "",
                                      .checkpoint_mode = cohort::checkpoint_mode::async}));
  if (rank == 0) std::filesystem::remove_all(g_dir);
  return status;
}
