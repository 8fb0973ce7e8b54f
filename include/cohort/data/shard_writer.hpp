#pragma once
/// \file
/// cohort::data::shard_writer: samples into WebDataset tar shards (POSIX pax tar through
/// libarchive, readable by WebDataset, Python's tarfile and GNU tar) and the index beside them.

#include <archive.h>
#include <archive_entry.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/data/shard_set.hpp"
#include "cohort/error.hpp"

namespace cohort::data {

/// The knobs of a shard_writer.
struct shard_writer_options {
  std::string prefix = "shard";           ///< shard files are <prefix>-000000.tar, <prefix>-000001.tar, ...
  std::size_t samples_per_shard = 1000;   ///< a new shard after this many samples
  std::uintmax_t max_shard_bytes = 0;     ///< ... or once a shard holds this many bytes (0: no limit)
};

/// Writes samples into numbered tar shards in `dir`, each shard written to a temporary name and
/// renamed when complete, and `dir`/index.json (every shard's sample count and size, beside the
/// entries of other shards it already listed) at close().
/// A sample's members are `<key>.<ext>` in the order given. Move-only; one thread.
class shard_writer {
 public:
  shard_writer(std::filesystem::path dir, shard_writer_options options = {})
      : dir_(std::move(dir)), options_(std::move(options)) {
    if (options_.samples_per_shard == 0) throw cohort::error("shard_writer: samples_per_shard must be positive");
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw cohort::error(dir_.string() + ": cannot create the shard directory (" + ec.message() + ")");
  }
  shard_writer(shard_writer&&) = default;
  ~shard_writer() {
    if (a_) {  // not closed: the partial shard is not renamed into place
      archive_write_free(a_.release());
      std::error_code ec;
      std::filesystem::remove(tmp_path(), ec);
    }
  }

  /// Appends one sample: each member is written as `<key>.<ext>`. The key must not contain a dot
  /// in its file name part (WebDataset splits the key there).
  void write(std::string const& key, std::vector<std::pair<std::string, std::span<std::byte const>>> const& members) {
    if (auto slash = key.rfind('/'); key.find('.', slash == std::string::npos ? 0 : slash) != std::string::npos || key.empty())
      throw cohort::error("shard_writer: key '" + key + "' is empty or has a dot in its name: WebDataset would split it there");
    if (!a_) open_next();
    for (auto const& [ext, bytes] : members) {
      std::unique_ptr<archive_entry, void (*)(archive_entry*)> e(archive_entry_new(), &archive_entry_free);
      archive_entry_set_pathname(e.get(), (key + "." + ext).c_str());
      archive_entry_set_size(e.get(), static_cast<la_int64_t>(bytes.size()));
      archive_entry_set_filetype(e.get(), AE_IFREG);
      archive_entry_set_perm(e.get(), 0644);
      archive_entry_set_mtime(e.get(), 0, 0);  // the same bytes for the same samples
      if (archive_write_header(a_.get(), e.get()) != ARCHIVE_OK) fail();
      if (!bytes.empty() && archive_write_data(a_.get(), bytes.data(), bytes.size()) != static_cast<la_ssize_t>(bytes.size()))
        fail();
      shard_bytes_ += bytes.size();
    }
    ++in_shard_;
    if (in_shard_ >= options_.samples_per_shard || (options_.max_shard_bytes > 0 && shard_bytes_ >= options_.max_shard_bytes))
      close_shard();
  }

  /// Finishes the last shard and writes the index. Returns the shards written.
  shard_set close() {
    if (a_) close_shard();
    std::map<std::string, shard_info> entries;  // other shards the index lists stay listed
    try {
      auto const old = detail::read_index(dir_ / shard_index_name);
      if (old.contains("shards"))
        for (auto const& e : old["shards"])
          entries[e.at("name").get<std::string>()] = {dir_ / e.at("name").get<std::string>(), e.at("samples").get<std::size_t>(),
                                                       e.at("bytes").get<std::uintmax_t>()};
    } catch (std::exception const&) {  // no index, or one not worth keeping: this one replaces it
      entries.clear();
    }
    for (auto const& s : written_.shards) entries[s.path.filename().string()] = s;
    if (!detail::write_index(dir_, entries)) throw cohort::error((dir_ / shard_index_name).string() + ": cannot write the index");
    return written_;
  }

 private:
  std::filesystem::path shard_path(std::size_t n) const {
    char num[16];
    std::snprintf(num, sizeof num, "%06zu", n);
    return dir_ / (options_.prefix + "-" + num + ".tar");
  }
  std::filesystem::path tmp_path() const { return shard_path(written_.shards.size()).string() + ".partial"; }

  void open_next() {
    a_.reset(archive_write_new());
    archive_write_set_format_pax_restricted(a_.get());  // ustar headers, pax only where ustar cannot say it
    if (archive_write_open_filename(a_.get(), tmp_path().c_str()) != ARCHIVE_OK) fail();
    in_shard_ = 0;
    shard_bytes_ = 0;
  }

  void close_shard() {
    auto const tmp = tmp_path(), final_path = shard_path(written_.shards.size());
    if (archive_write_close(a_.get()) != ARCHIVE_OK) fail();
    archive_write_free(a_.release());
    std::filesystem::rename(tmp, final_path);
    written_.shards.push_back({final_path, in_shard_, std::filesystem::file_size(final_path)});
  }

  [[noreturn]] void fail() const {
    char const* why = archive_error_string(a_.get());
    throw cohort::error(tmp_path().string() + ": cannot write the shard: " + (why ? why : "unknown error"));
  }

  struct free_archive {
    void operator()(archive* a) const { archive_write_free(a); }
  };
  std::filesystem::path dir_;
  shard_writer_options options_;
  std::unique_ptr<archive, free_archive> a_;
  std::size_t in_shard_ = 0;
  std::uintmax_t shard_bytes_ = 0;
  shard_set written_;
};

}  // namespace cohort::data
