#pragma once
/// \file
/// LibTorch state in checkpoints: modules (safetensors, which Python opens), optimizers
/// (LibTorch's archive), JSON values (epoch, step, a loader_state, ...) and torch's CPU random
/// generator state.

#include <torch/serialize.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"
#include "cohort/torch/safetensors.hpp"

namespace cohort {

namespace detail {

template <class T>
concept module_like = requires(T const& m) {
  { m->named_parameters() };
  { m->named_buffers() };
};
template <class T>
concept optimizer_like = std::is_base_of_v<torch::optim::Optimizer, std::remove_cvref_t<T>>;

using optimizer_state_map = std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

inline torch::Tensor copy_of(torch::Tensor const& t) { return t.defined() ? t.clone() : t; }

/// A deep copy of an optimizer's per-parameter state (every tensor cloned) for LibTorch's
/// built-in SGD, Adam, AdamW, Adagrad and RMSprop; nullopt for any other state type.
inline std::optional<optimizer_state_map> deep_copy_state(torch::optim::Optimizer const& o) {
  namespace optim = torch::optim;
  optimizer_state_map out;
  for (auto const& [key, state] : o.state()) {
    auto const* p = state.get();
    std::unique_ptr<optim::OptimizerParamState> copy;
    if (auto const* s = dynamic_cast<optim::SGDParamState const*>(p)) {
      auto c = std::make_unique<optim::SGDParamState>(*s);
      c->momentum_buffer(copy_of(s->momentum_buffer()));
      copy = std::move(c);
    } else if (auto const* a = dynamic_cast<optim::AdamParamState const*>(p)) {
      auto c = std::make_unique<optim::AdamParamState>(*a);
      c->exp_avg(copy_of(a->exp_avg())).exp_avg_sq(copy_of(a->exp_avg_sq())).max_exp_avg_sq(copy_of(a->max_exp_avg_sq()));
      copy = std::move(c);
    } else if (auto const* w = dynamic_cast<optim::AdamWParamState const*>(p)) {
      auto c = std::make_unique<optim::AdamWParamState>(*w);
      c->exp_avg(copy_of(w->exp_avg())).exp_avg_sq(copy_of(w->exp_avg_sq())).max_exp_avg_sq(copy_of(w->max_exp_avg_sq()));
      copy = std::move(c);
    } else if (auto const* g = dynamic_cast<optim::AdagradParamState const*>(p)) {
      auto c = std::make_unique<optim::AdagradParamState>(*g);
      c->sum(copy_of(g->sum()));
      copy = std::move(c);
    } else if (auto const* r = dynamic_cast<optim::RMSpropParamState const*>(p)) {
      auto c = std::make_unique<optim::RMSpropParamState>(*r);
      c->square_avg(copy_of(r->square_avg())).momentum_buffer(copy_of(r->momentum_buffer())).grad_avg(copy_of(r->grad_avg()));
      copy = std::move(c);
    } else {
      return std::nullopt;
    }
    out.emplace(key, std::move(copy));
  }
  return out;
}

/// An optimizer as snapshot() left it: an archive over copies of its state, serialised by the
/// writer thread, or (optimizers whose state deep_copy_state does not know) the bytes themselves.
struct saved_optimizer {
  std::shared_ptr<torch::serialize::OutputArchive> archive;
  std::string bytes;
};

inline std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

/// What checkpoint_of refers to: live module tensors and optimizers, until snapshot() copies
/// them (async mode) so training may go on while they are written.
struct torch_state {
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> modules;
  std::vector<torch::optim::Optimizer const*> optimizers;  ///< live until snapshot()
  std::vector<saved_optimizer> saved_optimizers;          ///< made by snapshot()
  nlohmann::json values = nlohmann::json::array();
  torch::Tensor cpu_rng;

