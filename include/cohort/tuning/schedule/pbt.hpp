#pragma once
/// \file
/// Population based training (Ray's PopulationBasedTraining), and the mutations it explores with.

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/tuning/schedule/common.hpp"

namespace cohort::tuning::schedule {

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
  bool waiting = false;  ///< synch: paused at the perturbation point until every trial is there
};

/// PBT's state, internal.
struct pbt_state {
  bool ready = false;
  resolved_objective objective{};
  std::vector<pbt_trial> trials{};  ///< in the order they were added
  std::mt19937_64 rng{};
  std::size_t num_perturbations = 0;
  bool restored = false;  ///< setup after restore_state keeps the restored rng
  double next_sync = 0;   ///< synch: the next perturbation point (Ray's _next_perturbation_sync)
  bool closed = false;    ///< synch: no trial will be added any more
  tuning::paused_decisions decided{};  ///< synch: about other trials, until the tuner takes them
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
                          static_cast<std::int64_t>(uniform_index_one_draw(g, static_cast<std::size_t>(hi - lo) + 1)));
  }
  double const u = uniform01(g);
  double x =
      r.log ? std::exp(std::log(r.low) + u * (std::log(r.high) - std::log(r.low))) : r.low + u * (r.high - r.low);
  x = std::clamp(integer ? std::round(x) : x, r.low, r.high);
  return as_number(x, integer);
}

}  // namespace detail

