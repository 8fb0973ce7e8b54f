#pragma once
/// \file
/// The ring all-reduce comm::mpi averages large buffers with, and across nodes sums large bfloat16
/// and float16 ones with (reduce-scatter then all-gather, an average's division fused into the last
/// reduction step), its element loops, the size from which it is used, and the pieces its
/// transfers to ranks on other nodes are cut into.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <numeric>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi_types.hpp"

namespace cohort::comm::detail {

/// `dst[i] = (dst[i] + src[i]) * scale` when `scaled`, else `dst[i] += src[i]`. Restrict
/// pointers and fixed-size blocks let GCC vectorise it at -O2 as well as -O3.
template <std::floating_point T>
void accumulate(T* __restrict dst, T const* __restrict src, std::size_t n, T scale, bool scaled) {
  constexpr std::size_t block = 64;
  std::size_t i = 0;
  if (scaled) {
    for (; i + block <= n; i += block)
      for (std::size_t j = 0; j < block; ++j) dst[i + j] = (dst[i + j] + src[i + j]) * scale;
    for (; i < n; ++i) dst[i] = (dst[i] + src[i]) * scale;
  } else {
    for (; i + block <= n; i += block)
      for (std::size_t j = 0; j < block; ++j) dst[i + j] += src[i + j];
    for (; i < n; ++i) dst[i] += src[i];
  }
}

/// The same for bfloat16 and float16: each pair added in float32 (then scaled) and rounded back
/// once, as the MPI user operation of mpi_op_for and NCCL reduce them; in blocks, like the loop
/// above, with conversions that have no branches, so that GCC vectorises it.
template <half_float T>
void accumulate(T* __restrict dst, T const* __restrict src, std::size_t n, float scale, bool scaled) {
  constexpr std::size_t block = 64;
  float const s = scaled ? scale : 1.0f;  // x * 1 is x: one loop for both
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) dst[i + j] = T::from_float((dst[i + j].to_float() + src[i + j].to_float()) * s);
  for (; i < n; ++i) dst[i] = T::from_float((dst[i].to_float() + src[i].to_float()) * s);
}

/// The most bytes of one message to or from a rank on another node (piece_elements), where the
/// nodes talk over TCP. Open MPI's TCP transport sends a message of up to its eager limit
/// (btl_tcp_eager_limit: 64 KiB with its headers) at once; a larger one waits for the receiver's
/// answer to its first fragment, and that answer queues behind whatever the receiver is sending on
/// the same connection. When both directions of a ring step share one TCP connection (which
/// connection each rank's data takes is settled at run time), each rank's answer waited behind
/// its own segment and the two directions went one after the other: across 2 hosts at 1 Gbit/s
/// the MLP's runs that took that path trained at 0.7-0.8x the others' samples/s
/// (docs/benchmarks.md, "Across hosts"). Pieces under the eager limit need no answer, so both
/// directions stream at once on any connection. A job that lowers the eager limit gets the
/// handshake back, not wrong results.
inline constexpr std::size_t remote_piece_bytes = std::size_t{63} << 10;

/// Pure: the elements of one message of a transfer between this rank and a peer, `remote` when
/// the peer is on another node (remote_piece_bytes), else as many as one MPI call takes.
constexpr std::size_t piece_elements(bool remote, std::size_t element_bytes) {
  return remote ? std::max<std::size_t>(1, remote_piece_bytes / element_bytes) : max_chunk;
}

/// Whether each world rank runs on another node than this one, set when cohort starts MPI on
/// nodes that talk over TCP (environment.hpp); empty on every rank where MPI was started by
/// someone else or a node has a fabric (RDMA moves large messages without a copy): every peer then
/// counts as on this node, and no transfer goes in pieces.
inline std::vector<bool>& world_rank_on_other_node() {
  static std::vector<bool> remote;
  return remote;
}

/// The ranks of MPI_COMM_WORLD that `ranks` of `comm` are (MPI_UNDEFINED for none). Local: a
/// group translation, no communication.
inline std::vector<int> world_ranks_of(MPI_Comm comm, std::vector<int> const& ranks) {
  std::vector<int> in_world(ranks.size(), MPI_UNDEFINED);
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  int const rc = MPI_Group_translate_ranks(group, static_cast<int>(ranks.size()), ranks.data(), world, in_world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks");
  return in_world;
}

/// For each rank of `comm`, whether it runs on another node than this one
/// (world_rank_on_other_node): one group translation, no communication.
inline std::vector<bool> ranks_on_other_node(MPI_Comm comm) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::vector<bool> other(static_cast<std::size_t>(size), false);
  auto const& remote = world_rank_on_other_node();
  if (remote.empty()) return other;
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto const in_world = world_ranks_of(comm, ranks);
  for (std::size_t r = 0; r < in_world.size(); ++r) {
    auto const w = in_world[r];
    other[r] = w >= 0 && static_cast<std::size_t>(w) < remote.size() && remote[static_cast<std::size_t>(w)];
  }
  return other;
}

