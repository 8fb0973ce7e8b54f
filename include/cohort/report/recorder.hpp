#pragma once
/// \file
/// report::recorder: the rows of one fit()'s reports on one rank. Every rank counts its reports
/// (fit() checks that all reported equally often); rank 0 also writes them to the run directory
/// (result.json, progress.csv), prints its progress line and appends its TensorBoard events, the
/// last two on the rank's background worker. Under a tuner, a trial's files are written on the
/// group's file_writer instead, one long-lived thread for all its trials.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

/// Pure: whether a tuner's next trial writes its files on the file_writer's thread, given how long
/// the group's last trial took (from opening its run directory to its end). Handing the files over lets a
/// trial that waits (on a timer, on data, on another rank) write them meanwhile; each hand-over
/// costs a thread's wake-up, which on two busy cores cost trials of 0.1-0.2 ms about a quarter
/// more time (`bench_tune`, trials/10000: docs/benchmarks.md), and less than 1% of a trial from
/// 10 ms.
inline bool files_beside_training(std::chrono::steady_clock::duration last_trial) {
  return last_trial >= std::chrono::milliseconds(10);
}

/// Where the files of runs are written, one run after another (a tuner's trials on one group's
/// rank 0): the run directory's params.json, result.json and progress.csv, and its TensorBoard
/// events. For trials long enough (files_beside_training), on one long-lived thread: the training
/// thread hands each report's row over and goes on, so a trial's setup, reports and end do not
/// wait for the disk; for short ones, on the caller's thread as the jobs are started. A run's
/// failure (its first) is its own: end_run() hands it to what follows the run's jobs, and the
/// next run starts meanwhile (a tuner's trial ends once its files are written, or fails with the
/// cause; the next trial does not wait for that).
class file_writer {
 public:
  file_writer() = default;
  file_writer(file_writer const&) = delete;
  file_writer& operator=(file_writer const&) = delete;

  /// A run begins (its run directory opened): end_run() times the run from here.
  void begin_run() {
    if (!run_began_) run_began_ = std::chrono::steady_clock::now();
  }
  /// Runs `job` after the jobs started before it (on the thread, or here); what it throws is
  /// kept as its run's failure (fail()).
  void start(std::function<void()> job) {
    begin_run();
    run_in_order([this, job = std::move(job), run = run_]() {
      set_job_run(run);
      try {
        job();
      } catch (std::exception const& e) {
        fail(e.what());
      } catch (...) {
        fail("writing the run's files failed");
      }
      set_job_run(std::nullopt);
    });
  }
  /// Blocks until every started job has returned.
  void wait() { worker_.wait(); }
  /// `why` fails the run whose job calls it, or else the run being written (only the first
  /// failure of a run is kept).
  void fail(std::string why) {
    std::lock_guard lock(mutex_);
    failures_.try_emplace(job_run_.value_or(run_), std::move(why));
  }
  /// The run's failure, if any, without waiting (the training thread, at each report).
  std::optional<std::string> failure() const { return failure_of(run()); }
  /// Run number `run`'s failure, if any (a job's, of its own run).
  std::optional<std::string> failure_of(std::uint64_t run) const {
    std::lock_guard lock(mutex_);
    auto it = failures_.find(run);
    return it == failures_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  /// The number of the run being written (a job started now belongs to it).
  std::uint64_t run() const {
    std::lock_guard lock(mutex_);
    return run_;
  }

  /// After a run, without waiting for its files: chooses where the next run's files are written
  /// (files_beside_training), and runs `then(failure)` after the run's jobs, on the thread where
  /// they ran, with the run's failure, if any; `here`: on the caller's thread, once they have
  /// run. Jobs started from here on are the next run's.
  void end_run(std::function<void(std::optional<std::string>)> then, bool here = false) {
    std::uint64_t const ended = run();
    if (here) worker_.wait();
    std::function<void()> job = [this, ended, then = std::move(then)]() {
      std::optional<std::string> failure;
      {
        std::lock_guard lock(mutex_);
        if (auto it = failures_.find(ended); it != failures_.end()) {
          failure = std::move(it->second);
          failures_.erase(it);
        }
      }
      then(std::move(failure));
    };
    if (here) job();
    else run_in_order(std::move(job));
    bool const was_beside = beside_;
    if (run_began_) beside_ = files_beside_training(std::chrono::steady_clock::now() - *run_began_);
    run_began_.reset();
    {
      std::lock_guard lock(mutex_);
      ++run_;
    }
    if (was_beside && !beside_) worker_.wait();  // the next run's jobs here: after the thread's
  }
  /// end_run(), waiting for the run's files: their failure, if any.
  std::optional<std::string> settle() {
    std::optional<std::string> out;
    end_run([&out](std::optional<std::string> failure) { out = std::move(failure); }, true);
    return out;
  }
  /// Whether jobs run on the thread now (else on the caller's).
  bool beside_training() const { return beside_; }

 private:
  void run_in_order(std::function<void()> job) {
    if (beside_) worker_.start(std::move(job));
    else job();
  }
  void set_job_run(std::optional<std::uint64_t> run) {
    std::lock_guard lock(mutex_);
    job_run_ = run;
  }

  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::string> failures_;  ///< by run number: the first failure of each run not ended yet
  std::uint64_t run_ = 0;                          ///< the run being written (its jobs' run number)
  std::optional<std::uint64_t> job_run_;           ///< while a job runs: its run's number
  std::optional<std::chrono::steady_clock::time_point> run_began_;  ///< of the run being written
  bool beside_ = false;  ///< the first run's files on the caller's thread: nothing known yet
  cohort::detail::background_worker worker_{"cohort-files"};
};

/// What rank 0's recorder writes besides the run directory.
struct recorder_options {
  bool console = false;        ///< a progress line per report (run_config::verbose > 0)
  bool tensorboard = false;    ///< a TensorBoard events file (run_config::tensorboard)
  bool last_row_only = false;  ///< keep only the last row in history() (a tuner keeps the history)
  bool hparams = false;        ///< the events file begins with an HParams session of `params` (a tuner's trial)
  /// Keys added to every row, after the metrics and Ray's auto-filled keys (a tuner's trial: its
  /// attempt count, num_failures).
  nlohmann::json row_keys = nlohmann::json::object();
  /// Where the run directory's files and events are written (a tuner's group: file_writer);
  /// null: on the training thread (rows) and the fit's worker (events), as outside a tuner.
  file_writer* files = nullptr;
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

