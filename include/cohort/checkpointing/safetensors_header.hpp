#pragma once
/// \file
/// The header of a safetensors file, parsed and checked without LibTorch: an 8-byte
/// little-endian header length, a JSON object naming each tensor's dtype, shape and byte range,
/// then the raw bytes. cohort::safetensors::load (cohort/torch/safetensors.hpp) allocates only
/// what this accepted; the fuzz target fuzz/safetensors.cpp calls it on arbitrary bytes.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/error.hpp"

namespace cohort::checkpointing::safetensors {

/// One tensor of a safetensors header, checked against the file it came from.
struct header_entry {
  std::string name;
  std::string dtype;                ///< "F32", "BF16", ...: one dtype_bytes knows
  std::vector<std::int64_t> shape;  ///< non-negative; the product of the non-zero dimensions fits in int64
  std::uint64_t begin = 0;          ///< byte range in the data after the header: begin <= end <= data_bytes
  std::uint64_t end = 0;            ///< end - begin = elements * dtype_bytes(dtype)
};

/// A parsed safetensors header.
struct parsed_header {
  std::uint64_t data_start = 0;       ///< offset of the data in the file: 8 + the header length
  std::uint64_t data_bytes = 0;       ///< bytes after the header
  std::vector<header_entry> tensors;  ///< in the order of the header's JSON object (by name); no "__metadata__"
};

/// Bytes per element of a safetensors dtype name, 0 for one this build does not read.
inline std::size_t dtype_bytes(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

/// Parses the header of the safetensors file `file` (its whole content; `path` only names it in
/// errors) and checks every size and offset against the file before anything is allocated.
/// Throws cohort::error naming the file, the tensor and the field when it is not a valid
/// safetensors file: a header that claims more bytes than the file holds is an error.
inline parsed_header parse_header(std::string_view file, std::filesystem::path const& path) {
  if (file.size() < 8) throw cohort::error(path.string() + ": too short for a safetensors file");
  std::uint64_t n = 0;
  for (std::size_t k = 0; k < 8; ++k) n |= std::uint64_t{static_cast<unsigned char>(file[k])} << (8 * k);
  std::uint64_t const data_bytes = file.size() - 8;
  if (n > data_bytes) throw cohort::error(path.string() + ": header length " + std::to_string(n) + " past the end of the file");
  auto const json = nlohmann::json::parse(file.substr(8, n), nullptr, false);
  if (!json.is_object()) throw cohort::error(path.string() + ": the header is not a JSON object");
  parsed_header out{.data_start = 8 + n, .data_bytes = data_bytes - n, .tensors = {}};
  std::uint64_t const body = out.data_bytes;
  for (auto const& item : json.items()) {
    auto const& name = item.key();  // not a structured binding: clang 14 cannot capture one in `bad`
    auto const& v = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](std::string const& what) { return cohort::error(path.string() + ": tensor '" + name + "': " + what); };
    if (!v.is_object()) throw bad("its entry is not a JSON object");
    auto const& offsets = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw bad("field 'data_offsets' is not two byte offsets");
    auto const b = offsets[0].get<std::uint64_t>(), e = offsets[1].get<std::uint64_t>();
    if (b > e || e > body) throw bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] lie past the end of the file");
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw bad("field 'dtype' is missing or not a string");
    auto dtype = v["dtype"].get<std::string>();
    auto const element = std::uint64_t{dtype_bytes(dtype)};
    if (element == 0) throw bad("unsupported dtype " + dtype);
    if (!v.contains("shape") || !v["shape"].is_array()) throw bad("field 'shape' is missing or not a list");
    std::vector<std::int64_t> shape;
    std::uint64_t count = 1;    // elements, checked against the bytes before anything is allocated
    std::uint64_t extent = 1;   // the product of the non-zero dimensions: a tensor's strides must fit in int64
    for (auto const& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("field 'shape' holds " + d.dump() + ", not a dimension");
      auto const dim = d.get<std::uint64_t>();
      if (dim != 0 && count > body / dim) throw bad("shape " + v["shape"].dump() + " is larger than the file");
      if (dim != 0 && extent > std::uint64_t{std::numeric_limits<std::int64_t>::max()} / dim)
        throw bad("shape " + v["shape"].dump() + " has dimensions whose product exceeds 2^63 (even with a zero among them)");
      count *= dim;
      extent *= dim != 0 ? dim : 1;
      shape.push_back(static_cast<std::int64_t>(dim));
    }
    if (count > body / element || count * element != e - b)
      throw bad("shape " + v["shape"].dump() + " of " + dtype + " needs " +
                (count > body / element ? std::string("more bytes than the file has") : std::to_string(count * element) + " bytes") +
                ", data_offsets give " + std::to_string(e - b));
    out.tensors.push_back({.name = name, .dtype = std::move(dtype), .shape = std::move(shape), .begin = b, .end = e});
  }
  return out;
}

}  // namespace cohort::checkpointing::safetensors
