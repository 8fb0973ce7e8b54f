#pragma once
/// \file
/// scaling::cuda: one GPU per MPI rank. Gradients of CUDA tensors are all-reduced over NCCL
/// (comm::nccl, the cohort::nccl CMake target); control traffic stays on MPI.

#include <optional>
#include <string>

#if COHORT_WITH_NCCL
#include <cuda_runtime.h>
#endif

#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/policy.hpp"
#include "cohort/scaling/topology.hpp"

namespace cohort::scaling {

/// CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 without a GPU or when
/// cohort was built without the CUDA runtime (no cohort::nccl).
inline int visible_cuda_devices() {
#if COHORT_WITH_NCCL
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

/// One worker per MPI rank, on GPU `job_local_rank` of its node: the rank's index among every
/// rank of the job on the node (an index among the visible devices, so CUDA_VISIBLE_DEVICES is
/// respected). Under a tuner, trials that share a node thus get disjoint GPUs (Ray's
/// resources_per_trial={"gpu": 1}: 8 one-rank trials at once on 8 GPUs). `num_workers` and
/// `threads_per_worker` as scaling::cpu.
struct cuda {
  int num_workers = 0;
  int threads_per_worker = 0;

  /// Pure: an error message when a communicator of `comm_size` ranks cannot run this policy.
  std::optional<std::string> check(int comm_size) const {
    auto e = cpu{.num_workers = num_workers, .threads_per_worker = threads_per_worker}.check(comm_size);
    if (!e) return e;
    for (auto at = e->find("scaling::cpu"); at != std::string::npos; at = e->find("scaling::cpu", at))
      e->replace(at, 12, "scaling::cuda");  // the same rules as scaling::cpu, under this name
    return e;
  }

  /// Pure: the rank's GPU.
  device device_for(topology const& t) const { return {device_kind::cuda, t.job_local_rank}; }

  /// Pure: intra-op CPU threads, as scaling::cpu.
  int intra_op_threads(topology const& t, int node_cores) const {
    return cpu{.threads_per_worker = threads_per_worker}.intra_op_threads(t, node_cores);
  }

  /// Pure: an error when node `t.node_rank` has fewer visible GPUs than the job's ranks on it
  /// (under a tuner: trials side by side times ranks per trial).
  std::optional<std::string> placement_error(topology const& t, int visible_devices) const {
    if (visible_devices >= t.job_local_size) return std::nullopt;
    bool const trials = t.job_local_size > t.local_world_size;  // other trainers of the job share the node
    return "scaling::cuda: node " + std::to_string(t.node_rank) + " runs " + std::to_string(t.job_local_size) +
           " ranks" + (trials ? " (trials side by side, each with GPUs of its own)" : "") + " but sees " +
           std::to_string(visible_devices) + " GPU" + (visible_devices == 1 ? "" : "s") +
           (visible_devices == 0 ? " (none visible, or cohort built without cohort::nccl)" : "") +
           ": start at most one rank per GPU (mpirun -np <GPUs> or --map-by ppr:<GPUs per node>:node), "
           "check CUDA_VISIBLE_DEVICES, or use scaling::cpu";
  }
};

}  // namespace cohort::scaling

static_assert(cohort::scaling_policy<cohort::scaling::cuda>);
