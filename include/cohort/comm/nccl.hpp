#pragma once
/// \file
/// comm::nccl: the communicator concept over NCCL, for buffers in GPU memory, bootstrapped by MPI
/// (rank 0's ncclUniqueId is broadcast over the MPI communicator it is made from). Needs the CUDA
/// runtime and NCCL (the cohort::nccl CMake target); nothing here depends on LibTorch.
///
/// Every collective is enqueued on the communicator's CUDA stream (set_stream: LibTorch's current
/// stream, in the LibTorch glue) and is ordered with the work on that stream: no host
/// synchronisation unless a call says so. Errors and hangs: a request's wait() polls
/// ncclCommGetAsyncError and gives up after `timeout_ms`, aborting the NCCL communicator and
/// throwing cohort::error with the cause and the fix, never hanging.

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi.hpp"
#include "cohort/error.hpp"

namespace cohort::comm {

/// Knobs of an NCCL communicator.
struct nccl_options {
  /// How long wait()/barrier() let a collective run before the communicator is aborted and the
  /// call throws (a peer that died or diverged would otherwise hang every rank). prepare_model
  /// sets run_config::collective_timeout_ms. 0: no deadline.
  int timeout_ms = 600'000;
};

namespace detail {

inline void check_cuda(cudaError_t code, char const* what) {
  if (code == cudaSuccess) return;
  throw cohort::error(std::string("CUDA call ") + what + " failed: " + cudaGetErrorString(code));
}

inline void check_nccl(ncclResult_t code, char const* what) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  throw cohort::error(std::string("NCCL call ") + what + " failed: " + ncclGetErrorString(code) +
                      (code == ncclSystemError || code == ncclRemoteError
                           ? ": a peer rank may have died or its network failed; check every rank's log"
                           : ""));
}

template <class T>
ncclDataType_t nccl_type() {
  static_assert(reducible<T>, "nccl_type: not one of COHORT_REDUCIBLE_TYPES");
  if constexpr (std::same_as<T, float>) return ncclFloat32;
  else if constexpr (std::same_as<T, double>) return ncclFloat64;
  else if constexpr (std::same_as<T, bfloat16>) return ncclBfloat16;
  else if constexpr (std::same_as<T, float16>) return ncclFloat16;
  else if constexpr (std::same_as<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::same_as<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::same_as<T, std::uint8_t>) return ncclUint8;
  else {
    static_assert(std::same_as<T, std::uint64_t>, "nccl_type: a type of COHORT_REDUCIBLE_TYPES without its NCCL type");
    return ncclUint64;
  }
}

inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::avg: return ncclAvg;
    default: return ncclSum;
  }
}

/// The NCCL communicator and its CUDA stream, shared by a comm::nccl and its requests. A watchdog
/// thread may abort it while another thread enqueues: `comm` is atomic, and `use` is held by every
/// call that passes the handle to NCCL and by abort(), so the handle is never freed under a call
/// (NCCL allows one thread at a time per communicator).
struct nccl_state {
  std::atomic<ncclComm_t> comm{nullptr};
  std::recursive_timed_mutex use;
  cudaStream_t stream = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  nccl_options options{};

  ~nccl_state() {
    if (ncclComm_t c = comm.load()) ncclCommDestroy(c);  // an aborted one is null
  }

