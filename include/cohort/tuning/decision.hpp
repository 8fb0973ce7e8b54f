#pragma once
/// \file
/// What searchers, schedulers and stoppers are told and what they answer: the shared vocabulary of
/// the tuning layer. Every decision is a pure function of what was reported so far, so the tuner can
/// make it on one rank and the tests can check it on hand-computed learning curves.

#include <string>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/policies.hpp"  // cohort::order

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

}  // namespace cohort::tuning
