#pragma once
/// \file
/// Deadlines on collectives. comm::mpi starts every collective non-blocking and waits for it
/// here: past the communicator's timeout, or when another rank gave up (the alarm), the rank
/// prints one line naming the collective and where its functor is, and the job is aborted; when
/// the job is being killed (SIGTERM while a peer does not answer), it says where it waits. Never
/// a hang.

#include <mpi.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>


namespace cohort::comm {

namespace detail {

/// The signal (SIGTERM, SIGINT) this process received during fit(), 0 if none: set by the
/// trainer's handler, read by report() and by collectives waiting past their peers' death.
inline std::atomic<int>& stop_signal() {
  static std::atomic<int> s{0};
  return s;
}

}  // namespace detail

/// A collective in flight, as error messages name it.
struct collective {
  char const* kind = "";       ///< "allreduce", "broadcast", "allgather", "barrier", "split"
  char const* comm_name = "";  ///< the communicator's name (mpi_options::name)
  std::uint64_t sequence = 0;  ///< its number on that communicator, from 1
  std::size_t bytes = 0;       ///< this rank's payload
};

/// Pure: a collective as messages name it, e.g. "allreduce #12 on 'gradients' (4096 bytes)".
inline std::string describe(collective const& c) {
  return std::string(c.kind) + " #" + std::to_string(c.sequence) + " on '" + c.comm_name + "' (" +
         std::to_string(c.bytes) + " bytes)";
}

/// Pure: " (at report 3, backward 41)" from a position, or nothing when it is empty.
inline std::string position_suffix(std::string const& position) {
  return position.empty() ? std::string{} : " (this rank is at " + position + ")";
}

/// Pure: the line a rank prints when a collective outlived its deadline (comm::mpi; the NCCL
/// backend uses the same shape).
inline std::string timeout_message(int rank, collective const& c, int timeout_ms, std::string const& position) {
  return "[cohort] rank " + std::to_string(rank) + ": error: " + describe(c) + " did not complete within " +
         std::to_string(timeout_ms) + " ms" + position_suffix(position) +
         ": another rank is stopped, dead, unreachable or on another code path (check every rank's log), or the "
         "step is slower than the deadline (raise run_config.collective_timeout_ms): aborting the job";
}

namespace detail {

/// What this process's functor is doing ("report 3, backward 41"), for deadline messages: set
/// by the trainer for the duration of fit(), empty otherwise.
class position_source {
 public:
  void set(std::function<std::string()> f) {
    std::lock_guard lock(mutex_);
    describe_ = std::move(f);
  }
  std::string operator()() {
    std::lock_guard lock(mutex_);
    return describe_ ? describe_() : std::string{};
  }

