#pragma once
/// \file
/// TensorBoard event files: every numeric metric of a report as a scalar at its
/// training_iteration, in an `events.out.tfevents.*` file of the run directory that TensorBoard
/// (`tensorboard --logdir <storage_path>`) reads. The encoding is in report/tensorboard_events.hpp;
/// this header names the files and writes them.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/posix_file.hpp"
#include "cohort/report/tensorboard_events.hpp"

namespace cohort::report {

/// Pure: the name of a new events file, as TensorFlow names them:
/// `events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>`. TensorBoard reads the files of a
/// directory in name order and skips a file that sorts before the one it is reading, so the
/// seconds are raised past those of every file in `existing` (the directory's other names): a
/// resumed run's file always comes after the earlier attempts' files, even within one second
/// or with the clock set back.
inline std::string events_file_name(std::int64_t unix_s, std::string_view host, long pid,
                                    std::span<std::string const> existing = {}) {
  static constexpr std::string_view prefix = "events.out.tfevents.";
  for (auto const& name : existing) {
    if (name.size() < prefix.size() + 10 || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::int64_t t = 0;
    bool digits = true;
    for (std::size_t i = prefix.size(); i < prefix.size() + 10; ++i) {
      digits = digits && name[i] >= '0' && name[i] <= '9';
      t = t * 10 + (name[i] - '0');
    }
    if (digits && t >= unix_s) unix_s = t + 1;
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_s));
  return std::string(prefix) + seconds + "." + std::string(host) + "." + std::to_string(pid);
}

/// The wall-clock time now, in seconds since the Unix epoch (an event's wall_time).
inline double wall_time_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Whether a run directory was just created (no earlier events file in it to order after) or
/// existed already (a resume).
enum class directory_age { existing, just_created };

/// The TensorBoard events file of one run directory, written by the rank that owns the
/// directory (rank 0; in fit() on its background thread). Each attempt of a run (a resume)
/// writes a new file: nothing written before is rewritten. No I/O until the first write() or
/// create().
class event_writer {
 public:
  /// Events for `dir`; a directory just created is not listed for earlier events files.
  explicit event_writer(std::filesystem::path dir, directory_age age = directory_age::existing)
      : dir_(std::move(dir)), fresh_(age == directory_age::just_created) {}
  event_writer(event_writer const&) = delete;
  event_writer& operator=(event_writer const&) = delete;

  /// Events the file begins with after its SessionLog START (the HParams session of a trial).
  void set_preamble(std::string events) { preamble_ = std::move(events); }

  /// Seals `records` (from append_unsealed_event) and appends them in one write(); the file is
  /// created at the first call, beginning with its file_version event, a SessionLog START at
  /// the first record's step (session_start_event) and the preamble. A failure prints one warning on stderr and
  /// ends the writing of events; training goes on (result.json has every row).
  void write(std::string& records) {
    if (failed_ || records.empty()) return;
    seal_records(records);
    if (file_.is_open()) return append(records);
    if (!open()) return;
    append(header(first_step(records)) + records);
  }

  /// Creates the file now, as write() would for a first record at `step` (a new run's first
  /// report: 1), so that the first write() only appends: a tuner's trial creates it as it starts,
  /// as Ray does, not as it ends (bench_tune scale/N). Fails as write() does.
  void create(std::int64_t step) {
    if (failed_ || file_.is_open() || !open()) return;
    append(header(step));
  }

  /// The file's path (empty until the first write() or create()).
  std::filesystem::path const& path() const { return path_; }

 private:
  /// The file's first events: its file_version, a SessionLog START at `step`, the preamble.
  std::string header(std::int64_t step) const {
    double const now_s = wall_time_now_s();
    return tfrecord(file_version_event(now_s)) + tfrecord(session_start_event(now_s, step)) + preamble_;
  }

  /// Appends `bytes` in as few write() calls as it takes.
  void append(std::string_view bytes) {
    if (auto ec = file_.write(bytes)) fail(ec.message());
  }

  bool open() {
    std::vector<std::string> existing;
    if (!fresh_) {
      std::error_code ec;
      for (auto const& e : std::filesystem::directory_iterator(dir_, ec)) existing.push_back(e.path().filename().string());
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    auto const now_s = static_cast<std::int64_t>(wall_time_now_s());
    std::error_code ec;
    for (int attempt = 0; attempt < 100 && !file_.is_open(); ++attempt) {  // another file of that name: a later second
      path_ = dir_ / events_file_name(now_s + attempt, host, static_cast<long>(::getpid()), existing);
      file_ = cohort::detail::posix_file::open(path_, O_CREAT | O_EXCL | O_APPEND, ec);
      if (ec != std::errc::file_exists) break;
    }
    if (ec) {
      fail(ec.message());
      return false;
    }
    return true;
  }

  void fail(std::string const& why) {
    failed_ = true;
    std::fputs(("[cohort] warning: TensorBoard events not written to " + path_.string() + ": " + why +
                "; training goes on (result.json has every report)\n").c_str(),
               stderr);
  }

  std::filesystem::path dir_, path_;
  std::string preamble_;  ///< sealed TFRecords
  cohort::detail::posix_file file_;
  bool fresh_ = false;
  bool failed_ = false;
};

}  // namespace cohort::report
