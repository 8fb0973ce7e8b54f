#pragma once
/// \file
/// scaling::cpu: data parallelism over CPU ranks, gradients all-reduced over MPI.

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"

namespace cohort::scaling {

/// One worker per MPI rank, on the CPU.
/// `num_workers`: the number of ranks the job must have (0: whatever it was launched with).
/// `threads_per_worker`: LibTorch intra-op threads per rank (0: the cores the rank may run on / the
/// ranks of the job that share them: cores of the node / ranks on it when mpirun does not bind,
/// the rank's own cores when it binds each rank to its own; scaling/cpu_set.hpp).
struct cpu {
  int num_workers = 0;
  int threads_per_worker = 0;

  /// Pure: an error message when a communicator of `comm_size` ranks cannot run this policy.
  std::optional<std::string> check(int comm_size) const {
    if (num_workers < 0)
      return "scaling::cpu{.num_workers = " + std::to_string(num_workers) +
             "} is negative: set it to the number of ranks, or 0 to use every rank";
    if (threads_per_worker < 0)
      return "scaling::cpu{.threads_per_worker = " + std::to_string(threads_per_worker) +
             "} is negative: set it to a thread count, or 0 for cores per local rank";
    if (num_workers != 0 && num_workers != comm_size)
      return "scaling::cpu{.num_workers = " + std::to_string(num_workers) + "} but the job has " +
             std::to_string(comm_size) + " rank" + (comm_size == 1 ? "" : "s") + ": launch with mpirun -np " +
             std::to_string(num_workers) + " or set .num_workers = " + std::to_string(comm_size) +
             " (0 uses every rank)";
    return std::nullopt;
  }

  /// Pure: the device of a rank placed at `t` (always the CPU).
  device device_for(topology const&) const { return {}; }

  /// Pure: intra-op threads for a rank at `t` on a node with `node_cores` cores.
  int intra_op_threads(topology const& t, int node_cores) const {
    if (threads_per_worker > 0) return threads_per_worker;
    return std::max(1, node_cores / std::max(1, t.local_world_size));
  }
};

/// Cores on this node as seen by the process (at least 1).
inline int node_cores() {
  static int const cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));  // reads sysfs: once
  return cores;
}

}  // namespace cohort::scaling
