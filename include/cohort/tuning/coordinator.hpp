#pragma once
/// \file
/// The tuner's coordinator: the thread on rank 0 that serves the book of trials (trial_book.hpp)
/// to the group leaders, prints the status table and writes experiment_state.json.

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/comm/deadline.hpp"
#include "cohort/detail/background_worker.hpp"
#include "cohort/report/html_report.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/report/trial_table.hpp"
#include "cohort/tuning/messages.hpp"
#include "cohort/tuning/result_grid.hpp"
#include "cohort/tuning/search_space.hpp"
#include "cohort/tuning/trial_book.hpp"
#include "cohort/tuning/trial_events.hpp"
#include "cohort/tuning/tune_config.hpp"

namespace cohort::tuning::detail {

/// Rank 0's coordinator: the book of trials behind one mutex. The thread in serve() answers the
/// other group leaders over MPI; rank 0's own group calls the local_* functions directly. The
/// book's state is written to experiment_state.json (and trials.csv) at most every
/// state_interval_s, on a writer thread, and at the end, so a rerun resumes the experiment.
template <class Searcher, class Scheduler, class Stoppers>
class coordinator {
 public:
  coordinator(Searcher searcher, Scheduler scheduler, Stoppers stoppers, tune_config cfg, std::filesystem::path exp,
              std::vector<int> leaders, MPI_Comm comm, int verbose)
      : book_(std::move(searcher), std::move(scheduler), std::move(stoppers), cfg, exp, concurrency(cfg, leaders.size())),
        cfg_(std::move(cfg)), exp_(std::move(exp)), leaders_(std::move(leaders)), comm_(comm), verbose_(verbose) {}

  /// Sets up the searcher and scheduler, and restores an interrupted experiment from
  /// experiment_state.json when there is one. Throws cohort::error on bad input.
  void start(tuning::space const& space) { book_.start(space); }

  /// Whether start() restored an interrupted experiment.
  bool restored() const { return book_.restored(); }

  /// Rank 0's callbacks, told of every trial's events (null: none). Before serve().
  void set_callbacks(report::callback_runner* callbacks) { book_.set_callbacks(callbacks); }

  /// The thread body: answers the other leaders until every group has been told it is done.
  void serve() {
    int idle = 0;
    auto last_message = std::chrono::steady_clock::now();
    auto next_tick = last_message;
    while (groups_done_.load() < leaders_.size()) {
      // The periodic work, under the mutex, once per tick_interval: a poll between messages
      // does not take the mutex, which rank 0's main thread would then wait for whenever this
      // thread lost its core holding it (bench_tune trials/N).
      if (auto const now = std::chrono::steady_clock::now(); now >= next_tick) {
        next_tick = now + tick_interval;
        std::optional<state_snapshot> due;
        {
          std::lock_guard lock(mutex_);
          tick();
          if (state_due()) due = snapshot();
        }
        // On the writer's thread: the groups' messages are answered meanwhile, and rank 0's own
        // trial does not wait for the mutex.
        if (due) writer_.start([this, s = std::move(*due)] { write_state(s); });
      }
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &st);
      if (!flag) {
        // Spin briefly while results stream in; then poll every 100 us for a quarter of a second
        // after the last message (short trials: their next message is answered within 0.1 ms,
        // bench_tune scale/2000); then back off to 1 ms between polls, so that an idle
        // coordinator costs rank 0's trial nothing measurable.
        if (++idle < 2000) {
          std::this_thread::yield();
        } else if (std::chrono::steady_clock::now() - last_message < std::chrono::milliseconds(250)) {
          comm::detail::precise_sleep(std::chrono::microseconds(100));  // 1 us timer slack, not Linux's 50
        } else {
          comm::detail::precise_sleep(std::chrono::microseconds(std::min(1000, 100 + 50 * (idle - 1999))));
        }
        continue;
      }
      idle = 0;
      last_message = std::chrono::steady_clock::now();
      auto msg = recv_json(comm_, st.MPI_SOURCE, st.MPI_TAG);
      std::lock_guard lock(mutex_);
      std::size_t const group = group_of(st.MPI_SOURCE);
      bool const asked = st.MPI_TAG == result_tag && !msg.contains("quiet");  // its leader waits for the answer
      try {
        if (st.MPI_TAG == request_tag) on_request(group, msg);
        else if (st.MPI_TAG == result_tag && !asked) on_quiet_result(msg);
        else if (st.MPI_TAG == result_tag) on_result(group, std::move(msg));
        else if (st.MPI_TAG == complete_tag) on_complete(group, msg);
      } catch (std::exception const& e) {  // a broken invariant of the tuner itself: end the experiment cleanly
        book_.fail(std::string("the tuner's coordinator failed: ") + e.what());
        if (asked) send_json(comm_, leaders_[group], reply_tag, {{"what", "stop"}});  // a quiet result's trial: at its next asked one
        serve_waiting();
      }
    }
    // The last state, report and table taken from the book; the book is then released to rank
    // 0's main thread (wait_ended), which sends the result grid to the other ranks while the
    // files are written here.
    writer_.wait();
    std::unique_lock lock(mutex_);
    auto const state = snapshot();
    report::html_options const html{.title = exp_.filename().string(), .metric = cfg_.metric, .mode = cfg_.mode};
    auto const histories = book_.histories(report::points_per_line(html));
    auto const last_table = verbose_ > 0 ? table() : std::string{};
    ended_ = true;
    cv_.notify_all();
    lock.unlock();
    // report.html on the writer's thread, beside the state here: for many trials each is a few
    // hundred milliseconds that rank 0's fit() waits for (bench_tune trials/N).
    writer_.start([&] {
      std::vector<report::trial_row> rows;
      rows.reserve(state.state.trials.rows.size());
      for (auto const& r : state.state.trials.rows) rows.push_back(*r);
      write_report(rows, histories, html);
    });
    write_state(state);
    writer_.wait();
    if (verbose_ > 0) std::cout << last_table << std::flush;
  }