  /// On the training thread: clones the module tensors and the optimizers' state tensors (a
  /// copy of the bytes), and builds each optimizer's archive over the clones; the archive's
  /// serialisation (pickling, zip records, CRC-32: most of the cost) is left to write().
  void snapshot() {
    for (auto& m : modules)
      for (auto& [name, t] : m) t = copy_of(t);
    for (auto const* o : optimizers) {
      auto copy = deep_copy_state(*o);
      if (!copy) {  // an optimizer of unknown state: serialised here, from the live state
        torch::serialize::OutputArchive archive;
        o->save(archive);
        saved_optimizers.push_back({nullptr, archive_bytes(archive)});
        continue;
      }
      // Optimizer::save writes state() into the archive by reference: lend it the copies for
      // the call. The optimizer is the caller's (checkpoint_of takes it by const reference
      // only to say report() does not change it, which holds: its state is back on return).
      auto& live = const_cast<torch::optim::Optimizer&>(*o).state();
      auto archive = std::make_shared<torch::serialize::OutputArchive>();
      std::swap(live, *copy);
      try {
        o->save(*archive);
      } catch (...) {
        std::swap(live, *copy);
        throw;
      }
      std::swap(live, *copy);
      saved_optimizers.push_back({std::move(archive), {}});
    }
    optimizers.clear();
  }
};

template <class T>
void capture(torch_state& s, T const& item) {
  if constexpr (module_like<T>) {
    std::vector<std::pair<std::string, torch::Tensor>> d;
    for (auto const& p : item->named_parameters()) d.emplace_back(p.key(), p.value().detach());
    for (auto const& b : item->named_buffers()) d.emplace_back(b.key(), b.value().detach());
    s.modules.push_back(std::move(d));
  } else if constexpr (optimizer_like<T>) {
    s.optimizers.push_back(&item);
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

inline std::string numbered(char const* stem, std::size_t i, char const* ext) {
  return std::string(stem) + (i == 0 ? std::string() : "_" + std::to_string(i)) + ext;
}

template <class T>
void restore(std::filesystem::path const& dir, std::size_t& module_i, std::size_t& optimizer_i, std::size_t& value_i,
             nlohmann::json const& values, T& item) {
  if constexpr (module_like<T>) {
    auto file = dir / numbered("model", module_i++, ".safetensors");
    auto saved = safetensors::load(file);
    torch::NoGradGuard no_grad;
    auto load = [&](std::string const& name, torch::Tensor& t) {
      for (auto const& [n, v] : saved)
        if (n == name) {
          t.copy_(v);
          return;
        }
      throw cohort::error("checkpoint file " + file.string() + " has no tensor '" + name + "': it was saved from another model");
    };
    for (auto& p : item->named_parameters()) load(p.key(), p.value());
    for (auto& b : item->named_buffers()) load(b.key(), b.value());
  } else if constexpr (optimizer_like<T>) {
    torch::serialize::InputArchive archive;
    archive.load_from((dir / numbered("optimizer", optimizer_i++, ".pt")).string());
    item.load(archive);
  } else {
    if (value_i >= values.size()) throw cohort::error("checkpoint " + dir.string() + " holds fewer values than requested");
    item = values[value_i++].template get<T>();
  }
}

}  // namespace detail

/// A checkpoint of LibTorch state: modules (model.safetensors, model_1.safetensors, ...: Python
/// opens them with safetensors.torch.load_file), optimizers (optimizer.pt, ...: LibTorch's
/// archive), any JSON-convertible values (state.json, in order) and torch's CPU random
/// generator (rng.pt). Rank 0 writes them: they are replicated. In sync mode they are written
/// from the live tensors before report() returns; in async mode report() first copies them.
/// Use: `ctx.report(metrics, cohort::checkpoint_of(model, optimizer, epoch))`; read back with
/// `cohort::load_checkpoint(*ctx.checkpoint(), model, optimizer, epoch)`.
template <class... Items>
checkpoint_payload checkpoint_of(Items const&... items) {
  auto st = std::make_shared<detail::torch_state>();
  (detail::capture(*st, items), ...);
  st->cpu_rng = at::detail::getDefaultCPUGenerator().get_state().clone();
  checkpoint_payload p;
  p.snapshot = [st] { st->snapshot(); };
  p.write = [st](std::filesystem::path const& dir, int rank) {
    if (rank != 0) return;
    // Small files first: the model's fsync (write_checked) then carries them to disk in the same
    // journal commit, and commit() finds them already synced.
    auto state = nlohmann::json{{"values", st->values}}.dump(2);
    checkpointing::write_checked(dir / "state.json", state.data(), state.size());
    auto rng = torch::pickle_save(st->cpu_rng);
    checkpointing::write_checked(dir / "rng.pt", rng.data(), rng.size());
    std::vector<std::string> optimizer_bytes;  // async: from snapshot()'s archives; sync: from the live optimizers
    for (auto& saved : st->saved_optimizers)
      optimizer_bytes.push_back(saved.archive ? detail::archive_bytes(*saved.archive) : saved.bytes);
    for (auto const* o : st->optimizers) {
      torch::serialize::OutputArchive archive;
      o->save(archive);
      optimizer_bytes.push_back(detail::archive_bytes(archive));
    }
    for (std::size_t i = 0; i < optimizer_bytes.size(); ++i)
      checkpointing::write_checked(dir / detail::numbered("optimizer", i, ".pt"), optimizer_bytes[i].data(), optimizer_bytes[i].size());
    for (std::size_t i = 0; i < st->modules.size(); ++i) safetensors::save(dir / detail::numbered("model", i, ".safetensors"), st->modules[i]);
  };
  return p;
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
