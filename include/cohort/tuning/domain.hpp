#pragma once
/// \file
/// One hyperparameter's distribution, as Ray Tune's domains (`domain` and choice, uniform, ...,
/// sample_from). Sampling is portable: uniform draws take the top 53 bits of one mt19937_64
/// output, integer draws use rejection, normal draws Box-Muller: the same values everywhere.

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

namespace cohort::tuning {

namespace detail {

/// Uniform in [0, 1) from the top 53 bits of one draw.
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

/// Uniform in [0, n), n > 0, without modulo bias (rejects the top partial block).
inline std::uint64_t uniform_index(std::mt19937_64& rng, std::uint64_t n) {
  std::uint64_t const limit = std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % n;
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

/// Standard normal by Box-Muller, two uniform draws per value (no cached second value, so the
/// engine alone is the sampler's whole state).
inline double standard_normal(std::mt19937_64& rng) {
  double const u1 = 1.0 - uniform01(rng);  // (0, 1]
  double const u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

/// A bound or parameter as a person would write it: "2", "0.0001", "1e-05".
inline std::string format_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::nearbyint(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  return nlohmann::json(x).dump();  // shortest representation that round-trips
}

/// "[32, 64, 128]".
inline std::string format_values(std::vector<nlohmann::json> const& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + values[i].dump();
  return out + "]";
}

/// Ray's check that a bound is a multiple of q (math.isclose with its default rel_tol 1e-9).
inline bool is_multiple(double x, double q) {
  double const r = x / q, k = std::nearbyint(r);
  return std::fabs(r - k) <= 1e-9 * std::max(std::fabs(r), std::fabs(k));
}

}  // namespace detail

class domain;

/// Every value is tried: the searcher expands grid keys as a Cartesian product (`search::basic`;
/// `num_samples` repeats the whole grid). `values` must not be empty.
inline domain grid_search(std::vector<nlohmann::json> values);
/// One of `values`, uniformly at random (Ray's `tune.choice`). `values` must not be empty.
inline domain choice(std::vector<nlohmann::json> values);
/// A float uniform in [low, high]. Needs finite low <= high.
inline domain uniform(double low, double high);
/// `uniform(low, high)` rounded to the nearest multiple of q (half to even, like NumPy): a float.
/// As in Ray, low and high must be multiples of q; high is reachable.
inline domain quniform(double low, double high, double q);
/// A float whose logarithm is uniform: low * (high / low)^u. Needs 0 < low <= high. (Ray's old
/// `base` argument is left out: the distribution is the same in every base, and Ray deprecated it.)
inline domain loguniform(double low, double high);
/// `loguniform(low, high)` rounded to the nearest multiple of q: a float. As in Ray, low and high
/// must be multiples of q.
inline domain qloguniform(double low, double high, double q);
/// An integer uniform in [low, high): high is exclusive, as in Ray and NumPy. A JSON integer.
inline domain randint(std::int64_t low, std::int64_t high);
/// An integer multiple of q uniform among the multiples of q in [low, high]: high is inclusive, as
/// Ray documents it. A JSON integer.
inline domain qrandint(std::int64_t low, std::int64_t high, std::int64_t q = 1);
/// An integer whose logarithm is about uniform: floor(low * (high / low)^u), in [low, high) (high
/// exclusive, as Ray's `tune.lograndint` and randint). Needs 0 < low < high. A JSON integer. (Ray's
/// `base` argument is left out, as for loguniform: the distribution is the same in every base.)
inline domain lograndint(std::int64_t low, std::int64_t high);
/// `low * (high / low)^u` rounded to the nearest multiple of q among those in [low, high] (high
/// inclusive, as Ray's `tune.qlograndint`). Needs 0 < low <= high and a multiple of q inside. A JSON
/// integer.
inline domain qlograndint(std::int64_t low, std::int64_t high, std::int64_t q);
/// A float from the normal distribution N(mean, sd^2). Needs sd > 0.
inline domain randn(double mean = 0.0, double sd = 1.0);
/// `randn(mean, sd)` rounded to the nearest multiple of q: a float.
inline domain qrandn(double mean, double sd, double q);
/// A value computed from the config sampled so far (Ray's `tune.sample_from(lambda spec: ...)`):
/// it sees every constant, grid and distribution key, and the sample_from keys before it in the
/// space, nested as the trial will see them (`c["optimizer"]["lr"]`).
inline domain sample_from(std::function<nlohmann::json(nlohmann::json const& partial_config)> fn);
/// As above, for a function that also draws random numbers: it gets the searcher's engine, so its
/// draws are reproducible from the searcher's seed.
inline domain sample_from(std::function<nlohmann::json(nlohmann::json const& partial_config, std::mt19937_64& rng)> fn);

/// One hyperparameter's distribution: a constant, a grid, a categorical choice, a numeric
/// distribution or a function of the other keys. Built by the functions above, or implicitly from
/// any value nlohmann::json accepts (a constant), so `{"epochs", 3}` works in a space. Invalid
/// arguments throw cohort::error when the domain is built, not when a trial starts.
class domain {
 public:
  /// A constant: every config gets `value` as is.
  template <class T>
    requires(!std::same_as<std::remove_cvref_t<T>, domain>) && std::constructible_from<nlohmann::json, T>
  domain(T&& value)  // implicit on purpose: a plain value in a space is a constant
      : kind_(kind::constant), constant_(std::forward<T>(value)) {}

  /// One value for a trial. `partial_config` is the nested config sampled so far (only sample_from
  /// reads it). Throws cohort::error for a grid: grid values are expanded by the searcher.
  nlohmann::json sample(std::mt19937_64& rng, nlohmann::json const& partial_config) const {
    switch (kind_) {
      case kind::constant: return constant_;
      case kind::grid:
        throw cohort::error(describe() + " cannot be sampled: a searcher expands grid values into one trial each "
                            "(search::basic); use choice(...) to draw one value at random");
      case kind::choice: return values_[detail::uniform_index(rng, values_.size())];
      case kind::uniform: return lo_ + (hi_ - lo_) * detail::uniform01(rng);
      case kind::quniform:
        return k_to_value(std::nearbyint((klo_ * q_ + (khi_ - klo_) * q_ * detail::uniform01(rng)) / q_));
      case kind::loguniform: return log_draw(lo_, hi_, rng);
      case kind::qloguniform: return k_to_value(std::nearbyint(log_draw(klo_ * q_, khi_ * q_, rng) / q_));
      case kind::lograndint: return integer_value(clamp_k(std::floor(log_draw(lo_, hi_, rng))));
      case kind::qlograndint: return integer_value(clamp_k(std::nearbyint(log_draw(lo_, hi_, rng) / q_)));
      case kind::randint:
      case kind::qrandint: {  // in integers: a range as wide as int64's has more values than a double tells apart
        auto const span = static_cast<std::uint64_t>(ikhi_) - static_cast<std::uint64_t>(iklo_);  // values - 1
        auto const i = span == std::numeric_limits<std::uint64_t>::max() ? rng() : detail::uniform_index(rng, span + 1);
        return integer_value(static_cast<std::int64_t>(static_cast<std::uint64_t>(iklo_) + i));
      }
      case kind::randn: return mean_ + sd_ * detail::standard_normal(rng);
      case kind::qrandn: return std::nearbyint((mean_ + sd_ * detail::standard_normal(rng)) / q_) * q_;
      case kind::function: return fn_(partial_config, rng);
    }
    return nullptr;
  }

  /// True for grid_search.
  bool is_grid() const { return kind_ == kind::grid; }
  /// True for choice.
  bool is_categorical() const { return kind_ == kind::choice; }
  /// True for a constant.
  bool is_constant() const { return kind_ == kind::constant; }
  /// True for sample_from.
  bool is_function() const { return kind_ == kind::function; }
  /// True for uniform, quniform, loguniform, qloguniform, randint, qrandint, lograndint,
  /// qlograndint, randn and qrandn.
  bool is_numeric() const { return kind_ >= kind::uniform && kind_ <= kind::qrandn; }
  /// True for randint, qrandint, lograndint and qlograndint: their values are JSON integers.
  bool is_integer() const {
    return kind_ == kind::randint || kind_ == kind::qrandint || kind_ == kind::lograndint || kind_ == kind::qlograndint;
  }
  /// True for loguniform, qloguniform, lograndint and qlograndint.
  bool is_log() const {
    return kind_ == kind::loguniform || kind_ == kind::qloguniform || kind_ == kind::lograndint || kind_ == kind::qlograndint;
  }

  /// The values of a grid_search or choice (empty for other kinds).
  std::vector<nlohmann::json> const& values() const { return values_; }
  /// The constant's value (null for other kinds).
  nlohmann::json const& constant() const { return constant_; }

  /// The lower bound as given (-inf for randn). Numeric domains only.
  double low() const {
    numeric_or_throw("low()");
    return lo_;
  }
  /// The upper bound as given: exclusive for randint and lograndint, inclusive otherwise (+inf for
  /// randn).
  /// Numeric domains only.
  double high() const {
    numeric_or_throw("high()");
    return hi_;
  }
  /// The spacing of admissible values: q for quniform, qloguniform, qrandint, qlograndint and
  /// qrandn, 1 for randint and lograndint, nothing for continuous domains.
  std::optional<double> quantum() const {
    if (kind_ == kind::randint || kind_ == kind::lograndint) return 1.0;
    if (kind_ == kind::quniform || kind_ == kind::qloguniform || kind_ == kind::qrandint || kind_ == kind::qlograndint ||
        kind_ == kind::qrandn)
      return q_;
    return std::nullopt;
  }
  /// The mean of randn and qrandn.
  double mean() const {
    if (kind_ != kind::randn && kind_ != kind::qrandn)
      throw cohort::error(describe() + ": mean() is only defined for randn and qrandn");
    return mean_;
  }
  /// The standard deviation of randn and qrandn.
  double sd() const {
    if (kind_ != kind::randn && kind_ != kind::qrandn)
      throw cohort::error(describe() + ": sd() is only defined for randn and qrandn");
    return sd_;
  }

  /// The admissible value nearest to `x`, as JSON of the domain's type: x clamped into
  /// [low, high] (high - 1 for randint and lograndint), rounded to the nearest multiple of q (or
  /// integer), an integer for the integer domains and a float otherwise. Numeric domains only (PBT perturbs
  /// values by x1.2 / x0.8 and puts them back with this).
  nlohmann::json clamp_and_round(double x) const {
    numeric_or_throw("clamp_and_round()");
    if (std::isnan(x)) throw cohort::error(describe() + ": clamp_and_round() got NaN: pass a number");
    switch (kind_) {
      case kind::uniform:
      case kind::loguniform: return std::clamp(x, lo_, hi_);
      case kind::randn: return x;
      case kind::qrandn: return std::nearbyint(x / q_) * q_;
      case kind::randint:
      case kind::qrandint:
      case kind::lograndint:
      case kind::qlograndint: return integer_value(clamp_k(std::nearbyint(x / static_cast<double>(iq_))));
      default:  // quniform, qloguniform: clamp k = x / q into [klo, khi]
        return k_to_value(std::nearbyint(std::clamp(x / q_, klo_, khi_)));
    }
  }

  /// Short and printable: "loguniform(0.0001, 0.1)", "choice([32, 64])", "3".
  std::string describe() const {
    auto call = [](char const* name, std::initializer_list<double> args) {
      std::string out = std::string(name) + "(";
      for (double a : args) out += (out.back() == '(' ? "" : ", ") + detail::format_number(a);
      return out + ")";
    };
    switch (kind_) {
      case kind::constant: return constant_.dump();
      case kind::grid: return "grid_search(" + detail::format_values(values_) + ")";
      case kind::choice: return "choice(" + detail::format_values(values_) + ")";
      case kind::uniform: return call("uniform", {lo_, hi_});
      case kind::quniform: return call("quniform", {lo_, hi_, q_});
      case kind::loguniform: return call("loguniform", {lo_, hi_});
      case kind::qloguniform: return call("qloguniform", {lo_, hi_, q_});
      case kind::randint: return call("randint", {lo_, hi_});
      case kind::qrandint: return call("qrandint", {lo_, hi_, q_});
      case kind::lograndint: return call("lograndint", {lo_, hi_});
      case kind::qlograndint: return call("qlograndint", {lo_, hi_, q_});
      case kind::randn: return call("randn", {mean_, sd_});
      case kind::qrandn: return call("qrandn", {mean_, sd_, q_});
      case kind::function: return "sample_from(<function>)";
    }
    return {};
  }

 private:
  enum class kind {
    constant, grid, choice,                                                        // not numeric
    uniform, quniform, loguniform, qloguniform, randint, qrandint, lograndint, qlograndint, randn, qrandn,  // numeric
    function,
  };
  using function_type = std::function<nlohmann::json(nlohmann::json const&, std::mt19937_64&)>;

  explicit domain(kind k) : kind_(k) {}

  friend domain grid_search(std::vector<nlohmann::json>);
  friend domain choice(std::vector<nlohmann::json>);
  friend domain uniform(double, double);
  friend domain quniform(double, double, double);
  friend domain loguniform(double, double);
  friend domain qloguniform(double, double, double);
  friend domain randint(std::int64_t, std::int64_t);
  friend domain qrandint(std::int64_t, std::int64_t, std::int64_t);
  friend domain lograndint(std::int64_t, std::int64_t);
  friend domain qlograndint(std::int64_t, std::int64_t, std::int64_t);
  friend domain randn(double, double);
  friend domain qrandn(double, double, double);
  friend domain sample_from(function_type);

  /// Validates and stores bounds; for quantized kinds also k bounds (admissible values k * q).
  static domain bounded(kind k, double lo, double hi, double q) {
    domain d{k};
    d.lo_ = lo;
    d.hi_ = hi;
    d.q_ = q;
    std::string const what = d.describe();
    if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(q))
      throw cohort::error(what + ": bounds and q must be finite numbers: for an unbounded range use randn");
    if (lo > hi) throw cohort::error(what + ": low > high: pass the smaller bound first");
    if (q <= 0) throw cohort::error(what + ": q must be > 0: it is the spacing of the values");
    if (d.is_log() && !(lo > 0))
      throw cohort::error(what + ": bounds must be > 0 for a log scale: use a small positive low (e.g. 1e-8), "
                          "or uniform for a range that includes 0");
    if (k == kind::quniform || k == kind::qloguniform) {
      if (!detail::is_multiple(lo, q) || !detail::is_multiple(hi, q))
        throw cohort::error(what + ": low and high must be multiples of q (as in Ray): e.g. quniform(0, 1, 0.1)");
      d.klo_ = std::nearbyint(lo / q);
      d.khi_ = std::nearbyint(hi / q);
    }
    return d;
  }

  static domain integral(kind k, std::int64_t lo, std::int64_t hi, std::int64_t q) {
    domain d{k};
    d.lo_ = static_cast<double>(lo);
    d.hi_ = static_cast<double>(hi);
    d.q_ = static_cast<double>(q);
    std::string const what = d.describe();
    if (d.is_log() && lo <= 0)
      throw cohort::error(what + ": low must be > 0 for a log scale: use randint or qrandint for a range that includes 0");
    if (k == kind::randint || k == kind::lograndint) {
      if (lo >= hi)
        throw cohort::error(what + ": needs low < high, high is exclusive: " +
                            (lo < std::numeric_limits<std::int64_t>::max()
                                 ? what.substr(0, what.find('(')) + "(" + std::to_string(lo) + ", " + std::to_string(lo + 1) +
                                       ") always gives " + std::to_string(lo)
                                 : std::string("lower low")));
      d.iklo_ = lo;
      d.ikhi_ = hi - 1;
      d.klo_ = static_cast<double>(d.iklo_);
      d.khi_ = static_cast<double>(d.ikhi_);
      return d;
    }
    if (q <= 0) throw cohort::error(what + ": q must be > 0: it is the spacing of the values");
    if (lo > hi) throw cohort::error(what + ": low > high: pass the smaller bound first (high is inclusive)");
    // q > 0: round a / q towards -inf and +inf, without negating (-INT64_MIN overflows)
    auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - (a % b != 0 && a < 0); };
    auto ceil_div = [](std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 && a > 0); };
    std::int64_t const klo = ceil_div(lo, q), khi = floor_div(hi, q);
    if (klo > khi) throw cohort::error(what + ": no multiple of q lies in [low, high]: widen the range or change q");
    d.iklo_ = klo;
    d.ikhi_ = khi;
    d.iq_ = q;
    d.klo_ = static_cast<double>(klo);
    d.khi_ = static_cast<double>(khi);
    return d;
  }

