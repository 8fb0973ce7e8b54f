#pragma once
/// \file
/// cohort::context: what a training functor sees of the job (ranks, device, name), and how it
/// reports. One per rank per fit().

#include <chrono>
#include <cstdint>
#include <ctime>
#include <any>
#include <atomic>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/checkpointing/policies.hpp"
#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/detail/background.hpp"
#include "cohort/detail/background_thread.hpp"
#include "cohort/detail/lockstep.hpp"
#include "cohort/detail/stop_signal.hpp"
#include "cohort/error.hpp"
#include "cohort/report/console.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/report/tensorboard.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"
#include "cohort/sharding/datasets.hpp"
#include "cohort/sharding/loader_options.hpp"
#include "cohort/sharding/redeal.hpp"
#include "cohort/torch/model_options.hpp"

namespace cohort {

/// The exit code for a run that stopped because it was asked to (SIGTERM or SIGINT) after
/// committing its checkpoint: EX_TEMPFAIL, "try again". cohort-run reruns it.
inline constexpr int exit_code_preempted = 75;

/// Validates a committed checkpoint (Ray's validate_fn): returns metrics merged into that
/// checkpoint's metrics. Runs on a background thread of rank 0; must not communicate.
using validate_fn = std::function<nlohmann::json(cohort::checkpoint const&)>;

namespace detail {

/// Thrown by report() on every rank once any rank has received SIGTERM or SIGINT (after the
/// report's checkpoint, if any, is committed); fit() turns it into result::preempted.
struct preempted {
  int signal = 0;
  std::int64_t iteration = 0;
};

/// Thrown by report() on every rank of a trial when the tuner ends it early (a scheduler's stop,
/// pause or exploit, a stopper, or another trial's preemption), after the report's checkpoint, if any, is committed; fit()
/// turns it into result::stopped.
struct stopped_by_tuner {
  std::string reason;
};

/// What a tuner consults after every report (only rank 0 of the trial calls it): given the
/// report's row, it answers {"what": "proceed" | "stop" | "pause" | "exploit" | "preempt", "error": "..."}.
using report_listener = std::function<nlohmann::json(nlohmann::json const& row)>;

/// The report bookkeeping of one fit() on one rank. Rank 0 owns the run directory and the
/// checkpoints; every rank counts its reports so fit() can check that all reported equally often.
struct report_state {
  std::optional<report::run_directory> dir;  ///< only on rank 0
  std::string name;
  /// Rank 0 with run_config::tensorboard: the run's events file, written on `worker` (declared
  /// before it, so no job outlives it).
  std::optional<report::event_writer> events;
  /// Rank 0: encoded events not handed to `worker` yet (only without a console: see record()).
  std::string events_pending;
  std::chrono::steady_clock::time_point events_handed_over = std::chrono::steady_clock::now();
  /// The rank's one background thread for reports: progress lines and async checkpoint writes,
  /// in order (one wake-up per report). The writer thread makes no MPI call.
  detail::background_worker worker{"cohort-writer"};
  std::optional<report::console_printer> console;  ///< rank 0 with verbose > 0: the progress lines, on `worker`
  int rank = 0;
  std::filesystem::path run_path;
  std::string staging_prefix;  ///< unique per attempt: staging directories never collide
  comm::any* control = nullptr;
  lockstep* steps = nullptr;  ///< the ranks' agreement on control flow: every report starts with it
  std::function<std::vector<std::size_t>(std::span<checkpointing::record const>)> retain;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last = start;
  std::int64_t count = 0;               ///< training_iteration of the last report (continues on resume)
  std::int64_t reports_this_attempt = 0;
  std::vector<nlohmann::json> history;  ///< rank 0 only; broadcast at the end of fit()
  std::vector<checkpointing::record> checkpoints;  ///< rank 0: retained, oldest first
  checkpoint_mode mode = checkpoint_mode::sync;
  report_listener listener;  ///< set (on every rank) when a tuner runs this fit as a trial
  // Async mode: the checkpoint this rank's writer (`worker`) is writing, and the one written on
  // every rank (agreed) that rank 0 commits next.
  std::string worker_error;
  struct pending_checkpoint {
    std::int64_t iteration = 0;
    nlohmann::json row;
    validate_fn validate;
  };
  std::optional<pending_checkpoint> writing, to_commit;
  /// The payload `worker` is writing, held by the training thread until it has waited for the
  /// writer: what it refers to (a snapshot's references to live tensors) is released here, never
  /// on the writer thread.
  std::optional<checkpoint_payload> writing_payload;
  // Async validation (rank 0): at most one in flight; `checkpoints` is shared with it.
  std::thread validator;
  std::mutex checkpoints_mutex;
  std::vector<std::int64_t> validating_;  ///< checkpoints whose validation has not finished: never deleted
  std::thread reaper;                     ///< deletes dropped checkpoints (rank 0)

