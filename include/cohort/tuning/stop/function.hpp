#pragma once
/// \file
/// stop::function: Ray Tune's FunctionStopper.

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

}  // namespace cohort::tuning::stop
