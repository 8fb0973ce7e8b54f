#pragma once
/// \file
/// Checkpoints on disk: a directory `checkpoint_<iteration>` committed atomically (files written
/// into a staging directory, fsynced, listed with size and XXH3-64 checksum in manifest.json, then
/// renamed),
/// verified against its manifest when loaded.

#include <fcntl.h>
#include <unistd.h>
#define XXH_INLINE_ALL  // header-only use of xxHash: nothing to link
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"

namespace cohort {

/// A committed checkpoint directory. Cheap to copy (a path).
class checkpoint {
 public:
  /// Refers to `dir` (not verified; see checkpointing::verify).
  static checkpoint from_directory(std::filesystem::path dir) { return checkpoint(std::move(dir)); }

  /// The directory.
  std::filesystem::path const& path() const { return dir_; }
  /// Scoped access to the files: checkpoints live on a filesystem every rank can read, so this
  /// is the directory itself; valid while the checkpoint is retained.
  std::filesystem::path const& as_directory() const { return dir_; }
  /// The metadata stored at commit (training_iteration, metrics, and what the writer added).
  nlohmann::json metadata() const {
    std::ifstream in(dir_ / "manifest.json");
    auto m = nlohmann::json::parse(in, nullptr, false);
    return m.is_object() && m.contains("metadata") ? m["metadata"] : nlohmann::json::object();
  }

 private:
  explicit checkpoint(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::filesystem::path dir_;
};

namespace checkpointing {

/// The manifest format this build writes and reads.
inline constexpr int manifest_format = 1;

/// The directory name of the checkpoint of report `iteration`: checkpoint_000042.
inline std::string dir_name(std::int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "checkpoint_%06lld", static_cast<long long>(iteration));
  return buf;
}

/// Streaming XXH3-64 (xxHash): the checksum of checkpoint files (chosen over CRC-32 for speed:
/// docs/benchmarks.md).
class hasher {
 public:
  hasher() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  hasher(hasher const&) = delete;
  hasher& operator=(hasher const&) = delete;
  ~hasher() { XXH3_freeState(state_); }
  void update(void const* data, std::size_t n) { XXH3_64bits_update(state_, data, n); }
  /// The digest as 16 hex digits.
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(state_)));
    return buf;
  }

 private:
  XXH3_state_t* state_;
};

/// XXH3-64 of a file's bytes, as 16 hex digits.
inline std::string file_hash(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw cohort::error("cannot read " + p.string());
  hasher h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (auto n = in.gcount(); n > 0) h.update(buf.data(), static_cast<std::size_t>(n));
  }
  return h.hex();
}

/// fsync of a file or a directory; throws cohort::error on failure (e.g. a full disk).
inline void fsync_path(std::filesystem::path const& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw cohort::error("cannot open " + p.string() + " to sync it");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw cohort::error("fsync of " + p.string() + " failed: check free space");
}