  static void check_metrics(nlohmann::json& metrics) {
    if (metrics.is_null()) metrics = nlohmann::json::object();  // `ctx.report({})`, Ray's report({}, None)
    if (!metrics.is_object())
      throw cohort::error("report() takes a JSON object of metrics, e.g. ctx.report({{\"loss\", 0.1}}), got: " +
                          metrics.dump());
  }

  /// The row of the next report: the metrics with Ray's auto-filled keys.
  nlohmann::json row_of(nlohmann::json metrics) {
    auto now = std::chrono::steady_clock::now();
    metrics["training_iteration"] = count + 1;
    metrics["time_this_iter_s"] = std::chrono::duration<double>(now - last).count();
    metrics["time_total_s"] = std::chrono::duration<double>(now - start).count();
    metrics["timestamp"] = static_cast<std::int64_t>(std::time(nullptr));
    last = now;
    return metrics;
  }

  /// What a report leaves for `worker` to write: its progress line and TensorBoard events.
  struct report_output {
    std::string line;    ///< empty: none (no console)
    std::string events;  ///< this report's event, and earlier ones not handed over yet (unsealed TFRecords)
    bool empty() const { return line.empty() && events.empty(); }
  };

  /// Without a console, events are handed to `worker` once this long has passed since the last
  /// hand-over, or once this many bytes wait: a report that wakes no thread for its line does not
  /// wake one for its event either, and reports a second or more apart are still handed over at
  /// once. (Chosen, not tuned: a batch is a few hundred events.)
  static constexpr auto events_hand_over_interval = std::chrono::seconds(1);
  static constexpr std::size_t events_hand_over_bytes = 64 * 1024;

  /// Counts the report; rank 0 appends it to the run directory and hands its progress line and
  /// TensorBoard event to `worker` (one job: one wake-up), or, given `deferred`, leaves them there
  /// for the caller's job on `worker` (write_output). The event is encoded here (less than
  /// copying the row for `worker` would cost: docs/benchmarks.md) and sealed and written on
  /// `worker`. Without a console, events wait in events_pending (events_hand_over_interval); the
  /// last ones are written when fit() ends (~report_state).
  void record(nlohmann::json row, report_output* deferred = nullptr) {
    ++count;
    ++reports_this_attempt;
    if (!dir) return;
    dir->append(row);
    report_output out;
    if (console) out.line = report::progress_line(name, row);
    if (events) {
      report::append_unsealed_event(events_pending, report::wall_time_now_s(), row);
      if (console || deferred || last - events_handed_over >= events_hand_over_interval ||
          events_pending.size() >= events_hand_over_bytes) {
        out.events = std::exchange(events_pending, std::string{});
        events_handed_over = last;
      }
    }
    if (deferred) *deferred = std::move(out);
    else if (!out.empty()) worker.start([this, out = std::move(out)]() mutable { write_output(out); });
    if (listener && !history.empty()) history.back() = std::move(row);  // under a tuner, which keeps the history
    else history.push_back(std::move(row));
  }

  /// On `worker`: prints a report's line and appends its events. Never throws (the events
  /// writer warns once and stops on a failure).
  void write_output(report_output& out) {
    if (!out.line.empty()) report::console_printer::write_line(out.line);
    if (!out.events.empty()) events->write(out.events);
  }

