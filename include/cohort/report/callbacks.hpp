#pragma once
/// \file
/// Callbacks (Ray's `tune.Callback`): user types told of an experiment's events, passed to a
/// tuner or a trainer as policies (`cohort::tuner{fn, search, my_logger{}, report::mlflow{...},
/// tune_config{...}}`) and checked by the `cohort::callback` concept. Every event is queued on
/// rank 0 and delivered on one thread of its own (report::callback_runner), never on a training
/// thread: a callback that blocks delays only its own events, and the queue is bounded (events
/// beyond it are counted, dropped, and said once); one that throws is reported once and keeps
/// getting events. Under a tuner each trial is a trial; a trainer's fit() is one trial named as
/// the run.

#include <pthread.h>

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/order.hpp"

namespace cohort::report {

/// The experiment (a tuner's, or a trainer's single run) as callbacks see it.
struct experiment_info {
  std::string name{};              ///< run_config::name
  std::filesystem::path path{};    ///< the experiment's (or the run's) directory
  int world_size = 1;              ///< ranks of the job
  bool tuning = false;             ///< a tuner's experiment (trials) rather than one fit()
  std::string metric{};            ///< tune_config::metric (empty for a trainer)
  cohort::order mode = cohort::max;  ///< tune_config::mode
};

/// One trial as callbacks see it: under a tuner a trial, for a trainer the run itself.
struct trial_info {
  std::string id{};              ///< "trial_00003", or the run's name
  nlohmann::json config{};       ///< its config (after a PBT exploit, the new one)
  std::filesystem::path path{};  ///< its directory
};

}  // namespace cohort::report

namespace cohort {

/// A callback: a copyable type with one or more of these members, each optional (Ray's Callback):
/// `on_experiment_start(experiment_info const&)`, `on_trial_start(trial_info const&)`,
/// `on_trial_restore(trial_info const&, path const& checkpoint)` (the trial goes on from a
/// checkpoint: a resumed, retried or exploiting trial), `on_trial_result(trial_info const&,
/// json const& result)`, `on_checkpoint(trial_info const&, path const& checkpoint)` (committed),
/// `on_trial_complete(trial_info const&)`, `on_trial_error(trial_info const&, std::string const&
/// error)`, `on_experiment_end(experiment_info const&)`. All are called on one thread, in order.
template <class C>
concept callback =
    std::copy_constructible<C> &&
    requires(C& c, report::experiment_info const& e, report::trial_info const& t, nlohmann::json const& j,
             std::filesystem::path const& p, std::string const& s) {
      requires(requires { c.on_experiment_start(e); } || requires { c.on_trial_start(t); } ||
               requires { c.on_trial_restore(t, p); } || requires { c.on_trial_result(t, j); } ||
               requires { c.on_checkpoint(t, p); } || requires { c.on_trial_complete(t); } ||
               requires { c.on_trial_error(t, s); } || requires { c.on_experiment_end(e); });
    };

}  // namespace cohort

namespace cohort::report {

/// What happened, for callback_runner's queue.
/// (trial_start with a checkpoint is told as on_trial_restore.)
enum class callback_event { experiment_start, trial_start, trial_result, checkpoint, trial_complete, trial_error, experiment_end };

/// Pure: the event's name, for messages.
inline char const* event_name(callback_event e) {
  constexpr char const* names[] = {"on_experiment_start", "on_trial_start",    "on_trial_result",  "on_checkpoint",
                                   "on_trial_complete",   "on_trial_error",    "on_experiment_end"};
  return names[static_cast<int>(e)];
}

/// Knobs of the callback thread. Chosen, not tuned: a queue of this many events holds minutes of
/// reports at the rates trials report, and a callback taking a second is one worth saying.
struct callback_limits {
  std::size_t max_queued_events = 65536;                        ///< beyond: dropped and counted
  std::chrono::milliseconds slow_call{1000};                    ///< a call this long is said once per callback
  std::chrono::milliseconds drain_timeout{30000};               ///< at the end, how long the last events may take
  std::chrono::milliseconds idle_wake{20};                      ///< the thread looks at the queue this often
};

/// One event in callback_runner's queue.
struct callback_record {
  callback_event what{};
  std::string trial{};
  trial_info info{};              ///< trial_start
  experiment_info experiment{};   ///< experiment_start, experiment_end
  nlohmann::json data{};          ///< trial_result: the row; trial_error: the message
  std::filesystem::path path{};   ///< checkpoint; trial_start: the checkpoint it is restored from
};

/// Rank 0's callbacks and the thread that calls them (make_callback_runner). post_*() are cheap
/// (a lock and a move into a deque; no wake-up: the thread looks every idle_wake) and never wait
/// for a callback. finish() posts the end, waits up to drain_timeout for the thread, and says
/// what was dropped.
class callback_runner {
 public:
  /// Delivers one event to every callback (`trial`: the trial it concerns, as started).
  using deliver_fn = std::function<void(callback_record const&, trial_info const&)>;

