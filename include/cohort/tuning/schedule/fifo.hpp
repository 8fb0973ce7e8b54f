#pragma once
/// \file
/// The FIFO scheduler (Ray's FIFOScheduler): every trial runs to its end.

#include <nlohmann/json.hpp>

#include "cohort/tuning/schedule/common.hpp"

namespace cohort::tuning::schedule {

/// First in, first out: every trial runs to its end (Ray's FIFOScheduler, the default).
struct fifo {
  /// What runs next does not wait for completions (tuning::independent_of_completions).
  static constexpr bool next_independent_of_completions = true;
  /// Nothing to set up.
  void setup(tuning::objective const&) {}
  /// Nothing to track.
  void on_trial_add(std::string const&, nlohmann::json const&) {}
  /// Always `proceed`.
  tuning::scheduling_decision on_trial_result(std::string const&, nlohmann::json const&) { return {}; }
  /// Every result: fifo always proceeds.
  tuning::proceed_span proceeds(std::string const&) const { return {}; }
  /// Nothing to track.
  void on_trial_complete(std::string const&, nlohmann::json const&) {}
  /// Ray's debug_string.
  std::string debug_string() const { return "Using FIFO scheduling algorithm."; }
  /// An empty object: fifo has no state.
  nlohmann::json save_state() const { return nlohmann::json::object(); }
  /// Nothing to restore.
  void restore_state(nlohmann::json const&) {}
};
static_assert(cohort::scheduler<fifo>);

}  // namespace cohort::tuning::schedule