  /// A report, with a checkpoint when any rank passes `payload`. Collective over every rank:
  /// first the ranks agree (lockstep) that they are all at this report, whether a checkpoint is
  /// passed (then every rank takes the checkpoint path, those without a payload writing nothing)
  /// and whether any rank received a stop signal (then every rank stops here).
  void report(nlohmann::json metrics, checkpoint_payload const* payload, validate_fn const& validate = {}) {
    check_metrics(metrics);
    auto const kind = !payload                                           ? checkpoint_kind::none
                      : payload->scope == checkpoint_scope::per_rank ? checkpoint_kind::per_rank
                                                                         : checkpoint_kind::replicated;
    auto const agreed = steps->agree_report(kind, stop_signal().load(), count + 1);
    if (agreed.any_checkpoint) {
      static checkpoint_payload const nothing{};
      return report_checkpoint(std::move(metrics), payload ? *payload : nothing, validate);
    }
    record(dir ? row_of(std::move(metrics)) : nlohmann::json());
    if (agreed.signal != 0) throw preempted{agreed.signal, count};
    consult_listener();
  }

  /// Under a tuner: rank 0 hands the last row to the listener, and every rank learns its answer
  /// (one broadcast over the control communicator). A no-op outside a tuner.
  void consult_listener() {
    if (!listener) return;  // the same on every rank
    nlohmann::json decision;
    if (rank == 0) {
      try {
        decision = listener(history.back());
      } catch (std::exception const& e) {
        decision = {{"what", "error"}, {"error", e.what()}};
      }
    }
    if (control->size() > 1) decision = nlohmann::json::parse(comm::broadcast_string(*control, rank == 0 ? decision.dump() : std::string{}));
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
      throw preempted{s, count};
    }
  }

  /// The signal any rank received (0: none), agreed by one small allreduce over control.
  std::int32_t agreed_stop_signal() {
    std::int32_t s = stop_signal().load();
    control->allreduce(&s, 1, comm::reduce_op::max);
    return s;
  }

  /// A report with a checkpoint. Collective over the control communicator: every rank writes
  /// its files into one staging directory, the ranks agree that all writes succeeded, rank 0
  /// commits (manifest, fsync, rename) and applies the retention policy, and the ranks agree on
  /// the commit. Any failure is a cohort::error on every rank; committed checkpoints are intact.
  /// In async mode the writing and rank 0's commit run on a background thread; the agreement on
  /// checkpoint k happens at the next checkpointed report or at the end of fit (flush()).
  void report_checkpoint(nlohmann::json metrics, checkpoint_payload const& payload, validate_fn const& validate) {
    auto const iteration = count + 1;
    nlohmann::json row = row_of(std::move(metrics));
    if (mode == checkpoint_mode::async) {
      settle_writes();  // at most one checkpoint in flight
      if (payload.snapshot) payload.snapshot(rank);  // copies (or defers them): training may go on now
      // The collective first, while the ranks are still in step: rank 0's work below (result.json,
      // the console, handing the write over) then holds up no other rank.
      std::int32_t const signal = agreed_stop_signal();
      pending_checkpoint next{iteration, row, validate};
      // The progress line and the events are written by the write's job (after the deferred
      // copies), so this report wakes one thread. A failure here (result.json on a full disk) is
      // thrown after the job is handed over: the checkpoint to commit is committed and the step
      // gate opened, as on every other rank.
      report_output output;
      std::exception_ptr record_error;
      try {
        record(std::move(row), &output);
      } catch (...) {
        record_error = std::current_exception();
      }
      auto commit_first = rank == 0 ? std::exchange(to_commit, std::nullopt) : std::nullopt;
      to_commit.reset();
      writing = std::move(next);
      writing_payload = payload;
      worker.start([this, commit_first, iteration, payload, output = std::move(output)]() mutable {
        // The deferred copies first: the training thread's next optimizer step waits for them.
        try {
          if (payload.finish_snapshot) payload.finish_snapshot();
        } catch (std::exception const& e) {
          worker_error = std::string("checkpoint ") + checkpointing::dir_name(iteration) + " was not written: " + e.what();
        }
        write_output(output);
        try {
          if (commit_first) commit_now(commit_first->iteration, commit_first->row, commit_first->validate);
          if (worker_error.empty()) write_now(iteration, payload);
        } catch (std::exception const& e) {
          if (worker_error.empty()) worker_error = e.what();
        }
      });
      if (record_error) std::rethrow_exception(record_error);
      if (signal != 0) {  // this checkpoint is the preemption's: committed before stopping
        flush();
        throw preempted{signal, count};
      }
      consult_listener();
      return;
    }
    std::optional<std::string> err;
    try {
      write_now(iteration, payload);
    } catch (std::exception const& e) {
      err = e.what();
    }
    if (auto e = agree_on(err)) throw cohort::error(*e);
    if (rank == 0) {
      try {
        commit_now(iteration, row, validate);
      } catch (std::exception const& e) {
        err = e.what();
      }
    }
    if (auto e = agree_on(err)) throw cohort::error(*e);
    record(std::move(row));
    stop_if_asked();
    consult_listener();
  }

