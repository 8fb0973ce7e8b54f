#pragma once
/// \file
/// scaling::cpu: data parallelism over CPU ranks, gradients all-reduced over MPI.

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include "cohort/scaling/device.hpp"
#include "cohort/scaling/policy.hpp"
#include "cohort/scaling/topology.hpp"

namespace cohort::scaling {

/// One worker per MPI rank, on the CPU.
/// `num_workers`: the number of ranks the job must have (0: whatever it was launched with).
/// `min_workers`, `max_workers`: the range of ranks the job may have instead (0: no bound), for
/// elastic relaunch: `cohort-run --hostfile` relaunches on the hosts left after one is lost, and
/// the run resumes at the new world size (its data re-dealt, sharding/redeal.hpp). Use either
/// num_workers or the range.
/// `threads_per_worker`: LibTorch intra-op threads per rank (0: the cores the rank may run on / the
/// ranks of the job that share them: cores of the node / ranks on it when mpirun does not bind,
/// the rank's own cores when it binds each rank to its own; scaling/cpu_set.hpp).
struct cpu {
  int num_workers = 0;
  int min_workers = 0;
  int max_workers = 0;
  int threads_per_worker = 0;

  /// Pure: an error message when a communicator of `comm_size` ranks cannot run this policy.
  std::optional<std::string> check(int comm_size) const {
    auto ranks = [](int n) { return std::to_string(n) + " rank" + (n == 1 ? "" : "s"); };
    if (num_workers < 0 || min_workers < 0 || max_workers < 0)
      return "scaling::cpu{.num_workers = " + std::to_string(num_workers) + ", .min_workers = " + std::to_string(min_workers) +
             ", .max_workers = " + std::to_string(max_workers) +
             "} has a negative count: set rank counts, or 0 to use every rank";
    if (threads_per_worker < 0)
      return "scaling::cpu{.threads_per_worker = " + std::to_string(threads_per_worker) +
             "} is negative: set it to a thread count, or 0 for cores per local rank";
    if (num_workers != 0 && (min_workers != 0 || max_workers != 0))
      return "scaling::cpu{.num_workers = " + std::to_string(num_workers) +
             "} with .min_workers/.max_workers: set either an exact count or a range";
    if (max_workers != 0 && min_workers > max_workers)
      return "scaling::cpu{.min_workers = " + std::to_string(min_workers) + ", .max_workers = " + std::to_string(max_workers) +
             "}: the minimum is above the maximum";
    if (num_workers != 0 && num_workers != comm_size)
      return "scaling::cpu{.num_workers = " + std::to_string(num_workers) + "} but the job has " + ranks(comm_size) +
             ": launch with mpirun -np " + std::to_string(num_workers) + " or set .num_workers = " +
             std::to_string(comm_size) + " (0 uses every rank)";
    if (comm_size < min_workers)
      return "scaling::cpu{.min_workers = " + std::to_string(min_workers) + "} but the job has " + ranks(comm_size) +
             ": too few hosts are left to go on; bring hosts back (or add some) to the hostfile, or lower .min_workers";
    if (max_workers != 0 && comm_size > max_workers)
      return "scaling::cpu{.max_workers = " + std::to_string(max_workers) + "} but the job has " + ranks(comm_size) +
             ": launch with mpirun -np " + std::to_string(max_workers) + " or fewer, or raise .max_workers";
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

static_assert(cohort::scaling_policy<cohort::scaling::cpu>);
