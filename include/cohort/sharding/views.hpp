#pragma once
/// \file
/// range-v3 views: `dataset | cohort::views::shard(ctx, policy, epoch) | cohort::views::batch(n)`
/// over any random-access, sized range. Lazy: only this rank's index list is computed; elements
/// are read from the underlying range when the view is iterated, never copied up front.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <range/v3/range/access.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/view/all.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include "cohort/sharding/policies.hpp"

namespace cohort::sharding::views {

/// The adaptor made by `shard(...)`: which rank of how many, which epoch, which policy.
template <sharding_policy Policy>
struct shard_adaptor {
  int world_size = 1;
  int rank = 0;
  std::int64_t epoch = 0;
  Policy policy{};

  /// This rank's elements of `rng` in `epoch`, as a lazy random-access view.
  template <class Range>
    requires ranges::random_access_range<Range> && ranges::sized_range<Range> && ranges::viewable_range<Range>
  friend auto operator|(Range&& rng, shard_adaptor const& a) {
    auto idx = std::make_shared<std::vector<std::size_t> const>(
        a.policy.indices(static_cast<std::size_t>(ranges::size(rng)), a.world_size, a.rank, a.epoch));
    return ranges::views::iota(std::size_t{0}, idx->size()) |
           ranges::views::transform([idx, base = ranges::views::all(static_cast<Range&&>(rng))](std::size_t k) {
             return ranges::begin(base)[static_cast<std::ptrdiff_t>((*idx)[k])];
           });
  }
};

/// Shards a range for rank `rank` of `world_size` in `epoch` (no communication).
template <sharding_policy Policy>
shard_adaptor<Policy> shard(int world_size, int rank, Policy policy, std::int64_t epoch) {
  return {world_size, rank, epoch, std::move(policy)};
}

/// Shards a range for this rank of the trainer (`ctx` is a cohort::context).
template <class Context, sharding_policy Policy>
  requires requires(Context const& c) { c.world_size(); c.world_rank(); }
shard_adaptor<Policy> shard(Context const& ctx, Policy policy, std::int64_t epoch) {
  return {ctx.world_size(), ctx.world_rank(), epoch, std::move(policy)};
}

/// Groups consecutive elements into batches of `n` (the last may be shorter): range-v3's chunk.
inline auto batch(std::ptrdiff_t n) { return ranges::views::chunk(n); }

}  // namespace cohort::sharding::views

namespace cohort {
/// The short name users write: `cohort::views::shard`, `cohort::views::batch`.
namespace views = sharding::views;
}  // namespace cohort
