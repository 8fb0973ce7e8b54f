#pragma once
/// \file
/// search::tpe: a Tree-structured Parzen Estimator (Bergstra et al. 2011, as Optuna's independent
/// TPESampler runs it), and the Parzen estimators, splits and picks BOHB's models reuse.

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
#include "cohort/tuning/search/basic.hpp"

namespace cohort::tuning::search {

namespace detail {

/// One completed trial as TPE sees it.
struct observation {
  std::size_t ordinal = 0;  ///< when it was suggested (Optuna's trial number)
  nlohmann::json params{};  ///< flat: key -> value, for the keys TPE models
  double loss = 0;          ///< the metric, negated for mode max: lower is better
};

/// An observation as the searchers' saved states hold it: {"ordinal", "params", "loss"}.
inline nlohmann::json observation_json(observation const& o) {
  return {{"ordinal", o.ordinal}, {"params", o.params}, {"loss", o.loss}};
}
inline observation observation_of(nlohmann::json const& j) {
  return {.ordinal = j.at("ordinal").get<std::size_t>(), .params = j.at("params"), .loss = j.at("loss").get<double>()};
}

/// The state of search::tpe: set by setup, advanced by suggest and on_trial_complete.
struct tpe_state {
  tuning::space space{};                         ///< a copy of the space given to setup
  tuning::objective objective{};                 ///< the metric and its direction
  std::size_t num_samples = 0;                   ///< suggestions in all
  std::size_t count = 0;                         ///< configs proposed so far
  std::mt19937_64 rng{};                         ///< every draw, startup and model alike
  std::map<std::string, observation> running{};  ///< proposed, not complete (loss unset)
  std::vector<observation> observations{};       ///< completed with the metric
  bool ready = false;                            ///< setup was called
};

/// Optuna's default_weights: 1 for the 25 most recent observations, a ramp from 1/n up for older.
inline std::vector<double> recency_weights(std::size_t n) {
  std::vector<double> w(n, 1.0);
  if (n < 25) return w;
  std::size_t const ramp = n - 25;
  for (std::size_t i = 0; i < ramp; ++i) {
    double const lo = 1.0 / static_cast<double>(n);
    w[i] = ramp == 1 ? lo : lo + (1.0 - lo) * static_cast<double>(i) / static_cast<double>(ramp - 1);
  }
  return w;
}

inline double log_sum_exp(std::vector<double> const& v) {
  double const m = *std::max_element(v.begin(), v.end());
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

/// Phi(z2) - Phi(z1) for z1 <= z2, accurate in either tail.
inline double normal_mass(double z1, double z2) {
  constexpr double r = 0.70710678118654752440;  // 1 / sqrt(2)
  if (z1 > 0) return 0.5 * (std::erfc(z1 * r) - std::erfc(z2 * r));
  return 0.5 * (std::erfc(-z2 * r) - std::erfc(-z1 * r));
}

inline double safe_log(double x) { return std::log(std::max(x, std::numeric_limits<double>::min())); }

/// Where one numeric parameter is modelled: in log space for log domains, on [a, b] (infinite for
/// randn), bins of width `step` around admissible values for quantized and integer domains.
struct numeric_model {
  bool log = false;
  std::optional<double> step{};
  double a = 0, b = 0;
  double prior_mu = 0, prior_sigma = 1;

  double to_model(double x) const { return log ? std::log(x) : x; }
  double from_model(double y) const { return log ? std::exp(y) : y; }
};

inline numeric_model model_of(tuning::domain const& d) {
  numeric_model m{.log = d.is_log(), .step = d.quantum()};
  if (!std::isfinite(d.low())) {  // randn, qrandn: the prior is the domain itself
    m.a = -std::numeric_limits<double>::infinity();
    m.b = std::numeric_limits<double>::infinity();
    m.prior_mu = d.mean();
    m.prior_sigma = d.sd();
    return m;
  }
  double const lo = d.clamp_and_round(d.low()).get<double>(), hi = d.clamp_and_round(d.high()).get<double>();
  double const half = m.step ? *m.step / 2 : 0.0;
  m.a = m.to_model(lo - half);
  m.b = m.to_model(hi + half);
  m.prior_mu = 0.5 * (m.a + m.b);
  m.prior_sigma = m.b - m.a;
  return m;
}

/// A truncated Gaussian mixture on [a, b]: one kernel per observation plus the prior.
struct parzen {
  std::vector<double> mu{}, sigma{}, weight{}, log_norm{};  // log_norm: log of the kernel's mass in [a, b]
};

/// Optuna's univariate Parzen estimator: kernels at the observations (model space, oldest first)
/// and at the prior, each kernel's bandwidth the larger gap to its sorted neighbours (the outer
/// ones: the inner gap), clipped to [range / min(100, n + 2), range]; the prior's is `range`.
inline parzen fit_parzen(numeric_model const& m, std::vector<double> const& obs, double prior_weight) {
  parzen p;
  p.mu = obs;
  p.mu.push_back(m.prior_mu);
  std::size_t const k = p.mu.size();
  std::vector<std::size_t> order(k);
  for (std::size_t i = 0; i < k; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return p.mu[x] < p.mu[y]; });
  p.sigma.assign(k, m.prior_sigma);
  double const range = m.prior_sigma;
  double const min_sigma = range / std::min(100.0, 1.0 + static_cast<double>(k));
  for (std::size_t r = 0; k >= 2 && r < k; ++r) {
    double const left = r > 0 ? p.mu[order[r]] - p.mu[order[r - 1]] : 0.0;
    double const right = r + 1 < k ? p.mu[order[r + 1]] - p.mu[order[r]] : 0.0;
    p.sigma[order[r]] = std::clamp(std::max(left, right), min_sigma, range);
  }
  p.sigma[k - 1] = m.prior_sigma;
  p.weight = recency_weights(obs.size());
  p.weight.push_back(prior_weight);
  double total = 0;
  for (double w : p.weight) total += w;
  for (double& w : p.weight) w /= total;
  for (std::size_t i = 0; i < k; ++i) {
    double const za = (m.a - p.mu[i]) / p.sigma[i], zb = (m.b - p.mu[i]) / p.sigma[i];
    p.log_norm.push_back(std::isfinite(m.a) ? safe_log(normal_mass(za, zb)) : 0.0);
  }
  return p;
}

/// Index drawn with probability proportional to `w` (w sums to 1).
inline std::size_t weighted_index(std::vector<double> const& w, std::mt19937_64& rng) {
  double u = tuning::detail::uniform01(rng);
  for (std::size_t i = 0; i + 1 < w.size(); ++i) {
    if (u < w[i]) return i;
    u -= w[i];
  }
  return w.size() - 1;
}

/// One draw in model space: a kernel by weight, then its normal truncated to [a, b] by rejection
/// (each kernel has at least a third of its mass there, so few draws are rejected).
inline double draw(parzen const& p, numeric_model const& m, std::mt19937_64& rng) {
  std::size_t const k = weighted_index(p.weight, rng);
  double y = 0;
  for (int attempt = 0; attempt < 64; ++attempt) {
    y = p.mu[k] + p.sigma[k] * tuning::detail::standard_normal(rng);
    if (y >= m.a && y <= m.b) return y;
  }
  return std::clamp(y, m.a, m.b);
}

/// log of the mixture's density at admissible value `x` (its mass on x's bin for discrete domains).
inline double log_likelihood(parzen const& p, numeric_model const& m, double x) {
  std::vector<double> terms(p.mu.size());
  double lo = 0, hi = 0, y = 0;
  if (m.step) {
    lo = std::max(m.a, m.to_model(x - *m.step / 2));
    hi = std::min(m.b, m.to_model(x + *m.step / 2));
  } else {
    y = m.to_model(x);
  }
  for (std::size_t i = 0; i < p.mu.size(); ++i) {
    double const s = p.sigma[i], z = (y - p.mu[i]) / s;
    double const t = m.step ? safe_log(normal_mass((lo - p.mu[i]) / s, (hi - p.mu[i]) / s))
                            : -0.5 * z * z - std::log(s * std::sqrt(2 * std::numbers::pi));
    terms[i] = std::log(p.weight[i]) + t - p.log_norm[i];
  }
  return log_sum_exp(terms);
}

/// The category probabilities of Optuna's categorical Parzen estimator: each observation's
/// kernel puts 1 + prior_weight / n_kernels on its category and prior_weight / n_kernels on every
/// one (normalised), the prior kernel is uniform, mixed with the recency weights.
inline std::vector<double> categorical_parzen(std::vector<std::size_t> const& obs, std::size_t n_choices,
                                              double prior_weight) {
  std::vector<double> w = recency_weights(obs.size());
  w.push_back(prior_weight);
  double total = 0;
  for (double x : w) total += x;
  double const c = static_cast<double>(n_choices);
  double const base = prior_weight / static_cast<double>(obs.size() + 1);
  std::vector<double> prob(n_choices, w.back() / total / c);
  for (std::size_t i = 0; i < obs.size(); ++i) {
    double const share = w[i] / total / (1.0 + c * base);
    for (std::size_t j = 0; j < n_choices; ++j) prob[j] += share * (base + (j == obs[i] ? 1.0 : 0.0));
  }
  return prob;
}

/// TPE's knobs that shape its model (search::tpe's, and BOHB's per budget).
struct tpe_knobs {
  double gamma = 0.25;
  std::size_t n_ei_candidates = 24;
  double prior_weight = 1.0;
  std::size_t min_good = 0;  ///< at least this many observations are good (BOHB's min_points_in_model)
};

using observation_group = std::vector<observation const*>;

inline bool modelled(tuning::domain const& d) { return d.is_numeric() || d.is_categorical(); }

/// The best max(min_good, min(ceil(gamma n), 25)) observations by loss (ties: the earlier; at
/// most n) and the rest, each oldest first.
inline std::pair<observation_group, observation_group> split(std::vector<observation> const& observations, double gamma,
                                                             std::size_t min_good = 0) {
  observation_group all;
  for (auto const& o : observations) all.push_back(&o);
  std::stable_sort(all.begin(), all.end(), [](auto* x, auto* y) {
    return x->loss < y->loss || (x->loss == y->loss && x->ordinal < y->ordinal);
  });
  auto const n_good = std::max(min_good, std::min<std::size_t>(static_cast<std::size_t>(std::ceil(gamma * static_cast<double>(all.size()))), 25));
  observation_group good(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(n_good, all.size())));
  observation_group bad(all.begin() + static_cast<std::ptrdiff_t>(good.size()), all.end());
  auto by_age = [](auto* x, auto* y) { return x->ordinal < y->ordinal; };
  std::sort(good.begin(), good.end(), by_age);
  std::sort(bad.begin(), bad.end(), by_age);
  return {std::move(good), std::move(bad)};
}

/// The value of numeric parameter `p` that maximises l(x) / g(x) among n_ei_candidates drawn from l.
inline nlohmann::json pick_number(tuning::parameter const& p, observation_group const& good, observation_group const& bad,
                                  tpe_knobs const& k, std::mt19937_64& rng) {
  auto const m = model_of(p.domain);
  if (!(m.b > m.a)) return p.domain.clamp_and_round(p.domain.low());  // uniform(x, x)
  auto values = [&](observation_group const& g) {
    std::vector<double> v;
    for (auto* o : g)
      if (o->params.contains(p.key) && o->params.at(p.key).is_number()) v.push_back(m.to_model(o->params.at(p.key).get<double>()));
    return v;
  };
  auto const l = fit_parzen(m, values(good), k.prior_weight), g = fit_parzen(m, values(bad), k.prior_weight);
  nlohmann::json best;
  double best_score = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < k.n_ei_candidates; ++i) {
    auto candidate = p.domain.clamp_and_round(m.from_model(draw(l, m, rng)));
    double const x = candidate.get<double>();
    double const score = log_likelihood(l, m, x) - log_likelihood(g, m, x);
    if (i == 0 || score > best_score) {
      best = std::move(candidate);
      best_score = score;
    }
  }
  return best;
}

