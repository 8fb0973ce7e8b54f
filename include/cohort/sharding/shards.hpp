#pragma once
/// \file
/// The sharding policy of datasets stored as shard files (WebDataset tar shards): pure functions
/// from (samples per shard, world size, rank, epoch) to what one rank reads and in which order.
///
/// An epoch's *stream* is every shard in an order drawn from (seed, epoch), each shard's samples
/// in file order. Rank r reads the r-th of `world` equal consecutive blocks of the stream: with
/// more shards than ranks a rank reads whole shards and at most two parts of shards, with fewer a
/// shard is split between ranks, and every rank reads the same number of samples (remainder::pad
/// continues the last block from the start of the stream, remainder::drop leaves the last
/// `total % world` samples out). Each rank then passes its block through a shuffle buffer of
/// `shuffle_buffer_samples` (WebDataset's shuffle(n)), seeded by (seed, epoch, rank), so samples
/// are mixed beyond shard boundaries while the reads stay sequential.
///
/// Samples are named by their global index: the samples of shard 0 in file order, then those of
/// shard 1, and so on, in the order the shards were listed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cohort/sharding/policies.hpp"

namespace cohort::sharding {

/// Deals shard files to ranks; see the file comment. Its seed is the loader state's seed, so a
/// state restores only under the same one.
struct shards {
  std::uint64_t seed = 0;                  ///< draws the shard order and the shuffle buffer
  bool shuffle_shards = true;              ///< false: shards in the order listed, every epoch
  std::size_t shuffle_buffer_samples = 0;  ///< samples held for sample-level shuffling (0 or 1: none)
  remainder on_remainder = remainder::pad;

  /// Pure: the shards in the order `epoch` streams them (indices into `samples_per_shard`).
  std::vector<std::size_t> shard_order(std::size_t shard_count, std::int64_t epoch) const {
    return shuffle_shards ? detail::permutation(shard_count, seed, epoch) : detail::identity(shard_count);
  }

  /// Pure: rank `rank`'s block of the epoch's stream, as global sample indices in read order.
  /// Cost: a pass over the shards, and a binary search per sample of the block.
  std::vector<std::size_t> stream(std::vector<std::size_t> const& samples_per_shard, int world, int rank,
                                  std::int64_t epoch) const {
    std::vector<std::size_t> first(samples_per_shard.size() + 1, 0);  // global index of each shard's first sample
    for (std::size_t s = 0; s < samples_per_shard.size(); ++s) first[s + 1] = first[s] + samples_per_shard[s];
    std::size_t const total = first.back();
    std::size_t const per_rank = detail::per_rank_count(total, world, on_remainder);
    std::vector<std::size_t> out;
    if (total == 0 || per_rank == 0) return out;
    out.reserve(per_rank);
    auto const order = shard_order(samples_per_shard.size(), epoch);
    std::vector<std::size_t> at(order.size() + 1, 0);  // stream position of each shard of the order
    for (std::size_t k = 0; k < order.size(); ++k) at[k + 1] = at[k] + samples_per_shard[order[k]];
    std::size_t const begin = static_cast<std::size_t>(rank) * per_rank;
    for (std::size_t p = begin; p < begin + per_rank; ++p) {
      std::size_t const q = p % total;  // a padded block continues from the start of the stream
      auto const k = static_cast<std::size_t>(std::upper_bound(at.begin(), at.end(), q) - at.begin()) - 1;
      out.push_back(first[order[k]] + (q - at[k]));
    }
    return out;
  }

  /// Pure: rank `rank`'s samples in `epoch` in the order they are handed out: its stream()
  /// through the shuffle buffer. Every rank gets the same count. Satisfies what a loader needs
  /// of a policy once `samples_per_shard` is bound (see shard_indices_fn).
  std::vector<std::size_t> indices(std::vector<std::size_t> const& samples_per_shard, int world, int rank,
                                   std::int64_t epoch) const {
    auto in = stream(samples_per_shard, world, rank, epoch);
    if (shuffle_buffer_samples <= 1) return in;
    std::mt19937_64 gen((seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch)) * 0xBF58476D1CE4E5B9ull +
                        static_cast<std::uint64_t>(rank));
    std::vector<std::size_t> buffer, out;
    buffer.reserve(std::min(shuffle_buffer_samples, in.size()));
    out.reserve(in.size());
    for (auto id : in) {
      if (buffer.size() < shuffle_buffer_samples) {  // filling
        buffer.push_back(id);
        continue;
      }
      auto& slot = buffer[gen() % buffer.size()];
      out.push_back(slot);
      slot = id;
    }
    while (!buffer.empty()) {  // draining, in random order
      auto const k = gen() % buffer.size();
      out.push_back(buffer[k]);
      buffer[k] = buffer.back();
      buffer.pop_back();
    }
    return out;
  }
};

}  // namespace cohort::sharding
