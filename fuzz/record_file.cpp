// libFuzzer target: data::record_file on arbitrary bytes. The first two bytes choose the record
// size (1 to 256) and the header size (0 to 255), the rest is the file. It must map the file or
// throw cohort::error; what it maps must be consistent with the file's size, and every record
// must read back the file's bytes at its offset.
#include <cohort/data/record_file.hpp>

#include <cstdint>
#include <cstring>

#include "input_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  if (size < 2) return 0;
  std::size_t const record_bytes = std::size_t{data[0]} + 1, header_bytes = data[1];
  data += 2;
  size -= 2;
  auto const& file = input_file(data, size, ".rec");
  try {
    cohort::data::record_file f(file, record_bytes, header_bytes);
    if (size < header_bytes || f.size() * record_bytes + header_bytes != size) __builtin_trap();
    if (f.header().size() != header_bytes || (header_bytes > 0 && std::memcmp(f.header().data(), data, header_bytes) != 0))
      __builtin_trap();
    std::size_t n = 0;
    for (auto r : f.records()) {
      if (r.size() != record_bytes || std::memcmp(r.data(), data + header_bytes + n * record_bytes, record_bytes) != 0)
        __builtin_trap();
      ++n;
    }
    if (n != f.size()) __builtin_trap();
  } catch (cohort::error const&) {
  }
  return 0;
}