namespace detail {

/// What write_checked knows of a file it wrote, for commit(): its checksum, its size and
/// whether it is already synced. Keyed by path; commit() takes the entries of its files out.
struct written_file {
  std::string xxh3;
  std::uint64_t size = 0;
  bool synced = false;
};

inline std::mutex& written_mutex() {
  static std::mutex m;
  return m;
}
inline std::map<std::string, written_file>& written_files() {
  static std::map<std::string, written_file> files;
  return files;
}

/// The record write_checked left for `path` (removed from the registry), if any.
inline std::optional<written_file> take_written(std::filesystem::path const& path) {
  std::lock_guard lock(written_mutex());
  auto& files = written_files();
  auto it = files.find(path.string());
  if (it == files.end()) return std::nullopt;
  auto out = it->second;
  files.erase(it);
  return out;
}

/// Starts writing `fd`'s dirty pages to the disk without waiting for them (Linux:
/// sync_file_range). With delayed allocation their blocks are allocated now, so the next fsync in
/// the same directory carries them (ext4 with a journal: in the same commit); elsewhere a no-op,
/// and fsync does it all.
inline void start_writeback(int fd) {
#if defined(__linux__)
  ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd;
#endif
}

/// start_writeback of the file (or directory: a no-op) at `p`, if it can be opened.
inline void start_writeback(std::filesystem::path const& p) {
  if (int fd = ::open(p.c_str(), O_RDONLY); fd >= 0) {
    start_writeback(fd);
    ::close(fd);
  }
}

/// fsyncs `paths` (files and directories) concurrently, on up to 8 threads: their metadata
/// writes (one journal commit where there is a journal) and the disk's cache flushes are then
/// shared, where one fsync after another paid for each (docs/benchmarks.md). Throws
/// cohort::error naming the first path that failed.
inline void sync_together(std::vector<std::filesystem::path> const& paths) {
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::optional<std::string> failure;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < paths.size();) {
      try {
        fsync_path(paths[i]);
      } catch (cohort::error const& e) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 1; t < std::min<std::size_t>(paths.size(), 8); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (failure) throw cohort::error(*failure);
}

/// Starts the write-back of the files write_checked wrote into `dir` and has not synced, so that
/// the next fsync in `dir` commits their blocks too.
inline void start_writeback_of_unsynced(std::filesystem::path const& dir) {
  std::vector<std::filesystem::path> paths;
  {
    std::lock_guard lock(written_mutex());
    for (auto const& [path, file] : written_files())
      if (std::filesystem::path p(path); !file.synced && p.parent_path() == dir) paths.push_back(std::move(p));
  }
  for (auto const& p : paths) start_writeback(p);
}

}  // namespace detail

/// Files of at least this many bytes are fsynced by write_checked itself, overlapped with their
/// checksum; smaller ones by commit().
inline constexpr std::size_t large_file_bytes = std::size_t{1} << 20;

/// Writes pieces of memory, in order, to `path`, fsyncs it when it is large (else commit() does),
/// and records its checksum and size for commit(), which then neither reads the file back nor
/// syncs it again. Throws cohort::error naming the file (a full disk, a file size limit).
inline void write_checked(std::filesystem::path const& path, std::vector<std::pair<void const*, std::size_t>> const& pieces) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw cohort::error("cannot create " + path.string() + ": check permissions");
  std::size_t total = 0;
  for (auto const& [data, n] : pieces) {
    auto const* p = static_cast<unsigned char const*>(data);
    std::size_t done = 0;
    while (done < n) {
      auto w = ::write(fd, p + done, std::min<std::size_t>(n - done, std::size_t{1} << 24));
      if (w <= 0) {
        ::close(fd);
        throw cohort::error("could not write " + path.string() + " (" + std::to_string(total + done) +
                            " bytes written): check free space");
      }
      done += static_cast<std::size_t>(w);
    }
    total += n;
  }
  hasher h;
  if (total < large_file_bytes) {
    for (auto const& [data, n] : pieces) h.update(data, n);
  } else {
    // A large file: its checksum is computed from memory while fsync waits for the disk, and the
    // small files written before it go to the disk with it (their write-back started first).
    // Hashing while writing instead cost more on a busy machine (docs/benchmarks.md).
    detail::start_writeback_of_unsynced(path.parent_path());
    std::thread hashing([&] {
      for (auto const& [data, n] : pieces) h.update(data, n);
    });
    int const synced = ::fsync(fd);
    hashing.join();
    if (synced != 0) {
      ::close(fd);
      throw cohort::error("fsync of " + path.string() + " failed: check free space");
    }
  }
  ::close(fd);
  std::lock_guard lock(detail::written_mutex());
  detail::written_files()[path.string()] = {h.hex(), total, total >= large_file_bytes};
}

/// write_checked of one piece of memory.
inline void write_checked(std::filesystem::path const& path, void const* data, std::size_t n) {
  write_checked(path, std::vector<std::pair<void const*, std::size_t>>{{data, n}});
}

