#pragma once
/// \file
/// A data loader's knobs and its resumable position (no LibTorch needed to name them).

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace cohort {

/// Knobs of a loader; none of them changes which samples a rank sees or in which order.
struct loader_options {
  std::int64_t batch_size = 32;      ///< samples per batch on each rank
  /// Batches made ahead by background threads (0 with no workers: none). 2, PyTorch DataLoader's
  /// prefetch_factor: bench_data_loader finds in-memory batches need none (data wait 0.13% without,
  /// 0.16% at 4: docs/benchmarks.md, "Data loading"); decoded shards gain from workers, not depth.
  /// In-memory batches on a rank whose intra-op threads take all its cores are made on the
  /// training thread instead (loader_threads).
  std::size_t prefetch_batches = 2;
  /// Threads that make batches in parallel (decode a shard dataset's samples, gather a tensor
  /// dataset's rows); 0: one thread when prefetch_batches > 0. Batches come out in order whatever
  /// the threads' timing; at most max(prefetch_batches, num_workers) are made ahead.
  std::size_t num_workers = 0;
  bool drop_last = true;  ///< drop the last partial batch of an epoch
};

/// Pure: how many threads make a loader's batches. `num_workers` when set; else one when
/// `prefetch_batches` > 0, except for batches gathered from memory (`in_memory`: a tensor
/// dataset's rows, microseconds each) on a rank whose `intra_op_threads`, more than one, take
/// every one of the `rank_cpus` it may run on, with no spare core for cohort's threads
/// (`spare_cpus`): there they are made on the training thread. A thread woken beside a busy
/// OpenMP team takes a core the team waits for at its next barrier: the reference CNN on one
/// rank of two cores ran at 0.91x the plain loop with the thread and 1.07x without
/// (bench/compare, docs/benchmarks.md, "One rank against the plain C++ loop").
constexpr std::size_t loader_threads(loader_options const& o, bool in_memory, int intra_op_threads, int rank_cpus,
                                     bool spare_cpus) {
  if (o.num_workers > 0) return o.num_workers;
  if (o.prefetch_batches == 0) return 0;
  bool const cores_taken = intra_op_threads > 1 && intra_op_threads >= rank_cpus && !spare_cpus;
  return in_memory && cores_taken ? 0 : 1;
}

/// A loader's position: the next batch handed out is batch `position` of epoch `epoch`. `seed` is
/// the sharding policy's seed (0 when it has none); a state restores only under the same seed.
/// The rest says how the epoch's samples were dealt (sharding/redeal.hpp), so that a job
/// relaunched with another number of ranks, or another batch size, resumes at exactly the samples
/// it had reached: `world_size` ranks of `batch_size` were dealing, the epoch's sample sequence is
/// the dealing to `epoch_world_size` ranks, `epoch_offset` of its samples were consumed before the
/// current dealing began, and the epoch trains its first `epoch_end` (0: all; fewer when the
/// epoch's first dealing dropped partial batches). A state saved without them (0) is taken to be
/// of the world size and batch size it is restored at (which cannot be checked).
/// `dataset_size` is the dataset's sample count: a state restores only over a dataset of the same
/// size (a shard set that gained or lost samples would deal another order; 0: not recorded).
/// Small and JSON-convertible, so a checkpoint can carry it.
struct loader_state {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::uint64_t seed = 0;
  std::int64_t world_size = 0;
  std::int64_t batch_size = 0;
  std::int64_t epoch_world_size = 0;
  std::int64_t epoch_offset = 0;
  std::int64_t epoch_end = 0;
  std::int64_t dataset_size = 0;

  /// Samples of the epoch's sequence trained on by all ranks together before batch `position`.
  std::int64_t samples_seen() const { return epoch_offset + position * batch_size * world_size; }
  friend bool operator==(loader_state const&, loader_state const&) = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(loader_state, epoch, position, seed, world_size, batch_size,
                                                epoch_world_size, epoch_offset, epoch_end, dataset_size)

}  // namespace cohort
