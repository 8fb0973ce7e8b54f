// libFuzzer target: data::read_csv on arbitrary bytes. It must return a consistent table or
// throw cohort::error; a crash or another exception is a bug.
#include <cohort/data/csv.hpp>

#include <cstdint>

#include "input_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  auto const& file = input_file(data, size, ".csv");
  try {
    auto t = cohort::data::read_csv(file);
    if (t.features.size() != t.rows * t.columns.size() || t.labels.size() != t.rows) __builtin_trap();
  } catch (cohort::error const&) {
  }
  return 0;
}
