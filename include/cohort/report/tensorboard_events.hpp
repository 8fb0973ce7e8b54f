#pragma once
/// \file
/// TensorBoard's file format, as pure functions: TFRecord framing (CRC-32C, masked) around
/// `Event` protocol buffers holding scalars, the file version, a SessionLog START and the HParams
/// plugin's session start. The few fields used are encoded here (no protobuf library, no CRC
/// library: a CRC-32C table and a protobuf writer for seven fields are less than either
/// dependency). report/tensorboard.hpp writes them to a run directory's events file.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::report {

namespace detail {

/// CRC-32C tables (Castagnoli, reflected polynomial 0x82F63B78) for slicing by 8, built at
/// compile time: table[0] is the byte-at-a-time table, table[k] advances k more bytes.
inline constexpr auto crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  return t;
}();

inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFFu);
}

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7Fu) | 0x80u);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

/// A length-delimited protobuf field: tag, length, bytes.
inline void put_bytes_field(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_varint(out, (field << 3) | 2u);
  put_varint(out, bytes.size());
  out.append(bytes);
}

}  // namespace detail

/// Pure: CRC-32C (Castagnoli) of `bytes`, the checksum of TFRecord files;
/// crc32c("123456789") == 0xE3069283.
inline std::uint32_t crc32c(std::string_view bytes) {
  auto const& t = detail::crc32c_tables;
  auto byte = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])); };
  std::uint32_t c = 0xFFFFFFFFu;
  std::size_t i = 0;
  for (; bytes.size() - i >= 8; i += 8) {  // 8 bytes per step: ~5x the byte-at-a-time loop
    std::uint32_t const lo = c ^ (byte(i) | byte(i + 1) << 8 | byte(i + 2) << 16 | byte(i + 3) << 24);
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][byte(i + 4)] ^
        t[2][byte(i + 5)] ^ t[1][byte(i + 6)] ^ t[0][byte(i + 7)];
  }
  for (; i < bytes.size(); ++i) c = t[0][(c ^ byte(i)) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/// Pure: the masked CRC-32C a TFRecord stores (a CRC of data that holds CRCs is weak, so TFRecord
/// rotates it and adds a constant).
inline std::uint32_t masked_crc32c(std::string_view bytes) {
  std::uint32_t const c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/// Pure: one TFRecord around `data`: its length (uint64, little-endian), the masked CRC-32C of
/// those 8 bytes, the data, the masked CRC-32C of the data.
inline std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  detail::put_le(out, data.size(), 8);
  detail::put_le(out, masked_crc32c(out), 4);
  out.append(data);
  detail::put_le(out, masked_crc32c(data), 4);
  return out;
}

/// One scalar of an event: TensorBoard's tag (a flattened metric key, "val/acc") and its value.
struct scalar {
  std::string tag;
  float value = 0;
};

namespace detail {

/// A metric's key path, innermost last: its segments joined with '/' are its flattened key.
struct key_path {
  std::string_view key;
  key_path const* outer = nullptr;
  std::size_t size() const { return key.size() + (outer ? outer->size() + 1 : 0); }
  void append_to(std::string& out) const {
    if (outer) {
      outer->append_to(out);
      out += '/';
    }
    out.append(key);
  }
  char* copy_to(char* p) const {
    if (outer) {
      p = outer->copy_to(p);
      *p++ = '/';
    }
    return std::copy(key.begin(), key.end(), p);
  }
};

/// Writes into memory already sized for it (append_unsealed_event).
struct cursor {
  char* p;
  void byte(unsigned v) { *p++ = static_cast<char>(v); }
  void le(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) *p++ = static_cast<char>((v >> (8 * i)) & 0xFFu);
  }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      *p++ = static_cast<char>((v & 0x7Fu) | 0x80u);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
  }
  template <class T>
  void bits(T v) {
    std::uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    le(b, sizeof v);
  }
};

/// Calls `f(path, value)` for each scalar of `j` (see scalars_of), in flatten() order, without
/// allocating; sets `step` to a top-level integer training_iteration.
template <class F>
void for_each_scalar(nlohmann::json const& j, key_path const* outer, F& f, std::int64_t& step) {
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end(); ++it) {
    key_path const path{it.key(), outer};
    auto const& v = it.value();
    if (!outer && path.key == "training_iteration") {
      if (v.is_number_integer()) step = v.get<std::int64_t>();
      continue;
    }
    if (!outer && path.key == "timestamp") continue;
    if (v.is_object() && !v.empty()) {
      for_each_scalar(v, &path, f, step);
    } else if (v.is_boolean()) {
      f(path, v.get<bool>() ? 1.0f : 0.0f);
    } else if (v.is_number()) {
      double const d = v.get<double>();
      if (std::isfinite(d)) f(path, static_cast<float>(d));
    }
  }
}

inline std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline void put_double(std::string& out, double d) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof bits);
  put_le(out, bits, 8);
}

inline void put_float(std::string& out, float f) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  put_le(out, bits, 4);
}

}  // namespace detail