/// Commits `staging` as `final`: lists every regular file under it (relative path, size, XXH3-64
/// checksum; as write_checked recorded it, else computed from the file) with `metadata` in
/// manifest.json, makes the files (but those write_checked synced), the manifest and the
/// directories durable, renames `staging` to `final` and fsyncs the parent. A crash at any point
/// leaves either no `final` or a complete one. Throws cohort::error on any failure: before the
/// rename (a write, a file's or directory's fsync) it leaves no `final`; when only the last fsync
/// (of the parent, after the rename) fails, `final` is complete and verifies, but its name may not
/// survive a power cut.
inline void commit(std::filesystem::path const& staging, std::filesystem::path const& final_dir,
                   nlohmann::json const& metadata) {
  namespace fs = std::filesystem;
  nlohmann::json files = nlohmann::json::array();
  std::vector<fs::path> dirs{staging};
  std::vector<fs::path> to_sync;  // what write_checked did not sync, the manifest, the directories
  for (auto const& e : fs::recursive_directory_iterator(staging)) {
    if (e.is_directory()) dirs.push_back(e.path());
    if (!e.is_regular_file()) continue;
    auto const size = static_cast<std::uint64_t>(e.file_size());
    auto const known = detail::take_written(e.path());
    bool const recorded = known && known->size == size;
    std::string const hash = recorded ? known->xxh3 : file_hash(e.path());  // else not written by write_checked
    files.push_back({{"name", e.path().lexically_relative(staging).generic_string()}, {"size", size}, {"xxh3", hash}});
    if (recorded && known->synced) continue;
    to_sync.push_back(e.path());
    // A small file's blocks are allocated now, in the transaction the fsyncs below commit (a large
    // one's write-back started early would go out as slower background writes).
    if (size < large_file_bytes) detail::start_writeback(e.path());
  }
  {
    std::ofstream out(staging / "manifest.json", std::ios::trunc);
    out << nlohmann::json{{"format", manifest_format}, {"files", files}, {"metadata", metadata}}.dump(2) << "\n";
    out.flush();
    if (!out) throw cohort::error("could not write " + (staging / "manifest.json").string() + ": check free space");
  }
  to_sync.push_back(staging / "manifest.json");
  to_sync.insert(to_sync.end(), dirs.begin(), dirs.end());
  detail::sync_together(to_sync);
  std::error_code ec;
  fs::rename(staging, final_dir, ec);
  if (ec) throw cohort::error("could not commit " + final_dir.string() + ": " + ec.message());
  fsync_path(final_dir.parent_path());
}

/// Pure: why `name`, a file name listed in a manifest, is not a safe name inside its checkpoint
/// directory; nothing when it is. Safe: a relative path of plain components separated by '/'
/// (a subfolder the writer made), none of them empty, "." or "..", without NUL or backslash.
/// A checkpoint directory may come from another user or job: its manifest must never lead outside it.
inline std::optional<std::string> unsafe_name(std::string const& name) {
  if (name.empty()) return std::string("an empty file name");
  if (name.find('\0') != std::string::npos) return std::string("a file name with a NUL byte");
  if (name.find('\\') != std::string::npos) return "file name '" + name + "' has a backslash";
  if (name.front() == '/') return "file name '" + name + "' is absolute";
  for (std::size_t start = 0; start <= name.size();) {
    auto const end = std::min(name.find('/', start), name.size());
    auto const part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..")
      return "file name '" + name + "' has a '" + part + "' component (it must stay inside the checkpoint directory)";
    start = end + 1;
  }
  return std::nullopt;
}

