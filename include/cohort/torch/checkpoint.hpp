#pragma once
/// \file
/// Deprecated: this header was renamed cohort/torch/checkpoint_state.hpp. It forwards there, with
/// a warning, until 0.2.0 removes it (CHANGELOG.md).

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "cohort/torch/checkpoint.hpp is deprecated: include <cohort/torch/checkpoint_state.hpp> (this header goes in 0.2.0)"
#else
#pragma message("cohort/torch/checkpoint.hpp is deprecated: include <cohort/torch/checkpoint_state.hpp> (this header goes in 0.2.0)")
#endif

#include "cohort/torch/checkpoint_state.hpp"