/// Population based training (Ray's PopulationBasedTraining), asynchronous or, with `synch`,
/// synchronous.
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
/// With `synch` (Ray's synch=True), perturbations happen at common points instead: the first at
/// max(perturbation_interval, burn_in_period), then every perturbation_interval. A trial whose
/// time_attr reaches the point records its score and pauses until every unfinished trial has
/// reached it and no trial will join (on_no_more_trials). Then the lower quantile, in the order
/// trials were added, exploits as above, all decided at once from scores taken at the same point
/// (the donors' checkpoints are the ones they paused with), and the others resume; the next point
/// is perturbation_interval later, or the furthest trial's time if that is later. Decisions about
/// paused trials wait in take_paused_decisions(). The outcome no longer depends on the order
/// results arrive in, which is what tune_config::reproducible needs.
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
  bool synch = false;  ///< perturb at common points, every trial paused there (see the type)

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
    if (!state_.restored) {
      state_.rng.seed(seed);
      state_.next_sync = std::max(perturbation_interval, burn_in_period);
    }
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
    if (synch) {
      if (t < state_.next_sync) return {};
      me->last_score = state_.objective.sign * value;
      me->last_train_time = t;
      me->last_perturbation_time = t;
      me->waiting = true;
      return perturb_all(&id);
    }
    if (t - me->last_perturbation_time < perturbation_interval) return {};
    me->last_score = state_.objective.sign * value;
    me->last_train_time = t;
    me->last_perturbation_time = t;

    auto [lower, upper] = quantiles();
    if (std::find(lower.begin(), lower.end(), me) == lower.end() || upper.empty()) return {};
    detail::pbt_trial const* donor = upper[detail::uniform_index_one_draw(state_.rng, upper.size())];
    nlohmann::json config = explore(donor->config);
    me->config = config;
    me->last_perturbation_time = donor->last_perturbation_time;
    me->last_train_time = donor->last_train_time;
    ++state_.num_perturbations;
    return {.what = tuning::decision::exploit, .donor = donor->id, .config = std::move(config)};
  }

  /// Leaves the trial out of later rankings (Ray ranks only unfinished trials). With synch, the
  /// trials waiting at the perturbation point may now all be there.
  void on_trial_complete(std::string const& id, nlohmann::json const&) {
    if (auto* me = find(id)) {
      me->finished = true;
      me->waiting = false;
    }
    std::erase(state_.decided.resume, id);
    std::erase_if(state_.decided.exploit, [&](auto const& e) { return e.first == id; });
    if (synch) perturb_all(nullptr);
  }

  /// The searcher is exhausted: with synch, the perturbation point waits for no new trial.
  void on_no_more_trials() {
    if (state_.closed) return;
    state_.closed = true;
    if (synch) perturb_all(nullptr);
  }

  /// Under tune_config::reproducible: no trial need end before another is suggested. Every trial
  /// of the population waits at the first perturbation point until the last one has started, so a
  /// searcher waiting on ended trials would wait forever; it learns from none of them instead.
  std::size_t trials_settled_before(std::size_t) const { return 0; }

  /// With synch: the paused trials to resume and to restart from a donor, decided since the last call.
  tuning::paused_decisions take_paused_decisions() { return std::exchange(state_.decided, {}); }

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
           {"finished", tr.finished},
           {"waiting", tr.waiting}});
    nlohmann::json exploit = nlohmann::json::array();
    for (auto const& [id, d] : state_.decided.exploit) exploit.push_back({{"id", id}, {"donor", d.donor}, {"config", d.config}});
    return {{"trials", trials},
            {"rng", detail::rng_text(state_.rng)},
            {"num_perturbations", state_.num_perturbations},
            {"next_sync", state_.next_sync},
            {"closed", state_.closed},
            {"resume", state_.decided.resume},
            {"exploit", exploit}};
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
      tr.waiting = j.value("waiting", false);
      state_.trials.push_back(std::move(tr));
    }
    detail::set_rng_text(state_.rng, s.at("rng"), "schedule::pbt");
    state_.num_perturbations = s.value("num_perturbations", std::size_t{0});
    state_.next_sync = s.value("next_sync", std::max(perturbation_interval, burn_in_period));
    state_.closed = s.value("closed", false);
    state_.decided = {.resume = s.value("resume", std::vector<std::string>{})};
    for (auto const& e : s.value("exploit", nlohmann::json::array()))
      state_.decided.exploit.emplace_back(
          e.at("id").get<std::string>(),
          tuning::scheduling_decision{.what = tuning::decision::exploit, .donor = e.at("donor").get<std::string>(), .config = e.at("config")});
    state_.restored = true;
  }

  /// The config PBT holds for a trial (its initial one, or the one its last exploit gave it).
  nlohmann::json const& config_of(std::string const& id) const {
    for (auto const& tr : state_.trials)
      if (tr.id == id) return tr.config;
    throw cohort::error("schedule::pbt: no trial " + id + "; it was never added");
  }

  /// Ray's debug_string, less its checkpoint count: "PopulationBasedTraining: N perturbs".
  std::string debug_string() const {
    return "PopulationBasedTraining: " + std::to_string(state_.num_perturbations) + " perturbs";
  }

  /// How many exploits PBT has decided so far.
  std::size_t num_perturbations() const { return state_.num_perturbations; }

  /// The trials' scores and the rng (not a knob; only pbt reaches it).
  cohort::detail::internal_state<detail::pbt_state, pbt> state_{};

 private:
  void require_setup() const {
    if (!state_.ready) throw cohort::error("schedule::pbt: used before setup(objective); the tuner calls setup first");
  }

  detail::pbt_trial* find(std::string const& id) {
    for (auto& tr : state_.trials)
      if (tr.id == id) return &tr;
    return nullptr;
  }

  /// With synch: once every unfinished trial waits at the perturbation point and none will join,
  /// the lower quantile exploits (in the order trials were added) and the rest resume. Returns
  /// what `current` (the reporting trial, null for none) does: pause while others are missing.
  tuning::scheduling_decision perturb_all(std::string const* current) {
    bool any = false;
    for (auto const& tr : state_.trials) {
      if (tr.finished) continue;
      if (!tr.waiting) return {tuning::decision::pause};
      any = true;
    }
    if (!any || !state_.closed) return {tuning::decision::pause};
    auto [lower, upper] = quantiles();
    tuning::scheduling_decision mine{};
    double furthest = 0;
    for (auto& tr : state_.trials) {
      if (tr.finished) continue;
      furthest = std::max(furthest, tr.last_train_time);
      tuning::scheduling_decision d{};
      if (std::find(lower.begin(), lower.end(), &tr) != lower.end() && !upper.empty()) {
        detail::pbt_trial const* donor = upper[detail::uniform_index_one_draw(state_.rng, upper.size())];
        d = {.what = tuning::decision::exploit, .donor = donor->id, .config = explore(donor->config)};
        tr.config = d.config;
        tr.last_perturbation_time = donor->last_perturbation_time;
        tr.last_train_time = donor->last_train_time;
        ++state_.num_perturbations;
      }
      tr.waiting = false;
      if (current && tr.id == *current) mine = std::move(d);
      else if (d.what == tuning::decision::exploit) state_.decided.exploit.emplace_back(tr.id, std::move(d));
      else state_.decided.resume.push_back(tr.id);
    }
    state_.next_sync = std::max(state_.next_sync + perturbation_interval, furthest);
    return mine;
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
          out[ptr] = (*values)[detail::uniform_index_one_draw(g, values->size())];
        } else {
          auto const idx = static_cast<std::ptrdiff_t>(pos - values->begin());
          auto const shift = detail::uniform_index_one_draw(g, 2) == 0 ? -1 : 1;
          auto const last = static_cast<std::ptrdiff_t>(values->size()) - 1;
          out[ptr] = (*values)[static_cast<std::size_t>(std::clamp(idx + shift, std::ptrdiff_t{0}, last))];
        }
      } else {
        auto const& r = *m.as_range();
        bool const integer = r.integer || (old && old->is_number_integer());
        if (resample || old == nullptr || !old->is_number()) {
          out[ptr] = detail::resample_range(r, integer, g);
        } else {
          double const factor = perturbation_factors[detail::uniform_index_one_draw(g, perturbation_factors.size())];
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

}  // namespace cohort::tuning::schedule
