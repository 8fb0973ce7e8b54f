#pragma once
/// \file
/// Trial schedulers (Ray Tune's FIFOScheduler, AsyncHyperBandScheduler, MedianStoppingRule and
/// PopulationBasedTraining): after every reported result they decide whether a trial proceeds,
/// stops, pauses or (PBT) exploits another trial. Each decision is a pure function of the results
/// seen so far (and, for PBT and multi-bracket ASHA, of a seeded std::mt19937_64 whose state is part
/// of `save_state`), so the tuner makes it on one rank and the tests check it on hand-computed
/// learning curves. None of them communicates.
///
/// A `result` is a JSON object with the user's metrics and the keys the tuner fills in:
/// `training_iteration` (1, 2, ...), `time_total_s`, `time_this_iter_s`, `timestamp`. A metric or
/// time attribute named "a/b" is looked up as that key, else as the path a -> b in nested objects
/// (Ray flattens results the same way).
///
/// Each scheduler may carry its own `metric`/`mode`; an empty `metric` (unset `mode`) takes the
/// tuner's `tuning::objective` given to `setup`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/concepts.hpp"
#include "cohort/error.hpp"
#include "cohort/tuning/decision.hpp"

namespace cohort::schedule {

namespace detail {

using nlohmann::json;

inline constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();
inline constexpr double inf_v = std::numeric_limits<double>::infinity();

using tuning::detail::keys_of;

/// The value named `key` in `j` (a key, else an "a/b" path); null when absent.
inline json const* find(json const& j, std::string const& key) { return tuning::detail::find_key(j, key); }

/// The number named `key` in a result; throws naming the key and the keys present (Ray's strict
/// metric check) when it is missing or not a number.
inline double number(json const& result, std::string const& key, std::string const& who, std::string const& id) {
  json const* v = find(result, key);
  if (v == nullptr)
    throw cohort::error(who + ": the result of trial " + id + " has no \"" + key + "\" (its keys: " + keys_of(result) +
                        "); report it in every result or point " + who + " at a reported key");
  if (!v->is_number())
    throw cohort::error(who + ": \"" + key + "\" in the result of trial " + id + " is " + v->dump() +
                        ", not a number; report a number");
  return v->get<double>();
}

/// True when the result holds both keys (on_trial_complete skips results without them: a
/// failed trial's last result may be null).
inline bool has_numbers(json const& result, std::string const& a, std::string const& b) {
  auto x = find(result, a), y = find(result, b);
  return x != nullptr && y != nullptr && x->is_number() && y->is_number();
}

/// The metric and direction a scheduler uses: its own, else the objective's.
struct resolved_objective {
  std::string metric{};
  double sign = 1.0;  ///< +1 for max, -1 for min (Ray's metric_op)
};

inline resolved_objective resolve(std::string const& own_metric, std::optional<cohort::order> own_mode,
                                  tuning::objective const& o, std::string const& who) {
  resolved_objective r{own_metric.empty() ? o.metric : own_metric, 1.0};
  if (r.metric.empty())
    throw cohort::error(who + " needs a metric: set " + who + "'s .metric or the tuner's objective metric");
  r.sign = own_mode.value_or(o.mode) == cohort::order::max ? 1.0 : -1.0;
  return r;
}

/// A JSON number, or null for NaN and infinities (which JSON cannot hold).
inline json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }
inline double number_or(json const& j, double fallback) { return j.is_number() ? j.get<double>() : fallback; }

/// Uniform in [0, 1) from the top 53 bits of one draw: the same on every standard library
/// (std::uniform_real_distribution is not).
inline double uniform01(std::mt19937_64& g) { return std::ldexp(static_cast<double>(g() >> 11), -53); }

/// Uniform index in [0, n), n > 0, from one draw.
inline std::size_t pick(std::mt19937_64& g, std::size_t n) {
  return std::min(n - 1, static_cast<std::size_t>(uniform01(g) * static_cast<double>(n)));
}

inline std::string rng_text(std::mt19937_64 const& g) {
  std::ostringstream s;
  s << g;
  return s.str();
}

inline void set_rng_text(std::mt19937_64& g, json const& j, std::string const& who) {
  std::istringstream s(j.is_string() ? j.get<std::string>() : std::string{});
  s >> g;
  if (!s) throw cohort::error(who + ": saved state has no valid \"rng\"; restore from a state saved by " + who);
}

/// numpy's nanpercentile with its default "linear" method: NaNs dropped, virtual index
/// (n - 1) * q / 100, and numpy's two-sided lerp. NaN when nothing is left.
inline double nan_percentile(std::vector<double> v, double percent) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  if (v.empty()) return nan_v;
  std::sort(v.begin(), v.end());
  auto const n = v.size();
  double const virtual_index = static_cast<double>(n - 1) * (percent / 100.0);
  double const previous = std::floor(virtual_index);
  double const gamma = virtual_index - previous;
  std::size_t lo = static_cast<std::size_t>(std::max(previous, 0.0)), hi = lo + 1;
  if (virtual_index >= static_cast<double>(n - 1)) lo = hi = n - 1;
  if (virtual_index < 0) lo = hi = 0;
  double const a = v[lo], b = v[hi], diff = b - a;
  return gamma >= 0.5 ? b - diff * (1 - gamma) : a + diff * gamma;
}

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

