#pragma once
/// \file
/// The scaling axis's concept: what cohort::trainer asks of a scaling policy. Checked with a
/// static_assert beside each policy (scaling/cpu.hpp, scaling/cuda.hpp).

#include <concepts>
#include <optional>
#include <string>

#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"

namespace cohort {

/// Scaling: validates the communicator size, and places each rank (device, threads).
template <class P>
concept scaling_policy = std::copyable<P> && requires(P const& p, scaling::topology const& t, int n) {
  { p.check(n) } -> std::same_as<std::optional<std::string>>;
  { p.device_for(t) } -> std::same_as<device>;
  { p.intra_op_threads(t, n) } -> std::same_as<int>;
};

}  // namespace cohort
