#pragma once
/// \file
/// What a report carries to be checkpointed: a function that writes this rank's files.

#include <filesystem>
#include <functional>

namespace cohort {

/// Whose state a checkpoint holds: who must pass it to report().
enum class checkpoint_scope {
  replicated,  ///< the same on every rank: rank 0 writes it (checkpoint_of); the other ranks may pass none (Ray's idiom)
  per_rank,    ///< each rank's own (sharded) state: every rank passes one, or the report is an error naming the ranks without
};

/// The files of one checkpoint, as written by one rank: `write(dir, rank)` puts them into `dir`
/// (shared by all ranks of the trainer; use distinct names per rank for per-rank state). Make
/// one with cohort::checkpoint_of (LibTorch state) or write your own files.
struct checkpoint_payload {
  std::function<void(std::filesystem::path const& dir, int rank)> write;
  /// Copies whatever `write` refers to on this rank, so that training may change it while
  /// `write` runs on a background thread. Called by report() in async mode only, with this
  /// rank (sync mode writes before report() returns, from the live state, with no copy). May be
  /// empty when `write` owns its data.
  std::function<void(int rank)> snapshot{};
  /// Async mode: called on the writer thread before `write`, to finish copies that `snapshot`
  /// left for later (checkpoint_of defers the copy of a prepared model's parameters and
  /// optimizer state, holding the next optimizer step until it is done). May be empty.
  std::function<void()> finish_snapshot{};
  /// Whose state this is (see checkpoint_scope).
  checkpoint_scope scope = checkpoint_scope::replicated;
  /// Called on every rank when the files `write` put into `dir` will not be committed (a rank's
  /// write or rank 0's commit failed), before `dir` is deleted: a payload that moved files in
  /// (a directory checkpoint in checkpoint_mode::no_upload) moves them back. May be empty.
  std::function<void(std::filesystem::path const& dir, int rank)> undo{};
};

/// When checkpoint files are written.
enum class checkpoint_mode {
  sync,   ///< report() returns once the checkpoint is committed on disk
  async,  ///< report() returns once the state is captured (checkpoint_of copies it); the files are
          ///< written and committed by a background thread on each rank while training goes on,
          ///< at most one checkpoint in flight; the next report (or the end of fit) waits for it
  no_upload,  ///< Ray's NO_UPLOAD: a directory checkpoint (report(metrics, checkpoint::from_directory(dir)))
              ///< written under the run directory is committed where it lies (renamed to
              ///< checkpoint_<iteration>, no byte copied) instead of copied; everything else as sync
};

}  // namespace cohort
