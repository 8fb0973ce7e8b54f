#pragma once
/// \file
/// Sharded, prefetching data loading for LibTorch: this rank's shard of a dataset, batched into
/// tensors, produced by a background thread into a bounded queue, with a resumable position.

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/context.hpp"
#include "cohort/detail/thread_start.hpp"
#include "cohort/error.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/sharding/datasets.hpp"
#include "cohort/sharding/loader_options.hpp"
#include "cohort/sharding/redeal.hpp"
#include "cohort/torch/to_torch.hpp"

namespace cohort {

/// Samples as tensors: row i of `inputs` and of `targets` is sample i.
struct tensor_dataset {
  torch::Tensor inputs;
  torch::Tensor targets;
  std::size_t size() const { return inputs.defined() ? static_cast<std::size_t>(inputs.size(0)) : 0; }
};

/// One batch.
struct batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

/// Where a loader's batches come from: a dataset of `size()` samples and a way to gather a batch
/// of sample indices into tensors.
template <class S>
concept batch_source = requires(S const& s, std::vector<std::size_t> const& idx) {
  { s.size() } -> std::convertible_to<std::size_t>;
  { gather(s, idx) } -> std::same_as<batch>;
};

/// Gathers rows `idx` of a tensor dataset (one index_select per tensor).
inline batch gather(tensor_dataset const& d, std::vector<std::size_t> const& idx) {
  auto rows = torch::empty({static_cast<std::int64_t>(idx.size())}, torch::kLong);
  auto* p = rows.data_ptr<std::int64_t>();
  for (std::size_t k = 0; k < idx.size(); ++k) p[k] = static_cast<std::int64_t>(idx[k]);
  return {d.inputs.index_select(0, rows), d.targets.index_select(0, rows)};
}

/// This rank's shard of a dataset, iterated one epoch at a time:
/// `for (auto& b : loader.epoch()) ...` runs the next epoch from the saved position, and the
/// epoch advances when it has been run to the end (no set_epoch to forget). Every rank gets the
/// same number of batches per epoch (the sharding policies guarantee equal shard sizes).
template <batch_source Source>
class data_loader {
 public:
  /// This rank's part of the data as `shard` deals it (ctx.sharding() for the trainer's policy):
  /// a state saved at another world size or batch size resumes elastically (restore()).
  data_loader(Source source, sharding::rank_shard shard, loader_options options, cohort::device dev = {},
              std::uint64_t seed = 0)
      : source_(std::move(source)), shard_(std::move(shard)), options_(options), device_(dev) {
    state_.seed = seed;
    state_.world_size = state_.epoch_world_size = shard_.world_size;
    state_.batch_size = options_.batch_size;
    check_batch_size();
  }

  /// `indices(n, epoch)` is this rank's sample indices of an n-sample dataset in `epoch`. Such a
  /// loader cannot deal an epoch again: it restores the states it saves, not those of another
  /// batch size or of a loader that records its world size.
  data_loader(Source source, std::function<std::vector<std::size_t>(std::size_t, std::int64_t)> indices,
              loader_options options, cohort::device dev = {}, std::uint64_t seed = 0)
      : data_loader(std::move(source),
                    sharding::rank_shard{[f = std::move(indices)](std::size_t n, int, int, std::int64_t e) { return f(n, e); }, 0, 0},
                    options, dev, seed) {}

 private:
  void check_batch_size() const {
    if (options_.batch_size <= 0)
      throw cohort::error("loader batch_size " + std::to_string(options_.batch_size) + " must be positive");
    auto per_rank = static_cast<std::int64_t>(shard_.indices(source_.size(), shard_.world_size, shard_.rank, 0).size());
    if (options_.drop_last && options_.batch_size > per_rank)
      throw cohort::error("batch_size " + std::to_string(options_.batch_size) + " is larger than this rank's shard of " +
                          std::to_string(per_rank) + " samples (dataset of " + std::to_string(source_.size()) +
                          "): lower batch_size or set drop_last = false");
  }

 public:
  /// Batches in the current epoch on every rank (fewer in an epoch resumed at another world size).
  std::int64_t batches_per_epoch() const { return batches_in(order_of_current_epoch().size()); }

