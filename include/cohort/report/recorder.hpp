#pragma once
/// \file
/// report::recorder: the rows of one fit()'s reports on one rank. Every rank counts its reports
/// (fit() checks that all reported equally often); rank 0 also writes them to the run directory
/// (result.json, progress.csv), prints its progress line and appends its TensorBoard events, the
/// last two on the rank's background worker.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/background_worker.hpp"
#include "cohort/error.hpp"
#include "cohort/report/console.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/report/tensorboard.hpp"

namespace cohort::report {

/// What rank 0's recorder writes besides the run directory.
struct recorder_options {
  bool console = false;        ///< a progress line per report (run_config::verbose > 0)
  bool tensorboard = false;    ///< a TensorBoard events file (run_config::tensorboard)
  bool last_row_only = false;  ///< keep only the last row in history() (a tuner keeps the history)
  bool hparams = false;        ///< the events file begins with an HParams session of `params` (a tuner's trial)
  /// Keys added to every row, after the metrics and Ray's auto-filled keys (a tuner's trial: its
  /// attempt count, num_failures).
  nlohmann::json row_keys = nlohmann::json::object();
};

/// The rows of one fit()'s reports on one rank; see the file comment. Not thread-safe: the
/// training thread calls it; what it hands to the worker is the worker's alone.
class recorder {
 public:
  /// What a report leaves for the worker to write: its progress line and TensorBoard events.
  struct output {
    std::string line;    ///< empty: none (no console)
    std::string events;  ///< this report's event, and earlier ones not handed over yet (unsealed TFRecords)
    bool empty() const { return line.empty() && events.empty(); }
  };

  /// Hands its output to `worker`, which must outlive the recorder (its console drains the
  /// worker when destroyed).
  explicit recorder(cohort::detail::background_worker& worker) : worker_(worker) {}
  recorder(recorder const&) = delete;
  recorder& operator=(recorder const&) = delete;

  /// Writes the events still waiting (no console): after every job of the worker, so in order.
  ~recorder() {
    worker_.wait();
    if (events_ && !events_pending_.empty()) events_->write(events_pending_);
  }

  /// Rank 0: opens (or reopens, on resume) the run directory at `path` with the run's `params`,
  /// and the console and events file `options` asks for. Throws cohort::error when the
  /// directory cannot be written.
  void open(std::filesystem::path const& path, nlohmann::json const& params, std::string name, recorder_options options) {
    name_ = std::move(name);
    last_row_only_ = options.last_row_only;
    row_keys_ = std::move(options.row_keys);
    dir_.emplace(path, params);
    if (options.tensorboard) {  // no I/O until the first events
      events_.emplace(path, dir_->fresh() ? directory_age::just_created : directory_age::existing);
      if (options.hparams) events_->set_preamble(tfrecord(hparams_session_start_event(wall_time_now_s(), params)));
    }
    if (options.console) console_.emplace(worker_);  // starts the worker's thread
  }

  /// Every rank, after open(): counts on from `iteration` (a resumed run); rank 0 takes back the
  /// rows of the run directory up to it into history().
  void resume_at(std::int64_t iteration) {
    count_ = iteration;
    if (!dir_) return;
    for (auto const& row : dir_->previous_rows())
      if (row.value("training_iteration", std::int64_t{0}) <= count_) history_.push_back(row);
  }

  /// Rank 0 after open(): the run directory.
  run_directory const& directory() const { return *dir_; }
  /// Whether this rank writes the run's files (rank 0 after open()).
  bool is_open() const { return dir_.has_value(); }
  /// Whether a progress line is printed per report.
  bool has_console() const { return console_.has_value(); }
  /// training_iteration of the last report (continues on resume).
  std::int64_t count() const { return count_; }
  /// Reports recorded by this fit() (not counting a resumed run's earlier ones).
  std::int64_t reports_this_attempt() const { return reports_this_attempt_; }
  /// Rank 0: the rows so far (only the last with last_row_only).
  std::vector<nlohmann::json> const& history() const { return history_; }

