#pragma once
/// \file
/// comm::mpi: the communicator concept over an MPI communicator, for CPU buffers.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/error.hpp"

namespace cohort::comm {

namespace detail {

inline void check_mpi(int code, char const* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw cohort::error(std::string("MPI call ") + what + " failed: " + std::string(text, len));
}

/// The 16-bit floating types MPI has no type for (bfloat16, float16): sent as MPI_UINT16_T,
/// reduced by the user operations of mpi_op_for in float32.
template <class T>
concept half_float = std::same_as<T, bfloat16> || std::same_as<T, float16>;

template <class T>
MPI_Datatype mpi_type() {
  static_assert(reducible<T>, "mpi_type: not one of COHORT_REDUCIBLE_TYPES");
  if constexpr (std::same_as<T, float>) return MPI_FLOAT;
  else if constexpr (std::same_as<T, double>) return MPI_DOUBLE;
  else if constexpr (half_float<T>) return MPI_UINT16_T;  // reduced by the user operations of mpi_op_for
  else if constexpr (std::same_as<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::same_as<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::same_as<T, std::uint8_t>) return MPI_UINT8_T;
  else {
    static_assert(std::same_as<T, std::uint64_t>, "mpi_type: a type of COHORT_REDUCIBLE_TYPES without its MPI type");
    return MPI_UINT64_T;
  }
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

/// An MPI user operation on a half_float type: each pair added (or compared) in float32 and
/// rounded back, as NCCL reduces bfloat16 and float16.
template <half_float T, reduce_op Op>
void half_float_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  auto const* a = static_cast<T const*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    float const x = a[i].to_float(), y = b[i].to_float();
    float const r = Op == reduce_op::max ? std::max(x, y) : Op == reduce_op::min ? std::min(x, y) : x + y;
    b[i] = T::from_float(r);
  }
}

/// The MPI operation for `op` on elements of type T (created once per half_float type).
template <class T>
MPI_Op mpi_op_for(reduce_op op) {
  if constexpr (half_float<T>) {
    auto make = [](MPI_User_function* f) {
      MPI_Op o = MPI_OP_NULL;
      check_mpi(MPI_Op_create(f, 1, &o), "MPI_Op_create");
      return o;
    };
    static MPI_Op const sum = make(&half_float_reduce<T, reduce_op::sum>);
    static MPI_Op const max = make(&half_float_reduce<T, reduce_op::max>);
    static MPI_Op const min = make(&half_float_reduce<T, reduce_op::min>);
    return op == reduce_op::max ? max : op == reduce_op::min ? min : sum;
  } else {
    return mpi_op(op);
  }
}

/// `data[i] *= factor`, rounded back to T.
template <half_float T>
void scale(T* data, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) data[i] = T::from_float(data[i].to_float() * factor);
}

/// MPI counts are `int`; larger buffers go in chunks of this many elements.
inline constexpr std::size_t max_chunk = static_cast<std::size_t>(INT_MAX) / 2;

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

/// `data[i] *= s`, vectorised like accumulate.
template <class T>
void scale(T* __restrict data, std::size_t n, T s) {
  constexpr std::size_t block = 64;
  std::size_t i = 0;
  for (; i + block <= n; i += block)
    for (std::size_t j = 0; j < block; ++j) data[i + j] *= s;
  for (; i < n; ++i) data[i] *= s;
}

/// `ns` elements to `to` and `nr` elements from `from` (non-blocking, waited for with the
/// deadline of `what`), in max_chunk pieces (the peer's counts mirror these, so both sides make the
/// same number of calls).
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
    wait_all(reqs, 2, what, timeout_ms);
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
/// with MPI_Allreduce (fewer steps) and a scaling pass.
inline constexpr std::size_t ring_min_bytes_per_rank = 32 << 10;

/// Element types reduce_op::avg applies to, and the type of their scaling factor.
template <class T>
concept averageable = std::floating_point<T> || half_float<T>;
template <class T>
using scale_type = std::conditional_t<half_float<T>, float, T>;

[[noreturn]] inline void avg_needs_floating() {
  throw cohort::error("reduce_op::avg needs float, double, bfloat16 or float16 buffers: use reduce_op::sum and divide");
}

}  // namespace detail