  /// Async mode: waits for this rank's writer, agrees on its outcome, and commits what is still
  /// pending. Collective; fit() calls it after the functor returns. A no-op in sync mode.
  void flush() {
    if (mode != checkpoint_mode::async || (!writing && !to_commit)) return;  // same on every rank
    settle_writes();
    std::optional<std::string> err;
    if (rank == 0 && to_commit) {
      try {
        commit_now(to_commit->iteration, to_commit->row, to_commit->validate);
      } catch (std::exception const& e) {
        err = e.what();
      }
    }
    to_commit.reset();
    if (auto e = agree_on(err)) throw cohort::error(*e);
  }

  ~report_state() {
    worker.wait();
    // The events still waiting (no console): written here, after every job, so in order; fit()
    // is over, and the writer would have to be woken (or started) and waited for anyway.
    if (events && !events_pending.empty()) events->write(events_pending);
    finish_validation();
    if (reaper.joinable()) reaper.join();
  }

  /// Rank 0: waits for the validation in flight (fit() calls it before listing checkpoints).
  void finish_validation() {
    if (validator.joinable()) validator.join();
  }

  /// Rank 0, after committing checkpoint `iteration`: runs `validate` on a background thread,
  /// writes its metrics to the checkpoint's validation.json, merges them into the checkpoint's
  /// metrics (same key overwrites) and applies the retention policy again, so best-K ranks by
  /// them; until then the checkpoint is not deleted. A validation that throws records {"validation_error": ...} instead; it does not fail
  /// the run.
  void start_validation(std::int64_t iteration, validate_fn validate) {
    {
      std::lock_guard lock(checkpoints_mutex);
      validating_.push_back(iteration);
    }
    finish_validation();  // at most one in flight
    validator = std::thread([this, iteration, validate = std::move(validate)] {
      cohort::detail::begin_background_thread("cohort-validate");
      auto const dir = run_path / checkpointing::dir_name(iteration);
      nlohmann::json m;
      try {
        m = validate(cohort::checkpoint::from_directory(dir));
        if (!m.is_object()) m = {{"validation_error", "validate_fn must return a JSON object, got " + m.dump()}};
      } catch (std::exception const& e) {
        m = {{"validation_error", e.what()}};
      }
      std::lock_guard lock(checkpoints_mutex);
      std::error_code ec;
      if (std::filesystem::exists(dir, ec)) {
        std::ofstream(dir / "validation.json") << m.dump(2) << "\n";
      }
      for (auto& r : checkpoints)
        if (static_cast<std::int64_t>(r.iteration) == iteration) r.metrics.update(m);
      validating_.erase(std::find(validating_.begin(), validating_.end(), iteration));
      apply_retention();
    });
  }