  explicit callback_runner(deliver_fn deliver, callback_limits limits = {})
      : shared_(std::make_shared<shared>(std::move(deliver), limits)) {
    thread_ = std::thread([s = shared_] { s->run(); });
#ifdef __linux__
    pthread_setname_np(thread_.native_handle(), "cohort-callback");
#endif
  }
  callback_runner(callback_runner const&) = delete;
  callback_runner& operator=(callback_runner const&) = delete;
  ~callback_runner() { finish(); }

  void experiment_start(experiment_info e) { post({.what = callback_event::experiment_start, .experiment = std::move(e)}); }
  /// A trial starts (`restored_from`: the checkpoint it goes on from; empty for a fresh start).
  void trial_start(trial_info t, std::filesystem::path restored_from = {}) {
    std::string id = t.id;
    post({.what = callback_event::trial_start, .trial = std::move(id), .info = std::move(t), .path = std::move(restored_from)});
  }
  void trial_result(std::string id, nlohmann::json row) {
    post({.what = callback_event::trial_result, .trial = std::move(id), .data = std::move(row)});
  }
  void checkpoint(std::string id, std::filesystem::path dir) {
    post({.what = callback_event::checkpoint, .trial = std::move(id), .path = std::move(dir)});
  }
  void trial_complete(std::string id) { post({.what = callback_event::trial_complete, .trial = std::move(id)}); }
  void trial_error(std::string id, std::string error) {
    post({.what = callback_event::trial_error, .trial = std::move(id), .data = nlohmann::json(std::move(error))});
  }

  /// Posts the end (when given), then waits at most drain_timeout for every event to be
  /// delivered, and says what was dropped or left. Once; later calls do nothing.
  void finish(experiment_info const* end = nullptr) {
    if (!thread_.joinable()) return;
    if (end) post({.what = callback_event::experiment_end, .experiment = *end});
    std::unique_lock lock(shared_->mutex);
    shared_->closing = true;
    shared_->wake.notify_all();
    bool const drained = shared_->done_cv.wait_for(lock, shared_->limits.drain_timeout, [&] { return shared_->done; });
    std::size_t const left = shared_->queue.size() + (drained ? 0 : 1);
    std::size_t const dropped = shared_->dropped;
    lock.unlock();
    if (drained) thread_.join();
    else thread_.detach();  // a callback still blocked: the state it uses lives as long as the thread
    if (!drained)
      std::cerr << "[cohort] callbacks still busy " << shared_->limits.drain_timeout.count() / 1000
                << " s after the end: about " << left << " events not delivered\n";
    if (dropped > 0)
      std::cerr << "[cohort] callbacks fell behind: " << dropped << " events dropped (more than "
                << shared_->limits.max_queued_events << " were waiting)\n";
  }

  /// Events dropped so far because the queue was full.
  std::size_t dropped() const {
    std::lock_guard lock(shared_->mutex);
    return shared_->dropped;
  }

 private:
  struct shared {
    shared(deliver_fn d, callback_limits l) : deliver(std::move(d)), limits(l) {}
    deliver_fn deliver;
    callback_limits limits;
    mutable std::mutex mutex;
    std::condition_variable wake, done_cv;
    std::deque<callback_record> queue;
    std::size_t dropped = 0;
    bool closing = false, done = false;
    std::map<std::string, trial_info> trials;  ///< the callback thread's only: trials started, not ended

    void run() {
      std::deque<callback_record> batch;
      for (;;) {
        {
          std::unique_lock lock(mutex);
          wake.wait_for(lock, limits.idle_wake, [&] { return closing || !queue.empty(); });
          batch.swap(queue);
          if (batch.empty() && closing) {
            done = true;
            done_cv.notify_all();
            return;
          }
        }
        for (auto const& e : batch) {
          if (e.what == callback_event::trial_start) trials[e.trial] = e.info;
          static trial_info const unknown{};
          auto it = trials.find(e.trial);
          deliver(e, it != trials.end() ? it->second : unknown);
          if (e.what == callback_event::trial_complete || e.what == callback_event::trial_error) trials.erase(e.trial);
        }
        batch.clear();
      }
    }
  };

