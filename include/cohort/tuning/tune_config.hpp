#pragma once
/// \file
/// cohort::tune_config: what a tuning run optimises and how many trials run side by side.

#include <cstddef>
#include <string>

#include "cohort/order.hpp"

namespace cohort {

/// The knobs of a tuning run (Ray's TuneConfig). Passed to cohort::tuner with its policies.
struct tune_config {
  std::string metric{};                     ///< the metric searchers and schedulers optimise
  cohort::order mode = cohort::order::max;  ///< its direction
  std::size_t num_samples = 1;              ///< repeats of the search space (the whole grid num_samples times)
  int ranks_per_trial = 1;                  ///< ranks of each trial group; must divide the world size
  std::size_t max_concurrent_trials = 0;    ///< at most this many trials at once; 0: one per group
  double status_interval_s = 5.0;           ///< console status table at most this often (Ray's CLIReporter: 5 s)
  /// experiment_state.json and trials.csv are rewritten at most this often (and at most every 20
  /// times as long as the last rewrite took, so that it costs at most 5% of rank 0's time).
  double state_interval_s = 1.0;
  /// Class trainables (setup/step/save_checkpoint/load_checkpoint): checkpoint every this many
  /// steps (and at a step whose result says "done"); 0 never.
  std::size_t checkpoint_frequency = 1;
  /// A trial whose functor throws runs again on a free group, from its latest committed
  /// checkpoint (from the start when it has none), up to this many times; the next failure makes
  /// it ERROR (Ray's FailureConfig(max_failures)). 0: the first failure does; -1: without limit.
  int max_failures = 0;
  /// When the experiment is restored (rerun with the same name, docs/tuning.md), as Ray's
  /// Tuner.restore: unfinished trials (pending, running, paused) go on (true) or end as they were,
  /// TERMINATED (false); ERROR trials go on from their latest checkpoint (resume_errored) or start
  /// over with their config (restart_errored: their directory moved aside, never deleted).
  bool resume_unfinished = true;
  bool resume_errored = false;   ///< see resume_unfinished
  bool restart_errored = false;  ///< see resume_unfinished; not with resume_errored
  /// The same seed gives the same experiment at any number of trial groups (docs/tuning.md,
  /// reproducibility): the scheduler sees results in a fixed order (a trial's result at iteration
  /// t once every earlier trial still running has reported t), and the searcher learns of a trial
  /// only when it and every earlier trial have ended, `reproducible_lag` trials behind the one it
  /// suggests (suggestion k from trials 0 .. k - 1 - lag, waiting for them; fewer under a
  /// scheduler that pauses trials: trials_settled_before). Off by default: groups may wait.
  /// schedule::fifo, asha, hyperband and pbt{.synch = true} only.
  bool reproducible = false;
  std::size_t reproducible_lag = 8;  ///< see reproducible
};

}  // namespace cohort
