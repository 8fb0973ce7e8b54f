#pragma once
/// \file
/// An optimizer's state captured for a checkpoint: LibTorch's built-in SGD, Adam, AdamW, Adagrad
/// and RMSprop copied tensor by tensor (so that training may go on while the copy is written),
/// any other optimizer serialised from its live state; and the kind state.json records.

#include <torch/serialize.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace cohort::detail {

using optimizer_state_map = std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

inline torch::Tensor copy_of(torch::Tensor const& t) { return t.defined() ? t.clone() : t; }

/// `state`'s tensors replaced by `copy(tensor)`.
template <class F>
void copy_tensors(torch::optim::SGDParamState& s, F const& copy) {
  s.momentum_buffer(copy(s.momentum_buffer()));
}
template <class F>
void copy_tensors(torch::optim::AdagradParamState& s, F const& copy) {
  s.sum(copy(s.sum()));
}
template <class F>
void copy_tensors(torch::optim::RMSpropParamState& s, F const& copy) {
  s.square_avg(copy(s.square_avg())).momentum_buffer(copy(s.momentum_buffer())).grad_avg(copy(s.grad_avg()));
}
template <class State, class F>  // Adam, AdamW
void copy_tensors(State& s, F const& copy) {
  s.exp_avg(copy(s.exp_avg())).exp_avg_sq(copy(s.exp_avg_sq())).max_exp_avg_sq(copy(s.max_exp_avg_sq()));
}

/// The optimizer's kind as state.json records it: a built-in's name, else its C++ type.
inline std::string optimizer_kind(torch::optim::Optimizer const& o) {
  namespace optim = torch::optim;
  if (dynamic_cast<optim::AdamW const*>(&o)) return "AdamW";
  if (dynamic_cast<optim::Adam const*>(&o)) return "Adam";
  if (dynamic_cast<optim::SGD const*>(&o)) return "SGD";
  if (dynamic_cast<optim::Adagrad const*>(&o)) return "Adagrad";
  if (dynamic_cast<optim::RMSprop const*>(&o)) return "RMSprop";
  if (dynamic_cast<optim::LBFGS const*>(&o)) return "LBFGS";
  return c10::demangle(typeid(o).name());
}

inline std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

/// An optimizer as snapshot() left it: a function that serialises it (run by the writer
/// thread), or, for an optimizer whose state snapshot() cannot copy, the bytes themselves.
struct saved_optimizer {
  std::function<std::string()> serialise;
  std::string bytes;
};

/// If `o` is an `Opt`: its state with every tensor replaced by `copy(tensor)` and its
/// parameter groups (options cloned: a later learning-rate change does not reach them), and
/// the writer's function that saves them through a second `Opt` built over them, so the bytes
/// are exactly what `o.save` writes. The live optimizer is only read.
template <class Opt, class State, class Options, class F>
std::optional<saved_optimizer> capture_optimizer(torch::optim::Optimizer const& o, F const& copy) {
  if (!dynamic_cast<Opt const*>(&o)) return std::nullopt;
  auto state = std::make_shared<optimizer_state_map>();
  for (auto const& [key, st] : o.state()) {
    auto const* typed = dynamic_cast<State const*>(st.get());
    if (!typed) return std::nullopt;
    auto c = std::make_unique<State>(*typed);
    copy_tensors(*c, copy);
    state->emplace(key, std::move(c));
  }
  auto groups = std::make_shared<std::vector<torch::optim::OptimizerParamGroup>>(o.param_groups());
  auto const defaults = static_cast<Options const&>(o.defaults());
  return saved_optimizer{[state, groups, defaults] {
    Opt twin(*groups, defaults);
    twin.state() = std::move(*state);
    torch::serialize::OutputArchive archive;
    twin.save(archive);
    return archive_bytes(archive);
  }, {}};
}

/// capture_optimizer for LibTorch's built-in SGD, Adam, AdamW, Adagrad and RMSprop; any other
/// optimizer is serialised here, from the live state.
template <class F>
saved_optimizer capture_any_optimizer(torch::optim::Optimizer const& o, F const& copy) {
  namespace optim = torch::optim;
  auto s = capture_optimizer<optim::SGD, optim::SGDParamState, optim::SGDOptions>(o, copy);
  if (!s) s = capture_optimizer<optim::Adam, optim::AdamParamState, optim::AdamOptions>(o, copy);
  if (!s) s = capture_optimizer<optim::AdamW, optim::AdamWParamState, optim::AdamWOptions>(o, copy);
  if (!s) s = capture_optimizer<optim::Adagrad, optim::AdagradParamState, optim::AdagradOptions>(o, copy);
  if (!s) s = capture_optimizer<optim::RMSprop, optim::RMSpropParamState, optim::RMSpropOptions>(o, copy);
  if (s) return std::move(*s);
  torch::serialize::OutputArchive archive;
  o.save(archive);
  return {{}, archive_bytes(archive)};
}

}  // namespace cohort::detail
