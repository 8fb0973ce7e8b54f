#pragma once
/// \file
/// detail::utc_stamp: the current UTC time as a name part (run names, attempt prefixes).

#include <ctime>
#include <string>

namespace cohort::detail {

/// The current UTC time as `YYYY-MM-DD_HH-MM-SS`, to second resolution.
inline std::string utc_stamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H-%M-%S", &tm);
  return buf;
}

}  // namespace cohort::detail