  /// Waits for `event` (recorded after a collective) polling the communicator's asynchronous
  /// error; aborts and throws on an error or after options.timeout_ms. Polls in a busy loop
  /// first, then every `poll` (a zero `poll`: every 50 us after 1000 busy polls).
  void wait_for(cudaEvent_t event, char const* what, std::chrono::microseconds poll = {}) {
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
    for (int spins = 0;; ++spins) {
      cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(live(), &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort(std::string("NCCL ") + what + ": " + ncclGetErrorString(async));
        check_nccl(async, what);
      }
      if (options.timeout_ms > 0 && std::chrono::steady_clock::now() > deadline) {
        std::string const message =
            std::string("NCCL ") + what + " did not complete within " + std::to_string(options.timeout_ms) + " ms" +
            position_suffix(detail::position()()) +
            ": another rank is stopped, dead, unreachable or on another code path (check every rank's log), or the "
            "step is slower than the deadline (raise run_config.collective_timeout_ms): the NCCL communicator was aborted";
        abort(message);
        throw cohort::error(message);
      }
      if (poll.count() > 0) std::this_thread::sleep_for(poll);
      else if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  /// The communicator; throws once it was aborted, naming why (a call on another thread may be
  /// the first to hear of it: the training thread, after the watchdog's abort).
  ncclComm_t live() const {
    ncclComm_t c = comm.load();
    if (!c) {
      std::lock_guard lock(reason_mutex);
      throw cohort::error("this NCCL communicator was aborted (" + (reason.empty() ? std::string("an earlier error or timeout") : reason) +
                          "): stop the run (every rank saw the error) and restart it from its checkpoint");
    }
    return c;
  }

  /// Calls `f` with the communicator while holding `use` (so abort() cannot free it meanwhile)
  /// and checks its result.
  template <class F>
  void call(F&& f, char const* what) {
    std::lock_guard lock(use);
    check_nccl(f(live()), what);
  }

  /// Aborts the communicator (once, whichever thread gets here first): its kernels in flight
  /// return, and later calls throw. Waits up to 10 s for a call in progress on another thread;
  /// one stuck inside NCCL longer than that is what ncclCommAbort exists to release.
  void abort(std::string const& why = {}) {
    {
      std::lock_guard lock(reason_mutex);  // before the handle goes: a call that finds it gone finds the reason
      if (reason.empty()) reason = why;
    }
    std::unique_lock lock(use, std::chrono::seconds(10));
    if (ncclComm_t c = comm.exchange(nullptr)) ncclCommAbort(c);
  }
  mutable std::mutex reason_mutex;
  std::string reason;  ///< why it was aborted (the first reason given)
};

}  // namespace detail

/// An NCCL collective in flight: an event recorded on the stream after it. wait() blocks the
/// host until it completed (with the timeout and error polling above); test() does not block.
class nccl_request {
 public:
  nccl_request() = default;
  nccl_request(std::shared_ptr<detail::nccl_state> state, cudaEvent_t event, char const* what)
      : state_(std::move(state)), event_(event), what_(what) {}
  nccl_request(nccl_request&& o) noexcept
      : state_(std::move(o.state_)), event_(std::exchange(o.event_, nullptr)), what_(o.what_) {}
  nccl_request& operator=(nccl_request&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::move(o.state_);
      event_ = std::exchange(o.event_, nullptr);
      what_ = o.what_;
    }
    return *this;
  }
  nccl_request(nccl_request const&) = delete;
  nccl_request& operator=(nccl_request const&) = delete;
  ~nccl_request() { release(); }

  /// Blocks until the collective completed on the device (or throws, see nccl_options::timeout_ms);
  /// a non-zero `poll` checks every `poll` without busy polling (a watchdog thread's way).
  void wait(std::chrono::microseconds poll = {}) {
    if (event_) state_->wait_for(event_, what_, poll);
  }
  /// True once the collective has completed on the device.
  bool test() { return !event_ || cudaEventQuery(event_) == cudaSuccess; }
  /// The CUDA event recorded after the collective (null for a default-constructed request):
  /// another stream may wait on it (cudaStreamWaitEvent) while the request lives.
  cudaEvent_t event() const { return event_; }

 private:
  void release() noexcept {
    if (event_) cudaEventDestroy(event_);
    event_ = nullptr;
  }
  std::shared_ptr<detail::nccl_state> state_;
  cudaEvent_t event_ = nullptr;
  char const* what_ = "collective";
};

/// The communicator concept over NCCL, for device buffers. Made from an MPI communicator
/// (collective over it): one NCCL communicator per cohort communicator, split ones included.
/// Move-only.
class nccl {
 public:
  /// Creates the NCCL communicator of the ranks of `bootstrap` on CUDA device `device`: rank 0
  /// creates the unique id, one broadcast over MPI shares it, every rank calls ncclCommInitRank.
  /// The MPI communicator is duplicated and kept for split(). Throws cohort::error on failure.
  nccl(mpi const& bootstrap, int device, nccl_options options = {}) : state_(std::make_shared<detail::nccl_state>()) {
    mpi_ = std::make_unique<mpi>(bootstrap.split(0, bootstrap.rank()));  // a duplicate, with the bootstrap's deadline
    state_->rank = mpi_->rank();
    state_->size = mpi_->size();
    state_->device = device;
    state_->options = options;
    detail::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    if (state_->rank == 0) detail::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    mpi_->broadcast(reinterpret_cast<std::byte*>(&id), sizeof id, 0);
    ncclComm_t made = nullptr;
    detail::check_nccl(ncclCommInitRank(&made, state_->size, id, state_->rank), "ncclCommInitRank");
    state_->comm = made;
  }