/// The same for a choice parameter.
inline nlohmann::json pick_category(tuning::parameter const& p, observation_group const& good, observation_group const& bad,
                                    tpe_knobs const& k, std::mt19937_64& rng) {
  auto const& choices = p.domain.values();
  auto indices = [&](observation_group const& g) {
    std::vector<std::size_t> v;
    for (auto* o : g) {
      if (!o->params.contains(p.key)) continue;
      auto const it = std::find(choices.begin(), choices.end(), o->params.at(p.key));
      if (it != choices.end()) v.push_back(static_cast<std::size_t>(it - choices.begin()));
    }
    return v;
  };
  auto const l = categorical_parzen(indices(good), choices.size(), k.prior_weight);
  auto const g = categorical_parzen(indices(bad), choices.size(), k.prior_weight);
  std::size_t best = 0;
  double best_score = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < k.n_ei_candidates; ++i) {
    std::size_t const c = weighted_index(l, rng);
    double const score = std::log(l[c]) - std::log(g[c]);
    if (i == 0 || score > best_score) {
      best = c;
      best_score = score;
    }
  }
  return choices[best];
}

/// TPE's choice of every modelled key from `observations` (fixed values for resolve()), each
/// numeric and choice key in the space's order; {} when there are no observations.
inline nlohmann::json tpe_pick(tuning::space const& space, std::vector<observation> const& observations, tpe_knobs const& k,
                               std::mt19937_64& rng) {
  nlohmann::json fixed = nlohmann::json::object();
  if (observations.empty()) return fixed;
  auto [good, bad] = split(observations, k.gamma, k.min_good);
  for (auto const& p : space) {
    if (p.domain.is_categorical()) fixed[p.key] = pick_category(p, good, bad, k, rng);
    else if (p.domain.is_numeric()) fixed[p.key] = pick_number(p, good, bad, k, rng);
  }
  return fixed;
}

