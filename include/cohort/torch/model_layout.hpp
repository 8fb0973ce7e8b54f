#pragma once
/// \file
/// A module's layout (one line per tensor: name, shape, dtype), the first difference between the
/// ranks' layouts as an error message, and a tensor broadcast from rank 0: what prepare_model
/// checks and does before training starts.

#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/comm/any.hpp"
#include "cohort/comm/collectives.hpp"

namespace cohort::detail {

/// One line per tensor: "name shape dtype"; compared across ranks before anything is broadcast.
inline std::vector<std::string> module_layout(torch::nn::Module const& m) {
  std::vector<std::string> out;
  auto add = [&](std::string const& kind, std::string const& name, torch::Tensor const& t) {
    std::ostringstream s;
    s << kind << " '" << name << "' " << t.sizes() << " " << t.dtype();
    out.push_back(s.str());
  };
  for (auto const& p : m.named_parameters()) add("parameter", p.key(), p.value());
  for (auto const& b : m.named_buffers()) add("buffer", b.key(), b.value());
  return out;
}

/// Pure: the first difference between rank 0's layout and another rank's, as an error message.
inline std::optional<std::string> layout_mismatch(std::vector<std::vector<std::string>> const& layouts) {
  for (std::size_t r = 1; r < layouts.size(); ++r) {
    auto const& a = layouts[0];
    auto const& b = layouts[r];
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i])
        return "model layout differs between ranks: tensor " + std::to_string(i) + " is " + a[i] + " on rank 0 but " +
               b[i] + " on rank " + std::to_string(r) + ": every rank must construct the same model";
    if (a.size() != b.size())
      return "model layout differs between ranks: rank 0 has " + std::to_string(a.size()) + " tensors, rank " +
             std::to_string(r) + " has " + std::to_string(b.size()) + ": every rank must construct the same model";
  }
  return std::nullopt;
}

inline void broadcast_tensor(comm::any& c, torch::Tensor& t) {
  auto host = t.device().is_cpu() && t.is_contiguous() ? t : t.to(torch::kCPU).contiguous();
  c.broadcast(reinterpret_cast<std::byte*>(host.data_ptr()), host.nbytes(), 0);
  if (!host.is_same(t)) t.copy_(host);
}

}  // namespace cohort::detail
