// Tuner bookkeeping with a no-op objective: what the tuner itself costs per trial and per result.
//   mpirun -np 2 ./bench_tune [--smoke | --guard] [google-benchmark flags]   (storage: $TMPDIR or /tmp)
//   trials/N     N trials of one report each, ranks_per_trial 1: wall time / N is the cost of a
//                trial (suggest, assign, trainer setup, trial directory, params.json, result.json,
//                progress.csv, scheduler, completion); reported as ms_per_trial
//   results/N    4 trials of N reports each under ASHA: results_per_s is how fast results flow
//                through the coordinator's decisions on rank 0 (a round trip at each rung and at
//                least every 10 ms; the rest sent without waiting), report.html and the grid
//   scale/N      N trials of one report after 50 ms each: overhead_pct over N x 50 ms / ranks
//   reproducible/on:R/tpe:S   40 trials of 6 uneven reports with tune_config::reproducible off
//                (R = 0) or on (R = 1), random + ASHA (S = 0) or TPE + FIFO (S = 1): the cost of its waiting
//   callbacks/C  one trainer run of 20,000 reports of 8 metrics, timed on rank 0's training thread:
//                C = 0 no callback, 1 a callback that counts results, 2 report::mlflow (to
//                $COHORT_BENCH_MLFLOW_URI, else to a closed port: it buffers every metric);
//                us_per_report, the callbacks' cost being the difference from C = 0 (goal: <= 5 us)
// Anchors (Ray Tune's docs, "Tune Scalability and Overhead Benchmarks"): 10,000 one-second trials
// on 16 CPUs took 715 s against 625 s ideal, about 9 ms of overhead per trial; about 500-1,000
// results/s. Goal here: <= 0.1 ms per trial and >= 100,000 results/s.
#include <cohort/report/mlflow.hpp>
#include <cohort/tuning/tuner.hpp>

#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "mpi_bench.hpp"

namespace {

std::filesystem::path g_dir;
int g_run = 0;


void trials(benchmark::State& state) {
  auto const n = static_cast<std::size_t>(state.range(0));
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) { ctx.report({{"score", config.at("x")}}); };
  for (auto _ : state) {
    double const s = cohort_bench::slowest_seconds([&] {
      cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .num_samples = n, .status_interval_s = 1e9}};
      auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 1)}},
                            {.name = "trials_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0});
      if (!grid.ok() || grid.size() != n) cohort_bench::fail(state, "the trials experiment failed: " + grid.error.value_or("not every trial finished"));
    });
    state.SetIterationTime(s);
    state.counters["ms_per_trial"] = s * 1e3 / static_cast<double>(n);
  }
}

