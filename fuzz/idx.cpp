// libFuzzer target: data::read_idx on arbitrary bytes (plain or gzipped). It must return or throw
// cohort::error; a crash, another exception, or an allocation the file cannot back is a bug.
#include <cohort/data/idx.hpp>

#include <cstdint>

#include "input_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  auto const& file = input_file(data, size, ".idx");
  try {
    auto a = cohort::data::read_idx(file);
    std::int64_t count = 1;
    for (auto d : a.dims) count *= d;
    if (static_cast<std::int64_t>(a.data.size()) != count) __builtin_trap();  // what it read is what it claims
  } catch (cohort::error const&) {
  }
  return 0;
}
