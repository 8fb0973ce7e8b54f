#pragma once
/// \file
/// One long-lived background thread that runs jobs in order: a rank's async checkpoint writes and
/// progress lines share one (report::protocol's worker); a gradient reducer's all-reduces have one.
/// Handing a job to a waiting thread costs a wake-up, where starting a thread per job cost a
/// clone() and, on busy cores, sometimes milliseconds before the caller ran again.

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include "cohort/detail/thread_start.hpp"
#include "cohort/scaling/cpu_set.hpp"

namespace cohort::detail {

/// Makes the calling thread a batch thread (Linux SCHED_BATCH): it still gets its fair share of
/// the cores, but waking it no longer preempts a running thread, so handing work to it does
/// not take the core from the training thread that handed it over. Best effort.
inline void yield_on_wakeup() {
#ifdef SCHED_BATCH
  sched_param param{};
  param.sched_priority = 0;
  (void)sched_setscheduler(0, SCHED_BATCH, &param);
#endif
}

/// How a background_worker's thread takes its core when a job wakes it.
enum class on_wakeup {
  yield,    ///< after the running thread's slice (SCHED_BATCH: yield_on_wakeup): writers, printers
  preempt,  ///< at once, as any thread: work the training thread waits for (gradient all-reduces)
};

/// One long-lived thread that runs the jobs given to it one after another, in order: a rank's
/// progress lines and its async checkpoint writes (one in flight), on one thread so that a report
/// wakes one thread. Waking a second batch thread while the first still waits for the core makes
/// Linux (EEVDF) preempt the waking thread once its slice is spent: the training thread lost its
/// core inside report() for 0.4-4 ms (docs/benchmarks.md, "Async checkpoint stall").
/// SIGTERM/SIGINT are blocked on it, so they reach the training thread's handler instead.
class background_worker {
 public:
  /// `name` names the thread, e.g. "cohort-writer" (cut to the 15 characters Linux allows).
  explicit background_worker(std::string_view name, on_wakeup wakeup = on_wakeup::yield) : wakeup_(wakeup) {
    name.copy(name_, sizeof name_ - 1);
  }
  background_worker(background_worker const&) = delete;
  background_worker& operator=(background_worker const&) = delete;
  ~background_worker() {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [&] { return jobs_.empty() && !running_; });
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Starts the thread now, so that the first job costs a wake-up only (a thread's creation
  /// cost the first async checkpoint ~2.6 ms of training time: docs/benchmarks.md).
  void warm_up() {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }

  /// Queues `job` to run after the jobs started before it. Called from one thread.
  void start(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    warm_up();
    wake_.notify_all();
  }

  /// Blocks until every started job has returned.
  void wait() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return jobs_.empty() && !running_; });
  }

  /// wait() for at most `timeout`: true when every started job has returned.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    return idle_.wait_for(lock, timeout, [&] { return jobs_.empty() && !running_; });
  }

 private:
  void loop() {
    begin_background_thread(name_);
    if (wakeup_ == on_wakeup::yield) yield_on_wakeup();
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
      lock.unlock();
      job();  // a job reports its own errors: it must not throw
      job = nullptr;
      lock.lock();
      running_ = false;
      if (jobs_.empty()) idle_.notify_all();
    }
  }

  char name_[16] = {};
  on_wakeup wakeup_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::detail
