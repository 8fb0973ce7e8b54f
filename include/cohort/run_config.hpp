#pragma once
/// \file
/// cohort::run_config: where a run's files go and how it reports.

#include <chrono>
#include <string>

#include "cohort/checkpointing/payload.hpp"
#include "cohort/checkpointing/validators.hpp"

namespace cohort {

/// Where and how a run records itself (Ray's RunConfig).
struct run_config {
  std::string name{};                        ///< run directory name; empty: "cohort_<UTC date-time>"
  std::string storage_path = "cohort_results";  ///< parent of the run directory
  int verbose = 1;                           ///< 0: silent; 1: one rank-0 line per report
  /// How long a rank whose functor threw waits for the others to reach the end of fit() before
  /// it aborts the job (they may be blocked in a collective it will never enter). Never a hang.
  int abort_timeout_ms = 30'000;
  /// How long any collective of the run (gradient all-reduces, the ranks' agreements, broadcasts,
  /// the end-of-fit checks; NCCL's on a GPU) may wait for the other ranks. Past it, every rank
  /// that can still print says which collective it waits in and where its functor is, and the
  /// job is aborted (non-zero exit). Ranks on different code paths are found sooner, at the next
  /// report or backward (docs/fault-tolerance.md). 0: no deadline. 10 minutes, as PyTorch's NCCL
  /// watchdog; raise it for steps slower than that.
  int collective_timeout_ms = 600'000;
  /// A checkpoint directory to resume from. Empty: resume from the latest good checkpoint of this
  /// run directory, if there is one (rerunning the same command resumes, as in Ray Train).
  std::string resume_from_checkpoint{};
  /// Write checkpoints before report() returns (sync) or in the background (async).
  cohort::checkpoint_mode checkpoint_mode = cohort::checkpoint_mode::sync;
  /// Write a TensorBoard events file (`events.out.tfevents.*`) into the run directory: every
  /// numeric metric of every report (bools as 0/1; strings and nulls left out) as a scalar at its
  /// training_iteration, tagged with its flattened key ("val/acc"). Rank 0's background thread
  /// writes it, so report() does not wait for it; each attempt of a run writes a new file. Under
  /// a tuner every trial directory gets one. `tensorboard --logdir <storage_path>` shows them.
  bool tensorboard = true;
  /// Ranks that validate instead of training (Ray's validate_fn on workers of its own): the last
  /// `validators.ranks` ranks run `validators.validate` on every committed checkpoint, together
  /// (they may communicate), while the others train; the first validator's metrics are merged
  /// into the checkpoint's as a report's validate_fn's are (docs/checkpointing.md).
  cohort::validator_options validators{};
};

}  // namespace cohort
