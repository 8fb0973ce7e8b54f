#pragma once
/// \file
/// prepare_model: rank-0 broadcast of a LibTorch module, a cross-rank layout check, and gradient
/// averaging during backward in size-capped buckets whose all-reduces start as soon as their last
/// gradient is ready (PyTorch DDP's reducer, over any cohort communicator).

#include <mpi.h>
#include <torch/torch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <latch>
#include <mutex>
#include <thread>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/context.hpp"
#include "cohort/detail/background_thread.hpp"
#include "cohort/error.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/torch/bucket_plan.hpp"
#include "cohort/torch/device.hpp"

#if COHORT_WITH_NCCL
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include "cohort/comm/nccl.hpp"
#endif

namespace cohort {

namespace detail {

/// One line per tensor: "name shape dtype"; compared across ranks before anything is broadcast.
inline std::vector<std::string> module_layout(torch::nn::Module const& m) {
  std::vector<std::string> out;
  auto add = [&](std::string const& kind, std::string const& name, torch::Tensor const& t) {
    std::ostringstream s;
    s << kind << " '" << name << "' " << t.sizes() << " " << t.dtype();
    out.push_back(s.str());
  };
  for (auto const& p : m.named_parameters()) add("parameter", p.key(), p.value());
  for (auto const& b : m.named_buffers()) add("buffer", b.key(), b.value());
  return out;
}

/// Pure: the first difference between rank 0's layout and another rank's, as an error message.
inline std::optional<std::string> layout_mismatch(std::vector<std::vector<std::string>> const& layouts) {
  for (std::size_t r = 1; r < layouts.size(); ++r) {
    auto const& a = layouts[0];
    auto const& b = layouts[r];
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i])
        return "model layout differs between ranks: tensor " + std::to_string(i) + " is " + a[i] + " on rank 0 but " +
               b[i] + " on rank " + std::to_string(r) + ": every rank must construct the same model";
    if (a.size() != b.size())
      return "model layout differs between ranks: rank 0 has " + std::to_string(a.size()) + " tensors, rank " +
             std::to_string(r) + " has " + std::to_string(b.size()) + ": every rank must construct the same model";
  }
  return std::nullopt;
}

inline void broadcast_tensor(comm::any& c, torch::Tensor& t) {
  auto host = t.device().is_cpu() && t.is_contiguous() ? t : t.to(torch::kCPU).contiguous();
  c.broadcast(reinterpret_cast<std::byte*>(host.data_ptr()), host.nbytes(), 0);
  if (!host.is_same(t)) t.copy_(host);
}

/// Fills `out` with a few sampled values of each tensor (first, middle, last element, as bits):
/// cheap to take, and changed by an optimizer step with any non-zero update. `out` is left empty
/// when a tensor is not a contiguous CPU float or double tensor (nothing can be told then). It
/// reuses `out`'s memory: no allocation once it has held as many values.
inline void sample_values(std::vector<torch::Tensor> const& tensors, std::vector<std::uint64_t>& out) {
  out.clear();
  for (auto const& t : tensors) {
    bool const readable = t.defined() && t.device().is_cpu() && t.is_contiguous() && t.numel() > 0 &&
                          (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble);
    if (!readable) {
      out.clear();
      return;
    }
    auto const n = t.numel();
    for (auto i : {std::int64_t{0}, n / 2, n - 1}) {
      std::uint64_t bits = 0;
      if (t.scalar_type() == torch::kFloat) {
        std::uint32_t b32 = 0;
        std::memcpy(&b32, t.data_ptr<float>() + i, sizeof b32);
        bits = b32;
      } else {
        std::memcpy(&bits, t.data_ptr<double>() + i, sizeof bits);
      }
      out.push_back(bits);
    }
  }
}

/// sample_values into a new vector.
inline std::vector<std::uint64_t> sampled_values(std::vector<torch::Tensor> const& tensors) {
  std::vector<std::uint64_t> out;
  sample_values(tensors, out);
  return out;
}

/// Holds a prepared model's next optimizer step until an async checkpoint has copied the live
/// tensors it refers to (CheckFreq's pipelined snapshot): opened once by the checkpoint writer,
/// or when the checkpoint is dropped; the end of every backward waits for the gates it holds.
class step_gate {
 public:
  /// Opens the gate (once; later calls do nothing).
  void open() {
    if (!opened_.exchange(true)) latch_.count_down();
  }
  /// Blocks until open() was called.
  void wait() { latch_.wait(); }

