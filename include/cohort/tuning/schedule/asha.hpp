#pragma once
/// \file
/// Asynchronous successive halving (Ray's AsyncHyperBandScheduler, "ASHA").

#include <cstdio>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/tuning/schedule/common.hpp"

namespace cohort::tuning::schedule {

namespace detail {

/// One rung of an ASHA bracket: a milestone and the (signed) values recorded there.
struct asha_rung {
  double milestone = 0;
  std::map<std::string, double> recorded{};
};

/// ASHA's state, internal.
struct asha_state {
  bool ready = false;
  resolved_objective objective{};
  std::vector<std::vector<asha_rung>> brackets{};  ///< rungs largest milestone first
  std::map<std::string, std::size_t> trial_bracket{};
  std::mt19937_64 rng{};
  std::size_t num_stopped = 0;
  bool restored = false;  ///< setup after restore_state keeps the restored rng
};

}  // namespace detail

/// Asynchronous successive halving (Ray's AsyncHyperBandScheduler, "ASHA", with Ray's defaults).
///
/// Bracket s has rungs at `grace_period * reduction_factor^(k + s)` for k = 0 .. MAX_RUNGS - s - 1,
/// MAX_RUNGS = int(log(max_t / grace_period) / log(reduction_factor) + 1), largest first (the
/// largest may equal max_t). On each result: a trial at `time_attr >= max_t` stops (if
/// `stop_last_trials`); otherwise at the largest milestone it has reached and not yet recorded
/// at, its value (metric, negated for min) is compared with the cutoff, numpy's linearly
/// interpolated (1 - 1/reduction_factor) percentile of the values recorded there before; it stops
/// when below, and its value is recorded there either way. Trials are dealt to brackets at
/// random with Ray's softmax over the bracket sizes, from `seed`; with one bracket (the default)
/// that draws nothing.
///
/// Preconditions, checked by `setup`: max_t > 0, 0 < grace_period <= max_t, reduction_factor > 1,
/// brackets >= 1, a metric here or in the objective.
struct asha {
  /// What runs next does not wait for completions (tuning::independent_of_completions).
  static constexpr bool next_independent_of_completions = true;
  std::string time_attr = "training_iteration";  ///< the result key that measures progress (monotone)
  std::string metric{};                          ///< empty: the objective's metric
  std::optional<cohort::order> mode{};           ///< unset: the objective's mode
  double max_t = 100;                            ///< trials stop at this time_attr
  double grace_period = 1;                       ///< the first rung; no trial stops before it
  double reduction_factor = 4;                   ///< about 1 in reduction_factor trials passes each rung
  std::size_t brackets = 1;                      ///< brackets with fewer, later rungs each
  bool stop_last_trials = true;                  ///< stop trials that reach max_t
  std::uint64_t seed = 0;                        ///< bracket assignment, when brackets > 1

  /// Checks the knobs, fixes metric and mode, builds the rungs. Call once, before any trial.
  void setup(tuning::objective const& o) {
    std::string const who = "schedule::asha";
    if (!(max_t > 0)) throw cohort::error(who + ": .max_t must be positive; set it to the longest a trial may run");
    if (!(grace_period > 0)) throw cohort::error(who + ": .grace_period must be positive");
    if (!(grace_period <= max_t)) throw cohort::error(who + ": .grace_period must be at most .max_t; lower it");
    if (!(reduction_factor > 1))
      throw cohort::error(who + ": .reduction_factor must be greater than 1 (Ray's default is 4)");
    if (brackets < 1) throw cohort::error(who + ": .brackets must be at least 1");
    state_.objective = detail::resolve(metric, mode, o, who);
    if (state_.brackets.empty()) state_.brackets = make_brackets();
    if (!state_.restored) state_.rng.seed(seed);
    state_.ready = true;
  }

  /// Deals the trial to a bracket. A trial id added twice keeps its first bracket.
  void on_trial_add(std::string const& id, nlohmann::json const&) {
    require_setup();
    if (state_.trial_bracket.contains(id)) return;
    std::size_t b = 0;
    if (state_.brackets.size() > 1) {
      // Ray: p = softmax(len(rungs)) and np.random.choice(p=p): the first b with u < cdf[b].
      double max_size = 0;
      for (auto const& br : state_.brackets) max_size = std::max(max_size, static_cast<double>(br.size()));
      std::vector<double> cdf;
      double total = 0;
      for (auto const& br : state_.brackets)
        cdf.push_back(total += std::exp(static_cast<double>(br.size()) - max_size));
      double const u = detail::uniform01(state_.rng) * total;
      while (b + 1 < cdf.size() && !(u < cdf[b])) ++b;
    }
    state_.trial_bracket[id] = b;
  }

