#pragma once
/// \file
/// Concise rank-0 console progress: one line per report, written by a background thread.

#include <pthread.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cohort/detail/background.hpp"
#include "cohort/report/flatten.hpp"

namespace cohort::report {

/// Pure: the progress line for one report row, e.g.
/// `[cohort] fashion iter 3 (12.4 s): loss=0.3121 test_accuracy=0.9012`.
inline std::string progress_line(std::string const& name, nlohmann::json const& row) {
  static char const* const auto_keys[] = {"training_iteration", "time_this_iter_s", "time_total_s", "timestamp"};
  char head[128];
  std::snprintf(head, sizeof head, " iter %lld (%.1f s):", row.value("training_iteration", 0LL),
                row.value("time_total_s", 0.0));
  std::string line = "[cohort] " + name + head;
  for (auto const& [k, v] : flatten(row)) {
    bool is_auto = false;
    for (auto const* a : auto_keys) is_auto = is_auto || k == a;
    if (is_auto) continue;
    if (v.is_number_float()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
      line += " " + k + "=" + buf;
    } else {
      line += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  return line;
}

/// Writes lines to stdout on its own (batch) thread, in order, so that a report does not wait
/// for the write: under mpirun stdout is a pipe, and the write wakes mpirun, which on busy
/// cores took the core from the training thread for up to 3 ms (docs/benchmarks.md). drain() and
/// the destructor return once every line given so far is written.
class console_printer {
 public:
  console_printer() : thread_([this] { loop(); }) {}
  console_printer(console_printer const&) = delete;
  console_printer& operator=(console_printer const&) = delete;
  ~console_printer() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();  // after writing what is queued
  }

  /// Queues `line` (a newline is added).
  void print(std::string line) {
    {
      std::lock_guard lock(mutex_);
      lines_.push_back(std::move(line));
    }
    wake_.notify_all();
  }

  /// Blocks until every line queued so far is written and flushed.
  void drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return lines_.empty() && !writing_; });
  }

 private:
  void loop() {
    cohort::detail::yield_on_wakeup();
    sigset_t stop_signals;  // SIGTERM/SIGINT go to the other threads: no write cut short here
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !lines_.empty(); });
      if (lines_.empty()) return;  // stop_, nothing left
      std::string text;
      for (; !lines_.empty(); lines_.pop_front()) text += lines_.front() + "\n";
      writing_ = true;
      lock.unlock();
      std::fputs(text.c_str(), stdout);  // one write per batch of lines
      std::fflush(stdout);
      lock.lock();
      writing_ = false;
      idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::string> lines_;
  bool writing_ = false;
  bool stop_ = false;
  std::thread thread_;  ///< last: started once the members it uses exist
};

}  // namespace cohort::report
