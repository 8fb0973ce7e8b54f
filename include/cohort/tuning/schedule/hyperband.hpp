#pragma once
/// \file
/// Synchronous HyperBand (Ray's HyperBandScheduler): trials are dealt to brackets of a band in
/// the order of hyperband_brackets(); a trial that reaches its bracket's milestone pauses until
/// every live trial of the bracket has, then the best go on and the rest stop.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/tuning/schedule/common.hpp"
#include "cohort/tuning/schedule/hyperband_brackets.hpp"

namespace cohort::tuning::schedule {

namespace detail {

/// A live trial of a bracket and its last result (time_attr; the signed metric, NaN before one).
struct hyperband_trial {
  std::string id{};
  double time = 0;
  double value = nan_v;
};

/// One bracket: its place in the band's schedule, the milestones passed, its live trials in the
/// order they were added.
struct hyperband_bracket_state {
  std::size_t band = 0;
  std::size_t index = 0;  ///< into hyperband_brackets(max_t, reduction_factor)
  std::size_t stage = 0;  ///< milestones passed (successive halvings done)
  double progress = 0;    ///< iterations reported by its trials, for the completion figure
  std::size_t added = 0;  ///< trials ever added (a bracket whose trials all ended is still full)
  std::vector<hyperband_trial> live{};
};

/// HyperBand's state, internal.
struct hyperband_state {
  bool ready = false;
  resolved_objective objective{};
  std::vector<hyperband_bracket> schedule{};
  std::vector<hyperband_bracket_state> brackets{};  ///< every bracket made, in order
  std::map<std::string, std::size_t> trial_bracket{};
  bool closed = false;  ///< no trial will be added any more
  std::size_t num_stopped = 0;
  tuning::paused_decisions decided{};  ///< about other trials, until the tuner takes them
};

}  // namespace detail

/// Synchronous HyperBand (Li et al. 2018), as Ray's HyperBandScheduler with its defaults.
///
/// Trials fill the brackets of a band in order (hyperband_brackets: bracket s takes n0 trials
/// first run to r0 iterations), a new band after the last. A result below the bracket's current
/// milestone (time_attr, cumulative) proceeds; one at or past it pauses the trial until every
/// live trial of the bracket has reached the milestone, and no trial will join the bracket any
/// more (it was given n0, a later bracket exists, or the searcher is exhausted: on_no_more_trials;
/// Ray creates its trials ahead, the tuner asks its searcher one trial at a time). Then the best
/// ceil(n / reduction_factor) by the metric go on to the next milestone and the others stop; at
/// the last milestone (max_t) every trial stops (if `stop_last_trials`). Ties keep the order of
/// addition, the later trial ranking higher (Python's stable sort, as Ray); a NaN ranks lowest.
/// Decisions about paused trials other than the reporting one wait in take_paused_decisions().
///
/// Preconditions, checked by `setup`: max_t >= 1, reduction_factor > 1, a metric here or in the
/// objective.
struct hyperband {
  /// Which bracket schedule: Ray's HyperBandScheduler's (hyperband_brackets) or BOHB's
  /// (bohb_brackets: the paper's trial counts and budgets, s_max first; pair it with search::bohb,
  /// as Ray pairs TuneBOHB with HyperBandForBOHB).
  enum class brackets_of { ray, bohb };
  std::string time_attr = "training_iteration";  ///< the result key that measures progress (monotone)
  std::string metric{};                          ///< empty: the objective's metric
  std::optional<cohort::order> mode{};           ///< unset: the objective's mode
  std::int64_t max_t = 81;                       ///< the most iterations a trial runs
  double reduction_factor = 3;                   ///< 1 in reduction_factor trials goes on at a milestone
  bool stop_last_trials = true;                  ///< stop trials at the last milestone (max_t)
  brackets_of schedule = brackets_of::ray;       ///< the bracket schedule

  /// Checks the knobs, fixes metric and mode, computes the band's schedule. Call once, before any trial.
  void setup(tuning::objective const& o) {
    std::string const who = "schedule::hyperband";
    if (max_t < 1) throw cohort::error(who + ": .max_t must be at least 1; set it to the most iterations a trial may run");
    if (!(reduction_factor > 1)) throw cohort::error(who + ": .reduction_factor must be greater than 1 (Ray's default is 3)");
    state_.objective = detail::resolve(metric, mode, o, who);
    state_.schedule = schedule_for_knobs();
    state_.ready = true;
  }

