#pragma once
/// \file
/// The tuner's coordinator: the thread on rank 0 that owns the trial table, the searcher, the
/// scheduler and the stoppers, answers the group leaders and writes experiment_state.json.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/detail/utc_stamp.hpp"
#include "cohort/error.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/report/trial_table.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/messages.hpp"
#include "cohort/tuning/result_grid.hpp"
#include "cohort/tuning/search_space.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

/// The id of the n-th trial: trial_00000, trial_00001, ...
inline std::string trial_id(std::size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "trial_%05zu", n);
  return buf;
}

/// Rank 0's coordinator: the trial table, the searcher, the scheduler and the stoppers, behind
/// one mutex. The thread in serve() answers the other group leaders over MPI; rank 0's own
/// group calls the local_* functions directly. Every decision is logged in the trial table and
/// written to experiment_state.json at most every state_interval_s (and at the end), so a
/// rerun resumes the experiment.
template <class Searcher, class Scheduler, class Stoppers>
class coordinator {
 public:
  coordinator(Searcher searcher, Scheduler scheduler, Stoppers stoppers, tune_config cfg, std::filesystem::path exp,
              std::vector<int> leaders, MPI_Comm comm, int verbose)
      : searcher_(std::move(searcher)), scheduler_(std::move(scheduler)), stoppers_(std::move(stoppers)),
        cfg_(std::move(cfg)), exp_(std::move(exp)), leaders_(std::move(leaders)), comm_(comm), verbose_(verbose) {}

  /// Sets up the searcher and scheduler, and restores an interrupted experiment from
  /// experiment_state.json when there is one. Throws cohort::error on bad input.
  void start(tuning::space const& space) {
    objective const obj{cfg_.metric, cfg_.mode};
    searcher_.setup(space, obj, cfg_.num_samples);
    scheduler_.setup(obj);
    auto state_path = exp_ / "experiment_state.json";
    std::error_code ec;
    if (!std::filesystem::exists(state_path, ec)) return;
    auto state = read_experiment_state(state_path);  // checked: ids, statuses, fields
    restore_policies(state, searcher_, scheduler_, state_path);
    next_ = state.next_trial;
    exhausted_ = state.searcher_exhausted;
    for (auto& t : state.trials) {
      std::ifstream rows(exp_ / t.id / "result.json", std::ios::binary);
      t.history = parse_result_rows(std::string{std::istreambuf_iterator<char>(rows), std::istreambuf_iterator<char>()});
      if (t.status == "RUNNING" || t.status == "PENDING") {
        t.status = "PENDING";
        queue_.push_back(t.id);
      } else if (t.status == "PAUSED") {
        paused_.push_back(t.id);
      }
      order_.push_back(t.id);
      trials_.emplace(t.id, std::move(t));
    }
    // Trials begun after the last state write are suggested again (same ids): move what they
    // left aside rather than resume a checkpoint that may belong to another config.
    for (auto const& entry : std::filesystem::directory_iterator(exp_, ec)) {
      auto name = entry.path().filename().string();
      if (name.rfind("trial_", 0) == 0 && name.size() == 11 && !trials_.contains(name))
        std::filesystem::rename(entry.path(), exp_ / (name + ".orphaned_" + cohort::detail::utc_stamp()), ec);
    }
    restored_ = true;
  }

  bool restored() const { return restored_; }

