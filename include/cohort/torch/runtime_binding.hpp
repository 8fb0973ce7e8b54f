#pragma once
/// \file
/// Which copy of the C++ runtime this process calls. PyPI's torch wheels link parts of libstdc++
/// statically and export them (std::filesystem among them, pytorch/pytorch#133437). When the
/// dynamic loader meets LibTorch before libstdc++ in the program's list of libraries, every
/// std::filesystem call of the process (the checkpoint retention's, the user's) goes to that copy,
/// and the CUDA wheel's remove_all jumps to address 0. cohort::torch (CMake) names the runtime
/// first on the link line; a program linked another way is warned once, at the trainer's setup.

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace cohort::detail {

/// The file that defines the std::filesystem::remove_all this program calls ("" if unknown).
inline std::string remove_all_defined_in() {
  auto* const f = static_cast<std::uintmax_t (*)(std::filesystem::path const&)>(&std::filesystem::remove_all);
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(f), &where) == 0 || where.dli_fname == nullptr) return {};
  return where.dli_fname;
}

/// The warning for a program whose std::filesystem calls reach a LibTorch library's copy of
/// libstdc++ (empty when they reach the C++ runtime): pure in `defined_in`, tested on one rank.
inline std::string runtime_binding_warning(std::string const& defined_in) {
  auto const slash = defined_in.rfind('/');
  auto const file = slash == std::string::npos ? defined_in : defined_in.substr(slash + 1);
  if (file.find("libtorch") == std::string::npos && file.find("libc10") == std::string::npos) return {};
  return "cohort: warning: std::filesystem calls of this program run in " + file +
         "'s copy of libstdc++, which can crash (remove_all of a directory in the CUDA wheels): link the program "
         "through CMake's cohort::torch, or put -Wl,--push-state,--no-as-needed,-lstdc++,--pop-state before the "
         "LibTorch libraries on its link line";
}

/// Prints runtime_binding_warning once per process, where it applies.
inline void warn_if_runtime_shadowed() {
  static bool const warned = [] {
    auto const w = runtime_binding_warning(remove_all_defined_in());
    if (!w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
    return true;
  }();
  (void)warned;
}

}  // namespace cohort::detail