  /// Proceed, or stop at max_t or below a rung's cutoff (see the type's description).
  /// Throws cohort::error when the result lacks the metric or time_attr, or the trial was not added.
  tuning::scheduling_decision on_trial_result(std::string const& id, nlohmann::json const& result) {
    require_setup();
    double const t = detail::number(result, time_attr, "schedule::asha", id);
    double const value = state_.objective.sign * detail::number(result, state_.objective.metric, "schedule::asha", id);
    auto it = state_.trial_bracket.find(id);
    if (it == state_.trial_bracket.end())
      throw cohort::error("schedule::asha: a result for trial " + id +
                          ", which was never added; call on_trial_add first");
    tuning::scheduling_decision d{};
    if (t >= max_t && stop_last_trials)
      d.what = tuning::decision::stop;
    else
      d.what = on_bracket_result(state_.brackets[it->second], id, t, value);
    if (d.what == tuning::decision::stop) ++state_.num_stopped;
    return d;
  }

  /// The trial's results that on_trial_result will answer `proceed`: those with time_attr below
  /// the first milestone of its bracket it has not recorded at, and below max_t (stop_last_trials).
  /// Other trials' results move the rungs' cutoffs, not this span. None for a trial not added.
  tuning::proceed_span proceeds(std::string const& id) const {
    tuning::proceed_span out{.key = time_attr, .below = stop_last_trials ? max_t : detail::inf_v};
    auto it = state_.trial_bracket.find(id);
    if (it == state_.trial_bracket.end()) return {.key = time_attr, .below = -detail::inf_v};
    for (auto const& rung : state_.brackets[it->second])
      if (!rung.recorded.contains(id)) out.below = std::min(out.below, rung.milestone);
    return out;
  }

  /// Records the trial's last result at a rung it reached (as Ray does) and forgets the trial.
  /// A last result without the metric or time_attr (a failed trial) records nothing.
  void on_trial_complete(std::string const& id, nlohmann::json const& last_result) {
    auto it = state_.trial_bracket.find(id);
    if (it == state_.trial_bracket.end()) return;
    if (detail::has_numbers(last_result, time_attr, state_.objective.metric))
      on_bracket_result(state_.brackets[it->second], id, detail::find(last_result, time_attr)->get<double>(),
                        state_.objective.sign * detail::find(last_result, state_.objective.metric)->get<double>());
    state_.trial_bracket.erase(it);
  }

  /// Rungs with their recorded values, live trials' brackets, the rng and the stop count.
  nlohmann::json save_state() const {
    nlohmann::json brackets_j = nlohmann::json::array();
    for (auto const& br : state_.brackets) {
      nlohmann::json rungs = nlohmann::json::array();
      for (auto const& r : br) {
        nlohmann::json rec = nlohmann::json::object();
        for (auto const& [tid, v] : r.recorded) rec[tid] = detail::number_or_null(v);
        rungs.push_back({{"milestone", r.milestone}, {"recorded", rec}});
      }
      brackets_j.push_back(rungs);
    }
    return {{"brackets", brackets_j},
            {"trial_bracket", state_.trial_bracket},
            {"rng", detail::rng_text(state_.rng)},
            {"num_stopped", state_.num_stopped}};
  }

  /// Restores what `save_state` returned. The knobs must be the ones it was saved with.
  void restore_state(nlohmann::json const& s) {
    std::string const who = "schedule::asha";
    auto mine = make_brackets();
    auto const& bj = s.at("brackets");
    if (bj.size() != mine.size())
      throw cohort::error(who + ": the saved state has " + std::to_string(bj.size()) + " brackets, these knobs make " +
                          std::to_string(mine.size()) + "; restore with the knobs it was saved with");
    for (std::size_t b = 0; b < mine.size(); ++b) {
      if (bj[b].size() != mine[b].size())
        throw cohort::error(
            who + ": the saved state's rungs differ from these knobs'; restore with the knobs it was saved with");
      for (std::size_t r = 0; r < mine[b].size(); ++r)
        for (auto const& [tid, v] : bj[b][r].at("recorded").items())
          mine[b][r].recorded[tid] = detail::number_or(v, detail::nan_v);
    }
    state_.brackets = std::move(mine);
    state_.trial_bracket = s.at("trial_bracket").get<std::map<std::string, std::size_t>>();
    for (auto const& [tid, b] : state_.trial_bracket)
      if (b >= state_.brackets.size())
        throw cohort::error(who + ": the saved state puts trial " + tid +
                            " in a bracket these knobs lack; restore with the knobs it was saved with");
    detail::set_rng_text(state_.rng, s.at("rng"), who);
    state_.num_stopped = s.value("num_stopped", std::size_t{0});
    state_.restored = true;
  }

