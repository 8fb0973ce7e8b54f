#pragma once
/// \file
/// The one exception type cohort throws for bad input and broken invariants.

#include <stdexcept>
#include <string>

namespace cohort {

/// Thrown for bad input (a wrong worker count, a config that does not parse, an unwritable
/// storage path) and for invariants broken across ranks (different model layouts). The message
/// is one line: what is wrong, then how to fix it.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace cohort
