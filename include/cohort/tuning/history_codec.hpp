#pragma once
/// \file
/// A trial's metrics history as compact bytes, for the result grid rank 0 sends to the other ranks
/// at the end of an experiment (encode_trials) and for the batches of results a group leader
/// sends without waiting (quiet_batch). A history is many rows with the same keys: the
/// keys of each distinct set are written once, and each row as the index of its set and its values
/// (numbers as their 8 bytes), so neither side parses, compares or looks up a key per row, and
/// the reader inserts each row's keys in order. Rows that are not objects, and values that are
/// arrays or objects, travel as MessagePack.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::tuning::detail {

/// The bytes of a history (nlohmann::json's binary type, so that it travels inside MessagePack).
using history_bytes = std::vector<std::uint8_t>;

namespace history_codec {

/// What precedes each value.
enum tag : std::uint8_t { null = 'n', yes = 't', no = 'f', integer = 'i', unsigned_integer = 'u', floating = 'd', string = 's', other = 'm' };
/// A row's key-set index meaning "not an object" (its value follows, as put_value writes it).
inline constexpr std::uint32_t not_an_object = 0xFFFFFFFFu;

template <class T>
void put(history_bytes& out, T const& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  auto const* p = reinterpret_cast<std::uint8_t const*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

inline void put_bytes(history_bytes& out, std::string_view s) {
  put(out, static_cast<std::uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

inline void put_value(history_bytes& out, nlohmann::json const& v) {
  using t = nlohmann::json::value_t;
  switch (v.type()) {
    case t::null: out.push_back(null); return;
    case t::boolean: out.push_back(v.get<bool>() ? yes : no); return;
    case t::number_integer: out.push_back(integer); put(out, v.get<std::int64_t>()); return;
    case t::number_unsigned: out.push_back(unsigned_integer); put(out, v.get<std::uint64_t>()); return;
    case t::number_float: out.push_back(floating); put(out, v.get<double>()); return;
    case t::string: out.push_back(string); put_bytes(out, v.get_ref<std::string const&>()); return;
    default: {
      std::string packed;
      nlohmann::json::to_msgpack(v, packed);
      out.push_back(other);
      put_bytes(out, packed);
    }
  }
}

/// Reads what put() and put_bytes() wrote; throws std::runtime_error past the end.
class reader {
 public:
  explicit reader(history_bytes const& in) : p_(in.data()), end_(in.data() + in.size()) {}

  template <class T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string_view bytes() {
    auto const n = get<std::uint32_t>();
    return {reinterpret_cast<char const*>(take(n)), n};
  }
  nlohmann::json value() {
    switch (get<std::uint8_t>()) {
      case null: return nullptr;
      case yes: return true;
      case no: return false;
      case integer: return get<std::int64_t>();
      case unsigned_integer: return get<std::uint64_t>();
      case floating: return get<double>();
      case string: return std::string(bytes());
      case other: {
        auto const b = bytes();
        return nlohmann::json::from_msgpack(b.begin(), b.end());
      }
      default: throw std::runtime_error("a history's bytes: unknown value tag");
    }
  }
  bool done() const { return p_ == end_; }

 private:
  std::uint8_t const* take(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) throw std::runtime_error("a history's bytes end early");
    auto const* at = p_;
    p_ += n;
    return at;
  }

  std::uint8_t const* p_;
  std::uint8_t const* end_;
};

/// A key set as history_writer keeps it: where each key's bytes were written in its output.
using written_keys = std::vector<std::pair<std::size_t, std::size_t>>;  // offset, size

/// Whether object `row`'s keys are `keys` (written in `out`), in order.
inline bool has_keys(nlohmann::json const& row, written_keys const& keys, history_bytes const& out) {
  auto const& obj = row.get_ref<nlohmann::json::object_t const&>();
  if (obj.size() != keys.size()) return false;
  auto k = keys.begin();
  for (auto const& [key, value] : obj) {
    auto const [offset, size] = *k++;
    if (key.size() != size || std::memcmp(key.data(), out.data() + offset, size) != 0) return false;
  }
  return true;
}

}  // namespace history_codec

/// Rows written one at a time as encode_history's bytes: their count; then per row the index of
/// its key set (a new set's index is the number of sets before it, followed by its keys) and its
/// values in key order.
class history_writer {
 public:
  history_writer() { history_codec::put(out_, std::uint32_t{0}); }  // the count, set by take()

  /// Appends `row`.
  void add(nlohmann::json const& row) {
    namespace c = history_codec;
    ++count_;
    if (!row.is_object()) {
      c::put(out_, c::not_an_object);
      c::put_value(out_, row);
      return;
    }
    auto const& obj = row.get_ref<nlohmann::json::object_t const&>();
    if (key_sets_.empty() || !c::has_keys(row, key_sets_[last_], out_)) {  // most rows have the keys of the row before
      // Else one of the latest sets_searched sets, or a new one (a set may then be written twice:
      // rows whose keys all differ cost a set each, not a search through every earlier one).
      last_ = key_sets_.size() - std::min(key_sets_.size(), sets_searched);
      while (last_ < key_sets_.size() && !c::has_keys(row, key_sets_[last_], out_)) ++last_;
    }
    c::put(out_, static_cast<std::uint32_t>(last_));
    if (last_ == key_sets_.size()) {  // a new set: its keys follow its index
      auto& keys = key_sets_.emplace_back();
      c::put(out_, static_cast<std::uint32_t>(obj.size()));
      for (auto const& [key, value] : obj) {
        c::put_bytes(out_, key);
        keys.emplace_back(out_.size() - key.size(), key.size());
      }
    }
    for (auto const& [key, value] : obj) c::put_value(out_, value);
  }

  /// Rows added since the last take().
  std::size_t size() const { return count_; }

  /// The bytes of the rows added, and a fresh start.
  history_bytes take() {
    auto const count = static_cast<std::uint32_t>(count_);
    std::memcpy(out_.data(), &count, sizeof count);
    auto bytes = std::exchange(out_, history_bytes{});
    *this = history_writer{};
    return bytes;
  }

 private:
  history_bytes out_;
  std::size_t count_ = 0;
  static constexpr std::size_t sets_searched = 16;
  std::vector<history_codec::written_keys> key_sets_;  ///< in out_, not copied
  std::size_t last_ = 0;  ///< the key set of the row before
};

/// `rows` as bytes (history_writer).
inline history_bytes encode_history(std::vector<nlohmann::json> const& rows) {
  history_writer w;
  for (auto const& row : rows) w.add(row);
  return w.take();
}

/// The rows encode_history wrote. Throws std::runtime_error on bytes it did not write (or
/// nlohmann::json::parse_error, where a value written as MessagePack is not).
inline std::vector<nlohmann::json> decode_history(history_bytes const& bytes) {
  namespace c = history_codec;
  c::reader in(bytes);
  auto const count = in.get<std::uint32_t>();
  if (count > bytes.size() / 4) throw std::runtime_error("a history's bytes end early");  // 4 or more bytes a row
  std::vector<nlohmann::json> rows(count);
  std::vector<std::vector<std::string_view>> key_sets;  // into `bytes`
  for (auto& row : rows) {
    auto const set = in.get<std::uint32_t>();
    if (set == c::not_an_object) {
      row = in.value();
      continue;
    }
    if (set == key_sets.size()) {
      auto const n = in.get<std::uint32_t>();
      if (n > bytes.size() / 4) throw std::runtime_error("a history's bytes end early");  // 4 or more bytes a key
      auto& keys = key_sets.emplace_back(n);
      for (auto& k : keys) k = in.bytes();
    } else if (set > key_sets.size()) {
      throw std::runtime_error("a history's bytes: unknown key set");
    }
    row = nlohmann::json::object();
    auto& obj = row.get_ref<nlohmann::json::object_t&>();
    for (auto const& k : key_sets[set]) obj.emplace_hint(obj.end(), k, in.value());  // written in key order
  }
  if (!in.done()) throw std::runtime_error("a history's bytes go on past its rows");
  return rows;
}

}  // namespace cohort::tuning::detail