/// Checks a checkpoint directory against its manifest: nothing when the manifest is of a known
/// format and every listed file exists inside the directory (no symbolic link on the way) with
/// its size and checksum; else what is wrong, naming the file and the field. Reads nothing
/// outside `dir`.
inline std::optional<std::string> verify(std::filesystem::path const& dir) {
  namespace fs = std::filesystem;
  auto const manifest = (dir / "manifest.json").string();
  std::error_code ec;
  if (auto const t = fs::status(dir, ec).type(); t == fs::file_type::not_found)
    return dir.string() + ": does not exist";
  else if (t != fs::file_type::directory)
    return dir.string() + ": not a directory";
  if (fs::symlink_status(dir / "manifest.json", ec).type() != fs::file_type::regular)
    return dir.string() + ": no manifest.json (an uncommitted or foreign directory)";
  std::ifstream in(dir / "manifest.json");
  if (!in) return manifest + ": cannot be read";
  auto m = nlohmann::json::parse(in, nullptr, false);
  if (m.is_discarded()) return manifest + ": not valid JSON";
  if (!m.is_object()) return manifest + ": not a JSON object";
  if (!m.contains("format") || !m["format"].is_number_integer())
    return manifest + ": field 'format' is missing or not an integer";
  if (m["format"] != manifest_format)
    return manifest + ": format " + m["format"].dump() + " is not one this build reads (" + std::to_string(manifest_format) +
           "): written by another cohort version; resume with that version or from another checkpoint";
  if (!m.contains("files") || !m["files"].is_array()) return manifest + ": field 'files' is missing or not a list";
  for (auto const& f : m["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      return manifest + ": an entry of 'files' has no string 'name'";
    auto const name = f["name"].get<std::string>();
    if (auto why = unsafe_name(name)) return manifest + ": " + *why;
    if (!f.contains("size") || !f["size"].is_number_unsigned())
      return manifest + ": entry '" + name + "': field 'size' is missing or not a byte count";
    if (!f.contains("xxh3") || !f["xxh3"].is_string())
      return manifest + ": entry '" + name + "': field 'xxh3' is missing or not a string";
    auto const p = dir / name;
    // Every component must be what it says, not a link that could lead elsewhere.
    fs::path at = dir;
    for (auto const& part : fs::path(name)) {
      at /= part;
      auto const type = fs::symlink_status(at, ec).type();
      bool const last = at == p;
      if (type == fs::file_type::not_found || ec) return p.string() + ": listed in the manifest but missing";
      if (type == fs::file_type::symlink) return at.string() + ": a symbolic link (a checkpoint holds plain files only)";
      if (last && type != fs::file_type::regular) return p.string() + ": not a regular file";
      if (!last && type != fs::file_type::directory) return at.string() + ": not a directory";
    }
    auto size = fs::file_size(p, ec);
    if (ec) return p.string() + ": listed in the manifest but missing";
    if (size != f["size"].get<std::uint64_t>())
      return p.string() + ": " + std::to_string(size) + " bytes, the manifest says " + f["size"].dump() + " (truncated?)";
    if (file_hash(p) != f["xxh3"].get<std::string>()) return p.string() + ": checksum does not match the manifest";
  }
  return std::nullopt;
}

/// The committed checkpoint directories under `run_dir`, oldest first (by iteration).
inline std::vector<std::filesystem::path> committed(std::filesystem::path const& run_dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (auto const& e : std::filesystem::directory_iterator(run_dir, ec)) {
    auto name = e.path().filename().string();
    // A link named like a checkpoint is not one of this run's: never resumed from or deleted.
    if (e.is_directory() && !e.is_symlink() && name.rfind("checkpoint_", 0) == 0 && name.size() == 17) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The newest checkpoint under `run_dir` that verifies; each newer one that does not is skipped
/// with a one-line warning on `warnings` naming it and the problem.
inline std::optional<checkpoint> latest_good(std::filesystem::path const& run_dir, std::ostream* warnings = nullptr) {
  auto all = committed(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto problem = verify(*it);
    if (!problem) return checkpoint::from_directory(*it);
    if (warnings) *warnings << "[cohort] warning: skipping checkpoint " << it->string() << ": " << *problem << "\n";
  }
  return std::nullopt;
}

}  // namespace checkpointing
}  // namespace cohort
