#pragma once
/// \file
/// Deprecated: this header was renamed cohort/report/protocol.hpp (detail::reporter is now
/// report::protocol). It forwards there, with a warning, until 0.2.0 removes it (CHANGELOG.md).

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC warning "cohort/reporter.hpp is deprecated: include <cohort/report/protocol.hpp> (this header goes in 0.2.0)"
#else
#pragma message("cohort/reporter.hpp is deprecated: include <cohort/report/protocol.hpp> (this header goes in 0.2.0)")
#endif

#include "cohort/report/protocol.hpp"
