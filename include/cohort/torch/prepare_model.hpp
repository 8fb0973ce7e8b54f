#pragma once
/// \file
/// prepare_model: rank-0 broadcast of a LibTorch module, a cross-rank layout check, and gradient
/// averaging during backward in size-capped buckets whose all-reduces start as soon as their last
/// gradient is ready (PyTorch DDP's reducer, over any cohort communicator).

#include <torch/torch.h>
#include <torch/csrc/autograd/engine.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/context.hpp"
#include "cohort/error.hpp"
#include "cohort/torch/bucket_plan.hpp"
#include "cohort/torch/device.hpp"

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

/// Averages gradients over a communicator during backward. Invariant across ranks: buckets are
/// planned identically (same layout, checked) and their all-reduces are started in bucket
/// order, whatever order the gradients become ready in, so every rank enters the same
/// collectives in the same order.
class gradient_reducer {
 public:
  gradient_reducer(comm::any& c, std::vector<torch::Tensor> params, model_options const& options)
      : comm_(c), params_(std::move(params)) {
    std::vector<tensor_spec> specs;
    for (auto const& p : params_) specs.push_back({p.nbytes(), static_cast<int>(p.scalar_type())});
    auto plan = plan_buckets(specs, options);
    slot_of_.resize(params_.size());
    for (std::size_t b = 0; b < plan.size(); ++b) {
      bucket bk;
      std::int64_t numel = 0;
      for (auto i : plan[b].tensors) {
        slot_of_[i] = {b, numel};
        numel += params_[i].numel();
      }
      bk.params = plan[b].tensors;
      bk.flat = torch::zeros({numel}, params_[plan[b].tensors.front()].options().requires_grad(false));
      auto st = bk.flat.scalar_type();
      if (st != torch::kFloat && st != torch::kDouble)
        throw cohort::error(std::string("prepare_model: gradients of dtype ") + std::string(c10::toString(st)) +
                            " are not supported by the MPI backend: use float32 or float64 parameters");
      buckets_.push_back(std::move(bk));
    }
    seen_.assign(params_.size(), false);
    for (std::size_t i = 0; i < params_.size(); ++i)
      hooks_.push_back(params_[i].register_hook([this, i](torch::Tensor const& grad) { on_grad(i, grad); }));
  }
  gradient_reducer(gradient_reducer const&) = delete;
  gradient_reducer& operator=(gradient_reducer const&) = delete;
  ~gradient_reducer() {
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hooks_[i]);
  }

  std::size_t num_buckets() const { return buckets_.size(); }
  bool sync_enabled = true;  ///< false inside no_sync(): gradients accumulate locally

 private:
  struct bucket {
    std::vector<std::size_t> params;
    torch::Tensor flat;
    std::size_t pending = 0;
    bool launched = false;
    comm::any_request request;
  };
  struct slot {
    std::size_t bucket = 0;
    std::int64_t offset = 0;
  };

  torch::Tensor view_of(std::size_t i) {
    auto const& s = slot_of_[i];
    return buckets_[s.bucket].flat.narrow(0, s.offset, params_[i].numel());
  }

  void on_grad(std::size_t i, torch::Tensor const& grad) {
    if (!sync_enabled) return;
    if (!in_pass_) begin_pass();
    torch::NoGradGuard no_grad;
    auto v = view_of(i);
    v.copy_(grad.reshape({-1}));
    // DDP semantics: what is all-reduced is the gradient .grad will hold (locally accumulated
    // gradients from no_sync() passes plus this one).
    if (params_[i].grad().defined()) v.add_(params_[i].grad().reshape({-1}));
    seen_[i] = true;
    auto& b = buckets_[slot_of_[i].bucket];
    if (--b.pending == 0) launch_ready();
    for (std::size_t k = 0; k < next_; ++k) buckets_[k].request.test();  // drive MPI progress
  }

  void begin_pass() {
    in_pass_ = true;
    next_ = 0;
    std::fill(seen_.begin(), seen_.end(), false);
    for (auto& b : buckets_) {
      b.pending = b.params.size();
      b.launched = false;
    }
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_pass(); });
  }

  void launch_ready() {
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) launch(next_++);
  }

  void launch(std::size_t b) {
    auto& bk = buckets_[b];
    if (bk.flat.scalar_type() == torch::kFloat)
      bk.request = comm_.iallreduce(bk.flat.data_ptr<float>(), static_cast<std::size_t>(bk.flat.numel()), comm::reduce_op::sum);
    else
      bk.request = comm_.iallreduce(bk.flat.data_ptr<double>(), static_cast<std::size_t>(bk.flat.numel()), comm::reduce_op::sum);
    bk.launched = true;
  }

  /// Runs at the end of backward (an engine callback): buckets with parameters that got no
  /// gradient this pass are filled from .grad (or zeros) and launched, all reduces are awaited,
  /// averaged, and written to .grad.
  void finish_pass() {
    torch::NoGradGuard no_grad;
    for (std::size_t b = next_; b < buckets_.size(); ++b) {
      for (auto i : buckets_[b].params)
        if (!seen_[i]) {
          auto v = view_of(i);
          if (params_[i].grad().defined()) v.copy_(params_[i].grad().reshape({-1}));
          else v.zero_();
        }
      buckets_[b].pending = 0;
    }
    launch_ready();
    double const scale = 1.0 / static_cast<double>(comm_.size());
    for (auto& bk : buckets_) {
      bk.request.wait();
      bk.flat.mul_(scale);
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto v = view_of(i).view(params_[i].sizes());
      auto& g = params_[i].mutable_grad();
      if (g.defined()) g.copy_(v);
      else g = v.clone();
    }
    in_pass_ = false;
  }

  comm::any& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<slot> slot_of_;
  std::vector<bucket> buckets_;
  std::vector<bool> seen_;
  std::vector<unsigned> hooks_;
  std::size_t next_ = 0;
  bool in_pass_ = false;
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

 private:
  Module module_;
  std::shared_ptr<detail::gradient_reducer> reducer_;
};

/// `ctx.prepare_model(module, options)`: checks the layout on every rank (a mismatch is a
/// cohort::error on every rank, naming the first differing tensor and rank), moves the module to
/// the rank's device, broadcasts parameters and buffers from rank 0 and installs the gradient
/// reducer. Collective: every rank of the trainer must call it, in the same order.
/// Cost: two allgathers of the layout text, one broadcast per tensor.
template <class Module>
prepared_model<Module> prepare_model_for(context& ctx, Module module, model_options const& options) {
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
    if (!params.empty()) reducer = std::make_shared<detail::gradient_reducer>(c, std::move(params), options);
  }
  return prepared_model<Module>(std::move(module), std::move(reducer));
}

}  // namespace cohort