 private:
  std::latch latch_{1};
  std::atomic<bool> opened_{false};
};

/// One bucket's all-reduce: the buffer sent and the operation (avg; sum for a compressed bucket,
/// divided on the way in).
struct reduction {
  torch::Tensor buffer;
  comm::reduce_op op = comm::reduce_op::avg;
};

/// Calls `f` with `t`'s elements as a typed pointer (float, double, comm::bfloat16 or
/// comm::float16): what a communicator reduces.
template <class F>
void with_elements(torch::Tensor const& t, F&& f) {
  switch (t.scalar_type()) {
    case torch::kFloat: return f(t.data_ptr<float>());
    case torch::kDouble: return f(t.data_ptr<double>());
    case torch::kBFloat16: return f(static_cast<comm::bfloat16*>(t.data_ptr()));
    case torch::kHalf: return f(static_cast<comm::float16*>(t.data_ptr()));
    default:
      throw cohort::error(std::string("prepare_model: gradients of dtype ") + std::string(c10::toString(t.scalar_type())) +
                          " cannot be averaged: use float32, float64, bfloat16 or float16 parameters");
  }
}

/// A reducer's buckets on a GPU (the NCCL gradient path): each all-reduce is enqueued on a side
/// stream behind the backward work that filled its bucket, and the end of backward makes the
/// current stream wait for them. No host synchronisation in the step.
class device_buckets {
 public:
  virtual ~device_buckets() = default;
  /// Enqueues the all-reduces of `batch` (in bucket order) after the work enqueued so far on the
  /// current stream. Throws an error an earlier pass ran into.
  virtual void launch(std::span<reduction const> batch) = 0;
  /// The end of backward: the current stream waits for every all-reduce launched (an optimizer
  /// step enqueued next sees averaged gradients). Throws an error an earlier pass ran into.
  virtual void finish() = 0;
  /// Ranks taking part.
  virtual int size() const = 0;
};

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

