#pragma once
/// \file
/// Flattening of nested metrics into "a/b" columns, as Ray's progress.csv does.

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::report {

/// A flattened row: ("outer/inner" key, leaf value) pairs.
using flat_row = std::vector<std::pair<std::string, nlohmann::json>>;

/// Pure: nested objects become "outer/inner" keys, in the object's (sorted) key order; arrays and
/// scalars are leaves.
inline flat_row flatten(nlohmann::json const& j, std::string const& prefix = {}) {
  flat_row out;
  if (!j.is_object()) {
    out.emplace_back(prefix, j);
    return out;
  }
  for (auto const& [k, v] : j.items()) {
    auto key = prefix.empty() ? k : prefix + "/" + k;
    if (v.is_object() && !v.empty()) {
      auto sub = flatten(v, key);
      out.insert(out.end(), sub.begin(), sub.end());
    } else {
      out.emplace_back(key, v);
    }
  }
  return out;
}

/// Pure: one CSV field for a JSON value (strings unquoted unless they need quoting).
inline std::string csv_field(nlohmann::json const& v) {
  std::string s = v.is_string() ? v.get<std::string>() : (v.is_null() ? std::string{} : v.dump());
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace cohort::report
