#pragma once
// Catch2 v2 (Debian 12) and v3 (the GPU machine) behind one include.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define COHORT_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#endif

#include <string>

#ifdef COHORT_CATCH_V3
using Catch::Approx;
/// Matches a string containing `s` (v2 Contains, v3 ContainsSubstring).
inline auto contains_text(std::string const& s) { return Catch::Matchers::ContainsSubstring(s); }
#else
inline auto contains_text(std::string const& s) { return Catch::Matchers::Contains(s); }
#endif

#ifdef CATCH_CONFIG_RUNNER  // the mains (mpi_main.cpp, gpu/gpu_main.cpp)
/// Makes a test spec given on the command line that matches no test fail the run (exit 2). Without
/// it Catch2 v2 exits 0 when a filter matches nothing, so a wrapper trusting the exit status of
/// `tests "[some tag]"` would pass with the tag renamed. v2 calls it NoTests, v3 UnmatchedTestSpec
/// (v3 fails on zero tests run by default, not on one unmatched spec of several).
inline void fail_on_unmatched_test_spec(Catch::Session& session) {
#ifdef COHORT_CATCH_V3
  constexpr auto unmatched = Catch::WarnAbout::UnmatchedTestSpec;
#else
  constexpr auto unmatched = Catch::WarnAbout::NoTests;
#endif
  auto& data = session.configData();
  data.warnings = static_cast<Catch::WarnAbout::What>(data.warnings | unmatched);
}
#endif
