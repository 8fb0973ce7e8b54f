#pragma once
/// \file
/// search::basic (and its alias search::random): Ray Tune's BasicVariantGenerator, grid
/// expansion plus independent random draws, deterministic for a seed; and the seeding and
/// engine-state helpers every searcher shares.

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

namespace cohort::tuning::search {

namespace detail {

/// A well-mixed 64-bit seed from (seed, stream) (SplitMix64's finaliser).
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The engine's full state as text (the standard fixes the format of operator<<).
inline std::string engine_text(std::mt19937_64 const& rng) {
  std::ostringstream out;
  out << rng;
  return out.str();
}

/// The engine restored from engine_text.
inline std::mt19937_64 engine_from_text(std::string const& text, char const* who) {
  std::istringstream in(text);
  std::mt19937_64 rng;
  in >> rng;
  if (!in)
    throw cohort::error(std::string(who) + ": saved engine state does not parse: pass the JSON save_state() returned");
  return rng;
}

/// Throws unless `state` was saved by the searcher named `who` over the same space.
inline void check_state(nlohmann::json const& state, char const* who, tuning::space const& sp) {
  if (!state.is_object() || state.value("searcher", std::string{}) != who)
    throw cohort::error(std::string("search::") + who + ": cannot restore " + state.dump().substr(0, 80) +
                        ": pass the JSON that search::" + who + "::save_state() returned");
  if (state.value("space", nlohmann::json{}) != sp.to_json())
    throw cohort::error(std::string("search::") + who + ": the search space changed since the state was saved (" +
                        state.value("space", nlohmann::json{}).dump() + " then, " + sp.to_json().dump() +
                        " now): resume with the same space");
}

/// The state of search::basic: set by setup, advanced by suggest.
struct basic_state {
  tuning::space space{};        ///< a copy of the space given to setup
  std::size_t num_samples = 0;  ///< repeats of the grid
  std::size_t count = 0;        ///< configs proposed so far
  bool ready = false;           ///< setup was called
};

}  // namespace detail

/// Ray Tune's BasicVariantGenerator: grid_search keys are expanded as a Cartesian product (the
/// first grid key in the space varies fastest; Ray first sorts grid keys by name), every other
/// domain is drawn independently for each variant, and `num_samples` repeats the whole grid: a
/// 3 x 3 grid with num_samples 2 gives 18 trials, a space without grid gives num_samples trials.
/// Then suggest returns nothing. Variant i draws from an engine seeded by (seed, i), so the
/// configs depend only on the seed and the space; it ignores results.
struct basic {
  /// What runs next does not wait for completions (tuning::independent_of_completions).
  static constexpr bool next_independent_of_completions = true;
  std::uint64_t seed = 0;  ///< same seed and space, same configs

  /// Keeps a copy of the space; the objective is not needed.
  void setup(tuning::space const& sp, tuning::objective const& /*objective*/, std::size_t num_samples) {
    state_ = {.space = sp, .num_samples = num_samples, .count = 0, .ready = true};
  }

  /// The next variant, or nothing after num_samples x grid_size of them.
  std::optional<nlohmann::json> suggest(std::string const& /*trial_id*/) {
    if (!state_.ready) throw cohort::error("search::basic: suggest() before setup(): the tuner calls setup first");
    auto const grid = state_.space.grid_size();
    if (state_.count >= state_.num_samples * grid) return std::nullopt;
    auto const i = state_.count++;
    nlohmann::json fixed = nlohmann::json::object();
    auto g = i % grid;
    for (auto const& p : state_.space)
      if (p.domain.is_grid()) {
        fixed[p.key] = p.domain.values()[g % p.domain.values().size()];
        g /= p.domain.values().size();
      }
    std::mt19937_64 rng(detail::mix_seed(seed, i));
    return tuning::detail::resolve(state_.space, fixed, rng);
  }

  /// Results do not change what basic proposes.
  void on_trial_complete(std::string const& /*trial_id*/, nlohmann::json const& /*last_result*/) {}

  /// {"searcher": "basic", "seed", "count", "space"}.
  nlohmann::json save_state() const {
    return {{"searcher", "basic"}, {"seed", seed}, {"count", state_.count}, {"space", state_.space.to_json()}};
  }

  /// Continues from a saved state; call after setup with the same space. The saved seed replaces
  /// this one. Throws cohort::error for another searcher's state or a changed space.
  void restore_state(nlohmann::json const& state) {
    detail::check_state(state, "basic", state_.space);
    seed = state.at("seed").get<std::uint64_t>();
    state_.count = state.at("count").get<std::size_t>();
  }

  cohort::detail::internal_state<detail::basic_state, basic> state_{};  ///< not a knob; only basic reaches it
};
static_assert(cohort::searcher<basic>);

/// Random search. Ray's default random search is the BasicVariantGenerator, so this is an alias of
/// search::basic: `search::random{.seed = 1}` draws exactly what `search::basic{.seed = 1}` does.
using random = basic;

}  // namespace cohort::tuning::search