/// Averages gradients over a communicator during backward, as PyTorch DDP's reducer does with
/// gradient_as_bucket_view: each parameter's .grad aliases its slot in a flat bucket buffer, so
/// autograd accumulates straight into the bucket and nothing is copied on the way in or out.
/// A hook after each parameter's gradient accumulation marks it ready; once all of a bucket's
/// gradients are ready its all-reduce is handed to the reducer's communication thread (non-blocking
/// for the training thread; MPI's blocking all-reduce is its fastest algorithm, and a thread of its
/// own overlaps it with the rest of backward; see use_communication_thread for when it is used,
/// otherwise the buckets are reduced on the training thread, in order, once backward is done); an
/// engine callback at the end of backward awaits the buckets. Each bucket is averaged by one all-reduce
/// (reduce_op::avg, the division fused in; with compression a sum of values divided on the way in).
/// On a GPU (`device`, the NCCL gradient path) complete buckets are enqueued at once on a side
/// stream instead (device_buckets): no thread, no host synchronisation.
/// MPI is called from one thread at a time (MPI_THREAD_SERIALIZED): the training thread makes no
/// MPI call between the first hook of a backward pass and the end of that pass. When MPI was
/// initialised below MPI_THREAD_SERIALIZED, buckets are reduced on the training thread instead.
/// Invariant across ranks: buckets are planned identically (same layout, checked) and their
/// all-reduces are started in bucket order, whatever order the gradients become ready in, so
/// every rank enters the same collectives in the same order.
class gradient_reducer {
 public:
  /// `steps`: the ranks' agreement on control flow, started at the first hook of each
  /// synchronised backward and awaited before its first all-reduce (null: none).
  gradient_reducer(comm::any& c, std::vector<torch::Tensor> params, model_options const& options, bool use_thread,
                   std::unique_ptr<device_buckets> device = nullptr, lockstep* steps = nullptr)
      : comm_(c), params_(std::move(params)), steps_(steps), device_(std::move(device)) {
    torch::NoGradGuard no_grad;
    std::vector<tensor_spec> specs;
    for (auto const& p : params_) specs.push_back({p.nbytes(), static_cast<int>(p.scalar_type())});
    auto plan = plan_buckets(specs, options);
    slot_of_.resize(params_.size());
    aliases_.resize(params_.size());
    for (std::size_t b = 0; b < plan.size(); ++b) {
      bucket bk;
      std::int64_t numel = 0;
      for (auto i : plan[b].tensors) {
        slot_of_[i] = b;
        numel += params_[i].numel();
      }
      auto const& first = params_[plan[b].tensors.front()];
      auto st = first.scalar_type();
      bool const half = st == torch::kBFloat16 || st == torch::kHalf;
      if (st != torch::kFloat && st != torch::kDouble && !(device_ && half))
        throw cohort::error(std::string("prepare_model: gradients of dtype ") + std::string(c10::toString(st)) +
                            (device_ ? " are not supported by NCCL: use float32, float64, bfloat16 or float16 parameters"
                                     : " are not supported by the MPI backend: use float32 or float64 parameters"));
      bk.params = plan[b].tensors;
      bk.flat = torch::zeros({numel}, first.options().requires_grad(false));
      if (options.compression != gradient_compression::none && st == torch::kFloat)
        bk.packed = torch::empty({numel}, bk.flat.options().dtype(
                                              options.compression == gradient_compression::bfloat16 ? torch::kBFloat16 : torch::kHalf));
      std::int64_t offset = 0;
      for (auto i : plan[b].tensors) {
        // set_ (not narrow): a plain tensor sharing the bucket's storage, so that optimizers may
        // detach_() it as they do any .grad (a view would refuse).
        aliases_[i] = torch::empty({0}, bk.flat.options()).set_(bk.flat.storage(), offset, params_[i].sizes());
        offset += params_[i].numel();
      }
      buckets_.push_back(std::move(bk));
    }
    done_.assign(buckets_.size(), 0);
    int const ranks = device_ ? device_->size() : comm_.size();
    inv_size_f_ = 1.0f / static_cast<float>(ranks);
    inv_size_ = torch::scalar_tensor(inv_size_f_, torch::kFloat);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (!device_ && level >= MPI_THREAD_SERIALIZED && use_thread) worker_ = std::thread([this] { work(); });
    for (std::size_t i = 0; i < params_.size(); ++i) {
      bind(i);
      auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
      hook_keys_.push_back(acc->add_post_hook(std::make_unique<ready_hook>(this, i)));
      accumulators_.push_back(std::move(acc));
    }
    seen_.assign(params_.size(), false);
  }
  gradient_reducer(gradient_reducer const&) = delete;
  gradient_reducer& operator=(gradient_reducer const&) = delete;
  ~gradient_reducer() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
    if (worker_.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stop_ = true;
      }
      wake_.notify_all();
      worker_.join();
    }
  }

  std::size_t num_buckets() const { return buckets_.size(); }
  bool sync_enabled = true;  ///< false inside no_sync(): gradients accumulate locally

  /// The parameters whose gradients are averaged (those that require grad).
  std::vector<torch::Tensor> const& params() const { return params_; }

  /// Whether the parameters changed (an optimizer step) since the end of the last synchronised
  /// backward: their version counters or their sampled values differ (LibTorch's SGD updates
  /// `p.data()`, which leaves the version counter alone). False before the first backward, and
  /// when nothing can be told.
  bool stepped_since_backward() const {
    if (backward_versions_ < 0) return false;
    if (version_sum() != backward_versions_) return true;
    auto const now = sampled_values(params_);
    return !now.empty() && !backward_values_.empty() && now != backward_values_;
  }

  /// The end of every later synchronised backward waits until `gate` is open (before the
  /// optimizer step that follows it). Training thread.
  void hold_step_until(std::shared_ptr<step_gate> gate) {
    std::lock_guard lock(mutex_);
    gates_.push_back(std::move(gate));
  }

 private:
  struct bucket {
    std::vector<std::size_t> params;
    torch::Tensor flat;
    torch::Tensor packed;  ///< the bfloat16 or float16 copy sent instead (compression), else undefined
    std::size_t pending = 0;
    /// What its all-reduce sends: the packed copy (summed: divided on the way in) or the bucket.
    reduction sent() const { return packed.defined() ? reduction{packed, comm::reduce_op::sum} : reduction{flat}; }
  };

  /// Runs after autograd has accumulated a parameter's gradient.
  struct ready_hook final : torch::autograd::FunctionPostHook {
    ready_hook(gradient_reducer* r, std::size_t i) : reducer(r), index(i) {}
    torch::autograd::variable_list operator()(torch::autograd::variable_list const& outputs,
                                              torch::autograd::variable_list const&) override {
      reducer->on_ready(index);
      return outputs;
    }
    gradient_reducer* reducer;
    std::size_t index;
  };

  bool bound(std::size_t i) const {
    auto const& g = params_[i].grad();
    return g.defined() && g.data_ptr() == aliases_[i].data_ptr();
  }

  /// Makes .grad the bucket slot again, keeping its value (zero when there is none), after
  /// zero_grad(set_to_none) or anything else replaced it. One copy, only in that case.
  void bind(std::size_t i) {
    if (bound(i)) return;
    auto& g = params_[i].mutable_grad();
    if (g.defined()) aliases_[i].copy_(g);
    else aliases_[i].zero_();
    g = aliases_[i];
  }

  void on_ready(std::size_t i) {
    if (!sync_enabled) return;
    if (!in_pass_) begin_pass();
    torch::NoGradGuard no_grad;
    bind(i);
    seen_[i] = true;
    try {
      if (--buckets_[slot_of_[i]].pending == 0) launch_ready();
    } catch (...) {
      in_pass_ = false;  // backward fails; its end-of-pass callback will not run
      throw;
    }
  }

  void begin_pass() {
    if (steps_) steps_->start(step::backward);  // awaited before the first all-reduce (launch_ready)
    in_pass_ = true;
    next_ = 0;
    std::fill(seen_.begin(), seen_.end(), false);
    for (auto& b : buckets_) b.pending = b.params.size();
    {
      std::lock_guard lock(mutex_);
      std::fill(done_.begin(), done_.end(), 0);
    }
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_pass(); });
  }

  /// Starts the all-reduces of the complete buckets, in bucket order. Without a communication
  /// thread, nothing is started before the end of backward (`at_end`): a blocking all-reduce on
  /// the training thread overlaps nothing, and one mid-backward makes each rank wait for the
  /// other's backward there as well as at the end (bench_train_step: the CNN step 3.8% slower
  /// than a hand-written loop on average over 7 runs, 2.2% faster over 8 deferred ones).
  void launch_ready(bool at_end = false) {
    if (!device_ && !worker_.joinable() && !at_end) return;
    // Every rank is at this backward (else diverged is thrown): its all-reduces may start.
    if (steps_ && steps_->pending()) steps_->finish();
    if (device_) return launch_on_device();
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      auto b = next_++;
      // The last bucket has nothing left to overlap with: once the thread has finished the
      // earlier ones (collective order), reduce it here and save the hand-off.
      if (!worker_.joinable() || b + 1 == buckets_.size()) {
        if (worker_.joinable()) {
          std::unique_lock lock(mutex_);
          wake_.wait(lock, [&] { return queue_.empty() && !busy_; });
        }
        reduce(b);
        std::lock_guard lock(mutex_);
        done_[b] = 1;
        continue;
      }
      {
        std::lock_guard lock(mutex_);
        queue_.push_back(b);
      }
      wake_.notify_all();
    }
  }

  /// The complete buckets, in bucket order, enqueued on the GPU in one batch.
  void launch_on_device() {
    batch_.clear();
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      auto& bk = buckets_[next_];
      if (bk.packed.defined()) pack(bk);
      batch_.push_back(bk.sent());
      std::lock_guard lock(mutex_);
      done_[next_++] = 1;  // enqueued: finish() orders the current stream after it
    }
    if (!batch_.empty()) device_->launch(batch_);
  }

  /// Compression, on the way in: each gradient divided by the size and rounded once to the
  /// packed type (DDP's hooks divide after rounding); summed by the all-reduce, widened back after.
  /// On the GPU one kernel on the current stream; on the CPU a loop (at::mul_out would allocate
  /// a float32 temporary there, per bucket and backward).
  void pack(bucket& bk) const {
    torch::NoGradGuard no_grad;
    if (bk.flat.is_cuda()) return void(at::mul_out(bk.packed, bk.flat, inv_size_));
    auto const n = static_cast<std::size_t>(bk.flat.numel());
    float const* g = bk.flat.data_ptr<float>();
    float const inv = inv_size_f_;
    auto round_into = [&]<class Half>(Half* out) {
      for (std::size_t i = 0; i < n; ++i) out[i] = Half::from_float(g[i] * inv);
    };
    if (bk.packed.scalar_type() == torch::kBFloat16) round_into(static_cast<comm::bfloat16*>(bk.packed.data_ptr()));
    else round_into(static_cast<comm::float16*>(bk.packed.data_ptr()));
  }

  /// One bucket over the communicator (avg: the division by the world size fused into the
  /// reduction; compressed: packed, summed, widened back).
  void reduce(std::size_t b) {
    auto& bk = buckets_[b];
    if (bk.packed.defined()) pack(bk);
    auto const r = bk.sent();
    with_elements(r.buffer, [&](auto* data) { comm_.allreduce(data, static_cast<std::size_t>(r.buffer.numel()), r.op); });
    if (bk.packed.defined()) bk.flat.copy_(bk.packed);
  }

  /// The communication thread: reduces buckets in the order they were queued.
  void work() {
    cohort::detail::begin_background_thread("cohort-reduce");
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      auto b = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::string err;
      try {
        reduce(b);
      } catch (std::exception const& e) {
        err = e.what();
      }
      lock.lock();
      if (!err.empty() && error_.empty()) error_ = err;
      done_[b] = 1;
      busy_ = false;
      wake_.notify_all();
    }
  }

  /// The end of backward: parameters that got no gradient this pass (unused in the forward)
  /// contribute what their .grad holds (zero when none), the remaining buckets are launched, and
  /// every all-reduce (an average) is awaited.
  void finish_pass() {
    in_pass_ = false;  // first: the next backward starts a new pass, whatever throws below
    torch::NoGradGuard no_grad;
    for (std::size_t b = next_; b < buckets_.size(); ++b) {
      for (auto i : buckets_[b].params)
        if (!seen_[i]) bind(i);
      buckets_[b].pending = 0;
    }
    launch_ready(true);
    if (device_) {
      device_->finish();
      for (auto& bk : buckets_)
        if (bk.packed.defined()) bk.flat.copy_(bk.packed);  // on the current stream, after the all-reduce
    }
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return std::all_of(done_.begin(), done_.end(), [](char d) { return d != 0; }); });
    if (!error_.empty()) throw cohort::error("gradient all-reduce failed: " + error_);
    auto gates = std::exchange(gates_, {});
    lock.unlock();
    for (auto const& g : gates) g->wait();  // an async checkpoint still copying: the step must wait
    backward_versions_ = version_sum();
    sample_values(params_, backward_values_);  // per step: into the same buffer, no allocation
  }

  std::int64_t version_sum() const {
    std::int64_t v = 0;
    for (auto const& p : params_) v += p._version();
    return v;
  }

  comm::any& comm_;
  std::vector<torch::Tensor> params_;
  lockstep* steps_ = nullptr;
  float inv_size_f_ = 1.0f;  ///< 1 / ranks (compression divides by it)
  torch::Tensor inv_size_;   ///< the same as a scalar tensor, for at::mul_out on the GPU
  std::vector<torch::Tensor> aliases_;  ///< per parameter: its slot in its bucket's flat buffer
  std::vector<std::size_t> slot_of_;    ///< per parameter: its bucket
  std::vector<bucket> buckets_;
  std::vector<bool> seen_;
  /// Kept alive: a Variable holds them weakly. A shared_ptr in LibTorch 1.13, an intrusive_ptr in
  /// later versions: the type grad_accumulator returns.
  using accumulator_ptr = decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor const&>()));
  std::vector<accumulator_ptr> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::size_t next_ = 0;
  bool in_pass_ = false;
  std::int64_t backward_versions_ = -1;  ///< the parameters' version sum at the end of the last backward
  std::vector<std::uint64_t> backward_values_;  ///< their sampled_values then
  // Communication thread state, guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::size_t> queue_;
  std::vector<char> done_;  ///< per bucket: reduced in this pass
  std::string error_;
  std::vector<std::shared_ptr<step_gate>> gates_;  ///< held by async checkpoints still copying
  bool stop_ = false;
  bool busy_ = false;  ///< the thread is reducing a bucket
  std::thread worker_;
  // The GPU path; declared after the buckets, so destroyed before them (its destructor waits
  // for the all-reduces still reading them).
  std::unique_ptr<device_buckets> device_;
  std::vector<reduction> batch_;  ///< launch_on_device's batch, reused
};

}  // namespace detail

