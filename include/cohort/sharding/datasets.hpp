#pragma once
/// \file
/// cohort::datasets: named datasets handed to a trainer (Ray's `datasets={"train": ds}`), read
/// on each rank through `ctx.dataset_shard(name, ...)`.

#include <any>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace cohort {

/// Named datasets for a trainer; pass it to the trainer's constructor with the policies:
/// `cohort::trainer{fn, cohort::datasets{{"train", train}, {"test", test}}, ...}`. Values are
/// copied (a cohort::tensor_dataset copies tensor handles, not data).
struct datasets {
  datasets() = default;
  datasets(std::initializer_list<std::pair<std::string const, std::any>> items) : items(items) {}
  std::map<std::string, std::any> items;
};

}  // namespace cohort
