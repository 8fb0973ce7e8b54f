#pragma once
// Google Benchmark under MPI: every rank runs every benchmark with fixed iteration counts (so all
// ranks enter the same collectives); each iteration's time is the maximum over ranks (MPI_MAX) and
// only rank 0 reports. Rank 0 also keeps each benchmark's mean time for the ratio summaries.
// Every benchmark takes --smoke (ctest's bench.* tests): its smallest size, an iteration or two,
// so that CI shows it still runs from start to end; figures from a smoke run mean nothing.

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort_bench {

/// True under --smoke: each benchmark at its smallest size for an iteration or two (CI).
inline bool smoke = false;

/// Takes --smoke out of argv (so neither Google Benchmark nor the program's own flags see it) and
/// sets `smoke`; call it first in main().
inline void take_smoke_flag(int& argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--smoke") smoke = true;
    else argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = nullptr;
}

/// Set when a benchmark's work failed; the program then exits 1 (ctest's bench.* tests see it).
inline bool failed = false;

/// Records that `what` failed (on stderr, and as the benchmark's error) so the program exits 1.
inline void fail(benchmark::State& state, std::string const& what) {
  failed = true;
  std::fprintf(stderr, "error: %s\n", what.c_str());
  state.SkipWithError(what.c_str());
}

/// The program's exit status: 1 (with the error on stderr) if `result`, a fit's result, failed or
/// a benchmark called fail(); else 0.
template <class Result>
int exit_status(Result const& result) {
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", result.error ? result.error->c_str() : "the fit failed");
    failed = true;
  }
  return failed ? 1 : 0;
}

/// `full` normally, `small` under --smoke.
template <class T>
T full_or_smoke(T full, T small) {
  return smoke ? small : full;
}

/// Runs `body` on every rank after a barrier; the slowest rank's seconds (MPI_MAX).
template <class Body>
double slowest_seconds(Body&& body) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  body();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

/// Times `body` once on every rank, after a barrier; records the slowest rank's time.
template <class Body>
void timed_iteration(benchmark::State& state, Body&& body) {
  state.SetIterationTime(slowest_seconds(std::forward<Body>(body)));
}

/// Rank 0's reporter: the console output plus each run's mean seconds per iteration.
class recording_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(std::vector<Run> const& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (auto const& r : runs)
      if (r.run_type == Run::RT_Iteration && r.iterations > 0) {
        double s = r.real_accumulated_time / static_cast<double>(r.iterations);
        seconds[r.benchmark_name()] = s;
        if (on_run) on_run(r.benchmark_name(), s);
      }
  }
  std::map<std::string, double> seconds;                       ///< last run of each name
  std::function<void(std::string const&, double)> on_run;      ///< every run, in order
};

/// Other ranks: nothing printed.
class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(Context const&) override { return true; }
  void ReportRuns(std::vector<Run> const&) override {}
};

/// Runs the registered benchmarks on every rank; rank 0's mean seconds per benchmark name.
inline std::map<std::string, double> run_all() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    recording_reporter rep;
    benchmark::RunSpecifiedBenchmarks(&rep);
    return rep.seconds;
  }
  silent_reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  return {};
}

}  // namespace cohort_bench
