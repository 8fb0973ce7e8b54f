// A program written against the old header names: it still compiles, each header warning that it
// is deprecated and naming its replacement (tests/CMakeLists.txt: compile_warn.old_headers).
#include <cohort/reporter.hpp>
#include <cohort/sharding/batch_size.hpp>
#include <cohort/sharding/datasets.hpp>
#include <cohort/sharding/loader_options.hpp>
#include <cohort/torch/checkpoint.hpp>
#include <cohort/torch/data_loader.hpp>
#include <cohort/torch/device.hpp>
#if COHORT_OLD_SHARD_HEADERS
#include <cohort/torch/image.hpp>
#include <cohort/torch/shard_dataset.hpp>
#endif

int main() {
  auto const d = cohort::to_torch(cohort::device{});                    // from to_torch.hpp
  auto payload = cohort::checkpoint_of(nlohmann::json{{"epoch", 1}});  // from checkpoint_state.hpp
  (void)payload;
  cohort::report::protocol_options const options{};                   // from report/protocol.hpp
  (void)options;
  cohort::datasets const sets{{"train", cohort::tensor_dataset{}}};     // data/datasets.hpp, data/torch/
  cohort::loader_options const loader{.batch_size = cohort::per_worker_batch_size(8, 2)};
#if COHORT_OLD_SHARD_HEADERS
  cohort::shard_dataset const shards{};  // from data/torch/shard_dataset.hpp
  (void)shards;
#endif
  return d.is_cpu() && sets.items.size() == 1 && loader.batch_size == 4 ? 0 : 1;
}
