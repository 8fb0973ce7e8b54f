#pragma once
/// \file
/// cohort::datasets: named datasets handed to a trainer (Ray's `datasets={"train": ds}`), read
/// on each rank through `ctx.dataset_shard(name, ...)`.

#include <any>
#include <initializer_list>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

namespace cohort {

/// Named datasets for a trainer; pass it to the trainer's constructor with the policies:
/// `cohort::trainer{fn, cohort::datasets{{"train", train}, {"test", test}}, ...}`. Values are
/// copied (a cohort::tensor_dataset copies tensor handles, not data); a dataset read as a stream
/// (one with `as_stream()`, such as cohort::shard_dataset) is kept as the stream it returns.
struct datasets {
  /// One dataset, as the trainer keeps it.
  struct value {
    template <class T>
      requires(!std::is_same_v<std::remove_cvref_t<T>, value>)
    value(T&& v) {  // NOLINT(google-explicit-constructor): {"train", ds} reads as a map entry
      if constexpr (requires { v.as_stream(); }) any = v.as_stream();
      else any = std::forward<T>(v);
    }
    std::any any;
  };

  datasets() = default;
  datasets(std::initializer_list<std::pair<std::string const, value>> list) {
    for (auto const& [name, v] : list) items.emplace(name, v.any);
  }
  std::map<std::string, std::any> items;
};

}  // namespace cohort
