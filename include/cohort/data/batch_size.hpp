#pragma once
/// \file
/// Global vs per-worker batch size: global = per-worker x world size.

#include <cstdint>
#include <string>

#include "cohort/error.hpp"

namespace cohort {

/// Pure: the global batch size of `per_worker` samples on each of `world_size` ranks.
inline std::int64_t global_batch_size(std::int64_t per_worker, int world_size) { return per_worker * world_size; }

/// Pure: each rank's batch size for a `global` batch over `world_size` ranks. Throws
/// cohort::error when it does not divide evenly (the ranks would step on unequal batches).
inline std::int64_t per_worker_batch_size(std::int64_t global, int world_size) {
  if (world_size <= 0 || global <= 0 || global % world_size != 0)
    throw cohort::error("global batch size " + std::to_string(global) + " does not divide over " +
                        std::to_string(world_size) + " ranks: choose a multiple of the rank count");
  return global / world_size;
}

}  // namespace cohort
