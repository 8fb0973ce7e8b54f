#pragma once
/// \file
/// Collectives built from the communicator concept: strings and scalars, for control traffic
/// (configs, errors, layouts). None of these sit on the per-step path.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cohort/comm/communicator.hpp"

namespace cohort::comm {

/// Every rank's `value`, in rank order. Cost: two allgathers (lengths, then padded bytes).
template <communicator C>
std::vector<std::string> allgather_strings(C& comm, std::string const& value) {
  auto const n = static_cast<std::size_t>(comm.size());
  std::int64_t len = static_cast<std::int64_t>(value.size());
  std::vector<std::int64_t> lens(n);
  comm.allgather(reinterpret_cast<std::byte const*>(&len), sizeof len,
                 reinterpret_cast<std::byte*>(lens.data()));
  std::size_t width = 0;
  for (auto l : lens) width = std::max(width, static_cast<std::size_t>(l));
  std::vector<std::byte> send(width), recv(width * n);
  if (!value.empty()) std::memcpy(send.data(), value.data(), value.size());  // an empty vector's data() may be null
  comm.allgather(send.data(), width, recv.data());
  std::vector<std::string> out(n);
  for (std::size_t r = 0; r < n; ++r)
    out[r].assign(reinterpret_cast<char const*>(recv.data() + r * width), static_cast<std::size_t>(lens[r]));
  return out;
}

/// `root`'s `value` on every rank. Cost: two broadcasts (length, then bytes).
template <communicator C>
std::string broadcast_string(C& comm, std::string value, int root = 0) {
  if (comm.size() == 1) return value;
  std::int64_t len = static_cast<std::int64_t>(value.size());
  comm.broadcast(reinterpret_cast<std::byte*>(&len), sizeof len, root);
  value.resize(static_cast<std::size_t>(len));
  comm.broadcast(reinterpret_cast<std::byte*>(value.data()), value.size(), root);
  return value;
}

/// Every rank's `value`, in rank order.
template <communicator C, class T>
  requires std::is_trivially_copyable_v<T>
std::vector<T> allgather_value(C& comm, T const& value) {
  std::vector<T> out(static_cast<std::size_t>(comm.size()));
  comm.allgather(reinterpret_cast<std::byte const*>(&value), sizeof(T),
                 reinterpret_cast<std::byte*>(out.data()));
  return out;
}

/// Agreement on an error (blocking, control path; every rank must call): the first error any rank
/// reports, prefixed with its rank when the ranks do not all report the same one, or nothing when
/// every rank is fine. Cost: two allgathers.
template <comm::communicator C>
std::optional<std::string> agree_on_error(C& comm, std::optional<std::string> const& local) {
  auto all = allgather_strings(comm, local ? "!" + *local : std::string{});
  std::optional<std::string> first;
  bool same = true;
  int first_rank = -1;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) {
      same = false;
      continue;
    }
    if (!first) {
      first = all[r].substr(1);
      first_rank = static_cast<int>(r);
    } else if (all[r].substr(1) != *first) {
      same = false;
    }
  }
  if (first && !same) return "rank " + std::to_string(first_rank) + ": " + *first;
  return first;
}

}  // namespace cohort::comm
