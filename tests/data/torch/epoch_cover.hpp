#pragma once
/// \file
/// The check that one epoch's batches cover a dataset: what each rank returned from its epoch,
/// {"batches": <count>, "seen": [<sample id>...]}, gathered from a trainer's return values.

#include <cstddef>
#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

#include "../../catch.hpp"
#include "../../support.hpp"

namespace cohort_test {

/// The distinct sample ids every rank saw in the epoch, after checking that each rank returned
/// one value (a loop over none would check nothing) and that all ranks ran as many batches.
template <class ReturnValues>
std::set<std::int64_t> samples_seen(ReturnValues const& per_rank) {
  REQUIRE(per_rank.size() == static_cast<std::size_t>(world_size()));
  std::set<std::int64_t> all;
  for (auto const& v : per_rank) {
    CHECK(v["batches"] == per_rank.front()["batches"]);
    for (auto const& id : v["seen"]) all.insert(id.template get<std::int64_t>());
  }
  return all;
}

}  // namespace cohort_test
