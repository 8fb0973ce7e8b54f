#pragma once
/// \file
/// search::bohb: BOHB's searcher (Falkner et al. 2018; Ray's TuneBOHB), TPE-style models, one
/// per budget, driving schedule::hyperband's brackets.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/error.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/search_space.hpp"
#include "cohort/tuning/search/tpe.hpp"

namespace cohort::tuning::search {

namespace detail {

/// The state of search::bohb: set by setup, advanced by suggest and the trials' results.
struct bohb_state {
  tuning::space space{};
  tuning::objective objective{};
  std::size_t num_samples = 0;
  std::size_t count = 0;
  std::mt19937_64 rng{};
  std::map<std::string, observation> running{};               ///< suggested, not complete: ordinal and params
  std::map<double, std::vector<observation>> by_budget{};     ///< per budget, one result per trial
  std::set<double> milestones{};                              ///< budgets a trial paused or ended at
  bool ready = false;
};

}  // namespace detail

/// BOHB (Falkner et al. 2018; Ray's TuneBOHB): TPE-style models, one per budget, driving
/// HyperBand's brackets. Pair it with `schedule::hyperband{.schedule = brackets_of::bohb}` (Ray's
/// HyperBandForBOHB): each trial's result when it pauses at a milestone or ends is an observation
/// at its budget (`time_attr`, cumulative). A config is drawn at random with probability
/// `random_fraction`, and while no budget holds `min_points_in_model + 2` observations; otherwise
/// from the largest budget that does: its best `top_n_percent` (at least min_points_in_model)
/// against the rest, each key modelled as search::tpe does (Parzen estimators, the candidate of
/// `n_ei_candidates` with the best l(x) / g(x)), where BOHB fits one multivariate kernel density.
struct bohb {
  std::uint64_t seed = 0;                        ///< same seed, space and results: same suggestions
  std::string time_attr = "training_iteration";  ///< the result key that is the budget
  std::size_t min_points_in_model = 0;           ///< 0: the modelled keys + 1 (BOHB's default)
  double top_n_percent = 15;                     ///< share of a budget's observations that are good (BOHB's default)
  double random_fraction = 1.0 / 3;              ///< share of configs drawn at random (BOHB's default)
  std::size_t n_ei_candidates = 64;              ///< candidates drawn per key (BOHB's num_samples)
  double prior_weight = 1.0;                     ///< weight of the prior kernel, > 0

  /// Keeps a copy of the space and the objective. Throws cohort::error for a grid_search key, an
  /// objective without metric, or knobs out of range.
  void setup(tuning::space const& sp, tuning::objective const& objective, std::size_t num_samples) {
    std::string const who = "search::bohb";
    for (auto const& p : sp)
      if (p.domain.is_grid())
        throw cohort::error(who + " cannot expand grid_search: \"" + p.key + "\" is " + p.domain.describe() +
                            ": use choice(...) instead, or search::basic for a grid");
    if (objective.metric.empty()) throw cohort::error(who + " needs a metric to model: set the objective's metric and mode");
    if (!(top_n_percent > 0 && top_n_percent < 100))
      throw cohort::error(who + "{.top_n_percent = " + std::to_string(top_n_percent) + "}: must be in (0, 100)");
    if (!(random_fraction >= 0 && random_fraction <= 1))
      throw cohort::error(who + "{.random_fraction = " + std::to_string(random_fraction) + "}: must be in [0, 1]");
    if (n_ei_candidates == 0) throw cohort::error(who + "{.n_ei_candidates = 0}: needs at least 1 candidate");
    if (!(prior_weight > 0)) throw cohort::error(who + "{.prior_weight = " + std::to_string(prior_weight) + "}: must be > 0");
    if (time_attr.empty()) throw cohort::error(who + "{.time_attr = \"\"}: name the result key that is the budget");
    state_ = detail::bohb_state{};
    state_.space = sp;
    state_.objective = objective;
    state_.num_samples = num_samples;
    state_.rng.seed(seed);
    state_.ready = true;
  }

  /// The next config (see the type); nothing after num_samples.
  std::optional<nlohmann::json> suggest(std::string const& trial_id) {
    if (!state_.ready) throw cohort::error("search::bohb: suggest() before setup(): the tuner calls setup first");
    if (state_.count >= state_.num_samples) return std::nullopt;
    auto const ordinal = state_.count++;
    bool const at_random = tuning::detail::uniform01(state_.rng) < random_fraction;
    nlohmann::json fixed = nlohmann::json::object();
    if (auto const* obs = model_budget(); obs && !at_random) {
      auto const n = obs->size();
      auto const good = std::max(points_in_model(), static_cast<std::size_t>(top_n_percent * static_cast<double>(n) / 100));
      fixed = detail::tpe_pick(state_.space, *obs,
                               {.gamma = 0, .n_ei_candidates = n_ei_candidates, .prior_weight = prior_weight, .min_good = good},
                               state_.rng);
    }
    auto config = tuning::detail::resolve(state_.space, fixed, state_.rng);
    state_.running[trial_id] = {.ordinal = ordinal, .params = detail::modelled_params(state_.space, config), .loss = 0};
    return config;
  }

