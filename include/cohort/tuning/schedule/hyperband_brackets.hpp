#pragma once
/// \file
/// The bracket schedule of synchronous HyperBand (Li et al. 2018, as Ray's HyperBandScheduler
/// computes it): how many trials each bracket of a band starts, and how many go on at each
/// milestone to how many iterations. A pure function: the arithmetic schedule::hyperband
/// (hyperband.hpp) follows.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::tuning::schedule {

/// One milestone of a bracket: `trials` live trials run until `iteration` (cumulative).
struct hyperband_milestone {
  std::int64_t trials = 0;
  std::int64_t iteration = 0;
  friend bool operator==(hyperband_milestone const&, hyperband_milestone const&) = default;
};

/// One bracket: `s` successive halvings after its first milestone.
struct hyperband_bracket {
  int s = 0;
  std::vector<hyperband_milestone> milestones;  ///< the first: (n0 trials, r0 iterations); the last at max_t when max_t is a power of eta
};

/// Pure: the brackets of one HyperBand band, in the order Ray fills them (s = 0, 1, ...,
/// s_max), for `max_t` iterations and reduction factor `eta`. s_max + 1 = round(log(max_t) /
/// log(eta)) + 1; bracket s starts n0 = ceil((s_max + 1) / (s + 1) * eta^s) trials run to
/// r0 = floor(max_t * eta^-s) iterations (a bracket whose r0 is 0 is skipped, as Ray's "Bracket too
/// small"); at each of its s milestones the best ceil(n / eta) go on for r = min(r * eta, max_t -
/// iterations so far) more. Throws cohort::error unless max_t >= 1 and eta > 1.
inline std::vector<hyperband_bracket> hyperband_brackets(std::int64_t max_t, double eta) {
  if (max_t < 1) throw cohort::error("hyperband: max_t must be at least 1, got " + std::to_string(max_t));
  if (!(eta > 1)) throw cohort::error("hyperband: the reduction factor must be above 1, got " + std::to_string(eta));
  auto const brackets = static_cast<int>(std::round(std::log(static_cast<double>(max_t)) / std::log(eta))) + 1;
  std::vector<hyperband_bracket> out;
  for (int s = 0; s < brackets; ++s) {
    auto const r0 = static_cast<std::int64_t>(static_cast<double>(max_t) * std::pow(eta, -s));
    if (r0 == 0) continue;
    auto n = static_cast<std::int64_t>(std::ceil(static_cast<double>(brackets) / (s + 1) * std::pow(eta, s)));
    hyperband_bracket b{.s = s, .milestones = {{n, r0}}};
    std::int64_t r = r0, done = r0;
    for (int h = 0; h < s; ++h) {
      n = static_cast<std::int64_t>(std::ceil(static_cast<double>(n) / eta));
      r = static_cast<std::int64_t>(std::min(static_cast<double>(r) * eta, static_cast<double>(max_t - done)));
      done += r;
      b.milestones.push_back({n, done});
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// Pure: the brackets of one band of BOHB (Falkner et al. 2018, as its reference implementation
/// HpBandSter computes them with min_budget 1 and max_budget `max_t`), in the order it runs them
/// (s = s_max first). S = floor(log(max_t) / log(eta)) + 1 budgets, max_t * eta^-k for
/// k = S - 1, ..., 0, rounded to whole iterations; bracket s starts n0 = floor(S / (s + 1)) * eta^s
/// trials on the budget S - 1 - s (counting from 0), and after each budget the best
/// max(floor(n0 * eta^-i), 1) go on to the next, up to max_t. Where Ray's HyperBand (hyperband_brackets)
/// rounds trial counts up and spreads the iterations, BOHB's brackets are HyperBand's of the paper.
/// Throws cohort::error unless max_t >= 1 and eta > 1.
inline std::vector<hyperband_bracket> bohb_brackets(std::int64_t max_t, double eta) {
  if (max_t < 1) throw cohort::error("bohb: max_t must be at least 1, got " + std::to_string(max_t));
  if (!(eta > 1)) throw cohort::error("bohb: the reduction factor must be above 1, got " + std::to_string(eta));
  auto const budgets_n = static_cast<int>(std::floor(std::log(static_cast<double>(max_t)) / std::log(eta) + 1e-9)) + 1;
  auto budget = [&](int k) {  // k = 0 .. budgets_n - 1, the last max_t
    return std::max<std::int64_t>(1, std::llround(static_cast<double>(max_t) * std::pow(eta, -(budgets_n - 1 - k))));
  };
  std::vector<hyperband_bracket> out;
  for (int s = budgets_n - 1; s >= 0; --s) {
    double const n0 = std::floor(static_cast<double>(budgets_n) / (s + 1)) * std::pow(eta, s);
    hyperband_bracket b{.s = s, .milestones = {}};
    for (int i = 0; i <= s; ++i)
      b.milestones.push_back({std::max<std::int64_t>(1, static_cast<std::int64_t>(n0 * std::pow(eta, -i) + 1e-9)),
                              budget(budgets_n - 1 - s + i)});
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace cohort::tuning::schedule
