#pragma once
/// \file
/// Sharded, prefetching data loading for LibTorch: this rank's shard of a dataset, batched into
/// tensors, produced by worker threads into a bounded queue, with a resumable position. What a
/// loader reads from (tensor datasets, torch::data datasets, streams) is in data/torch/batch_sources.hpp.

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
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
#include "cohort/scaling/cpu_set.hpp"
#include "cohort/scaling/device.hpp"
#include "cohort/data/datasets.hpp"
#include "cohort/data/loader_options.hpp"
#include "cohort/sharding/redeal.hpp"
#include "cohort/data/torch/batch_sources.hpp"

namespace cohort {

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
      : source_(std::move(source)), shard_(std::move(shard)), options_(options), device_(dev), torch_device_(dev.str()) {
    state_.seed = seed;
    state_.world_size = state_.epoch_world_size = shard_.world_size;
    state_.batch_size = options_.batch_size;
    state_.dataset_size = static_cast<std::int64_t>(source_.size());
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
    std::int64_t skipped_samples = 0;  ///< bad samples left out of the batches handed out (on_bad_sample = skip)
  };
  stats_type stats() const { return stats_; }

  /// Continues from `s` (saved by state()). Saved at another world size or batch size (a job
  /// relaunched with fewer hosts), the rest of the saved epoch is dealt again to this world size
  /// (sharding/redeal.hpp): together the ranks go on from exactly the samples they had reached,
  /// each sample of the epoch's rest once (the last few repeated when the rest does not divide
  /// evenly; with drop_last, a partial last batch dropped). Throws cohort::error when `s` was
  /// saved under another shuffling seed or over a dataset of another size (the sample order would
  /// differ), or at another world size
  /// or batch size when this loader cannot deal the epoch again.
  void restore(loader_state const& s) {
    if (s.seed != state_.seed)
      throw cohort::error("loader state was saved with sharding seed " + std::to_string(s.seed) +
                          " but this run shards with seed " + std::to_string(state_.seed) +
                          ": resume with the same sharding policy");
    if (s.dataset_size != 0 && s.dataset_size != state_.dataset_size)
      throw cohort::error("loader state was saved over a dataset of " + std::to_string(s.dataset_size) +
                          " samples and this loader's has " + std::to_string(state_.dataset_size) +
                          ": resume with the data the run started with (the order of another size differs)");
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
    saved.dataset_size = state_.dataset_size;
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

  /// An input range over one epoch, its batches made by worker threads (defined below the class).
  class epoch_range;
  /// The rest of the current epoch (from state().position), as an input range of batches.
  epoch_range epoch() { return epoch_range(*this); }

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
  ::torch::Device torch_device_;  // device_ for LibTorch, made once
  loader_state state_;
  stats_type stats_;
};

/// An input range over one epoch. While it is iterated, worker threads make the next batches
/// (options.num_workers of them, or one with prefetch_batches and no workers; none with both 0,
/// or for in-memory batches where the intra-op threads take the rank's cores: loader_threads):
/// each takes the next batch number, fetches its raw samples from the epoch's reader (one
/// worker at a time, in batch order) and decodes them in parallel with the others; batches are
/// handed out in batch order whatever the threads' timing, at most max(prefetch_batches,
/// num_workers) made ahead. The workers stop when the range is destroyed (also after a `break`).
template <batch_source Source>
class data_loader<Source>::epoch_range {
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
  using reader_type = decltype(detail::open_reader(std::declval<Source const&>(), std::vector<std::size_t>{}, 0));

  /// A batch made by a worker, or why it could not be.
  struct made_batch {
    std::optional<cohort::batch> made;
    std::string error;
  };

  void start() {
    auto& l = *loader_;
    auto order = l.order_of_current_epoch();
    order_size_ = order.size();
    total_ = l.batches_in(order_size_);  // not batches_per_epoch(): the order is computed once
    next_fetch_ = l.state_.position;
    reader_.emplace(detail::open_reader(l.source_, std::move(order),
                                        std::min(order_size_, static_cast<std::size_t>(next_fetch_ * l.options_.batch_size))));
    // The training thread's cores and the intra-op threads in effect now (a user may have set them).
    std::size_t const threads = loader_threads(l.options_, detail::in_memory(l.source_), at::get_num_threads(),
                                               static_cast<int>(scaling::this_thread_cpus().size()),
                                               !scaling::placement().spare.empty());
    capacity_ = std::max<std::size_t>({l.options_.prefetch_batches, l.options_.num_workers, 1});
    for (std::size_t k = 0; k < threads; ++k) workers_.emplace_back([this] { work(); });
  }

  auto fetch(std::int64_t b) {
    auto& l = *loader_;
    auto lo = static_cast<std::size_t>(b * l.options_.batch_size);
    auto hi = std::min(order_size_, lo + static_cast<std::size_t>(l.options_.batch_size));
    return reader_->fetch(lo, hi);
  }

  template <class Raw>
  cohort::batch decode(Raw&& raw) const {
    auto& l = *loader_;
    auto out = detail::decode(l.source_, std::forward<Raw>(raw));
    if (l.device_.kind == device_kind::cuda) {  // pinned host memory, then an asynchronous copy
      out.inputs = out.inputs.pin_memory();
      out.targets = out.targets.pin_memory();
    }
    return out;
  }