/// First in, first out: every trial runs to its end (Ray's FIFOScheduler, the default).
struct fifo {
  /// Nothing to set up.
  void setup(tuning::objective const&) {}
  /// Nothing to track.
  void on_trial_add(std::string const&, nlohmann::json const&) {}
  /// Always `proceed`.
  tuning::scheduling_decision on_trial_result(std::string const&, nlohmann::json const&) { return {}; }
  /// Nothing to track.
  void on_trial_complete(std::string const&, nlohmann::json const&) {}
  /// An empty object: fifo has no state.
  nlohmann::json save_state() const { return nlohmann::json::object(); }
  /// Nothing to restore.
  void restore_state(nlohmann::json const&) {}
};
static_assert(cohort::scheduler<fifo>);

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

  /// Internal state, not a knob: leave it out of the initializer.
  detail::asha_state state_{};

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

  /// Ray's _Bracket.on_result.
  tuning::decision on_bracket_result(std::vector<detail::asha_rung>& rungs, std::string const& id, double t,
                                     double value) const {
    auto what = tuning::decision::proceed;
    for (auto& [milestone, recorded] : rungs) {
      bool const seen = recorded.contains(id);
      if (t >= milestone && seen && !stop_last_trials) break;
      if (t < milestone || seen) continue;
      if (!recorded.empty()) {
        std::vector<double> values;
        for (auto const& [tid, v] : recorded) values.push_back(v);
        double const cutoff = detail::nan_percentile(std::move(values), (1 - 1 / reduction_factor) * 100);
        if (value < cutoff) what = tuning::decision::stop;
      }
      recorded[id] = value;
      break;
    }
    return what;
  }
};
static_assert(cohort::scheduler<asha>);

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

  /// Internal state, not a knob: leave it out of the initializer.
  detail::median_state state_{};

 private:
  void require_setup() const {
    if (!state_.ready)
      throw cohort::error("schedule::median_stopping: used before setup(objective); the tuner calls setup first");
  }
};
static_assert(cohort::scheduler<median_stopping>);

/// A continuous or integer range a PBT hyperparameter moves in: perturbation multiplies by a
/// perturbation factor and clamps to [low, high]; resampling draws uniformly (log-uniformly with
/// `log`) from [low, high], or calls `resample` when given. With `integer` (or when the config
/// holds an integer) values are rounded to the nearest integer. Without `resample`, low and high
/// must be finite, low <= high, and low > 0 for `log`.
struct mutation_range {
  double low = -std::numeric_limits<double>::infinity();       ///< smallest value (inclusive)
  double high = std::numeric_limits<double>::infinity();       ///< largest value (inclusive)
  bool log = false;                                            ///< resample log-uniformly
  bool integer = false;                                        ///< round to integers
  std::function<nlohmann::json(std::mt19937_64&)> resample{};  ///< custom resampling (Ray's lambda)
};

