#pragma once
/// \file
/// What tuner::fit returns (Ray's ResultGrid): every trial with its config, results and status,
/// and the best one by a metric with a scope. Identical on every rank.

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"
#include "cohort/order.hpp"
#include "cohort/result.hpp"

namespace cohort::tuning {

/// Which of a trial's results count when trials are compared (Ray's `scope`).
enum class scope {
  last,            ///< its last result
  all,             ///< its best result
  average_of_last, ///< the average of its last `last_k` results (all of them when last_k is 0)
};

/// How trials are compared: `grid.best_result({.metric = "acc", .mode = cohort::max})`.
struct best_by {
  std::string metric{};
  cohort::order mode = cohort::order::max;
  tuning::scope scope = tuning::scope::last;
  std::size_t last_k = 0;  ///< for scope::average_of_last
};

/// One trial of a tuning run.
struct trial_result {
  std::string id;                                ///< "trial_00003"
  std::string status;                            ///< TERMINATED (finished or stopped early) or ERROR
  nlohmann::json config = nlohmann::json::object();  ///< its hyperparameters (the last ones, under PBT)
  nlohmann::json metrics = nlohmann::json::object(); ///< its last result
  std::vector<nlohmann::json> metrics_history;   ///< every result, in order
  std::filesystem::path path;                    ///< the trial directory
  std::optional<std::string> error;              ///< why it failed
  std::size_t num_failures = 0;                  ///< times its functor threw (tune_config::max_failures retries)
  /// Its committed checkpoints at the end, oldest first, each with the metrics of the report that
  /// carried it (what its retention policy kept).
  std::vector<checkpoint_info> checkpoints;

  /// Its latest committed checkpoint (Ray's `Result.checkpoint`); none when it committed none.
  std::optional<checkpoint_info> checkpoint() const {
    if (checkpoints.empty()) return std::nullopt;
    return checkpoints.back();
  }

  /// Its best committed checkpoint by `by.metric` and `by.mode` (Ray's
  /// `Result.get_best_checkpoint`): checkpoints whose report lacks the metric never win, ties go
  /// to the newest; none when no checkpoint has the metric.
  std::optional<checkpoint_info> best_checkpoint(best_by const& by) const {
    std::optional<checkpoint_info> best;
    double best_value = 0;
    for (auto const& c : checkpoints) {
      if (!c.metrics.contains(by.metric) || !c.metrics[by.metric].is_number()) continue;
      double const v = c.metrics[by.metric].get<double>();
      if (std::isnan(v)) continue;
      if (!best || (by.mode == cohort::order::max ? v >= best_value : v <= best_value)) {
        best = c;
        best_value = v;
      }
    }
    return best;
  }

  /// The trial's score by `by` (NaN when it has no such metric).
  double score(best_by const& by) const {
    double const nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> values;
    for (auto const& row : metrics_history)
      if (row.contains(by.metric) && row[by.metric].is_number()) values.push_back(row[by.metric].get<double>());
    if (values.empty()) return nan;
    switch (by.scope) {
      case scope::last:
        return values.back();
      case scope::all: {
        double best = values.front();
        for (double v : values) best = by.mode == cohort::order::max ? std::max(best, v) : std::min(best, v);
        return best;
      }
      case scope::average_of_last: {
        std::size_t const k = by.last_k == 0 ? values.size() : std::min(by.last_k, values.size());
        double sum = 0;
        for (std::size_t i = values.size() - k; i < values.size(); ++i) sum += values[i];
        return sum / static_cast<double>(k);
      }
    }
    return nan;
  }
};

/// Every trial of a tuning run, in creation order, and the best one.
struct result_grid {
  std::vector<trial_result> trials;
  std::filesystem::path path;          ///< the experiment directory
  std::optional<std::string> error;    ///< set when the run as a whole failed (setup, bad input) or was preempted
  bool preempted = false;              ///< stopped by SIGTERM/SIGINT: rerun with the same name to resume (exit with exit_code_preempted)
  best_by objective{};                 ///< the tune_config's metric and mode, scope last

  bool ok() const { return !error.has_value(); }
  std::size_t size() const { return trials.size(); }
  /// Trials that ended in an error.
  std::size_t num_errors() const {
    std::size_t n = 0;
    for (auto const& t : trials) n += t.error ? 1 : 0;
    return n;
  }

  /// The best trial by `by` (Ray's get_best_result); trials without the metric never win. Throws
  /// cohort::error when no trial reported it.
  trial_result const& best_result(best_by const& by) const {
    trial_result const* best = nullptr;
    double best_score = 0;
    for (auto const& t : trials) {
      double s = t.score(by);
      if (std::isnan(s)) continue;
      if (!best || (by.mode == cohort::order::max ? s > best_score : s < best_score)) {
        best = &t;
        best_score = s;
      }
    }
    if (!best)
      throw cohort::error("best_result: no trial reported the metric '" + by.metric +
                          "': name a metric the trials pass to report()");
    return *best;
  }
  /// The best trial by the tune_config's metric and mode, scope last.
  trial_result const& best_result() const { return best_result(objective); }
};

inline void to_json(nlohmann::json& j, trial_result const& t) {
  j = {{"id", t.id}, {"status", t.status}, {"config", t.config}, {"metrics", t.metrics},
       {"history", t.metrics_history}, {"path", t.path.string()}, {"checkpoints", t.checkpoints},
       {"num_failures", t.num_failures}};
  if (t.error) j["error"] = *t.error;
}
inline void from_json(nlohmann::json const& j, trial_result& t) {
  t.id = j.at("id").get<std::string>();
  t.status = j.at("status").get<std::string>();
  t.config = j.at("config");
  t.metrics = j.at("metrics");
  t.metrics_history = j.at("history").get<std::vector<nlohmann::json>>();
  t.path = j.at("path").get<std::string>();
  if (j.contains("error")) t.error = j["error"].get<std::string>();
  t.num_failures = j.value("num_failures", std::size_t{0});
  if (j.contains("checkpoints")) t.checkpoints = j["checkpoints"].get<std::vector<checkpoint_info>>();
}

}  // namespace cohort::tuning
