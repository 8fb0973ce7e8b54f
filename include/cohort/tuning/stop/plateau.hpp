#pragma once
/// \file
/// stop::plateau: Ray Tune's TrialPlateauStopper.

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

namespace detail {

/// One trial's recent values, as the plateau stopper keeps them.
struct plateau_trial {
  std::deque<double> last{};  ///< at most num_results values, NaN for a missing metric
  std::size_t seen = 0;       ///< results seen (Ray's _iter)
};

}  // namespace detail

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

}  // namespace cohort::tuning::stop
