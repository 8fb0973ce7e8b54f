#pragma once
/// \file
/// The trials of one experiment as the book of trials keeps them: each trial's state by id, their
/// creation order, the lines they wait in (queued to run, paused) and how many run, with the
/// views the status table, trials.csv, experiment_state.json and the result grid are made from.
/// No decisions: trial_book decides, the roster records.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/report/html_report.hpp"
#include "cohort/report/trial_table.hpp"
#include "cohort/tuning/experiment_state.hpp"
#include "cohort/tuning/result_grid.hpp"

namespace cohort::tuning::detail {

/// Every trial of the experiment in directory `exp`, by id and in creation order, and the lines
/// they wait in. A trial is in at most one line; its status says which (PENDING: queued, PAUSED:
/// paused, RUNNING: counted in running()).
class trial_roster {
 public:
  explicit trial_roster(std::filesystem::path exp) : exp_(std::move(exp)) {}
  trial_roster(trial_roster&&) = default;  // the map's nodes, which ordered_ points to, move with it
  trial_roster& operator=(trial_roster&&) = default;
  trial_roster(trial_roster const&) = delete;
  trial_roster& operator=(trial_roster const&) = delete;

  /// Adds `t` last in creation order (in no line yet).
  trial_state& add(trial_state t) {
    order_.push_back(t.id);
    auto const id = t.id;
    auto& e = trials_.emplace(id, entry{.state = std::move(t), .changed = true, .row = nullptr, .state_text = nullptr}).first->second;
    ordered_.push_back(&e);
    return e.state;
  }
  /// The trial `id`, to change: its part of the next view() is made again.
  trial_state& at(std::string const& id) { return changing(trials_.at(id)); }
  trial_state const& at(std::string const& id) const { return trials_.at(id).state; }
  /// The trial `id`, or null; as at().
  trial_state* find(std::string const& id) {
    auto it = trials_.find(id);
    return it == trials_.end() ? nullptr : &changing(it->second);
  }
  bool contains(std::string const& id) const { return trials_.contains(id); }
  /// Trial ids in creation order.
  std::vector<std::string> const& order() const { return order_; }
  /// The experiment's directory (a trial's is dir() / id).
  std::filesystem::path const& dir() const { return exp_; }

  /// Queues `t` to run (PENDING), first in line or last.
  void queue_first(trial_state& t) {
    t.status = "PENDING";
    queue_.push_front(t.id);
  }
  void queue_last(trial_state& t) {
    t.status = "PENDING";
    queue_.push_back(t.id);
  }
  /// Parks `t` in the paused line (PAUSED).
  void pause(trial_state& t) {
    t.status = "PAUSED";
    paused_.push_back(t.id);
  }
  /// The first queued trial, taken out of its line.
  std::optional<std::string> take_queued() { return take_front(queue_); }
  /// The first paused trial, taken out of its line.
  std::optional<std::string> take_paused() { return take_front(paused_); }
  /// Where `id` waited before being taken out of its line here: paused, queued, or in none.
  enum class line { paused, queued, none };
  line take_out(std::string const& id) {
    if (auto p = std::find(paused_.begin(), paused_.end(), id); p != paused_.end()) {
      paused_.erase(p);
      return line::paused;
    }
    if (auto q = std::find(queue_.begin(), queue_.end(), id); q != queue_.end()) {
      queue_.erase(q);
      return line::queued;
    }
    return line::none;
  }
  bool nothing_queued() const { return queue_.empty(); }
  bool nothing_paused() const { return paused_.empty(); }

  /// `t` starts on a group (RUNNING).
  void run(trial_state& t) {
    t.status = "RUNNING";
    ++running_;
  }
  /// A running trial's group finished with it.
  void finished_running() { --running_; }
  std::size_t running() const { return running_; }

  /// Whether every trial numbered below `n` that is still RUNNING has reported iteration `level`.
  bool running_before_reached(std::size_t n, std::int64_t level) const {
    for (auto const& [id, e] : trials_) {
      auto const& t = e.state;
      if (trial_number(id).value_or(0) >= n || t.status != "RUNNING") continue;
      auto const reached = t.history.empty() ? std::int64_t{0} : t.history.back().value("training_iteration", std::int64_t{0});
      if (reached < level) return false;
    }
    return true;
  }
  /// Whether the trial `id` ended for good (TERMINATED, ERROR), or was never made.
  bool ended_or_absent(std::string const& id) const {
    auto it = trials_.find(id);
    return it == trials_.end() || it->second.state.status == "TERMINATED" || it->second.state.status == "ERROR";
  }

