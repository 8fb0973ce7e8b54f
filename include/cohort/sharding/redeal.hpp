#pragma once
/// \file
/// Elastic resume: the rest of an epoch dealt again to a different number of ranks, so that a job
/// relaunched with fewer (or more) ranks goes on from exactly the samples it had reached.
///
/// An epoch's *sample sequence* is the sharding of the world size the epoch began with, read
/// batch-row by batch-row: entry `i * world + r` is rank r's i-th index. Batch b of every rank
/// together is entries [b * batch * world, (b + 1) * batch * world), so after `position` batches the
/// samples seen are exactly the first `position * batch * world` entries, whatever the policy. The
/// rest is dealt round-robin to the new ranks, which again consume it a prefix at a time: a second
/// resize in the same epoch is exact too.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace cohort::sharding {

/// A policy's indices for any world size: `indices(dataset_size, world_size, rank, epoch)`.
using indices_fn = std::function<std::vector<std::size_t>(std::size_t, int, int, std::int64_t)>;

/// Which rank of how many, and the trainer's sharding policy (what a loader needs to resume at
/// another world size).
struct rank_shard {
  indices_fn indices;  ///< the policy, for any world size
  int world_size = 1;  ///< ranks the data is dealt to
  int rank = 0;        ///< this rank
};

/// Pure: the sample sequence of `epoch` as dealt to `epoch_world` ranks (see the file comment).
inline std::vector<std::size_t> epoch_sequence(indices_fn const& indices, std::size_t size, int epoch_world,
                                               std::int64_t epoch) {
  std::vector<std::vector<std::size_t>> per_rank;
  per_rank.reserve(static_cast<std::size_t>(epoch_world));
  for (int r = 0; r < epoch_world; ++r) per_rank.push_back(indices(size, epoch_world, r, epoch));
  std::vector<std::size_t> out;
  std::size_t const rows = per_rank.empty() ? 0 : per_rank.front().size();
  out.reserve(rows * per_rank.size());
  for (std::size_t i = 0; i < rows; ++i)
    for (auto const& mine : per_rank) out.push_back(mine[i]);
  return out;
}

/// Pure: rank `rank` of `world`'s indices for the rest of `epoch`, whose first `seen` entries of
/// the sample sequence (dealt to `epoch_world` ranks) were trained on and whose first `end`
/// entries the epoch trains (0: all of them): entries [seen, end) dealt round-robin, every rank the
/// same count (the last entries repeat from the start of the rest when it does not divide evenly,
/// as the policies' remainder::pad does). Cost: the policy's indices for `epoch_world` ranks.
inline std::vector<std::size_t> redeal(indices_fn const& indices, std::size_t size, std::int64_t epoch, int epoch_world,
                                       std::int64_t seen, std::int64_t end, int world, int rank) {
  auto sequence = epoch_sequence(indices, size, epoch_world, epoch);
  if (end > 0 && static_cast<std::size_t>(end) < sequence.size()) sequence.resize(static_cast<std::size_t>(end));
  auto const start = std::min(sequence.size(), static_cast<std::size_t>(std::max<std::int64_t>(0, seen)));
  std::size_t const rest = sequence.size() - start;
  std::vector<std::size_t> out;
  if (rest == 0) return out;
  auto const w = static_cast<std::size_t>(world);
  std::size_t const per_rank = (rest + w - 1) / w;
  out.reserve(per_rank);
  for (std::size_t i = 0; i < per_rank; ++i) out.push_back(sequence[start + (i * w + static_cast<std::size_t>(rank)) % rest]);
  return out;
}

}  // namespace cohort::sharding