  /// The position of the next batch.
  loader_state state() const { return state_; }

  /// What the training thread has spent on this loader: batches handed out, and seconds spent
  /// waiting for them (blocked on the prefetch queue, or making the batch when prefetch is off).
  struct stats_type {
    std::int64_t batches = 0;
    double wait_s = 0;
  };
  stats_type stats() const { return stats_; }

  /// Continues from `s` (saved by state()). Saved at another world size or batch size (a job
  /// relaunched with fewer hosts), the rest of the saved epoch is dealt again to this world size
  /// (sharding/redeal.hpp): together the ranks go on from exactly the samples they had reached,
  /// each sample of the epoch's rest once (the last few repeated when the rest does not divide
  /// evenly; with drop_last, a partial last batch dropped). Throws cohort::error when `s` was
  /// saved under another shuffling seed (the sample order would differ), or at another world size
  /// or batch size when this loader cannot deal the epoch again.
  void restore(loader_state const& s) {
    if (s.seed != state_.seed)
      throw cohort::error("loader state was saved with sharding seed " + std::to_string(s.seed) +
                          " but this run shards with seed " + std::to_string(state_.seed) +
                          ": resume with the same sharding policy");
    if (s.world_size == 0) {  // saved without its dealing (or by a loader that does not know it)
      if (s.batch_size != 0 && s.batch_size != state_.batch_size)
        throw cohort::error("loader state was saved with batch size " + std::to_string(s.batch_size) + " and this loader has " +
                            std::to_string(state_.batch_size) + " but cannot deal the epoch again: make the loader with a "
                            "sharding::rank_shard (ctx.sharding()), or resume with the same batch size");
      state_.epoch = s.epoch;
      state_.position = s.position;
      state_.epoch_offset = state_.epoch_end = 0;
      state_.epoch_world_size = state_.world_size;
      return;
    }
    auto saved = s;
    if (saved.epoch_world_size <= 0) saved.epoch_world_size = saved.world_size;  // a state written by hand
    if (saved.world_size == state_.world_size && saved.batch_size == state_.batch_size) {
      state_ = saved;
      return;
    }
    if (state_.world_size == 0 || saved.batch_size <= 0)
      throw cohort::error("loader state " + nlohmann::json(s).dump() + " was saved at world size " + std::to_string(s.world_size) +
                          " and batch size " + std::to_string(s.batch_size) +
                          " and this loader cannot deal its epoch again: make the loader with a sharding::rank_shard "
                          "(ctx.sharding()), or resume at the world size and batch size it was saved at");
    if (saved.epoch_offset == 0 && saved.epoch_world_size == saved.world_size) {
      // Saved in the epoch's first dealing: the epoch trains what that dealing's full batches hold.
      auto const per_rank = static_cast<std::int64_t>(
          shard_.indices(source_.size(), static_cast<int>(saved.world_size), 0, saved.epoch).size());
      auto const rows = options_.drop_last ? per_rank / saved.batch_size * saved.batch_size : per_rank;
      saved.epoch_end = rows * saved.world_size;
    }
    auto const seen = saved.samples_seen();
    state_.epoch = saved.epoch;
    state_.position = 0;
    state_.epoch_offset = seen;
    state_.epoch_end = saved.epoch_end;
    state_.epoch_world_size = seen == 0 ? state_.world_size : saved.epoch_world_size;
    if (seen == 0) state_.epoch_end = 0;
  }

  class epoch_range;
  /// The rest of the current epoch (from state().position), as an input range of batches.
  epoch_range epoch() { return epoch_range(*this); }

  /// An input range over one epoch; the prefetch thread runs while it is being iterated and is
  /// stopped when the range is destroyed (also after a `break`).
  class epoch_range {
   public:
    explicit epoch_range(data_loader& l) : loader_(&l) {}
    epoch_range(epoch_range const&) = delete;
    epoch_range& operator=(epoch_range const&) = delete;
    ~epoch_range() { stop(); }

