#pragma once
/// \file
/// The scaling model: an alpha-beta model of bucketed gradient all-reduce overlapped with backward,
/// projecting the step time and scaling efficiency of data-parallel training on many GPUs from a
/// step measured on one. Pure functions, no MPI, LibTorch or GPU; docs/scaling-model.md derives
/// the formulas, lists what they leave out and where each default comes from.
///
/// Units: bytes, microseconds (`_us`), and GB/s of 10^9 bytes per second.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "cohort/gradients/model_options.hpp"

namespace cohort::scaling {

/// One kind of link between GPUs, alpha-beta style: a latency per algorithm step and a bus bandwidth.
struct interconnect {
  /// Latency of one step of a ring all-reduce over this link (µs).
  double alpha_us = 0;
  /// Latency of one hop of a tree all-reduce over this link (µs). NCCL's own tuning table charges a
  /// tree hop differently from a ring step, so the two are separate.
  double tree_alpha_us = 0;
  /// Bus bandwidth per GPU, as nccl-tests reports it (`busbw`, GB/s): for an all-reduce of B bytes
  /// on n GPUs that took t seconds, busbw = 2(n-1)/n * B / t.
  double bus_bandwidth_gbytes_per_s = 1;
};

/// A cluster of identical nodes: NVLink within a node, one network port per GPU across nodes.
/// The defaults are a reference H100 cluster; see docs/scaling-model.md for sources.
struct cluster {
  /// GPUs per node (8 on an HGX/DGX H100).
  int gpus_per_node = 8;
  /// Within a node: NVLink 4 through NVSwitch. 370 GB/s is the all-reduce bus bandwidth
  /// nccl-tests reports for 8 H100s (docs/scaling-model.md); the latencies are NCCL's tuning
  /// table (src/graph/tuning.cc, LL128: ring 1.9 µs per step, tree 1.25 µs per hop).
  interconnect intra_node{.alpha_us = 1.9, .tree_alpha_us = 1.25, .bus_bandwidth_gbytes_per_s = 370};
  /// Across nodes, per GPU: 400 Gb/s InfiniBand NDR is 50 GB/s of line rate; 45 GB/s assumes NCCL
  /// reaches 90% of it. Latencies from NCCL's tuning table (network, LL128: ring 4.0, tree 8.5 µs).
  interconnect inter_node{.alpha_us = 4.0, .tree_alpha_us = 8.5, .bus_bandwidth_gbytes_per_s = 45};
  /// Fixed cost of one collective call (µs): NCCL's base latency for LL128, ring and tree alike.
  double call_latency_us = 14.0;
  /// A tree all-reduce's bus bandwidth relative to the ring's (NCCL's tuning model: 0.92).
  double tree_bandwidth_fraction = 0.92;
};

/// Pure: the nodes `gpus` GPUs occupy, nodes filled one after the other. Precondition: gpus >= 1.
constexpr int nodes_for(int gpus, cluster const& c) {
  int per_node = std::max(c.gpus_per_node, 1);
  return (gpus + per_node - 1) / per_node;
}

/// Pure: a flat ring all-reduce of `bytes` on `gpus` GPUs over one kind of link, in µs: the
/// textbook alpha-beta cost 2(n-1)/n * B / busbw + 2(n-1) * alpha (a reduce-scatter and an
/// all-gather, n-1 steps each). No call latency. One GPU: 0.
constexpr double flat_ring_allreduce_us(std::size_t bytes, int gpus, interconnect const& l) {
  if (gpus <= 1) return 0;
  double n = gpus;
  double bandwidth_us = 2 * (n - 1) / n * static_cast<double>(bytes) / (l.bus_bandwidth_gbytes_per_s * 1e3);
  return bandwidth_us + 2 * (n - 1) * l.alpha_us;
}

/// Pure: the bus bandwidth (GB/s) a ring all-reduce reaches on `gpus` GPUs of `c`. Within a node,
/// NVLink's. Across nodes, NCCL runs one ring per network rail, each carrying its share of the
/// data, and pipelines every link of the ring at once: the slowest link sets the rate, so the
/// busbw is min(NVLink busbw, network busbw per GPU * GPUs on the least-populated node).
constexpr double ring_bus_bandwidth_gbytes_per_s(int gpus, cluster const& c) {
  int nodes = nodes_for(gpus, c);
  if (nodes <= 1) return c.intra_node.bus_bandwidth_gbytes_per_s;
  int on_last_node = gpus - (nodes - 1) * c.gpus_per_node;
  return std::min(c.intra_node.bus_bandwidth_gbytes_per_s, on_last_node * c.inter_node.bus_bandwidth_gbytes_per_s);
}

/// Pure: NCCL's ring all-reduce of `bytes` on `gpus` GPUs of `c`, in µs. Bandwidth term as the
/// flat ring at the bottleneck bus bandwidth (`ring_bus_bandwidth_gbytes_per_s`); latency as NCCL's
/// tuning model: of the 2(n-1) steps, 2 * nodes cross the network (none on one node), the rest
/// NVLink, plus the call latency. One GPU: 0.
constexpr double ring_allreduce_us(std::size_t bytes, int gpus, cluster const& c) {
  if (gpus <= 1) return 0;
  double n = gpus;
  int nodes = nodes_for(gpus, c);
  int steps = 2 * (gpus - 1);
  int inter_steps = nodes > 1 ? std::min(2 * nodes, steps) : 0;
  double latency_us = c.call_latency_us + (steps - inter_steps) * c.intra_node.alpha_us + inter_steps * c.inter_node.alpha_us;
  double bandwidth_us = 2 * (n - 1) / n * static_cast<double>(bytes) / (ring_bus_bandwidth_gbytes_per_s(gpus, c) * 1e3);
  return latency_us + bandwidth_us;
}

/// Pure: ceil(log2(x)) for x >= 1: the depth of a binary tree over x nodes.
constexpr int ceil_log2(int x) {
  int depth = 0;
  while ((1 << depth) < x) ++depth;
  return depth;
}

/// Pure: NCCL's tree all-reduce (a chain within each node, a double binary tree across nodes) of
/// `bytes` on `gpus` GPUs of `c`, in µs. Latency: the call latency plus, up and down,
/// (GPUs per node - 1) NVLink hops and ceil(log2 nodes) network hops; its latency grows with the
/// logarithm of the node count where the ring's grows linearly. Bandwidth: NCCL's model,
/// 2 * B / (tree_bandwidth_fraction * ring busbw). One GPU: 0.
constexpr double tree_allreduce_us(std::size_t bytes, int gpus, cluster const& c) {
  if (gpus <= 1) return 0;
  int nodes = nodes_for(gpus, c);
  int per_node = std::min(gpus, c.gpus_per_node);
  double latency_us = c.call_latency_us +
                      2 * ((per_node - 1) * c.intra_node.tree_alpha_us + ceil_log2(nodes) * c.inter_node.tree_alpha_us);
  double bus = c.tree_bandwidth_fraction * ring_bus_bandwidth_gbytes_per_s(gpus, c);
  return latency_us + 2 * static_cast<double>(bytes) / (bus * 1e3);
}

/// Pure: one all-reduce of `bytes` on `gpus` GPUs of `c`, in µs: the faster of ring and tree, as
/// NCCL's tuner picks the algorithm with the lowest modelled time for each call. One GPU: 0.
constexpr double allreduce_us(std::size_t bytes, int gpus, cluster const& c) {
  return std::min(ring_allreduce_us(bytes, gpus, c), tree_allreduce_us(bytes, gpus, c));
}

/// Pure: the bucket sizes, in the order their all-reduces start, of a model whose gradients total
/// `total_bytes` in tensors much smaller than the caps: a first bucket of `first_bucket_cap_bytes`,
/// then full buckets of `bucket_cap_bytes`, then the rest. For a real layout (large tensors get a
/// bucket each), take the sizes of `cohort::plan_buckets` instead.
inline std::vector<std::size_t> uniform_buckets(std::size_t total_bytes, model_options const& options = {}) {
  std::vector<std::size_t> buckets;
  std::size_t first = std::min(total_bytes, std::max<std::size_t>(options.first_bucket_cap_bytes, 1));
  if (first > 0) buckets.push_back(first);
  std::size_t cap = std::max<std::size_t>(options.bucket_cap_bytes, 1);
  for (std::size_t left = total_bytes - first; left > 0;) {
    std::size_t b = std::min(left, cap);
    buckets.push_back(b);
    left -= b;
  }
  return buckets;
}

/// The calibration inputs: one GPU's training step without communication. They must be measured on
/// the GPU (docs/scaling-model.md says how); until then callers pass labelled estimates.
struct step_profile {
  /// Forward + backward + optimizer step on one GPU, no communication (µs).
  double step_us = 0;
  /// Share of `step_us` spent in backward, where gradients become ready. Precondition: with
  /// `optimizer_fraction`, at most 1; the rest is forward.
  double backward_fraction = 2.0 / 3.0;
  /// Share of `step_us` after backward: the optimizer step (and zero_grad), which waits for the
  /// averaged gradients.
  double optimizer_fraction = 0;
  /// Cost of starting one bucket's all-reduce that NCCL's call latency does not cover: the
  /// reducer's hook, event and enqueue (µs). Charged on the communication stream.
  double per_bucket_overhead_us = 0;
};

/// One projected step on some number of GPUs (all times in µs, per GPU, weak scaling).
struct step_projection {
  int gpus = 1;                           ///< data-parallel GPUs
  int nodes = 1;                          ///< nodes they occupy
  std::size_t buckets = 0;                ///< buckets in the plan: all-reduces per step (none on one GPU)
  double compute_us = 0;                  ///< the single-GPU step: the same work per GPU at any scale
  double communication_us = 0;            ///< all bucket all-reduces back to back, overheads included
  double exposed_communication_us = 0;    ///< what backward does not hide: step_us - compute_us
  double step_us = 0;                     ///< projected step time
  double efficiency = 1;                  ///< compute_us / step_us, in (0, 1]
};

/// Pure: the step time on `gpus` GPUs of `c` (weak scaling: fixed batch per GPU) of a model whose
/// gradient buckets have sizes `bucket_bytes`, in the order their all-reduces start (the order of
/// `plan_buckets`: the last layers' gradients first).
///
/// The model: forward, then backward producing gradient bytes at a constant rate, so bucket k is
/// ready when the bytes of buckets 0..k have been produced. All-reduces run one at a time on one
/// communication stream, in bucket order, each starting when its bucket is ready and the previous
/// all-reduce has finished, taking `per_bucket_overhead_us` + `allreduce_us`. The optimizer starts
/// when both backward and the last all-reduce have finished. So
///   step = max(forward + backward, end of the last all-reduce) + optimizer,
/// and the last bucket's all-reduce is always exposed, since it is ready only as backward ends.
/// One GPU: no communication (the reducer is not installed), step = `profile.step_us`.
constexpr step_projection project_step(std::span<std::size_t const> bucket_bytes, step_profile const& profile,
                                       cluster const& c, int gpus) {
  step_projection p;
  p.gpus = gpus;
  p.nodes = nodes_for(gpus, c);
  p.buckets = bucket_bytes.size();
  p.compute_us = profile.step_us;
  double backward_us = profile.backward_fraction * profile.step_us;
  double optimizer_us = profile.optimizer_fraction * profile.step_us;
  double backward_end_us = profile.step_us - optimizer_us;
  double forward_us = backward_end_us - backward_us;
  std::size_t total_bytes = 0;
  for (auto b : bucket_bytes) total_bytes += b;
  double comm_end_us = backward_end_us;
  if (gpus > 1 && total_bytes > 0) {
    std::size_t ready_bytes = 0;
    double stream_free_us = 0;
    for (auto b : bucket_bytes) {
      ready_bytes += b;
      double ready_us = forward_us + backward_us * static_cast<double>(ready_bytes) / static_cast<double>(total_bytes);
      double cost_us = profile.per_bucket_overhead_us + allreduce_us(b, gpus, c);
      stream_free_us = std::max(ready_us, stream_free_us) + cost_us;
      p.communication_us += cost_us;
    }
    comm_end_us = std::max(backward_end_us, stream_free_us);
  }
  p.exposed_communication_us = comm_end_us - backward_end_us;
  p.step_us = comm_end_us + optimizer_us;
  p.efficiency = p.step_us > 0 ? p.compute_us / p.step_us : 1;
  return p;
}

/// Pure: `project_step` at each GPU count of `gpu_counts`, in that order.
inline std::vector<step_projection> project_scaling(std::span<std::size_t const> bucket_bytes, step_profile const& profile,
                                                    cluster const& c, std::span<int const> gpu_counts) {
  std::vector<step_projection> out;
  out.reserve(gpu_counts.size());
  for (int g : gpu_counts) out.push_back(project_step(bucket_bytes, profile, c, g));
  return out;
}

/// The cluster's parameters on one line, for reports.
inline std::string to_string(cluster const& c) {
  char line[320];
  std::snprintf(line, sizeof line,
                "%d GPUs/node; NVLink busbw %.0f GB/s, alpha %.2f us (tree %.2f us); network busbw %.0f GB/s per GPU, "
                "alpha %.2f us (tree %.2f us); call latency %.1f us; tree bandwidth x%.2f",
                c.gpus_per_node, c.intra_node.bus_bandwidth_gbytes_per_s, c.intra_node.alpha_us, c.intra_node.tree_alpha_us,
                c.inter_node.bus_bandwidth_gbytes_per_s, c.inter_node.alpha_us, c.inter_node.tree_alpha_us,
                c.call_latency_us, c.tree_bandwidth_fraction);
  return line;
}

}  // namespace cohort::scaling
