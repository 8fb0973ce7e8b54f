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
  std::size_t prefetch_batches = 2;  ///< batches made ahead by a background thread (0: none)
  bool drop_last = true;             ///< drop the last partial batch of an epoch
};

/// A loader's position: the next batch handed out is batch `position` of epoch `epoch`. `seed` is
/// the sharding policy's seed (0 when it has none); a state restores only under the same seed.
/// Small and JSON-convertible, so a checkpoint can carry it.
struct loader_state {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::uint64_t seed = 0;
  friend bool operator==(loader_state const&, loader_state const&) = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(loader_state, epoch, position, seed)

}  // namespace cohort
