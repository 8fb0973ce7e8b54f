#pragma once
/// \file
/// The ranks' agreement on their control flow. At each natural point of a functor (prepare_model,
/// the first bucket of each synchronised backward, each report, the end) every rank contributes a
/// fingerprint, what it is about to do and how many times it has done it, to one small all-reduce
/// on a communicator of its own. Because every point uses the same collective, a rank on another
/// code path still meets the others there, and mismatched control flow (an extra report, an early
/// return, an extra backward, a missing prepare_model, a rank that threw) is a clear error on every
/// rank in the time of one step, instead of a hang.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"
#include "cohort/error.hpp"

namespace cohort::detail {

/// The points where ranks compare their control flow.
enum class step : std::int64_t { prepare_model = 1, backward = 2, report = 3, end = 4, failed = 5 };

/// How a step is named in messages.
inline std::string step_name(step s) {
  switch (s) {
    case step::prepare_model: return "prepare_model";
    case step::backward: return "backward";
    case step::report: return "report";
    case step::end: return "the end of the functor";
    case step::failed: return "an error";
  }
  return "?";
}

/// What a report carries, for the agreement: nothing, a replicated checkpoint (rank 0's state),
/// or per-rank (sharded) state.
enum class checkpoint_kind : std::int64_t { none = 0, replicated = 1, per_rank = 2 };

/// One rank's contribution: the step it is about to take, the how-many-th of its kind it is,
/// what it has done so far, and (reports) the checkpoint it passes.
struct fingerprint {
  step what = step::end;
  std::int64_t count = 0;  ///< the how-many-th `what` this is (1-based)
  std::int64_t prepares = 0, backwards = 0, reports = 0;  ///< done before this step
  checkpoint_kind checkpoint = checkpoint_kind::none;
  friend bool operator==(fingerprint const&, fingerprint const&) = default;
};

/// Pure: "3 reports, 41 backward passes, 1 prepare_model".
inline std::string progress_text(std::int64_t prepares, std::int64_t backwards, std::int64_t reports) {
  return std::to_string(reports) + (reports == 1 ? " report, " : " reports, ") + std::to_string(backwards) +
         (backwards == 1 ? " backward pass, " : " backward passes, ") + std::to_string(prepares) + " prepare_model";
}

/// Pure: "ranks 0, 2" / "rank 1".
inline std::string rank_list(std::vector<int> const& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

/// Pure: whether every rank is at the same step, and if not, the message naming the ranks and
/// what each was doing. A rank at step::failed makes it `peer_failed` (its own error is the one
/// to show).
struct divergence {
  std::string message;
  bool peer_failed = false;
};
inline std::optional<divergence> find_divergence(std::span<fingerprint const> all) {
  if (all.empty()) return std::nullopt;
  auto same = [](fingerprint const& a, fingerprint const& b) { return a.what == b.what && a.count == b.count; };
  if (std::all_of(all.begin(), all.end(), [&](fingerprint const& f) { return same(f, all.front()); })) return std::nullopt;
  // Group the ranks by where they are, in order of their lowest rank.
  std::vector<std::pair<fingerprint, std::vector<int>>> groups;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto const& g) { return same(g.first, all[r]); });
    if (it == groups.end()) groups.push_back({all[r], {static_cast<int>(r)}});
    else it->second.push_back(static_cast<int>(r));
  }
  divergence d;
  std::vector<int> failed;
  for (auto const& [f, ranks] : groups)
    if (f.what == step::failed) failed.insert(failed.end(), ranks.begin(), ranks.end());
  std::string where;
  for (auto const& [f, ranks] : groups) {
    if (!where.empty()) where += "; ";
    where += rank_list(ranks) + (ranks.size() == 1 ? " is at " : " are at ");
    if (f.what == step::failed) where += "an error";
    else if (f.what == step::end) where += "the end of the functor";
    else where += step_name(f.what) + " " + std::to_string(f.count);
    where += " (after " + progress_text(f.prepares, f.backwards, f.reports) + ")";
  }
  if (!failed.empty()) {
    d.peer_failed = true;
    d.message = "stopped because " + rank_list(failed) + (failed.size() == 1 ? " failed" : " failed") + ": " + where;
    return d;
  }
  d.message = "the ranks' control flow diverged: " + where +
              ": every rank must call prepare_model(), run synchronised backward passes and call report() the same "
              "number of times, in the same order (look for an extra or missing call, or an early return, on one rank)";
  return d;
}

/// Pure: for a report where some ranks pass a checkpoint, the problem with it, if any: per-rank
/// (sharded) state must come from every rank, a replicated checkpoint from rank 0 (which writes it).
inline std::optional<std::string> checkpoint_gap(std::span<fingerprint const> all, std::int64_t iteration) {
  std::vector<int> with, without;
  bool per_rank = false;
  for (std::size_t r = 0; r < all.size(); ++r) {
    (all[r].checkpoint == checkpoint_kind::none ? without : with).push_back(static_cast<int>(r));
    per_rank = per_rank || all[r].checkpoint == checkpoint_kind::per_rank;
  }
  if (with.empty() || without.empty()) return std::nullopt;
  auto const name = "report " + std::to_string(iteration);
  if (per_rank)
    return name + " passes per-rank checkpoint state (checkpoint_payload::scope = per_rank) on " + rank_list(with) +
           " but none on " + rank_list(without) + ": pass each rank's own checkpoint on every rank";
  if (all[0].checkpoint == checkpoint_kind::none)
    return name + " passes a checkpoint on " + rank_list(with) +
           " but not on rank 0, which writes replicated state: pass it on rank 0 (Ray's idiom: rank 0 reports "
           "with the checkpoint, the others without), or mark per-rank state checkpoint_payload::scope = per_rank";
  return std::nullopt;
}

