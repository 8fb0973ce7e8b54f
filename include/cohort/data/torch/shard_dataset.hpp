#pragma once
/// \file
/// cohort::shard_dataset: a dataset stored as WebDataset tar shards, read as a stream and decoded
/// into tensors by a user transform on the loader's worker threads. Given to a trainer through
/// cohort::datasets and read with `ctx.dataset_shard(name, {.batch_size, .num_workers})` like a
/// tensor_dataset; dealt to ranks by its own sharding::shards policy (docs/data.md, "Shards").
///
/// Reading: each rank reads the samples of its epoch in stream order (sharding::shards), shard by
/// shard, front to back, keeping in memory the samples read ahead of their turn (at most the
/// shuffle buffer) and seeking past the samples it does not need (a resumed epoch's). Exact
/// resume comes with it: the order is a pure function of (shards, seed, epoch, world size, rank),
/// so the loader's position (epoch, batch) says exactly which samples were handed out and which
/// were in the shuffle buffer, and a resumed reader reads the latter again by their place in
/// their shards.

#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cohort/data/tar_shard.hpp"
#include "cohort/data/shard_set.hpp"
#include "cohort/error.hpp"
#include "cohort/sharding/shards.hpp"
#include "cohort/data/torch/data_loader.hpp"

namespace cohort {

/// What a shard dataset does with a sample it cannot read or decode.
enum class bad_sample {
  error,  ///< end the run with one line naming the shard, the sample or member, and the cause
  skip,   ///< leave it out of its batch, counted (loader.stats().skipped_samples; fit_loop reports it)
};

/// A transform: one sample's members (bytes by extension) to its input and target tensors.
using sample_transform = std::function<torch::data::Example<>(data::sample const&)>;

/// A dataset of WebDataset tar shards; see the file comment. Knobs set with designated
/// initializers: `cohort::shard_dataset{.shards = data::shard_set::from_glob("train-*.tar"),
/// .transform = fn, .sharding = {.seed = 1, .shuffle_buffer_samples = 1000}}`.
struct shard_dataset {
  data::shard_set shards;                   ///< the files and their sample counts
  sample_transform transform;               ///< bytes -> tensors, on the loader's workers (must be thread-safe)
  sharding::shards sharding{};              ///< how shards and samples are dealt and shuffled
  bad_sample on_bad_sample = bad_sample::error;

  /// Samples in all shards.
  std::size_t size() const { return shards.size(); }
  /// The type-erased form the loader reads (what cohort::datasets keeps).
  stream_dataset as_stream() const;
};

namespace detail {

/// A shard dataset as a loader reads it: one reader per epoch over the epoch's order.
class shard_stream final : public stream_dataset::source {
 public:
  explicit shard_stream(shard_dataset d) : d_(std::move(d)), first_(d_.shards.shards.size() + 1, 0) {
    if (!d_.transform) throw cohort::error("shard_dataset has no transform: set .transform to turn a sample's bytes into tensors");
    for (std::size_t s = 0; s < d_.shards.shards.size(); ++s) first_[s + 1] = first_[s] + d_.shards.shards[s].samples;
  }

  std::size_t size() const override { return first_.back(); }

  std::optional<std::pair<sharding::indices_fn, std::uint64_t>> dealing() const override {
    return std::pair{sharding::indices_fn([policy = d_.sharding, counts = d_.shards.samples_per_shard()](
                                              std::size_t, int world, int rank, std::int64_t epoch) {
                       return policy.indices(counts, world, rank, epoch);
                     }),
                     d_.sharding.seed};
  }

  /// One sample as fetched: read, or why not.
  struct fetched {
    std::optional<data::sample> sample;
    std::string error;
  };

  class reader final : public stream_dataset::reader {
   public:
    reader(shard_stream const& s, std::vector<std::size_t> order, std::size_t first) : s_(&s), order_(std::move(order)) {
      for (std::size_t k = first; k < order_.size(); ++k) ++demand_[order_[k]];
    }

    std::function<batch()> fetch(std::size_t lo, std::size_t hi) override {
      std::vector<fetched> raw;
      raw.reserve(hi - lo);
      for (std::size_t k = lo; k < hi; ++k) raw.push_back(get(order_[k]));
      return [s = s_, raw = std::make_shared<std::vector<fetched>>(std::move(raw))] { return s->decode(*raw); };
    }

