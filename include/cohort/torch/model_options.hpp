#pragma once
/// \file
/// Tuning knobs of prepare_model (no LibTorch needed to name them). They never change results.

#include <cstddef>

namespace cohort {

/// Knobs of `ctx.prepare_model(model, {...})`.
struct model_options {
  /// Largest gradient bucket; each bucket is one all-reduce. 25 MiB, PyTorch DDP's default.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// Cap of the first bucket (the last layers' gradients, ready first), small so that
  /// communication starts early in backward. 1 MiB, DDP's kDefaultFirstBucketBytes.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
};

}  // namespace cohort
