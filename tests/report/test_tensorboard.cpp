#include <cohort/report/tensorboard.hpp>
#include <cohort/trainer.hpp>
#include <cohort/tuning/tuner.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

using cohort_test::slurp;

std::string hex(std::string_view bytes) {
  static char const digits[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    auto const b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 0xF];
  }
  return out;
}

// A reader written from the formats' descriptions, independent of the writer: TFRecord framing
// checked with the masked CRC computed bit by bit, and the Event fields TensorBoard reads.
std::uint32_t bitwise_masked_crc32c(std::string_view bytes) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (char ch : bytes) {
    c ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  c ^= 0xFFFFFFFFu;
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::uint32_t masked_crc32c_of(std::uint32_t c) { return ((c >> 15) | (c << 17)) + 0xA282EAD8u; }

std::uint64_t le(std::string_view b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

std::vector<std::string> records_of(std::string const& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(file.size() - at >= 12);
    auto const len = le(file, at, 8);
    REQUIRE(le(file, at + 8, 4) == bitwise_masked_crc32c(std::string_view(file).substr(at, 8)));
    REQUIRE(file.size() - at - 12 >= len + 4);
    auto data = file.substr(at + 12, len);
    REQUIRE(le(file, at + 12 + len, 4) == bitwise_masked_crc32c(data));
    out.push_back(std::move(data));
    at += 16 + len;
  }
  return out;
}

struct decoded_event {
  double wall_time_s = 0;
  std::int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> values;
  std::string hparams_tag;  ///< an HParams summary's tag (its metadata names the "hparams" plugin)
};

struct proto_reader {
  std::string_view b;
  std::size_t at = 0;
  bool done() const { return at >= b.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < b.size());
      auto const byte = static_cast<unsigned char>(b[at++]);
      v |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return v;
    }
  }
  std::string_view bytes() {
    auto const n = varint();
    REQUIRE(b.size() - at >= n);
    auto s = b.substr(at, n);
    at += n;
    return s;
  }
  std::uint64_t fixed(int n) {
    REQUIRE(b.size() - at >= static_cast<std::size_t>(n));
    auto v = le(b, at, n);
    at += static_cast<std::size_t>(n);
    return v;
  }
};

decoded_event decode_event(std::string_view bytes) {
  decoded_event e;
  proto_reader r{bytes};
  while (!r.done()) {
    auto const key = r.varint();
    if (key == ((1u << 3) | 1u)) {
      auto bits = r.fixed(8);
      std::memcpy(&e.wall_time_s, &bits, sizeof bits);
    } else if (key == (2u << 3)) {
      e.step = static_cast<std::int64_t>(r.varint());
    } else if (key == ((3u << 3) | 2u)) {
      e.file_version = std::string(r.bytes());
    } else if (key == ((7u << 3) | 2u)) {
      proto_reader log{r.bytes()};
      REQUIRE(log.varint() == (1u << 3));  // SessionLog.status
      e.session_start = log.varint() == 1;  // START
    } else if (key == ((5u << 3) | 2u)) {
      proto_reader summary{r.bytes()};
      while (!summary.done()) {
        REQUIRE(summary.varint() == ((1u << 3) | 2u));
        proto_reader value{summary.bytes()};
        std::pair<std::string, float> v;
        while (!value.done()) {
          auto const k = value.varint();
          if (k == ((1u << 3) | 2u)) {
            v.first = std::string(value.bytes());
          } else if (k == ((8u << 3) | 2u)) {
            (void)value.bytes();  // the empty tensor of a plugin's summary
          } else if (k == ((9u << 3) | 2u)) {
            if (value.bytes().find("hparams") != std::string_view::npos) e.hparams_tag = v.first;
          } else {
            REQUIRE(k == ((2u << 3) | 5u));
            auto const bits = static_cast<std::uint32_t>(value.fixed(4));
            std::memcpy(&v.second, &bits, sizeof bits);
          }
        }
        if (e.hparams_tag.empty()) e.values.push_back(v);
      }
    } else {
      FAIL("unexpected field key " << key);
    }
  }
  return e;
}

