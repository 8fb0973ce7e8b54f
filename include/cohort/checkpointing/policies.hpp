#pragma once
/// \file
/// Checkpoint retention policies: pure functions from the reported checkpoints (oldest first)
/// to the ones to keep. Writing checkpoints is the checkpointing layer's job; these only decide.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/order.hpp"

namespace cohort::checkpointing {

/// What a retention decision sees of one checkpoint.
struct record {
  std::size_t iteration = 0;  ///< training_iteration of the report that carried it
  nlohmann::json metrics{};   ///< that report's metrics
};

/// Keep every checkpoint (Ray's CheckpointConfig default).
struct keep_all {
  std::vector<std::size_t> retain(std::span<record const> all) const {
    std::vector<std::size_t> keep(all.size());
    std::iota(keep.begin(), keep.end(), std::size_t{0});
    return keep;
  }
};

/// Keep the `num_to_keep` most recent checkpoints.
struct keep_last {
  std::size_t num_to_keep = 1;

  std::vector<std::size_t> retain(std::span<record const> all) const {
    std::vector<std::size_t> keep;
    for (std::size_t i = all.size() > num_to_keep ? all.size() - num_to_keep : 0; i < all.size(); ++i)
      keep.push_back(i);
    return keep;
  }
};

/// Keep the `num_to_keep` best checkpoints by `metric` in `order`, and always the latest one
/// (Ray keeps the latest so a run can resume). Checkpoints without the metric rank last; ties
/// keep the more recent. Returned oldest first.
struct keep_best {
  std::size_t num_to_keep = 1;
  std::string metric{};
  cohort::order order = cohort::order::min;

  std::vector<std::size_t> retain(std::span<record const> all) const {
    auto score = [&](record const& r) -> std::optional<double> {
      if (!r.metrics.is_object() || !r.metrics.contains(metric) || !r.metrics[metric].is_number()) return std::nullopt;
      return r.metrics[metric].get<double>();
    };
    std::vector<std::size_t> idx(all.size());
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      auto sa = score(all[a]), sb = score(all[b]);
      if (sa.has_value() != sb.has_value()) return sa.has_value();
      if (!sa || *sa == *sb) return a > b;
      return order == cohort::order::min ? *sa < *sb : *sa > *sb;
    });
    idx.resize(std::min(idx.size(), num_to_keep));
    if (!all.empty() && std::find(idx.begin(), idx.end(), all.size() - 1) == idx.end()) idx.push_back(all.size() - 1);
    std::sort(idx.begin(), idx.end());
    return idx;
  }
};

}  // namespace cohort::checkpointing

namespace cohort {

/// Checkpointing: which of the reported checkpoints (oldest first) to keep.
template <class P>
concept checkpointing_policy = std::copyable<P> && requires(P const& p, std::span<checkpointing::record const> s) {
  { p.retain(s) } -> std::same_as<std::vector<std::size_t>>;
};

static_assert(checkpointing_policy<checkpointing::keep_all>);
static_assert(checkpointing_policy<checkpointing::keep_last>);
static_assert(checkpointing_policy<checkpointing::keep_best>);

}  // namespace cohort
