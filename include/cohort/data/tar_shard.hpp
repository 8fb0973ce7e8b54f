#pragma once
/// \file
/// WebDataset tar shards, read as a stream through libarchive: a shard is a tar file whose members
/// are grouped into samples by key, `000123.jpg` and `000123.cls` being the members "jpg" and
/// "cls" of sample "000123" (WebDataset's rule: the key is the path up to the first dot of its
/// file name, the rest is the member's extension; consecutive members with one key form a sample).
/// Members without an extension and entries that are not regular files are passed over, as
/// WebDataset does. The bytes are untrusted: a member's size is checked before allocation, and a
/// truncated or corrupt tar is a cohort::error naming the shard, the member and the cause.

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::data {

/// One sample of a shard: its key and its members' bytes, by extension, in the order stored.
struct sample {
  std::string shard;  ///< the shard file it was read from (for messages)
  std::string key;    ///< e.g. "000123", or "images/000123" (the path up to the first dot)
  std::vector<std::pair<std::string, std::vector<std::byte>>> members;

  /// The member with extension `ext` ("jpg", "cls", "seg.png"), or nullptr.
  std::vector<std::byte> const* find(std::string_view ext) const {
    for (auto const& [e, bytes] : members)
      if (e == ext) return &bytes;
    return nullptr;
  }
  /// The member with extension `ext`; throws cohort::error naming the shard, the key and the
  /// members the sample has when it is missing.
  std::span<std::byte const> member(std::string_view ext) const {
    if (auto const* b = find(ext)) return *b;
    std::string have;
    for (auto const& m : members) have += (have.empty() ? "" : ", ") + m.first;
    throw cohort::error(shard + ": sample '" + key + "' has no member '" + std::string(ext) + "' (it has " +
                        (have.empty() ? std::string("none") : have) + "): write every sample with its ." +
                        std::string(ext) + " file");
  }
  /// The member `ext` as text (a .cls or .txt member).
  std::string text(std::string_view ext) const {
    auto b = member(ext);
    return {reinterpret_cast<char const*>(b.data()), b.size()};
  }
};

/// Splits a member's path into (key, extension) as WebDataset does; nullopt without an extension.
inline std::optional<std::pair<std::string, std::string>> split_member_name(std::string_view path) {
  auto const slash = path.rfind('/');
  auto const name_at = slash == std::string_view::npos ? 0 : slash + 1;
  auto const dot = path.find('.', name_at);
  if (dot == std::string_view::npos || dot == name_at || dot + 1 == path.size()) return std::nullopt;
  return std::pair{std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

/// Reads one tar shard sample by sample, front to back. Move-only; one thread at a time.
class tar_shard {
 public:
  /// The largest member read into memory by default (a corrupt header cannot make it allocate more).
  static constexpr std::int64_t default_max_member_bytes = std::int64_t{1} << 30;

  /// Opens `path` (plain or gzip-compressed tar). Throws cohort::error naming it when it is
  /// missing or not a tar.
  explicit tar_shard(std::filesystem::path path, std::int64_t max_member_bytes = default_max_member_bytes)
      : path_(std::move(path)), max_member_bytes_(max_member_bytes), a_(archive_read_new(), &archive_read_free) {
    if (!std::filesystem::is_regular_file(path_))
      throw cohort::error(path_.string() + ": shard not found: check the shard list (a glob or a list file)");
    archive_read_support_format_tar(a_.get());
    archive_read_support_filter_gzip(a_.get());
    if (archive_read_open_filename(a_.get(), path_.c_str(), 1 << 16) != ARCHIVE_OK) fail("cannot open");
    file_bytes_ = static_cast<std::int64_t>(std::filesystem::file_size(path_));
  }

  std::filesystem::path const& path() const { return path_; }
  /// Samples read or skipped so far (the ordinal of the next one).
  std::size_t position() const { return position_; }

  /// The next sample, or nullopt at the end of the shard.
  std::optional<sample> next() { return advance(/*keep=*/true); }
  /// Passes over the next sample without reading its members' bytes (the file is seeked past
  /// them); false at the end of the shard.
  bool skip() { return advance(/*keep=*/false).has_value(); }

 private:
  // Reads the next header into (key_, ext_); false at the end of the archive.
  bool next_member() {
    while (!at_end_) {
      archive_entry* entry = nullptr;
      int const rc = archive_read_next_header(a_.get(), &entry);
      if (rc == ARCHIVE_EOF) break;
      if (rc < ARCHIVE_WARN) fail(last_name_.empty() ? std::string("at its start") : "after member '" + last_name_ + "'");
      std::string name = archive_entry_pathname(entry) ? archive_entry_pathname(entry) : "";
      if (archive_entry_filetype(entry) != AE_IFREG) continue;
      auto split = split_member_name(name);
      if (!split) continue;
      size_ = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : -1;
      last_name_ = std::move(name);
      key_ = std::move(split->first);
      ext_ = std::move(split->second);
      return true;
    }
    at_end_ = true;
    return false;
  }

  std::vector<std::byte> read_member() {
    // An uncompressed shard cannot hold a member larger than itself: a corrupt header is refused
    // before it makes us allocate.
    auto const limit = archive_filter_code(a_.get(), 0) == ARCHIVE_FILTER_NONE ? std::min(max_member_bytes_, file_bytes_) : max_member_bytes_;
    if (size_ < 0 || size_ > limit)
      throw cohort::error(path_.string() + ": member '" + last_name_ + "' has a size of " + std::to_string(size_) +
                          " bytes, outside 0.." + std::to_string(limit) + ": the shard is corrupt");
    std::vector<std::byte> bytes(static_cast<std::size_t>(size_));
    std::size_t got = 0;
    while (got < bytes.size()) {
      auto const n = archive_read_data(a_.get(), bytes.data() + got, bytes.size() - got);
      if (n < 0) fail("member '" + last_name_ + "'");
      if (n == 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got != bytes.size())
      throw cohort::error(path_.string() + ": member '" + last_name_ + "': truncated after " + std::to_string(got) + " of " +
                          std::to_string(bytes.size()) + " bytes: the shard is incomplete; write it again");
    return bytes;
  }

  std::optional<sample> advance(bool keep) {
    if (!pending_ && !next_member()) return std::nullopt;
    pending_ = false;
    sample out;
    out.shard = path_.string();
    out.key = key_;
    for (;;) {
      if (keep) out.members.emplace_back(ext_, read_member());
      else if (archive_read_data_skip(a_.get()) < ARCHIVE_WARN) fail("member '" + last_name_ + "'");
      if (!next_member()) break;
      if (key_ != out.key) {
        pending_ = true;  // the first member of the next sample: its header is read
        break;
      }
    }
    ++position_;
    return out;
  }

  [[noreturn]] void fail(std::string const& where) const {
    char const* why = archive_error_string(a_.get());
    throw cohort::error(path_.string() + ": " + where + ": " + (why ? why : "unreadable") +
                        ": the shard is truncated or corrupt; write it again");
  }

  std::filesystem::path path_;
  std::int64_t max_member_bytes_;
  std::int64_t file_bytes_ = 0;
  std::unique_ptr<archive, int (*)(archive*)> a_;
  bool pending_ = false;
  bool at_end_ = false;
  std::string key_, ext_, last_name_;
  std::int64_t size_ = 0;
  std::size_t position_ = 0;
};

/// The samples in the shard at `path`, counted from its headers (the members' bytes are seeked past).
inline std::size_t count_samples(std::filesystem::path const& path) {
  tar_shard t(path);
  while (t.skip()) {
  }
  return t.position();
}

}  // namespace cohort::data
