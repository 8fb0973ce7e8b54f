#pragma once
/// \file
/// The messages between the tuner's group leaders and its coordinator on rank 0: JSON values sent
/// point to point as MessagePack on the tuner's duplicate of MPI_COMM_WORLD, one tag per kind of
/// message, and the trials as one MessagePack message for the broadcast at the end of an experiment.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/comm/deadline.hpp"
#include "cohort/report/recorder.hpp"
#include "cohort/tuning/decision.hpp"
#include "cohort/tuning/history_codec.hpp"
#include "cohort/tuning/result_grid.hpp"

namespace cohort::tuning::detail {

/// Message tags between group leaders and the coordinator (on a duplicate of MPI_COMM_WORLD).
/// Every result is answered with one reply_tag message, except quiet results (quiet_results),
/// which are not answered; every request with one assignment_tag message, which may come while
/// the group's trial runs (a request ahead: trial_book::reservation).
enum tag : int { request_tag = 1, result_tag = 2, complete_tag = 3, reply_tag = 11, assignment_tag = 12 };

/// Sends `j` as MessagePack (nlohmann::json::to_msgpack: half the time of JSON text to write,
/// two thirds to read; a result is one message) to `dest` with `tag`.
inline void send_json(MPI_Comm comm, int dest, int tag, nlohmann::json const& j) {
  std::string bytes;
  nlohmann::json::to_msgpack(j, bytes);
  MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, comm);
}

