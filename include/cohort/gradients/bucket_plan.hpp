#pragma once
/// \file
/// The gradient bucket plan: a pure function, no LibTorch needed.

#include <cstddef>
#include <span>
#include <vector>

#include "cohort/gradients/model_options.hpp"

namespace cohort {

/// What the bucket planner sees of one gradient tensor.
struct tensor_spec {
  std::size_t bytes = 0;  ///< size of the gradient in bytes
  int dtype = 0;          ///< opaque element type id: only tensors of one dtype share a bucket
};

/// One bucket: the tensors it holds (indices into the planner's input) and their total size.
struct bucket_spec {
  std::vector<std::size_t> tensors;
  std::size_t bytes = 0;
  int dtype = 0;
};

/// Pure: assigns gradient tensors to buckets, PyTorch DDP's way (its
/// compute_bucket_assignment_by_size). Tensors are taken in reverse order (the last layers'
/// gradients are ready first in backward); each dtype fills its own open bucket, which is closed
/// as soon as it holds at least the cap (the first bucket closed uses `first_bucket_cap_bytes`,
/// later ones `bucket_cap_bytes`). A large tensor thus closes the bucket it joins: its all-reduce
/// starts as soon as its gradient is ready, overlapping the rest of backward (the reference CNN's
/// 1.6 MB fc1 weight, ready before the convolutions' backward, which is most of the step; closed
/// before it instead, it went with them at the end of backward). Buckets are returned in the order
/// they close, then the still open ones; this order is identical across ranks and is the order
/// their all-reduces are started.
inline std::vector<bucket_spec> plan_buckets(std::span<tensor_spec const> tensors, model_options const& options) {
  std::vector<bucket_spec> closed;
  std::vector<bucket_spec> open;  // one per dtype, in order of first appearance
  for (std::size_t k = tensors.size(); k-- > 0;) {
    auto const& t = tensors[k];
    bucket_spec* b = nullptr;
    for (auto& o : open)
      if (o.dtype == t.dtype) b = &o;
    if (!b) {
      open.push_back({{}, 0, t.dtype});
      b = &open.back();
    }
    b->tensors.push_back(k);
    b->bytes += t.bytes;
    if (b->bytes >= (closed.empty() ? options.first_bucket_cap_bytes : options.bucket_cap_bytes)) {
      closed.push_back(std::move(*b));
      *b = {{}, 0, t.dtype};
    }
  }
  for (auto& o : open)
    if (!o.tensors.empty()) closed.push_back(std::move(o));
  return closed;
}

}  // namespace cohort