  /// The milestones of bracket `b`, largest first (for inspection and tests).
  std::vector<double> milestones(std::size_t b = 0) const {
    auto const all = make_brackets();
    std::vector<double> out;
    for (auto const& r : all.at(b)) out.push_back(r.milestone);
    return out;
  }

  /// How many trials asha has stopped so far.
  std::size_t num_stopped() const { return state_.num_stopped; }

  /// Ray's debug_string: "Using AsyncHyperBand: num_stopped=N", then a line per bracket with
  /// each rung's milestone and cutoff (in the metric's own units; None before a value is
  /// recorded there), largest milestone first. The tuner's status table prints it.
  std::string debug_string() const {
    std::string out = "Using AsyncHyperBand: num_stopped=" + std::to_string(state_.num_stopped);
    for (auto const& rungs : state_.brackets) {
      out += "\nBracket:";
      for (std::size_t k = 0; k < rungs.size(); ++k) {
        double const cutoff = cutoff_of(rungs[k]);
        char buf[96];
        if (std::isnan(cutoff)) std::snprintf(buf, sizeof buf, "%s Iter %.3f: None", k ? " |" : "", rungs[k].milestone);
        else std::snprintf(buf, sizeof buf, "%s Iter %.3f: %.5g", k ? " |" : "", rungs[k].milestone, state_.objective.sign * cutoff);
        out += buf;
      }
    }
    return out;
  }

  /// The bracket each trial was placed in, by trial id.
  std::map<std::string, std::size_t> const& trial_brackets() const { return state_.trial_bracket; }

  /// Brackets, rungs and the rng (not a knob; only asha reaches it).
  cohort::detail::internal_state<detail::asha_state, asha> state_{};

 private:
  void require_setup() const {
    if (!state_.ready) throw cohort::error("schedule::asha: used before setup(objective); the tuner calls setup first");
  }

  std::vector<std::vector<detail::asha_rung>> make_brackets() const {
    std::vector<std::vector<detail::asha_rung>> out;
    for (std::size_t s = 0; s < brackets; ++s) {
      // Ray: MAX_RUNGS = int(np.log(max_t / min_t) / np.log(rf) - s + 1); int() truncates toward 0.
      double const count = std::log(max_t / grace_period) / std::log(reduction_factor) - static_cast<double>(s) + 1;
      auto const max_rungs = static_cast<long long>(std::trunc(count));
      std::vector<detail::asha_rung> rungs;
      for (long long k = max_rungs - 1; k >= 0; --k)
        rungs.push_back(
            {grace_period * std::pow(reduction_factor, static_cast<double>(k) + static_cast<double>(s)), {}});
      out.push_back(std::move(rungs));
    }
    return out;
  }

  /// Ray's _Bracket.cutoff: the (1 - 1/reduction_factor) percentile of the (signed) values
  /// recorded at `rung`; NaN when none is.
  double cutoff_of(detail::asha_rung const& rung) const {
    std::vector<double> values;
    for (auto const& [tid, v] : rung.recorded) values.push_back(v);
    return detail::nan_percentile(std::move(values), (1 - 1 / reduction_factor) * 100);
  }

  /// Ray's _Bracket.on_result.
  tuning::decision on_bracket_result(std::vector<detail::asha_rung>& rungs, std::string const& id, double t,
                                     double value) const {
    auto what = tuning::decision::proceed;
    for (auto& rung : rungs) {
      bool const seen = rung.recorded.contains(id);
      if (t >= rung.milestone && seen && !stop_last_trials) break;
      if (t < rung.milestone || seen) continue;
      if (!rung.recorded.empty() && value < cutoff_of(rung)) what = tuning::decision::stop;
      rung.recorded[id] = value;
      break;
    }
    return what;
  }
};
static_assert(cohort::scheduler<asha>);

}  // namespace cohort::tuning::schedule
