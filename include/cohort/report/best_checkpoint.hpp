#pragma once
/// \file
/// Which of a trial's committed checkpoints is its best by a metric, as trackers tag it
/// (report::mlflow's `cohort.checkpoint`), from the results and checkpoints callbacks see.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/order.hpp"

namespace cohort::report::detail {

/// Which of a trial's committed checkpoints is its best by `metric` (`mode`), for the
/// `cohort.checkpoint` tag: each result's value of the metric is kept by iteration until the
/// checkpoint of that iteration is told (async checkpoints are told after their results). Without
/// a metric every new checkpoint is the best (the newest); a checkpoint whose result lacks the
/// metric is the best only until one that has it. Ties keep the earlier. Pure.
struct best_checkpoint {
  std::string metric{};
  cohort::order mode = cohort::min;
  std::map<std::int64_t, double> values{};  ///< results' values not yet matched with a checkpoint
  std::optional<double> best{};

  /// A result: its metric's value at its training_iteration (a key, else an "a/b" path).
  void observe(nlohmann::json const& row) {
    if (metric.empty() || !row.is_object()) return;
    nlohmann::json const* v = row.contains(metric) ? &row[metric] : nullptr;
    if (!v) {
      v = &row;
      for (std::size_t from = 0; v && from <= metric.size();) {
        auto const to = std::min(metric.find('/', from), metric.size());
        auto const key = metric.substr(from, to - from);
        v = v->is_object() && v->contains(key) ? &(*v)[key] : nullptr;
        from = to + 1;
      }
    }
    if (v && v->is_number() && std::isfinite(v->get<double>()))
      values[row.value("training_iteration", std::int64_t{0})] = v->get<double>();
  }
  /// A committed checkpoint of `iteration`: whether it is the trial's best now.
  bool is_new_best(std::int64_t iteration) {
    if (metric.empty()) return true;
    std::optional<double> v;
    if (auto it = values.find(iteration); it != values.end()) v = it->second;
    values.erase(values.begin(), values.upper_bound(iteration));
    if (!v) return !best;
    if (best && !(mode == cohort::min ? *v < *best : *v > *best)) return false;
    best = v;
    return true;
  }
};

}  // namespace cohort::report::detail