  static domain normal(kind k, double mean, double sd, double q) {
    domain d{k};
    d.mean_ = mean;
    d.sd_ = sd;
    d.q_ = q;
    if (!std::isfinite(mean) || !std::isfinite(sd) || !std::isfinite(q))
      throw cohort::error(d.describe() + ": mean, sd and q must be finite numbers");
    if (!(sd > 0)) throw cohort::error(d.describe() + ": sd must be > 0: it is the standard deviation");
    if (!(q > 0)) throw cohort::error(d.describe() + ": q must be > 0: it is the spacing of the values");
    return d;
  }

  void numeric_or_throw(char const* what) const {
    if (!is_numeric()) throw cohort::error(describe() + ": " + what + " is only defined for numeric domains");
  }

  /// The admissible value k * q of quniform and qloguniform.
  nlohmann::json k_to_value(double k) const { return k * q_; }

  /// The admissible value k * q of an integer domain (q = 1 for randint and lograndint; within
  /// [low, high] for k in [iklo_, ikhi_]), a JSON integer.
  nlohmann::json integer_value(std::int64_t k) const { return k * iq_; }

  /// An integral `k` (a double) clamped into [iklo_, ikhi_] before it becomes an int64.
  std::int64_t clamp_k(double k) const {
    if (!(k > static_cast<double>(iklo_))) return iklo_;
    if (k >= static_cast<double>(ikhi_)) return ikhi_;
    return static_cast<std::int64_t>(k);  // strictly between two int64s
  }