/// The values of the modelled keys of `config`, flat (key -> value).
inline nlohmann::json modelled_params(tuning::space const& space, nlohmann::json const& config) {
  nlohmann::json params = nlohmann::json::object();
  for (auto const& p : space)
    if (modelled(p.domain))
      if (auto const* v = tuning::lookup(config, p.key)) params[p.key] = *v;
  return params;
}

/// The objective's loss (lower is better) in `result`: its metric, negated for mode max; nothing
/// when the result is not an object or has no finite metric.
inline std::optional<double> loss_of(nlohmann::json const& result, tuning::objective const& objective) {
  if (!result.is_object()) return std::nullopt;
  nlohmann::json const* metric =
      result.contains(objective.metric) ? &result.at(objective.metric) : tuning::lookup(result, objective.metric);
  if (metric == nullptr || !metric->is_number()) return std::nullopt;
  double const v = metric->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return objective.mode == cohort::order::min ? v : -v;
}

}  // namespace detail

/// Tree-structured Parzen Estimator (Bergstra et al. 2011; Optuna's independent TPESampler).
/// The first suggestions are random (as search::basic draws them) until `n_startup_trials`
/// trials have completed with the metric. Then the completed trials split into the best
/// n_good = min(ceil(gamma * n), 25) by the objective (mode min or max) and the rest; for each
/// numeric or choice parameter it fits l(x) to the good and g(x) to the bad values (truncated
/// Gaussian mixtures with a prior kernel, in log space for log domains, mass over the rounding bin
/// for quantized and integer ones; weighted categorical distributions for choice), draws
/// `n_ei_candidates` from l and keeps the one with the largest l(x) / g(x). Constants and
/// sample_from keys are filled as usual. Trials that failed or lack the metric are ignored.
/// Returns nothing after num_samples suggestions. A space with grid_search is an error (use
/// choice). Costs O(n_ei_candidates x trials) per parameter per suggestion.
struct tpe {
  std::uint64_t seed = 0;              ///< same seed, space and results: same suggestions
  std::size_t n_startup_trials = 10;   ///< completed trials before the model is used (Optuna's default)
  double gamma = 0.25;                 ///< fraction of trials that count as good, in (0, 1]
  std::size_t n_ei_candidates = 24;    ///< candidates drawn from l(x) per parameter (Optuna's default)
  double prior_weight = 1.0;           ///< weight of the prior kernel, > 0 (Optuna's default)