  /// Rank 0's main thread: waits until serve() has taken the last state from the book (its files
  /// may still be being written: join serve()'s thread before they are read).
  void wait_ended() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return ended_; });
  }

  /// Rank 0's own group: asks for its next assignment (a request message, see on_request), which
  /// local_answer() then waits for.
  void local_ask(nlohmann::json const& request) {
    std::lock_guard lock(mutex_);
    on_request(0, request);
  }
  /// Rank 0's own group: the answer to its oldest unanswered request, waiting until there is one.
  nlohmann::json local_answer() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !local_replies_.empty(); });
    auto reply = std::move(local_replies_.front());
    local_replies_.pop_front();
    return reply;
  }
  /// Rank 0's own group: a result, answered with what the trial does next (under
  /// tune_config::reproducible, once its turn has come).
  nlohmann::json local_result(nlohmann::json msg) {
    std::unique_lock lock(mutex_);
    if (!cfg_.reproducible) return book_.on_result(std::move(msg));
    on_result(0, std::move(msg));
    cv_.wait(lock, [&] { return local_answer_.has_value(); });
    return *std::exchange(local_answer_, std::nullopt);
  }
  /// Rank 0's own group: a trial ended.
  void local_complete(nlohmann::json const& msg) {
    std::lock_guard lock(mutex_);
    on_complete(0, msg);
  }

  /// After wait_ended(), on rank 0: every trial, in creation order, their histories moved out of
  /// the book.
  std::vector<tuning::trial_result> take_trials() {
    std::lock_guard lock(mutex_);
    return book_.take_trials();
  }

  /// Why the experiment did not finish (the error and whether it was preempted), as JSON.
  nlohmann::json outcome() {
    std::lock_guard lock(mutex_);
    return book_.outcome();
  }

 private:
  /// How many trials run at once: one per group, or fewer (tune_config::max_concurrent_trials).
  static std::size_t concurrency(tune_config const& cfg, std::size_t groups) {
    return cfg.max_concurrent_trials == 0 ? groups : std::min(cfg.max_concurrent_trials, groups);
  }

  std::size_t group_of(int world_rank) const {
    for (std::size_t g = 0; g < leaders_.size(); ++g)
      if (leaders_[g] == world_rank) return g;
    return 0;
  }

  /// Hands `group` the answer to one of its requests: a trial, or {"done": true}, after which
  /// its leader reads no more (its requests still waiting go unanswered). Not waiting for the
  /// leader to receive it: a reservation comes while the leader trains, and a large config is
  /// not sent until the receive is posted (MPI's rendezvous).
  void deliver(std::size_t group, nlohmann::json const& assignment) {
    if (assignment.contains("done")) {
      ++groups_done_;
      deferred_[group] = 0;
    } else if (assignment.contains("reserved")) {
      ++unstarted_[group];
    } else {
      running_[group] = 1;
    }
    if (leaders_[group] == 0) {
      local_replies_.push_back(assignment);
      cv_.notify_all();
    } else {
      assignments_.send(comm_, leaders_[group], assignment_tag, assignment);
    }
  }

  /// Names in `reply` the span of trial `id`'s next results its group may send without waiting
  /// (quiet_results), where there is one.
  void name_quiet_span(nlohmann::json& reply, std::string const& id) {
    if (auto span = book_.quiet_span(id)) reply["quiet"] = quiet_results::to_json(*span);
  }

  /// The book's next assignment, naming the span of the trial's first quiet results.
  std::optional<nlohmann::json> assignment() {
    auto a = book_.assignment();
    if (a && a->contains("trial_id")) name_quiet_span(*a, a->at("trial_id"));
    return a;
  }

  /// A group asks for its next trial: {} when it has none, {"ahead": trial id} as it starts
  /// that trial, or {"ahead": null} as its first trial starts (requests_ahead). Asked ahead, it
  /// gets a trial reserved for it at once where the book can tell (trial_book::reservation);
  /// else the request waits until the group has no trial running or reserved (on_complete).
  /// Only while every group holds a trial and the group's last trial took less than
  /// short_trial (its last two trial starts apart), and a second one ahead only while it took
  /// less than very_short_trial: a reservation ties a trial to a group until that group's trial
  /// ends, which for trials of seconds or more would let another group sit idle for more than
  /// it saves, 0.1-0.3 ms per trial (bench_tune scale/N).
  void on_request(std::size_t group, nlohmann::json const& request) {
    if (auto it = request.find("ahead"); it != request.end()) {
      if (it->is_string()) {
        if (book_.started(it->get<std::string>())) --unstarted_[group];
        running_[group] = 1;
        auto const now = std::chrono::steady_clock::now();
        auto const last = last_start_[group] ? now - *last_start_[group] : std::chrono::steady_clock::duration::max();
        may_reserve_[group] = last < very_short_trial ? requests_ahead : last < short_trial ? 1 : 0;
        last_start_[group] = now;
      }
      ++deferred_[group];
      return reserve_ahead(group);
    }
    if (auto a = assignment()) deliver(group, *a);
    else waiting_.push_back(group);
  }

  /// `group`'s requests asked ahead and not answered get trials reserved for it, while the book
  /// has them to reserve and on_request's conditions hold.
  void reserve_ahead(std::size_t group) {
    auto const holds = [&](std::size_t g) { return running_[g] != 0 || unstarted_[g] > 0; };
    while (deferred_[group] > 0 && unstarted_[group] < may_reserve_[group]) {
      for (std::size_t g = 0; g < leaders_.size(); ++g)
        if (!holds(g)) return;
      auto r = book_.reservation();
      if (!r) return;
      name_quiet_span(*r, r->at("trial_id"));
      --deferred_[group];
      deliver(group, *r);
    }
  }

  /// A group's result: answered at once, or under tune_config::reproducible held until its turn.
  void on_result(std::size_t group, nlohmann::json msg) {
    if (!cfg_.reproducible) return send_json(comm_, leaders_[group], reply_tag, answer(std::move(msg)));
    auto id = msg.at("trial_id").get<std::string>();
    auto const n = trial_number(id).value_or(0);
    held_by_[std::move(id)] = group;
    held_.hold(n, std::move(msg));
    answer_released();
  }

  /// The answer to a result its group waits for: the decision owed to the trial from one of its
  /// quiet results, if any, else the book's; with the span of results it may send quiet next
  /// (quiet_results) when the answer is proceed.
  nlohmann::json answer(nlohmann::json msg) {
    auto id = msg.at("trial_id").get<std::string>();
    auto reply = book_.on_result(std::move(msg));
    if (auto owed = owed_.find(id); owed != owed_.end()) {
      reply = std::move(owed->second);
      owed_.erase(owed);
    } else if (reply.value("what", std::string{}) == "proceed") {
      name_quiet_span(reply, id);
    }
    return reply;
  }

  /// A result its group did not wait for (quiet_results): decided on as any other; a decision
  /// other than proceed (the experiment stopping, the scheduler failing on it) is owed to the
  /// trial and is the answer to its next asked result (quiet_results: within max_quiet or one report).
  /// They come in batches (quiet_batch).
  void on_quiet_result(nlohmann::json const& msg) {
    auto const& id = msg.at("trial_id").get_ref<std::string const&>();
    for (auto& row : decode_history(msg.at("rows").get_binary())) {
      auto reply = book_.on_result(id, std::move(row));
      if (reply.value("what", std::string{}) != "proceed") owed_.try_emplace(id, std::move(reply));
    }
  }

  /// Under tune_config::reproducible: the answers to the held results whose turn has come.
  void answer_released() {
    if (!cfg_.reproducible) return;
    auto const turn_of = [&](std::size_t n, std::int64_t level) { return book_.turn_of(n, level); };
    auto const decide = [&](nlohmann::json msg) -> nlohmann::json {
      try {
        return book_.on_result(std::move(msg));
      } catch (std::exception const& e) {  // a broken invariant of the tuner: its group still gets an answer
        book_.fail(std::string("the tuner's coordinator failed: ") + e.what());
        return {{"what", "stop"}};
      }
    };
    for (auto& [id, answer] : held_.release(turn_of, decide)) {
      auto const group = held_by_.at(id);
      held_by_.erase(id);
      if (leaders_[group] == 0) {
        local_answer_ = std::move(answer);
        cv_.notify_all();
      } else {
        send_json(comm_, leaders_[group], reply_tag, answer);
      }
    }
  }

  /// `group`'s trial ended; where no trial is reserved for it, one of its requests asked ahead
  /// now waits as any other (a group is never told "done" while it holds a reserved trial).
  void on_complete(std::size_t group, nlohmann::json const& msg) {
    owed_.erase(msg.at("trial_id").get<std::string>());  // the trial ended before its next asked result
    running_[group] = 0;
    book_.on_complete(msg);
    answer_released();  // a trial that ended no longer holds the later ones back
    if (unstarted_[group] == 0 && deferred_[group] > 0) {
      --deferred_[group];
      waiting_.push_back(group);
    }
    serve_waiting();
  }

  /// The groups that asked while no trial was free get one (or "done") as soon as there is.
  void serve_waiting() {
    while (!waiting_.empty()) {
      auto a = assignment();
      if (!a) return;
      deliver(waiting_.front(), *a);
      waiting_.pop_front();
    }
  }

  /// Periodic work under the mutex: the time budget, the status table.
  void tick() {
    if (book_.out_of_budget()) {
      answer_released();
      serve_waiting();
    }
    auto now = std::chrono::steady_clock::now();
    if (verbose_ > 0 && now - last_table_ >= std::chrono::duration<double>(cfg_.status_interval_s)) {
      last_table_ = now;
      std::cout << table() << std::flush;
    }
  }

  /// Whether experiment_state.json is due for its periodic rewrite: something changed, and at
  /// least state_interval_s and 20 times as long as the last rewrite took (as Ray adapts its
  /// experiment checkpoint period) have passed, so that it costs at most 5% of the coordinator's time.
  /// One rewrite at a time: none while the last one is still on the writer's thread.
  bool state_due() {
    auto const since = std::chrono::steady_clock::now() - last_state_;
    return book_.dirty() && since >= std::chrono::duration<double>(std::max(cfg_.state_interval_s, 20 * state_write_s_.load())) &&
           writer_.wait_for(std::chrono::seconds(0));
  }

  std::string table() const {
    return report::trial_table(book_.rows(), book_.elapsed_s(),
                               {.metric = cfg_.metric, .mode = cfg_.mode, .scheduler = book_.scheduler_lines()});
  }

  /// What experiment_state.json and trials.csv are written from, taken under the mutex (which
  /// the groups wait for: only the trials changed since the last one are made again); written
  /// without it (write_state).
  struct state_snapshot {
    std::chrono::steady_clock::time_point taken{};
    typename trial_book<Searcher, Scheduler, Stoppers>::state_parts state;
  };
  state_snapshot snapshot() {
    last_state_ = std::chrono::steady_clock::now();
    return {.taken = last_state_, .state = book_.state()};
  }

  /// Rewrites experiment_state.json and trials.csv from `s`; how long that took since `s` was
  /// taken sets the next periodic rewrite (state_due).
  void write_state(state_snapshot const& s) {
    try {
      report::write_file_atomic(exp_ / "experiment_state.json", s.state.text() + "\n");
      report::write_file_atomic(exp_ / "trials.csv", report::trials_csv(s.state.trials.rows));
    } catch (std::exception const& e) {
      std::cerr << ("[cohort] warning: " + std::string(e.what()) + "\n") << std::flush;
    }
    state_write_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.taken).count();
  }

  /// report.html beside trials.csv (report::experiment_html: the trials table and a plot per
  /// metric), once, when the experiment ends however it ends.
  void write_report(std::vector<report::trial_row> const& rows, std::vector<std::vector<nlohmann::json>> const& histories,
                    report::html_options const& o) {
    try {
      report::write_file_atomic(exp_ / "report.html", report::experiment_html(rows, histories, o));
    } catch (std::exception const& e) {
      std::cerr << ("[cohort] warning: " + std::string(e.what()) + "\n") << std::flush;
    }
  }

  trial_book<Searcher, Scheduler, Stoppers> book_;
  tune_config cfg_;
  std::filesystem::path exp_;
  std::vector<int> leaders_;  ///< world rank of each group's leader
  MPI_Comm comm_;
  int verbose_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<nlohmann::json> local_replies_;  ///< rank 0's group's answers, in order, not read yet
  std::optional<nlohmann::json> local_answer_;  ///< rank 0's group's held result, answered (reproducible)
  std::map<std::string, std::size_t> held_by_;  ///< held results: the group waiting for each (reproducible)
  held_results held_;  ///< tune_config::reproducible: results held for their turn (trial_book::turn_of)
  std::map<std::string, nlohmann::json> owed_;  ///< decisions on quiet results, for the trial's next asked one
  std::deque<std::size_t> waiting_;  ///< groups that asked for a trial while none was free
  // Each group: requests asked ahead and not answered yet; trials reserved for it and not started;
  // whether a trial of its runs; how many trials may be reserved for it (on_request).
  std::vector<std::size_t> deferred_ = std::vector<std::size_t>(leaders_.size(), 0);
  std::vector<std::size_t> unstarted_ = std::vector<std::size_t>(leaders_.size(), 0);
  std::vector<char> running_ = std::vector<char>(leaders_.size(), 0);
  std::vector<std::size_t> may_reserve_ = std::vector<std::size_t>(leaders_.size(), 0);
  std::vector<std::optional<std::chrono::steady_clock::time_point>> last_start_ =
      std::vector<std::optional<std::chrono::steady_clock::time_point>>(leaders_.size());  ///< each group's last trial start
  quiet_sends assignments_;  ///< assignments to other ranks' leaders, in flight
  std::atomic<std::size_t> groups_done_ = 0;  ///< changed under the mutex, read by serve() without it
  /// How often serve() does its periodic work (tick, the state's rewrite): the time budget and the
  /// status table are seconds.
  static constexpr auto tick_interval = std::chrono::milliseconds(1);
  bool ended_ = false;  ///< serve() has taken the last state: the book is rank 0's main thread's
  std::chrono::steady_clock::time_point last_table_ = std::chrono::steady_clock::now(), last_state_ = last_table_;
  std::atomic<double> state_write_s_ = 0;  ///< how long the last write_state took (set on the writer's thread)
  cohort::detail::background_worker writer_{"cohort-state"};  ///< the periodic state rewrites; last member: joined first
};

}  // namespace cohort::tuning::detail