void results(benchmark::State& state) {
  auto const n = state.range(0);
  auto fn = [n](cohort::context& ctx, nlohmann::json const& config) {
    double const x = config.at("x").get<double>();
    for (std::int64_t i = 0; i < n; ++i) ctx.report({{"score", x}});
  };
  for (auto _ : state) {
    std::size_t total = 0;
    double const s = cohort_bench::slowest_seconds([&] {
      cohort::tuner tuner{fn, cohort::schedule::asha{.max_t = static_cast<double>(n + 1), .grace_period = 1, .reduction_factor = 4},
                          cohort::tune_config{.metric = "score", .status_interval_s = 1e9}};
      auto grid = tuner.fit(cohort::space{{"x", cohort::grid_search({1.0, 2.0, 3.0, 4.0})}},
                            {.name = "results_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0});
      if (!grid.ok()) cohort_bench::fail(state, "the results experiment failed: " + grid.error.value_or("?"));
      for (auto const& t : grid.trials) total += t.metrics_history.size();
    });
    state.SetIterationTime(s);
    state.counters["results"] = static_cast<double>(total);
    state.counters["results_per_s"] = static_cast<double>(total) / s;
  }
}

/// reproducible/R (R = 0 off, 1 on) x searcher S (0 random under ASHA, 1 TPE under FIFO): 40
/// trials of 6 reports, each report after 1-9 ms (by the trial's config), so that trials finish
/// out of order: what tune_config::reproducible's waiting costs in wall time.
void reproducible(benchmark::State& state) {
  bool const on = state.range(0) != 0, tpe = state.range(1) != 0;
  auto const n = static_cast<std::size_t>(cohort_bench::full_or_smoke(40, 4));
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) {
    double const x = config.at("x").get<double>(), y = config.at("y").get<double>();
    for (int t = 1; t <= 6; ++t) {
      std::this_thread::sleep_for(std::chrono::microseconds(1000 + static_cast<int>(8000 * y)));
      ctx.report({{"loss", (x - 0.3) * (x - 0.3) * (1 + 1.0 / t)}});
    }
  };
  cohort::tune_config const cfg{.metric = "loss", .mode = cohort::min, .num_samples = n, .status_interval_s = 1e9, .reproducible = on};
  cohort::space const space{{"x", cohort::uniform(0, 1)}, {"y", cohort::uniform(0, 1)}};
  for (auto _ : state) {
    double const s = cohort_bench::slowest_seconds([&] {
      cohort::run_config const run{.name = "reproducible_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0};
      auto grid = tpe ? cohort::tuner{fn, cohort::search::tpe{.seed = 1, .n_startup_trials = 5}, cfg}.fit(space, run)
                      : cohort::tuner{fn, cohort::search::random{.seed = 1},
                                      cohort::schedule::asha{.max_t = 6, .grace_period = 1, .reduction_factor = 2}, cfg}
                            .fit(space, run);
      if (!grid.ok() || grid.size() != n) cohort_bench::fail(state, "the reproducible experiment failed: " + grid.error.value_or("?"));
    });
    state.SetIterationTime(s);
  }
}

/// scale/N: N trials of one report after 50 ms (--smoke: 5 ms), ranks_per_trial 1: the wall time
/// against the ideal, N x 50 ms / groups (Ray's scalability page: 10,000 one-second trials on 16
/// CPUs, 715 s against 625 s ideal, 14% over). Reported as overhead_pct; and where it goes, as
/// medians over a group's trials, the larger of the two groups' (less noisy than the wall time):
/// between_us from a trial's return to the group's next trial's start (the tuner's work between
/// trials), report_us the report, sleep_over_us the 50 ms sleep's overshoot; and over the whole
/// run, the slowest rank's: start_ms from fit() to its first trial, end_ms from its last trial's
/// return to fit()'s, trials_max the most trials a group ran (the wall time's share of them).
void scale(benchmark::State& state) {
  auto const n = static_cast<std::size_t>(state.range(0));
  auto const trial_ms = cohort_bench::full_or_smoke(50, 5);
  using clock = std::chrono::steady_clock;
  std::vector<double> between_us, report_us, sleep_over_us;
  std::optional<clock::time_point> returned, first;
  auto fn = [&, trial_ms](cohort::context& ctx, nlohmann::json const& config) {
    auto const entered = clock::now();
    if (!first) first = entered;
    if (returned) between_us.push_back(std::chrono::duration<double, std::micro>(entered - *returned).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(trial_ms));
    auto const slept = clock::now();
    sleep_over_us.push_back(std::chrono::duration<double, std::micro>(slept - entered).count() - 1e3 * trial_ms);
    ctx.report({{"score", config.at("x")}});
    returned = clock::now();
    report_us.push_back(std::chrono::duration<double, std::micro>(*returned - slept).count());
  };
  auto slowest_median = [](std::vector<double> const& v) {
    double m = cohort_bench::median(v);
    MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
  };
  auto slowest = [](double v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  };
  int groups = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &groups);
  for (auto _ : state) {
    double start_ms = 0, end_ms = 0;
    double const s = cohort_bench::slowest_seconds([&] {
      cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .num_samples = n, .status_interval_s = 1e9}};
      auto const called = clock::now();
      auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 1)}},
                            {.name = "scale_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0});
      auto const back = clock::now();
      if (!grid.ok() || grid.size() != n) cohort_bench::fail(state, "the scale experiment failed: " + grid.error.value_or("?"));
      if (first) start_ms = std::chrono::duration<double, std::milli>(*first - called).count();
      if (returned) end_ms = std::chrono::duration<double, std::milli>(back - *returned).count();
    });
    state.SetIterationTime(s);
    double const ideal = static_cast<double>(n) * static_cast<double>(trial_ms) / 1e3 / groups;
    state.counters["ideal_s"] = ideal;
    state.counters["overhead_pct"] = 100 * (s / ideal - 1);
    state.counters["between_us"] = slowest_median(between_us);
    state.counters["report_us"] = slowest_median(report_us);
    state.counters["sleep_over_us"] = slowest_median(sleep_over_us);
    state.counters["start_ms"] = slowest(start_ms);
    state.counters["end_ms"] = slowest(end_ms);
    state.counters["trials_max"] = slowest(static_cast<double>(sleep_over_us.size()));
    between_us.clear(), report_us.clear(), sleep_over_us.clear();
    returned.reset(), first.reset();
  }
}