    struct sentinel {};
    class iterator {
     public:
      using value_type = cohort::batch;
      using difference_type = std::ptrdiff_t;
      explicit iterator(epoch_range* r) : r_(r) { r_->advance(); }
      cohort::batch& operator*() const { return *r_->current_; }
      cohort::batch* operator->() const { return &*r_->current_; }
      iterator& operator++() {
        r_->advance();
        return *this;
      }
      void operator++(int) { r_->advance(); }
      bool done() const { return !r_->current_; }
      friend bool operator==(iterator const& it, sentinel) { return it.done(); }

     private:
      epoch_range* r_;
    };
    iterator begin() {
      start();
      return iterator(this);
    }
    sentinel end() const { return {}; }

   private:
    friend class iterator;

    void start() {
      auto& l = *loader_;
      order_ = l.order_of_current_epoch();
      total_ = l.batches_in(order_.size());  // not batches_per_epoch(): the order is computed once
      next_make_ = l.state_.position;
      if (l.options_.prefetch_batches > 0) producer_ = std::thread([this] { produce(); });
    }

    cohort::batch make(std::int64_t b) const {
      auto& l = *loader_;
      auto lo = static_cast<std::size_t>(b * l.options_.batch_size);
      auto hi = std::min(order_.size(), lo + static_cast<std::size_t>(l.options_.batch_size));
      auto out = gather(l.source_, std::vector<std::size_t>(order_.begin() + static_cast<std::ptrdiff_t>(lo),
                                                             order_.begin() + static_cast<std::ptrdiff_t>(hi)));
      if (l.device_.kind == device_kind::cuda) {  // pinned host memory, then an asynchronous copy
        out.inputs = out.inputs.pin_memory();
        out.targets = out.targets.pin_memory();
      }
      return out;
    }

    void produce() {
      cohort::detail::begin_background_thread("cohort-loader");
      // The rank's GPU current on this thread too: pinning memory here otherwise makes a CUDA
      // context on GPU 0, one per rank of a node.
      std::optional<c10::DeviceGuard> on_device;
      if (loader_->device_.kind == device_kind::cuda) on_device.emplace(to_torch(loader_->device_));
      for (std::int64_t b = next_make_; b < total_; ++b) {
        std::string err;
        std::optional<cohort::batch> made;
        try {
          made = make(b);
        } catch (std::exception const& e) {
          err = e.what();
        }
        std::unique_lock lock(mutex_);
        space_.wait(lock, [&] { return stop_ || queue_.size() < loader_->options_.prefetch_batches; });
        if (stop_) return;
        if (!err.empty()) {
          error_ = err;
          ready_.notify_all();
          return;
        }
        queue_.push_back(std::move(*made));
        ready_.notify_all();
      }
    }

    void advance() {
      auto& l = *loader_;
      current_.reset();
      auto const t0 = std::chrono::steady_clock::now();
      if (l.state_.position >= total_) {
        l.state_.epoch += 1;
        l.state_.position = 0;
        l.state_.epoch_offset = l.state_.epoch_end = 0;
        l.state_.epoch_world_size = l.state_.world_size;
        return;
      }
      if (producer_.joinable()) {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return !queue_.empty() || !error_.empty(); });
        if (queue_.empty()) throw cohort::error("data loader: " + error_);
        current_ = std::move(queue_.front());
        queue_.pop_front();
        space_.notify_all();
      } else {
        current_ = make(l.state_.position);
      }
      ++l.state_.position;  // handed out: a state saved while it is in use resumes after it
      ++l.stats_.batches;
      l.stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (l.device_.kind == device_kind::cuda) {
        current_->inputs = current_->inputs.to(to_torch(l.device_), /*non_blocking=*/true);
        current_->targets = current_->targets.to(to_torch(l.device_), /*non_blocking=*/true);
      }
    }

    void stop() {
      if (!producer_.joinable()) return;
      {
        std::lock_guard lock(mutex_);
        stop_ = true;
      }
      space_.notify_all();
      producer_.join();
    }

