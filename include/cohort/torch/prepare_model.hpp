#pragma once
/// \file
/// prepare_model: rank-0 broadcast of a LibTorch module, a cross-rank layout check, and gradient
/// averaging during backward in size-capped buckets whose all-reduces start as soon as their last
/// gradient is ready (PyTorch DDP's reducer, over any cohort communicator).

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/context.hpp"
#include "cohort/error.hpp"
#include "cohort/scaling/cpu.hpp"
#include "cohort/scaling/cpu_set.hpp"
#include "cohort/torch/gradient_reducer.hpp"
#include "cohort/torch/model_layout.hpp"
#include "cohort/torch/nccl_buckets.hpp"
#include "cohort/torch/to_torch.hpp"

namespace cohort {

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

namespace detail {

/// prepare_model_for, with the question a reducer on the training thread asks once the link's
/// rate is known (gradient_reducer's `move_to_thread`). Empty: thread_for_link with the measured
/// rate, for `automatic` (tests give their own).
template <class Module>
prepared_model<Module> prepare_model_with(context& ctx, Module module, model_options const& options,
                                          std::function<bool()> move_to_thread) {
  detail::context_access::lockstep(ctx).agree(detail::step::prepare_model);  // every rank is here (else diverged on every rank)
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
    auto const where = !on_gpu && use_communication_thread(options.reduce_on, scaling::node_cores(), ctx.local_world_size())
                           ? reduce_on::communication_thread
                           : reduce_on::training_thread;
    if (!move_to_thread && options.reduce_on == reduce_on::automatic && ctx.num_nodes() > 1)
      move_to_thread = [nodes = ctx.num_nodes(), per_core = scaling::ranks_per_core(scaling::node_cores(), ctx.local_world_size())] {
        return thread_for_link(reduce_on::automatic, nodes, comm::detail::link_rate().load(std::memory_order_relaxed), per_core);
      };
    auto device = on_gpu ? detail::make_device_buckets(c, ctx.device().index, options.timeout_ms > 0 ? options.timeout_ms : ctx.collective_timeout_ms()) : nullptr;
    if (!params.empty())
      reducer = std::make_shared<detail::gradient_reducer>(c, std::move(params), options, where, std::move(device),
                                                           &detail::context_access::lockstep(ctx), std::move(move_to_thread));
  }
  return prepared_model<Module>(std::move(module), std::move(reducer));
}

}  // namespace detail

/// `ctx.prepare_model(module, options)`: checks the layout on every rank (a mismatch is a
/// cohort::error on every rank, naming the first differing tensor and rank), moves the module to
/// the rank's device, broadcasts parameters and buffers from rank 0 and installs the gradient
/// reducer. Collective: every rank of the trainer must call it, in the same order (a rank that
/// does not is an error on every rank, see docs/fault-tolerance.md).
/// Cost: one agreement (a small all-reduce), two allgathers of the layout text, one broadcast per tensor.
template <class Module>
prepared_model<Module> prepare_model_for(context& ctx, Module module, model_options const& options) {
  return detail::prepare_model_with(ctx, std::move(module), options, {});
}

}  // namespace cohort
