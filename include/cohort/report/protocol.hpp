#pragma once
/// \file
/// report::protocol: what `ctx.report()` does on one rank during one fit(): the ranks' agreement
/// that they are all at this report, the checkpointed-report protocol (every rank writes into one
/// staging directory, the ranks agree, rank 0 commits; in async mode on the rank's background
/// worker, agreed at the next checkpointed report), a stop signal turned into a stop on every
/// rank, and the tuner's decision. It composes the report's rows (recorder) and rank 0's
/// committed checkpoints (checkpointing::retained).

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/directory_payload.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/checkpointing/retained.hpp"
#include "cohort/checkpointing/staging.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/detail/background_worker.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/error.hpp"
#include "cohort/report/callbacks.hpp"
#include "cohort/report/recorder.hpp"

namespace cohort::report {

/// Thrown by report() on every rank once any rank has received SIGTERM or SIGINT (after the
/// report's checkpoint, if any, is committed); fit() turns it into result::preempted.
struct preempted {
  int signal = 0;
  std::int64_t iteration = 0;
};

/// Thrown by report() on every rank of a trial when the tuner ends it early (a scheduler's stop,
/// pause or exploit, a stopper, or another trial's preemption), after the report's checkpoint, if
/// any, is committed; fit() turns it into result::stopped.
struct stopped_by_tuner {
  std::string reason;
};

/// What a tuner consults after every report (only rank 0 of the trial calls it): given the
/// report's row, it answers {"what": "proceed" | "stop" | "pause" | "exploit" | "preempt", "error": "..."}.
struct listener {
  /// Rank 0 calls it with each report's row; its answer (the tuner's decision) reaches every rank.
  std::function<nlohmann::json(nlohmann::json const& row)> decide{};
  /// Keys added to every row (the trial's attempt count, num_failures).
  nlohmann::json row_keys = nlohmann::json::object();
  /// Where rank 0 writes the trial's files (recorder_options::files): the group's file_writer.
  file_writer* files = nullptr;
  /// Whether a tuner runs this fit as a trial.
  explicit operator bool() const { return static_cast<bool>(decide); }
};

/// How one fit() reports on this rank.
struct protocol_options {
  int rank = 0;                                     ///< in the trainer's communicator
  std::filesystem::path run_path{};                 ///< the run directory (written by rank 0)
  checkpoint_mode mode = checkpoint_mode::sync;     ///< run_config::checkpoint_mode
  report::listener listener{};                      ///< set (on every rank) when a tuner runs this fit as a trial
  callback_runner* callbacks = nullptr;             ///< rank 0 outside a tuner: told of each row and commit
  checkpointing::retained::retain_fn retain{};      ///< the checkpointing policy's decision
  /// Rank 0: validates every committed checkpoint after the report's own validate_fn, if any
  /// (run_config::validators: asks the validator ranks).
  validate_fn validate_every{};
};

/// One rank's reports during one fit(); see the file comment. Only the training thread calls it.
class protocol {
 public:
  /// `control`: the trainer's control communicator (agreements, commits); `steps`: the ranks'
  /// agreement on control flow, which every report starts with. Both outlive the protocol.
  protocol(comm::any& control, cohort::detail::lockstep& steps, protocol_options options)
      : control_(control), steps_(steps), staging_{std::move(options.run_path), {}, options.rank},
        mode_(options.mode), listener_(std::move(options.listener)), callbacks_(options.callbacks),
        validate_every_(std::move(options.validate_every)) {
    checkpoints_.open(staging_.run_path, std::move(options.retain));
  }
  protocol(protocol const&) = delete;
  protocol& operator=(protocol const&) = delete;

  /// Waits for the worker's jobs (the last progress lines and checkpoint writes); then the
  /// members write the events still waiting and wait for the validation and deletion in flight.
  ~protocol() { worker_.wait(); }

