#pragma once
/// \file
/// The check that one epoch's batches cover a dataset: what each rank returned from its epoch,
/// {"batches": <count>, "seen": [<sample id>...]}, gathered from a trainer's return values.

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cohort/data/torch/data_loader.hpp>

#include "../../catch.hpp"
#include "../../support.hpp"

namespace cohort_test {

/// The sample ids of a batch (its targets).
inline std::vector<std::int64_t> ids_of(cohort::batch const& b) {
  auto t = b.targets.contiguous();
  return {t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel()};
}

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
