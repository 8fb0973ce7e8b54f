// Which copy of the C++ runtime a LibTorch program calls. PyPI's torch wheels link parts of
// libstdc++ statically and export them (std::filesystem among them, pytorch/pytorch#133437); when
// the loader finds LibTorch before libstdc++, every std::filesystem call of the process goes to
// that copy, and the 2.11 CUDA wheel's remove_all jumps to address 0. cmake/CohortFindTorch.cmake
// names the runtime first; this checks that it took. Compiled into the LibTorch and the GPU tests.
#include <dlfcn.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "../catch.hpp"

TEST_CASE("std::filesystem calls reach the C++ runtime, not the copy a LibTorch wheel exports", "[torch][link]") {
  // Catches: a link order (or a new wheel) that lets LibTorch's exported std::filesystem take
  // the calls of cohort's checkpoint retention and of the user's own code.
  auto* const remove_all = static_cast<std::uintmax_t (*)(std::filesystem::path const&)>(&std::filesystem::remove_all);
  Dl_info where{};
  REQUIRE(dladdr(reinterpret_cast<void*>(remove_all), &where) != 0);
  REQUIRE(where.dli_fname != nullptr);
  INFO("std::filesystem::remove_all is defined in " << where.dli_fname);
  CHECK(std::string(where.dli_fname).find("libtorch") == std::string::npos);
  CHECK(std::string(where.dli_fname).find("libstdc++") != std::string::npos);
}
