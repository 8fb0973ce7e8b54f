#pragma once
/// \file
/// A dataset stored as many shard files: the list of shards (from a glob or a list file) and each
/// shard's sample count, so that every rank knows its batch count before an epoch starts. The
/// counts come from `index.json` beside the shards (written by data::shard_writer, or counted
/// once from the shards' headers and cached there); an index entry whose byte size disagrees with
/// its shard is an error, never a silent miscount.

#include <glob.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/data/tar_shard.hpp"
#include "cohort/error.hpp"

namespace cohort::data {

/// The index file's name, beside the shards it describes.
inline constexpr char const* shard_index_name = "index.json";

/// One shard file and what the index says of it.
struct shard_info {
  std::filesystem::path path;
  std::size_t samples = 0;
  std::uintmax_t bytes = 0;
};

namespace detail {

inline nlohmann::json read_index(std::filesystem::path const& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "cohort-shards" || !j.contains("shards") ||
      !j["shards"].is_array())
    throw cohort::error(file.string() + ": not a cohort shard index: remove it, and it is counted again from the shards");
  if (j.value("version", 0) != 1)
    throw cohort::error(file.string() + ": shard index version " + j.value("version", nlohmann::json()).dump() +
                        " is not supported (this cohort reads version 1): remove it to count the shards again");
  return j;
}

/// Writes `entries` (file name -> {samples, bytes}) as `dir`/index.json, atomically (a temporary
/// file renamed over it). False when the directory is not writable (a read-only dataset).
inline bool write_index(std::filesystem::path const& dir, std::map<std::string, shard_info> const& entries) {
  nlohmann::json shards = nlohmann::json::array();
  for (auto const& [name, info] : entries) shards.push_back({{"name", name}, {"samples", info.samples}, {"bytes", info.bytes}});
  auto const tmp = dir / (std::string(shard_index_name) + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    if (!out) return false;
    out << nlohmann::json{{"format", "cohort-shards"}, {"version", 1}, {"shards", shards}}.dump(1) << "\n";
    if (!out) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir / shard_index_name, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

}  // namespace detail

/// The shards of a dataset, in the order listed (a sample's global index counts through them in
/// this order), with their sample counts.
struct shard_set {
  std::vector<shard_info> shards;

  /// Samples in all shards.
  std::size_t size() const {
    std::size_t n = 0;
    for (auto const& s : shards) n += s.samples;
    return n;
  }
  /// Each shard's sample count, in order (what sharding::shards deals).
  std::vector<std::size_t> samples_per_shard() const {
    std::vector<std::size_t> out;
    for (auto const& s : shards) out.push_back(s.samples);
    return out;
  }

  /// The shards at `paths`, counted from the index beside each (or from the shard, once, then
  /// cached in the index where its directory is writable). Throws cohort::error naming the shard
  /// when one is missing, unreadable, or disagrees with its index entry.
  static shard_set from_paths(std::vector<std::filesystem::path> const& paths) {
    if (paths.empty()) throw cohort::error("shard list is empty: give a glob or a list file that names at least one shard");
    shard_set out;
    std::map<std::filesystem::path, std::map<std::string, shard_info>> indexes;  // by directory
    std::map<std::filesystem::path, bool> counted;                               // directories to write back
    for (auto const& p : paths) {
      std::error_code ec;
      auto const bytes = std::filesystem::file_size(p, ec);
      if (ec) throw cohort::error(p.string() + ": shard not found (" + ec.message() + "): check the shard list");
      auto const dir = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
      auto [it, fresh] = indexes.try_emplace(dir);
      if (fresh) {
        auto j = detail::read_index(dir / shard_index_name);
        if (j.contains("shards"))
          for (auto const& e : j["shards"]) {
            if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("samples") ||
                !e["samples"].is_number_unsigned() || !e.contains("bytes") || !e["bytes"].is_number_unsigned())
              throw cohort::error((dir / shard_index_name).string() + ": entry " + e.dump() +
                                  " needs a name, samples and bytes: remove the index to count the shards again");
            it->second[e["name"].get<std::string>()] = {dir / e["name"].get<std::string>(), e["samples"].get<std::size_t>(),
                                                         e["bytes"].get<std::uintmax_t>()};
          }
      }
      auto const name = p.filename().string();
      auto entry = it->second.find(name);
      if (entry == it->second.end()) {
        entry = it->second.emplace(name, shard_info{p, count_samples(p), bytes}).first;
        counted[dir] = true;
      } else if (entry->second.bytes != bytes) {
        throw cohort::error(p.string() + " has " + std::to_string(bytes) + " bytes but " + (dir / shard_index_name).string() +
                            " says " + std::to_string(entry->second.bytes) +
                            ": the index is of another shard; remove the index to count the shards again");
      }
      out.shards.push_back({p, entry->second.samples, bytes});
    }
    for (auto const& [dir, yes] : counted)
      if (yes) detail::write_index(dir, indexes[dir]);  // a cache: a read-only directory is counted each time
    return out;
  }

  /// The shards matching `pattern` (a shell glob, e.g. "data/train-*.tar"), in sorted order.
  static shard_set from_glob(std::string const& pattern) {
    glob_t g{};
    int const rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::filesystem::path> paths;
    if (rc == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (paths.empty()) throw cohort::error("no shard matches '" + pattern + "': check the pattern and the directory");
    return from_paths(paths);  // glob(3) sorts its matches
  }

  /// The shards listed in `list_file`, one path per line (relative paths are relative to the
  /// list file's directory; empty lines and lines starting with '#' are passed over).
  static shard_set from_list_file(std::filesystem::path const& list_file) {
    std::ifstream in(list_file);
    if (!in) throw cohort::error(list_file.string() + ": shard list file not found: check the path");
    std::vector<std::filesystem::path> paths;
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line.front() == '#') continue;
      std::filesystem::path p(line);
      paths.push_back(p.is_absolute() ? p : list_file.parent_path() / p);
    }
    return from_paths(paths);
  }
};

}  // namespace cohort::data