/// A non-blocking MPI collective in flight (move-only, no heap allocation unless the buffer
/// needed more than one MPI call). wait() has the deadline of the communicator that started it.
/// Destroying an unfinished request waits for it.
class mpi_request {
 public:
  mpi_request() = default;
  /// `then` runs once, on this rank, when the collective has completed (reduce_op::avg's division).
  mpi_request(MPI_Request first, std::vector<MPI_Request> rest, std::function<void()> then = {}, collective what = {},
              int timeout_ms = 0)
      : first_(first), rest_(std::move(rest)), then_(std::move(then)), what_(what), timeout_ms_(timeout_ms) {}
  mpi_request(mpi_request&& o) noexcept
      : first_(std::exchange(o.first_, MPI_REQUEST_NULL)), rest_(std::exchange(o.rest_, {})),
        then_(std::exchange(o.then_, {})), what_(o.what_), timeout_ms_(o.timeout_ms_) {}
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      first_ = std::exchange(o.first_, MPI_REQUEST_NULL);
      rest_ = std::exchange(o.rest_, {});
      then_ = std::exchange(o.then_, {});
      what_ = o.what_;
      timeout_ms_ = o.timeout_ms_;
    }
    return *this;
  }
  mpi_request(mpi_request const&) = delete;
  mpi_request& operator=(mpi_request const&) = delete;
  ~mpi_request() { finish_quietly(); }

  /// Blocks until the collective has completed on this rank; past the deadline, ends the job
  /// with an error naming the collective (comm::timeout_message).
  void wait() {
    detail::wait_all(&first_, 1, what_, timeout_ms_);
    if (!rest_.empty()) detail::wait_all(rest_.data(), static_cast<int>(rest_.size()), what_, timeout_ms_);
    completed();
  }
  /// Drives progress; true once the collective has completed on this rank.
  bool test() {
    int done = 0;
    detail::check_mpi(MPI_Test(&first_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done && !rest_.empty())
      detail::check_mpi(MPI_Testall(static_cast<int>(rest_.size()), rest_.data(), &done, MPI_STATUSES_IGNORE),
                        "MPI_Testall");
    if (done) completed();
    return done != 0;
  }
  /// The collective, as error messages name it.
  collective const& what() const { return what_; }

 private:
  void completed() {
    if (then_) std::exchange(then_, {})();
  }
  void finish_quietly() noexcept {
    if (first_ != MPI_REQUEST_NULL) detail::wait_all(&first_, 1, what_, timeout_ms_);
    if (!rest_.empty()) detail::wait_all(rest_.data(), static_cast<int>(rest_.size()), what_, timeout_ms_);
    rest_.clear();
    then_ = {};  // the buffer may be gone: an abandoned request is not finished
  }
  MPI_Request first_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> rest_;
  std::function<void()> then_;
  collective what_{};
  int timeout_ms_ = 0;
};

/// Knobs of a comm::mpi communicator.
struct mpi_options {
  /// How long one collective may wait for the other ranks before the job is ended with a line
  /// naming it on every rank that can still print (comm::timeout_message); 0: no deadline.
  /// 10 minutes, as NCCL's watchdog in PyTorch. Trainers set run_config::collective_timeout_ms.
  int timeout_ms = 600'000;
  /// The communicator's name in messages: a string literal (it is not copied).
  char const* name = "world";
};

/// Whether a comm::mpi frees its MPI communicator when it ends.
enum class ownership {
  borrowed,  ///< someone else frees it (MPI_COMM_WORLD, a user's communicator)
  owned,     ///< MPI_Comm_free on destruction (what split() returns)
};

/// The communicator concept over an MPI communicator. `world()` views MPI_COMM_WORLD without
/// owning it; `split()` returns communicators that free themselves. Move-only. Every collective
/// is started non-blocking and waited for with the deadline of options().timeout_ms.
class mpi {
 public:
  /// MPI_COMM_WORLD (not owned). Precondition: MPI is initialised (see cohort::environment).
  static mpi world() { return mpi(MPI_COMM_WORLD, ownership::borrowed); }

  /// Wraps `comm`; frees it on destruction when `who` is ownership::owned.
  mpi(MPI_Comm comm, ownership who, mpi_options options = {})
      : comm_(comm), owned_(who == ownership::owned), options_(options) {
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  mpi(mpi&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(std::exchange(o.owned_, false)),
        rank_(o.rank_), size_(o.size_), options_(o.options_), sequence_(o.sequence_), scratch_(std::move(o.scratch_)) {}
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(o.owned_, false);
      rank_ = o.rank_;
      size_ = o.size_;
      options_ = o.options_;
      sequence_ = o.sequence_;
      scratch_ = std::move(o.scratch_);
    }
    return *this;
  }
  mpi(mpi const&) = delete;
  mpi& operator=(mpi const&) = delete;
  ~mpi() { release(); }

  /// This process's rank in the communicator.
  int rank() const { return rank_; }
  /// Number of ranks in the communicator.
  int size() const { return size_; }
  /// The MPI handle, for code that calls MPI directly.
  MPI_Comm native() const { return comm_; }
  /// The deadline and name of this communicator's collectives.
  mpi_options const& options() const { return options_; }
  void set_options(mpi_options options) { options_ = options; }