/// Receives one message that send_json sent from `source` with `tag` (MPI_ANY_SOURCE/MPI_ANY_TAG
/// allowed) and decodes it; `status` receives the sender and tag.
inline nlohmann::json recv_json(MPI_Comm comm, int source, int tag, MPI_Status* status = nullptr) {
  MPI_Status st;
  // Polled, not MPI_Probe: Open MPI's blocking probe spins on a core, and a leader waiting for
  // the coordinator's answer would take that core from rank 0's coordinator thread, which has
  // to run for the answer to come (bench_tune trials/N, results/N at 2 ranks on 2 cores). It
  // yields for the first 200 us, which covers an answer the coordinator gives at once, then
  // sleeps 20 us between polls: on a VM a 20 us sleep takes 50-70 us to wake from (bench_tune
  // scale/N: the answer to a request for the next trial).
  int flag = 0;
  auto const spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  for (int polls = 0;; ++polls) {
    MPI_Iprobe(source, tag, comm, &flag, &st);
    if (flag) break;
    if (polls < 20 || std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    else comm::detail::precise_sleep(std::chrono::microseconds(20));
  }
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  std::string bytes(static_cast<std::size_t>(n), '\0');
  MPI_Recv(bytes.data(), n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
  if (status) *status = st;
  return nlohmann::json::from_msgpack(bytes);
}

/// Trials shorter than this are short (bench_tune scale/N): the coordinator reserves a group's
/// next one ahead (coordinator::on_request), and the group tells a short trial's end from its
/// files' thread, starting the next trial without waiting for the files (sent_in_order). A
/// longer trial's end waits for its files on the training thread: it saves too little of the
/// trial to be worth the files' thread's turn on busy cores (bench_tune results/N).
inline constexpr auto short_trial = std::chrono::milliseconds(100);

/// How many requests a group leader keeps unanswered while its trial runs: as each trial starts it
/// asks for the next, and as its first starts it asks once more, so that the coordinator may
/// reserve a group's next two trials while their trials are very short (under
/// very_short_trial). The answer then has two trials' time to come: one trial of 0.15 ms was less
/// than the coordinator thread took to get a core on busy cores and answer (bench_tune
/// trials/N). Longer trials get one reserved: a second would only let the group that holds it
/// run two trials at the experiment's end while another has none.
inline constexpr std::size_t requests_ahead = 2;
inline constexpr auto very_short_trial = std::chrono::milliseconds(1);  ///< see requests_ahead

/// A trial group leader's messages to the coordinator, sent in order with its trials' files
/// (report::file_writer): on the files' thread while they are written beside training, else at
/// once. A trial's completion goes once its files are written (end_run), and the next trial
/// need not wait for that; its results wait() for the messages before them.
class sent_in_order {
 public:
  /// Calls `send` after the files' jobs started before it.
  template <class Send>
  void start(report::file_writer& files, Send send) {
    ++started_;
    files.start([this, send = std::move(send)]() mutable { counted([&] { send(); }); });
  }
  /// files.end_run(): `then(failure)` once the run's files are written; `here`: on this
  /// thread, having waited for them.
  template <class Then>
  void end_run(report::file_writer& files, Then then, bool here) {
    ++started_;
    files.end_run([this, then = std::move(then)](std::optional<std::string> failure) mutable {
      counted([&] { then(failure); });
    }, here);
  }
  /// Returns once every message started has been sent; throws what a send threw.
  void wait() {
    for (auto n = sent_.load(); n < started_; n = sent_.load()) sent_.wait(n);
    if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
  }

 private:
  template <class F>
  void counted(F&& f) {
    try {
      f();
    } catch (...) {
      failed_ = std::current_exception();  // read by wait() after the count below
    }
    sent_.fetch_add(1);
    sent_.notify_all();
  }

  std::uint64_t started_ = 0;  ///< the leader's thread only
  std::atomic<std::uint64_t> sent_{0};
  std::exception_ptr failed_;
};

/// Messages in flight, each one's bytes kept until its MPI_Isend completes: a group leader's
/// quiet results, and the coordinator's assignments (a reservation reaches a leader that is
/// training). A send that waits for the receiver (shared memory has a few fragments per peer)
/// does not spin in MPI_Send: that would take a core from the thread that is to receive it.
class quiet_sends {
 public:
  quiet_sends() = default;
  quiet_sends(quiet_sends const&) = delete;
  quiet_sends& operator=(quiet_sends const&) = delete;
  ~quiet_sends() { wait(); }

  /// Sends `j` as send_json does, without waiting for it to be received.
  void send(MPI_Comm comm, int dest, int tag, nlohmann::json const& j) {
    forget_done();
    auto& [bytes, request] = sends_.emplace_back(std::string{}, MPI_REQUEST_NULL);
    nlohmann::json::to_msgpack(j, bytes);
    MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, comm, &request);
  }

  /// Waits for every send, polling (20 us apart) rather than spinning.
  void wait() {
    for (forget_done(); !sends_.empty(); forget_done()) comm::detail::precise_sleep(std::chrono::microseconds(20));
  }

 private:
  /// Drops the completed sends from the oldest on, up to the first still in flight.
  void forget_done() {
    for (int done = 1; done && !sends_.empty();) {
      MPI_Test(&sends_.front().second, &done, MPI_STATUS_IGNORE);
      if (done) sends_.pop_front();
    }
  }

  std::deque<std::pair<std::string, MPI_Request>> sends_;
};

/// A group leader's quiet results: those of its trial that the coordinator's last answer (or the
/// trial's assignment) said it is sure to answer "proceed" (the answer's "quiet" member: a
/// trial_book::quiet_span). The leader sends them with "quiet": true and does not wait; the
/// coordinator answers none of them, and any other decision it takes on one waits for the
/// trial's next waiting result. Results go quiet for `max_quiet` after an answer, and the first
/// one after it however late it comes: a stopping experiment or an owed decision reaches the
/// trial within max_quiet or one report, and a trial that reports every 50 ms waits for every
/// other answer instead of every one (bench_tune scale/N).
class quiet_results {
 public:
  static constexpr std::chrono::milliseconds max_quiet{10};

  /// Whether `row` goes without waiting for the answer; counts it when it does.
  bool send_quiet(nlohmann::json const& row) {
    if (!span_ || (sent_since_answer_ > 0 && std::chrono::steady_clock::now() >= until_)) return false;
    if (!span_->key.empty()) {
      auto const* v = tuning::detail::find_key(row, span_->key);
      if (!v || !v->is_number() || !(v->get<double>() < span_->below)) return false;
    }
    ++sent_since_answer_;
    return true;
  }

  /// The coordinator answered: its span (none when the answer has no "quiet"), from now.
  void answered(nlohmann::json const& reply) {
    span_.reset();
    sent_since_answer_ = 0;
    auto it = reply.find("quiet");
    if (it == reply.end()) return;
    span_ = proceed_span{.key = it->value("key", std::string{}), .below = it->value("below", std::numeric_limits<double>::infinity())};
    until_ = std::chrono::steady_clock::now() + max_quiet;
  }

  /// The "quiet" member of an answer for `span` (JSON text has no infinity: an unbounded span has no "below").
  static nlohmann::json to_json(proceed_span const& span) {
    nlohmann::json j{{"key", span.key}};
    if (span.below < std::numeric_limits<double>::infinity()) j["below"] = span.below;
    return j;
  }

 private:
  std::optional<proceed_span> span_;
  std::chrono::steady_clock::time_point until_{};
  std::size_t sent_since_answer_ = 0;
};

/// A group leader's quiet results waiting to go as one message ({"trial_id", "quiet": true,
/// "rows": their history bytes}) instead of one each: the coordinator then probes, receives and
/// decodes once per batch, and reads no key per row. A batch goes once it is max_age old or holds
/// max_rows, and at once when its result came max_age or more after the one before (reports
/// that far apart go one by one, as they come); the leader sends what waits before any other
/// message and when its trial ends.
class quiet_batch {
 public:
  static constexpr std::chrono::milliseconds max_age{1};
  static constexpr std::size_t max_rows = 256;

  /// Adds `row`; whether the batch is to be sent now (take()).
  bool add(nlohmann::json const& row) {
    auto const now = std::chrono::steady_clock::now();
    bool const after_gap = now - last_ >= max_age;
    if (rows_.size() == 0) first_ = now;
    last_ = now;
    rows_.add(row);
    return after_gap || rows_.size() >= max_rows || now - first_ >= max_age;
  }
  bool empty() const { return rows_.size() == 0; }
  /// The message of the rows waiting, which are then forgotten.
  nlohmann::json take(std::string const& trial_id) {
    return {{"trial_id", trial_id}, {"quiet", true}, {"rows", nlohmann::json::binary(rows_.take())}};
  }

 private:
  history_writer rows_;
  std::chrono::steady_clock::time_point first_{};  ///< the oldest waiting row's report
  std::chrono::steady_clock::time_point last_{};   ///< the last report added
};

/// The positions of a trial's fields in encode_trials' message (each checkpoint: [path, metrics]).
struct trial_fields {
  enum : std::size_t { id, status, config, metrics, history, path, checkpoints, num_failures, error, count };
};

/// Swaps trial `t`'s JSON values but its history with those of `j`, an array in trial_fields
/// order (the same call puts them back).
inline void swap_trial_values(tuning::trial_result& t, nlohmann::json& j) {
  using f = trial_fields;
  std::swap(t.config, j[f::config]);
  std::swap(t.metrics, j[f::metrics]);
  auto& checkpoints = j[f::checkpoints];
  for (std::size_t i = 0; i < t.checkpoints.size(); ++i) std::swap(t.checkpoints[i].metrics, checkpoints[i][1]);
}

/// The trials as MessagePack (nlohmann::json::to_msgpack), for the broadcast at the end of an
/// experiment: a third faster to write and to read than JSON text, and NaN stays NaN. Each trial
/// is an array of its fields in a fixed order (trial_fields), not an object: no key is written or
/// looked up. Its JSON values (config, metrics, each checkpoint's metrics) are moved into the
/// message's tree and back, never copied; its history goes as encode_history's bytes, its keys
/// once (bench_tune: the other ranks decode every trial of the experiment, and results/N's
/// 100,000 rows took 0.33 s to read as MessagePack).
inline std::string encode_trials(std::vector<tuning::trial_result>& trials) {
  nlohmann::json all = nlohmann::json::array();
  all.get_ref<nlohmann::json::array_t&>().reserve(trials.size());
  struct put_back {  // the values go back to the trials however the encoding ends
    std::vector<tuning::trial_result>& trials;
    nlohmann::json& all;
    ~put_back() {
      for (std::size_t i = 0; i < all.size(); ++i) swap_trial_values(trials[i], all[i]);
    }
  } const guard{trials, all};
  for (auto& t : trials) {
    auto checkpoints = nlohmann::json::array();
    for (auto const& c : t.checkpoints) checkpoints.push_back(nlohmann::json::array({c.path.string(), nullptr}));
    auto& j = all.emplace_back(nlohmann::json::array({t.id, t.status, nullptr, nullptr,
                                                      nlohmann::json::binary(encode_history(t.metrics_history)), t.path.string(),
                                                      std::move(checkpoints), t.num_failures,
                                                      t.error ? nlohmann::json(*t.error) : nlohmann::json()}));
    swap_trial_values(t, j);
  }
  std::string bytes;
  nlohmann::json::to_msgpack(all, bytes);
  return bytes;
}

/// What encode_trials wrote, the JSON values moved out of the decoded tree.
inline std::vector<tuning::trial_result> decode_trials(std::string const& bytes) {
  using f = trial_fields;
  auto all = nlohmann::json::from_msgpack(bytes);
  std::vector<tuning::trial_result> out;
  out.reserve(all.size());
  for (auto& j : all) {
    if (!j.is_array() || j.size() != f::count) throw std::runtime_error("decode_trials: not a trial's fields");
    auto& t = out.emplace_back();
    t.id = std::move(j[f::id].get_ref<std::string&>());
    t.status = std::move(j[f::status].get_ref<std::string&>());
    t.path = std::move(j[f::path].get_ref<std::string&>());
    t.num_failures = j[f::num_failures].get<std::size_t>();
    if (j[f::error].is_string()) t.error = std::move(j[f::error].get_ref<std::string&>());
    for (auto& c : j[f::checkpoints]) t.checkpoints.push_back({std::move(c[0].get_ref<std::string&>()), nlohmann::json()});
    if (!j[f::history].is_binary()) throw std::runtime_error("decode_trials: not a trial's fields");
    t.metrics_history = decode_history(j[f::history].get_binary());
    swap_trial_values(t, j);
  }
  return out;
}

}  // namespace cohort::tuning::detail
