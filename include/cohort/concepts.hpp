#pragma once
/// \file
/// One concept per policy axis of the trainer (scaling, sharding, checkpointing); the tuning
/// axis's (searcher, scheduler, stopper) are in tuning/concepts.hpp. Every policy cohort ships is
/// checked against its concept with a static_assert; a user's policy that breaks one is a compile
/// error naming the concept.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/checkpointing/policies.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cuda.hpp"
#include "cohort/sharding/policies.hpp"

namespace cohort {

/// Scaling: validates the communicator size, and places each rank (device, threads).
template <class P>
concept scaling_policy = std::copyable<P> && requires(P const& p, scaling::topology const& t, int n) {
  { p.check(n) } -> std::same_as<std::optional<std::string>>;
  { p.device_for(t) } -> std::same_as<device>;
  { p.intra_op_threads(t, n) } -> std::same_as<int>;
};

/// Sharding: the sample indices of one rank in one epoch, a pure function of
/// (dataset size, world size, rank, epoch).
template <class P>
concept sharding_policy = std::copyable<P> && requires(P const& p, std::size_t n, int w, std::int64_t e) {
  { p.indices(n, w, w, e) } -> std::same_as<std::vector<std::size_t>>;
};

/// Checkpointing: which of the reported checkpoints (oldest first) to keep.
template <class P>
concept checkpointing_policy = std::copyable<P> && requires(P const& p, std::span<checkpointing::record const> s) {
  { p.retain(s) } -> std::same_as<std::vector<std::size_t>>;
};

static_assert(scaling_policy<scaling::cpu>);
static_assert(scaling_policy<scaling::cuda>);
static_assert(sharding_policy<sharding::contiguous>);
static_assert(sharding_policy<sharding::interleaved>);
static_assert(sharding_policy<sharding::shuffled>);
static_assert(checkpointing_policy<checkpointing::keep_all>);
static_assert(checkpointing_policy<checkpointing::keep_last>);
static_assert(checkpointing_policy<checkpointing::keep_best>);

}  // namespace cohort