/// A module prepared for data-parallel training: use it like the module (`model->forward(x)`,
/// `model->parameters()`); backward averages gradients over the trainer's ranks. Copies share
/// the same gradient synchronisation. Valid during the fit() that prepared it.
template <class Module>
class prepared_model {
 public:
  prepared_model(Module m, std::shared_ptr<detail::gradient_reducer> r) : module_(std::move(m)), reducer_(std::move(r)) {}

  auto* operator->() const { return get(); }
  auto& operator*() const { return *get(); }
  /// The module's object (non-owning).
  auto* get() const {
    if constexpr (requires { module_.ptr(); }) return module_.ptr().get();  // a ModuleHolder
    else return module_.get();                                               // a shared_ptr
  }
  /// The module itself (a shared_ptr or a ModuleHolder, as given to prepare_model).
  Module const& module() const { return module_; }
  /// `model(x)` forwards to `model->forward(x)`.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const { return get()->forward(std::forward<Args>(args)...); }

  /// While the returned guard lives, backward accumulates gradients locally without
  /// communication (gradient accumulation); the next backward outside it averages the total.
  /// Every rank must use no_sync() for the same passes.
  [[nodiscard]] auto no_sync() const {
    struct guard {
      guard(detail::gradient_reducer* reducer, bool was) : r(reducer), before(was) {}
      guard(guard const&) = delete;
      guard& operator=(guard const&) = delete;
      ~guard() {
        if (r) r->sync_enabled = before;
      }
      detail::gradient_reducer* r;
      bool before;
    };
    if (!reducer_) return guard{nullptr, true};
    bool before = reducer_->sync_enabled;
    reducer_->sync_enabled = false;
    return guard{reducer_.get(), before};
  }

