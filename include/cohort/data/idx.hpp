#pragma once
/// \file
/// IDX files (MNIST, Fashion-MNIST), gzipped or not, read with zlib (gzread reads plain files too).
/// A gzipped file is decompressed once and its plain copy kept in a cache folder (idx_cache_dir):
/// inflating Fashion-MNIST's 47 MB of training images took 0.44 s of every launch, reading the
/// copy a few milliseconds.

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::data {

/// An IDX array of unsigned bytes: its dimensions (outermost first) and its elements.
struct idx_array {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Where read_idx keeps plain copies of gzipped IDX files: $COHORT_CACHE_DIR/idx, else
/// $XDG_CACHE_HOME/cohort/idx, else $HOME/.cache/cohort/idx; none (every read inflates) when
/// COHORT_CACHE_DIR is set but empty, or no home is known.
inline std::filesystem::path idx_cache_dir() {
  auto env = [](char const* name) -> std::string_view {
    char const* v = std::getenv(name);
    return v ? v : std::string_view{};
  };
  if (std::getenv("COHORT_CACHE_DIR")) {
    auto const dir = env("COHORT_CACHE_DIR");
    return dir.empty() ? std::filesystem::path{} : std::filesystem::path(dir) / "idx";
  }
  if (!env("XDG_CACHE_HOME").empty()) return std::filesystem::path(env("XDG_CACHE_HOME")) / "cohort" / "idx";
  if (!env("HOME").empty()) return std::filesystem::path(env("HOME")) / ".cache" / "cohort" / "idx";
  return {};
}

/// Pure: the name of the plain copy of gzipped IDX file `path` (absolute) of `bytes` bytes last
/// written at `mtime_ns`: "train-images-idx3-ubyte-<hash of the path>-<bytes>-<mtime>". A file
/// rewritten or replaced gets a new name; the old copy is simply no longer read.
inline std::string idx_cache_name(std::filesystem::path const& path, std::uintmax_t bytes, std::int64_t mtime_ns) {
  auto stem = path.filename().string();
  if (stem.size() > 3 && stem.ends_with(".gz")) stem.resize(stem.size() - 3);
  return stem + "-" + std::to_string(std::hash<std::string>{}(path.string())) + "-" + std::to_string(bytes) + "-" +
         std::to_string(static_cast<std::uint64_t>(mtime_ns));  // the file clock's epoch may lie after the time
}

namespace detail {

/// The IDX parser over an open zlib stream (gzipped or plain); `path` names the file in errors.
inline idx_array parse_idx(gzFile f, std::filesystem::path const& path);

/// Writes `a` as a plain IDX file at `to`, through a temporary file and a rename (ranks of one
/// node may do it at once; a reader sees the whole copy or none). Best effort: false on failure.
inline bool write_idx_copy(idx_array const& a, std::filesystem::path const& to) {
  std::error_code ec;
  std::filesystem::create_directories(to.parent_path(), ec);
  auto const tmp = to.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    unsigned char const head[4] = {0, 0, 0x08, static_cast<unsigned char>(a.dims.size())};
    out.write(reinterpret_cast<char const*>(head), 4);
    for (auto d : a.dims) {
      unsigned char const b[4] = {static_cast<unsigned char>(d >> 24), static_cast<unsigned char>(d >> 16),
                                  static_cast<unsigned char>(d >> 8), static_cast<unsigned char>(d)};
      out.write(reinterpret_cast<char const*>(b), 4);
    }
    out.write(reinterpret_cast<char const*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
    if (!out.flush()) {
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, to, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

/// Opens `path` with zlib and parses it.
inline idx_array read_idx_file(std::filesystem::path const& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw cohort::error(path.string() + ": cannot open: check its permissions");
  struct closer {
    gzFile f;
    ~closer() { gzclose(f); }
  } close_at_exit{f};
  gzbuffer(f, 1 << 20);  // zlib's 8 KiB default costs a read call per 8 KiB
  return parse_idx(f, path);
}

}  // namespace detail

/// Reads an IDX file of unsigned bytes (type 0x08), gzipped or not; a gzipped one through its
/// plain copy in idx_cache_dir(), made on the first read (a copy that does not parse is made
/// again). Throws cohort::error naming the file, the byte offset and the problem: missing file,
/// wrong magic, unsupported element type, short read, trailing bytes.
inline idx_array read_idx(std::filesystem::path const& path) {
  if (!std::filesystem::exists(path))
    throw cohort::error(path.string() + ": no such file: check the path (for Fashion-MNIST: install the "
                        "dataset-fashion-mnist package, or pass the directory that holds the IDX files)");
  if (std::filesystem::is_directory(path))
    throw cohort::error(path.string() + ": a directory, not an IDX file: check the path");
  std::error_code ec;
  auto const dir = path.extension() == ".gz" ? idx_cache_dir() : std::filesystem::path{};
  if (dir.empty()) return detail::read_idx_file(path);
  auto const absolute = std::filesystem::absolute(path, ec);
  auto const bytes = std::filesystem::file_size(path, ec);
  auto const mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return detail::read_idx_file(path);
  auto const copy = dir / idx_cache_name(absolute, bytes,
                                         std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count());
  if (std::filesystem::exists(copy, ec)) {
    try {
      return detail::read_idx_file(copy);
    } catch (cohort::error const&) {  // damaged or cut short: made again below
    }
  }
  auto out = detail::read_idx_file(path);
  detail::write_idx_copy(out, copy);
  return out;
}

namespace detail {

inline idx_array parse_idx(gzFile f, std::filesystem::path const& path) {
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
  // file's size says nothing of its content), in chunks from 64 KiB doubling up to 64 MiB. A
  // plain file (the gzipped files' copy) whose size is header plus count is read in one piece:
  // the chunks' growth cost the 47 MB of Fashion-MNIST's training images 0.075 s, a third of
  // what reading and converting them took at launch.
  std::int64_t chunk_bytes = std::int64_t{64} << 10;
  std::error_code size_error;
  if (gzdirect(f) == 1 && std::filesystem::file_size(path, size_error) == static_cast<std::uintmax_t>(header + count) &&
      !size_error && count > 0)
    chunk_bytes = count;
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

}  // namespace detail

}  // namespace cohort::data
