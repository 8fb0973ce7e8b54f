#pragma once
/// \file
/// The run directory: params.json, result.json (one JSON object per line, one line per report)
/// and progress.csv (flattened keys), laid out as Ray lays out a trial directory. Only the
/// owning rank (rank 0 of a trainer) creates one.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/posix_file.hpp"
#include "cohort/error.hpp"
#include "cohort/report/flatten.hpp"

namespace cohort::report {

/// Writes `text` to `path` atomically: a temporary file in the same directory, then a rename, so
/// a reader never sees a half-written file under the final name.
inline void write_file_atomic(std::filesystem::path const& path, std::string const& text) {
  auto tmp = path;
  tmp += ".tmp";
  std::error_code ec;
  {
    auto out = cohort::detail::posix_file::truncate(tmp, ec);
    if (!ec) ec = out.write(text);
    if (ec) throw cohort::error("could not write " + tmp.string() + " (" + ec.message() + "): check free space and permissions");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw cohort::error("could not rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

/// A run directory owned by one rank: creates it, writes params.json once, then appends one
/// row per report. progress.csv keeps the columns of the first report; when a later report
/// brings new keys the file is rewritten (atomically) with the wider header.
class run_directory {
 public:
  /// Creates `path` (and parents) and writes params.json unless it exists. When the directory
  /// already holds result.json (a rerun of the same run, e.g. a resume), new rows are appended
  /// after the earlier ones, which are never rewritten or dropped. Throws cohort::error with the
  /// cause and the fix when the directory cannot be created or written.
  run_directory(std::filesystem::path path, nlohmann::json const& params) : run_directory(path, make(path)) {
    if (fresh_) write_new(params);
    else read_existing(params);
  }

  /// The directory at `path`, made by make() (`created`: make()'s answer), its files not touched
  /// yet: write_new() or read_existing() comes next, possibly on another thread.
  run_directory(std::filesystem::path path, bool created) : path_(std::move(path)), fresh_(created) {}

  /// Creates `path` (one mkdir when the parent exists, as for a new trial of an experiment; else
  /// the whole chain): true when this call created it. Throws cohort::error with the cause and
  /// the fix when it cannot be created.
  static bool make(std::filesystem::path const& path) {
    std::error_code ec;
    bool created = std::filesystem::create_directory(path, ec);
    if (ec) created = std::filesystem::create_directories(path, ec);
    if (ec || (!created && !std::filesystem::is_directory(path)))
      throw cohort::error("cannot create run directory " + path.string() + " (" +
                          (ec ? ec.message() : std::string("not a directory")) +
                          "): set run_config.storage_path to a writable directory");
    return created;
  }

  /// A directory make() just created: params.json, and result.json and progress.csv created
  /// empty, as Ray creates them when a trial starts (creating a file took the first report ~1-2
  /// ms on ext4: docs/benchmarks.md). Throws cohort::error with the cause and the fix.
  void write_new(nlohmann::json const& params) {
    // Nobody else has seen this directory: a plain write. If it is cut short by a crash, the
    // rerun finds params.json unreadable and writes it again (read_existing).
    std::error_code ec;
    if (auto out = cohort::detail::posix_file::truncate(path_ / "params.json", ec); !ec) ec = out.write(params.dump(2) + "\n");
    if (!ec) result_ = cohort::detail::posix_file::append_to(path_ / "result.json", ec);
    if (!ec) progress_ = cohort::detail::posix_file::truncate(path_ / "progress.csv", ec);
    if (ec)
      throw cohort::error("could not write params.json, result.json and progress.csv in " + path_.string() + " (" +
                          ec.message() + "): check free space and permissions; set run_config.storage_path to a writable directory");
  }

  /// A directory that existed (a rerun of the same run, e.g. a resume): params.json written again
  /// only when unreadable, the rows of result.json taken back; new rows are appended after them.
  void read_existing(nlohmann::json const& params) {
    try {
      std::ifstream existing(path_ / "params.json");
      if (!existing || !nlohmann::json::parse(existing, nullptr, false).is_object())
        write_file_atomic(path_ / "params.json", params.dump(2) + "\n");
    } catch (cohort::error const& e) {
      throw cohort::error(std::string(e.what()) + "; set run_config.storage_path to a writable directory");
    }
    std::ifstream old(path_ / "result.json");
    for (std::string line; std::getline(old, line);) {
      auto row = nlohmann::json::parse(line, nullptr, false);
      if (!row.is_object()) continue;  // a line cut short by a crash
      previous_.push_back(row);
      ++rows_written_;
      for (auto const& [k, v] : flatten(row))
        if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) columns_.push_back(k);
    }
  }

  /// The directory.
  std::filesystem::path const& path() const { return path_; }
  /// True when this object created the directory (a new run: nothing to resume from in it).
  bool fresh() const { return fresh_; }
  /// The rows an earlier attempt of this run left in result.json, oldest first.
  std::vector<nlohmann::json> const& previous_rows() const { return previous_; }

  /// Appends one report (already carrying the auto-filled keys) to result.json and progress.csv.
  void append(nlohmann::json const& row) { append(row, flatten(row)); }

  /// append, given the row already flattened (the recorder flattens each row once, for this and
  /// the progress line).
  void append(nlohmann::json const& row, flat_row const& flat) {
    // The files stay open between reports (a report is one write() each, not an open and close:
    // the tuner's results/s benchmark); each line is written whole, so readers see whole rows.
    write_to(result_, "result.json", opened_as::append, row.dump() + "\n");
    bool widened = false;
    for (auto const& [k, v] : flat)
      if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) {
        columns_.push_back(k);
        widened = true;
      }
    if (widened && rows_written_ == 0) {  // the first row: the header, then the row
      write_to(progress_, "progress.csv", opened_as::empty, header() + csv_row(flat));  // open: created empty
    } else if (widened) {  // rare: every row again, from result.json, under the wider header
      progress_.close();
      std::string all = header();
      std::ifstream rows(path_ / "result.json");
      for (std::string line; std::getline(rows, line);) {
        auto r = nlohmann::json::parse(line, nullptr, false);
        if (r.is_object()) all += csv_row(flatten(r));
      }
      write_file_atomic(path_ / "progress.csv", all);
    } else {
      write_to(progress_, "progress.csv", opened_as::append, csv_row(flat));
    }
    ++rows_written_;
  }

 private:
  using flat_row = std::vector<std::pair<std::string, nlohmann::json>>;
  enum class opened_as { append, empty };

  /// Writes `text` to `file`, first opening `name` in the run directory where it is not open (to
  /// append to, or emptied); throws naming the file and why.
  void write_to(cohort::detail::posix_file& file, char const* name, opened_as how, std::string_view text) {
    auto const path = path_ / name;
    std::error_code ec;
    if (!file.is_open())
      file = how == opened_as::empty ? cohort::detail::posix_file::truncate(path, ec) : cohort::detail::posix_file::append_to(path, ec);
    if (!ec) ec = file.write(text);
    if (ec)
      throw cohort::error((how == opened_as::empty ? "could not write " : "could not append to ") + path.string() + " (" +
                          ec.message() + "): check free space");
  }

  std::string header() const {
    std::string s;
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      if (i) s += ',';
      s += csv_field(columns_[i]);
    }
    s += '\n';
    return s;
  }
  std::string csv_row(flat_row const& r) const {
    std::string s;
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      if (i) s += ",";
      auto it = std::find_if(r.begin(), r.end(), [&](auto const& kv) { return kv.first == columns_[i]; });
      if (it != r.end()) s += csv_field(it->second);
    }
    return s + "\n";
  }

  std::filesystem::path path_;
  std::vector<std::string> columns_;
  std::vector<nlohmann::json> previous_;
  cohort::detail::posix_file result_, progress_;
  std::size_t rows_written_ = 0;  ///< rows in result.json (earlier attempts' included)
  bool fresh_ = false;            ///< make() created the directory
};

}  // namespace cohort::report