  /// The rows: rank 0 opens the run directory through it at setup.
  recorder& rows() { return rows_; }
  recorder const& rows() const { return rows_; }
  /// Rank 0's committed checkpoints (restored at setup, read at the end).
  checkpointing::retained& checkpoints() { return checkpoints_; }
  /// The ranks' agreement on control flow.
  cohort::detail::lockstep& steps() { return steps_; }
  /// Whether a tuner runs this fit as a trial.
  bool under_tuner() const { return static_cast<bool>(listener_); }
  /// Keys the tuner adds to every row of a trial (recorder_options::row_keys).
  nlohmann::json const& row_keys() const { return listener_.row_keys; }
  /// Where a tuner's trial writes its files (recorder_options::files); null outside a tuner.
  file_writer* files() const { return listener_.files; }
  /// The rank's background worker: progress lines and async checkpoint writes.
  cohort::detail::background_worker& worker() { return worker_; }

  /// A prefix unique to this attempt, the same on every rank (staging directories never collide).
  void set_attempt_prefix(std::string const& prefix) {
    staging_.prefix = prefix;
    checkpoints_.set_trash_prefix(prefix);
  }

  /// A report, with a checkpoint when any rank passes `payload`. Collective over every rank:
  /// first the ranks agree (lockstep) that they are all at this report, whether a checkpoint is
  /// passed (then every rank takes the checkpoint path, those without a payload writing nothing)
  /// and whether any rank received a stop signal (then every rank stops here).
  void report(nlohmann::json metrics, checkpoint_payload const* payload, validate_fn const& validate = {}) {
    recorder::check_metrics(metrics);
    using kinds = cohort::detail::checkpoint_kind;
    auto const kind = !payload                                       ? kinds::none
                      : payload->scope == checkpoint_scope::per_rank ? kinds::per_rank
                                                                     : kinds::replicated;
    auto const agreed = steps_.agree_report(kind, comm::detail::stop_signal().load(), rows_.count() + 1);
    if (agreed.any_checkpoint) {
      static checkpoint_payload const nothing{};
      return report_checkpoint(std::move(metrics), payload ? *payload : nothing, validate);
    }
    rows_.record(rows_.is_open() ? rows_.row_of(std::move(metrics)) : nlohmann::json());
    tell_callbacks();
    if (agreed.signal != 0) throw preempted{agreed.signal, rows_.count()};
    consult_listener();
  }

  /// A report with a checkpoint the functor wrote itself as directory `dir`: copied into the
  /// checkpoint (sync, async) or moved there (no_upload); see checkpointing/directory_payload.hpp.
  void report_directory(nlohmann::json metrics, std::filesystem::path const& dir) {
    auto const payload = checkpointing::directory_payload(dir, staging_.run_path, mode_ == checkpoint_mode::no_upload);
    report(std::move(metrics), &payload);
  }

  /// Async mode: waits for this rank's writer, agrees on its outcome, and commits what is still
  /// pending. Collective; fit() calls it after the functor returns. A no-op in sync mode.
  void flush() {
    if (mode_ != checkpoint_mode::async || (!writing_ && !to_commit_)) return;  // same on every rank
    settle_writes();
    std::optional<std::string> err;
    if (rank() == 0 && to_commit_) {
      try {
        commit_now(to_commit_->iteration, to_commit_->row, to_commit_->validate);
      } catch (std::exception const& e) {
        err = e.what();
      }
    }
    to_commit_.reset();
    if (auto e = agree_on(err)) throw cohort::error(*e);
  }

 private:
  /// A checkpoint in async mode: the one this rank's worker is writing, or the one written on
  /// every rank (agreed) that rank 0 commits next.
  struct pending_checkpoint {
    std::int64_t iteration = 0;
    nlohmann::json row;
    validate_fn validate;
  };

  /// Under a tuner: rank 0 hands the last row to the listener, and every rank learns its answer
  /// (one broadcast over the control communicator). A no-op outside a tuner.
  void consult_listener() {
    if (!listener_) return;  // the same on every rank
    nlohmann::json decision;
    if (rank() == 0) {
      try {
        decision = listener_.decide(rows_.history().back());
      } catch (std::exception const& e) {
        decision = {{"what", "error"}, {"error", e.what()}};
      }
    }
    if (control_.size() > 1)
      decision = nlohmann::json::parse(comm::broadcast_string(control_, rank() == 0 ? decision.dump() : std::string{}));
    auto what = decision.value("what", std::string("proceed"));
    if (what == "proceed") return;
    if (what == "error") throw cohort::error(decision.value("error", std::string("the tuner failed")));
    flush();
    throw stopped_by_tuner{what};
  }