  int rank() const { return state_->rank; }
  int size() const { return state_->size; }
  /// The CUDA device the communicator runs on.
  int device() const { return state_->device; }
  /// The stream collectives are enqueued on (nullptr: the legacy default stream).
  cudaStream_t stream() const { return state_->stream; }
  /// Enqueue later collectives on `s` (the LibTorch glue passes the current CUDA stream).
  void set_stream(cudaStream_t s) { state_->stream = s; }
  /// The NCCL handle, for code that calls NCCL directly.
  ncclComm_t native() const { return state_->comm.load(); }

  /// In-place element-wise reduction of a device buffer, enqueued on stream(); ordered with the
  /// stream's other work, no host synchronisation. Cost: one ncclAllReduce.
  template <reducible T>
  void allreduce(T* data, std::size_t count, reduce_op op) {
    if (op == reduce_op::avg && !detail::averageable<T>) detail::avg_needs_floating();
    state_->call([&](ncclComm_t c) { return ncclAllReduce(data, data, count, detail::nccl_type<T>(), detail::nccl_op(op), c, state_->stream); },
                 "ncclAllReduce");
  }

  /// allreduce, plus an event to wait on or test.
  template <reducible T>
  nccl_request iallreduce(T* data, std::size_t count, reduce_op op) {
    allreduce(data, count, op);
    return record("all-reduce");
  }

  /// `bytes` of the device buffer from `root` to every rank (ncclBroadcast, in place).
  void broadcast(std::byte* data, std::size_t bytes, int root) {
    state_->call([&](ncclComm_t c) { return ncclBroadcast(data, data, bytes, ncclUint8, root, c, state_->stream); }, "ncclBroadcast");
  }

  /// `bytes` from each rank's device buffer `send` into `recv` (size() * bytes), in rank order.
  void allgather(std::byte const* send, std::size_t bytes, std::byte* recv) {
    state_->call([&](ncclComm_t c) { return ncclAllGather(send, recv, bytes, ncclUint8, c, state_->stream); }, "ncclAllGather");
  }

  /// Returns once every rank has reached it and the stream's work before it has completed
  /// (a one-element all-reduce, then a host wait with the timeout).
  void barrier() {
    if (!scratch_) {
      void* p = nullptr;
      detail::check_cuda(cudaMalloc(&p, sizeof(std::int32_t)), "cudaMalloc");
      scratch_.reset(p);
    }
    allreduce(static_cast<std::int32_t*>(scratch_.get()), 1, reduce_op::sum);
    record("barrier").wait();
  }

  /// A request for everything enqueued on stream() so far (an event recorded there): what a
  /// caller waits on, or makes another stream wait on, after several collectives.
  nccl_request record(char const* what) {
    cudaEvent_t event = nullptr;
    detail::check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    if (auto rc = cudaEventRecord(event, state_->stream); rc != cudaSuccess) {
      cudaEventDestroy(event);
      detail::check_cuda(rc, "cudaEventRecord");
    }
    return nccl_request(state_, event, what);
  }

  /// The NCCL communicator of the ranks with the same `color`, ordered by `key` (collective over
  /// this communicator's MPI twin), on the same device, with the same options.
  nccl split(int color, int key) const {
    auto sub = mpi_->split(color, key);
    return nccl(sub, state_->device, state_->options);
  }

  /// Groups the collectives enqueued in its lifetime into one NCCL launch (ncclGroupStart/End):
  /// several buckets' all-reduces at once. Every rank must group the same collectives. Ending a
  /// group while an exception unwinds ignores NCCL's result (the exception in flight says more).
  struct group {
    group() { detail::check_nccl(ncclGroupStart(), "ncclGroupStart"); }
    group(group const&) = delete;
    group& operator=(group const&) = delete;
    ~group() noexcept(false) {
      auto const rc = ncclGroupEnd();
      if (std::uncaught_exceptions() == unwinding_) detail::check_nccl(rc, "ncclGroupEnd");
    }

   private:
    int unwinding_ = std::uncaught_exceptions();
  };

  nccl(nccl&& o) noexcept = default;
  nccl& operator=(nccl&& o) noexcept = default;
  nccl(nccl const&) = delete;
  nccl& operator=(nccl const&) = delete;
  ~nccl() = default;

 private:
  struct cuda_free {
    void operator()(void* p) const noexcept { cudaFree(p); }
  };

  std::shared_ptr<detail::nccl_state> state_;
  std::unique_ptr<mpi> mpi_;
  std::unique_ptr<void, cuda_free> scratch_;
};

static_assert(communicator<nccl>);
static_assert(request<nccl_request>);

}  // namespace cohort::comm