  /// In-place element-wise reduction over all ranks. Cost: one MPI_Iallreduce per 1 Gi elements;
  /// reduce_op::avg: a ring all-reduce with the division fused in (detail::ring_average) from
  /// 32 KiB per rank, else MPI_Iallreduce and one scaling pass.
  template <reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    if (op == reduce_op::avg) {
      if constexpr (!detail::averageable<T>) {
        detail::avg_needs_floating();
      } else {
        if constexpr (std::floating_point<T>) {
          if (size_ > 1 && count * sizeof(T) >= detail::ring_min_bytes_per_rank * static_cast<std::size_t>(size_)) {
            detail::ring_average(data, count, comm_, rank_, size_, scratch_, next("allreduce", count * sizeof(T)),
                                 options_.timeout_ms);
            return;
          }
        }
        allreduce(data, count, reduce_op::sum);
        detail::scale(data, count, detail::scale_type<T>(1) / static_cast<detail::scale_type<T>>(size_));
      }
      return;
    }
    auto const what = next("allreduce", count * sizeof(T));
    for (std::size_t off = 0; off < count; off += detail::max_chunk) {
      auto n = static_cast<int>(std::min(detail::max_chunk, count - off));
      MPI_Request r;
      detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + off, n, detail::mpi_type<T>(), detail::mpi_op_for<T>(op),
                                       comm_, &r),
                        "MPI_Iallreduce");
      detail::wait_all(&r, 1, what, options_.timeout_ms);
    }
  }

  /// Non-blocking in-place reduction; `data` must stay valid until the request completes.
  /// reduce_op::avg: a sum, divided by the size when wait() or test() sees it complete.
  template <reducible T>
  mpi_request iallreduce(T* data, std::size_t count, reduce_op op) {
    std::function<void()> then;
    if (op == reduce_op::avg) {
      using F = detail::scale_type<T>;
      if constexpr (!detail::averageable<T>) detail::avg_needs_floating();
      else then = [data, count, f = F(1) / static_cast<F>(size_)] { detail::scale(data, count, f); };
    }
    MPI_Request first = MPI_REQUEST_NULL;
    std::vector<MPI_Request> rest;
    for (std::size_t off = 0; off < count; off += detail::max_chunk) {
      auto n = static_cast<int>(std::min(detail::max_chunk, count - off));
      MPI_Request r;
      detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + off, n, detail::mpi_type<T>(),
                                       detail::mpi_op_for<T>(op), comm_, &r),
                        "MPI_Iallreduce");
      if (off == 0) first = r;
      else rest.push_back(r);
    }
    return mpi_request(first, std::move(rest), std::move(then), next("iallreduce", count * sizeof(T)), options_.timeout_ms);
  }

  /// Copies `bytes` bytes from `root`'s buffer into every rank's buffer.
  void broadcast(std::byte* data, std::size_t bytes, int root) {
    auto const what = next("broadcast", bytes);
    for (std::size_t off = 0; off < bytes; off += detail::max_chunk) {
      auto n = static_cast<int>(std::min(detail::max_chunk, bytes - off));
      MPI_Request r;
      detail::check_mpi(MPI_Ibcast(data + off, n, MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
      detail::wait_all(&r, 1, what, options_.timeout_ms);
    }
  }

  /// Gathers `bytes` bytes from every rank into `recv` (size() * bytes), in rank order.
  void allgather(std::byte const* send, std::size_t bytes, std::byte* recv) {
    if (bytes > detail::max_chunk) throw cohort::error("allgather of more than 1 GiB per rank is not supported");
    auto const what = next("allgather", bytes);
    MPI_Request r;
    detail::check_mpi(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                                     comm_, &r),
                      "MPI_Iallgather");
    detail::wait_all(&r, 1, what, options_.timeout_ms);
  }

  /// Blocks until every rank has entered the barrier.
  void barrier() { barrier_named("barrier"); }

  /// A new communicator holding the ranks that pass the same `color`, ordered by `key`, with this
  /// one's options. MPI_Comm_split has no non-blocking form: a barrier with the deadline first.
  mpi split(int color, int key) const {
    barrier_named("split");
    MPI_Comm out = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
    return mpi(out, ownership::owned, options_);
  }

 private:
  collective next(char const* kind, std::size_t bytes) const { return {kind, options_.name, ++sequence_, bytes}; }
  void barrier_named(char const* kind) const {
    auto const what = next(kind, 0);
    MPI_Request r;
    detail::check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    detail::wait_all(&r, 1, what, options_.timeout_ms);
  }
  void release() noexcept {
    if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
  mpi_options options_{};
  mutable std::uint64_t sequence_ = 0;  ///< collectives started on this communicator (split() counts)
  std::vector<std::byte> scratch_;  ///< ring_average's receive segment
};

static_assert(communicator<mpi>);
static_assert(request<mpi_request>);

}  // namespace cohort::comm
