#pragma once
/// \file
/// stop::time_budget: Ray Tune's TimeoutStopper (RunConfig's time_budget_s).

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

}  // namespace cohort::tuning::stop