  /// Puts the trial in the current bracket, or in a new one when that is full. A trial id added
  /// twice keeps its bracket.
  void on_trial_add(std::string const& id, nlohmann::json const&) {
    require_setup();
    if (state_.trial_bracket.contains(id)) return;
    if (state_.brackets.empty() || !accepting(state_.brackets.size() - 1)) {
      detail::hyperband_bracket_state next;
      if (!state_.brackets.empty()) {
        auto const& last = state_.brackets.back();
        bool const band_done = last.index + 1 == state_.schedule.size();
        next.band = last.band + (band_done ? 1 : 0);
        next.index = band_done ? 0 : last.index + 1;
      }
      state_.brackets.push_back(std::move(next));
    }
    state_.brackets.back().live.push_back({id, 0, detail::nan_v});
    ++state_.brackets.back().added;
    state_.trial_bracket[id] = state_.brackets.size() - 1;
  }

  /// Proceed below the milestone; at it, pause, or (the bracket's milestone done) go on or stop.
  /// Throws cohort::error when the result lacks the metric or time_attr, or the trial was not added.
  tuning::scheduling_decision on_trial_result(std::string const& id, nlohmann::json const& result) {
    require_setup();
    double const t = detail::number(result, time_attr, "schedule::hyperband", id);
    double const value = state_.objective.sign * detail::number(result, state_.objective.metric, "schedule::hyperband", id);
    auto it = state_.trial_bracket.find(id);
    if (it == state_.trial_bracket.end())
      throw cohort::error("schedule::hyperband: a result for trial " + id + ", which was never added; call on_trial_add first");
    auto& b = state_.brackets[it->second];
    auto* live = find_live(b, id);
    if (live == nullptr) return {tuning::decision::stop};  // stopped at a milestone already
    b.progress += std::max(0.0, t - live->time);
    live->time = t;
    live->value = value;
    if (continues(b, *live)) return {tuning::decision::proceed};
    return {process(it->second, &id)};
  }

  /// The trial left its bracket (ended, failed or stopped): the bracket's milestone may now be done.
  void on_trial_complete(std::string const& id, nlohmann::json const&) {
    auto it = state_.trial_bracket.find(id);
    if (it == state_.trial_bracket.end()) return;
    auto const b = it->second;
    state_.trial_bracket.erase(it);
    std::erase_if(state_.brackets[b].live, [&](auto const& t) { return t.id == id; });
    std::erase(state_.decided.resume, id);
    std::erase(state_.decided.stop, id);
    if (!state_.brackets[b].live.empty()) process(b, nullptr);
  }

  /// The searcher is exhausted: no bracket waits for more trials.
  void on_no_more_trials() {
    if (state_.closed) return;
    state_.closed = true;
    for (std::size_t b = 0; b < state_.brackets.size(); ++b)
      if (!state_.brackets[b].live.empty()) process(b, nullptr);
  }

  /// The paused trials to resume and to stop, decided since the last call.
  tuning::paused_decisions take_paused_decisions() { return std::exchange(state_.decided, {}); }

  /// Brackets with their live trials, the stop count, whether it is closed, decisions not taken.
  nlohmann::json save_state() const {
    nlohmann::json brackets_j = nlohmann::json::array();
    for (auto const& b : state_.brackets) {
      nlohmann::json live = nlohmann::json::array();
      for (auto const& t : b.live) live.push_back({{"id", t.id}, {"time", t.time}, {"value", detail::number_or_null(t.value)}});
      brackets_j.push_back(
          {{"band", b.band}, {"index", b.index}, {"stage", b.stage}, {"progress", b.progress}, {"added", b.added}, {"live", live}});
    }
    return {{"max_t", max_t},
            {"reduction_factor", reduction_factor},
            {"schedule", schedule == brackets_of::bohb ? "bohb" : "ray"},
            {"brackets", brackets_j},
            {"closed", state_.closed},
            {"num_stopped", state_.num_stopped},
            {"resume", state_.decided.resume},
            {"stop", state_.decided.stop}};
  }