  /// Number of gradient buckets (0 when running on one rank: nothing to synchronise).
  std::size_t num_buckets() const { return reducer_ ? reducer_->num_buckets() : 0; }

  /// The gradient reducer (null on one rank); checkpoint_of uses it to defer its copies.
  std::shared_ptr<detail::gradient_reducer> const& reducer() const { return reducer_; }

 private:
  Module module_;
  std::shared_ptr<detail::gradient_reducer> reducer_;
};

/// `ctx.prepare_model(module, options)`: checks the layout on every rank (a mismatch is a
/// cohort::error on every rank, naming the first differing tensor and rank), moves the module to
/// the rank's device, broadcasts parameters and buffers from rank 0 and installs the gradient
/// reducer. Collective: every rank of the trainer must call it, in the same order (a rank that
/// does not is an error on every rank, see docs/fault-tolerance.md).
/// Cost: one agreement (a small all-reduce), two allgathers of the layout text, one broadcast per tensor.
template <class Module>
prepared_model<Module> prepare_model_for(context& ctx, Module module, model_options const& options) {
  ctx.lockstep().agree(detail::step::prepare_model);  // every rank is here (else diverged on every rank)
  torch::nn::Module& m = *prepared_model<Module>(module, nullptr).get();
  m.to(to_torch(ctx.device()));
  auto& c = ctx.comm();
  auto mine = detail::module_layout(m);
  std::string joined;
  for (auto const& l : mine) joined += l + "\n";
  auto all = comm::allgather_strings(c, joined);
  std::vector<std::vector<std::string>> layouts;
  for (auto const& s : all) {
    std::vector<std::string> lines;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    layouts.push_back(std::move(lines));
  }
  if (auto e = detail::layout_mismatch(layouts)) throw cohort::error(*e);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m.parameters()) detail::broadcast_tensor(c, p);
    for (auto& b : m.buffers()) detail::broadcast_tensor(c, b);
  }
  std::shared_ptr<detail::gradient_reducer> reducer;
  if (c.size() > 1) {
    std::vector<torch::Tensor> params;
    for (auto& p : m.parameters())
      if (p.requires_grad()) params.push_back(p);
    bool const on_gpu = ctx.device().kind == device_kind::cuda;
    bool const thread = !on_gpu && use_communication_thread(options.reduce_on, scaling::node_cores(), ctx.local_world_size());
    auto device = on_gpu ? detail::make_device_buckets(c, ctx.device().index, options.timeout_ms > 0 ? options.timeout_ms : ctx.collective_timeout_ms()) : nullptr;
    if (!params.empty())
      reducer = std::make_shared<detail::gradient_reducer>(c, std::move(params), options, thread, std::move(device),
                                                           &ctx.lockstep());
  }
  return prepared_model<Module>(std::move(module), std::move(reducer));
}

}  // namespace cohort