  /// Keeps a copy of the space and the objective. Throws cohort::error for a grid_search key, an
  /// objective without metric, or knobs out of range.
  void setup(tuning::space const& sp, tuning::objective const& objective, std::size_t num_samples) {
    for (auto const& p : sp)
      if (p.domain.is_grid())
        throw cohort::error("search::tpe cannot expand grid_search: \"" + p.key + "\" is " + p.domain.describe() +
                            ": use choice(...) instead, or search::basic for a grid");
    if (objective.metric.empty())
      throw cohort::error("search::tpe needs a metric to model: set the objective's metric (e.g. \"loss\") and mode");
    if (!(gamma > 0 && gamma <= 1))
      throw cohort::error("search::tpe{.gamma = " + std::to_string(gamma) + "}: must be in (0, 1]");
    if (n_ei_candidates == 0) throw cohort::error("search::tpe{.n_ei_candidates = 0}: needs at least 1 candidate");
    if (!(prior_weight > 0))
      throw cohort::error("search::tpe{.prior_weight = " + std::to_string(prior_weight) + "}: must be > 0");
    state_ = detail::tpe_state{};
    state_.space = sp;
    state_.objective = objective;
    state_.num_samples = num_samples;
    state_.rng.seed(seed);
    state_.ready = true;
  }

