#pragma once
/// \file
/// checkpointing::retained: rank 0's list of a run's committed checkpoints, kept to the
/// retention policy after every commit, with each checkpoint's asynchronous validation (Ray's
/// validate_fn) on a thread of its own and dropped checkpoints deleted on another.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/policies.hpp"
#include "cohort/detail/thread_start.hpp"

namespace cohort {

/// Validates a committed checkpoint (Ray's validate_fn): returns metrics merged into that
/// checkpoint's metrics. Runs on a background thread of rank 0; must not communicate.
using validate_fn = std::function<nlohmann::json(cohort::checkpoint const&)>;

namespace checkpointing {

/// A report's own validation `own`, then `every` (run_config's, for every checkpoint): their
/// metrics merged in that order. Either may be empty.
inline validate_fn validate_both(validate_fn const& own, validate_fn const& every) {
  if (!every || !own) return own ? own : every;
  return [own, every](cohort::checkpoint const& c) {
    auto m = own(c);
    if (m.is_object()) m.update(every(c));  // otherwise retained records the error
    return m;
  };
}

/// Rank 0's committed checkpoints of one run, oldest first; see the file comment. The list is
/// shared with the validation thread behind a mutex; every other member belongs to the thread
/// that commits checkpoints, one at a time: the training thread (checkpoint_mode::sync) or the
/// report protocol's worker thread (checkpoint_mode::async), never both in one run.
class retained {
 public:
  /// The checkpointing policy's decision: the indices of `all` to keep.
  using retain_fn = std::function<std::vector<std::size_t>(std::span<record const> all)>;

  retained() = default;
  retained(retained const&) = delete;
  retained& operator=(retained const&) = delete;
  /// Waits for the validation in flight and the deletion in flight.
  ~retained() {
    finish_validation();
    if (reaper_.joinable()) reaper_.join();
  }

  /// The run directory and the policy (none: keep all).
  void open(std::filesystem::path run_path, retain_fn retain) {
    run_path_ = std::move(run_path);
    retain_ = std::move(retain);
  }
  /// A prefix unique to this attempt for the names of dropped checkpoints in <run>/.trash/.
  void set_trash_prefix(std::string prefix) { trash_prefix_ = std::move(prefix); }

  /// At setup, before any commit: a checkpoint of an earlier attempt, for the policy.
  void restore(record r) { records_.push_back(std::move(r)); }

  /// After committing checkpoint `iteration` with `row`: lists it, applies the policy, and starts
  /// `validate` on it when given. Until its validation ends a checkpoint is never deleted; then
  /// its metrics are merged with the validation's (same key overwrites), written to its
  /// validation.json, and the policy applied again, so best-K ranks by them. A validation that
  /// throws records {"validation_error": ...} instead; it does not fail the run.
  void add(std::int64_t iteration, nlohmann::json const& row, validate_fn const& validate = {}) {
    {
      std::lock_guard lock(mutex_);
      records_.push_back({static_cast<std::size_t>(iteration), row});
      apply_policy();
    }
    if (validate) start_validation(iteration, validate);
  }

  /// Waits for the validation in flight (before the list is read at the end of fit()).
  void finish_validation() {
    if (validator_.joinable()) validator_.join();
  }

  /// The checkpoints kept, oldest first. Call after finish_validation() (or before any add()).
  std::vector<record> const& records() const { return records_; }

  /// The directory of checkpoint `iteration`.
  std::filesystem::path path_of(std::int64_t iteration) const { return run_path_ / dir_name(iteration); }

 private:
  void start_validation(std::int64_t iteration, validate_fn validate) {
    {
      std::lock_guard lock(mutex_);
      validating_.push_back(iteration);
    }
    finish_validation();  // at most one in flight
    validator_ = std::thread([this, iteration, validate = std::move(validate)] {
      cohort::detail::begin_background_thread("cohort-validate");
      auto const dir = path_of(iteration);
      nlohmann::json m;
      try {
        m = validate(cohort::checkpoint::from_directory(dir));
        if (!m.is_object()) m = {{"validation_error", "validate_fn must return a JSON object, got " + m.dump()}};
      } catch (std::exception const& e) {
        m = {{"validation_error", e.what()}};
      }
      std::lock_guard lock(mutex_);
      std::error_code ec;
      if (std::filesystem::exists(dir, ec)) std::ofstream(dir / "validation.json") << m.dump(2) << "\n";
      for (auto& r : records_)
        if (static_cast<std::int64_t>(r.iteration) == iteration) r.metrics.update(m);
      validating_.erase(std::find(validating_.begin(), validating_.end(), iteration));
      apply_policy();
    });
  }

  /// Holding mutex_: deletes the checkpoints the policy does not keep (none being validated).
  void apply_policy() {
    if (!retain_) return;
    auto keep = retain_(records_);
    std::vector<record> kept;
    for (std::size_t i = 0; i < records_.size(); ++i) {
      auto const iteration = static_cast<std::int64_t>(records_[i].iteration);
      bool const validating = std::find(validating_.begin(), validating_.end(), iteration) != validating_.end();
      if (validating || std::find(keep.begin(), keep.end(), i) != keep.end()) {  // ranked once validated
        kept.push_back(records_[i]);
        continue;
      }
      discard(path_of(iteration));
    }
    records_ = std::move(kept);
  }

  /// Holding mutex_: takes a checkpoint the policy dropped out of the run directory at once (a
  /// rename into .trash/) and deletes it on a background thread, so that deleting a large
  /// checkpoint does not hold up training (the destructor waits for it).
  void discard(std::filesystem::path const& dir) {
    std::error_code ec;
    auto const trash = run_path_ / ".trash";
    if (std::filesystem::symlink_status(trash, ec).type() != std::filesystem::file_type::directory) {
      std::filesystem::remove(trash, ec);  // a link (or file) named .trash is never followed, nor emptied
      std::filesystem::create_directory(trash, ec);
    }
    std::filesystem::rename(dir, trash / (trash_prefix_ + dir.filename().string()), ec);
    if (ec) {  // cannot move it: delete it here
      std::filesystem::remove_all(dir, ec);
      return;
    }
    if (reaper_.joinable()) reaper_.join();  // one deletion at a time
    reaper_ = std::thread([trash] {
      cohort::detail::begin_background_thread("cohort-reaper");
      std::error_code e;
      for (auto const& entry : std::filesystem::directory_iterator(trash, e)) std::filesystem::remove_all(entry.path(), e);
    });
  }

  std::filesystem::path run_path_;
  retain_fn retain_;
  std::string trash_prefix_;
  std::mutex mutex_;
  std::vector<record> records_;          ///< guarded by mutex_ while a validation runs
  std::vector<std::int64_t> validating_;  ///< checkpoints whose validation has not finished: never deleted
  std::thread validator_;                ///< at most one validation in flight
  std::thread reaper_;                   ///< deletes dropped checkpoints
};

}  // namespace checkpointing

}  // namespace cohort
