#pragma once
/// \file
/// IDX files (MNIST, Fashion-MNIST), gzipped or not, read with zlib (gzread reads plain files too).

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::data {

/// An IDX array of unsigned bytes: its dimensions (outermost first) and its elements.
struct idx_array {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Reads an IDX file of unsigned bytes (type 0x08). Throws cohort::error naming the file, the
/// byte offset and the problem: missing file, wrong magic, unsupported element type, short read,
/// trailing bytes.
inline idx_array read_idx(std::filesystem::path const& path) {
  if (!std::filesystem::exists(path))
    throw cohort::error(path.string() + ": no such file: check the path (for Fashion-MNIST: install the "
                        "dataset-fashion-mnist package, or pass the directory that holds the IDX files)");
  if (std::filesystem::is_directory(path))
    throw cohort::error(path.string() + ": a directory, not an IDX file: check the path");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw cohort::error(path.string() + ": cannot open: check its permissions");
  struct closer {
    gzFile f;
    ~closer() { gzclose(f); }
  } close_at_exit{f};
  auto fail = [&](std::int64_t offset, std::string const& what) {
    return cohort::error(path.string() + " at byte " + std::to_string(offset) + ": " + what);
  };
  auto corrupt = [&](std::int64_t offset) {
    int code = 0;
    char const* why = gzerror(f, &code);
    return fail(offset, std::string("corrupt compressed data (zlib: ") + (why ? why : "unknown") + "): the file is damaged");
  };
  unsigned char magic[4];
  if (int n = gzread(f, magic, 4); n != 4) {
    if (n < 0) throw corrupt(0);
    throw fail(0, "short read of the 4-byte magic number: the file is truncated or empty");
  }
  if (magic[0] != 0 || magic[1] != 0)
    throw fail(0, "bad magic number (expected 00 00 <type> <ndims>): not an IDX file");
  if (magic[2] != 0x08)
    throw fail(2, "unsupported element type 0x" + std::string{"0123456789abcdef"[magic[2] >> 4], "0123456789abcdef"[magic[2] & 15]} +
                      ": only unsigned bytes (0x08) are read");
  if (magic[3] < 1 || magic[3] > 8) throw fail(3, "bad dimension count " + std::to_string(magic[3]));
  idx_array out;
  std::int64_t count = 1;
  constexpr std::int64_t max_count = std::int64_t{1} << 48;  // 256 TiB: no real IDX file; keeps the product exact
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw fail(4 + 4 * d, "short read of dimension " + std::to_string(d) + ": the file is truncated");
    out.dims.push_back((std::int64_t{b[0]} << 24) | (std::int64_t{b[1]} << 16) | (std::int64_t{b[2]} << 8) | b[3]);
    if (out.dims.back() != 0 && count > max_count / out.dims.back())
      throw fail(4 + 4 * d, "dimensions multiply to more than 2^48 elements: not a real IDX file");
    count *= out.dims.back();
  }
  std::int64_t const header = 4 + 4 * std::int64_t{magic[3]};
  // The header's count is a claim: memory grows with the bytes actually read (a compressed
  // file's size says nothing of its content), in chunks from 64 KiB doubling up to 64 MiB.
  std::int64_t chunk_bytes = std::int64_t{64} << 10;
  std::int64_t got = 0;
  while (got < count) {
    auto const chunk = std::min(count - got, chunk_bytes);
    chunk_bytes = std::min(chunk_bytes * 2, std::int64_t{64} << 20);
    out.data.resize(static_cast<std::size_t>(got + chunk));
    int n = gzread(f, out.data.data() + got, static_cast<unsigned>(chunk));
    if (n < 0) throw corrupt(header + got);
    if (n == 0)
      throw fail(header + got, "short read: expected " + std::to_string(count) + " data bytes, the file holds " +
                                   std::to_string(got) + ": the file is truncated");
    got += n;
  }
  out.data.resize(static_cast<std::size_t>(got));
  unsigned char extra;
  if (gzread(f, &extra, 1) == 1) throw fail(header + count, "trailing bytes after the " + std::to_string(count) + " data bytes");
  return out;
}

}  // namespace cohort::data