/// Pure: the scalars of a report row, in flatten() order: every number, and every bool as 0 or
/// 1 (as Ray's TensorBoard logger, to which a bool is an int); strings, nulls, arrays and
/// non-finite numbers are left out. `training_iteration` is the event's step and `timestamp`
/// its wall time, so neither is a scalar of its own. Values become float32, TensorBoard's type.
inline std::vector<scalar> scalars_of(nlohmann::json const& row) {
  std::vector<scalar> out;
  if (!row.is_object()) return out;
  auto add = [&](detail::key_path const& path, float value) {
    std::string tag;
    path.append_to(tag);
    out.push_back({std::move(tag), value});
  };
  std::int64_t step = 0;
  detail::for_each_scalar(row, nullptr, add, step);
  return out;
}

/// Pure: an `Event` protocol buffer: wall_time (field 1, double), step (field 2, int64) and a
/// `Summary` (field 5) with one `Summary.Value` per scalar (tag: field 1, simple_value: field 2).
inline std::string scalar_event(double wall_time_s, std::int64_t step, std::span<scalar const> scalars) {
  std::string summary;
  for (auto const& s : scalars) {
    std::string value;
    detail::put_bytes_field(value, 1, s.tag);
    value += static_cast<char>((2u << 3) | 5u);  // simple_value, fixed32
    detail::put_float(value, s.value);
    detail::put_bytes_field(summary, 1, value);
  }
  std::string event;
  event += static_cast<char>((1u << 3) | 1u);  // wall_time, fixed64
  detail::put_double(event, wall_time_s);
  event += static_cast<char>(2u << 3);  // step, varint
  detail::put_varint(event, static_cast<std::uint64_t>(step));
  detail::put_bytes_field(event, 5, summary);
  return event;
}

/// Appends to `out` the TFRecord of a report row's event with its two CRCs left zero, for
/// seal_records() to fill in: once sealed, the same bytes as
/// `tfrecord(scalar_event(wall_time_s, row["training_iteration"], scalars_of(row)))`. One pass
/// over the row, written in place: report() encodes (0.2 us for a row of 8 metrics in a loop,
/// where copying the row for another thread takes 0.8 us; docs/benchmarks.md) and the writer
/// thread seals and writes (the CRCs, reading 8 KiB of tables, were a quarter of the encoding's
/// time in report() under perf). Pure.
inline void append_unsealed_event(std::string& out, double wall_time_s, nlohmann::json const& row) {
  // The values first, after room for the longest header; then the header, moved up to them.
  constexpr std::size_t header_room = 12 + 9 + 1 + 10 + 1 + 5;
  std::size_t const start = out.size();
  out.resize(start + header_room);
  auto write = [&](detail::key_path const& path, float value) {
    std::size_t const tag = path.size();
    std::size_t const value_bytes = 1 + detail::varint_size(tag) + tag + 5;
    std::size_t const at = out.size();
    out.resize(at + 1 + detail::varint_size(value_bytes) + value_bytes);
    detail::cursor c{out.data() + at};
    c.byte((1u << 3) | 2u);  // Summary.value
    c.varint(value_bytes);
    c.byte((1u << 3) | 2u);  // tag
    c.varint(tag);
    c.p = path.copy_to(c.p);
    c.byte((2u << 3) | 5u);  // simple_value, fixed32
    c.bits(value);
  };
  std::int64_t step = 0;
  detail::for_each_scalar(row, nullptr, write, step);
  std::size_t const summary_bytes = out.size() - start - header_room;
  auto const step_bits = static_cast<std::uint64_t>(step);
  std::size_t const event_bytes = 9 + 1 + detail::varint_size(step_bits) + 1 + detail::varint_size(summary_bytes) + summary_bytes;
  std::size_t const header = 12 + event_bytes - summary_bytes;
  detail::cursor c{out.data() + start};
  c.le(event_bytes, 8);
  c.le(0, 4);              // masked CRC of the length: seal_records
  c.byte((1u << 3) | 1u);  // wall_time, fixed64
  c.bits(wall_time_s);
  c.byte(2u << 3);  // step, varint
  c.varint(step_bits);
  c.byte((5u << 3) | 2u);  // summary
  c.varint(summary_bytes);
  std::memmove(out.data() + start + header, out.data() + start + header_room, summary_bytes);
  out.resize(start + header + summary_bytes + 4);  // and the masked CRC of the event: seal_records
  std::memset(out.data() + start + header + summary_bytes, 0, 4);
}