  void post(callback_record e) {
    std::lock_guard lock(shared_->mutex);
    bool const end = e.what == callback_event::experiment_end;
    if (shared_->closing) return;
    if (shared_->queue.size() >= shared_->limits.max_queued_events && !end) {
      ++shared_->dropped;
      return;
    }
    shared_->queue.push_back(std::move(e));
  }

  std::shared_ptr<shared> shared_;
  std::thread thread_;
};

namespace detail {

/// Calls `c`'s member for event `e`, if it has one. on_trial_restore falls back to on_trial_start.
template <class C>
void call_callback(C& c, callback_record const& e, trial_info const& t) {
  switch (e.what) {
    case callback_event::experiment_start:
      if constexpr (requires { c.on_experiment_start(e.experiment); }) c.on_experiment_start(e.experiment);
      break;
    case callback_event::trial_start:
      if (!e.path.empty()) {
        if constexpr (requires { c.on_trial_restore(t, e.path); }) {
          c.on_trial_restore(t, e.path);
          break;
        }
      }
      if constexpr (requires { c.on_trial_start(t); }) c.on_trial_start(t);
      break;
    case callback_event::trial_result:
      if constexpr (requires { c.on_trial_result(t, e.data); }) c.on_trial_result(t, e.data);
      break;
    case callback_event::checkpoint:
      if constexpr (requires { c.on_checkpoint(t, e.path); }) c.on_checkpoint(t, e.path);
      break;
    case callback_event::trial_complete:
      if constexpr (requires { c.on_trial_complete(t); }) c.on_trial_complete(t);
      break;
    case callback_event::trial_error:
      if constexpr (requires { c.on_trial_error(t, std::string()); }) c.on_trial_error(t, e.data.get<std::string>());
      break;
    case callback_event::experiment_end:
      if constexpr (requires { c.on_experiment_end(e.experiment); }) c.on_experiment_end(e.experiment);
      break;
  }
}

}  // namespace detail

/// The runner for `callbacks` (moved into it), or none without callbacks. Each call is timed and
/// guarded: the first exception of a callback, and its first call of slow_call or more (but
/// on_experiment_end, where a tracker sends what it kept), are said on stderr (one line each);
/// it keeps getting events either way.
template <class... Callbacks>
std::unique_ptr<callback_runner> make_callback_runner(std::tuple<Callbacks...> callbacks, callback_limits limits = {}) {
  if constexpr (sizeof...(Callbacks) == 0) {
    return nullptr;
  } else {
    struct state {
      std::tuple<Callbacks...> callbacks;
      bool said_throw[sizeof...(Callbacks)] = {};
      bool said_slow[sizeof...(Callbacks)] = {};
    };
    auto s = std::make_shared<state>(state{std::move(callbacks)});
    auto deliver = [s, slow = limits.slow_call, queued = limits.max_queued_events](callback_record const& e, trial_info const& t) {
      std::size_t index = 0;
      auto one = [&](auto& c) {
        auto const i = index++;
        auto const start = std::chrono::steady_clock::now();
        std::string error;
        try {
          detail::call_callback(c, e, t);
        } catch (std::exception const& ex) {
          error = ex.what();
        } catch (...) {
          error = "an exception that is not a std::exception";
        }
        if (!error.empty() && !std::exchange(s->said_throw[i], true))
          std::cerr << "[cohort] callback " << i << " threw in " << event_name(e.what) << ": " << error
                    << "; training goes on (its later errors are not reported)\n";
        auto const took = std::chrono::steady_clock::now() - start;
        if (took >= slow && e.what != callback_event::experiment_end && !std::exchange(s->said_slow[i], true))
          std::cerr << "[cohort] callback " << i << " took "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms in " << event_name(e.what)
                    << "; training goes on, events wait for it (at most " << queued << ", then dropped)\n";
      };
      std::apply([&](auto&... c) { (one(c), ...); }, s->callbacks);
    };
    return std::make_unique<callback_runner>(std::move(deliver), limits);
  }
}

}  // namespace cohort::report