  void work() {
    cohort::detail::begin_background_thread("cohort-loader");
    // The rank's GPU current on this thread too: pinning memory here otherwise makes a CUDA
    // context on GPU 0, one per rank of a node.
    std::optional<c10::DeviceGuard> on_device;
    if (loader_->device_.kind == device_kind::cuda) on_device.emplace(loader_->torch_device_);
    for (;;) {
      std::int64_t b = 0;
      made_batch out;
      std::optional<decltype(fetch(0))> raw;
      {
        std::lock_guard fetching(fetch_mutex_);  // the reader is read in batch order, by one worker at a time
        {
          std::unique_lock lock(mutex_);
          space_.wait(lock, [&] {
            return stop_ || next_fetch_ >= total_ || next_fetch_ < loader_->state_.position + static_cast<std::int64_t>(capacity_);
          });
          if (stop_ || next_fetch_ >= total_) return;
          b = next_fetch_++;
        }
        try {
          raw.emplace(fetch(b));
        } catch (std::exception const& e) {
          out.error = e.what();
        }
      }
      if (raw) try {
          out.made = decode(std::move(*raw));
        } catch (std::exception const& e) {
          out.error = e.what();
        }
      {
        std::lock_guard lock(mutex_);
        made_.emplace(b, std::move(out));
      }
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
    if (!workers_.empty()) {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return made_.count(l.state_.position) > 0; });
      auto node = made_.extract(l.state_.position);
      lock.unlock();
      if (!node.mapped().made) throw cohort::error("data loader: " + node.mapped().error);
      current_ = std::move(node.mapped().made);
    } else {
      current_ = decode(fetch(l.state_.position));
    }
    {
      std::lock_guard lock(mutex_);
      ++l.state_.position;  // handed out: a state saved while it is in use resumes after it
    }
    space_.notify_all();
    ++l.stats_.batches;
    l.stats_.skipped_samples += current_->skipped_samples;
    l.stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (l.device_.kind == device_kind::cuda) {
      current_->inputs = current_->inputs.to(l.torch_device_, /*non_blocking=*/true);
      current_->targets = current_->targets.to(l.torch_device_, /*non_blocking=*/true);
    }
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  data_loader* loader_;
  std::optional<reader_type> reader_;
  std::size_t order_size_ = 0;
  std::int64_t total_ = 0;
  std::int64_t next_fetch_ = 0;  // the next batch a worker takes
  std::size_t capacity_ = 1;     // batches made ahead of the one handed out, at most
  std::optional<cohort::batch> current_;
  std::vector<std::thread> workers_;
  std::mutex fetch_mutex_, mutex_;
  std::condition_variable ready_, space_;
  std::map<std::int64_t, made_batch> made_;
  bool stop_ = false;
};

/// Ray's prepare_data_loader: an existing torch::data dataset as this rank's sharded,
/// prefetching loader, sharded by the trainer's policy, batches on the rank's device.
template <class Dataset>
data_loader<torch_data_source<Dataset>> prepare_data_loader(context const& ctx, Dataset dataset,
                                                             loader_options const& options = {}) {
  return {torch_data_source<Dataset>{std::make_shared<Dataset>(std::move(dataset))}, ctx.sharding(), options,
          ctx.device(), ctx.sharding_seed()};
}


/// This rank's loader of `stream`: dealt by the dataset's own policy when it brings one (a shard
/// dataset), else by the trainer's (ctx.sharding()).
inline data_loader<stream_dataset> stream_loader(context const& ctx, stream_dataset stream, loader_options const& options) {
  auto shard = ctx.sharding();
  auto seed = ctx.sharding_seed();
  if (auto own = stream.impl->dealing()) {
    shard.indices = std::move(own->first);
    seed = own->second;
  }
  return {std::move(stream), std::move(shard), options, ctx.device(), seed};
}

/// `ctx.dataset_shard(name, options)`: the loader of the trainer's dataset `name` (a
/// cohort::tensor_dataset, or a cohort::shard_dataset or another stream_dataset) for this rank;
/// the same loader every call, so its epoch and position carry over. Throws cohort::error naming
/// the datasets the trainer has when `name` is unknown.
template <class Options>
data_loader<stream_dataset>& dataset_shard_for(context& ctx, std::string const& name, Options const& options) {
  auto& slot = detail::context_access::loader_slot(ctx, name);
  if (!slot) {
    auto const* ds = detail::context_access::dataset(ctx, name);
    if (!ds) throw cohort::error("no dataset named '" + name + "': the trainer has " + detail::context_access::dataset_names(ctx) +
                                 ": pass it with cohort::datasets{{\"" + name + "\", ...}}");
    stream_dataset stream;
    if (auto const* tensors = std::any_cast<tensor_dataset>(ds)) stream.impl = std::make_shared<detail::tensor_stream>(*tensors);
    else if (auto const* given = std::any_cast<stream_dataset>(ds)) stream = *given;
    else
      throw cohort::error("dataset '" + name + "' is neither a cohort::tensor_dataset nor a cohort::shard_dataset: use "
                          "prepare_data_loader for torch::data datasets");
    slot = std::make_shared<data_loader<stream_dataset>>(stream_loader(ctx, std::move(stream), options));
  }
  return *std::static_pointer_cast<data_loader<stream_dataset>>(slot);
}

}  // namespace cohort