/// Fills in the masked CRCs of the records in `records` (from append_unsealed_event); stops at a
/// record that does not fit. Pure.
inline void seal_records(std::string& records) {
  auto store = [&](std::size_t at, std::uint32_t v) {
    for (std::size_t i = 0; i < 4; ++i) records[at + i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
  };
  std::string_view const all = records;
  for (std::size_t at = 0; all.size() - at >= 16;) {
    std::uint64_t len = 0;
    for (std::size_t i = 8; i-- > 0;) len = (len << 8) | static_cast<unsigned char>(all[at + i]);
    if (len > all.size() - at - 16) return;
    store(at + 8, masked_crc32c(all.substr(at, 8)));
    store(at + 12 + len, masked_crc32c(all.substr(at + 12, len)));
    at += 16 + len;
  }
}

/// Pure: the first `Event` of every file: wall_time and file_version (field 3) "brain.Event:2".
inline std::string file_version_event(double wall_time_s) {
  std::string event;
  event += static_cast<char>((1u << 3) | 1u);
  detail::put_double(event, wall_time_s);
  detail::put_bytes_field(event, 3, "brain.Event:2");
  return event;
}

/// Pure: an `Event` at `step` holding a `SessionLog` (field 7) with status START: TensorBoard
/// then drops what earlier files of the directory hold at this step and later, as it does for a
/// TensorFlow job restarted from a checkpoint (a resumed run repeats the steps after it).
inline std::string session_start_event(double wall_time_s, std::int64_t step) {
  std::string event;
  event += static_cast<char>((1u << 3) | 1u);
  detail::put_double(event, wall_time_s);
  event += static_cast<char>(2u << 3);
  detail::put_varint(event, static_cast<std::uint64_t>(step));
  detail::put_bytes_field(event, 7, std::string_view("\x08\x01", 2));  // status = START
  return event;
}

/// Pure: an `Event` holding the HParams plugin's session start (TensorBoard's HParams tab: one
/// session per trial, its hyperparameters beside its final metrics): a `Summary.Value` tagged
/// `_hparams_/session_start_info` whose metadata names the plugin "hparams" and carries an
/// `HParamsPluginData` (version 0) with `session_start_info` (field 3): `hparams` (field 1, a map
/// of google.protobuf.Value: numbers as number_value, bools as bool_value, anything else as its
/// text in string_value; `config` flattened with '/', as flatten() does) and start_time_secs
/// (field 5); its value is an empty float tensor, as tensorboard's hparams summary writes it.
inline std::string hparams_session_start_event(double wall_time_s, nlohmann::json const& config) {
  std::string hparams;
  auto add = [&](std::string const& key, nlohmann::json const& v) {
    std::string value;  // google.protobuf.Value
    if (v.is_boolean()) {
      value += static_cast<char>(4u << 3);
      value += static_cast<char>(v.get<bool>() ? 1 : 0);
    } else if (v.is_number()) {
      value += static_cast<char>((2u << 3) | 1u);
      detail::put_double(value, v.get<double>());
    } else {
      detail::put_bytes_field(value, 3, v.is_string() ? v.get<std::string>() : v.dump());
    }
    std::string entry;
    detail::put_bytes_field(entry, 1, key);
    detail::put_bytes_field(entry, 2, value);
    detail::put_bytes_field(hparams, 1, entry);
  };
  auto walk = [&](auto& self, nlohmann::json const& j, std::string const& prefix) -> void {
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto const key = prefix.empty() ? it.key() : prefix + "/" + it.key();
      if (it.value().is_object() && !it.value().empty()) self(self, it.value(), key);
      else add(key, it.value());
    }
  };
  if (config.is_object()) walk(walk, config, "");
  hparams += static_cast<char>((5u << 3) | 1u);  // start_time_secs
  detail::put_double(hparams, wall_time_s);
  std::string plugin_data;  // HParamsPluginData
  detail::put_bytes_field(plugin_data, 3, hparams);
  std::string plugin;  // SummaryMetadata.PluginData
  detail::put_bytes_field(plugin, 1, "hparams");
  detail::put_bytes_field(plugin, 2, plugin_data);
  std::string metadata;
  detail::put_bytes_field(metadata, 1, plugin);
  std::string value;  // Summary.Value
  detail::put_bytes_field(value, 1, "_hparams_/session_start_info");
  detail::put_bytes_field(value, 8, std::string_view("\x08\x01\x12\x02\x12\x00", 6));  // DT_FLOAT, shape [0]
  detail::put_bytes_field(value, 9, metadata);
  std::string summary;
  detail::put_bytes_field(summary, 1, value);
  std::string event;
  event += static_cast<char>((1u << 3) | 1u);
  detail::put_double(event, wall_time_s);
  detail::put_bytes_field(event, 5, summary);
  return event;
}

/// Pure: the step of the first record in `records` (from append_unsealed_event), 0 if none.
inline std::int64_t first_step(std::string_view records) {
  // The record's header (12 bytes), wall_time (tag and 8 bytes), then step's tag and varint.
  std::uint64_t step = 0;
  if (records.size() < 12 + 9 + 2 || static_cast<unsigned char>(records[21]) != (2u << 3)) return 0;
  for (std::size_t i = 22, shift = 0; i < records.size() && shift < 64; ++i, shift += 7) {
    auto const b = static_cast<unsigned char>(records[i]);
    step |= static_cast<std::uint64_t>(b & 0x7Fu) << shift;
    if (!(b & 0x80u)) break;
  }
  return static_cast<std::int64_t>(step);
}

}  // namespace cohort::report
