#pragma once
/// \file
/// gradient_reducer: PyTorch DDP's reducer over any cohort communicator. Gradients accumulate
/// straight into size-capped flat buckets (flat_buckets.hpp); each bucket's all-reduce starts once
/// its last gradient is ready, on a communication thread (CPU) or a side stream (GPU), and the end
/// of backward waits for them.

#include <mpi.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/detail/background_worker.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/error.hpp"
#include "cohort/gradients/model_options.hpp"
#include "cohort/torch/device_buckets.hpp"
#include "cohort/torch/flat_buckets.hpp"
#include "cohort/torch/step_gate.hpp"

namespace cohort::detail {

/// Averages gradients over a communicator during backward, as PyTorch DDP's reducer does with
/// gradient_as_bucket_view: each parameter's .grad aliases its slot in a flat bucket buffer, so
/// autograd accumulates straight into the bucket and nothing is copied on the way in or out.
/// A hook after each parameter's gradient accumulation marks it ready; once all of a bucket's
/// gradients are ready its all-reduce is handed to the reducer's communication thread (non-blocking
/// for the training thread; MPI's blocking all-reduce is its fastest algorithm, and a thread of its
/// own overlaps it with the rest of backward; see use_communication_thread and thread_for_link for when it is used,
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
  /// `where`: reduce_on::communication_thread (a thread of its own, on the MPI path) or
  /// training_thread; the caller resolves automatic (use_communication_thread). `steps`: the
  /// ranks' agreement on control flow, started at the first hook of each synchronised backward
  /// and awaited before its first all-reduce (null: none). `move_to_thread`: asked once, at the
  /// end of synchronised backward number link_decision_pass, by a reducer on the training
  /// thread (prepare_model asks thread_for_link with the link's rate measured by then; a
  /// reducer already on the thread counts as true, unasked); the communication thread starts for
  /// the passes after it when every rank answered true (one all-reduce of the answers). Every
  /// rank must be given one or none (on a job across uneven hosts some ranks start on the
  /// thread: use_communication_thread counts each node's ranks). Collective, because a
  /// rank on the thread finishes the ranks' agreement (`steps`) mid-backward, where a rank on the
  /// training thread makes no MPI call until backward's end: the one would wait there for the
  /// other's whole backward.
  gradient_reducer(comm::any& c, std::vector<torch::Tensor> params, model_options const& options, reduce_on where,
                   std::unique_ptr<device_buckets> device = nullptr, lockstep* steps = nullptr,
                   std::function<bool()> move_to_thread = {})
      : comm_(c),
        params_(std::move(params)),
        steps_(steps),
        buckets_(params_, options, device ? device->size() : c.size(), device != nullptr),
        device_(std::move(device)) {
    torch::NoGradGuard no_grad;
    pending_.assign(buckets_.size(), 0);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    bool const threads_allowed = !device_ && level >= MPI_THREAD_SERIALIZED;
    if (threads_allowed && where == reduce_on::communication_thread) start_communication_thread();
    if (threads_allowed) move_to_thread_ = std::move(move_to_thread);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      buckets_.bind(i, params_[i]);
      auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
      auto bind = std::make_unique<bind_hook>(this, i);
      bind_hooks_.push_back(bind.get());
      acc->add_pre_hook(std::move(bind));
      hook_keys_.push_back(acc->add_post_hook(std::make_unique<ready_hook>(this, i)));
      accumulators_.push_back(std::move(acc));
    }
    seen_.assign(params_.size(), false);
  }
  gradient_reducer(gradient_reducer const&) = delete;
  gradient_reducer& operator=(gradient_reducer const&) = delete;
  ~gradient_reducer() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) {
      accumulators_[i]->del_post_hook(hook_keys_[i]);
      auto& pre = accumulators_[i]->pre_hooks();
      std::erase_if(pre, [&](auto const& h) { return h.get() == bind_hooks_[i]; });
    }
  }

  /// The synchronised backward pass at whose end move_to_thread is asked, never later: by then
  /// the passes before have measured the link's rate (comm::detail::link_rate, from the ring
  /// all-reduce's transfers of at least rate_sample_min_bytes).
  static constexpr std::int64_t link_decision_pass = 4;

  std::size_t num_buckets() const { return buckets_.size(); }
  /// Whether buckets are reduced on the communication thread (from now on).
  bool on_communication_thread() const { return worker_.has_value(); }
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
  /// optimizer step that follows it).
  void hold_step_until(std::shared_ptr<step_gate> gate) {
    std::lock_guard lock(gates_mutex_);
    gates_.push_back(std::move(gate));
  }

 private:
  /// Runs before autograd accumulates a parameter's gradient: makes its bucket slot the .grad
  /// (zeroed when there was none), so that the accumulation adds into the bucket in place. Without
  /// it, after zero_grad(set_to_none), LibTorch's default, autograd would allocate a fresh .grad
  /// for every parameter and every step, copied into the bucket afterwards (bench_gradient_sync
  /// --guard: 1 MiB synchronised at 0.5 of a raw all-reduce's throughput with that copy).
  struct bind_hook final : torch::autograd::FunctionPreHook {
    bind_hook(gradient_reducer* r, std::size_t i) : reducer(r), index(i) {}
    torch::autograd::variable_list operator()(torch::autograd::variable_list const& grads) override {
      torch::NoGradGuard no_grad;
      reducer->buckets_.bind(index, reducer->params_[index]);
      return grads;
    }
    gradient_reducer* reducer;
    std::size_t index;
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

  void on_ready(std::size_t i) {
    if (!sync_enabled) return;
    if (!in_pass_) begin_pass();
    torch::NoGradGuard no_grad;
    buckets_.bind(i, params_[i]);
    seen_[i] = true;
    try {
      if (--pending_[buckets_.bucket_of(i)] == 0) launch_ready_mid_backward();
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
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_.params_of(b).size();
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_pass(); });
  }

  /// launch_ready() from a gradient hook, mid-backward: only where the all-reduces then overlap
  /// the rest of backward (on the device, or on the communication thread). Without a
  /// communication thread nothing is started before the end of backward: a blocking all-reduce
  /// on the training thread overlaps nothing, and one mid-backward makes each rank wait for the
  /// other's backward there as well as at the end (bench_train_step: the CNN step 3.8% slower
  /// than a hand-written loop on average over 7 runs, 2.2% faster over 8 deferred ones).
  void launch_ready_mid_backward() {
    if (device_ || worker_) launch_ready();
  }

  /// Starts the all-reduces of the complete buckets, in bucket order: on the device, on the
  /// communication thread, or here. The last bucket has nothing left to overlap with: once the
  /// thread has finished the earlier ones (collective order), it is reduced here, saving the
  /// hand-off.
  void launch_ready() {
    // Every rank is at this backward (else diverged is thrown): its all-reduces may start.
    if (steps_ && steps_->pending()) steps_->finish();
    if (device_) return launch_on_device();
    while (next_ < buckets_.size() && pending_[next_] == 0) {
      auto const b = next_++;
      if (worker_ && b + 1 < buckets_.size()) {
        worker_->start([this, b] { reduce_on_worker(b); });
        continue;
      }
      if (worker_) worker_->wait();
      buckets_.reduce(b, comm_);
    }
  }

  /// One bucket on the communication thread; its error is kept for the end of backward.
  void reduce_on_worker(std::size_t b) {
    try {
      buckets_.reduce(b, comm_);
    } catch (std::exception const& e) {
      if (worker_error_.empty()) worker_error_ = e.what();
    }
  }

  /// The complete buckets, in bucket order, enqueued on the GPU in one batch.
  void launch_on_device() {
    batch_.clear();
    while (next_ < buckets_.size() && pending_[next_] == 0) batch_.push_back(buckets_.outgoing(next_++));
    if (!batch_.empty()) device_->launch(batch_);  // enqueued: finish() orders the current stream after them
  }

  /// The end of backward: parameters that got no gradient this pass (unused in the forward)
  /// contribute what their .grad holds (zero when none), the remaining buckets are launched, and
  /// every all-reduce (an average) is awaited.
  void finish_pass() {
    in_pass_ = false;  // first: the next backward starts a new pass, whatever throws below
    torch::NoGradGuard no_grad;
    for (std::size_t b = next_; b < buckets_.size(); ++b) {
      for (auto i : buckets_.params_of(b))
        if (!seen_[i]) buckets_.bind(i, params_[i]);
      pending_[b] = 0;
    }
    launch_ready();
    if (device_) {
      device_->finish();
      for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_.incoming(b);  // on the current stream, after the all-reduce
    }
    if (worker_) worker_->wait();  // every bucket was handed over above: idle means all reduced
    if (!worker_error_.empty()) throw cohort::error("gradient all-reduce failed: " + worker_error_);
    std::vector<std::shared_ptr<step_gate>> gates;
    {
      std::lock_guard lock(gates_mutex_);
      gates = std::exchange(gates_, {});
    }
    for (auto const& g : gates) g->wait();  // an async checkpoint still copying: the step must wait
    backward_versions_ = version_sum();
    sample_values(params_, backward_values_);  // per step: into the same buffer, no allocation
    if (move_to_thread_ && ++synchronised_passes_ == link_decision_pass) {
      std::int32_t every_rank = worker_ || move_to_thread_() ? 1 : 0;
      move_to_thread_ = nullptr;
      comm_.allreduce(&every_rank, 1, comm::reduce_op::min);  // no bucket in flight: backward is done
      if (every_rank == 1 && !worker_) start_communication_thread();
    }
  }

  void start_communication_thread() {
    worker_.emplace("cohort-reduce", on_wakeup::preempt);  // backward's end waits for it
    worker_->warm_up();
  }

  std::int64_t version_sum() const {
    std::int64_t v = 0;
    for (auto const& p : params_) v += p._version();
    return v;
  }

  comm::any& comm_;
  std::vector<torch::Tensor> params_;
  lockstep* steps_ = nullptr;
  flat_buckets buckets_;
  std::vector<std::size_t> pending_;  ///< per bucket: gradients not yet ready in this pass
  std::vector<bool> seen_;            ///< per parameter: its gradient was ready in this pass
  /// Kept alive: a Variable holds them weakly. A shared_ptr in LibTorch 1.13, an intrusive_ptr in
  /// later versions: the type grad_accumulator returns.
  using accumulator_ptr = decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor const&>()));
  std::vector<accumulator_ptr> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<torch::autograd::FunctionPreHook const*> bind_hooks_;  ///< per parameter: its bind_hook
  std::size_t next_ = 0;  ///< the first bucket not launched in this pass
  bool in_pass_ = false;
  std::int64_t backward_versions_ = -1;  ///< the parameters' version sum at the end of the last backward
  std::vector<std::uint64_t> backward_values_;  ///< their sampled_values then
  std::mutex gates_mutex_;
  std::vector<std::shared_ptr<step_gate>> gates_;  ///< held by async checkpoints still copying
  /// The first failure on the communication thread: written by its jobs, read after wait().
  std::string worker_error_;
  std::function<bool()> move_to_thread_;  ///< asked at the end of pass link_decision_pass, then dropped
  std::int64_t synchronised_passes_ = 0;  ///< counted while move_to_thread_ waits
  std::optional<background_worker> worker_;  ///< the communication thread (MPI path), if any
  // The GPU path and the communication thread: declared after the buckets, so destroyed before
  // them (the one waits for the all-reduces still reading them, the other drains its queue).
  std::unique_ptr<device_buckets> device_;
  std::vector<reduction> batch_;  ///< launch_on_device's batch, reused
};

}  // namespace cohort::detail
