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
