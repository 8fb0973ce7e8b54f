#pragma once
/// \file
/// comm::mpi: the communicator concept over an MPI communicator, for CPU buffers. Its parts:
/// mpi_types.hpp (datatypes and operations), ring.hpp (the averaging ring), mpi_request.hpp.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi_request.hpp"
#include "cohort/comm/mpi_types.hpp"
#include "cohort/comm/ring.hpp"
#include "cohort/error.hpp"

namespace cohort::comm {

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
    if (size_ > 1) {
      auto const other = detail::ranks_on_other_node(comm_);
      right_remote_ = other[static_cast<std::size_t>((rank_ + 1) % size_)];
      left_remote_ = other[static_cast<std::size_t>((rank_ + size_ - 1) % size_)];
      across_nodes_ = std::find(other.begin(), other.end(), true) != other.end();
    }
  }
  mpi(mpi&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(std::exchange(o.owned_, false)),
        rank_(o.rank_), size_(o.size_), right_remote_(o.right_remote_), left_remote_(o.left_remote_),
        across_nodes_(o.across_nodes_), options_(o.options_),
        sequence_(o.sequence_), scratch_(std::move(o.scratch_)) {}
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(o.owned_, false);
      rank_ = o.rank_;
      size_ = o.size_;
      right_remote_ = o.right_remote_;
      left_remote_ = o.left_remote_;
      across_nodes_ = o.across_nodes_;
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
  /// Whether the ring's neighbours (rank + 1 and rank - 1) run on other nodes: their transfers
  /// then go in pieces under Open MPI's TCP eager limit (detail::remote_piece_bytes).
  bool right_on_other_node() const { return right_remote_; }
  bool left_on_other_node() const { return left_remote_; }
  /// Whether the communicator spans more than one node: the same on every rank.
  bool across_nodes() const { return across_nodes_; }
  /// The deadline and name of this communicator's collectives.
  mpi_options const& options() const { return options_; }
  void set_options(mpi_options options) { options_ = options; }

  /// In-place element-wise reduction over all ranks. Cost: one MPI_Iallreduce per 1 Gi elements;
  /// from 32 KiB per rank a ring all-reduce instead (detail::ring_allreduce) for reduce_op::avg
  /// of float and double (the division fused in) and, across nodes, for sums and averages of
  /// bfloat16 and float16 (compressed gradients; detail::ring_reduces); an average otherwise is
  /// MPI_Iallreduce and one scaling pass.
  template <reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    if constexpr (detail::averageable<T>) {
      if (detail::ring_reduces<T>(op, across_nodes_) && size_ > 1 &&
          count * sizeof(T) >= detail::ring_min_bytes_per_rank * static_cast<std::size_t>(size_)) {
        detail::ring_allreduce(data, count, op, comm_, rank_, size_, scratch_, next("allreduce", count * sizeof(T)),
                               options_.timeout_ms, ring_pieces<T>());
        return;
      }
    }
    if (op == reduce_op::avg) {
      if constexpr (!detail::averageable<T>) {
        detail::avg_needs_floating();
      } else {
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
  template <class T>
  detail::ring_pieces ring_pieces() const {
    return {detail::piece_elements(right_remote_, sizeof(T)), detail::piece_elements(left_remote_, sizeof(T))};
  }
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
  bool right_remote_ = false;  ///< rank + 1 runs on another node (detail::ranks_on_other_node)
  bool left_remote_ = false;   ///< rank - 1 runs on another node
  bool across_nodes_ = false;  ///< some rank runs on another node: then every rank has one
  mpi_options options_{};
  mutable std::uint64_t sequence_ = 0;  ///< collectives started on this communicator (split() counts)
  std::vector<std::byte> scratch_;  ///< ring_allreduce's receive segment
};

static_assert(communicator<mpi>);
static_assert(request<mpi_request>);

}  // namespace cohort::comm
