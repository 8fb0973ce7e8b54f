#pragma once
/// \file
/// Deprecated: this header was renamed cohort/torch/to_torch.hpp. It forwards there, with a
/// warning, until 0.2.0 removes it (CHANGELOG.md).

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "cohort/torch/device.hpp is deprecated: include <cohort/torch/to_torch.hpp> (this header goes in 0.2.0)"
#else
#pragma message("cohort/torch/device.hpp is deprecated: include <cohort/torch/to_torch.hpp> (this header goes in 0.2.0)")
#endif

#include "cohort/torch/to_torch.hpp"
