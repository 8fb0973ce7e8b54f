#pragma once
/// \file
/// Deprecated: this header moved to cohort/data/torch/image.hpp with the rest of the data concern. It forwards there,
/// with a warning, until 0.2.0 removes it (CHANGELOG.md).

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "cohort/torch/image.hpp is deprecated: include <cohort/data/torch/image.hpp> (this header goes in 0.2.0)"
#else
#pragma message("cohort/torch/image.hpp is deprecated: include <cohort/data/torch/image.hpp> (this header goes in 0.2.0)")
#endif

#include "cohort/data/torch/image.hpp"
