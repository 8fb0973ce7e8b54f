#pragma once
/// \file
/// cohort::context: what a training functor sees of the job (ranks, device, name), and how it
/// reports. One per rank per fit().

#include <chrono>
#include <cstdint>
#include <ctime>
#include <any>
#include <filesystem>
#include <map>
#include <memory>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/comm/any.hpp"
#include "cohort/error.hpp"
#include "cohort/report/console.hpp"
#include "cohort/report/run_directory.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/scaling/topology.hpp"
#include "cohort/sharding/datasets.hpp"
#include "cohort/sharding/loader_options.hpp"
#include "cohort/torch/model_options.hpp"

namespace cohort {

namespace detail {

/// The report bookkeeping of one fit() on one rank. Rank 0 owns the run directory; every rank
/// counts its reports so fit() can check that all ranks reported equally often.
struct report_state {
  std::optional<report::run_directory> dir;  ///< only on rank 0
  std::string name;
  int verbose = 1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last = start;
  std::int64_t count = 0;
  std::vector<nlohmann::json> history;  ///< rank 0 only; broadcast at the end of fit()

  void report(nlohmann::json metrics) {
    if (!metrics.is_object())
      throw cohort::error("report() takes a JSON object of metrics, e.g. ctx.report({{\"loss\", 0.1}}), got: " +
                          metrics.dump());
    ++count;
    if (!dir) return;
    auto now = std::chrono::steady_clock::now();
    metrics["training_iteration"] = count;
    metrics["time_this_iter_s"] = std::chrono::duration<double>(now - last).count();
    metrics["time_total_s"] = std::chrono::duration<double>(now - start).count();
    metrics["timestamp"] = static_cast<std::int64_t>(std::time(nullptr));
    last = now;
    dir->append(metrics);
    if (verbose > 0) std::cout << report::progress_line(name, metrics) << std::endl;
    history.push_back(std::move(metrics));
  }
};

}  // namespace detail

/// What a training functor receives. Valid for the duration of fit(); not copyable.
class context {
 public:
  /// Built by the trainer.
  context(scaling::topology topo, cohort::device dev, int threads, std::string name, std::filesystem::path run_path,
          comm::any& work, detail::report_state& reports,
          std::function<std::vector<std::size_t>(std::size_t, int, int, std::int64_t)> shard,
          cohort::datasets const* data = nullptr, std::uint64_t sharding_seed = 0)
      : topo_(topo), device_(dev), threads_(threads), name_(std::move(name)), run_path_(std::move(run_path)),
        comm_(work), reports_(reports), shard_(std::move(shard)), datasets_(data), sharding_seed_(sharding_seed) {}
  context(context const&) = delete;
  context& operator=(context const&) = delete;

  int world_rank() const { return topo_.world_rank; }            ///< rank in the trainer's communicator
  int world_size() const { return topo_.world_size; }            ///< ranks in the trainer's communicator
  int local_rank() const { return topo_.local_rank; }            ///< rank among this node's ranks
  int local_world_size() const { return topo_.local_world_size; }  ///< ranks on this node
  int node_rank() const { return topo_.node_rank; }              ///< this node's index
  std::string const& experiment_name() const { return name_; }    ///< the run's name (run_config.name)
  std::filesystem::path const& run_path() const { return run_path_; }  ///< the run directory
  cohort::device device() const { return device_; }               ///< this rank's compute device
  int intra_op_threads() const { return threads_; }               ///< intra-op threads set for this rank

  /// The trainer's communicator (a duplicate of the one fit() was given), for the functor's own
  /// collectives, e.g. averaging an evaluation metric. Collectives must be entered by every rank.
  comm::any& comm() { return comm_; }

  /// Records one round of metrics. Every rank calls it the same number of times (fit() checks);
  /// rank 0's metrics are recorded, with Ray's auto-filled keys training_iteration,
  /// time_this_iter_s, time_total_s and timestamp, in result.json and progress.csv. No
  /// communication.
  void report(nlohmann::json const& metrics) { reports_.report(metrics); }

  /// This rank's sample indices of a dataset of `dataset_size` samples in `epoch`, from the
  /// trainer's sharding policy. Every rank gets the same count. No communication.
  std::vector<std::size_t> shard_indices(std::size_t dataset_size, std::int64_t epoch) const {
    return shard_(dataset_size, topo_.world_size, topo_.world_rank, epoch);
  }

  /// This rank's loader of the trainer's dataset `name` (a cohort::tensor_dataset given through
  /// cohort::datasets): sharded by the trainer's policy, batched, prefetched, on this rank's
  /// device. The same loader on every call, so `for (auto& b : ctx.dataset_shard("train").epoch())`
  /// runs epoch after epoch. Needs LibTorch (cohort/torch/data_loader.hpp). No communication.
  template <class Options = loader_options>
  auto& dataset_shard(std::string const& name, Options const& options = {}) {
    return dataset_shard_for(*this, name, options);  // found by ADL in torch/
  }

  /// The seed of the trainer's sharding policy (0 when it has none).
  std::uint64_t sharding_seed() const { return sharding_seed_; }
  /// The trainer's dataset `name`, or nullptr.
  std::any const* dataset(std::string const& name) const {
    if (!datasets_) return nullptr;
    auto it = datasets_->items.find(name);
    return it == datasets_->items.end() ? nullptr : &it->second;
  }
  /// The names of the trainer's datasets, for messages ("no datasets" when none).
  std::string dataset_names() const {
    std::string s;
    if (datasets_)
      for (auto const& [k, v] : datasets_->items) s += (s.empty() ? "'" : ", '") + k + "'";
    return s.empty() ? std::string("no datasets") : s;
  }
  /// Storage for the loader of dataset `name` (used by dataset_shard).
  std::shared_ptr<void>& loader_slot(std::string const& name) { return loaders_[name]; }

  /// Broadcasts `model`'s parameters and buffers from rank 0, checks that every rank holds the
  /// same layout, and averages gradients over the ranks during backward (bucketed,
  /// non-blocking all-reduces). Needs LibTorch: include cohort/torch/prepare_model.hpp (the
  /// umbrella header does when COHORT_WITH_TORCH is set).
  template <class Module>
  auto prepare_model(Module module, model_options const& options = {}) {
    return prepare_model_for(*this, std::move(module), options);  // found by ADL in torch/
  }

 private:
  scaling::topology topo_;
  cohort::device device_;
  int threads_;
  std::string name_;
  std::filesystem::path run_path_;
  comm::any& comm_;
  detail::report_state& reports_;
  std::function<std::vector<std::size_t>(std::size_t, int, int, std::int64_t)> shard_;
  cohort::datasets const* datasets_;
  std::uint64_t sharding_seed_;
  std::map<std::string, std::shared_ptr<void>> loaders_;
};

}  // namespace cohort
