#pragma once
/// \file
/// stop::thresholds: Ray Tune's `stop={"key": value, ...}` dict.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/error.hpp"
#include "cohort/order.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/stop/common.hpp"

namespace cohort::tuning::stop {

/// Ray's `stop={"key": value, ...}`: stops a trial as soon as one result has
/// `result[key] >= value` for any key. Keys may be "a/b" paths. A result without one of the keys,
/// or with a non-number there, throws cohort::error naming the key and the keys present (as Ray's
/// TuneError does). `stop::thresholds{{"mean_accuracy", 0.99}, {"training_iteration", 100}}`.
class thresholds {
 public:
  /// Criteria in the order they are checked; a key must not be empty.
  thresholds(std::initializer_list<std::pair<std::string, double>> criteria)
      : thresholds(std::vector<std::pair<std::string, double>>(criteria)) {}

  /// Criteria in the order they are checked; a key must not be empty.
  explicit thresholds(std::vector<std::pair<std::string, double>> criteria) : criteria_(std::move(criteria)) {
    for (auto const& [key, value] : criteria_)
      if (key.empty()) throw cohort::error("stop::thresholds: a criterion has an empty key; name a reported metric");
  }

  /// True when any `result[key] >= value`.
  bool stop_trial(std::string const& trial_id, nlohmann::json const& result) const {
    for (auto const& [key, value] : criteria_) {
      auto const* v = detail::find(result, key);
      if (v == nullptr)
        throw cohort::error("stop::thresholds: the result of trial " + trial_id + " has no \"" + key +
                            "\" (its keys: " + detail::keys_of(result) + "); report it or drop the criterion");
      if (!v->is_number())
        throw cohort::error("stop::thresholds: \"" + key + "\" in the result of trial " + trial_id + " is " +
                            v->dump() + ", not a number; report a number");
      if (v->get<double>() >= value) return true;
    }
    return false;
  }

  /// Never: thresholds judge single trials.
  bool stop_all(double) const { return false; }

  /// The criteria, in the order they are checked.
  std::vector<std::pair<std::string, double>> const& criteria() const { return criteria_; }

 private:
  std::vector<std::pair<std::string, double>> criteria_;
};
static_assert(cohort::stopper<thresholds>);

}  // namespace cohort::tuning::stop