/// --guard: 3 experiments of 300 one-report trials, in /dev/shm where there is one (a disk's
/// write-back would time the disk); the median of their wall times per trial must stay <= 1 ms
/// (docs/benchmarks.md: about 0.1 ms on tmpfs).
/// A callback that counts results (what any callback costs the training thread).
struct counting {
  std::shared_ptr<std::size_t> seen = std::make_shared<std::size_t>(0);
  void on_trial_result(cohort::report::trial_info const&, nlohmann::json const&) { ++*seen; }
};

void callbacks(benchmark::State& state) {
  auto const kind = state.range(0);
  constexpr int reports = 20'000;
  auto seconds = std::make_shared<double>(0);
  auto fn = [seconds](cohort::context& ctx) {
    auto const start = std::chrono::steady_clock::now();
    for (int i = 1; i <= reports; ++i)
      ctx.report({{"loss", 1.0 / i}, {"acc", 0.5}, {"lr", 0.1}, {"epoch", i / 100}, {"val", {{"loss", 0.2}, {"acc", 0.6}}}, {"step", i}, {"g", 1.5}});
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  char const* uri = std::getenv("COHORT_BENCH_MLFLOW_URI");
  cohort::report::mlflow const tracker{.tracking_uri = uri ? uri : "http://127.0.0.1:9", .experiment_name = "cohort-bench", .end_timeout_s = uri ? 60.0 : 0.0};
  cohort::run_config const run{.name = "callbacks_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0, .tensorboard = false};
  for (auto _ : state) {
    bool ok = kind == 0   ? cohort::trainer{fn}.fit(nlohmann::json::object(), run).ok()
              : kind == 1 ? cohort::trainer{fn, counting{}}.fit(nlohmann::json::object(), run).ok()
                          : cohort::trainer{fn, tracker}.fit(nlohmann::json::object(), run).ok();
    if (!ok) cohort_bench::fail(state, "the callbacks run failed");
    state.SetIterationTime(*seconds);
    state.counters["us_per_report"] = *seconds * 1e6 / reports;
  }
}

void guard_trials() {
  if (std::filesystem::is_directory("/dev/shm")) g_dir = std::filesystem::path("/dev/shm") / g_dir.filename();
  std::vector<double> ms;
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) { ctx.report({{"score", config.at("x")}}); };
  for (int round = 0; round < 3; ++round) {
    bool ok = true;
    double const s = cohort_bench::slowest_seconds([&] {
      cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .num_samples = 300, .status_interval_s = 1e9}};
      auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 1)}},
                            {.name = "guard_" + std::to_string(g_run++), .storage_path = g_dir.string(), .verbose = 0});
      ok = grid.ok() && grid.size() == 300;
    });
    if (!ok) {
      std::fprintf(stderr, "error: the guard's experiment failed\n");
      cohort_bench::failed = true;
      return;
    }
    ms.push_back(s * 1e3 / 300);
  }
  cohort_bench::check_guard("tuner bookkeeping, ms per trial (median of 3 experiments of 300 trials)", cohort_bench::median(ms), true, 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  cohort_bench::take_mode_flags(argc, argv);
  cohort::environment env{argc, argv};
  benchmark::Initialize(&argc, argv);
  long pid = getpid();
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  char const* tmp = std::getenv("TMPDIR");
  g_dir = std::filesystem::path(tmp ? tmp : "/tmp") / ("cohort_bench_tune_" + std::to_string(pid));
  benchmark::RegisterBenchmark("trials", trials)->Arg(cohort_bench::full_or_smoke(10'000, 20))->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("results", results)->Arg(cohort_bench::full_or_smoke(25'000, 40))->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("scale", scale)->Arg(cohort_bench::full_or_smoke(2'000, 4))->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("reproducible", reproducible)
      ->ArgsProduct({{0, 1}, {0, 1}})
      ->ArgNames({"on", "tpe"})
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("callbacks", callbacks)->Arg(0)->Arg(1)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  if (cohort_bench::guard) guard_trials();
  else cohort_bench::run_all();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(g_dir);
  return cohort_bench::failed ? 1 : 0;
}
