#pragma once
/// \file
/// Knobs of prepare_model (no LibTorch needed to name them). All but `compression` leave results unchanged.

#include <cstddef>

namespace cohort {

/// Where gradient buckets are all-reduced.
enum class reduce_on {
  automatic,             ///< a thread when each local rank has at least 2 cores, or across hosts on a slow link (thread_for_link)
  communication_thread,  ///< a thread per prepared model: all-reduces overlap the rest of backward
  training_thread,       ///< the training thread, every bucket in order at the end of backward (blocking)
};

/// What gradients travel as in the all-reduce (PyTorch DDP's communication hooks).
enum class gradient_compression {
  none,      ///< as they are (float32 or float64)
  bfloat16,  ///< float32 buckets rounded to bfloat16 (half the bytes), averaged, widened back (DDP's bf16_compress_hook)
  float16,   ///< float32 buckets rounded to float16 (half the bytes), averaged, widened back (DDP's fp16_compress_hook)
};

/// Knobs of `ctx.prepare_model(model, {...})`.
struct model_options {
  /// A gradient bucket closes once it holds this many bytes (its last tensor may take it past);
  /// each bucket is one all-reduce. 25 MiB, PyTorch DDP's default.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// Cap of the first bucket (the last layers' gradients, ready first), small so that
  /// communication starts early in backward. 1 MiB, DDP's kDefaultFirstBucketBytes.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  /// Where buckets are reduced. `automatic` chose best in bench/gradient_sync on a 2-core host
  /// with 2 ranks (docs/benchmarks.md): there the thread competes with backward for the cores and
  /// MPI's busy-polling, and reducing on the training thread was faster at every size. Across
  /// hosts it moves to the thread after the 4th synchronised backward when every rank measured
  /// its link under slow_link_threshold by then (thread_for_link), and never later.
  cohort::reduce_on reduce_on = cohort::reduce_on::automatic;
  /// Compression of float32 gradient buckets for the all-reduce (float64 buckets are sent as
  /// they are). Unlike the knobs above, it changes the result: each rank's gradient divided by
  /// the size is rounded to bfloat16 (8 significant bits) or float16 (11 significant bits, but
  /// magnitudes only from 6e-8 to 65504: smaller ones flush towards zero, larger ones become
  /// infinite), summed in float32 with a rounding per addition, and widened back.
  cohort::gradient_compression compression = cohort::gradient_compression::none;
  /// GPU only, kept for code that sets it: a deadline for the NCCL gradient path other than
  /// run_config::collective_timeout_ms, which it follows when 0 (the default).
  int timeout_ms = 0;
};

/// Pure: whether buckets are reduced on a communication thread, given the knob, the node's cores
/// and the ranks on the node. `automatic` uses one only when every local rank has a spare core.
inline bool use_communication_thread(reduce_on knob, int node_cores, int local_world_size) {
  if (knob != reduce_on::automatic) return knob == reduce_on::communication_thread;
  return node_cores >= 2 * (local_world_size > 0 ? local_world_size : 1);
}

/// The link rate each way, in bytes per second as comm::detail::link_rate measures it, under
/// which a job across hosts reduces on a communication thread even with fewer than 2 cores per
/// local rank, up to 2 local ranks per core (slow_link_threshold): each all-reduce then leaves
/// the cores idle for longer than the thread costs backward. 300 MB/s (2.4 Gbit/s): across 2
/// hosts x 2 ranks of one core, the CNN, the rate measured on the training thread was 111-124
/// MB/s on a 1 Gbit/s link and 245-253 on 2 Gbit/s, where the thread won (1.15x, 1.08x), and 402
/// or more from 3 Gbit/s up, where it lost (0.88-0.98x) (docs/benchmarks.md, "Across hosts").
inline constexpr double slow_link_bytes_per_s = 300e6;

/// Pure: the measured link rate under which `automatic` moves to a communication thread on a
/// node running `ranks_per_core` of the job's ranks per core: slow_link_bytes_per_s up to 2, and
/// (2 / ranks_per_core)^2 of it beyond. More ranks per core make the thread cost more (more
/// threads take turns on each core) and make the link read slower than it is (each transfer
/// waits for peers that get a share of a core): across 2 hosts x 4 ranks of one core, the CNN
/// read 121-133 MB/s at 1 Gbit/s and 175-233 unshaped, where the thread lost (0.81x, 0.91x), and
/// 21-23 at 200 Mbit/s, where it won (1.29x) (docs/benchmarks.md, "Across hosts").
constexpr double slow_link_threshold(double ranks_per_core) {
  double const share = ranks_per_core > 2 ? 2 / ranks_per_core : 1;
  return slow_link_bytes_per_s * share * share;
}

/// Pure: whether a reducer whose knob is `knob`, on the training thread because
/// use_communication_thread said no, moves to a communication thread, in a job across
/// `num_nodes` nodes whose links were measured at `link_bytes_per_s` each way (0: not known),
/// with `ranks_per_core` of the job's ranks per core of this node. Only `automatic` moves, and
/// only on a measured slow link between nodes (slow_link_threshold).
constexpr bool thread_for_link(reduce_on knob, int num_nodes, double link_bytes_per_s, double ranks_per_core) {
  return knob == reduce_on::automatic && num_nodes > 1 && link_bytes_per_s > 0 &&
         link_bytes_per_s < slow_link_threshold(ranks_per_core);
}

}  // namespace cohort