/// How PBT explores one hyperparameter: a list of allowed values (perturbation moves to a
/// neighbouring entry, clamped at the ends; resampling picks any entry), or a `range`.
/// `mutation::values({16, 32, 64})`, `mutation::range{.low = 1e-4, .high = 1e-1, .log = true}`.
class mutation {
 public:
  using range = mutation_range;

  /// A continuous or integer range (implicit, so a `range{...}` is a mutation).
  mutation(range r) : what_(std::move(r)) {}

  /// A list of allowed values, in the order "neighbouring" refers to.
  static mutation values(std::vector<nlohmann::json> allowed) { return mutation(std::move(allowed)); }

  /// The allowed values, or null for a range.
  std::vector<nlohmann::json> const* as_values() const { return std::get_if<0>(&what_); }
  /// The range, or null for a list of values.
  range const* as_range() const { return std::get_if<1>(&what_); }

 private:
  explicit mutation(std::vector<nlohmann::json> v) : what_(std::move(v)) {}
  std::variant<std::vector<nlohmann::json>, range> what_;
};

namespace detail {

/// One PBT trial as the scheduler tracks it.
struct pbt_trial {
  std::string id{};
  nlohmann::json config{};
  std::optional<double> last_score{};  ///< signed metric at the last perturbation check
  double last_perturbation_time = 0;
  double last_train_time = 0;
  bool finished = false;
};

/// PBT's state, internal.
struct pbt_state {
  bool ready = false;
  resolved_objective objective{};
  std::vector<pbt_trial> trials{};  ///< in the order they were added
  std::mt19937_64 rng{};
  std::size_t num_perturbations = 0;
  bool restored = false;  ///< setup after restore_state keeps the restored rng
};

/// A config's value at a mutation key: the key itself, else an "a/b" path.
inline nlohmann::json::json_pointer pointer_for(nlohmann::json const& config, std::string const& key) {
  nlohmann::json::json_pointer p;
  if (config.is_object() && config.contains(key)) return p / key;
  std::size_t begin = 0;
  while (true) {
    auto slash = key.find('/', begin);
    p /= key.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    if (slash == std::string::npos) return p;
    begin = slash + 1;
  }
}

inline nlohmann::json as_number(double x, bool integer) {
  if (integer) return nlohmann::json(static_cast<std::int64_t>(std::llround(x)));
  return nlohmann::json(x);
}

inline nlohmann::json resample_range(mutation_range const& r, bool integer, std::mt19937_64& g) {
  if (r.resample) return r.resample(g);
  if (integer && !r.log) {
    double const lo = std::ceil(r.low), hi = std::floor(r.high);
    return nlohmann::json(static_cast<std::int64_t>(lo) +
                          static_cast<std::int64_t>(pick(g, static_cast<std::size_t>(hi - lo) + 1)));
  }
  double const u = uniform01(g);
  double x =
      r.log ? std::exp(std::log(r.low) + u * (std::log(r.high) - std::log(r.low))) : r.low + u * (r.high - r.low);
  x = std::clamp(integer ? std::round(x) : x, r.low, r.high);
  return as_number(x, integer);
}

}  // namespace detail

