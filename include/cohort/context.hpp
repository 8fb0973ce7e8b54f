#pragma once
/// \file
/// cohort::context: what a training functor sees of the job (ranks, device, name), and how it
/// reports. One per rank per fit().

#include <any>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/checkpointing/retained.hpp"  // cohort::validate_fn
#include "cohort/comm/any.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/gradients/model_options.hpp"
#include "cohort/report/protocol.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"
#include "cohort/data/datasets.hpp"
#include "cohort/data/loader_options.hpp"
#include "cohort/sharding/redeal.hpp"

namespace cohort {

/// The exit code for a run that stopped because it was asked to (SIGTERM or SIGINT) after
/// committing its checkpoint: EX_TEMPFAIL, "try again". cohort-run reruns it.
inline constexpr int exit_code_preempted = 75;

namespace detail {
struct context_access;
}

/// What a training functor receives. Valid for the duration of fit(); not copyable. What the
/// library itself needs of it (the ranks' agreement, loader storage, what the trainer sets) is
/// reached through detail::context_access, not through this type.
class context {
  friend struct detail::context_access;

 public:
  /// Built by the trainer.
  context(scaling::topology topo, cohort::device dev, int threads, std::string name, std::filesystem::path run_path,
          comm::any& work, report::protocol& reports,
          sharding::indices_fn shard,
          cohort::datasets const* data = nullptr, std::uint64_t sharding_seed = 0)
      : topo_(topo), device_(dev), threads_(threads), name_(std::move(name)), run_path_(std::move(run_path)),
        comm_(work), reports_(reports), shard_(std::move(shard)), datasets_(data), sharding_seed_(sharding_seed) {}
  context(context const&) = delete;
  context& operator=(context const&) = delete;

  int world_rank() const { return topo_.world_rank; }            ///< rank in the trainer's communicator
  int world_size() const { return topo_.world_size; }            ///< ranks in the trainer's communicator
  int local_rank() const { return topo_.local_rank; }            ///< rank among this node's ranks
  int local_world_size() const { return topo_.local_world_size; }  ///< ranks on this node
  int node_rank() const { return topo_.node_rank; }              ///< this node's index
  int num_nodes() const { return topo_.num_nodes; }              ///< nodes (hosts) the ranks run on
  /// All of the above, and this rank's place among every rank of the job on its node
  /// (job_local_rank: what scaling::cuda picks the GPU by, so that trials side by side differ).
  scaling::topology const& topology() const { return topo_; }
  std::string const& experiment_name() const { return name_; }    ///< the run's name (run_config.name)
  std::filesystem::path const& run_path() const { return run_path_; }  ///< the run directory
  cohort::device device() const { return device_; }               ///< this rank's compute device
  int intra_op_threads() const { return threads_; }               ///< intra-op threads set for this rank

  /// The trainer's communicator (a duplicate of the one fit() was given), for the functor's own
  /// collectives, e.g. averaging an evaluation metric. Collectives must be entered by every rank.
  comm::any& comm() { return comm_; }

  /// Records one round of metrics. Every rank calls it at the same points of its control flow
  /// (a rank that reports more or less often is an error on every rank, see
  /// docs/fault-tolerance.md); rank 0's metrics are recorded, with Ray's auto-filled keys
  /// training_iteration, time_this_iter_s, time_total_s and timestamp, in result.json and
  /// progress.csv. Collective: one small all-reduce (the ranks' agreement on their control flow).
  /// When another rank passes a checkpoint to the same report, this is that checkpointed report.
  void report(nlohmann::json const& metrics) { reports_.report(metrics, nullptr); }

  /// Records metrics with a checkpoint (Ray's `report(metrics, checkpoint=...)`): `payload`
  /// writes this rank's files (rank 0 the replicated state, any rank may add its own) into one
  /// directory, which rank 0 commits atomically as checkpoint_<iteration> and the checkpointing
  /// policy then keeps or deletes. Every rank calls report() here; a replicated checkpoint
  /// (checkpoint_of) may be passed on rank 0 only, the others calling report(metrics), as in Ray;
  /// per-rank state (checkpoint_payload::scope = per_rank) must be passed on every rank.
  /// Collective: the agreement, then two agreements over the trainer's control communicator. A
  /// failed write or commit is a cohort::error on every rank.
  void report(nlohmann::json const& metrics, checkpoint_payload const& payload) { reports_.report(metrics, &payload); }

  /// Records metrics with a checkpoint written as a directory by the functor itself (Ray's
  /// `report(metrics, checkpoint=Checkpoint.from_directory(dir))`): rank 0 copies `dir` into
  /// checkpoint_<iteration> (checkpoint_mode sync and async: Ray's upload; leave `dir` as it is
  /// until report() returns, in async mode until the next report), or, with
  /// checkpoint_mode::no_upload, moves it there, no byte copied, when it lies under run_path()
  /// (Ray's NO_UPLOAD). Other ranks may pass the same directory, with files of their own written
  /// into it before report(), or call report(metrics). Then committed as any checkpoint. A
  /// directory that is missing, holds a symbolic link, or (no_upload) lies outside the run
  /// directory is an error on every rank.
  void report(nlohmann::json const& metrics, cohort::checkpoint const& dir) { reports_.report_directory(metrics, dir.path()); }

