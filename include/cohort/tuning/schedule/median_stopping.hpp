#pragma once
/// \file
/// The median stopping rule (Ray's MedianStoppingRule).

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/tuning/schedule/common.hpp"

namespace cohort::tuning::schedule {

namespace detail {

/// One trial's results as the median rule keeps them.
struct median_trial {
  std::vector<std::pair<double, double>> results{};  ///< (time, metric), in report order
  bool waiting = false;                              ///< paused by the rule and not reporting since: Ray's PAUSED
  bool complete = false;
  bool stopped = false;  ///< stopped or paused by the rule (Ray's _stopped_trials)
  double last_pause = -inf_v;
};

/// The median rule's state, internal.
struct median_state {
  bool ready = false;
  resolved_objective objective{};
  std::map<std::string, median_trial> trials{};
};

}  // namespace detail

/// The median stopping rule (Ray's MedianStoppingRule, after Google Vizier): a trial at time t
/// (past `grace_period`) stops when its best value so far is strictly worse than the median, over
/// the other trials that have reached t, of their running means of results with
/// grace_period <= time <= t. It needs `min_samples_required` such trials; with fewer it proceeds,
/// or pauses to yield to waiting trials when t is more than `min_time_slice` past the trial's
/// last such pause (Ray's _on_insufficient_samples, even with hard_stop). With `hard_stop` false a
/// trial the rule judges is paused instead and from then on always proceeds (Ray's FIFO fallback).
///
/// "Waiting" trials are the ones this rule paused that have not reported since (Ray's PAUSED).
/// Ray also counts PENDING trials; cohort's tuner adds a trial when it starts it, so a scheduler
/// here never sees one, and a trial added but not yet reporting counts as running.
///
/// Differences from Ray, both for results Ray mishandles: a trial with no result in
/// [grace_period, t] (it jumped over the window) is left out of the median, where Ray's mean of
/// nothing is NaN and stops every trial compared with it; and `on_trial_complete` does not record
/// the last result again when it was already reported (same time), where Ray counts it twice.
struct median_stopping {
  std::string time_attr = "time_total_s";  ///< the result key that measures progress (monotone)
  std::string metric{};                    ///< empty: the objective's metric
  std::optional<cohort::order> mode{};     ///< unset: the objective's mode
  double grace_period = 60.0;              ///< no trial stops before it; running means start here
  std::size_t min_samples_required = 3;    ///< other trials needed to take a median
  double min_time_slice = 0;               ///< least time_attr between yields for lack of samples
  bool hard_stop = true;                   ///< stop (true) or pause (false) a trial below the median

  /// Fixes metric and mode. Call once, before any trial.
  void setup(tuning::objective const& o) {
    state_.objective = detail::resolve(metric, mode, o, "schedule::median_stopping");
    state_.ready = true;
  }

  /// Starts tracking the trial (as running). A trial id added twice keeps its results.
  void on_trial_add(std::string const& id, nlohmann::json const&) {
    require_setup();
    state_.trials.try_emplace(id);
  }

  /// Proceed, stop or pause (see the type's description). Throws cohort::error when the result
  /// lacks the metric or time_attr.
  tuning::scheduling_decision on_trial_result(std::string const& id, nlohmann::json const& result) {
    require_setup();
    double const t = detail::number(result, time_attr, "schedule::median_stopping", id);
    double const value = detail::number(result, state_.objective.metric, "schedule::median_stopping", id);
    auto& me = state_.trials[id];
    me.waiting = false;
    if (me.stopped) return {};  // paused once by the rule (hard_stop false): FIFO from now on
    me.results.emplace_back(t, value);
    if (t < grace_period) return {};

    std::vector<double> means;
    std::size_t others = 0;
    for (auto const& [tid, tr] : state_.trials) {
      if (tid == id || tr.results.empty() || tr.results.back().first < t) continue;
      ++others;
      double sum = 0;
      std::size_t n = 0;
      for (auto const& [rt, rv] : tr.results)
        if (grace_period <= rt && rt <= t) sum += rv, ++n;
      if (n > 0) means.push_back(sum / static_cast<double>(n));
    }
    if (others < min_samples_required) {
      bool const someone_waits = std::any_of(state_.trials.begin(), state_.trials.end(), [&](auto const& kv) {
        return kv.first != id && kv.second.waiting && !kv.second.complete;
      });
      if (t - me.last_pause > min_time_slice && someone_waits) {
        me.last_pause = t;
        me.waiting = true;
        return {.what = tuning::decision::pause};
      }
      return {};
    }
    if (means.empty()) return {};
    std::sort(means.begin(), means.end());
    auto const m = means.size();
    double const median = m % 2 == 1 ? means[m / 2] : (means[m / 2 - 1] + means[m / 2]) / 2;
    bool const maximize = state_.objective.sign > 0;
    double best = me.results.front().second;
    for (auto const& [rt, rv] : me.results) best = maximize ? std::max(best, rv) : std::min(best, rv);
    if (maximize ? median > best : median < best) {
      me.stopped = true;
      if (hard_stop) return {.what = tuning::decision::stop};
      me.waiting = true;
      return {.what = tuning::decision::pause};
    }
    return {};
  }

