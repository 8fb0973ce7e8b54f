#pragma once
// The fuzz input as a file: the parsers under test read paths, as cohort does.

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

/// Writes `size` bytes at `data` to this process's input file (named with `suffix`) and returns it.
inline std::filesystem::path const& input_file(std::uint8_t const* data, std::size_t size, char const* suffix) {
  static auto const file = std::filesystem::temp_directory_path() / ("cohort_fuzz_" + std::to_string(getpid()) + suffix);
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<char const*>(data), static_cast<std::streamsize>(size));
  return file;
}