  /// A checkpointed report is a step boundary: if any rank received SIGTERM/SIGINT, every rank
  /// commits what is in flight and stops (one small allreduce over the control communicator).
  void stop_if_asked() {
    if (auto s = agreed_stop_signal()) {
      flush();
      throw preempted{s, rows_.count()};
    }
  }

  /// The signal any rank received (0: none), agreed by one small allreduce over control.
  std::int32_t agreed_stop_signal() {
    std::int32_t s = comm::detail::stop_signal().load();
    control_.allreduce(&s, 1, comm::reduce_op::max);
    return s;
  }

  /// A report with a checkpoint. Collective over the control communicator: every rank writes
  /// its files into one staging directory, the ranks agree that all writes succeeded, rank 0
  /// commits (manifest, fsync, rename) and applies the retention policy, and the ranks agree on
  /// the commit. Any failure is a cohort::error on every rank; committed checkpoints are intact.
  /// Rank 0 appends the report's row before it commits, so every committed checkpoint has its row.
  /// In async mode the writing and rank 0's commit run on the worker; the agreement on
  /// checkpoint k happens at the next checkpointed report or at the end of fit (flush()).
  void report_checkpoint(nlohmann::json metrics, checkpoint_payload const& payload, validate_fn const& validate) {
    auto const iteration = rows_.count() + 1;
    nlohmann::json row = rows_.row_of(std::move(metrics));
    if (mode_ == checkpoint_mode::async) return report_checkpoint_async(iteration, std::move(row), payload, validate);
    std::optional<std::string> err;
    try {
      staging_.write(iteration, payload);
    } catch (std::exception const& e) {
      err = e.what();
    }
    if (auto e = agree_on(err)) {
      staging_.undo(iteration, payload);
      throw cohort::error(*e);
    }
    // The row first, then the commit (as in async mode): a crash between the two leaves a row
    // whose checkpoint was never committed, and the resume redoes that iteration; never a
    // committed checkpoint whose row is missing from result.json.
    if (rank() == 0) {
      bool recorded = false;
      try {
        rows_.record(row, nullptr, /*durable=*/true);
        recorded = true;
        commit_now(iteration, row, validate, &payload);
      } catch (std::exception const& e) {
        err = e.what();
        if (!recorded) {  // the row could not be written: nor is the checkpoint committed
          staging_.undo(iteration, payload);
          std::error_code ec;
          std::filesystem::remove_all(staging_.of(iteration), ec);
        }
      }
    } else {
      rows_.record(std::move(row));
    }
    if (auto e = agree_on(err)) throw cohort::error(*e);
    tell_callbacks();
    stop_if_asked();
    consult_listener();
  }

  /// report_checkpoint in async mode: settles the previous checkpoint's write, hands this one's
  /// (and the commit of the previous one) to the worker, and returns.
  void report_checkpoint_async(std::int64_t iteration, nlohmann::json row, checkpoint_payload const& payload,
                               validate_fn const& validate) {
    settle_writes();  // at most one checkpoint in flight
    if (payload.snapshot) payload.snapshot(rank());  // copies (or defers them): training may go on now
    // The collective first, while the ranks are still in step: rank 0's work below (result.json,
    // the console, handing the write over) then holds up no other rank.
    std::int32_t const signal = agreed_stop_signal();
    pending_checkpoint next{iteration, row, validate};
    // The progress line and the events are written by the write's job (after the deferred
    // copies), so this report wakes one thread. A failure here (result.json on a full disk) is
    // thrown after the job is handed over: the checkpoint to commit is committed and the step
    // gate opened, as on every other rank.
    recorder::output output;
    std::exception_ptr record_error;
    try {
      rows_.record(std::move(row), &output, /*durable=*/true);
    } catch (...) {
      record_error = std::current_exception();
    }
    auto commit_first = rank() == 0 ? std::exchange(to_commit_, std::nullopt) : std::nullopt;
    to_commit_.reset();
    writing_ = std::move(next);
    writing_payload_ = payload;
    worker_.start([this, commit_first, iteration, payload, output = std::move(output)]() mutable {
      // The deferred copies first: the training thread's next optimizer step waits for them.
      try {
        if (payload.finish_snapshot) payload.finish_snapshot();
      } catch (std::exception const& e) {
        worker_error_ = std::string("checkpoint ") + checkpointing::dir_name(iteration) + " was not written: " + e.what();
      }
      rows_.write(output);
      try {
        if (commit_first) commit_now(commit_first->iteration, commit_first->row, commit_first->validate);
        if (worker_error_.empty()) staging_.write(iteration, payload);
      } catch (std::exception const& e) {
        if (worker_error_.empty()) worker_error_ = e.what();
      }
    });
    if (record_error) std::rethrow_exception(record_error);
    tell_callbacks();
    if (signal != 0) {  // this checkpoint is the preemption's: committed before stopping
      flush();
      throw preempted{signal, rows_.count()};
    }
    consult_listener();
  }