  /// Keeps the trial's results for later medians; records the last result if it is new.
  void on_trial_complete(std::string const& id, nlohmann::json const& last_result) {
    auto& me = state_.trials[id];
    me.complete = true;
    me.waiting = false;
    if (!detail::has_numbers(last_result, time_attr, state_.objective.metric)) return;
    double const t = detail::find(last_result, time_attr)->get<double>();
    if (!me.results.empty() && me.results.back().first == t) return;
    me.results.emplace_back(t, detail::find(last_result, state_.objective.metric)->get<double>());
  }

  /// Every trial's (time, value) results and flags.
  nlohmann::json save_state() const {
    nlohmann::json trials = nlohmann::json::object();
    for (auto const& [tid, tr] : state_.trials) {
      nlohmann::json results = nlohmann::json::array();
      for (auto const& [rt, rv] : tr.results)
        results.push_back({detail::number_or_null(rt), detail::number_or_null(rv)});
      trials[tid] = {{"results", results},
                     {"waiting", tr.waiting},
                     {"complete", tr.complete},
                     {"stopped", tr.stopped},
                     {"last_pause", detail::number_or_null(tr.last_pause)}};
    }
    return {{"trials", trials}};
  }

  /// Restores what `save_state` returned.
  void restore_state(nlohmann::json const& s) {
    state_.trials.clear();
    for (auto const& [tid, j] : s.at("trials").items()) {
      detail::median_trial tr;
      for (auto const& r : j.at("results"))
        tr.results.emplace_back(detail::number_or(r.at(0), detail::nan_v), detail::number_or(r.at(1), detail::nan_v));
      tr.waiting = j.value("waiting", false);
      tr.complete = j.value("complete", false);
      tr.stopped = j.value("stopped", false);
      tr.last_pause = detail::number_or(j.at("last_pause"), -detail::inf_v);
      state_.trials.emplace(tid, std::move(tr));
    }
  }

  /// Ray's debug_string: "Using MedianStoppingRule: num_stopped=N." (the trials the rule has
  /// stopped, or paused for good when hard_stop is false).
  std::string debug_string() const {
    auto const n = std::count_if(state_.trials.begin(), state_.trials.end(), [](auto const& kv) { return kv.second.stopped; });
    return "Using MedianStoppingRule: num_stopped=" + std::to_string(n) + ".";
  }

  /// How many results of `trial_id` the rule holds (0 for a trial it has not seen).
  std::size_t results_held(std::string const& trial_id) const {
    auto it = state_.trials.find(trial_id);
    return it == state_.trials.end() ? 0 : it->second.results.size();
  }

  /// Each trial's results (not a knob; only median_stopping reaches it).
  cohort::detail::internal_state<detail::median_state, median_stopping> state_{};

 private:
  void require_setup() const {
    if (!state_.ready)
      throw cohort::error("schedule::median_stopping: used before setup(objective); the tuner calls setup first");
  }
};
static_assert(cohort::scheduler<median_stopping>);

}  // namespace cohort::tuning::schedule
