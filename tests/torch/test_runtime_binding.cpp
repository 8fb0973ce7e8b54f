// Which copy of the C++ runtime a LibTorch program calls. PyPI's torch wheels link parts of
// libstdc++ statically and export them (std::filesystem among them, pytorch/pytorch#133437); when
// the loader finds LibTorch before libstdc++, every std::filesystem call of the process goes to
// that copy, and the 2.11 CUDA wheel's remove_all jumps to address 0. cmake/CohortFindTorch.cmake
// names the runtime first; this checks that it took. Compiled into the LibTorch and the GPU tests.
#include <cohort/torch/runtime_binding.hpp>

#include <string>

#include "../catch.hpp"

TEST_CASE("std::filesystem calls reach the C++ runtime, not the copy a LibTorch wheel exports", "[torch][link]") {
  // Catches: a link order (or a new wheel) that lets LibTorch's exported std::filesystem take
  // the calls of cohort's checkpoint retention and of the user's own code.
  auto const where = cohort::detail::remove_all_defined_in();
  INFO("std::filesystem::remove_all is defined in " << where);
  REQUIRE_FALSE(where.empty());
  CHECK(where.find("libtorch") == std::string::npos);
  CHECK(where.find("libstdc++") != std::string::npos);
  CHECK(cohort::detail::runtime_binding_warning(where).empty());
}

TEST_CASE("a program whose std::filesystem runs in LibTorch's copy is told how to link", "[torch][link]") {
  auto const w = cohort::detail::runtime_binding_warning("/venv/lib/python3.12/site-packages/torch/lib/libtorch.so");
  CHECK_THAT(w, contains_text("libtorch.so's copy of libstdc++"));
  CHECK_THAT(w, contains_text("cohort::torch"));
  CHECK_THAT(w, contains_text("--no-as-needed,-lstdc++"));
  CHECK(cohort::detail::runtime_binding_warning("/venv/torch/lib/libc10.so") != "");
  CHECK(cohort::detail::runtime_binding_warning("/usr/lib/x86_64-linux-gnu/libstdc++.so.6").empty());
  CHECK(cohort::detail::runtime_binding_warning("").empty());
}
