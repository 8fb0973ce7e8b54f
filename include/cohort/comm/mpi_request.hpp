#pragma once
/// \file
/// comm::mpi_request: a non-blocking MPI collective in flight, waited for with its
/// communicator's deadline.

#include <mpi.h>

#include <functional>
#include <utility>
#include <vector>

#include "cohort/comm/communicator.hpp"
#include "cohort/comm/deadline.hpp"
#include "cohort/comm/mpi_types.hpp"

namespace cohort::comm {

/// A non-blocking MPI collective in flight (move-only, no heap allocation unless the buffer
/// needed more than one MPI call). wait() has the deadline of the communicator that started it.
/// Destroying an unfinished request waits for it.
class mpi_request {
 public:
  mpi_request() = default;
  /// `then` runs once, on this rank, when the collective has completed (reduce_op::avg's division).
  mpi_request(MPI_Request first, std::vector<MPI_Request> rest, std::function<void()> then = {}, collective what = {},
              int timeout_ms = 0)
      : first_(first), rest_(std::move(rest)), then_(std::move(then)), what_(what), timeout_ms_(timeout_ms) {}
  mpi_request(mpi_request&& o) noexcept
      : first_(std::exchange(o.first_, MPI_REQUEST_NULL)), rest_(std::exchange(o.rest_, {})),
        then_(std::exchange(o.then_, {})), what_(o.what_), timeout_ms_(o.timeout_ms_) {}
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      first_ = std::exchange(o.first_, MPI_REQUEST_NULL);
      rest_ = std::exchange(o.rest_, {});
      then_ = std::exchange(o.then_, {});
      what_ = o.what_;
      timeout_ms_ = o.timeout_ms_;
    }
    return *this;
  }
  mpi_request(mpi_request const&) = delete;
  mpi_request& operator=(mpi_request const&) = delete;
  ~mpi_request() { finish_quietly(); }

  /// Blocks until the collective has completed on this rank; past the deadline, ends the job
  /// with an error naming the collective (comm::timeout_message).
  void wait() {
    detail::wait_all(&first_, 1, what_, timeout_ms_);
    if (!rest_.empty()) detail::wait_all(rest_.data(), static_cast<int>(rest_.size()), what_, timeout_ms_);
    completed();
  }
  /// Drives progress; true once the collective has completed on this rank.
  bool test() {
    int done = 0;
    detail::check_mpi(MPI_Test(&first_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done && !rest_.empty())
      detail::check_mpi(MPI_Testall(static_cast<int>(rest_.size()), rest_.data(), &done, MPI_STATUSES_IGNORE),
                        "MPI_Testall");
    if (done) completed();
    return done != 0;
  }
  /// The collective, as error messages name it.
  collective const& what() const { return what_; }

 private:
  void completed() {
    if (then_) std::exchange(then_, {})();
  }
  void finish_quietly() noexcept {
    if (first_ != MPI_REQUEST_NULL) detail::wait_all(&first_, 1, what_, timeout_ms_);
    if (!rest_.empty()) detail::wait_all(rest_.data(), static_cast<int>(rest_.size()), what_, timeout_ms_);
    rest_.clear();
    then_ = {};  // the buffer may be gone: an abandoned request is not finished
  }
  MPI_Request first_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> rest_;
  std::function<void()> then_;
  collective what_{};
  int timeout_ms_ = 0;
};

}  // namespace cohort::comm