  /// A report with a checkpoint and its asynchronous validation (Ray's validate_fn): once the
  /// checkpoint is committed, `validate(checkpoint)` runs on a background thread of rank 0 while
  /// training goes on; the metrics it returns are merged into that checkpoint's metrics (same key
  /// overwrites), written to its validation.json, and used by the retention policy (keep_best
  /// can rank by them). result.best_checkpoints shows the merged metrics. One validation at a
  /// time; fit() waits for the last one. `validate` must not communicate; rank 0's is used.
  void report(nlohmann::json const& metrics, checkpoint_payload const& payload, validate_fn validate) {
    reports_.report(metrics, &payload, validate);
  }

  /// The checkpoint this run resumes from: the latest committed checkpoint of this run directory
  /// that verifies against its manifest (or the one named by run_config.resume_from_checkpoint);
  /// nothing on a fresh run. The same on every rank.
  std::optional<cohort::checkpoint> const& checkpoint() const { return resume_; }

  /// This rank's sample indices of a dataset of `dataset_size` samples in `epoch`, from the
  /// trainer's sharding policy. Every rank gets the same count. No communication.
  std::vector<std::size_t> shard_indices(std::size_t dataset_size, std::int64_t epoch) const {
    return shard_(dataset_size, topo_.world_size, topo_.world_rank, epoch);
  }

  /// The trainer's sharding policy for any world size, and this rank's place in it (what a
  /// loader needs to deal the rest of an epoch again when a job resumes at another world size).
  sharding::rank_shard sharding() const { return {shard_, topo_.world_size, topo_.world_rank}; }

  /// This rank's loader of the trainer's dataset `name` (a cohort::tensor_dataset given through
  /// cohort::datasets): sharded by the trainer's policy, batched, prefetched, on this rank's
  /// device. The same loader on every call, so `for (auto& b : ctx.dataset_shard("train").epoch())`
  /// runs epoch after epoch. Needs LibTorch (cohort/data/torch/data_loader.hpp). No communication.
  template <class Options = loader_options>
  auto& dataset_shard(std::string const& name, Options const& options = {}) {
    return dataset_shard_for(*this, name, options);  // found by ADL in torch/
  }

  /// The seed of the trainer's sharding policy (0 when it has none).
  std::uint64_t sharding_seed() const { return sharding_seed_; }
  /// How long a collective may wait for the other ranks (run_config::collective_timeout_ms).
  int collective_timeout_ms() const { return collective_timeout_ms_; }

  /// Broadcasts `model`'s parameters and buffers from rank 0, checks that every rank holds the
  /// same layout, and averages gradients over the ranks during backward (bucketed,
  /// non-blocking all-reduces). Needs LibTorch: include cohort/torch/prepare_model.hpp (the
  /// umbrella header does when COHORT_WITH_TORCH is set).
  template <class Module>
  auto prepare_model(Module module, model_options const& options = {}) {
    return prepare_model_for(*this, std::move(module), options);  // found by ADL in torch/
  }

 private:
  scaling::topology topo_;
  cohort::device device_;
  int threads_;
  std::string name_;
  std::filesystem::path run_path_;
  comm::any& comm_;
  report::protocol& reports_;
  sharding::indices_fn shard_;
  cohort::datasets const* datasets_;
  std::uint64_t sharding_seed_;
  std::map<std::string, std::shared_ptr<void>> loaders_;
  std::optional<cohort::checkpoint> resume_;
  int collective_timeout_ms_ = 600'000;
};

namespace detail {

/// The library's access to a context's internals: the trainer sets what it found at setup, and
/// the LibTorch glue (prepare_model, the data loaders) takes part in the ranks' agreement and
/// keeps its loaders there. Not for training functors.
struct context_access {
  /// The ranks' agreement on control flow (prepare_model and the gradient reducer take part).
  static detail::lockstep& lockstep(context& c) { return c.reports_.steps(); }
  /// Storage for the loader of dataset `name` (dataset_shard's, kept for the run).
  static std::shared_ptr<void>& loader_slot(context& c, std::string const& name) { return c.loaders_[name]; }
  /// The trainer's dataset `name`, or nullptr.
  static std::any const* dataset(context const& c, std::string const& name) {
    if (!c.datasets_) return nullptr;
    auto it = c.datasets_->items.find(name);
    return it == c.datasets_->items.end() ? nullptr : &it->second;
  }
  /// The names of the trainer's datasets, for messages ("no datasets" when none).
  static std::string dataset_names(context const& c) {
    std::string s;
    if (c.datasets_)
      for (auto const& [k, v] : c.datasets_->items) s += (s.empty() ? "'" : ", '") + k + "'";
    return s.empty() ? std::string("no datasets") : s;
  }
  /// The checkpoint to resume from, found at the start of fit().
  static void set_resume_checkpoint(context& c, std::optional<cohort::checkpoint> checkpoint) {
    c.resume_ = std::move(checkpoint);
  }
  /// run_config::collective_timeout_ms, as the run applies it.
  static void set_collective_timeout_ms(context& c, int ms) { c.collective_timeout_ms_ = ms; }
};

}  // namespace detail

}  // namespace cohort
