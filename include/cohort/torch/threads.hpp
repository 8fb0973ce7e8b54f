#pragma once
/// \file
/// LibTorch intra-op threads for a rank.

#include <ATen/Parallel.h>

namespace cohort::detail {

/// Sets LibTorch's intra-op thread count for this process (no-op when already `n`).
inline void set_intra_op_threads(int n) {
  if (n > 0 && at::get_num_threads() != n) at::set_num_threads(n);
}

}  // namespace cohort::detail
