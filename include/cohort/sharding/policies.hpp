#pragma once
/// \file
/// Sharding policies: pure functions from (dataset size, world size, rank, epoch) to the sample
/// indices one rank sees in one epoch. Invariant across ranks: every rank gets the same number
/// of indices each epoch (unequal counts would hang collectives).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace cohort::sharding {

/// What happens to the `size % world` samples that do not divide evenly.
enum class remainder {
  pad,   ///< repeat samples from the start so every rank has ceil(size / world) (DistributedSampler)
  drop,  ///< drop them so every rank has floor(size / world)
};

namespace detail {

/// How `deal` gives each rank its part of an order.
enum class dealing {
  blocks,       ///< rank r takes the r-th contiguous block
  round_robin,  ///< rank r takes entries r, r + world, r + 2 world, ...
};

/// Pure: rank's part of `order` among `world` ranks, `per_rank` entries, padded by wrapping
/// around `order`.
inline std::vector<std::size_t> deal(std::vector<std::size_t> const& order, std::size_t per_rank, int rank, int world,
                                     dealing how) {
  std::vector<std::size_t> out;
  out.reserve(per_rank);
  for (std::size_t i = 0; i < per_rank; ++i) {
    std::size_t pos = how == dealing::round_robin ? i * static_cast<std::size_t>(world) + static_cast<std::size_t>(rank)
                                                  : static_cast<std::size_t>(rank) * per_rank + i;
    if (!order.empty()) out.push_back(order[pos % order.size()]);
  }
  return out;
}

inline std::vector<std::size_t> identity(std::size_t size) {
  std::vector<std::size_t> order(size);
  std::iota(order.begin(), order.end(), std::size_t{0});
  return order;
}

/// Pure: a permutation of [0, size) drawn from (seed, epoch), the same on every platform:
/// Fisher-Yates with its own index draw over std::mt19937_64 (std::shuffle's use of the engine is
/// implementation-defined).
inline std::vector<std::size_t> permutation(std::size_t size, std::uint64_t seed, std::int64_t epoch) {
  auto order = identity(size);
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = size; i > 1; --i) std::swap(order[i - 1], order[gen() % i]);
  return order;
}

inline std::size_t per_rank_count(std::size_t size, int world, remainder r) {
  auto w = static_cast<std::size_t>(world);
  return r == remainder::pad ? (size + w - 1) / w : size / w;
}

}  // namespace detail

/// Each rank gets one contiguous block of indices, the same blocks every epoch.
struct contiguous {
  remainder on_remainder = remainder::pad;

  std::vector<std::size_t> indices(std::size_t size, int world, int rank, std::int64_t /*epoch*/) const {
    return detail::deal(detail::identity(size), detail::per_rank_count(size, world, on_remainder), rank, world,
                        detail::dealing::blocks);
  }
};

/// Rank r gets indices r, r + world, r + 2 world, ... (torch's DistributedSampler with
/// shuffle=False), the same every epoch.
struct interleaved {
  remainder on_remainder = remainder::pad;

  std::vector<std::size_t> indices(std::size_t size, int world, int rank, std::int64_t /*epoch*/) const {
    return detail::deal(detail::identity(size), detail::per_rank_count(size, world, on_remainder), rank, world,
                        detail::dealing::round_robin);
  }
};

/// One permutation per epoch, drawn from (seed, epoch) and identical on every rank, then dealt
/// out round-robin (as torch's DistributedSampler does with shuffle=True).
struct shuffled {
  std::uint64_t seed = 0;
  remainder on_remainder = remainder::pad;

  std::vector<std::size_t> indices(std::size_t size, int world, int rank, std::int64_t epoch) const {
    return detail::deal(detail::permutation(size, seed, epoch), detail::per_rank_count(size, world, on_remainder), rank, world, detail::dealing::round_robin);
  }
};

}  // namespace cohort::sharding

namespace cohort {

/// Sharding: the sample indices of one rank in one epoch, a pure function of
/// (dataset size, world size, rank, epoch).
template <class P>
concept sharding_policy = std::copyable<P> && requires(P const& p, std::size_t n, int w, std::int64_t e) {
  { p.indices(n, w, w, e) } -> std::same_as<std::vector<std::size_t>>;
};

static_assert(sharding_policy<sharding::contiguous>);
static_assert(sharding_policy<sharding::interleaved>);
static_assert(sharding_policy<sharding::shuffled>);

}  // namespace cohort
