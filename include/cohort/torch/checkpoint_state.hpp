#pragma once
/// \file
/// LibTorch state in checkpoints: modules (safetensors, which Python opens), optimizers
/// (LibTorch's archive), JSON values (epoch, step, a loader_state, ...) and torch's CPU random
/// generator state. The optimizers' capture is in torch/optimizer_state.hpp.

#include <torch/serialize.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/payload.hpp"
#include "cohort/error.hpp"
#include "cohort/torch/optimizer_state.hpp"
#include "cohort/torch/prepare_model.hpp"
#include "cohort/torch/safetensors.hpp"
#include "cohort/torch/step_gate.hpp"

namespace cohort {

namespace detail {

template <class T>
concept module_like = requires(T const& m) {
  { m->named_parameters() };
  { m->named_buffers() };
};
template <class T>
concept optimizer_like = std::is_base_of_v<torch::optim::Optimizer, std::remove_cvref_t<T>>;

/// The tensors checkpoint_of captured from prepared models: their gradient reducers, which hold
/// the next optimizer step while a deferred copy is pending, and the parameters they average.
struct step_holders {
  std::vector<std::shared_ptr<gradient_reducer>> reducers;
  std::vector<void const*> params;  ///< TensorImpl of every parameter those reducers average
  bool all_modules_prepared = true;

  bool holds(torch::Tensor const& t) const {
    return std::find(params.begin(), params.end(), t.unsafeGetTensorImpl()) != params.end();
  }
  void add(std::shared_ptr<gradient_reducer> const& r) {
    if (!r || std::find(reducers.begin(), reducers.end(), r) != reducers.end()) return;
    reducers.push_back(r);
    for (auto const& p : r->params()) params.push_back(p.unsafeGetTensorImpl());
  }
};

/// What checkpoint_of refers to: live module tensors and optimizers, until snapshot() copies
/// them (async mode) so training may go on while they are written.
struct torch_state {
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> modules;
  std::vector<std::vector<bool>> trainable;  ///< per module tensor: a parameter a reducer averages
  std::vector<torch::optim::Optimizer const*> optimizers;  ///< live until snapshot()
  std::vector<saved_optimizer> saved_optimizers;          ///< made by snapshot()
  nlohmann::json values = nlohmann::json::array();
  nlohmann::json optimizer_kinds = nlohmann::json::array();  ///< optimizer_kind() of each optimizer
  torch::Tensor cpu_rng;
  step_holders holders;
  // A deferred snapshot: the live tensors still to be copied into their destinations (read by
  // finish_snapshot() on the writer thread), their version counters and sampled values at
  // report() (a change before the copy means a torn checkpoint), and the gate that holds the
  // next optimizer step until they are copied.
  std::vector<torch::Tensor> sources, copies;  ///< live tensor i is copied into copies[i]
  std::vector<std::int64_t> versions;
  std::vector<std::uint64_t> values_at_report;  ///< sampled_values of the sources at report()
  std::shared_ptr<step_gate> gate;

  torch_state() = default;
  torch_state(torch_state const&) = delete;
  torch_state& operator=(torch_state const&) = delete;
  ~torch_state() {
    if (gate) gate->open();  // dropped before its copy: nothing holds the step any more
  }

  /// Whether the copies may wait for the writer thread: every module is prepared with a
  /// reducer, each optimizer trains only their parameters, and every reducer saw an optimizer
  /// step since its last backward, so the next change to these tensors comes after another
  /// backward, whose end waits for the copy; and the tensors are on the CPU. Otherwise (one
  /// rank, a report between backward and step, other tensors) report() copies them itself.
  bool deferrable() const {
    if (holders.reducers.empty() || !holders.all_modules_prepared) return false;
    for (auto const& r : holders.reducers) {
      if (!r->stepped_since_backward()) return false;
      for (auto const& p : r->params())
        if (!p.device().is_cpu()) return false;
    }
    for (auto const* o : optimizers)
      for (auto const& g : o->param_groups())
        for (auto const& p : g.params())
          if (!holders.holds(p)) return false;
    return true;
  }