    data_loader* loader_;
    std::vector<std::size_t> order_;
    std::int64_t total_ = 0;
    std::int64_t next_make_ = 0;
    std::optional<cohort::batch> current_;
    std::thread producer_;
    std::mutex mutex_;
    std::condition_variable ready_, space_;
    std::deque<cohort::batch> queue_;
    std::string error_;
    bool stop_ = false;
  };

 private:
  /// This rank's indices in the current epoch: the policy's, or the rest of an epoch dealt again
  /// (kept for the epoch: it costs the policy's indices for every rank of the epoch's first dealing).
  std::vector<std::size_t> order_of_current_epoch() const {
    auto const& s = state_;
    if (s.epoch_offset == 0 && s.epoch_world_size == s.world_size)
      return shard_.indices(source_.size(), shard_.world_size, shard_.rank, s.epoch);
    auto const key = std::array<std::int64_t, 4>{s.epoch, s.epoch_world_size, s.epoch_offset, s.epoch_end};
    if (redealt_key_ != key) {
      redealt_ = sharding::redeal(shard_.indices, source_.size(), s.epoch, static_cast<int>(s.epoch_world_size), s.epoch_offset,
                                  s.epoch_end, shard_.world_size, shard_.rank);
      redealt_key_ = key;
    }
    return redealt_;
  }

  std::int64_t batches_in(std::size_t samples) const {
    auto n = static_cast<std::int64_t>(samples);
    return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
  }

  Source source_;
  sharding::rank_shard shard_;
  mutable std::array<std::int64_t, 4> redealt_key_{-1, -1, -1, -1};  // the epoch redealt_ holds
  mutable std::vector<std::size_t> redealt_;
  loader_options options_;
  cohort::device device_;
  loader_state state_;
  stats_type stats_;
};

/// A torch::data dataset (anything with `get(index)` returning an Example and `size()`) as a
/// batch source; examples are stacked into batch tensors. Pass the dataset before any batch
/// transform such as Stack: cohort batches it.
template <class Dataset>
struct torch_data_source {
  std::shared_ptr<Dataset> dataset;
  std::size_t size() const {
    auto n = dataset->size();
    if (!n) throw cohort::error("prepare_data_loader: the dataset has no size(): cohort shards only sized datasets");
    return *n;
  }
};

template <class Dataset>
batch gather(torch_data_source<Dataset> const& s, std::vector<std::size_t> const& idx) {
  std::vector<torch::Tensor> xs, ys;
  xs.reserve(idx.size());
  ys.reserve(idx.size());
  for (auto i : idx) {
    auto ex = s.dataset->get(i);
    xs.push_back(std::move(ex.data));
    ys.push_back(std::move(ex.target));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

/// Ray's prepare_data_loader: an existing torch::data dataset as this rank's sharded,
/// prefetching loader, sharded by the trainer's policy, batches on the rank's device.
template <class Dataset>
data_loader<torch_data_source<Dataset>> prepare_data_loader(context const& ctx, Dataset dataset,
                                                             loader_options const& options = {}) {
  return {torch_data_source<Dataset>{std::make_shared<Dataset>(std::move(dataset))}, ctx.sharding(), options,
          ctx.device(), ctx.sharding_seed()};
}

/// `ctx.dataset_shard(name, options)`: the loader of the trainer's dataset `name` (a
/// cohort::tensor_dataset) for this rank; the same loader every call, so its epoch and position
/// carry over. Throws cohort::error naming the datasets the trainer has when `name` is unknown.
template <class Options>
data_loader<tensor_dataset>& dataset_shard_for(context& ctx, std::string const& name, Options const& options) {
  auto& slot = ctx.loader_slot(name);
  if (!slot) {
    auto const* ds = ctx.dataset(name);
    if (!ds) throw cohort::error("no dataset named '" + name + "': the trainer has " + ctx.dataset_names() +
                                 ": pass it with cohort::datasets{{\"" + name + "\", ...}}");
    auto const* tensors = std::any_cast<tensor_dataset>(ds);
    if (!tensors) throw cohort::error("dataset '" + name + "' is not a cohort::tensor_dataset: use prepare_data_loader for other types");
    slot = std::make_shared<data_loader<tensor_dataset>>(*tensors, ctx.sharding(), options, ctx.device(),
                                                         ctx.sharding_seed());
  }
  return *std::static_pointer_cast<data_loader<tensor_dataset>>(slot);
}

}  // namespace cohort
