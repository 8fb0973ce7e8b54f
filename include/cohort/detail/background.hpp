#pragma once
/// \file
/// One long-lived background thread that runs one job at a time: the async checkpoint writer.
/// Handing a job to a waiting thread costs a wake-up, where starting a thread per job cost a
/// clone() and, on busy cores, sometimes milliseconds before the caller ran again.

#include <sched.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

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

class background_worker {
 public:
  background_worker() = default;
  background_worker(background_worker const&) = delete;
  background_worker& operator=(background_worker const&) = delete;
  ~background_worker() {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [&] { return !job_; });
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

  /// Runs `job` on the thread. Precondition: !busy() (the previous job was waited for).
  void start(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      started_ = true;
    }
    warm_up();
    wake_.notify_all();
  }

  /// Blocks until the started job has returned; afterwards !busy().
  void wait() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return !job_; });
    started_ = false;
  }

  /// True from start() until wait().
  bool busy() const {
    std::lock_guard lock(mutex_);
    return started_;
  }

 private:
  void loop() {
    yield_on_wakeup();
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;  // stop_
      lock.unlock();
      job_();  // the job reports its own errors: it must not throw
      lock.lock();
      job_ = nullptr;
      idle_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::function<void()> job_;
  bool started_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::detail
