// libFuzzer target: checkpointing::safetensors::parse_header on arbitrary bytes (the checks safetensors::load
// makes before it allocates anything). It must return or throw cohort::error; an accepted
// header's tensors must lie inside the file, their byte counts match shape x dtype size, and
// their shapes fit in a tensor's int64 sizes.
#include <cohort/checkpointing/safetensors_header.hpp>

#include <cstdint>
#include <limits>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const file(reinterpret_cast<char const*>(data), size);
  try {
    auto const h = cohort::checkpointing::safetensors::parse_header(file, "fuzz.safetensors");
    if (h.data_start + h.data_bytes != size) __builtin_trap();
    for (auto const& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_bytes) __builtin_trap();  // inside the file
      unsigned __int128 count = 1, extent = 1;
      for (auto d : t.shape) {
        if (d < 0) __builtin_trap();
        count *= static_cast<std::uint64_t>(d);
        if (d != 0) extent *= static_cast<std::uint64_t>(d);
        if (extent > std::numeric_limits<std::int64_t>::max()) __builtin_trap();
      }
      if (count * cohort::checkpointing::safetensors::dtype_bytes(t.dtype) != t.end - t.begin) __builtin_trap();
    }
  } catch (cohort::error const&) {
  }
  return 0;
}