  /// On the training thread (async mode): copies what training may change before the next
  /// backward ends (buffers, optimizer options) and either clones the trainable parameters and
  /// the optimizers' state tensors as well, or (deferrable()) allocates their destinations and
  /// leaves the copy to finish_snapshot(), holding the next optimizer step until it is done.
  /// The optimizers' archives (building, pickling, zip records, CRC-32) are left to write().
  /// Only rank 0 writes: other ranks copy nothing.
  void snapshot(int rank) {
    if (rank != 0) {
      modules.clear();
      optimizers.clear();
      return;
    }
    bool const defer = deferrable();
    auto copy = [&](torch::Tensor const& t) {
      if (!t.defined() || !defer) return copy_of(t);
      sources.push_back(t);
      copies.push_back(torch::empty_like(t));
      versions.push_back(t._version());
      return copies.back();
    };
    for (std::size_t m = 0; m < modules.size(); ++m)
      for (std::size_t i = 0; i < modules[m].size(); ++i) {
        auto& t = modules[m][i].second;
        t = trainable[m][i] ? copy(t) : copy_of(t);  // buffers change in every forward
      }
    for (auto const* o : optimizers) saved_optimizers.push_back(capture_any_optimizer(*o, copy));
    optimizers.clear();
    if (!sources.empty()) {
      values_at_report = sampled_values(sources);
      gate = std::make_shared<step_gate>();
      for (auto const& r : holders.reducers) r->hold_step_until(gate);
    }
  }

  /// On the writer thread, before write(): the copies snapshot() deferred, then the next
  /// optimizer step may go on. Throws cohort::error when a tensor changed before it was copied
  /// (an in-place change with no backward in between): that checkpoint is not written.
  void finish_snapshot() {
    if (!gate) return;
    bool changed = false;
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < sources.size(); ++i) {
        copies[i].copy_(sources[i]);
        changed = changed || sources[i]._version() != versions[i];
      }
    }
    changed = changed || sampled_values(copies) != values_at_report;
    // `sources` keeps its references: the training thread drops them once it has waited for the
    // writer (report::protocol::settle_writes), so that a live tensor the training thread frees later
    // (the functor's optimizer, destroyed while the writer still copies) is freed after the
    // writer's reads in an order ThreadSanitizer sees (LibTorch's reference counts it cannot).
    gate->open();
    if (changed)
      throw cohort::error(
          "the model or optimizer changed in place after report() and before the next backward ended, while the "
          "async checkpoint was copying it: report after optimizer.step(), change parameters only in the "
          "optimizer step, or use checkpoint_mode::sync");
  }
};

template <class T>
struct is_prepared_model : std::false_type {};
template <class M>
struct is_prepared_model<prepared_model<M>> : std::true_type {};

template <class T>
void capture(torch_state& s, T const& item) {
  if constexpr (module_like<T>) {
    if constexpr (is_prepared_model<T>::value) {
      s.holders.add(item.reducer());
      s.holders.all_modules_prepared = s.holders.all_modules_prepared && item.reducer() != nullptr;
    } else {
      s.holders.all_modules_prepared = false;
    }
    std::vector<std::pair<std::string, torch::Tensor>> d;
    std::vector<bool> trainable;
    for (auto const& p : item->named_parameters()) {
      trainable.push_back(s.holders.holds(p.value()));
      d.emplace_back(p.key(), p.value().detach());  // shares the parameter's version counter
    }
    for (auto const& b : item->named_buffers()) {
      trainable.push_back(false);
      d.emplace_back(b.key(), b.value().detach());
    }
    s.modules.push_back(std::move(d));
    s.trainable.push_back(std::move(trainable));
  } else if constexpr (optimizer_like<T>) {
    s.optimizers.push_back(&item);
    s.optimizer_kinds.push_back(optimizer_kind(item));
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

/// "[6, 3]": a tensor shape as errors write it.
inline std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}
/// The first line of `text` (a LibTorch message without its backtrace).
inline std::string first_line(std::string_view text) { return std::string(text.substr(0, text.find('\n'))); }
inline std::string numbered(char const* stem, std::size_t i, char const* ext) {
  return std::string(stem) + (i == 0 ? std::string() : "_" + std::to_string(i)) + ext;
}

template <class T>
void restore(std::filesystem::path const& dir, std::size_t& module_i, std::size_t& optimizer_i, std::size_t& value_i,
             nlohmann::json const& state, T& item) {
  if constexpr (module_like<T>) {
    auto file = dir / numbered("model", module_i++, ".safetensors");
    auto saved = safetensors::load(file);
    torch::NoGradGuard no_grad;
    // As PyTorch's strict load_state_dict: every tensor of the model, of the same shape, and no
    // other (copy_ would broadcast a smaller tensor into a larger one without a word).
    std::size_t matched = 0;
    auto load = [&](std::string const& name, torch::Tensor& t) {
      for (auto const& [n, v] : saved)
        if (n == name) {
          if (v.sizes() != t.sizes())
            throw cohort::error("checkpoint file " + file.string() + ": tensor '" + name + "' has shape " +
                                shape_text(v.sizes()) + ", the model's has " + shape_text(t.sizes()) +
                                ": it was saved from another model (check the model's constructor arguments)");
          t.copy_(v);
          ++matched;
          return;
        }
      throw cohort::error("checkpoint file " + file.string() + " has no tensor '" + name + "': it was saved from another model");
    };
    for (auto& p : item->named_parameters()) load(p.key(), p.value());
    for (auto& b : item->named_buffers()) load(b.key(), b.value());
    if (matched != saved.size()) {
      auto const names = item->named_parameters().keys(), buffers = item->named_buffers().keys();
      for (auto const& [n, v] : saved)
        if (std::find(names.begin(), names.end(), n) == names.end() && std::find(buffers.begin(), buffers.end(), n) == buffers.end())
          throw cohort::error("checkpoint file " + file.string() + " has tensor '" + n +
                              "', which the model does not: it was saved from another model");
    }
  } else if constexpr (optimizer_like<T>) {
    auto const file = dir / numbered("optimizer", optimizer_i, ".pt");
    // state.json names each optimizer's kind (checkpoints written before it did are not checked).
    if (auto const* kinds = state.contains("optimizers") ? &state["optimizers"] : nullptr;
        kinds && kinds->is_array() && optimizer_i < kinds->size() && (*kinds)[optimizer_i].is_string() &&
        (*kinds)[optimizer_i].get<std::string>() != optimizer_kind(item))
      throw cohort::error("checkpoint file " + file.string() + " holds the state of a " +
                          (*kinds)[optimizer_i].get<std::string>() + " optimizer, not of this " + optimizer_kind(item) +
                          ": build the optimizer the checkpoint was saved with");
    ++optimizer_i;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      throw cohort::error("checkpoint " + dir.string() + " has no " + file.filename().string() +
                          ": it holds fewer optimizers than load_checkpoint was given (pass the items in the order saved)");
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(file.string());
      item.load(archive);
    } catch (c10::Error const& e) {
      throw cohort::error("checkpoint file " + file.string() + " does not load into this optimizer (" +
                          first_line(e.what_without_backtrace()) +
                          "): it was saved by another kind of optimizer, or for another model");
    }
  } else {
    auto const values = state.value("values", nlohmann::json::array());
    if (!values.is_array() || value_i >= values.size()) throw cohort::error("checkpoint " + dir.string() + " holds fewer values than requested");
    try {
      item = values[value_i].template get<T>();
    } catch (nlohmann::json::exception const& e) {
      throw cohort::error("checkpoint " + dir.string() + ": value " + std::to_string(value_i) + " of state.json does not convert (" +
                          e.what() + "): load the values in the order and types they were saved");
    }
    ++value_i;
  }
}