  /// Restores what `save_state` returned. The knobs must be the ones it was saved with.
  void restore_state(nlohmann::json const& s) {
    std::string const who = "schedule::hyperband";
    std::string const saved_schedule = s.value("schedule", std::string("ray"));
    if (s.value("max_t", max_t) != max_t || s.value("reduction_factor", reduction_factor) != reduction_factor ||
        saved_schedule != (schedule == brackets_of::bohb ? "bohb" : "ray"))
      throw cohort::error(who + ": the saved state was made with max_t " + s.at("max_t").dump() + ", reduction_factor " +
                          s.at("reduction_factor").dump() + " and the " + saved_schedule +
                          " schedule; restore with the knobs it was saved with");
    auto const planned = schedule_for_knobs();
    std::vector<detail::hyperband_bracket_state> brackets;
    std::map<std::string, std::size_t> trial_bracket;
    for (auto const& bj : s.at("brackets")) {
      detail::hyperband_bracket_state b;
      b.band = bj.at("band").get<std::size_t>();
      b.index = bj.at("index").get<std::size_t>();
      b.stage = bj.at("stage").get<std::size_t>();
      b.progress = bj.value("progress", 0.0);
      b.added = bj.at("added").get<std::size_t>();
      if (b.index >= planned.size() || b.stage >= planned[b.index].milestones.size())
        throw cohort::error(who + ": the saved state's brackets differ from these knobs' (max_t " + std::to_string(max_t) +
                            "); restore with the knobs it was saved with");
      for (auto const& t : bj.at("live")) {
        b.live.push_back({t.at("id").get<std::string>(), t.at("time").get<double>(), detail::number_or(t.at("value"), detail::nan_v)});
        trial_bracket[b.live.back().id] = brackets.size();
      }
      brackets.push_back(std::move(b));
    }
    state_.brackets = std::move(brackets);
    state_.trial_bracket = std::move(trial_bracket);
    state_.closed = s.value("closed", false);
    state_.num_stopped = s.value("num_stopped", std::size_t{0});
    state_.decided = {s.value("resume", std::vector<std::string>{}), s.value("stop", std::vector<std::string>{})};
  }

  /// Under tune_config::reproducible: how many of the first trials must have ended before trial
  /// number `k` (counting from 0) is suggested, so that a learning searcher (search::bohb) knows
  /// the same results then in every run: all trials of the brackets two or more before trial k's.
  /// Never its own bracket's or the previous one's, whose trials may still be paused waiting for
  /// that bracket to fill. Brackets fill in order to n0 trials each (accepting()), so trial k's
  /// bracket follows from k.
  std::size_t trials_settled_before(std::size_t k) const {
    require_setup();
    std::size_t begin = 0, previous_begin = 0, index = 0;  // the bracket [begin, begin + n0) and the one before
    while (true) {
      auto const n0 = static_cast<std::size_t>(state_.schedule.at(index).milestones.at(0).trials);
      if (k < begin + n0) return previous_begin;
      previous_begin = begin;
      begin += n0;
      index = (index + 1) % state_.schedule.size();
    }
  }

  /// How many trials were stopped at a milestone so far.
  std::size_t num_stopped() const { return state_.num_stopped; }

  /// Each bracket made: (band, s, trials live, current milestone), in order (for inspection and tests).
  std::vector<std::tuple<std::size_t, int, std::size_t, std::int64_t>> brackets() const {
    std::vector<std::tuple<std::size_t, int, std::size_t, std::int64_t>> out;
    for (auto const& b : state_.brackets) out.emplace_back(b.band, schedule_of(b).s, b.live.size(), milestone(b).iteration);
    return out;
  }

  /// Ray's debug_string: "Using HyperBand: num_stopped=N total_brackets=B", then per band
  /// "Round #k:" and a line per bracket with its size, milestone, completion and live trials.
  std::string debug_string() const {
    std::string out = "Using HyperBand: num_stopped=" + std::to_string(state_.num_stopped) +
                      " total_brackets=" + std::to_string(state_.brackets.size());
    std::size_t band = static_cast<std::size_t>(-1);
    for (auto const& b : state_.brackets) {
      if (b.band != band) out += "\nRound #" + std::to_string(band = b.band) + ":";
      auto const m = milestone(b);
      char buf[160];
      std::snprintf(buf, sizeof buf, "\n  Bracket(Max Size (n)=%lld, Milestone (r)=%lld, completed=%.1f%%): %zu live",
                    static_cast<long long>(m.trials), static_cast<long long>(m.iteration), 100 * b.progress / total_work(b),
                    b.live.size());
      out += buf;
    }
    return out;
  }

  /// Brackets, live trials and decisions not yet taken (not a knob; only hyperband reaches it).
  cohort::detail::internal_state<detail::hyperband_state, hyperband> state_{};

