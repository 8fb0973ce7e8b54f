#pragma once
/// \file
/// Ray Tune's search space: one `domain` per hyperparameter (a constant, a grid to expand, or a
/// distribution to sample: tuning/domain.hpp), and a `space` that names them in order. Keys may contain '/' to nest:
/// "optimizer/lr" becomes {"optimizer": {"lr": ...}} in the config a trial receives.
///
/// Sampling is portable: uniform draws take the top 53 bits of one `std::mt19937_64` output,
/// integer draws use rejection, normal draws use Box-Muller, so a seed gives the same configs with
/// every standard library (std's distributions are implementation-defined).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/domain.hpp"

namespace cohort::tuning {

/// The value at `key` in `config`, '/' separating nested objects ("optimizer/lr"), or nullptr
/// when it is absent.
inline nlohmann::json const* lookup(nlohmann::json const& config, std::string_view key) {
  return detail::find_key(config, std::string(key));
}

/// Sets `key` in `config` to `value`, '/' separating nested objects, which are created as needed.
/// Throws cohort::error when a prefix of the key holds a value that is not an object.
inline void assign(nlohmann::json& config, std::string_view key, nlohmann::json value) {
  nlohmann::json* at = &config;
  std::string_view rest = key;
  while (true) {
    if (at->is_null()) *at = nlohmann::json::object();
    if (!at->is_object())
      throw cohort::error("cannot set \"" + std::string(key) + "\": a prefix of it holds " + at->dump() +
                          ", not an object: rename one of the keys");
    auto const slash = rest.find('/');
    at = &(*at)[std::string(rest.substr(0, slash))];
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  *at = std::move(value);
}

/// One entry of a space: a key ('/' nests) and its domain.
struct parameter {
  std::string key;        ///< e.g. "lr", or "optimizer/lr" for {"optimizer": {"lr": ...}}
  tuning::domain domain;  ///< its distribution, or a constant
};

/// A search space: an ordered list of (key, domain) pairs, e.g.
/// `space{{"lr", loguniform(1e-4, 1e-1)}, {"batch_size", choice({32, 64, 128})}, {"epochs", 3}}`.
/// Keys are unique, non-empty, and no key nests under another ("a" and "a/b" cannot both be keys).
/// The order matters for grid expansion (the first grid key varies fastest) and for sample_from,
/// and is the order of the random draws, so a seed reproduces the same configs.
struct space {
  /// An empty space (every config is {}).
  space() = default;
  /// The parameters in order. Throws cohort::error on a bad or duplicate key.
  space(std::initializer_list<parameter> params) {
    for (auto const& p : params) add(p.key, p.domain);
  }

  /// Appends one parameter. Throws cohort::error on a bad or duplicate key.
  space& add(std::string key, tuning::domain d) {
    if (key.empty() || key.front() == '/' || key.back() == '/' || key.find("//") != std::string::npos)
      throw cohort::error("space: bad key \"" + key +
                          "\": keys are names, '/' separating nested ones, e.g. \"optimizer/lr\"");
    for (auto const& p : parameters_) {
      if (p.key == key) throw cohort::error("space: duplicate key \"" + key + "\": each key may appear once");
      auto const nests = [](std::string const& outer, std::string const& inner) {
        return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '/';
      };
      if (nests(p.key, key) || nests(key, p.key))
        throw cohort::error("space: key \"" + key + "\" and key \"" + p.key +
                            "\" overlap: one would nest inside the other's value; rename one");
    }
    parameters_.push_back({std::move(key), std::move(d)});
    return *this;
  }

  /// The parameters, in order.
  std::vector<parameter> const& parameters() const { return parameters_; }
  /// Iteration over the parameters, in order.
  auto begin() const { return parameters_.begin(); }
  /// Iteration over the parameters, in order.
  auto end() const { return parameters_.end(); }
  /// The number of parameters.
  std::size_t size() const { return parameters_.size(); }
  /// True when the space has no parameters.
  bool empty() const { return parameters_.empty(); }

  /// The domain of `key`, or nullptr.
  tuning::domain const* find(std::string_view key) const {
    for (auto const& p : parameters_)
      if (p.key == key) return &p.domain;
    return nullptr;
  }

  /// The number of grid points: the product of the grid_search sizes, 1 when there is none.
  std::size_t grid_size() const {
    std::size_t n = 1;
    for (auto const& p : parameters_)
      if (p.domain.is_grid()) n *= p.domain.values().size();
    return n;
  }

  /// A nested config from a flat object keyed by '/'-paths: {"optimizer/lr": 0.1} becomes
  /// {"optimizer": {"lr": 0.1}}.
  nlohmann::json materialize(nlohmann::json const& flat) const {
    nlohmann::json config = nlohmann::json::object();
    for (auto const& [key, value] : flat.items()) assign(config, key, value);
    return config;
  }

  /// The inverse of materialize for this space's keys: a flat object of the keys present in
  /// `config`, e.g. {"optimizer/lr": 0.1}.
  nlohmann::json flatten(nlohmann::json const& config) const {
    nlohmann::json flat = nlohmann::json::object();
    for (auto const& p : parameters_)
      if (auto const* v = lookup(config, p.key)) flat[p.key] = *v;
    return flat;
  }

  /// For printing: {"epochs": 3, "lr": "loguniform(0.0001, 0.1)"}, constants as their values and
  /// the other domains described.
  nlohmann::json to_json() const {
    nlohmann::json out = nlohmann::json::object();
    for (auto const& p : parameters_)
      out[p.key] = p.domain.is_constant() ? p.domain.constant() : nlohmann::json(p.domain.describe());
    return out;
  }

  /// One line, in order: "lr: loguniform(0.0001, 0.1), epochs: 3".
  std::string describe() const {
    std::string out;
    for (auto const& p : parameters_) out += (out.empty() ? "" : ", ") + p.key + ": " + p.domain.describe();
    return out;
  }

 private:
  std::vector<parameter> parameters_{};
};

namespace detail {

/// One config of `sp`: the values in `fixed` (a flat object keyed by space keys: grid points, or a
/// model-based searcher's choices) and the constants first, then every other distribution in
/// space order, then the sample_from keys in space order, each seeing everything set before it.
/// Throws cohort::error for a grid key missing from `fixed`.
inline nlohmann::json resolve(space const& sp, nlohmann::json const& fixed, std::mt19937_64& rng) {
  nlohmann::json config = nlohmann::json::object();
  auto const is_fixed = [&](parameter const& p) { return fixed.is_object() && fixed.contains(p.key); };
  for (auto const& p : sp) {
    if (is_fixed(p)) assign(config, p.key, fixed.at(p.key));
    else if (p.domain.is_constant()) assign(config, p.key, p.domain.constant());
  }
  for (auto const& p : sp) {
    if (is_fixed(p) || p.domain.is_constant() || p.domain.is_function()) continue;
    if (p.domain.is_grid())
      throw cohort::error("\"" + p.key + "\" is " + p.domain.describe() +
                          ": grid values are expanded by a searcher (search::basic); use choice(...) to sample one");
    assign(config, p.key, p.domain.sample(rng, config));
  }
  for (auto const& p : sp)
    if (p.domain.is_function() && !is_fixed(p)) assign(config, p.key, p.domain.sample(rng, config));
  return config;
}

}  // namespace detail

/// One random config of `sp`, nested as a trial sees it. Throws cohort::error when `sp` has a
/// grid_search key (a grid is expanded by a searcher, not sampled).
inline nlohmann::json sample_config(space const& sp, std::mt19937_64& rng) {
  return detail::resolve(sp, nlohmann::json::object(), rng);
}

}  // namespace cohort::tuning

namespace cohort {
using tuning::choice;
using tuning::domain;
using tuning::grid_search;
using tuning::lograndint;
using tuning::loguniform;
using tuning::qlograndint;
using tuning::qloguniform;
using tuning::qrandint;
using tuning::qrandn;
using tuning::quniform;
using tuning::randint;
using tuning::randn;
using tuning::sample_from;
using tuning::space;
using tuning::uniform;
}  // namespace cohort