  std::filesystem::path staging_of(std::int64_t iteration) const {
    return run_path / ".staging" / (staging_prefix + checkpointing::dir_name(iteration));
  }

  void write_now(std::int64_t iteration, checkpoint_payload const& payload) {
    try {
      std::error_code ec;
      std::filesystem::create_directories(staging_of(iteration), ec);
      if (ec)
        throw cohort::error("cannot create " + staging_of(iteration).string() + " (" + ec.message() +
                            "): check free space and that run_config.storage_path is writable");
      if (payload.write) payload.write(staging_of(iteration), rank);
    } catch (std::exception const& e) {
      throw cohort::error(std::string("writing checkpoint ") + checkpointing::dir_name(iteration) + " failed: " + e.what());
    }
  }

  /// Rank 0.
  void commit_now(std::int64_t iteration, nlohmann::json const& row, validate_fn const& validate = {}) {
    try {
      checkpointing::commit(staging_of(iteration), run_path / checkpointing::dir_name(iteration),
                            {{"training_iteration", iteration}, {"metrics", row}});
    } catch (std::exception const& e) {
      std::error_code ec;
      std::filesystem::remove_all(staging_of(iteration), ec);
      throw cohort::error(std::string("committing checkpoint ") + checkpointing::dir_name(iteration) + " failed: " + e.what());
    }
    {
      std::lock_guard lock(checkpoints_mutex);
      checkpoints.push_back({static_cast<std::size_t>(iteration), row});
      apply_retention();
    }
    if (validate) start_validation(iteration, validate);
  }

  /// Joins the writer and agrees on its outcome; what it wrote becomes rank 0's next commit.
  void settle_writes() {
    if (!writing) return;
    worker.wait();
    writing_payload.reset();
    auto written = std::exchange(writing, std::nullopt);  // settled either way: a failed write is never committed
    std::optional<std::string> err;
    if (!worker_error.empty()) err = std::exchange(worker_error, std::string{});
    if (auto e = agree_on(err)) throw cohort::error(*e);
    to_commit = std::move(written);
  }

  /// Rank 0, holding checkpoints_mutex: deletes the committed checkpoints the policy does not keep.
  void apply_retention() {
    if (!retain) return;
    auto keep = retain(checkpoints);
    std::vector<checkpointing::record> kept;
    for (std::size_t i = 0; i < checkpoints.size(); ++i) {
      bool const validating = std::find(validating_.begin(), validating_.end(),
                                        static_cast<std::int64_t>(checkpoints[i].iteration)) != validating_.end();
      if (validating || std::find(keep.begin(), keep.end(), i) != keep.end()) {  // ranked once validated
        kept.push_back(checkpoints[i]);
        continue;
      }
      discard(run_path / checkpointing::dir_name(static_cast<std::int64_t>(checkpoints[i].iteration)));
    }
    checkpoints = std::move(kept);
  }

  /// Rank 0, holding checkpoints_mutex: takes a checkpoint the policy dropped out of the run
  /// directory at once (a rename into .trash/) and deletes it on a background thread, so that
  /// deleting a large checkpoint does not hold up training (fit() waits for it at the end).
  void discard(std::filesystem::path const& dir) {
    std::error_code ec;
    auto const trash = run_path / ".trash";
    if (std::filesystem::symlink_status(trash, ec).type() != std::filesystem::file_type::directory) {
      std::filesystem::remove(trash, ec);  // a link (or file) named .trash is never followed, nor emptied
      std::filesystem::create_directory(trash, ec);
    }
    std::filesystem::rename(dir, trash / (staging_prefix + dir.filename().string()), ec);
    if (ec) {  // cannot move it: delete it here
      std::filesystem::remove_all(dir, ec);
      return;
    }
    if (reaper.joinable()) reaper.join();  // one deletion at a time
    reaper = std::thread([trash] {
      cohort::detail::begin_background_thread("cohort-reaper");
      std::error_code e;
      for (auto const& entry : std::filesystem::directory_iterator(trash, e)) std::filesystem::remove_all(entry.path(), e);
    });
  }