 private:
  std::vector<hyperband_bracket> schedule_for_knobs() const {
    return schedule == brackets_of::bohb ? bohb_brackets(max_t, reduction_factor) : hyperband_brackets(max_t, reduction_factor);
  }

  void require_setup() const {
    if (!state_.ready) throw cohort::error("schedule::hyperband: used before setup(objective); the tuner calls setup first");
  }

  hyperband_bracket const& schedule_of(detail::hyperband_bracket_state const& b) const { return state_.schedule.at(b.index); }
  hyperband_milestone const& milestone(detail::hyperband_bracket_state const& b) const {
    return schedule_of(b).milestones.at(b.stage);
  }
  bool last_milestone(detail::hyperband_bracket_state const& b) const { return b.stage + 1 == schedule_of(b).milestones.size(); }
  double total_work(detail::hyperband_bracket_state const& b) const {
    double work = 0, before = 0;
    for (auto const& m : schedule_of(b).milestones) {
      work += static_cast<double>(m.trials) * (static_cast<double>(m.iteration) - before);
      before = static_cast<double>(m.iteration);
    }
    return std::max(work, 1.0);
  }

  /// Whether bracket `b` may still get trials: the newest, before its first milestone, given
  /// fewer than n0 trials so far, and the searcher not exhausted.
  bool accepting(std::size_t b) const {
    auto const& br = state_.brackets[b];
    return b + 1 == state_.brackets.size() && br.stage == 0 && !state_.closed &&
           static_cast<std::int64_t>(br.added) < milestone(br).trials;
  }

  static detail::hyperband_trial* find_live(detail::hyperband_bracket_state& b, std::string const& id) {
    auto it = std::find_if(b.live.begin(), b.live.end(), [&](auto const& t) { return t.id == id; });
    return it == b.live.end() ? nullptr : &*it;
  }

  /// Ray's _Bracket.continue_trial: below the current milestone (or past the last one when the
  /// last trials are not stopped).
  bool continues(detail::hyperband_bracket_state const& b, detail::hyperband_trial const& t) const {
    if (!stop_last_trials && last_milestone(b)) return true;
    return t.time < static_cast<double>(milestone(b).iteration);
  }

  /// Ray's _process_bracket: once the milestone is done (every live trial reached it, none will
  /// join), the best go on and the rest stop. Returns what `current` (the reporting trial, null
  /// for none) does; decisions about the others go to state_.decided.
  tuning::decision process(std::size_t bi, std::string const* current) {
    auto& b = state_.brackets[bi];
    auto const at = static_cast<double>(milestone(b).iteration);
    bool const done = !accepting(bi) && std::all_of(b.live.begin(), b.live.end(), [&](auto const& t) { return t.time >= at; });
    if (!done) return tuning::decision::pause;
    auto what = tuning::decision::pause;
    auto stop = [&](std::string const& id) {
      if (current && id == *current) what = tuning::decision::stop;
      else state_.decided.stop.push_back(id);
    };
    if (last_milestone(b)) {
      if (!stop_last_trials) return what;
      for (auto const& t : b.live) stop(t.id);
      b.live.clear();
      return what;
    }
    ++b.stage;
    auto const keep = static_cast<std::size_t>(milestone(b).trials);
    auto ranked = b.live;  // worst first; ties in order of addition (the later ranks higher)
    std::stable_sort(ranked.begin(), ranked.end(), [](auto const& x, auto const& y) {
      return (std::isnan(x.value) && !std::isnan(y.value)) || x.value < y.value;
    });
    auto const cut = ranked.size() > keep ? ranked.size() - keep : 0;
    for (std::size_t k = 0; k < cut; ++k) {
      stop(ranked[k].id);
      ++state_.num_stopped;
      std::erase_if(b.live, [&](auto const& t) { return t.id == ranked[k].id; });
    }
    bool ahead = !b.live.empty();  // every trial left already past the next milestone
    for (auto const& t : b.live) {
      if (!continues(b, t)) continue;  // already past the next milestone: waits there
      ahead = false;
      if (current && t.id == *current) what = tuning::decision::proceed;
      else state_.decided.resume.push_back(t.id);
    }
    if (ahead && what != tuning::decision::stop) return process(bi, current);
    return what;
  }
};
static_assert(cohort::scheduler<hyperband>);

}  // namespace cohort::tuning::schedule
