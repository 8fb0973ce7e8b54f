#pragma once
/// \file
/// The stop signal (SIGTERM, SIGINT) a process received during fit(): set by the trainer's
/// handler, read by report() and by collectives waiting past their peers' death.

#include <atomic>

namespace cohort::detail {

/// The signal (SIGTERM, SIGINT) this process received during fit(), 0 if none.
inline std::atomic<int>& stop_signal() {
  static std::atomic<int> s{0};
  return s;
}

}  // namespace cohort::detail