/// Thrown on every rank when the ranks' control flow diverged (the same message on each).
/// `peer_failed`: another rank threw; its error is the one fit() reports.
class diverged : public cohort::error {
 public:
  diverged(std::string const& message, bool peer_failed) : cohort::error(message), peer_failed_(peer_failed) {}
  bool peer_failed() const { return peer_failed_; }

 private:
  bool peer_failed_;
};

/// What the ranks agreed at a report.
struct report_agreement {
  bool any_checkpoint = false;  ///< some rank passed a checkpoint: every rank takes the checkpoint path
  std::int32_t signal = 0;      ///< a stop signal (SIGTERM, SIGINT) any rank received, 0 if none
};

/// One fit()'s agreement on control flow, over a communicator of its own (no other collective may
/// use it). Every rank must call agree() / start() at the same points; on one rank nothing is sent.
/// Cost per agreement: one all-reduce of 9 int64 (max); on a mismatch, one allgather more.
class lockstep {
 public:
  explicit lockstep(comm::any check) : check_(std::move(check)) {}
  lockstep(lockstep const&) = delete;
  lockstep& operator=(lockstep const&) = delete;

  /// A resumed run: reports are counted from the checkpoint's training_iteration, as users see them.
  void resume_at(std::int64_t reports) {
    reports_ = reports;
    counts_[index(step::report)] = reports;
  }

  /// Blocking agreement at `s`; throws diverged when the ranks are not all there.
  void agree(step s) {
    start(s);
    finish();
  }

  /// A report's agreement: the step, the checkpoint this rank passes, and the stop signal.
  /// Throws diverged, or cohort::error when the checkpoint is not passed where it must be.
  report_agreement agree_report(checkpoint_kind checkpoint, std::int32_t signal, std::int64_t iteration) {
    start(step::report, checkpoint, signal);
    finish();
    report_agreement out{.any_checkpoint = sent_[6] > 0, .signal = static_cast<std::int32_t>(sent_[8])};
    // Some rank lacks it, and it is per-rank state or rank 0 lacks it: known on every rank alike.
    bool const gap = out.any_checkpoint && sent_[5] > 0 && (sent_[4] > 0 || sent_[7] == 0);
    if (gap) {
      auto all = gather();
      if (auto e = checkpoint_gap(all, iteration)) throw cohort::error(*e);
    }
    return out;
  }

  /// Starts the agreement at `s` without waiting (the first bucket of a backward); finish() ends it.
  void start(step s, checkpoint_kind checkpoint = checkpoint_kind::none, std::int32_t signal = 0) {
    if (pending_) finish();
    mine_ = {s, ++counts_[index(s)], prepares_.load(), backwards_.load(), reports_.load(), checkpoint};
    if (s == step::prepare_model) ++prepares_;
    if (s == step::backward) ++backwards_;
    if (s == step::report) ++reports_;
    fill(signal);  // on one rank, already the reduction
    if (check_.size() == 1) return;
    request_ = check_.iallreduce(sent_.data(), sent_.size(), comm::reduce_op::max);
    pending_ = true;
  }

  /// Whether an agreement was started and not finished.
  bool pending() const { return pending_; }

  /// Drives a started agreement; true once it completed (then finish() does not wait).
  bool test() { return !pending_ || request_.test(); }

  /// Waits for the started agreement (with the deadline of the communicator) and throws diverged
  /// when the ranks are not all at the same step.
  void finish() {
    if (!pending_) return;
    pending_ = false;
    request_.wait();
    bool const same = sent_[0] == -sent_[1] && sent_[2] == -sent_[3];
    if (same) return;
    broken_ = true;
    auto all = gather();
    auto d = find_divergence(all);
    throw diverged(d ? d->message : "the ranks' control flow diverged", d && d->peer_failed);
  }

  /// A divergence was found: the ranks are at different places and agree on nothing more.
  bool broken() const { return broken_; }

  /// This rank's progress, for deadline messages ("3 reports, 41 backward passes, 1 prepare_model
  /// begun": the report, backward or prepare_model it waits in counts).
  std::string where() const { return progress_text(prepares_.load(), backwards_.load(), reports_.load()) + " begun"; }

 private:
  static std::size_t index(step s) { return static_cast<std::size_t>(s); }

  /// The buffer reduced with max: [what, -what, count, -count] (equal on every rank iff
  /// max == -max(-x)), per-rank state passed, checkpoint lacking, checkpoint passed, rank 0's
  /// checkpoint lacking (0) or not (-1), stop signal.
  void fill(std::int32_t signal) {
    auto const what = static_cast<std::int64_t>(mine_.what);
    std::int64_t const has = mine_.checkpoint == checkpoint_kind::none ? 0 : 1;
    std::int64_t const per_rank = mine_.checkpoint == checkpoint_kind::per_rank ? 1 : 0;
    sent_ = {what, -what, mine_.count, -mine_.count, per_rank, 1 - has, has, check_.rank() == 0 ? -has : -1, signal};
  }

  std::vector<fingerprint> gather() {
    if (check_.size() == 1) return {mine_};
    return comm::allgather_value(check_, mine_);
  }

  comm::any check_;
  std::array<std::int64_t, 9> sent_{};
  comm::any_request request_;
  bool pending_ = false;
  bool broken_ = false;
  fingerprint mine_{};
  std::array<std::int64_t, 6> counts_{};
  std::atomic<std::int64_t> prepares_{0}, backwards_{0}, reports_{0};
};

}  // namespace cohort::detail
