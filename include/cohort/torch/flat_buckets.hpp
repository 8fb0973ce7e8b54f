#pragma once
/// \file
/// flat_buckets: the gradient buckets of a prepared model, as PyTorch DDP lays them out with
/// gradient_as_bucket_view: one flat buffer per bucket, each parameter's .grad a slot in it, and
/// under compression a bfloat16 or float16 copy that the all-reduce sends instead; and what a
/// bucket hands to a communicator (`reduction`, `with_elements`).

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/communicator.hpp"
#include "cohort/error.hpp"
#include "cohort/gradients/bucket_plan.hpp"
#include "cohort/gradients/model_options.hpp"

namespace cohort::detail {

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

/// The buckets of plan_buckets' plan over `params` (their order and sizes), each one flat buffer;
/// parameter i's gradient is the slot alias(i) of bucket bucket_of(i), so autograd accumulates
/// straight into the bucket and nothing is copied on the way in or out. Knows nothing of
/// backward passes or threads: gradient_reducer decides when a bucket is reduced.
class flat_buckets {
 public:
  /// `ranks`: the ranks averaging (compression divides by it on the way in); `on_device`: the
  /// NCCL path (bfloat16 and float16 gradients reducible too). Throws cohort::error for a
  /// gradient dtype the backend cannot reduce.
  flat_buckets(std::vector<torch::Tensor> const& params, model_options const& options, int ranks, bool on_device)
      : on_device_(on_device), inv_size_f_(1.0f / static_cast<float>(ranks)), inv_size_(torch::scalar_tensor(inv_size_f_, torch::kFloat)) {
    torch::NoGradGuard no_grad;
    std::vector<tensor_spec> specs;
    for (auto const& p : params) specs.push_back({p.nbytes(), static_cast<int>(p.scalar_type())});
    auto plan = plan_buckets(specs, options);
    slot_of_.resize(params.size());
    aliases_.resize(params.size());
    for (std::size_t b = 0; b < plan.size(); ++b) {
      bucket bk;
      std::int64_t numel = 0;
      for (auto i : plan[b].tensors) {
        slot_of_[i] = b;
        numel += params[i].numel();
      }
      auto const& first = params[plan[b].tensors.front()];
      auto st = first.scalar_type();
      check_reducible(st);
      bk.params = plan[b].tensors;
      bk.flat = torch::zeros({numel}, first.options().requires_grad(false));
      if (options.compression != gradient_compression::none && st == torch::kFloat)
        bk.packed = torch::empty({numel}, bk.flat.options().dtype(
                                              options.compression == gradient_compression::bfloat16 ? torch::kBFloat16 : torch::kHalf));
      std::int64_t offset = 0;
      for (auto i : plan[b].tensors) {
        // set_ (not narrow): a plain tensor sharing the bucket's storage, so that optimizers may
        // detach_() it as they do any .grad (a view would refuse).
        aliases_[i] = torch::empty({0}, bk.flat.options()).set_(bk.flat.storage(), offset, params[i].sizes());
        offset += params[i].numel();
      }
      buckets_.push_back(std::move(bk));
    }
  }

  std::size_t size() const { return buckets_.size(); }
  /// The parameters of bucket `b`, in bucket order.
  std::vector<std::size_t> const& params_of(std::size_t b) const { return buckets_[b].params; }
  /// The bucket parameter `i` is in.
  std::size_t bucket_of(std::size_t i) const { return slot_of_[i]; }

  /// Whether `param` (parameter i) has its bucket slot as .grad.
  bool bound(std::size_t i, torch::Tensor const& param) const {
    auto const& g = param.grad();
    return g.defined() && g.data_ptr() == aliases_[i].data_ptr();
  }

  /// Makes the .grad of `param` (parameter i) its bucket slot again, keeping its value (zero when
  /// there is none), after zero_grad(set_to_none) or anything else replaced it. One copy, only
  /// in that case.
  void bind(std::size_t i, torch::Tensor& param) {
    if (bound(i, param)) return;
    auto& g = param.mutable_grad();
    if (g.defined()) aliases_[i].copy_(g);
    else aliases_[i].zero_();
    g = aliases_[i];
  }

  /// What bucket `b`'s all-reduce sends, made ready: the packed copy (compression: each gradient
  /// divided by the ranks and rounded once, summed by the all-reduce) or the bucket (averaged).
  reduction outgoing(std::size_t b) {
    auto& bk = buckets_[b];
    if (!bk.packed.defined()) return {bk.flat};
    pack(bk);
    return {bk.packed, comm::reduce_op::sum};
  }

  /// After bucket `b`'s all-reduce: a packed copy widened back into the bucket (on the current
  /// stream on a GPU).
  void incoming(std::size_t b) {
    auto& bk = buckets_[b];
    if (bk.packed.defined()) bk.flat.copy_(bk.packed);
  }

  /// Bucket `b` averaged over `c`, on the calling thread (the MPI path).
  void reduce(std::size_t b, comm::any& c) {
    auto const r = outgoing(b);
    with_elements(r.buffer, [&](auto* data) { c.allreduce(data, static_cast<std::size_t>(r.buffer.numel()), r.op); });
    incoming(b);
  }

 private:
  struct bucket {
    std::vector<std::size_t> params;
    torch::Tensor flat;
    torch::Tensor packed;  ///< the bfloat16 or float16 copy sent instead (compression), else undefined
  };

  /// float32 and float64 everywhere; bfloat16 and float16 too on the GPU (NCCL).
  void check_reducible(torch::ScalarType st) const {
    bool const half = st == torch::kBFloat16 || st == torch::kHalf;
    if (st != torch::kFloat && st != torch::kDouble && !(on_device_ && half))
      throw cohort::error(std::string("prepare_model: gradients of dtype ") + std::string(c10::toString(st)) +
                          (on_device_ ? " are not supported by NCCL: use float32, float64, bfloat16 or float16 parameters"
                                      : " are not supported by the MPI backend: use float32 or float64 parameters"));
  }

  /// Compression, on the way in: each gradient divided by the size and rounded once to the
  /// packed type (DDP's hooks divide after rounding). On the GPU one kernel on the current
  /// stream; on the CPU a loop (at::mul_out would allocate a float32 temporary there, per bucket
  /// and backward).
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

  bool on_device_ = false;
  float inv_size_f_ = 1.0f;  ///< 1 / ranks (compression divides by it)
  torch::Tensor inv_size_;   ///< the same as a scalar tensor, for at::mul_out on the GPU
  std::vector<torch::Tensor> aliases_;  ///< per parameter: its slot in its bucket's flat buffer
  std::vector<std::size_t> slot_of_;    ///< per parameter: its bucket
  std::vector<bucket> buckets_;
};

}  // namespace cohort::detail
