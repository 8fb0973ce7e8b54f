#pragma once
// A small reader for (gzipped) IDX files, as MNIST and Fashion-MNIST ship them. zlib's gzread
// reads plain files too. The data layer issue moves this into the library.

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <cohort/error.hpp>

/// An IDX file: its dimensions and its bytes (unsigned 8-bit data only).
struct idx_file {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Reads `path`; throws cohort::error naming the file, the offset and the problem.
inline idx_file read_idx(std::filesystem::path const& path) {
  if (!std::filesystem::exists(path))
    throw cohort::error("data file " + path.string() +
                        " does not exist: install the dataset-fashion-mnist package or pass --data DIR "
                        "(or set FASHION_MNIST_DIR) to a directory holding the IDX files");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw cohort::error("cannot open " + path.string() + ": check its permissions");
  auto fail = [&](std::string const& what, std::int64_t offset) {
    gzclose(f);
    return cohort::error(path.string() + " at byte " + std::to_string(offset) + ": " + what +
                         ": the file is truncated or not an IDX file; download it again");
  };
  unsigned char magic[4];
  if (gzread(f, magic, 4) != 4) throw fail("short read of the magic number", 0);
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4)
    throw fail("bad magic number (expected 00 00 08 <ndims>)", 0);
  idx_file out;
  std::int64_t count = 1;
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw fail("short read of dimension " + std::to_string(d), 4 + 4 * d);
    out.dims.push_back((std::int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
    count *= out.dims.back();
  }
  out.data.resize(static_cast<std::size_t>(count));
  std::int64_t got = 0;
  while (got < count) {
    int chunk = static_cast<int>(std::min<std::int64_t>(count - got, 1 << 30));
    int n = gzread(f, out.data.data() + got, static_cast<unsigned>(chunk));
    if (n <= 0) throw fail("short read: expected " + std::to_string(count) + " data bytes, got " + std::to_string(got), 4 + 4 * magic[3] + got);
    got += n;
  }
  gzclose(f);
  return out;
}