  std::optional<std::string> agree_on(std::optional<std::string> const& local) { return comm::agree_on_error(*control, local); }

};

}  // namespace detail

/// What a training functor receives. Valid for the duration of fit(); not copyable.
class context {
 public:
  /// Built by the trainer.
  context(scaling::topology topo, cohort::device dev, int threads, std::string name, std::filesystem::path run_path,
          comm::any& work, detail::report_state& reports,
          sharding::indices_fn shard,
          cohort::datasets const* data = nullptr, std::uint64_t sharding_seed = 0)
      : topo_(topo), device_(dev), threads_(threads), name_(std::move(name)), run_path_(std::move(run_path)),
        comm_(work), reports_(reports), shard_(std::move(shard)), datasets_(data), sharding_seed_(sharding_seed) {}
  context(context const&) = delete;
  context& operator=(context const&) = delete;

  int world_rank() const { return topo_.world_rank; }            ///< rank in the trainer's communicator
  int world_size() const { return topo_.world_size; }            ///< ranks in the trainer's communicator
  int local_rank() const { return topo_.local_rank; }            ///< rank among this node's ranks
  int local_world_size() const { return topo_.local_world_size; }  ///< ranks on this node
  int node_rank() const { return topo_.node_rank; }              ///< this node's index
  int num_nodes() const { return topo_.num_nodes; }              ///< nodes (hosts) the ranks run on
  std::string const& experiment_name() const { return name_; }    ///< the run's name (run_config.name)
  std::filesystem::path const& run_path() const { return run_path_; }  ///< the run directory
  cohort::device device() const { return device_; }               ///< this rank's compute device
  int intra_op_threads() const { return threads_; }               ///< intra-op threads set for this rank

  /// The trainer's communicator (a duplicate of the one fit() was given), for the functor's own
  /// collectives, e.g. averaging an evaluation metric. Collectives must be entered by every rank.
  comm::any& comm() { return comm_; }

  /// Records one round of metrics. Every rank calls it at the same points of its control flow
  /// (a rank that reports more or less often is an error on every rank, see
  /// docs/fault-tolerance.md); rank 0's metrics are recorded, with Ray's auto-filled keys
  /// training_iteration, time_this_iter_s, time_total_s and timestamp, in result.json and
  /// progress.csv. Collective: one small all-reduce (the ranks' agreement on their control flow).
  /// When another rank passes a checkpoint to the same report, this is that checkpointed report.
  void report(nlohmann::json const& metrics) { reports_.report(metrics, nullptr); }

  /// Records metrics with a checkpoint (Ray's `report(metrics, checkpoint=...)`): `payload`
  /// writes this rank's files (rank 0 the replicated state, any rank may add its own) into one
  /// directory, which rank 0 commits atomically as checkpoint_<iteration> and the checkpointing
  /// policy then keeps or deletes. Every rank calls report() here; a replicated checkpoint
  /// (checkpoint_of) may be passed on rank 0 only, the others calling report(metrics), as in Ray;
  /// per-rank state (checkpoint_payload::scope = per_rank) must be passed on every rank.
  /// Collective: the agreement, then two agreements over the trainer's control communicator. A
  /// failed write or commit is a cohort::error on every rank.
  void report(nlohmann::json const& metrics, checkpoint_payload const& payload) { reports_.report(metrics, &payload); }

  /// A report with a checkpoint and its asynchronous validation (Ray's validate_fn): once the
  /// checkpoint is committed, `validate(checkpoint)` runs on a background thread of rank 0 while
  /// training goes on; the metrics it returns are merged into that checkpoint's metrics (same key
  /// overwrites), written to its validation.json, and used by the retention policy (keep_best
  /// can rank by them). result.best_checkpoints shows the merged metrics. One validation at a
  /// time; fit() waits for the last one. `validate` must not communicate; rank 0's is used.
  void report(nlohmann::json const& metrics, checkpoint_payload const& payload, validate_fn validate) {
    reports_.report(metrics, &payload, validate);
  }