 private:
  std::mutex mutex_;
  std::function<std::string()> describe_;
};

inline position_source& position() {
  static position_source p;
  return p;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// The job's alarm: one message from a rank that is ending the job to every other rank, so that
/// each rank waiting in a collective prints where it is before the job is aborted. A duplicate of
/// MPI_COMM_WORLD with one receive posted; set up by cohort::environment (MPI_THREAD_MULTIPLE),
/// absent when MPI was initialised by someone else.
class alarm {
 public:
  static constexpr int tag = 0x616c;  // "al"

  void start() {
    if (comm_ != MPI_COMM_NULL) return;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Irecv(&from_, 1, MPI_INT, MPI_ANY_SOURCE, tag, comm_, &pending_);
  }
  /// Before MPI_Finalize.
  void stop() {
    std::lock_guard lock(mutex_);
    if (comm_ == MPI_COMM_NULL) return;
    if (pending_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&pending_);
      MPI_Wait(&pending_, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  /// The rank that raised the alarm, or -1. Cheap to call often; one thread at a time tests.
  int poll() {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock || comm_ == MPI_COMM_NULL || pending_ == MPI_REQUEST_NULL) return -1;
    int done = 0;
    MPI_Test(&pending_, &done, MPI_STATUS_IGNORE);
    return done ? from_ : -1;
  }
  /// Tells every other rank (without waiting: some may be gone).
  void raise() {
    std::lock_guard lock(mutex_);
    if (comm_ == MPI_COMM_NULL) return;
    int size = 0;
    MPI_Comm_size(comm_, &size);
    me_ = world_rank();
    for (int r = 0; r < size; ++r) {
      if (r == me_) continue;
      MPI_Request req;
      MPI_Isend(&me_, 1, MPI_INT, r, tag, comm_, &req);
      MPI_Request_free(&req);
    }
  }

 private:
  std::mutex mutex_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  int from_ = -1;
  int me_ = 0;
};

inline alarm& job_alarm() {
  static alarm a;
  return a;
}

/// How long a rank that ends the job waits after raising the alarm, so that the ranks waiting in
/// collectives print their own line before MPI_Abort takes them down.
inline constexpr auto alarm_grace = std::chrono::milliseconds(1000);
/// After this long, a wait of a job that spans hosts (or has more ranks than cores) polls every
/// poll_interval instead of spinning: a collective across hosts takes milliseconds, and a
/// spinning poll would take the core from the backward pass it overlaps and from the kernel's
/// network stack that carries it (bench/compare/hosts: the CNN across 2 hosts at 1 Gbit/s,
/// docs/benchmarks.md).
inline constexpr auto spin_wait = std::chrono::microseconds(50);
/// How often a wait past spin_wait polls while the link's rate is not known (link_rate), and at
/// the least: at 1 Gbit/s 20 us is 2.5 KB, far less than what the kernel's socket buffers hold, so
/// the transfer does not stall between polls.
inline constexpr auto poll_interval = std::chrono::microseconds(20);
/// The most a wait past spin_wait sleeps between polls on a slow link (poll_interval_for).
inline constexpr auto max_poll_interval = std::chrono::microseconds(500);
/// The bytes a link carries between two polls (poll_interval_for): far less than what Open MPI's
/// TCP transport keeps moving without a progress call (3 fragments of 128 KiB in flight, the
/// sockets' buffers), so a transfer does not stall between polls; at memory speed (a link
/// between containers) it is the 20 us floor.
inline constexpr std::size_t bytes_per_poll = std::size_t{16} << 10;
/// Transfers of at least this many bytes each way tell the link's rate (note_transfer).
inline constexpr std::size_t rate_sample_min_bytes = std::size_t{64} << 10;
/// After this long (another trial group's work, a peer's long evaluation), every 100 us.
inline constexpr auto long_wait = std::chrono::milliseconds(100);
inline constexpr auto long_poll_interval = std::chrono::microseconds(100);

/// Pure: how long a wait spins before it polls, for a job of `world_ranks` ranks of which
/// `ranks_on_node` run on this node of `node_cores` cores. Every rank on this node, a core each:
/// long_wait. Shared memory moves a message only as the ranks' own progress calls copy it, so
/// a sleeping poll stalls it: a two-rank ring all-reduce of 1 MiB (comm::mpi's Isend/Irecv
/// pairs) took 330 us spinning and 630 us polling every 20 us after 50 us (docs/benchmarks.md,
/// "Gradient synchronisation"). Across hosts, or with more ranks than cores: spin_wait.
constexpr std::chrono::microseconds spin_limit(int world_ranks, int ranks_on_node, int node_cores) {
  bool const one_node_a_core_each = world_ranks == ranks_on_node && ranks_on_node <= node_cores;
  return one_node_a_core_each ? std::chrono::microseconds(long_wait) : spin_wait;
}

/// This process's spin limit (spin_limit), set when cohort starts MPI (environment.hpp); spin_wait
/// until then, and where MPI was started by someone else.
inline std::atomic<std::int64_t>& spin_limit_us() {
  static std::atomic<std::int64_t> us{spin_wait.count()};
  return us;
}

/// Pure: how long a wait that has lasted `waited` sleeps before its next poll, on a link that
/// moves `bytes_per_s` each way (0: not known): the time bytes_per_poll takes, up to
/// max_poll_interval, and at most half of `waited` (a short wait, such as the ranks' agreement,
/// is seen done at most half its length late), never under poll_interval (long_poll_interval
/// once it has lasted long_wait). Each poll wakes a thread that shares the core with backward:
/// across two hosts of one core each at 200 Mbit/s, polling every 20 us took 19 ms of the core
/// per CNN step (its all-reduce: 67 ms), every 500 us 5 ms (docs/benchmarks.md, "Across hosts").
constexpr std::chrono::microseconds poll_interval_for(double bytes_per_s, std::chrono::microseconds waited) {
  auto const least = waited > long_wait ? long_poll_interval : poll_interval;
  if (!(bytes_per_s > 0)) return least;
  double const link_us = std::min(static_cast<double>(bytes_per_poll) / bytes_per_s * 1e6,
                                  static_cast<double>(max_poll_interval.count()));
  auto const us = static_cast<std::int64_t>(std::min(link_us, static_cast<double>(waited.count()) / 2));
  return std::max(least, std::chrono::microseconds(us));
}

/// Pure: the link's rate after a transfer of `bytes` each way that took `seconds`, given the
/// estimate before (`before`, 0: none): the faster of the new sample and nine tenths of the
/// estimate (a wait that began before the peer was ready reads slower than the link, never
/// faster; the decay follows a link that became slower). Transfers under rate_sample_min_bytes
/// leave it as it was.
constexpr double next_link_rate(double before, std::size_t bytes, double seconds) {
  if (bytes < rate_sample_min_bytes || !(seconds > 0)) return before;
  double const sample = static_cast<double>(bytes) / seconds;
  return std::max(sample, 0.9 * before);
}

/// This process's estimate of its links' rate in bytes per second each way (next_link_rate), 0
/// until a transfer told it; read by every wait (poll_interval_for).
inline std::atomic<double>& link_rate() {
  static std::atomic<double> rate{0};
  return rate;
}

/// Feeds a completed transfer of `bytes` each way that took `seconds` to link_rate.
inline void note_transfer(std::size_t bytes, double seconds) {
  auto& r = link_rate();
  r.store(next_link_rate(r.load(std::memory_order_relaxed), bytes, seconds), std::memory_order_relaxed);
}

/// Sleeps `d` with a timer slack of 1 us on the calling thread (Linux's default, 50 us, would
/// more than triple a 20 us poll interval).
inline void precise_sleep(std::chrono::microseconds d) {
#ifdef __linux__
  thread_local bool const slack_set = ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
#endif
  std::this_thread::sleep_for(d);
}
/// How long a collective waits once the process got SIGTERM or SIGINT before it says where it
/// waits: mpirun sends SIGTERM to every rank when one dies, and SIGKILL 1 s later.
inline constexpr auto signal_grace = std::chrono::milliseconds(300);

/// Whether abort_job raises the job's alarm first, so that the other ranks say why they stop.
enum class other_ranks {
  alarmed,       ///< raise the alarm: a failure they do not know of
  already_know,  ///< no alarm: they reached the same failure, or raised the alarm themselves
};

/// Prints `line`, raises the alarm (unless `others` already know) and aborts the job. The first
/// caller in the process does; any other thread arriving here waits for the abort.
[[noreturn]] inline void abort_job(std::string const& line, other_ranks others = other_ranks::alarmed) {
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  auto const text = line + "\n";
  [[maybe_unused]] auto written = ::write(2, text.data(), text.size());
  if (others == other_ranks::alarmed) {
    job_alarm().raise();
    std::this_thread::sleep_for(alarm_grace);
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

/// Waits for `n` requests of one collective, without a deadline when `timeout_ms` is 0. Ends the
/// job (abort_job) when the deadline passes or when another rank raised the alarm. When a stop
/// signal arrived and the peers still do not answer after signal_grace, says so once (mpirun
/// kills the other ranks that way when one dies) and goes on waiting.
inline void wait_all(MPI_Request* requests, int n, collective const& what, int timeout_ms) {
  using clock = std::chrono::steady_clock;
  int done = 0;
  MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
  if (done) return;
  auto const start = clock::now();
  auto next_alarm_check = start;
  clock::time_point signalled{};
  bool told = false;
  for (;;) {
    MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    auto const now = clock::now();
    // Past the spin limit (a transfer across hosts, another trial group's work, a peer's long
    // evaluation), poll as often as the link needs (poll_interval_for), leaving the core to
    // whoever works meanwhile.
    if (now - start > std::chrono::microseconds(spin_limit_us().load(std::memory_order_relaxed)))
      precise_sleep(poll_interval_for(link_rate().load(std::memory_order_relaxed),
                                      std::chrono::duration_cast<std::chrono::microseconds>(now - start)));
    if (timeout_ms > 0 && now - start > std::chrono::milliseconds(timeout_ms))
      abort_job(timeout_message(world_rank(), what, timeout_ms, position()()));
    if (now < next_alarm_check) continue;
    next_alarm_check = now + std::chrono::milliseconds(1);
    if (int const from = job_alarm().poll(); from >= 0)
      abort_job("[cohort] rank " + std::to_string(world_rank()) + ": error: rank " + std::to_string(from) +
                    " is ending the job (see its error) while this rank waits in " + describe(what) +
                    position_suffix(position()()) + ": aborting",
                other_ranks::already_know);
    if (int const s = detail::stop_signal().load(); s != 0 && !told) {
      if (signalled == clock::time_point{}) signalled = now;
      if (now - signalled > signal_grace) {
        // Said once, and the wait goes on: if a rank died, the launcher kills this one next;
        // if the collective completes after all, the run stops at its next report.
        told = true;
        auto const text = "[cohort] rank " + std::to_string(world_rank()) + ": error: " + (s == SIGINT ? "SIGINT" : "SIGTERM") +
                          " received while waiting in " + describe(what) + position_suffix(position()()) +
                          ", which the other ranks have not completed " + std::to_string(signal_grace.count()) +
                          " ms later: a rank died or the job is being cancelled; committed checkpoints are intact, "
                          "rerun the same command to resume\n";
        [[maybe_unused]] auto written = ::write(2, text.data(), text.size());
      }
    }
  }
}

/// Polls `done` until it is true, for rank `rank` that failed on its own with `failure`; after
/// `timeout_ms`, prints the failure and aborts the job (the other ranks, told by the alarm, print
/// where they wait); when another rank ends the job meanwhile, prints the failure and goes too.
template <class Done>
void wait_or_abort(Done done, int timeout_ms, int rank, std::string const& failure) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (job_alarm().poll() >= 0)  // another rank is ending the job: say why this one stopped
      abort_job("[cohort] rank " + std::to_string(rank) + ": error: " + failure, other_ranks::already_know);
    if (std::chrono::steady_clock::now() > deadline)
      abort_job("[cohort] rank " + std::to_string(rank) + ": error: " + failure + "\n[cohort] rank " + std::to_string(rank) +
                ": the other ranks did not finish within " + std::to_string(timeout_ms) +
                " ms of this rank's error (they are likely blocked in a collective it will not enter): aborting the job");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace detail

}  // namespace cohort::comm