  /// The next config: random while fewer than n_startup_trials trials have completed, from the
  /// model after; nothing after num_samples.
  std::optional<nlohmann::json> suggest(std::string const& trial_id) {
    if (!state_.ready) throw cohort::error("search::tpe: suggest() before setup(): the tuner calls setup first");
    if (state_.count >= state_.num_samples) return std::nullopt;
    auto const ordinal = state_.count++;
    nlohmann::json fixed = nlohmann::json::object();
    if (state_.observations.size() >= n_startup_trials)
      fixed = detail::tpe_pick(state_.space, state_.observations,
                               {.gamma = gamma, .n_ei_candidates = n_ei_candidates, .prior_weight = prior_weight}, state_.rng);
    auto config = tuning::detail::resolve(state_.space, fixed, state_.rng);
    state_.running[trial_id] = {.ordinal = ordinal, .params = detail::modelled_params(state_.space, config), .loss = 0};
    return config;
  }

  /// Records the trial's metric from its last result; a null result (failed trial), a result
  /// without a finite metric, or an id it did not suggest is ignored.
  void on_trial_complete(std::string const& trial_id, nlohmann::json const& last_result) {
    auto it = state_.running.find(trial_id);
    if (it == state_.running.end()) return;
    auto obs = std::move(it->second);
    state_.running.erase(it);
    auto const loss = detail::loss_of(last_result, state_.objective);
    if (!loss) return;
    obs.loss = *loss;
    state_.observations.push_back(std::move(obs));
  }

  /// Everything needed to continue exactly: the knobs, the count, the engine, the running and the
  /// completed trials, and the space's description (checked on restore).
  nlohmann::json save_state() const {
    nlohmann::json running = nlohmann::json::object();
    for (auto const& [id, o] : state_.running) running[id] = detail::observation_json(o);
    nlohmann::json observations = nlohmann::json::array();
    for (auto const& o : state_.observations) observations.push_back(detail::observation_json(o));
    return {{"searcher", "tpe"},
            {"seed", seed},
            {"n_startup_trials", n_startup_trials},
            {"gamma", gamma},
            {"n_ei_candidates", n_ei_candidates},
            {"prior_weight", prior_weight},
            {"count", state_.count},
            {"rng", detail::engine_text(state_.rng)},
            {"running", std::move(running)},
            {"observations", std::move(observations)},
            {"space", state_.space.to_json()}};
  }

  /// Continues from a saved state; call after setup with the same space and objective. The saved
  /// knobs replace these. Throws cohort::error for another searcher's state or a changed space.
  void restore_state(nlohmann::json const& state) {
    detail::check_state(state, "tpe", state_.space);
    seed = state.at("seed").get<std::uint64_t>();
    n_startup_trials = state.at("n_startup_trials").get<std::size_t>();
    gamma = state.at("gamma").get<double>();
    n_ei_candidates = state.at("n_ei_candidates").get<std::size_t>();
    prior_weight = state.at("prior_weight").get<double>();
    state_.count = state.at("count").get<std::size_t>();
    state_.rng = detail::engine_from_text(state.at("rng").get<std::string>(), "search::tpe");
    state_.running.clear();
    for (auto const& [id, o] : state.at("running").items()) state_.running[id] = detail::observation_of(o);
    state_.observations.clear();
    for (auto const& o : state.at("observations")) state_.observations.push_back(detail::observation_of(o));
  }

  cohort::detail::internal_state<detail::tpe_state, tpe> state_{};  ///< not a knob; only tpe reaches it

};
static_assert(cohort::searcher<tpe>);

}  // namespace cohort::tuning::search
