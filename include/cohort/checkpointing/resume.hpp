#pragma once
/// \file
/// Rank 0's view of a run directory's checkpoints at the start and at the end of fit(): the
/// point to resume from (with the earlier attempts' checkpoints handed to the retention list),
/// and the summary of the retained checkpoints that fit() returns.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/retained.hpp"
#include "cohort/error.hpp"
#include "cohort/order.hpp"

namespace cohort::checkpointing {

/// Rank 0, at setup of a run directory that holds an earlier attempt (or with
/// run_config::resume_from_checkpoint, `resume_from`): the checkpoint to resume from as
/// {"path", "iteration"} ({} when there is none), with the committed checkpoints of earlier
/// attempts restored into `kept` for the retention policy. Staging and trash left by a crashed
/// attempt are removed; checkpoints newer than the one resumed from that fail verification are
/// moved aside (renamed *.corrupt), never deleted. A `resume_from` that does not verify is a
/// cohort::error naming the fix.
inline nlohmann::json resume_point(std::filesystem::path const& run_path, std::string const& resume_from, retained& kept) {
  std::error_code ec;
  std::filesystem::remove_all(run_path / ".staging", ec);  // staging left by a crashed attempt
  std::filesystem::remove_all(run_path / ".trash", ec);    // dropped checkpoints not yet deleted
  std::optional<cohort::checkpoint> from;
  if (!resume_from.empty()) {
    if (auto problem = verify(resume_from))
      throw cohort::error("run_config.resume_from_checkpoint: " + *problem + ": name a committed checkpoint directory");
    from = cohort::checkpoint::from_directory(resume_from);
  } else {
    from = latest_good(run_path, &std::cerr);
  }
  for (auto const& dir : committed(run_path)) {
    if (verify(dir)) {
      if (!from || dir.filename() > from->path().filename()) std::filesystem::rename(dir, dir.string() + ".corrupt", ec);
      continue;
    }
    auto meta = cohort::checkpoint::from_directory(dir).metadata();
    kept.restore({meta.value("training_iteration", std::size_t{0}), meta.value("metrics", nlohmann::json::object())});
  }
  if (!from) return nlohmann::json::object();
  return {{"path", from->path().string()}, {"iteration", from->metadata().value("training_iteration", std::int64_t{0})}};
}

/// Rank 0, at the end of fit() (after the last validation): {"latest": {"path", "metrics"}, "best":
/// [...]}, the retained checkpoints best first when `policy` ranks by a metric (keep_best: NaN or
/// missing last, ties newest first), else newest first; no "latest" when none is retained.
template <class Policy>
nlohmann::json summary(retained const& kept, Policy const& policy) {
  auto entry = [&](record const& r) {
    return nlohmann::json{{"path", kept.path_of(static_cast<std::int64_t>(r.iteration)).string()}, {"metrics", r.metrics}};
  };
  nlohmann::json out{{"best", nlohmann::json::array()}};
  auto const& records = kept.records();
  if (records.empty()) return out;
  out["latest"] = entry(records.back());
  auto order = records;
  std::reverse(order.begin(), order.end());
  if constexpr (requires { policy.metric; policy.order; }) {
    auto score = [&](record const& r) {
      return r.metrics.contains(policy.metric) && r.metrics[policy.metric].is_number() ? r.metrics[policy.metric].template get<double>()
                                                                                      : std::numeric_limits<double>::quiet_NaN();
    };
    std::stable_sort(order.begin(), order.end(), [&](auto const& a, auto const& b) {
      double sa = score(a), sb = score(b);
      if (std::isnan(sa) || std::isnan(sb)) return !std::isnan(sa) && std::isnan(sb);
      return policy.order == cohort::order::min ? sa < sb : sa > sb;
    });
  }
  for (auto const& r : order) out["best"].push_back(entry(r));
  return out;
}

}  // namespace cohort::checkpointing
