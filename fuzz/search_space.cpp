// libFuzzer target: a search space built from arbitrary JSON, as a program that reads its space
// from a file would build it: {"space": {"key": {"uniform": [low, high]} | {"choice": [...]} |
// ... | a constant}, "probe": x}. Building must succeed or throw cohort::error; an accepted space
// must sample (seed fixed) values inside each domain's bounds, search::basic must expand its
// grid from the given values, and clamp_and_round(probe) must land inside the bounds.
#include <cohort/tuning/search_space.hpp>
#include <cohort/tuning/searchers.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
namespace tuning = cohort::tuning;

std::optional<double> real(json const& a, std::size_t i) {
  if (!a.is_array() || i >= a.size() || !a[i].is_number()) return std::nullopt;
  return a[i].get<double>();
}
std::optional<std::int64_t> integer(json const& a, std::size_t i) {
  if (!a.is_array() || i >= a.size() || !a[i].is_number_integer()) return std::nullopt;
  if (a[i].is_number_unsigned() && a[i].get<std::uint64_t>() > std::uint64_t{INT64_MAX}) return std::nullopt;
  return a[i].get<std::int64_t>();
}
std::vector<json> values(json const& a) { return a.is_array() ? a.get<std::vector<json>>() : std::vector<json>{}; }

/// The domain `spec` describes, or nothing when the harness cannot read its arguments.
std::optional<tuning::domain> domain_of(json const& spec) {
  if (!spec.is_object() || spec.size() != 1) return tuning::domain(spec);  // a constant
  std::string const name = spec.begin().key();
  auto const& a = spec.begin().value();
  auto r0 = real(a, 0), r1 = real(a, 1), r2 = real(a, 2);
  auto i0 = integer(a, 0), i1 = integer(a, 1), i2 = integer(a, 2);
  if (name == "choice") return tuning::choice(values(a));
  if (name == "grid_search") return tuning::grid_search(values(a));
  if (name == "uniform" && r0 && r1) return tuning::uniform(*r0, *r1);
  if (name == "quniform" && r0 && r1 && r2) return tuning::quniform(*r0, *r1, *r2);
  if (name == "loguniform" && r0 && r1) return tuning::loguniform(*r0, *r1);
  if (name == "qloguniform" && r0 && r1 && r2) return tuning::qloguniform(*r0, *r1, *r2);
  if (name == "randint" && i0 && i1) return tuning::randint(*i0, *i1);
  if (name == "qrandint" && i0 && i1 && i2) return tuning::qrandint(*i0, *i1, *i2);
  if (name == "randn" && r0 && r1) return tuning::randn(*r0, *r1);
  if (name == "qrandn" && r0 && r1 && r2) return tuning::qrandn(*r0, *r1, *r2);
  return tuning::domain(spec);
}

/// `v` is a value `d` may give (quantized values within a relative 1e-9 of the bounds).
bool admissible(tuning::domain const& d, json const& v) {
  if (d.is_constant()) return v == d.constant();
  if (d.is_categorical() || d.is_grid()) return std::find(d.values().begin(), d.values().end(), v) != d.values().end();
  if (!v.is_number()) return false;
  if (d.is_integer() && !v.is_number_integer()) return false;
  double const x = v.get<double>(), lo = d.low(), hi = d.high();
  if (std::isinf(lo) && std::isinf(hi)) return !std::isnan(x);  // randn, qrandn
  double const slack = 1e-9 * std::max({std::fabs(lo), std::fabs(hi), d.quantum().value_or(0.0)});
  if (d.describe().rfind("randint(", 0) == 0) return x >= lo && x <= hi - 1;  // randint: high exclusive
  return x >= lo - slack && x <= hi + slack;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  auto const input = json::parse(data, data + size, nullptr, false);
  if (!input.is_object() || !input.contains("space") || !input["space"].is_object()) return 0;
  try {
    tuning::space sp;
    bool grid = false;
    for (auto const& [key, spec] : input["space"].items()) {
      auto d = domain_of(spec);
      if (!d) return 0;
      grid = grid || d->is_grid();
      sp.add(key, *d);
    }
    if (!grid) {
      std::mt19937_64 rng(7);
      for (int i = 0; i < 4; ++i) {
        auto const config = tuning::sample_config(sp, rng);
        for (auto const& p : sp) {
          auto const* v = tuning::lookup(config, p.key);
          if (!v || !admissible(p.domain, *v)) __builtin_trap();
        }
      }
    }
    if (sp.grid_size() <= 64) {
      cohort::search::basic searcher{.seed = 7};
      searcher.setup(sp, {"loss", cohort::order::min}, 1);
      for (std::size_t i = 0; i < sp.grid_size(); ++i) {
        auto const config = searcher.suggest("trial");
        if (!config) __builtin_trap();
        for (auto const& p : sp)
          if (auto const* v = tuning::lookup(*config, p.key); !v || !admissible(p.domain, *v)) __builtin_trap();
      }
      if (searcher.suggest("trial")) __builtin_trap();  // num_samples 1: the grid once
    }
    if (auto const probe = real(input.value("probe", json::array()), 0))
      for (auto const& p : sp)
        if (p.domain.is_numeric() && !std::isnan(*probe) && !admissible(p.domain, p.domain.clamp_and_round(*probe))) __builtin_trap();
  } catch (cohort::error const&) {
  }
  return 0;
}