  /// The checkpoint this run resumes from: the latest committed checkpoint of this run directory
  /// that verifies against its manifest (or the one named by run_config.resume_from_checkpoint);
  /// nothing on a fresh run. The same on every rank.
  std::optional<cohort::checkpoint> const& checkpoint() const { return resume_; }
  /// Sets the checkpoint to resume from (the trainer does, at the start of fit()).
  void set_resume_checkpoint(std::optional<cohort::checkpoint> c) { resume_ = std::move(c); }

  /// This rank's sample indices of a dataset of `dataset_size` samples in `epoch`, from the
  /// trainer's sharding policy. Every rank gets the same count. No communication.
  std::vector<std::size_t> shard_indices(std::size_t dataset_size, std::int64_t epoch) const {
    return shard_(dataset_size, topo_.world_size, topo_.world_rank, epoch);
  }

  /// The trainer's sharding policy for any world size, and this rank's place in it (what a
  /// loader needs to deal the rest of an epoch again when a job resumes at another world size).
  sharding::rank_shard sharding() const { return {shard_, topo_.world_size, topo_.world_rank}; }

  /// This rank's loader of the trainer's dataset `name` (a cohort::tensor_dataset given through
  /// cohort::datasets): sharded by the trainer's policy, batched, prefetched, on this rank's
  /// device. The same loader on every call, so `for (auto& b : ctx.dataset_shard("train").epoch())`
  /// runs epoch after epoch. Needs LibTorch (cohort/torch/data_loader.hpp). No communication.
  template <class Options = loader_options>
  auto& dataset_shard(std::string const& name, Options const& options = {}) {
    return dataset_shard_for(*this, name, options);  // found by ADL in torch/
  }

  /// The seed of the trainer's sharding policy (0 when it has none).
  std::uint64_t sharding_seed() const { return sharding_seed_; }
  /// The trainer's dataset `name`, or nullptr.
  std::any const* dataset(std::string const& name) const {
    if (!datasets_) return nullptr;
    auto it = datasets_->items.find(name);
    return it == datasets_->items.end() ? nullptr : &it->second;
  }
  /// The names of the trainer's datasets, for messages ("no datasets" when none).
  std::string dataset_names() const {
    std::string s;
    if (datasets_)
      for (auto const& [k, v] : datasets_->items) s += (s.empty() ? "'" : ", '") + k + "'";
    return s.empty() ? std::string("no datasets") : s;
  }
  /// The ranks' agreement on control flow (prepare_model and the gradient reducer take part).
  detail::lockstep& lockstep() { return *reports_.steps; }
  /// How long a collective may wait for the other ranks (run_config::collective_timeout_ms).
  int collective_timeout_ms() const { return collective_timeout_ms_; }
  /// Set by the trainer.
  void set_collective_timeout_ms(int ms) { collective_timeout_ms_ = ms; }

  /// Storage for the loader of dataset `name` (used by dataset_shard).
  std::shared_ptr<void>& loader_slot(std::string const& name) { return loaders_[name]; }

  /// Broadcasts `model`'s parameters and buffers from rank 0, checks that every rank holds the
  /// same layout, and averages gradients over the ranks during backward (bucketed,
  /// non-blocking all-reduces). Needs LibTorch: include cohort/torch/prepare_model.hpp (the
  /// umbrella header does when COHORT_WITH_TORCH is set).
  template <class Module>
  auto prepare_model(Module module, model_options const& options = {}) {
    return prepare_model_for(*this, std::move(module), options);  // found by ADL in torch/
  }

 private:
  scaling::topology topo_;
  cohort::device device_;
  int threads_;
  std::string name_;
  std::filesystem::path run_path_;
  comm::any& comm_;
  detail::report_state& reports_;
  sharding::indices_fn shard_;
  cohort::datasets const* datasets_;
  std::uint64_t sharding_seed_;
  std::map<std::string, std::shared_ptr<void>> loaders_;
  std::optional<cohort::checkpoint> resume_;
  int collective_timeout_ms_ = 600'000;
};

}  // namespace cohort