  /// The thread body: answers the other leaders until every group has been told it is done.
  void serve() {
    int idle = 0;
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        tick();
        if (groups_done_ == leaders_.size()) break;
      }
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st);
      if (!flag) {
        // Spin briefly while results stream in, then back off to at most 1 ms between polls so an
        // idle coordinator costs rank 0's trial nothing measurable.
        if (++idle < 2000) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 50 * (idle - 1999))));
        continue;
      }
      idle = 0;
      auto msg = recv_json(comm_, st.MPI_SOURCE, st.MPI_TAG);
      std::lock_guard lock(mutex_);
      std::size_t const group = group_of(st.MPI_SOURCE);
      try {
        if (st.MPI_TAG == request_tag) on_request(group);
        else if (st.MPI_TAG == result_tag) deliver(group, on_result(std::move(msg)));
        else if (st.MPI_TAG == complete_tag) on_complete(msg);
      } catch (std::exception const& e) {  // a broken invariant of the tuner itself: end the experiment cleanly
        fail(std::string("the tuner's coordinator failed: ") + e.what());
        if (st.MPI_TAG == result_tag) deliver(group, {{"what", "stop"}});
        serve_waiting();
      }
    }
    std::lock_guard lock(mutex_);
    write_state();
    if (verbose_ > 0) std::cout << table() << std::flush;
  }

  /// Rank 0's own group: the next assignment, waiting until there is one.
  nlohmann::json local_request() {
    std::unique_lock lock(mutex_);
    on_request(0);
    cv_.wait(lock, [&] { return local_reply_.has_value(); });
    return *std::exchange(local_reply_, std::nullopt);
  }
  nlohmann::json local_result(nlohmann::json msg) {
    std::lock_guard lock(mutex_);
    return on_result(std::move(msg));
  }
  void local_complete(nlohmann::json const& msg) {
    std::lock_guard lock(mutex_);
    on_complete(msg);
  }

  /// After serve() returned: the result grid, as JSON (broadcast to every rank).
  /// After serve() returned, on rank 0: every trial, in creation order, their histories moved
  /// out of the coordinator.
  std::vector<tuning::trial_result> take_trials() {
    std::vector<tuning::trial_result> out;
    out.reserve(order_.size());
    for (auto const& id : order_) {
      auto& t = trials_.at(id);
      tuning::trial_result r{t.id, t.status, t.config, t.last(), std::move(t.history), exp_ / t.id, std::nullopt};
      if (!t.error.empty()) r.error = t.error;
      out.push_back(std::move(r));
    }
    return out;
  }

  /// Why the experiment did not finish (the error and whether it was preempted), as JSON.
  nlohmann::json outcome() const {
    nlohmann::json out = nlohmann::json::object();
    if (!fatal_.empty()) out["error"] = fatal_;
    else if (!preempted_.empty()) out["error"] = preempted_ + " (the experiment resumes when rerun with the same name)";
    if (!preempted_.empty()) out["preempted"] = true;
    return out;
  }

 private:
  std::size_t group_of(int world_rank) const {
    for (std::size_t g = 0; g < leaders_.size(); ++g)
      if (leaders_[g] == world_rank) return g;
    return 0;
  }

  std::size_t limit() const {
    return cfg_.max_concurrent_trials == 0 ? leaders_.size() : std::min(cfg_.max_concurrent_trials, leaders_.size());
  }

  double elapsed_s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  void deliver(std::size_t group, nlohmann::json const& reply) {
    if (reply.contains("done")) ++groups_done_;
    if (leaders_[group] == 0) {
      local_reply_ = reply;
      cv_.notify_all();
    } else {
      send_json(comm_, leaders_[group], reply_tag, reply);
    }
  }

  void on_request(std::size_t group) {
    if (auto a = assignment()) deliver(group, *a);
    else waiting_.push_back(group);
  }

  /// The next trial for a free group, {"done": true} when there will be none, or nothing yet.
  std::optional<nlohmann::json> assignment() {
    if (running_ < limit() && fatal_.empty() && !stopping_) {
      std::optional<std::string> id;
      if (!queue_.empty()) {
        id = queue_.front();
        queue_.pop_front();
      } else if (!exhausted_) {
        auto candidate = trial_id(next_);
        std::optional<nlohmann::json> config;
        try {
          config = searcher_.suggest(candidate);
        } catch (std::exception const& e) {
          fail(std::string("the searcher failed: ") + e.what());
        }
        if (config) {
          ++next_;
          trial_state t;
          t.id = candidate;
          t.config = *config;
          try {
            scheduler_.on_trial_add(t.id, t.config);
          } catch (std::exception const& e) {
            fail(std::string("the scheduler failed: ") + e.what());
          }
          order_.push_back(t.id);
          trials_.emplace(t.id, std::move(t));
          id = candidate;
        } else {
          exhausted_ = true;
        }
      }
      if (!id && exhausted_ && !paused_.empty()) {
        id = paused_.front();
        paused_.pop_front();
        trials_.at(*id).resumed_after_pause = true;
      }
      if (id && fatal_.empty()) {
        auto& t = trials_.at(*id);
        t.status = "RUNNING";
        ++running_;
        dirty_ = true;
        if (!t.restore_from.empty() && !cohort::checkpointing::committed(exp_ / t.id).empty()) t.restore_from.clear();
        return nlohmann::json{{"trial_id", t.id}, {"config", t.config}, {"restore_from", t.restore_from}};
      }
    }
    bool const more = fatal_.empty() && !stopping_ && (!queue_.empty() || !paused_.empty() || !exhausted_);
    if (running_ == 0 && !more) return nlohmann::json{{"done", true}};
    return std::nullopt;
  }

  /// A result of a running trial: the stoppers and the scheduler decide what it does next.
  nlohmann::json on_result(nlohmann::json msg) {
    auto& t = trials_.at(msg.at("trial_id").get<std::string>());
    t.history.push_back(std::move(msg.at("row")));
    auto const& row = t.history.back();
    dirty_ = true;
    if (!preempted_.empty()) return {{"what", "preempt"}};  // every running trial stops, resumable
    if (stopping_) return {{"what", "stop"}};
    bool stop = std::apply([&](auto&... s) { return (false || ... || s.stop_trial(t.id, row)); }, stoppers_);
    if (std::apply([&](auto&... s) { return (false || ... || s.stop_all(elapsed_s())); }, stoppers_)) {
      stopping_ = true;
      stop = true;
    }
    if (stop) return {{"what", "stop"}};
    scheduling_decision d;
    try {
      d = scheduler_.on_trial_result(t.id, row);
    } catch (std::exception const& e) {
      return {{"what", "error"}, {"error", std::string("the scheduler failed on ") + t.id + ": " + e.what()}};
    }
    switch (d.what) {
      case decision::proceed:
        return {{"what", "proceed"}};
      case decision::stop:
        return {{"what", "stop"}};
      case decision::pause:
        // A trial resumed after a pause with nothing else to run would be paused forever.
        if (t.resumed_after_pause && running_ <= 1 && queue_.empty()) return {{"what", "proceed"}};
        return {{"what", "pause"}};
      case decision::exploit: {
        auto clone = clone_checkpoint(d.donor, t.id);
        if (!clone) {
          // The donor has no committed checkpoint yet: the trial keeps its own config (PBT had
          // already switched it to the new one; adding the trial again restores it).
          safely([&] { scheduler_.on_trial_add(t.id, t.config); });
          return {{"what", "proceed"}};
        }
        d.config = d.config.is_null() ? trials_.at(d.donor).config : d.config;
        t.exploit = d;
        t.exploit->donor = *clone;
        return {{"what", "exploit"}};
      }
    }
    return {{"what", "proceed"}};
  }

  /// PBT: copies the donor's latest good checkpoint into the trial's directory (the donor's
  /// retention may delete its own copy at any time) and returns the copy's path.
  std::optional<std::string> clone_checkpoint(std::string const& donor, std::string const& into) {
    auto from = cohort::checkpointing::latest_good(exp_ / donor);
    if (!from) return std::nullopt;
    auto dest = exp_ / into / ("exploit_" + std::to_string(++clones_) + "_" + donor + "_" + from->path().filename().string());
    std::error_code ec;
    std::filesystem::create_directories(dest.parent_path(), ec);
    std::filesystem::copy(from->path(), dest, std::filesystem::copy_options::recursive, ec);
    if (ec || cohort::checkpointing::verify(dest)) {
      std::filesystem::remove_all(dest, ec);
      return std::nullopt;
    }
    return dest.string();
  }

  void on_complete(nlohmann::json const& msg) {
    auto& t = trials_.at(msg.at("trial_id").get<std::string>());
    auto const outcome = msg.at("outcome").get<std::string>();
    --running_;
    dirty_ = true;
    if (outcome == "error") {
      t.status = "ERROR";
      t.error = msg.value("error", std::string("failed"));
      safely([&] { searcher_.on_trial_complete(t.id, nlohmann::json()); });
      safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
    } else if (outcome == "preempted" || outcome == "preempt") {
      // SIGTERM/SIGINT: the trial committed its checkpoint; it resumes when the experiment is rerun.
      t.status = "PENDING";
      queue_.push_front(t.id);
      stopping_ = true;
      if (preempted_.empty()) preempted_ = msg.value("error", std::string("stopped by a signal"));
    } else if (outcome == "pause") {
      t.status = "PAUSED";
      paused_.push_back(t.id);
    } else if (outcome == "exploit" && t.exploit) {
      // The trial continues from the donor's checkpoint with the perturbed config; its own
      // checkpoints belong to the abandoned lineage: kept, under superseded/.
      std::error_code ec;
      auto old = cohort::checkpointing::committed(exp_ / t.id);
      if (!old.empty()) std::filesystem::create_directories(exp_ / t.id / "superseded", ec);
      for (auto const& dir : old)
        std::filesystem::rename(dir, exp_ / t.id / "superseded" / (dir.filename().string() + "_" + std::to_string(clones_)), ec);
      t.config = t.exploit->config;
      t.restore_from = t.exploit->donor;
      t.exploit.reset();
      t.status = "PENDING";
      queue_.push_front(t.id);
    } else {
      t.status = "TERMINATED";
      safely([&] { searcher_.on_trial_complete(t.id, t.last()); });
      safely([&] { scheduler_.on_trial_complete(t.id, t.last()); });
    }
    serve_waiting();
  }

  template <class F>
  void safely(F&& f) {
    try {
      f();
    } catch (std::exception const& e) {
      fail(e.what());
    }
  }

  /// The experiment cannot go on: running trials stop at their next report, no new one starts,
  /// and fit() reports `why` on every rank.
  void fail(std::string const& why) {
    if (fatal_.empty()) fatal_ = why;
    stopping_ = true;
  }

  void serve_waiting() {
    while (!waiting_.empty()) {
      auto a = assignment();
      if (!a) return;
      deliver(waiting_.front(), *a);
      waiting_.pop_front();
    }
  }

  /// Periodic work: the time budget, the status table, the experiment state.
  void tick() {
    if (!stopping_ && std::apply([&](auto&... s) { return (false || ... || s.stop_all(elapsed_s())); }, stoppers_)) {
      stopping_ = true;
      serve_waiting();
    }
    auto now = std::chrono::steady_clock::now();
    if (verbose_ > 0 && now - last_table_ >= std::chrono::duration<double>(cfg_.status_interval_s)) {
      last_table_ = now;
      std::cout << table() << std::flush;
    }
    if (dirty_ && now - last_state_ >= std::chrono::duration<double>(std::max(cfg_.state_interval_s, 20 * state_write_s_)))
      write_state();
  }

  std::vector<report::trial_row> rows() const {
    std::vector<report::trial_row> out;
    for (auto const& id : order_) {
      auto const& t = trials_.at(id);
      out.push_back({t.id, t.status, t.config, t.last(), (exp_ / t.id).string(), t.error});
    }
    return out;
  }

  std::string table() const { return report::trial_table(rows(), cfg_.metric, elapsed_s()); }

  /// Rewrites experiment_state.json and trials.csv. The periodic rewrite waits at least 20 times
  /// as long as the last one took (as Ray adapts its experiment checkpoint period), so it costs
  /// at most 5% of rank 0's time however many trials there are.
  void write_state() {
    auto const started = std::chrono::steady_clock::now();
    dirty_ = false;
    nlohmann::json trials = nlohmann::json::array();
    for (auto const& id : order_) trials.push_back(trials_.at(id));
    nlohmann::json state{{"trials", trials}, {"searcher", searcher_.save_state()}, {"scheduler", scheduler_.save_state()},
                         {"next_trial", next_}, {"searcher_exhausted", exhausted_}};
    try {
      report::write_file_atomic(exp_ / "experiment_state.json", state.dump() + "\n");
      report::write_file_atomic(exp_ / "trials.csv", report::trials_csv(rows()));
    } catch (std::exception const& e) {
      std::cerr << ("[cohort] warning: " + std::string(e.what()) + "\n") << std::flush;
    }
    last_state_ = std::chrono::steady_clock::now();
    state_write_s_ = std::chrono::duration<double>(last_state_ - started).count();
  }

  Searcher searcher_;
  Scheduler scheduler_;
  Stoppers stoppers_;
  tune_config cfg_;
  std::filesystem::path exp_;
  std::vector<int> leaders_;  ///< world rank of each group's leader
  MPI_Comm comm_;
  int verbose_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<nlohmann::json> local_reply_;
  std::map<std::string, trial_state> trials_;
  std::vector<std::string> order_;
  std::deque<std::string> queue_, paused_;
  std::deque<std::size_t> waiting_;
  std::size_t next_ = 0, running_ = 0, groups_done_ = 0, clones_ = 0;
  bool exhausted_ = false, stopping_ = false, dirty_ = true, restored_ = false;
  std::string fatal_, preempted_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_table_ = start_, last_state_ = start_;
  double state_write_s_ = 0;  ///< how long the last write_state took
};

}  // namespace cohort::tuning::detail