/// Population based training (Ray's PopulationBasedTraining, asynchronous mode).
///
/// When a trial's `time_attr` is at least `perturbation_interval` past its last perturbation (and
/// not below `burn_in_period`), its score (metric, negated for min) is recorded and all unfinished
/// trials with a score are ranked (stable: ties keep the order trials were added). With n of them,
/// n > 1, the bottom and top q = min(ceil(n * quantile_fraction), floor(n / 2)) are the lower and
/// upper quantiles. A trial in the lower quantile exploits a uniformly chosen upper-quantile trial:
/// the decision is `exploit` with that `donor` and the donor's config explored key by key, in
/// `hyperparam_mutations` order: with probability `resample_probability` (or when the donor's
/// value is missing, or not in a value list) a fresh value is drawn; otherwise a list value moves
/// to a neighbouring entry (left or right with equal odds, clamped) and a range value is multiplied
/// by one of `perturbation_factors` (chosen uniformly), clamped to the range, and rounded if
/// integer. `custom_explore`, if set, then maps the config. The trial takes that config and the
/// donor's perturbation time. Anything else proceeds. Randomness comes from `seed` only.
///
/// Differences from Ray: the exploit does not wait on the donor having saved a checkpoint at its
/// own last perturbation (cohort's trials report their own checkpoints; the tuner clones the
/// donor's latest); range values are clamped and integers rounded (Ray neither clamps and it
/// truncates); a key missing from a trial's initial config is not filled in at on_trial_add (the
/// scheduler cannot change the config a trial starts with) but is drawn at its first exploit; and
/// there is no PAUSE to time-share trials, which is the tuner's concern.
///
/// Preconditions, checked by `setup`: perturbation_interval > 0, 0 <= quantile_fraction <= 0.5,
/// 0 <= resample_probability <= 1, perturbation_factors not empty, mutations or custom_explore set,
/// a metric here or in the objective.
struct pbt {
  std::string time_attr = "training_iteration";  ///< the result key that measures progress (monotone)
  std::string metric{};                          ///< empty: the objective's metric
  std::optional<cohort::order> mode{};           ///< unset: the objective's mode
  double perturbation_interval = 4;              ///< time_attr between perturbations of a trial
  double burn_in_period = 0;                     ///< no perturbation before this time_attr
  std::vector<std::pair<std::string, mutation>> hyperparam_mutations{};  ///< key ("a/b" nests) -> mutation
  double quantile_fraction = 0.25;                                       ///< size of the bottom and top quantiles
  double resample_probability = 0.25;                                    ///< chance a mutated key is drawn afresh
  std::vector<double> perturbation_factors = {1.2, 0.8};                 ///< multipliers for range values
  std::function<nlohmann::json(nlohmann::json, std::mt19937_64&)> custom_explore{};  ///< applied after the mutations
  std::uint64_t seed = 0;                                                            ///< all of PBT's randomness

  /// Checks the knobs, fixes metric and mode, seeds the rng. Call once, before any trial.
  void setup(tuning::objective const& o) {
    std::string const who = "schedule::pbt";
    if (!(perturbation_interval > 0)) throw cohort::error(who + ": .perturbation_interval must be positive");
    if (!(quantile_fraction >= 0 && quantile_fraction <= 0.5))
      throw cohort::error(who + ": .quantile_fraction must be between 0 and 0.5");
    if (!(resample_probability >= 0 && resample_probability <= 1))
      throw cohort::error(who + ": .resample_probability must be between 0 and 1");
    if (perturbation_factors.empty())
      throw cohort::error(who + ": .perturbation_factors is empty; give at least one, e.g. {1.2, 0.8}");
    if (hyperparam_mutations.empty() && !custom_explore)
      throw cohort::error(who + ": nothing to explore; set .hyperparam_mutations or .custom_explore");
    for (auto const& [key, m] : hyperparam_mutations) {
      if (auto v = m.as_values(); v && v->empty())
        throw cohort::error(who + ": the value list for \"" + key + "\" is empty; give at least one value");
      if (auto r = m.as_range(); r && r->low > r->high)
        throw cohort::error(who + ": the range for \"" + key + "\" has .low > .high; swap them");
      if (auto r = m.as_range(); r && !r->resample) {
        if (!std::isfinite(r->low) || !std::isfinite(r->high))
          throw cohort::error(who + ": the range for \"" + key +
                              "\" needs a finite .low and .high, or a .resample function");
        if (r->log && !(r->low > 0)) throw cohort::error(who + ": the log range for \"" + key + "\" needs .low > 0");
        if (r->integer && !r->log && std::ceil(r->low) > std::floor(r->high))
          throw cohort::error(who + ": the integer range for \"" + key + "\" holds no integer; widen it");
      }
    }
    state_.objective = detail::resolve(metric, mode, o, who);
    if (!state_.restored) state_.rng.seed(seed);
    state_.ready = true;
  }

