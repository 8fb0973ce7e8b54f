#pragma once
/// \file
/// LibTorch state in checkpoints: modules (a state dict in PyTorch's pickle format, so Python's
/// torch.load opens model.pt), optimizers (LibTorch's archive), JSON values (epoch, step, a
/// loader_state, ...) and torch's CPU random generator state.

#include <torch/serialize.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"

namespace cohort {

namespace detail {

template <class T>
concept module_like = requires(T const& m) {
  { m->named_parameters() };
  { m->named_buffers() };
};
template <class T>
concept optimizer_like = std::is_base_of_v<torch::optim::Optimizer, std::remove_cvref_t<T>>;

/// What checkpoint_of captured at the step boundary: copies, so training may go on while it is
/// written.
struct torch_snapshot {
  std::vector<c10::Dict<std::string, torch::Tensor>> modules;
  std::vector<std::string> optimizers;  ///< each serialised in memory
  nlohmann::json values = nlohmann::json::array();
  torch::Tensor cpu_rng;
};

template <class T>
void capture(torch_snapshot& s, T const& item) {
  if constexpr (module_like<T>) {
    c10::Dict<std::string, torch::Tensor> d;
    for (auto const& p : item->named_parameters()) d.insert(p.key(), p.value().detach().to(torch::kCPU, false, true));
    for (auto const& b : item->named_buffers()) d.insert(b.key(), b.value().detach().to(torch::kCPU, false, true));
    s.modules.push_back(std::move(d));
  } else if constexpr (optimizer_like<T>) {
    torch::serialize::OutputArchive archive;
    item.save(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    s.optimizers.push_back(bytes.str());
  } else {
    s.values.push_back(nlohmann::json(item));
  }
}

inline void write_bytes(std::filesystem::path const& p, char const* data, std::size_t n) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(n));
  out.flush();
  if (!out) throw cohort::error("could not write " + p.string() + ": check free space");
}

inline std::vector<char> read_bytes(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw cohort::error("checkpoint file " + p.string() + " is missing");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string numbered(char const* stem, std::size_t i) {
  return std::string(stem) + (i == 0 ? std::string() : "_" + std::to_string(i)) + ".pt";
}

template <class T>
void restore(std::filesystem::path const& dir, std::size_t& module_i, std::size_t& optimizer_i, std::size_t& value_i,
             nlohmann::json const& values, T& item) {
  if constexpr (module_like<T>) {
    auto d = torch::pickle_load(read_bytes(dir / numbered("model", module_i++))).toGenericDict();
    torch::NoGradGuard no_grad;
    auto load = [&](std::string const& name, torch::Tensor& t) {
      auto it = d.find(name);
      if (it == d.end()) throw cohort::error("checkpoint " + dir.string() + " has no tensor '" + name + "': it was saved from another model");
      t.copy_(it->value().toTensor());
    };
    for (auto& p : item->named_parameters()) load(p.key(), p.value());
    for (auto& b : item->named_buffers()) load(b.key(), b.value());
  } else if constexpr (optimizer_like<T>) {
    torch::serialize::InputArchive archive;
    archive.load_from((dir / numbered("optimizer", optimizer_i++)).string());
    item.load(archive);
  } else {
    if (value_i >= values.size()) throw cohort::error("checkpoint " + dir.string() + " holds fewer values than requested");
    item = values[value_i++].template get<T>();
  }
}

}  // namespace detail

/// A checkpoint of LibTorch state, captured now (copies): modules (as model.pt, model_1.pt, ...),
/// optimizers (optimizer.pt, ...), any JSON-convertible values (state.json, in order) and
/// torch's CPU random generator (rng.pt). Rank 0 writes them: they are replicated. Pass it to
/// `ctx.report(metrics, cohort::checkpoint_of(model, optimizer, epoch))`; read it back with
/// `cohort::load_checkpoint(*ctx.checkpoint(), model, optimizer, epoch)`.
template <class... Items>
checkpoint_payload checkpoint_of(Items const&... items) {
  auto snap = std::make_shared<detail::torch_snapshot>();
  (detail::capture(*snap, items), ...);
  snap->cpu_rng = at::detail::getDefaultCPUGenerator().get_state().clone();
  return {[snap](std::filesystem::path const& dir, int rank) {
    if (rank != 0) return;
    for (std::size_t i = 0; i < snap->modules.size(); ++i) {
      auto bytes = torch::pickle_save(snap->modules[i]);
      detail::write_bytes(dir / detail::numbered("model", i), bytes.data(), bytes.size());
    }
    for (std::size_t i = 0; i < snap->optimizers.size(); ++i)
      detail::write_bytes(dir / detail::numbered("optimizer", i), snap->optimizers[i].data(), snap->optimizers[i].size());
    auto state = nlohmann::json{{"values", snap->values}}.dump(2);
    detail::write_bytes(dir / "state.json", state.data(), state.size());
    auto rng = torch::pickle_save(snap->cpu_rng);
    detail::write_bytes(dir / "rng.pt", rng.data(), rng.size());
  }};
}

/// Loads what checkpoint_of saved into `items` (the same kinds, in the same order) and restores
/// torch's CPU random generator. Every rank reads the same files. Throws cohort::error naming the
/// checkpoint when a file or tensor is missing.
template <class... Items>
void load_checkpoint(checkpoint const& ckpt, Items&... items) {
  auto const& dir = ckpt.path();
  std::ifstream in(dir / "state.json");
  auto state = nlohmann::json::parse(in, nullptr, false);
  if (!state.is_object()) throw cohort::error("checkpoint " + dir.string() + " has no readable state.json");
  std::size_t m = 0, o = 0, v = 0;
  (detail::restore(dir, m, o, v, state["values"], items), ...);
  auto rng = torch::pickle_load(detail::read_bytes(dir / "rng.pt")).toTensor();
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle sharing the default generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace cohort
