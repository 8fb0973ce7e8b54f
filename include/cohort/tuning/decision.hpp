#pragma once
/// \file
/// What searchers, schedulers and stoppers are told and what they answer: the shared vocabulary of
/// the tuning layer. Every decision is a pure function of what was reported so far, so the tuner can
/// make it on one rank and the tests can check it on hand-computed learning curves.

#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/order.hpp"

namespace cohort::tuning {

/// The metric a tuning run optimises and its direction, passed to searchers and schedulers once,
/// before the first trial. `metric` may be empty for a searcher or scheduler that needs none.
struct objective {
  std::string metric{};
  cohort::order mode = cohort::order::max;
};

/// A scheduler's answer to one reported result.
enum class decision {
  proceed,  ///< keep training the trial
  stop,     ///< stop the trial for good (early stopping); it ends as "terminated"
  pause,    ///< checkpoint and park the trial; the tuner may resume it later
  exploit,  ///< (PBT) restart the trial from `donor`'s latest checkpoint with `config`
};

/// A scheduler's full answer: the decision and, for `exploit`, what to clone and the new config.
struct scheduling_decision {
  tuning::decision what = decision::proceed;
  std::string donor{};          ///< exploit: the trial whose latest checkpoint is cloned
  nlohmann::json config{};      ///< exploit: the perturbed config the trial continues with
};

/// The results of one trial a scheduler is sure to answer `proceed`, whatever other trials report
/// meanwhile: those whose `key` (a number) is below `below`; every result when `key` is empty. A
/// scheduler that can tell (`proceeds(id)`: schedule::fifo, schedule::asha) lets the tuner send
/// those results to its coordinator without waiting for the answer.
struct proceed_span {
  std::string key{};
  double below = std::numeric_limits<double>::infinity();
};

/// Whether a searcher's next suggestion, or which trial a scheduler lets run next, is the same
/// whenever a running trial's completion arrives. A policy says so with `static constexpr bool
/// next_independent_of_completions = true;`: search::basic (its suggestions learn nothing), and
/// schedule::fifo and asha (they never pause or exploit a trial, so the next trial is the
/// searcher's). Without it, a policy is taken to depend on completions.
template <class P>
inline constexpr bool independent_of_completions = requires { requires P::next_independent_of_completions; };

/// A synchronous scheduler's decisions about trials other than the one reporting (HyperBand at a
/// milestone, synchronous PBT at a perturbation point): paused trials to resume, to stop, and to
/// restart from a donor's checkpoint with a new config (trial id, its `exploit` decision). A trial
/// still pausing when it is named is resumed, stopped or restarted once its pause is committed.
struct paused_decisions {
  std::vector<std::string> resume{};
  std::vector<std::string> stop{};
  std::vector<std::pair<std::string, scheduling_decision>> exploit{};
};

namespace detail {

/// The value named `key` in a result or config: the key itself, else the "a/b" path through
/// nested objects. Null when absent.
inline nlohmann::json const* find_key(nlohmann::json const& j, std::string const& key) {
  if (!j.is_object()) return nullptr;
  if (auto it = j.find(key); it != j.end()) return &*it;
  nlohmann::json const* at = &j;
  std::size_t begin = 0;
  while (true) {
    auto slash = key.find('/', begin);
    auto part = key.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    if (!at->is_object()) return nullptr;
    auto it = at->find(part);
    if (it == at->end()) return nullptr;
    at = &*it;
    if (slash == std::string::npos) return at;
    begin = slash + 1;
  }
}

/// "a, b, c": the top-level keys of a result, for error messages.
inline std::string keys_of(nlohmann::json const& j) {
  if (!j.is_object()) return "none, it is not an object";
  std::string out;
  for (auto const& [k, v] : j.items()) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "none" : out;
}

}  // namespace detail

}  // namespace cohort::tuning
