#pragma once
/// \file
/// device_buckets: the interface through which the gradient reducer hands its buckets'
/// all-reduces to a GPU backend (nccl_buckets.hpp implements it). No GPU header: the CPU gradient
/// path includes this one.

#include <span>

#include "cohort/torch/flat_buckets.hpp"

namespace cohort::detail {

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

}  // namespace cohort::detail
