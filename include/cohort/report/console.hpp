#pragma once
/// \file
/// Concise rank-0 console progress: one line per report, written by a background thread.

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/detail/background_worker.hpp"
#include "cohort/report/flatten.hpp"

namespace cohort::report {

/// Pure: the progress line for one report row, given flattened (its keys in flatten() order),
/// e.g. `[cohort] fashion iter 3 (12.4 s): loss=0.3121 test_accuracy=0.9012`.
inline std::string progress_line_of_flat(std::string const& name, flat_row const& flat) {
  static char const* const auto_keys[] = {"training_iteration", "time_this_iter_s", "time_total_s", "timestamp",
                                          "num_failures"};
  long long iteration = 0;
  double total_s = 0;
  for (auto const& [k, v] : flat) {
    if (k == "training_iteration" && v.is_number()) iteration = v.get<long long>();
    if (k == "time_total_s" && v.is_number()) total_s = v.get<double>();
  }
  char head[128];
  std::snprintf(head, sizeof head, " iter %lld (%.1f s):", iteration, total_s);
  std::string line = "[cohort] " + name + head;
  for (auto const& [k, v] : flat) {
    bool is_auto = false;
    for (auto const* a : auto_keys) is_auto = is_auto || k == a;
    if (is_auto) continue;
    if (v.is_number_float()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
      line += " " + k + "=" + buf;
    } else {
      line += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  return line;
}

/// The progress line of a row not yet flattened.
inline std::string progress_line(std::string const& name, nlohmann::json const& row) {
  return progress_line_of_flat(name, flatten(row));
}

/// Writes lines to stdout on a background (batch) thread, in order, so that a report does not
/// wait for the write: under mpirun stdout is a pipe, and the write wakes mpirun, which on busy
/// cores took the core from the training thread for up to 3 ms (docs/benchmarks.md). The thread
/// is `worker`, shared with the rank's async checkpoint writes (a line queued after a write is
/// printed once the write is done; a checkpointed report's line is printed by its write's job);
/// it must outlive the printer. drain() and the destructor return once every line given so far
/// is written.
class console_printer {
 public:
  explicit console_printer(cohort::detail::background_worker& worker) : worker_(worker) { worker_.warm_up(); }
  console_printer(console_printer const&) = delete;
  console_printer& operator=(console_printer const&) = delete;
  ~console_printer() { drain(); }

  /// Queues `line` (a newline is added).
  void print(std::string line) {
    worker_.start([line = std::move(line)] { write_line(line); });
  }

  /// Writes `line` and a newline to stdout now, and flushes: what a queued line's job does. The
  /// async checkpoint's job calls it for its report's line, after the copy the next step waits for.
  static void write_line(std::string const& line) {
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  /// Blocks until every line queued so far is written and flushed (and the jobs queued before them).
  void drain() { worker_.wait(); }

 private:
  cohort::detail::background_worker& worker_;
};

}  // namespace cohort::report
