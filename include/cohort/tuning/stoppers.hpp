#pragma once
/// \file
/// Stop criteria (Ray Tune's `stop` dict, FunctionStopper, TrialPlateauStopper, TimeoutStopper,
/// MaximumIterationStopper): `stop_trial` ends one trial after one of its results, `stop_all` ends
/// the whole experiment. The tuner asks every stopper it was given and stops when any says so.
/// Each is a pure function of the results it was shown (and the elapsed time it is told); none
/// communicates. A key named "a/b" is looked up as that key, else as the path a -> b in nested
/// objects (Ray flattens results the same way). Knobs are checked on every call, so a bad one
/// throws cohort::error the first time the stopper is used.

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

namespace cohort::stop {

namespace detail {

using tuning::detail::keys_of;

/// The value named `key` in `j` (a key, else an "a/b" path); null when absent.
inline nlohmann::json const* find(nlohmann::json const& j, std::string const& key) { return tuning::detail::find_key(j, key); }

/// One trial's recent values, as the plateau stopper keeps them.
struct plateau_trial {
  std::deque<double> last{};  ///< at most num_results values, NaN for a missing metric
  std::size_t seen = 0;       ///< results seen (Ray's _iter)
};

}  // namespace detail

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

/// Ray's FunctionStopper: `fn(trial_id, result)` says whether to stop the trial.
/// `stop::function{.fn = [](std::string const&, nlohmann::json const& r) { return r["loss"] < 0.1; }}`.
struct function {
  std::function<bool(std::string const& trial_id, nlohmann::json const& result)> fn{};  ///< must be set

  /// What `fn` says. Throws cohort::error when `fn` is empty.
  bool stop_trial(std::string const& trial_id, nlohmann::json const& result) const {
    if (!fn) throw cohort::error("stop::function: .fn is empty; set it to a (trial_id, result) -> bool function");
    return fn(trial_id, result);
  }

  /// Never: the function judges single trials.
  bool stop_all(double) const { return false; }
};
static_assert(cohort::stopper<function>);

/// Ray's TrialPlateauStopper: stops a trial once it has reported at least `grace_period` results
/// and the (population) standard deviation of its last `num_results` values of `metric` is below
/// `std`; with `metric_threshold` set, only while the latest value is at or better than it
/// (`mode` says which side is better). A result without the metric counts as NaN, which never
/// plateaus (Ray's None makes np.std fail, which it treats as infinite).
///
/// Preconditions, checked on every call: metric not empty, std > 0, num_results >= 1, and a
/// `mode` when `metric_threshold` is set.
struct plateau {
  std::string metric{};                      ///< the metric to watch; must be set
  double std = 0.01;                         ///< stop below this standard deviation
  std::size_t num_results = 4;               ///< how many latest values the deviation is taken over
  std::size_t grace_period = 4;              ///< results a trial reports before it can stop
  std::optional<double> metric_threshold{};  ///< stop only at or beyond this value
  std::optional<cohort::order> mode{};       ///< which side of metric_threshold is better

  /// True when the trial's metric has plateaued (see the type's description).
  bool stop_trial(std::string const& trial_id, nlohmann::json const& result) {
    check();
    auto const* v = detail::find(result, metric);
    double const x = v != nullptr && v->is_number() ? v->get<double>() : std::numeric_limits<double>::quiet_NaN();
    auto& tr = state_[trial_id];
    tr.last.push_back(x);
    if (tr.last.size() > num_results) tr.last.pop_front();
    ++tr.seen;
    if (tr.seen < grace_period || tr.last.size() < num_results) return false;
    if (metric_threshold) {
      if (*mode == cohort::order::min && x > *metric_threshold) return false;
      if (*mode == cohort::order::max && x < *metric_threshold) return false;
    }
    // np.std: mean, then the mean of squared deviations, then its root.
    double sum = 0;
    for (double y : tr.last) sum += y;
    double const mean = sum / static_cast<double>(tr.last.size());
    double sq = 0;
    for (double y : tr.last) sq += (y - mean) * (y - mean);
    return std::sqrt(sq / static_cast<double>(tr.last.size())) < this->std;
  }

  /// Never: plateaus are per trial.
  bool stop_all(double) const {
    check();
    return false;
  }

  /// Each trial's latest values (not a knob; only plateau reaches it).
  cohort::detail::internal_state<std::map<std::string, detail::plateau_trial>, plateau> state_{};

 private:
  void check() const {
    if (metric.empty()) throw cohort::error("stop::plateau: .metric is empty; name the metric to watch");
    if (!(this->std > 0)) throw cohort::error("stop::plateau: .std must be positive, e.g. 0.01");
    if (num_results == 0) throw cohort::error("stop::plateau: .num_results must be at least 1");
    if (metric_threshold && !mode)
      throw cohort::error(
          "stop::plateau: .metric_threshold needs .mode (cohort::min or cohort::max) to say which side is better");
  }
};
static_assert(cohort::stopper<plateau>);

/// Ray's TimeoutStopper (RunConfig's time_budget_s): ends the experiment once
/// `experiment_elapsed_s >= time_budget_s`. The tuner measures elapsed time; a resumed experiment
/// counts only the time it ran (as Ray's budget does).
struct time_budget {
  double time_budget_s = std::numeric_limits<double>::quiet_NaN();  ///< must be set, 0 or more

  /// Never: the budget is for the whole experiment.
  bool stop_trial(std::string const&, nlohmann::json const&) const {
    check();
    return false;
  }

  /// True once the budget is spent.
  bool stop_all(double experiment_elapsed_s) const {
    check();
    return experiment_elapsed_s >= time_budget_s;
  }

 private:
  void check() const {
    if (!(time_budget_s >= 0))
      throw cohort::error("stop::time_budget: .time_budget_s is " + std::to_string(time_budget_s) +
                          "; set it to the experiment's budget in seconds, 0 or more");
  }
};
static_assert(cohort::stopper<time_budget>);

/// Ray's MaximumIterationStopper: stops a trial at its `max_iter`-th result. It counts the
/// results it is shown (as Ray does), not `training_iteration`, so a trial restored from a
/// checkpoint counts from where this stopper last saw it.
struct maximum_iterations {
  std::int64_t max_iter = 0;  ///< must be set, 1 or more

  /// True at the trial's max_iter-th result and after.
  bool stop_trial(std::string const& trial_id, nlohmann::json const&) {
    check();
    return ++state_[trial_id] >= max_iter;
  }

  /// Never: the count is per trial.
  bool stop_all(double) const {
    check();
    return false;
  }

  /// Results seen per trial (not a knob; only maximum_iterations reaches it).
  cohort::detail::internal_state<std::map<std::string, std::int64_t>, maximum_iterations> state_{};

 private:
  void check() const {
    if (max_iter < 1)
      throw cohort::error("stop::maximum_iterations: .max_iter is " + std::to_string(max_iter) +
                          "; set it to 1 or more");
  }
};
static_assert(cohort::stopper<maximum_iterations>);

}  // namespace cohort::stop
