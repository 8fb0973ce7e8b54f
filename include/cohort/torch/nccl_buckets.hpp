#pragma once
/// \file
/// The NCCL gradient path: nccl_buckets (each bucket's all-reduce on a side stream ordered after
/// the backward work that filled it, and a watchdog that aborts the communicator after its
/// deadline) and make_device_buckets, which prepare_model calls for a CUDA model on several ranks.
/// Without COHORT_WITH_NCCL only make_device_buckets' error remains.

#include <torch/torch.h>

#include <memory>
#include <string>

#include "cohort/comm/any.hpp"
#include "cohort/error.hpp"
#include "cohort/torch/device_buckets.hpp"

#if COHORT_WITH_NCCL
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "cohort/comm/mpi.hpp"
#include "cohort/comm/nccl.hpp"
#include "cohort/detail/thread_start.hpp"
#endif

namespace cohort::detail {

#if COHORT_WITH_NCCL
/// LibTorch's current CUDA stream on `device`, through c10's device-generic interface (no link to
/// c10_cuda, so a CPU-only LibTorch still links). LibTorch before 2.3 has no
/// Stream::native_handle: there, the legacy default stream (LibTorch's default current stream).
inline cudaStream_t current_cuda_stream(int device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  auto const s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
                     ->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  return static_cast<cudaStream_t>(s.native_handle());
#else
  (void)device;
  return nullptr;
#endif
}

/// device_buckets over NCCL: a communicator of its own (bootstrapped from the trainer's MPI
/// communicator), a non-blocking side stream ordered after the current stream by an event, and a
/// watchdog thread that waits (polling every 0.5 ms, no busy loop) for each pass's all-reduces,
/// polls ncclCommGetAsyncError, and after `timeout_ms` aborts the communicator (its kernels
/// return, so nothing waits forever) and leaves the error for the next launch() or finish().
class nccl_buckets final : public device_buckets {
 public:
  nccl_buckets(comm::mpi const& bootstrap, int device, int timeout_ms)
      : comm_(bootstrap, device, {.timeout_ms = timeout_ms}), device_(device) {
    comm::detail::check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    comm::detail::check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    comm_.set_stream(side_);
    watchdog_ = std::thread([this] { watch(); });
  }
  nccl_buckets(nccl_buckets const&) = delete;
  nccl_buckets& operator=(nccl_buckets const&) = delete;
  ~nccl_buckets() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();  // every pass waited for (or the communicator aborted): bounded
    if (!error_.empty() && !thrown_)  // the last pass failed and no backward came after it to say so
      std::fprintf(stderr, "cohort: error: gradient all-reduce failed: %s\n", error_.c_str());
    cudaStreamSynchronize(side_);  // nothing still reads the buckets, which are freed next
    cudaEventDestroy(ready_);
    cudaStreamDestroy(side_);
  }

  void launch(std::span<reduction const> batch) override {
    throw_if_failed();
    // One event marks the current stream's position; the side stream waits for it. Recording it
    // again later does not change a wait already enqueued.
    comm::detail::check_cuda(cudaEventRecord(ready_, current_cuda_stream(device_)), "cudaEventRecord");
    comm::detail::check_cuda(cudaStreamWaitEvent(side_, ready_, 0), "cudaStreamWaitEvent");
    // Not grouped: which buckets complete together can differ between ranks (a parameter unused
    // on one of them), and every rank must group the same collectives.
    for (auto const& r : batch)
      with_elements(r.buffer, [&](auto* data) { comm_.allreduce(data, static_cast<std::size_t>(r.buffer.numel()), r.op); });
  }

  void finish() override {
    throw_if_failed();
    auto pass = comm_.record("gradient all-reduce");
    comm::detail::check_cuda(cudaStreamWaitEvent(current_cuda_stream(device_), pass.event(), 0), "cudaStreamWaitEvent");
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(pass));
    }
    wake_.notify_all();
  }

  int size() const override { return comm_.size(); }

 private:
  void throw_if_failed() {
    std::lock_guard lock(mutex_);
    if (error_.empty()) return;
    thrown_ = true;
    throw cohort::error("gradient all-reduce failed: " + error_);
  }

  void watch() {
    cohort::detail::begin_background_thread("cohort-nccl");
    cudaSetDevice(device_);  // else its CUDA calls would make a context on device 0
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stop_, everything waited for
      auto pass = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      std::string err;
      try {
        pass.wait(std::chrono::microseconds(500));
      } catch (std::exception const& e) {
        err = e.what();
      }
      lock.lock();
      if (!err.empty() && error_.empty()) error_ = err;
    }
  }

  comm::nccl comm_;
  int device_ = 0;
  cudaStream_t side_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<comm::nccl_request> pending_;  ///< passes the watchdog has still to see complete
  std::string error_;
  bool thrown_ = false;  ///< error_ was thrown to the training thread
  bool stop_ = false;
  std::thread watchdog_;
};
#endif

/// The device path of `prepare_model` for a CUDA module on `c.size()` ranks: NCCL over the ranks
/// of `c` (an MPI communicator), or a cohort::error saying what is missing.
inline std::unique_ptr<device_buckets> make_device_buckets([[maybe_unused]] comm::any& c, [[maybe_unused]] int device,
                                                           [[maybe_unused]] int timeout_ms) {
#if COHORT_WITH_NCCL
  auto* mpi = c.target<comm::mpi>();
  if (!mpi)
    throw cohort::error("prepare_model: averaging CUDA gradients over NCCL needs the trainer's communicator to be "
                        "comm::mpi (NCCL is bootstrapped from it): run the trainer on MPI");
  return std::make_unique<nccl_buckets>(*mpi, device, timeout_ms);
#else
  throw cohort::error("prepare_model: averaging gradients of CUDA tensors across " + std::to_string(c.size()) +
                      " ranks needs the NCCL backend, which this program was built without: link the cohort::nccl "
                      "CMake target (the CUDA toolkit and NCCL must be found), or use scaling::cpu");
#endif
}

}  // namespace cohort::detail