std::vector<std::filesystem::path> events_files(std::filesystem::path const& dir) {
  std::vector<std::filesystem::path> out;
  for (auto const& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The scalar events of the files in `dir` as TensorBoard shows them: the files in name order,
// each beginning with its file_version event and a SessionLog START at its first step, which
// drops the events of earlier files at that step and later; a tuner's trial's files then hold
// its HParams session (`hparams`: whether every file has one; no other file may).
std::vector<decoded_event> events_in(std::filesystem::path const& dir, bool hparams = false) {
  std::vector<decoded_event> out;
  for (auto const& f : events_files(dir)) {
    auto records = records_of(slurp(f));
    std::size_t const first = hparams ? 3 : 2;
    REQUIRE(records.size() >= first + 1);
    CHECK(decode_event(records[0]).file_version == "brain.Event:2");
    auto const start = decode_event(records[1]);
    CHECK(start.session_start);
    if (hparams) CHECK(decode_event(records[2]).hparams_tag == "_hparams_/session_start_info");
    CHECK(start.step == decode_event(records[first]).step);
    std::erase_if(out, [&](decoded_event const& e) { return e.step >= start.step; });
    for (std::size_t i = first; i < records.size(); ++i) {
      out.push_back(decode_event(records[i]));
      CHECK(out.back().hparams_tag.empty());
    }
  }
  return out;
}

std::optional<float> value_of(decoded_event const& e, std::string const& tag) {
  for (auto const& [t, v] : e.values)
    if (t == tag) return v;
  return std::nullopt;
}

cohort::run_config quiet(std::filesystem::path const& storage, std::string name = "run") {
  return {.name = std::move(name), .storage_path = storage.string(), .verbose = 0};
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value, the RFC 3720 vectors and a bitwise crc at every length", "[report][tensorboard][pure]") {
  using cohort::report::crc32c;
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  std::string bytes;  // every length around the 8-byte steps, and every byte value
  for (int n = 0; n < 300; ++n) {
    CHECK(masked_crc32c_of(crc32c(bytes)) == bitwise_masked_crc32c(bytes));
    bytes += static_cast<char>((n * 167 + 13) & 0xFF);
  }
}

TEST_CASE("the masked crc rotates by 15 bits and adds TFRecord's constant", "[report][tensorboard][pure]") {
  using cohort::report::masked_crc32c;
  CHECK(masked_crc32c("") == 0xA282EAD8u);
  CHECK(masked_crc32c("123456789") == 0xC78AB0E5u);  // tensorboard's own masked_crc32c
  std::string some = "any bytes \x01\x02\xFF";
  CHECK(masked_crc32c(some) == bitwise_masked_crc32c(some));
}

TEST_CASE("a tfrecord frames data with its length and both masked crcs", "[report][tensorboard][pure]") {
  auto const rec = cohort::report::tfrecord("abc");
  REQUIRE(rec.size() == 3 + 16);
  CHECK(le(rec, 0, 8) == 3);
  CHECK(le(rec, 8, 4) == cohort::report::masked_crc32c(rec.substr(0, 8)));
  CHECK(rec.substr(12, 3) == "abc");
  CHECK(le(rec, 15, 4) == cohort::report::masked_crc32c("abc"));
  CHECK(records_of(rec + cohort::report::tfrecord("") + rec) == std::vector<std::string>{"abc", "", "abc"});
}

TEST_CASE("events are encoded byte for byte as TensorBoard's own protobuf classes encode them", "[report][tensorboard][pure]") {
  // The expected bytes come from tensorboard 2.20.0's event_pb2 (SerializeToString) and its
  // masked_crc32c, for Event(wall_time=1.5, step=3, summary: loss=0.25, val/acc=0.75).
  std::vector<cohort::report::scalar> const scalars{{"loss", 0.25f}, {"val/acc", 0.75f}};
  auto const event = cohort::report::scalar_event(1.5, 3, scalars);
  CHECK(hex(event) == "09000000000000f83f10032a1d0a0b0a046c6f7373150000803e0a0e0a0776616c2f616363150000403f");
  CHECK(hex(cohort::report::tfrecord(event)) ==
        "2a00000000000000ae8d91f5"
        "09000000000000f83f10032a1d0a0b0a046c6f7373150000803e0a0e0a0776616c2f616363150000403f"
        "bdbfc2c7");
  CHECK(hex(cohort::report::file_version_event(1.5)) == "09000000000000f83f1a0d627261696e2e4576656e743a32");
  CHECK(hex(cohort::report::session_start_event(1.5, 4)) == "09000000000000f83f10043a020801");
  auto const back = decode_event(event);
  CHECK(back.wall_time_s == 1.5);
  CHECK(back.step == 3);
  CHECK(back.values == std::vector<std::pair<std::string, float>>{{"loss", 0.25f}, {"val/acc", 0.75f}});
  CHECK(decode_event(cohort::report::scalar_event(0, 300'000'000'000, {})).step == 300'000'000'000);
}

TEST_CASE("the scalars of a row are its numbers and bools under flattened keys, without the step and timestamp",
          "[report][tensorboard][pure]") {
  nlohmann::json row{{"loss", 0.5},       {"epoch", 2},        {"done", true},   {"ok", false},
                     {"name", "x"},       {"none", nullptr},   {"list", {1, 2}}, {"val", {{"acc", 0.9}, {"n", 7u}}},
                     {"training_iteration", 4}, {"timestamp", 1'700'000'000}, {"empty", nlohmann::json::object()},
                     {"nan", std::numeric_limits<double>::quiet_NaN()}, {"inf", std::numeric_limits<double>::infinity()}};
  auto const s = cohort::report::scalars_of(row);
  std::vector<std::string> tags;
  for (auto const& x : s) tags.push_back(x.tag);
  CHECK(tags == std::vector<std::string>{"done", "epoch", "loss", "ok", "val/acc", "val/n"});
  CHECK(s[0].value == 1.0f);
  CHECK(s[1].value == 2.0f);
  CHECK(s[2].value == 0.5f);
  CHECK(s[3].value == 0.0f);
  CHECK(s[4].value == 0.9f);
  CHECK(s[5].value == 7.0f);
}

TEST_CASE("a new events file sorts after every events file already in the directory", "[report][tensorboard][pure]") {
  using cohort::report::events_file_name;
  CHECK(events_file_name(1'700'000'000, "node1", 42) == "events.out.tfevents.1700000000.node1.42");
  CHECK(events_file_name(5, "h", 1) == "events.out.tfevents.0000000005.h.1");
  std::vector<std::string> const existing{"result.json", "events.out.tfevents.1700000009.other.7", "events.out.tfevents.17x",
                                          "events.out.tfevents.1699999999.node1.9"};
  auto const name = events_file_name(1'700'000'000, "node1", 3, existing);  // the clock behind an earlier attempt
  CHECK(name == "events.out.tfevents.1700000010.node1.3");
  CHECK(existing[1] < name);
  CHECK(existing[3] < name);
}

TEST_CASE("a report row's event, encoded in place and sealed, is the reference encoding", "[report][tensorboard][pure]") {
  std::vector<nlohmann::json> const rows{
      {{"training_iteration", 1}, {"loss", 0.5}},
      {{"training_iteration", 300'000'000'000}, {"a", {{"b", {{"c", 1}}}, {"d", true}}}, {"s", "x"}, {"timestamp", 5}},
      {{"training_iteration", 2}},  // no scalars: an empty summary
      {{"training_iteration", 3}, {std::string(200, 'k'), 2.0}}};  // a tag longer than 127 bytes: two-byte lengths
  std::string records, reference;
  double t = 1.25;
  for (auto const& row : rows) {
    cohort::report::append_unsealed_event(records, t, row);
    reference += cohort::report::tfrecord(
        cohort::report::scalar_event(t, row["training_iteration"].get<std::int64_t>(), cohort::report::scalars_of(row)));
    t += 1;
  }
  REQUIRE(records.size() == reference.size());
  CHECK(records != reference);  // the CRCs are the writer thread's
  cohort::report::seal_records(records);
  CHECK(hex(records) == hex(reference));
  auto const decoded = records_of(records);
  REQUIRE(decoded.size() == 4);
  auto const second = decode_event(decoded[1]);
  CHECK(second.step == 300'000'000'000);
  CHECK(second.values == std::vector<std::pair<std::string, float>>{{"a/b/c", 1.0f}, {"a/d", 1.0f}});
  CHECK(cohort::report::first_step(records) == 1);
  CHECK(cohort::report::first_step(std::string_view(records).substr(decoded[0].size() + 16)) == 300'000'000'000);
  CHECK(cohort::report::first_step("") == 0);
}

namespace {
std::string encoded(std::vector<std::pair<double, nlohmann::json>> const& rows) {
  std::string out;
  for (auto const& [t, row] : rows) cohort::report::append_unsealed_event(out, t, row);
  return out;
}
}  // namespace

TEST_CASE("the event writer appends decodable events and a second writer starts a later file", "[report][tensorboard][pure]") {
  auto dir = cohort_test::scratch("tensorboard_writer") / std::to_string(cohort_test::world_rank());
  std::filesystem::create_directories(dir);
  {
    cohort::report::event_writer w(dir, cohort::report::directory_age::just_created);
    CHECK(w.path().empty());  // no file before the first event
    auto first = encoded({{1000.25, {{"training_iteration", 1}, {"loss", 1.0}}},
                          {1001.5, {{"training_iteration", 2}, {"loss", 0.5}, {"name", "x"}}}});
    w.write(first);
    auto second = encoded({{1002.0, {{"training_iteration", 3}, {"loss", 0.25}, {"acc", 0.8}}}});
    w.write(second);
    CHECK(w.path().parent_path() == dir);
  }
  {
    cohort::report::event_writer again(dir);  // a resume in the same second: the file name is later
    auto third = encoded({{1000.0, {{"training_iteration", 3}, {"loss", 0.125}}}});
    again.write(third);
  }
  auto const files = events_files(dir);
  REQUIRE(files.size() == 2);
  auto const events = events_in(dir);  // step 3 of the first file dropped by the second's START
  REQUIRE(events.size() == 3);
  CHECK(events[0].wall_time_s == 1000.25);
  CHECK(events[0].step == 1);
  CHECK(events[0].values == std::vector<std::pair<std::string, float>>{{"loss", 1.0f}});
  CHECK(events[1].step == 2);
  CHECK(events[1].values == std::vector<std::pair<std::string, float>>{{"loss", 0.5f}});  // the string left out
  CHECK(events[2].step == 3);  // the resumed attempt's
  CHECK(events[2].values == std::vector<std::pair<std::string, float>>{{"loss", 0.125f}});
  CHECK(records_of(slurp(files[0])).size() == 2 + 3);
}

TEST_CASE("create() makes the events file with its header at once; the first write only appends", "[report][tensorboard][pure]") {
  // Catches: create() writing nothing or no START (a tuner's trial creates its file as it
  // starts), or the first write() after it writing the header again.
  auto dir = cohort_test::scratch("tensorboard_create") / std::to_string(cohort_test::world_rank());
  std::filesystem::create_directories(dir);
  cohort::report::event_writer w(dir, cohort::report::directory_age::just_created);
  w.create(1);
  REQUIRE(events_files(dir).size() == 1);
  auto const header = slurp(events_files(dir)[0]);
  CHECK(records_of(header).size() == 2);  // file_version, SessionLog START
  auto first = encoded({{1000.25, {{"training_iteration", 1}, {"loss", 1.0}}}});
  w.write(first);
  w.create(1);  // once created, nothing more
  auto const all = slurp(events_files(dir)[0]);
  CHECK(all.substr(0, header.size()) == header);
  CHECK(records_of(all).size() == 2 + 1);
  auto const events = events_in(dir);
  REQUIRE(events.size() == 1);
  CHECK(events[0].step == 1);
  CHECK(events[0].values == std::vector<std::pair<std::string, float>>{{"loss", 1.0f}});
}

TEST_CASE("an events file that cannot be created is a warning, not an error", "[report][tensorboard][pure]") {
  cohort::report::event_writer w("/nonexistent/cohort/run", cohort::report::directory_age::just_created);
  auto one = encoded({{1.0, {{"training_iteration", 1}, {"loss", 1.0}}}});
  w.write(one);
  auto two = encoded({{2.0, {{"training_iteration", 2}, {"loss", 1.0}}}});
  w.write(two);  // gave up: no second warning
  CHECK_FALSE(std::filesystem::exists("/nonexistent/cohort/run"));
}

TEST_CASE("fit writes one events file in the run directory with every report, from rank 0 only", "[report][tensorboard][mpi]") {
  auto storage = cohort_test::scratch("tensorboard_fit");
  // A checkpoint every third report (async: its events go with the checkpoint's job), in both modes
  // and both hand-over paths (a console's job per report; batched without one).
  for (auto mode : {cohort::checkpoint_mode::sync, cohort::checkpoint_mode::async}) {
    for (int verbose : {0, 1}) {
      auto run = quiet(storage, "run_" + std::to_string(static_cast<int>(mode)) + "_" + std::to_string(verbose));
      run.verbose = verbose;
      run.checkpoint_mode = mode;
      auto r = cohort::trainer{[](cohort::context& ctx) {
                 for (int k = 1; k <= 7; ++k) {
                   nlohmann::json m{{"loss", 1.0 / k}, {"val", {{"acc", 0.1 * k}}}, {"phase", "train"}, {"best", k == 7}};
                   if (k % 3 == 0) {
                     ctx.report(m, cohort::checkpoint_payload{[k](std::filesystem::path const& dir, int rank) {
                       std::ofstream(dir / ("state_" + std::to_string(rank))) << k;
                     }, {}, {}, cohort::checkpoint_scope::per_rank});
                   } else {
                     ctx.report(m);
                   }
                 }
               }}.fit(nlohmann::json::object(), run);
      REQUIRE(r.ok());
      if (cohort_test::world_rank() != 0) continue;
      REQUIRE(events_files(r.path).size() == 1);  // rank 0's only
      auto const events = events_in(r.path);
      REQUIRE(events.size() == 7);
      for (std::size_t i = 0; i < events.size(); ++i) {
        auto const& row = r.metrics_history[i];
        CHECK(events[i].step == row["training_iteration"].get<std::int64_t>());
        CHECK(value_of(events[i], "loss") == static_cast<float>(row["loss"].get<double>()));
        CHECK(value_of(events[i], "val/acc") == static_cast<float>(row["val"]["acc"].get<double>()));
        CHECK(value_of(events[i], "best") == (i == 6 ? 1.0f : 0.0f));
        CHECK(value_of(events[i], "time_total_s") == static_cast<float>(row["time_total_s"].get<double>()));
        CHECK_FALSE(value_of(events[i], "phase"));
        CHECK_FALSE(value_of(events[i], "training_iteration"));
        CHECK(std::abs(events[i].wall_time_s - row["timestamp"].get<double>()) < 2.0);
      }
    }
  }
}

TEST_CASE("run_config.tensorboard = false writes no events file", "[report][tensorboard][mpi]") {
  auto storage = cohort_test::scratch("tensorboard_off");
  auto run = quiet(storage);
  run.tensorboard = false;
  auto r = cohort::trainer{[](cohort::context& ctx) { ctx.report({{"loss", 1.0}}); }}.fit(nlohmann::json::object(), run);
  REQUIRE(r.ok());
  if (cohort_test::world_rank() == 0) CHECK(events_files(r.path).empty());
}

TEST_CASE("a preempted run's events are all written, and its resume writes a second file", "[report][tensorboard][mpi]") {
  auto storage = cohort_test::scratch("tensorboard_resume");
  auto train = [](cohort::context& ctx) {
    std::int64_t k = ctx.checkpoint() ? std::stoll(slurp(ctx.checkpoint()->path() / "k")) : 0;
    for (++k; k <= 6; ++k) {
      if (k == 4 && !ctx.checkpoint()) cohort::comm::detail::stop_signal().store(SIGTERM);  // as if signalled before report 4
      ctx.report({{"k", k}}, cohort::checkpoint_payload{[k](std::filesystem::path const& dir, int rank) {
        if (rank == 0) std::ofstream(dir / "k") << k;
      }});
    }
  };
  auto first = cohort::trainer{train}.fit(nlohmann::json::object(), quiet(storage));
  CHECK(first.preempted);
  cohort::comm::detail::stop_signal().store(0);
  auto second = cohort::trainer{train}.fit(nlohmann::json::object(), quiet(storage));
  REQUIRE(second.ok());
  if (cohort_test::world_rank() != 0) return;
  REQUIRE(events_files(second.path).size() == 2);
  auto const events = events_in(second.path);
  std::vector<std::int64_t> steps;
  for (auto const& e : events) steps.push_back(e.step);
  CHECK(steps == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  for (auto const& e : events) CHECK(value_of(e, "k") == static_cast<float>(e.step));
}

TEST_CASE("steps a resumed run repeats show the resumed attempt's values", "[report][tensorboard][mpi]") {
  auto storage = cohort_test::scratch("tensorboard_repeat");
  auto train = [](cohort::context& ctx, nlohmann::json const& config) {
    int const attempt = config.at("attempt").get<int>();
    std::int64_t k = ctx.checkpoint() ? std::stoll(slurp(ctx.checkpoint()->path() / "k")) : 0;
    for (++k; k <= 6; ++k) {
      if (attempt == 1 && k == 6) throw std::runtime_error("a crash after report 5");
      nlohmann::json const m{{"k", k}, {"attempt", attempt}};
      if (k != 3) {
        ctx.report(m);
        continue;
      }
      ctx.report(m, cohort::checkpoint_payload{[k](std::filesystem::path const& dir, int rank) {
        if (rank == 0) std::ofstream(dir / "k") << k;
      }});
    }
  };
  CHECK_FALSE(cohort::trainer{train}.fit(nlohmann::json{{"attempt", 1}}, quiet(storage)).ok());
  auto second = cohort::trainer{train}.fit(nlohmann::json{{"attempt", 2}}, quiet(storage));  // from checkpoint 3
  REQUIRE(second.ok());
  if (cohort_test::world_rank() != 0) return;
  REQUIRE(events_files(second.path).size() == 2);
  std::vector<std::pair<std::int64_t, float>> seen;
  for (auto const& e : events_in(second.path)) seen.emplace_back(e.step, *value_of(e, "attempt"));
  CHECK(seen == std::vector<std::pair<std::int64_t, float>>{{1, 1.0f}, {2, 1.0f}, {3, 1.0f}, {4, 2.0f}, {5, 2.0f}, {6, 2.0f}});
}

TEST_CASE("every trial directory of a sweep gets its events file", "[report][tensorboard][mpi][tuning]") {
  auto storage = cohort_test::scratch("tensorboard_tune");
  auto fn = [](cohort::context& ctx, nlohmann::json const& config) {
    for (int k = 1; k <= 3; ++k) ctx.report({{"score", config.at("x").get<double>() * k}});
  };
  cohort::tuner tuner{fn, cohort::tune_config{.metric = "score", .num_samples = 3, .status_interval_s = 1e9}};
  auto grid = tuner.fit(cohort::space{{"x", cohort::uniform(0, 1)}}, quiet(storage, "sweep"));
  REQUIRE(grid.ok());
  REQUIRE(grid.size() == 3);
  if (cohort_test::world_rank() != 0) return;
  for (auto const& t : grid.trials) {
    auto const dir = t.path;
    REQUIRE(events_files(dir).size() == 1);
    auto const events = events_in(dir, true);  // a trial's file holds its HParams session
    REQUIRE(events.size() == 3);
    double const x = t.config.at("x").get<double>();
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(events[i].step == static_cast<std::int64_t>(i + 1));
      CHECK(value_of(events[i], "score") == static_cast<float>(x * static_cast<double>(i + 1)));
    }
  }
}