  /// Starts tracking the trial with its initial config. Adding a known trial again replaces the
  /// config PBT holds for it and keeps its score and times: the tuner does so when it could not
  /// carry out an exploit (the donor had no checkpoint yet) and the trial goes on as it was.
  void on_trial_add(std::string const& id, nlohmann::json const& config) {
    require_setup();
    if (auto* me = find(id)) {
      me->config = config;
      return;
    }
    state_.trials.push_back({.id = id, .config = config});
  }

  /// Proceed, or `exploit` for a lower-quantile trial at its perturbation time (see the type's
  /// description). Throws cohort::error when the result lacks the metric or time_attr (Ray's
  /// require_attrs), or the trial was not added.
  tuning::scheduling_decision on_trial_result(std::string const& id, nlohmann::json const& result) {
    require_setup();
    double const t = detail::number(result, time_attr, "schedule::pbt", id);
    double const value = detail::number(result, state_.objective.metric, "schedule::pbt", id);
    auto* me = find(id);
    if (me == nullptr)
      throw cohort::error("schedule::pbt: a result for trial " + id +
                          ", which was never added; call on_trial_add first");
    if (t < burn_in_period) return {};
    if (t - me->last_perturbation_time < perturbation_interval) return {};
    me->last_score = state_.objective.sign * value;
    me->last_train_time = t;
    me->last_perturbation_time = t;

    auto [lower, upper] = quantiles();
    if (std::find(lower.begin(), lower.end(), me) == lower.end() || upper.empty()) return {};
    detail::pbt_trial const* donor = upper[detail::pick(state_.rng, upper.size())];
    nlohmann::json config = explore(donor->config);
    me->config = config;
    me->last_perturbation_time = donor->last_perturbation_time;
    me->last_train_time = donor->last_train_time;
    ++state_.num_perturbations;
    return {.what = tuning::decision::exploit, .donor = donor->id, .config = std::move(config)};
  }

  /// Leaves the trial out of later rankings (Ray ranks only unfinished trials).
  void on_trial_complete(std::string const& id, nlohmann::json const&) {
    if (auto* me = find(id)) me->finished = true;
  }

  /// Every trial's config, score and times, the rng and the exploit count.
  nlohmann::json save_state() const {
    nlohmann::json trials = nlohmann::json::array();
    for (auto const& tr : state_.trials)
      trials.push_back(
          {{"id", tr.id},
           {"config", tr.config},
           {"last_score", tr.last_score ? detail::number_or_null(*tr.last_score) : nlohmann::json(nullptr)},
           {"has_score", tr.last_score.has_value()},
           {"last_perturbation_time", tr.last_perturbation_time},
           {"last_train_time", tr.last_train_time},
           {"finished", tr.finished}});
    return {{"trials", trials}, {"rng", detail::rng_text(state_.rng)}, {"num_perturbations", state_.num_perturbations}};
  }

  /// Restores what `save_state` returned.
  void restore_state(nlohmann::json const& s) {
    state_.trials.clear();
    for (auto const& j : s.at("trials")) {
      detail::pbt_trial tr{.id = j.at("id").get<std::string>(), .config = j.at("config")};
      if (j.value("has_score", false)) tr.last_score = detail::number_or(j.at("last_score"), detail::nan_v);
      tr.last_perturbation_time = j.at("last_perturbation_time").get<double>();
      tr.last_train_time = j.at("last_train_time").get<double>();
      tr.finished = j.value("finished", false);
      state_.trials.push_back(std::move(tr));
    }
    detail::set_rng_text(state_.rng, s.at("rng"), "schedule::pbt");
    state_.num_perturbations = s.value("num_perturbations", std::size_t{0});
    state_.restored = true;
  }

