#pragma once
/// \file
/// cohort::order: which end of a metric is best, shared by checkpoint retention (keep_best),
/// the tuner (tune_config::mode) and its status table.

namespace cohort {

/// Direction of a metric: lower is better (`min`) or higher is better (`max`).
enum class order { min, max };
inline constexpr order min = order::min;
inline constexpr order max = order::max;

}  // namespace cohort