/// Value `i` of what checkpoint_of saved in `ckpt` (state.json's values), or null where it holds
/// fewer: for an item added after checkpoints were already written.
inline nlohmann::json checkpoint_value(checkpoint const& ckpt, std::size_t i) {
  std::ifstream in(ckpt.path() / "state.json");
  auto const state = nlohmann::json::parse(in, nullptr, false);
  if (!state.is_object() || !state.contains("values") || !state["values"].is_array() || i >= state["values"].size()) return nullptr;
  return state["values"][i];
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
  p.snapshot = [st](int rank) { st->snapshot(rank); };
  p.finish_snapshot = [st] { st->finish_snapshot(); };
  p.write = [st](std::filesystem::path const& dir, int rank) {
    if (rank != 0) return;
    // Small files first: the model's fsync (write_checked) then commits their blocks too.
    auto state = nlohmann::json{{"values", st->values}, {"optimizers", st->optimizer_kinds}}.dump(2);
    checkpointing::write_checked(dir / "state.json", state.data(), state.size());
    auto rng = torch::pickle_save(st->cpu_rng);
    checkpointing::write_checked(dir / "rng.pt", rng.data(), rng.size());
    std::vector<std::string> optimizer_bytes;  // async: from snapshot()'s archives; sync: from the live optimizers
    for (auto& saved : st->saved_optimizers)
      optimizer_bytes.push_back(saved.serialise ? saved.serialise() : saved.bytes);
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
/// checkpoint, the file and the tensor or value when a file or tensor is missing, a tensor's
/// shape differs from the model's, the file holds a tensor the model lacks, an optimizer is of
/// another kind than the one saved (state.json records it; older checkpoints are not checked) or
/// a value does not convert. A tensor of another dtype is converted (as load_state_dict does).
template <class... Items>
void load_checkpoint(checkpoint const& ckpt, Items&... items) {
  auto const& dir = ckpt.path();
  std::ifstream in(dir / "state.json");
  auto state = nlohmann::json::parse(in, nullptr, false);
  if (!state.is_object()) throw cohort::error("checkpoint " + dir.string() + " has no readable state.json");
  std::size_t m = 0, o = 0, v = 0;
  (detail::restore(dir, m, o, v, std::as_const(state), items), ...);
  auto rng = torch::pickle_load(detail::read_bytes(dir / "rng.pt")).toTensor();
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle sharing the default generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

}  // namespace cohort
