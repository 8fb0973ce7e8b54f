#pragma once
/// \file
/// Concise rank-0 console progress: one line per report.

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/report/flatten.hpp"

namespace cohort::report {

/// Pure: the progress line for one report row, e.g.
/// `[cohort] fashion iter 3 (12.4 s): loss=0.3121 test_accuracy=0.9012`.
inline std::string progress_line(std::string const& name, nlohmann::json const& row) {
  static char const* const auto_keys[] = {"training_iteration", "time_this_iter_s", "time_total_s", "timestamp"};
  char head[128];
  std::snprintf(head, sizeof head, " iter %lld (%.1f s):", row.value("training_iteration", 0LL),
                row.value("time_total_s", 0.0));
  std::string line = "[cohort] " + name + head;
  for (auto const& [k, v] : flatten(row)) {
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

}  // namespace cohort::report
