#pragma once
// Google Benchmark under MPI: every rank runs every benchmark with fixed iteration counts (so all
// ranks enter the same collectives); each iteration's time is the maximum over ranks (MPI_MAX) and
// only rank 0 reports. Rank 0 also keeps each benchmark's mean time for the ratio summaries.
// Every benchmark takes --smoke (ctest's bench.* tests): its smallest size, an iteration or two,
// so that CI shows it still runs from start to end; figures from a smoke run mean nothing. Those
// with a guarded figure take --guard (ctest's guard.* tests): a few alternating rounds of the two
// sides of a same-run ratio, checked against a generous bound (check_guard), exit 1 outside it.

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
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

/// True under --guard: only the guarded ratio, measured and checked (CI's performance guards).
inline bool guard = false;

/// Takes --smoke and --guard out of argv (so neither Google Benchmark nor the program's own flags
/// see them) and sets `smoke` and `guard`; call it first in main().
inline void take_mode_flags(int& argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--smoke") smoke = true;
    else if (std::string_view(argv[i]) == "--guard") guard = true;
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

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto const n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// A performance guard, on every rank with the same `value` (from slowest_seconds): rank 0 prints
/// "guard: <what> = <value> (bound: <= or >= <bound>)", and outside the bound every rank marks the
/// run failed (exit 1) and rank 0 says so. Guards check same-run ratios of alternating rounds
/// (load slows both sides alike) or a cost with a bound far above its figure in docs/benchmarks.md.
inline void check_guard(std::string const& what, double value, bool at_most, double bound) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool const ok = at_most ? value <= bound : value >= bound;
  if (rank == 0) {
    std::printf("guard: %s = %.3f (bound: %s %.3f)\n", what.c_str(), value, at_most ? "<=" : ">=", bound);
    if (!ok) std::fprintf(stderr, "error: guard failed: %s is %.3f, outside its bound %s %.3f: something on this path got slower\n",
                          what.c_str(), value, at_most ? "<=" : ">=", bound);
    std::fflush(stdout);
  }
  if (!ok) failed = true;
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
