// libFuzzer target: data::tar_shard on arbitrary bytes as a shard file. It must read samples or
// throw cohort::error; every sample has a key and members with extensions, members hold no more
// bytes than the file, and counting the samples by skipping them gives the count read.
#include <cohort/data/tar_shard.hpp>

#include <cstdint>

#include "input_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  auto const& file = input_file(data, size, ".tar");
  std::size_t read = 0;
  bool complete = false;
  try {
    cohort::data::tar_shard t(file);
    std::size_t bytes = 0;
    while (auto s = t.next()) {
      if (s->key.empty() || s->members.empty() || s->shard != file.string()) __builtin_trap();
      for (auto const& [ext, b] : s->members) {
        if (ext.empty()) __builtin_trap();
        bytes += b.size();
      }
      ++read;
    }
    if (bytes > size || t.position() != read) __builtin_trap();
    complete = true;
  } catch (cohort::error const&) {
  }
  if (complete) {
    try {
      if (cohort::data::count_samples(file) != read) __builtin_trap();
    } catch (cohort::error const&) {
      __builtin_trap();  // read whole, it must count whole
    }
  }
  return 0;
}