  /// The config PBT holds for a trial (its initial one, or the one its last exploit gave it).
  nlohmann::json const& config_of(std::string const& id) const {
    for (auto const& tr : state_.trials)
      if (tr.id == id) return tr.config;
    throw cohort::error("schedule::pbt: no trial " + id + "; it was never added");
  }

  /// How many exploits PBT has decided so far.
  std::size_t num_perturbations() const { return state_.num_perturbations; }

  /// Internal state, not a knob: leave it out of the initializer.
  detail::pbt_state state_{};

 private:
  void require_setup() const {
    if (!state_.ready) throw cohort::error("schedule::pbt: used before setup(objective); the tuner calls setup first");
  }

  detail::pbt_trial* find(std::string const& id) {
    for (auto& tr : state_.trials)
      if (tr.id == id) return &tr;
    return nullptr;
  }

  /// Ray's _quantiles: (lower, upper), each q trials, or both empty.
  std::pair<std::vector<detail::pbt_trial*>, std::vector<detail::pbt_trial*>> quantiles() {
    std::vector<detail::pbt_trial*> ranked;
    for (auto& tr : state_.trials)
      if (tr.last_score && !tr.finished) ranked.push_back(&tr);
    std::stable_sort(ranked.begin(), ranked.end(), [](auto* a, auto* b) { return *a->last_score < *b->last_score; });
    if (ranked.size() <= 1) return {};
    auto const n = ranked.size();
    auto q = static_cast<std::size_t>(std::ceil(static_cast<double>(n) * quantile_fraction));
    if (static_cast<double>(q) > static_cast<double>(n) / 2) q = n / 2;
    return {{ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(q)},
            {ranked.end() - static_cast<std::ptrdiff_t>(q), ranked.end()}};
  }

  /// Ray's _explore on the donor's config.
  nlohmann::json explore(nlohmann::json const& donor_config) {
    auto& g = state_.rng;
    nlohmann::json out = donor_config;
    for (auto const& [key, m] : hyperparam_mutations) {
      auto const ptr = detail::pointer_for(donor_config, key);
      nlohmann::json const* old = donor_config.contains(ptr) ? &donor_config.at(ptr) : nullptr;
      bool const resample = detail::uniform01(g) < resample_probability;
      if (auto const* values = m.as_values()) {
        auto pos = old ? std::find(values->begin(), values->end(), *old) : values->end();
        if (resample || pos == values->end()) {
          out[ptr] = (*values)[detail::pick(g, values->size())];
        } else {
          auto const idx = static_cast<std::ptrdiff_t>(pos - values->begin());
          auto const shift = detail::pick(g, 2) == 0 ? -1 : 1;
          auto const last = static_cast<std::ptrdiff_t>(values->size()) - 1;
          out[ptr] = (*values)[static_cast<std::size_t>(std::clamp(idx + shift, std::ptrdiff_t{0}, last))];
        }
      } else {
        auto const& r = *m.as_range();
        bool const integer = r.integer || (old && old->is_number_integer());
        if (resample || old == nullptr || !old->is_number()) {
          out[ptr] = detail::resample_range(r, integer, g);
        } else {
          double const factor = perturbation_factors[detail::pick(g, perturbation_factors.size())];
          double x = old->get<double>() * factor;
          if (integer) x = std::round(x);
          out[ptr] = detail::as_number(std::clamp(x, r.low, r.high), integer);
        }
      }
    }
    if (custom_explore) out = custom_explore(std::move(out), g);
    return out;
  }
};
static_assert(cohort::scheduler<pbt>);

}  // namespace cohort::schedule