  /// Throws cohort::error unless `metrics` is a JSON object (null becomes {}, as Ray's report({})).
  static void check_metrics(nlohmann::json& metrics) {
    if (metrics.is_null()) metrics = nlohmann::json::object();
    if (!metrics.is_object())
      throw cohort::error("report() takes a JSON object of metrics, e.g. ctx.report({{\"loss\", 0.1}}), got: " +
                          metrics.dump());
  }

  /// The row of the next report: the metrics with Ray's auto-filled keys.
  nlohmann::json row_of(nlohmann::json metrics) {
    auto now = std::chrono::steady_clock::now();
    metrics["training_iteration"] = count_ + 1;
    metrics["time_this_iter_s"] = std::chrono::duration<double>(now - last_).count();
    metrics["time_total_s"] = std::chrono::duration<double>(now - start_).count();
    metrics["timestamp"] = static_cast<std::int64_t>(std::time(nullptr));
    for (auto const& [k, v] : row_keys_.items()) metrics[k] = v;
    last_ = now;
    return metrics;
  }

  /// Without a console, events are handed to the worker once this long has passed since the last
  /// hand-over, or once this many bytes wait: a report that wakes no thread for its line does not
  /// wake one for its event either, and reports a second or more apart are still handed over at
  /// once. (Chosen, not tuned: a batch is a few hundred events.)
  static constexpr auto events_hand_over_interval = std::chrono::seconds(1);
  static constexpr std::size_t events_hand_over_bytes = 64 * 1024;

  /// Counts the report; rank 0 appends `row` to the run directory and hands its progress line and
  /// TensorBoard event to the worker (one job: one wake-up), or, given `deferred`, leaves them
  /// there for the caller's job on the worker (write). The event is encoded here (less than
  /// copying the row for the worker would cost) and sealed and written on the worker. Without a
  /// console, events wait (events_hand_over_interval); the last ones are written by ~recorder.
  void record(nlohmann::json row, output* deferred = nullptr) {
    ++count_;
    ++reports_this_attempt_;
    if (!dir_) return;
    auto const flat = flatten(row);  // once, for progress.csv and the progress line
    dir_->append(row, flat);
    output out;
    if (console_) out.line = progress_line_of_flat(name_, flat);
    if (events_) {
      append_unsealed_event(events_pending_, wall_time_now_s(), row);
      if (console_ || deferred || last_ - events_handed_over_ >= events_hand_over_interval ||
          events_pending_.size() >= events_hand_over_bytes) {
        out.events = std::exchange(events_pending_, std::string{});
        events_handed_over_ = last_;
      }
    }
    if (deferred) *deferred = std::move(out);
    else if (!out.empty()) worker_.start([this, out = std::move(out)]() mutable { write(out); });
    if (last_row_only_ && !history_.empty()) history_.back() = std::move(row);
    else history_.push_back(std::move(row));
  }

  /// On the worker: prints a report's line and appends its events. Never throws (the events
  /// writer warns once and stops on a failure).
  void write(output& out) {
    if (!out.line.empty()) console_printer::write_line(out.line);
    if (!out.events.empty()) events_->write(out.events);
  }

 private:
  cohort::detail::background_worker& worker_;
  std::optional<run_directory> dir_;  ///< rank 0 only
  std::string name_;
  bool last_row_only_ = false;
  nlohmann::json row_keys_ = nlohmann::json::object();  ///< recorder_options::row_keys
  std::optional<event_writer> events_;  ///< rank 0 with tensorboard: written on the worker
  std::string events_pending_;          ///< rank 0: encoded events not handed to the worker yet
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
  std::chrono::steady_clock::time_point events_handed_over_ = start_;
  std::optional<console_printer> console_;  ///< rank 0 with a console: the progress lines, on the worker
  std::int64_t count_ = 0;
  std::int64_t reports_this_attempt_ = 0;
  std::vector<nlohmann::json> history_;  ///< rank 0 only; broadcast at the end of fit()
};

}  // namespace cohort::report