  static double log_draw(double lo, double hi, std::mt19937_64& rng) {
    return std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * detail::uniform01(rng));
  }

  kind kind_;
  nlohmann::json constant_{};
  std::vector<nlohmann::json> values_{};
  double lo_ = -std::numeric_limits<double>::infinity();
  double hi_ = std::numeric_limits<double>::infinity();
  double q_ = 0;
  double klo_ = 0, khi_ = 0;  // admissible values are k * q (k for randint) for k in [klo_, khi_]
  std::int64_t iklo_ = 0, ikhi_ = 0, iq_ = 1;  // the same k bounds and q, exact, for randint and qrandint
  double mean_ = 0, sd_ = 1;
  function_type fn_{};
};

inline domain grid_search(std::vector<nlohmann::json> values) {
  if (values.empty())
    throw cohort::error(
        "grid_search() needs at least one value: pass the values to try, e.g. grid_search({0.1, 0.01})");
  domain d{domain::kind::grid};
  d.values_ = std::move(values);
  return d;
}

inline domain choice(std::vector<nlohmann::json> values) {
  if (values.empty())
    throw cohort::error("choice() needs at least one value: pass the candidates, e.g. choice({32, 64, 128})");
  domain d{domain::kind::choice};
  d.values_ = std::move(values);
  return d;
}