  /// A result: an observation when its budget is a milestone (one a trial paused or ended at),
  /// as for the last trial of a bracket to reach a milestone, which goes on without pausing.
  void on_trial_result(std::string const& trial_id, nlohmann::json const& result) {
    if (auto const b = budget_of(result); b && state_.milestones.contains(*b)) observe(trial_id, result);
  }

  /// A trial paused at a milestone: its result is an observation at its budget.
  void on_trial_pause(std::string const& trial_id, nlohmann::json const& last_result) {
    if (auto const b = budget_of(last_result)) state_.milestones.insert(*b);
    observe(trial_id, last_result);
  }

  /// A trial ended: its last result is an observation at its budget (none for a failed trial).
  void on_trial_complete(std::string const& trial_id, nlohmann::json const& last_result) {
    if (auto const b = budget_of(last_result); b && state_.running.contains(trial_id)) state_.milestones.insert(*b);
    observe(trial_id, last_result);
    state_.running.erase(trial_id);
  }

  /// The observations per budget: the largest budget with enough of them drives the model.
  std::map<double, std::size_t> observations_per_budget() const {
    std::map<double, std::size_t> out;
    for (auto const& [b, obs] : state_.by_budget) out[b] = obs.size();
    return out;
  }

  /// Everything needed to continue exactly: the knobs, the count, the engine, the running
  /// trials, the observations per budget, and the space's description (checked on restore).
  nlohmann::json save_state() const {
    nlohmann::json running = nlohmann::json::object();
    for (auto const& [id, o] : state_.running) running[id] = detail::observation_json(o);
    nlohmann::json budgets = nlohmann::json::array();
    for (auto const& [b, obs] : state_.by_budget) {
      nlohmann::json list = nlohmann::json::array();
      for (auto const& o : obs) list.push_back(detail::observation_json(o));
      budgets.push_back({{"budget", b}, {"observations", std::move(list)}});
    }
    return {{"searcher", "bohb"},
            {"seed", seed},
            {"count", state_.count},
            {"rng", detail::engine_text(state_.rng)},
            {"running", std::move(running)},
            {"budgets", std::move(budgets)},
            {"milestones", state_.milestones},
            {"space", state_.space.to_json()}};
  }

  /// Continues from a saved state; call after setup with the same space and objective. Throws
  /// cohort::error for another searcher's state or a changed space.
  void restore_state(nlohmann::json const& state) {
    detail::check_state(state, "bohb", state_.space);
    seed = state.at("seed").get<std::uint64_t>();
    state_.count = state.at("count").get<std::size_t>();
    state_.rng = detail::engine_from_text(state.at("rng").get<std::string>(), "search::bohb");
    state_.running.clear();
    for (auto const& [id, o] : state.at("running").items()) state_.running[id] = detail::observation_of(o);
    state_.by_budget.clear();
    for (auto const& b : state.at("budgets")) {
      auto& list = state_.by_budget[b.at("budget").get<double>()];
      for (auto const& o : b.at("observations")) list.push_back(detail::observation_of(o));
    }
    state_.milestones = state.value("milestones", std::set<double>{});
  }

  cohort::detail::internal_state<detail::bohb_state, bohb> state_{};  ///< not a knob; only bohb reaches it

 private:
  std::size_t points_in_model() const {
    if (min_points_in_model > 0) return min_points_in_model;
    std::size_t modelled = 0;
    for (auto const& p : state_.space) modelled += detail::modelled(p.domain) ? 1 : 0;
    return modelled + 1;
  }

  /// The observations of the largest budget holding min_points_in_model + 2 of them, or null.
  std::vector<detail::observation> const* model_budget() const {
    for (auto it = state_.by_budget.rbegin(); it != state_.by_budget.rend(); ++it)
      if (it->second.size() >= points_in_model() + 2) return &it->second;
    return nullptr;
  }

  /// The budget of a result (its time_attr), if it has one.
  std::optional<double> budget_of(nlohmann::json const& result) const {
    if (!result.is_object()) return std::nullopt;
    auto const* budget = tuning::detail::find_key(result, time_attr);
    if (budget == nullptr || !budget->is_number()) return std::nullopt;
    return budget->get<double>();
  }

  /// Records `result` as trial `id`'s observation at its budget (replacing one it had there).
  void observe(std::string const& trial_id, nlohmann::json const& result) {
    auto it = state_.running.find(trial_id);
    auto const budget = budget_of(result);
    if (it == state_.running.end() || !budget) return;
    auto const loss = detail::loss_of(result, state_.objective);
    if (!loss) return;
    auto& list = state_.by_budget[*budget];
    auto obs = it->second;
    obs.loss = *loss;
    auto same = std::find_if(list.begin(), list.end(), [&](auto const& o) { return o.ordinal == obs.ordinal; });
    if (same != list.end()) *same = std::move(obs);
    else list.push_back(std::move(obs));
  }
};
static_assert(cohort::searcher<bohb>);

}  // namespace cohort::tuning::search
