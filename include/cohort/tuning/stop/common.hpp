#pragma once
/// \file
/// What the stoppers share: a result's value by key or "a/b" path. Internal (namespace detail).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/detail/internal_state.hpp"
#include "cohort/error.hpp"
#include "cohort/order.hpp"
#include "cohort/tuning/concepts.hpp"
#include "cohort/tuning/decision.hpp"

namespace cohort::tuning::stop {

namespace detail {

using tuning::detail::keys_of;

/// The value named `key` in `j` (a key, else an "a/b" path); null when absent.
inline nlohmann::json const* find(nlohmann::json const& j, std::string const& key) { return tuning::detail::find_key(j, key); }

}  // namespace detail

}  // namespace cohort::tuning::stop