  /// Rank 0: commits the staging directory of checkpoint `iteration` and lists it. `payload`
  /// (sync mode): undone when the commit fails.
  void commit_now(std::int64_t iteration, nlohmann::json const& row, validate_fn const& validate = {},
                  checkpoint_payload const* payload = nullptr) {
    try {
      checkpointing::commit(staging_.of(iteration), checkpoints_.path_of(iteration),
                            {{"training_iteration", iteration}, {"metrics", row}});
    } catch (std::exception const& e) {
      if (payload) staging_.undo(iteration, *payload);
      std::error_code ec;
      std::filesystem::remove_all(staging_.of(iteration), ec);
      throw cohort::error(std::string("committing checkpoint ") + checkpointing::dir_name(iteration) + " failed: " + e.what());
    }
    checkpoints_.add(iteration, row, checkpointing::validate_both(validate, validate_every_));
    if (!callbacks_) return;
    if (payload) committed_with_row_ = checkpoints_.path_of(iteration);  // sync: told after its row, as Ray
    else callbacks_->checkpoint(callback_id_, checkpoints_.path_of(iteration));  // async: committed later
  }

  /// Rank 0 outside a tuner: the row just recorded, then the checkpoint committed with it, to the
  /// run's callbacks (copies queued).
  void tell_callbacks() {
    if (!callbacks_) return;
    if (rows_.is_open() && !rows_.history().empty()) callbacks_->trial_result(callback_id_, rows_.history().back());
    if (!committed_with_row_.empty()) callbacks_->checkpoint(callback_id_, std::exchange(committed_with_row_, {}));
  }

  /// Joins the writer and agrees on its outcome; what it wrote becomes rank 0's next commit.
  void settle_writes() {
    if (!writing_) return;
    worker_.wait();
    writing_payload_.reset();
    auto written = std::exchange(writing_, std::nullopt);  // settled either way: a failed write is never committed
    std::optional<std::string> err;
    if (!worker_error_.empty()) err = std::exchange(worker_error_, std::string{});
    if (auto e = agree_on(err)) throw cohort::error(*e);
    to_commit_ = std::move(written);
  }

  std::optional<std::string> agree_on(std::optional<std::string> const& local) { return comm::agree_on_error(control_, local); }

  /// This rank in the trainer's communicator.
  int rank() const { return staging_.rank; }

  comm::any& control_;
  cohort::detail::lockstep& steps_;
  checkpointing::staging staging_;  ///< the run directory, this rank, where this attempt stages its checkpoints
  std::string const callback_id_ = staging_.run_path.filename().string();  ///< the run's name, as callbacks know it
  checkpoint_mode mode_ = checkpoint_mode::sync;
  report::listener listener_;
  report::callback_runner* callbacks_;
  std::filesystem::path committed_with_row_;  ///< rank 0, sync mode: told after the report's row
  validate_fn validate_every_;
  checkpointing::retained checkpoints_;  ///< rank 0: retained, oldest first
  /// The rank's one background thread for reports: progress lines and async checkpoint writes,
  /// in order (one wake-up per report). It makes no MPI call. Declared before rows_, whose
  /// console drains it when destroyed.
  cohort::detail::background_worker worker_{"cohort-writer"};
  recorder rows_{worker_};
  std::string worker_error_;  ///< async: the worker's failure, agreed on at settle_writes()
  std::optional<pending_checkpoint> writing_, to_commit_;
  /// The payload the worker is writing, held by the training thread until it has waited for the
  /// writer: what it refers to (a snapshot's references to live tensors) is released here, never
  /// on the writer thread.
  std::optional<checkpoint_payload> writing_payload_;
};

}  // namespace cohort::report