inline domain uniform(double low, double high) { return domain::bounded(domain::kind::uniform, low, high, 1.0); }
inline domain quniform(double low, double high, double q) {
  return domain::bounded(domain::kind::quniform, low, high, q);
}
inline domain loguniform(double low, double high) { return domain::bounded(domain::kind::loguniform, low, high, 1.0); }
inline domain qloguniform(double low, double high, double q) {
  return domain::bounded(domain::kind::qloguniform, low, high, q);
}
inline domain randint(std::int64_t low, std::int64_t high) {
  return domain::integral(domain::kind::randint, low, high, 1);
}
inline domain qrandint(std::int64_t low, std::int64_t high, std::int64_t q) {
  return domain::integral(domain::kind::qrandint, low, high, q);
}
inline domain lograndint(std::int64_t low, std::int64_t high) {
  return domain::integral(domain::kind::lograndint, low, high, 1);
}
inline domain qlograndint(std::int64_t low, std::int64_t high, std::int64_t q) {
  return domain::integral(domain::kind::qlograndint, low, high, q);
}

inline domain randn(double mean, double sd) { return domain::normal(domain::kind::randn, mean, sd, 1.0); }
inline domain qrandn(double mean, double sd, double q) { return domain::normal(domain::kind::qrandn, mean, sd, q); }

inline domain sample_from(std::function<nlohmann::json(nlohmann::json const&, std::mt19937_64&)> fn) {
  if (!fn) throw cohort::error("sample_from() needs a callable: pass a function of the config sampled so far");
  domain d{domain::kind::function};
  d.fn_ = std::move(fn);
  return d;
}

inline domain sample_from(std::function<nlohmann::json(nlohmann::json const&)> fn) {
  if (!fn) throw cohort::error("sample_from() needs a callable: pass a function of the config sampled so far");
  return sample_from([fn = std::move(fn)](nlohmann::json const& config, std::mt19937_64&) { return fn(config); });
}

}  // namespace cohort::tuning