  /// Writes the events still waiting (no console): after every job of the worker, so in order;
  /// with a file_writer, hands them to it (written before its next run's files).
  ~recorder() {
    worker_.wait();
    if (files_) {
      try {
        hand_over(*files_);
      } catch (std::exception const& e) {  // no thread for the job: the trial fails with the cause
        files_->fail(std::string("the trial's last rows were not written: ") + e.what());
      }
    } else if (events_ && !events_pending_.empty()) events_->write(events_pending_);
  }

  /// Rank 0: opens (or reopens, on resume) the run directory at `path` with the run's `params`,
  /// and the console and events file `options` asks for. Throws cohort::error when the
  /// directory cannot be written.
  /// With options.files, only the directory is made here; a new run's files are written on the
  /// file_writer (a rerun's, which are read back, here, after its earlier jobs).
  void open(std::filesystem::path const& path, nlohmann::json const& params, std::string name, recorder_options options) {
    name_ = std::move(name);
    last_row_only_ = options.last_row_only;
    row_keys_ = std::move(options.row_keys);
    files_ = options.files;
    if (!files_) {
      dir_ = std::make_shared<run_directory>(path, params);
    } else {
      files_->begin_run();
      dir_ = std::make_shared<run_directory>(path, run_directory::make(path));
      if (!dir_->fresh()) {
        files_->wait();
        dir_->read_existing(params);
      }
    }
    if (options.tensorboard) {  // no I/O until the first events (with a file_writer: the job below)
      events_ = std::make_shared<event_writer>(path, dir_->fresh() ? directory_age::just_created : directory_age::existing);
      if (options.hparams) events_->set_preamble(tfrecord(hparams_session_start_event(wall_time_now_s(), params)));
    }
    if (files_ && dir_->fresh()) {  // the new run's files, the events file with them
      files_->start([dir = dir_, params, events = events_] {
        dir->write_new(params);
        if (events) events->create(1);  // its first report's step
      });
      if (auto failure = files_->failure()) throw cohort::error(*failure);  // written inline: at once
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

  /// Rank 0 after open(): whether open() created the run directory (a new run).
  bool fresh() const { return dir_->fresh(); }
  /// Whether this rank writes the run's files (rank 0 after open()).
  bool is_open() const { return dir_ != nullptr; }
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
  /// With a file_writer, see record_on(): `durable` (a checkpoint's report) puts the row in
  /// result.json before record() returns, so before the checkpoint is committed; a failure the
  /// file_writer kept is thrown at the next report.
  void record(nlohmann::json row, output* deferred = nullptr, bool durable = false) {
    ++count_;
    ++reports_this_attempt_;
    if (!dir_) return;
    if (files_) return record_on(*files_, std::move(row), deferred, durable);
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
    finish(std::move(out), deferred, std::move(row));
  }

  /// On the worker: prints a report's line and appends its events. Never throws (the events
  /// writer warns once and stops on a failure).
  void write(output& out) {
    if (!out.line.empty()) console_printer::write_line(out.line);
    if (!out.events.empty()) events_->write(out.events);
  }

 private:
  /// record() with a file_writer. Writing beside training, rows and events are handed over
  /// together (copies of the rows), at once when the last hand-over is rows_hand_over_interval
  /// old, else in batches (one wake-up, not one per report); ~recorder hands over the rest. Else,
  /// and when `durable`, they are written here after the jobs started before. The progress line
  /// still goes to the worker (or `deferred`).
  void record_on(file_writer& files, nlohmann::json row, output* deferred, bool durable) {
    if (auto failure = files.failure()) throw cohort::error(*failure);
    output out;
    if (console_) out.line = progress_line_of_flat(name_, flatten(row));
    if (events_) append_unsealed_event(events_pending_, wall_time_now_s(), row);
    if (durable || !files.beside_training()) {
      files.wait();
      if (auto failure = files.failure()) throw cohort::error(*failure);
      for (auto const& r : rows_pending_) dir_->append(r);
      rows_pending_.clear();
      dir_->append(row);
      if (events_ && (durable || last_ - events_handed_over_ >= events_hand_over_interval ||
                      events_pending_.size() >= events_hand_over_bytes)) {
        events_->write(events_pending_);
        events_pending_.clear();
        events_handed_over_ = last_;
      }
    } else {
      rows_pending_.push_back(row);
      if (last_ - rows_handed_over_ >= rows_hand_over_interval || rows_pending_.size() >= rows_hand_over_count)
        hand_over(files);
    }
    finish(std::move(out), deferred, std::move(row));
  }

  /// The end of every record(): the progress line to `deferred` or the worker, the row to history().
  void finish(output out, output* deferred, nlohmann::json row) {
    if (deferred) *deferred = std::move(out);
    else if (!out.empty()) worker_.start([this, out = std::move(out)]() mutable { write(out); });
    if (last_row_only_ && !history_.empty()) history_.back() = std::move(row);
    else history_.push_back(std::move(row));
  }

  /// Beside training, rows and events are handed to the file_writer at once when the last
  /// hand-over is this old, else once this many rows wait (a batch per ~millisecond of reports).
  static constexpr auto rows_hand_over_interval = std::chrono::milliseconds(1);
  static constexpr std::size_t rows_hand_over_count = 256;

  /// Hands the rows and events waiting to the file_writer, as one job.
  void hand_over(file_writer& files) {
    rows_handed_over_ = last_;
    if (rows_pending_.empty() && events_pending_.empty()) return;
    files.start([&files, run = files.run(), dir = dir_, events_file = events_, rows = std::move(rows_pending_),
                 events = std::exchange(events_pending_, std::string{})]() mutable {
      if (files.failure_of(run)) return;  // the run has failed: no row or event after the failure
      for (auto const& r : rows) dir->append(r);
      if (!events.empty()) events_file->write(events);  // only events whose rows are written
    });
    rows_pending_.clear();  // moved from: empty again, explicitly
  }

  cohort::detail::background_worker& worker_;
  file_writer* files_ = nullptr;       ///< rank 0 under a tuner: where the files are written
  std::shared_ptr<run_directory> dir_;  ///< rank 0 only; with files_, used on its thread (and here once it is waited for)
  std::string name_;
  bool last_row_only_ = false;
  nlohmann::json row_keys_ = nlohmann::json::object();  ///< recorder_options::row_keys
  std::shared_ptr<event_writer> events_;  ///< rank 0 with tensorboard: written on the worker (or files_)
  std::string events_pending_;          ///< rank 0: encoded events not handed to the worker yet
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
  std::chrono::steady_clock::time_point events_handed_over_ = start_;
  std::optional<console_printer> console_;  ///< rank 0 with a console: the progress lines, on the worker
  std::int64_t count_ = 0;
  std::int64_t reports_this_attempt_ = 0;
  std::vector<nlohmann::json> history_;  ///< rank 0 only; broadcast at the end of fit()
  std::vector<nlohmann::json> rows_pending_;  ///< with files_ beside training: not handed over yet
  std::chrono::steady_clock::time_point rows_handed_over_ = start_;
};

}  // namespace cohort::report
