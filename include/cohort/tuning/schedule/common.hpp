#pragma once
/// \file
/// What the schedulers share: a result's numbers looked up by key or "a/b" path, the metric and
/// mode resolved against the tuner's objective, seeded draws that are the same on every standard
/// library, and numpy's nanpercentile. Internal (namespace detail).
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

#include "cohort/error.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/decision.hpp"

namespace cohort::tuning::schedule {

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
inline std::size_t uniform_index_one_draw(std::mt19937_64& g, std::size_t n) {
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

}  // namespace detail

}  // namespace cohort::tuning::schedule
