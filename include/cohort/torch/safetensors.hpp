#pragma once
/// \file
/// safetensors files (Hugging Face's format, read by Python's `safetensors.torch.load_file`):
/// an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
/// byte range, then the raw bytes. Written from the tensors' memory in one pass.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/checkpointing/checkpoint.hpp"
#include "cohort/checkpointing/safetensors_header.hpp"
#include "cohort/error.hpp"

namespace cohort::safetensors {

namespace detail {
inline std::string dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "F32";
    case torch::kDouble: return "F64";
    case torch::kHalf: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kLong: return "I64";
    case torch::kInt: return "I32";
    case torch::kShort: return "I16";
    case torch::kChar: return "I8";
    case torch::kByte: return "U8";
    case torch::kBool: return "BOOL";
    default: throw cohort::error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
  }
}
inline torch::ScalarType dtype_of(std::string const& s) {
  for (auto t : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt, torch::kShort,
                 torch::kChar, torch::kByte, torch::kBool})
    if (dtype_name(t) == s) return t;
  throw cohort::error("safetensors: unsupported dtype " + s);
}
}  // namespace detail

/// Where save() starts the byte buffer: the JSON header is padded with spaces (which the format
/// allows) so that the tensors' bytes begin on a page boundary of the file. Tensor memory is
/// 64-byte aligned, so write() then copies each cache line to the same offset in a page-cache
/// line; at the 80-byte offset of an unpadded header it took 5.5 ms instead of 3.6 for 16 MiB
/// (docs/benchmarks.md).
inline constexpr std::size_t data_alignment_bytes = 4096;

/// Writes `tensors` (name, CPU tensor) to `path` with checkpointing::write_checked (fsynced, its
/// checksum recorded for the commit). Contiguous CPU tensors are written from their own memory,
/// no copy; those whose size is a multiple of 64 bytes first, so they all stay aligned.
inline void save(std::filesystem::path const& path, std::vector<std::pair<std::string, torch::Tensor>> const& tensors) {
  std::vector<std::pair<std::string, torch::Tensor>> data;
  for (auto const& [name, t] : tensors) data.emplace_back(name, t.detach().to(torch::kCPU).contiguous());
  std::stable_partition(data.begin(), data.end(), [](auto const& d) { return d.second.nbytes() % 64 == 0; });
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (auto const& [name, t] : data) {
    auto bytes = static_cast<std::uint64_t>(t.nbytes());
    header[name] = {{"dtype", detail::dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h(8, '\0');  // the header's length, then the header
  h += header.dump();
  h.append((data_alignment_bytes - h.size() % data_alignment_bytes) % data_alignment_bytes, ' ');
  std::uint64_t const n = h.size() - 8;
  for (int k = 0; k < 8; ++k) h[static_cast<std::size_t>(k)] = static_cast<char>((n >> (8 * k)) & 0xff);
  std::vector<std::pair<void const*, std::size_t>> pieces{{h.data(), h.size()}};
  for (auto const& [name, t] : data) pieces.emplace_back(t.data_ptr(), t.nbytes());  // straight from the tensors
  checkpointing::write_checked(path, pieces);
}

/// Reads a safetensors file into (name, tensor) pairs, in file order. Throws cohort::error
/// naming the file, the tensor and the field when it is not a valid safetensors file. Every size
/// and offset is checked against the file before anything is allocated: a header that claims
/// more bytes than the file holds is an error, never an allocation.
inline std::vector<std::pair<std::string, torch::Tensor>> load(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cohort::error(path.string() + ": cannot open");
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  auto const h = checkpointing::safetensors::parse_header({bytes.data(), bytes.size()}, path);  // every check, before any allocation
  char const* base = bytes.data() + h.data_start;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto const& e : h.tensors) {
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(detail::dtype_of(e.dtype)));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), base + e.begin, e.end - e.begin);
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace cohort::safetensors