  /// Every trial, in creation order, as the status table and trials.csv show it.
  std::vector<report::trial_row> rows() const {
    std::vector<report::trial_row> out;
    out.reserve(ordered_.size());
    for (entry const* e : ordered_) out.push_back(row_of(e->state));
    return out;
  }

  /// The trials as experiment_state.json and trials.csv show them, in creation order, each
  /// trial's part shared with the last view() where the trial has not changed since (at(),
  /// find()): the coordinator takes one under the mutex every group waits for, and remaking
  /// every part took 2-18 ms at 200-2,000 trials (bench_tune scale/2000).
  struct view {
    std::vector<std::shared_ptr<report::trial_row const>> rows;  ///< as rows()
    std::vector<std::shared_ptr<std::string const>> states;      ///< each trial's to_json(), as JSON text
  };
  view take_view() {
    view out;
    out.rows.reserve(ordered_.size());
    out.states.reserve(ordered_.size());
    for (entry* e : ordered_) {
      if (e->changed || !e->row) {
        e->row = std::make_shared<report::trial_row const>(row_of(e->state));
        e->state_text = std::make_shared<std::string const>(nlohmann::json(e->state).dump());
        e->changed = false;
      }
      out.rows.push_back(e->row);
      out.states.push_back(e->state_text);
    }
    return out;
  }
  /// Every trial's results so far, in creation order (as rows()): a copy of at most `most` of
  /// each trial's results (report::evenly_spaced: what report.html draws).
  std::vector<std::vector<nlohmann::json>> histories(std::size_t most) const {
    std::vector<std::vector<nlohmann::json>> out;
    out.reserve(order_.size());
    for (entry const* e : ordered_) {
      auto const& history = e->state.history;
      auto& rows = out.emplace_back();
      for (std::size_t const i : report::evenly_spaced(history.size(), most)) rows.push_back(history[i]);
    }
    return out;
  }
  /// The trials as experiment_state.json lists them, in creation order.
  nlohmann::json to_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (entry const* e : ordered_) out.push_back(e->state);
    return out;
  }
  /// At the end: every trial, in creation order, its history moved out.
  std::vector<trial_result> take_results() {
    std::vector<trial_result> out;
    out.reserve(order_.size());
    for (entry* e : ordered_) {
      auto& t = changing(*e);
      trial_result r;
      r.id = t.id;
      r.status = t.status;
      r.config = t.config;
      r.metrics = t.last();
      r.metrics_history = std::move(t.history);
      r.path = exp_ / t.id;
      r.num_failures = t.failures;
      if (!t.error.empty()) r.error = t.error;
      std::vector<std::filesystem::path> dirs;
      if (t.retained_at_end) {  // as its last run said: no directory listing per trial
        for (auto const& name : *t.retained_at_end) dirs.push_back(r.path / name);
      } else {
        dirs = checkpointing::committed(r.path);
      }
      for (auto const& dir : dirs)
        r.checkpoints.push_back({dir, cohort::checkpoint::from_directory(dir).metadata().value("metrics", nlohmann::json::object())});
      out.push_back(std::move(r));
    }
    return out;
  }

 private:
  static std::optional<std::string> take_front(std::deque<std::string>& line) {
    if (line.empty()) return std::nullopt;
    auto id = std::move(line.front());
    line.pop_front();
    return id;
  }

  /// A trial and its part of the last view(), made again when `changed`.
  struct entry {
    trial_state state;
    bool changed = true;
    std::shared_ptr<report::trial_row const> row;
    std::shared_ptr<std::string const> state_text;
  };
  static trial_state& changing(entry& e) {
    e.changed = true;
    return e.state;
  }
  report::trial_row row_of(trial_state const& t) const {
    return {t.id, t.status, t.config, t.last(), (exp_ / t.id).string(), t.error, t.failures};
  }

  std::filesystem::path exp_;
  std::map<std::string, entry> trials_;
  std::vector<entry*> ordered_;     ///< trials_'s entries in creation order (a map's nodes stay put)
  std::vector<std::string> order_;  ///< trial ids in creation order
  std::deque<std::string> queue_, paused_;
  std::size_t running_ = 0;
};

}  // namespace cohort::tuning::detail