/// `ns` elements to `to` in messages of `send_piece` elements and `nr` elements from `from` in
/// messages of `recv_piece` (the peers' pieces mirror these), every receive posted before the
/// first send, all waited for together with the deadline of `what`. The transfer's time feeds
/// the link's rate (note_transfer), which sets how often waits poll. `requests` is reused.
template <class T>
void sendrecv(T const* send, std::size_t ns, int to, std::size_t send_piece, T* recv, std::size_t nr, int from,
              std::size_t recv_piece, MPI_Comm comm, collective const& what, int timeout_ms,
              std::vector<MPI_Request>& requests) {
  constexpr int tag = 0x636f;  // "co": cohort's ring all-reduce
  send_piece = std::max<std::size_t>(send_piece, 1);
  recv_piece = std::max<std::size_t>(recv_piece, 1);
  requests.clear();
  auto const start = std::chrono::steady_clock::now();
  for (std::size_t off = 0; off < nr || (off == 0 && nr == 0); off += recv_piece) {
    requests.emplace_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Irecv(recv + off, static_cast<int>(std::min(recv_piece, nr - off)), mpi_type<T>(), from, tag, comm,
                        &requests.back()),
              "MPI_Irecv");
  }
  for (std::size_t off = 0; off < ns || (off == 0 && ns == 0); off += send_piece) {
    requests.emplace_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Isend(send + off, static_cast<int>(std::min(send_piece, ns - off)), mpi_type<T>(), to, tag, comm,
                        &requests.back()),
              "MPI_Isend");
  }
  wait_all(requests.data(), static_cast<int>(requests.size()), what, timeout_ms);
  note_transfer(std::max(ns, nr) * sizeof(T),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

/// The message sizes of a ring's two transfers, in elements: to the rank on the right and from
/// the rank on the left (piece_elements).
struct ring_pieces {
  std::size_t to_right = max_chunk;
  std::size_t from_left = max_chunk;
};

/// Pure: whether comm::mpi reduces `op` on T with ring_allreduce (from ring_min_bytes_per_rank):
/// the average of float and double; and the sum and average of bfloat16 and float16 (compressed
/// gradient buckets are summed) on a communicator `across_nodes`. Open MPI reduces those with a
/// user operation in its own algorithm: on one node on par with the ring or faster
/// (docs/benchmarks.md, "Gradient synchronisation"), across nodes over TCP whole messages that
/// wait for a handshake, which left compression no faster than none (docs/benchmarks.md, "Across
/// hosts").
template <class T>
constexpr bool ring_reduces(reduce_op op, bool across_nodes) {
  return (op == reduce_op::avg && std::floating_point<T>) ||
         (half_float<T> && across_nodes && (op == reduce_op::sum || op == reduce_op::avg));
}

/// In-place sum or average (`op`: reduce_op::sum or avg; ring_reduces) over `size` ranks with a
/// ring (reduce-scatter, then all-gather: each rank sends and receives 2 (size-1)/size of the
/// buffer, like NCCL's ring), an average's division fused into the last reduction step so no
/// extra pass over the buffer is made. Every rank ends with bitwise the same values, whatever the
/// pieces. `scratch` holds one segment; it only grows.
template <class T>
  requires averageable<T>
void ring_allreduce(T* data, std::size_t count, reduce_op op, MPI_Comm comm, int rank, int size,
                    std::vector<std::byte>& scratch, collective const& what, int timeout_ms, ring_pieces pieces = {}) {
  auto const n = static_cast<std::size_t>(size);
  auto begin = [&](int s) { return count / n * static_cast<std::size_t>(s) + std::min(count % n, static_cast<std::size_t>(s)); };
  auto length = [&](int s) { return begin(s + 1) - begin(s); };
  if (scratch.size() < length(0) * sizeof(T)) scratch.resize(length(0) * sizeof(T));
  T* tmp = reinterpret_cast<T*>(scratch.data());
  int const right = (rank + 1) % size, left = (rank + size - 1) % size;
  auto const factor = scale_type<T>(1) / static_cast<scale_type<T>>(size);
  bool const average = op == reduce_op::avg;
  thread_local std::vector<MPI_Request> requests;
  for (int k = 0; k + 1 < size; ++k) {
    int const out = (rank - k + size) % size, in = (rank - k - 1 + 2 * size) % size;
    sendrecv(data + begin(out), length(out), right, pieces.to_right, tmp, length(in), left, pieces.from_left, comm, what,
             timeout_ms, requests);
    accumulate(data + begin(in), tmp, length(in), factor, average && k + 2 == size);
  }
  for (int k = 0; k + 1 < size; ++k) {
    int const out = (rank + 1 - k + size) % size, in = (rank - k + size) % size;
    sendrecv(data + begin(out), length(out), right, pieces.to_right, data + begin(in), length(in), left,
             pieces.from_left, comm, what, timeout_ms, requests);
  }
}

/// Buffers of at least this many bytes per rank are reduced with ring_allreduce; smaller ones
/// with MPI_Allreduce (fewer steps) and, for an average, a scaling pass. Chosen by
/// bench_gradient_sync's ring against MPI_Allreduce table (docs/benchmarks.md, "Gradient
/// synchronisation"): at 2 ranks the ring mostly takes 1.2-1.8x the time below 8 KiB per rank, is
/// on par at 8 KiB and faster in every run from 16 KiB per rank; 32 KiB leaves one size of margin.
inline constexpr std::size_t ring_min_bytes_per_rank = 32 << 10;

}  // namespace cohort::comm::detail
