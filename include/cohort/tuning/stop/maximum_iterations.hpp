#pragma once
/// \file
/// stop::maximum_iterations: Ray Tune's MaximumIterationStopper.

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

}  // namespace cohort::tuning::stop
