#pragma once
/// \file
/// The ring all-reduce comm::mpi averages large buffers with (reduce-scatter then all-gather, the
/// division fused into the last reduction step), its vectorised element loops, and the size from
/// which it is used.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi_types.hpp"

namespace cohort::comm::detail {

/// `dst[i] = (dst[i] + src[i]) * scale` when `scaled`, else `dst[i] += src[i]`. Restrict
/// pointers and fixed-size blocks let GCC vectorise it at -O2 as well as -O3.
template <class T>
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

/// `ns` elements to `to` and `nr` elements from `from` (non-blocking, waited for with the
/// deadline of `what`), in max_chunk pieces (the peer's counts mirror these, so both sides make the
/// same number of calls). Each piece's time feeds the link's rate (note_transfer), which sets how
/// often waits poll.
template <class T>
void sendrecv(T const* send, std::size_t ns, int to, T* recv, std::size_t nr, int from, MPI_Comm comm,
              collective const& what, int timeout_ms) {
  constexpr int tag = 0x636f;  // "co": cohort's ring all-reduce
  for (std::size_t off = 0; off < std::max(ns, nr); off += max_chunk) {
    auto s = static_cast<int>(off < ns ? std::min(max_chunk, ns - off) : 0);
    auto r = static_cast<int>(off < nr ? std::min(max_chunk, nr - off) : 0);
    MPI_Request reqs[2];
    check_mpi(MPI_Irecv(recv + off, r, mpi_type<T>(), from, tag, comm, &reqs[0]), "MPI_Irecv");
    check_mpi(MPI_Isend(send + off, s, mpi_type<T>(), to, tag, comm, &reqs[1]), "MPI_Isend");
    auto const start = std::chrono::steady_clock::now();
    wait_all(reqs, 2, what, timeout_ms);
    note_transfer(static_cast<std::size_t>(std::max(s, r)) * sizeof(T),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

/// In-place average over `size` ranks with a ring (reduce-scatter, then all-gather: each rank
/// sends and receives 2 (size-1)/size of the buffer, like NCCL's ring), the division fused into
/// the last reduction step so no extra pass over the buffer is made. Every rank ends with
/// bitwise the same values. `scratch` holds one segment; it only grows.
template <class T>
void ring_average(T* data, std::size_t count, MPI_Comm comm, int rank, int size, std::vector<std::byte>& scratch,
                  collective const& what, int timeout_ms) {
  auto const n = static_cast<std::size_t>(size);
  auto begin = [&](int s) { return count / n * static_cast<std::size_t>(s) + std::min(count % n, static_cast<std::size_t>(s)); };
  auto length = [&](int s) { return begin(s + 1) - begin(s); };
  if (scratch.size() < length(0) * sizeof(T)) scratch.resize(length(0) * sizeof(T));
  T* tmp = reinterpret_cast<T*>(scratch.data());
  int const right = (rank + 1) % size, left = (rank + size - 1) % size;
  T const factor = T(1) / static_cast<T>(size);
  for (int k = 0; k + 1 < size; ++k) {
    int const out = (rank - k + size) % size, in = (rank - k - 1 + 2 * size) % size;
    sendrecv(data + begin(out), length(out), right, tmp, length(in), left, comm, what, timeout_ms);
    accumulate(data + begin(in), tmp, length(in), factor, k + 2 == size);
  }
  for (int k = 0; k + 1 < size; ++k) {
    int const out = (rank + 1 - k + size) % size, in = (rank - k + size) % size;
    sendrecv(data + begin(out), length(out), right, data + begin(in), length(in), left, comm, what, timeout_ms);
  }
}

/// Buffers of at least this many bytes per rank are averaged with ring_average; smaller ones
/// with MPI_Allreduce (fewer steps) and a scaling pass. Chosen by bench_gradient_sync's ring
/// against MPI_Allreduce table (docs/benchmarks.md, "Gradient synchronisation"): at 2 ranks the
/// ring mostly takes 1.2-1.8x the time below 8 KiB per rank, is on par at 8 KiB and faster in
/// every run from 16 KiB per rank; 32 KiB leaves one size of margin.
inline constexpr std::size_t ring_min_bytes_per_rank = 32 << 10;

}  // namespace cohort::comm::detail