   private:
    // Sample `id`, read ahead earlier (held) or now from its shard.
    fetched get(std::size_t id) {
      auto& left = demand_[id];
      if (left > 0) --left;
      if (auto it = held_.find(id); it != held_.end()) {
        fetched out = left > 0 ? it->second : std::move(it->second);
        if (left == 0) held_.erase(it);
        return out;
      }
      auto const s = static_cast<std::size_t>(std::upper_bound(s_->first_.begin(), s_->first_.end(), id) - s_->first_.begin()) - 1;
      std::size_t const j = id - s_->first_[s];
      fetched out = read(s, j);
      if (left > 0) held_[id] = out;
      return out;
    }

    // Sample `j` of shard `s`, reading the samples before it that are still wanted into held_ and
    // seeking past the others. A shard that fails stays failed for this epoch (its later samples
    // get the same error).
    fetched read(std::size_t s, std::size_t j) {
      auto const& info = s_->d_.shards.shards[s];
      if (auto b = broken_.find(s); b != broken_.end()) return {std::nullopt, b->second};
      try {
        auto& cursor = open_[s];
        if (!cursor || cursor->position() > j) {
          if (open_.size() > max_open_shards) close_other_than(s);
          cursor = std::make_unique<data::tar_shard>(info.path);
        }
        while (cursor->position() < j) {
          std::size_t const id = s_->first_[s] + cursor->position();
          if (auto d = demand_.find(id); d != demand_.end() && d->second > 0 && !held_.count(id)) {
            auto smp = cursor->next();
            if (!smp) break;
            held_[id] = {std::move(smp), {}};
          } else if (!cursor->skip()) {
            break;
          }
        }
        std::optional<data::sample> smp;
        if (cursor->position() == j) smp = cursor->next();
        if (!smp)
          throw cohort::error(info.path.string() + ": ended after " + std::to_string(cursor->position()) + " samples where " +
                              data::shard_index_name + " says " + std::to_string(info.samples) +
                              ": the index is of another shard; remove it to count the shards again");
        return {std::move(smp), {}};
      } catch (cohort::error const& e) {
        open_.erase(s);
        broken_[s] = e.what();
        return {std::nullopt, e.what()};
      }
    }

    void close_other_than(std::size_t s) {
      for (auto it = open_.begin(); it != open_.end();) it = it->first == s ? std::next(it) : open_.erase(it);
    }

    /// Shards kept open between fetches (a file handle each). Chosen, not tuned: the loader's
    /// workers read one stream in batch order, so one open shard is the common case.
    static constexpr std::size_t max_open_shards = 8;
    shard_stream const* s_;
    std::vector<std::size_t> order_;
    std::unordered_map<std::size_t, int> demand_;   // sample -> times still to be handed out this epoch
    std::unordered_map<std::size_t, fetched> held_;  // read ahead of their turn
    std::map<std::size_t, std::unique_ptr<data::tar_shard>> open_;
    std::map<std::size_t, std::string> broken_;
  };

  std::unique_ptr<stream_dataset::reader> open(std::vector<std::size_t> order, std::size_t first) const override {
    return std::make_unique<reader>(*this, std::move(order), first);
  }

  /// The batch of `raw`: each sample through the transform, stacked. A bad sample is a
  /// cohort::error naming it, or (bad_sample::skip) left out and counted.
  batch decode(std::vector<fetched> const& raw) const {
    std::vector<torch::Tensor> xs, ys;
    xs.reserve(raw.size());
    ys.reserve(raw.size());
    batch out;
    std::string why;  // the last bad sample's cause
    for (auto const& f : raw) {
      why = f.error;
      if (f.sample) try {
          auto ex = d_.transform(*f.sample);
          xs.push_back(std::move(ex.data));
          ys.push_back(std::move(ex.target));
          continue;
        } catch (std::exception const& e) {
          why = std::string(e.what()).rfind(f.sample->shard, 0) == 0
                    ? e.what()
                    : f.sample->shard + ": sample '" + f.sample->key + "': " + e.what();
        }
      if (d_.on_bad_sample == bad_sample::error) throw cohort::error(why + " (on_bad_sample = skip leaves such samples out)");
      ++out.skipped_samples;
    }
    if (xs.empty())
      throw cohort::error("every sample of a batch of " + std::to_string(raw.size()) + " was bad (the last: " +
                          (why.empty() ? std::string("none") : why) + "): check the shards");
    out.inputs = torch::stack(xs);
    out.targets = torch::stack(ys);
    return out;
  }

 private:
  shard_dataset d_;
  std::vector<std::size_t> first_;  // global index of each shard's first sample
};

}  // namespace detail

inline stream_dataset shard_dataset::as_stream() const { return {std::make_shared<detail::shard_stream>(*this)}; }

}  // namespace cohort
