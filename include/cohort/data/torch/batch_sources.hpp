#pragma once
/// \file
/// What a data_loader reads from: `batch` and `tensor_dataset`, the batch_source concept, the
/// sources gathered by index (a tensor dataset, a torch::data dataset) and stream_dataset (a
/// dataset read through one reader per epoch, such as shard files), with the adapters between
/// them.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"
#include "cohort/data/loader_options.hpp"
#include "cohort/sharding/redeal.hpp"

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
  std::int64_t skipped_samples = 0;  ///< bad samples left out of it (a shard dataset's on_bad_sample = skip)
};

namespace detail {

/// A source read as a stream (shard files): `s.open_reader(order, first)` opens a reader over one
/// epoch's `order` of sample indices, of which those from position `first` on are still to be
/// read; the loader calls its `fetch(lo, hi)` for the samples at positions [lo, hi) of `order`, in
/// increasing order and one call at a time, and `s.decode(raw)` on the result, on any worker.
template <class S>
concept streamed_source = requires(S const& s, std::vector<std::size_t> order) {
  { s.open_reader(std::move(order), std::size_t{0}) };
};

/// The reader of a source that gathers batches by index: a batch's raw form is its indices.
struct index_reader {
  std::vector<std::size_t> order;
  std::vector<std::size_t> fetch(std::size_t lo, std::size_t hi) const {
    return {order.begin() + static_cast<std::ptrdiff_t>(lo), order.begin() + static_cast<std::ptrdiff_t>(hi)};
  }
};

template <class Source>
auto open_reader(Source const& s, std::vector<std::size_t> order, std::size_t first) {
  if constexpr (streamed_source<Source>) return s.open_reader(std::move(order), first);
  else return index_reader{std::move(order)};
}
template <class Source, class Raw>
batch decode(Source const& s, Raw&& raw) {
  if constexpr (streamed_source<Source>) return s.decode(std::forward<Raw>(raw));
  else return gather(s, raw);
}

}  // namespace detail

/// Where a loader's batches come from: a dataset of `size()` samples and either a way to gather
/// a batch of sample indices into tensors, or a reader per epoch (a stream, see stream_dataset).
template <class S>
concept batch_source = requires(S const& s, std::vector<std::size_t> const& idx) {
  { s.size() } -> std::convertible_to<std::size_t>;
} && (detail::streamed_source<S> || requires(S const& s, std::vector<std::size_t> const& idx) {
  { gather(s, idx) } -> std::same_as<batch>;
});

/// A dataset read through one reader per epoch, behind a type-erased handle: what
/// `ctx.dataset_shard` loads (a cohort::shard_dataset becomes one when given to cohort::datasets,
/// a cohort::tensor_dataset is read through one), and what any dataset that is not random access
/// can implement.
class stream_dataset {
 public:
  /// Reads one epoch: `fetch(lo, hi)` is called for positions [lo, hi) of the epoch's order, in
  /// increasing order, one call at a time, and returns what makes that batch; the loader calls
  /// the latter on any of its worker threads (decoding in parallel).
  struct reader {
    virtual ~reader() = default;
    virtual std::function<batch()> fetch(std::size_t lo, std::size_t hi) = 0;
  };
  /// What a stream_dataset is made of.
  struct source {
    virtual ~source() = default;
    /// Samples in the dataset.
    virtual std::size_t size() const = 0;
    /// A reader of one epoch's `order` (sample indices), of which the positions from `first` on
    /// are still to be read (a resumed epoch).
    virtual std::unique_ptr<reader> open(std::vector<std::size_t> order, std::size_t first) const = 0;
    /// The dealing the dataset brings (its policy for any world size, and that policy's seed),
    /// or nullopt to be dealt by the trainer's sharding policy.
    virtual std::optional<std::pair<sharding::indices_fn, std::uint64_t>> dealing() const { return std::nullopt; }
    /// True when a batch is gathered from memory (microseconds), not read or decoded: the loader
    /// may then make it on the training thread (loader_threads).
    virtual bool in_memory() const { return false; }
  };
  /// The reader of an epoch, as the loader holds it.
  struct epoch_reader {
    std::unique_ptr<reader> impl;
    std::function<batch()> fetch(std::size_t lo, std::size_t hi) { return impl->fetch(lo, hi); }
  };

  std::shared_ptr<source const> impl;

  std::size_t size() const { return impl->size(); }
  epoch_reader open_reader(std::vector<std::size_t> order, std::size_t first) const { return {impl->open(std::move(order), first)}; }
  batch decode(std::function<batch()> make) const { return make(); }
};

/// Gathers rows `idx` of a tensor dataset (one index_select per tensor).
inline batch gather(tensor_dataset const& d, std::vector<std::size_t> const& idx) {
  auto rows = torch::empty({static_cast<std::int64_t>(idx.size())}, torch::kLong);
  auto* p = rows.data_ptr<std::int64_t>();
  for (std::size_t k = 0; k < idx.size(); ++k) p[k] = static_cast<std::int64_t>(idx[k]);
  return {d.inputs.index_select(0, rows), d.targets.index_select(0, rows)};
}

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

namespace detail {

/// A tensor dataset read as a stream (what `ctx.dataset_shard` loads it through).
struct tensor_stream final : stream_dataset::source {
  explicit tensor_stream(tensor_dataset d) : data(std::move(d)) {}
  struct reader final : stream_dataset::reader {
    tensor_dataset const* data;
    std::vector<std::size_t> order;
    std::function<batch()> fetch(std::size_t lo, std::size_t hi) override {
      return [d = data, idx = index_reader{order}.fetch(lo, hi)] { return gather(*d, idx); };
    }
  };
  std::size_t size() const override { return data.size(); }
  bool in_memory() const override { return true; }
  std::unique_ptr<stream_dataset::reader> open(std::vector<std::size_t> order, std::size_t) const override {
    auto r = std::make_unique<reader>();
    r->data = &data;
    r->order = std::move(order);
    return r;
  }
  tensor_dataset data;
};

/// Whether `s`'s batches are gathered from memory (loader_threads): a tensor dataset's are, a
/// stream's when it says so, a torch::data dataset's are not known to be.
template <class Source>
bool in_memory(Source const& s) {
  if constexpr (std::is_same_v<Source, stream_dataset>) return s.impl && s.impl->in_memory();
  else return std::is_same_v<Source, tensor_dataset>;
}

}  // namespace detail

}  // namespace cohort
