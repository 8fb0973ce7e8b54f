#include <cohort/data/csv.hpp>
#include <cohort/data/idx.hpp>
#include <cohort/data/record_file.hpp>
#include <cohort/sharding/views.hpp>

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>

#include <range/v3/range/conversion.hpp>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

/// The Fashion-MNIST folder: the Debian package's, or FASHION_MNIST_DIR (a test takes no flags;
/// the variable is for running the tests against another copy of the files).
std::filesystem::path fashion_dir() {
  char const* d = std::getenv("FASHION_MNIST_DIR");
  return d ? d : "/usr/share/datasets/fashion-mnist";
}

std::filesystem::path scratch_file(std::string const& name) {
  auto dir = std::filesystem::temp_directory_path() / "cohort_tests" / ("readers_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

void write_bytes(std::filesystem::path const& p, std::string const& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::string idx_bytes(std::vector<std::int64_t> dims, std::string const& data) {
  std::string s{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int k = 3; k >= 0; --k) s += static_cast<char>((d >> (8 * k)) & 0xff);
  return s + data;
}

}  // namespace

TEST_CASE("the real Fashion-MNIST IDX files read with their shapes and labels", "[data][idx]") {
  auto labels = cohort::data::read_idx(fashion_dir() / "t10k-labels-idx1-ubyte.gz");
  REQUIRE(labels.dims == std::vector<std::int64_t>{10000});
  std::set<int> classes(labels.data.begin(), labels.data.end());
  CHECK(classes.size() == 10);
  CHECK(*classes.rbegin() == 9);
  auto images = cohort::data::read_idx(fashion_dir() / "t10k-images-idx3-ubyte.gz");
  CHECK(images.dims == std::vector<std::int64_t>{10000, 28, 28});
  CHECK(images.data.size() == 10000u * 28 * 28);
}

TEST_CASE("truncated and corrupt IDX files name the file, the offset and the problem", "[data][idx]") {
  // a gzipped copy cut in half
  auto src = fashion_dir() / "t10k-labels-idx1-ubyte.gz";
  std::ifstream in(src, std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto cut = scratch_file("cut.gz");
  write_bytes(cut, gz.substr(0, gz.size() / 2));
  CHECK_THROWS_WITH(cohort::data::read_idx(cut), contains_text(cut.string() + " at byte"));
  // plain (not gzipped) files: good, short, wrong magic, trailing bytes, missing
  auto good = scratch_file("good.idx");
  write_bytes(good, idx_bytes({2, 3}, "abcdef"));
  auto a = cohort::data::read_idx(good);
  CHECK(a.dims == std::vector<std::int64_t>{2, 3});
  CHECK(a.data[5] == 'f');
  auto shrt = scratch_file("short.idx");
  write_bytes(shrt, idx_bytes({2, 3}, "abc"));
  CHECK_THROWS_WITH(cohort::data::read_idx(shrt), contains_text("at byte 15: short read: expected 6 data bytes, the file holds 3"));
  auto magic = scratch_file("magic.idx");
  write_bytes(magic, "PK\x03\x04 not idx");
  CHECK_THROWS_WITH(cohort::data::read_idx(magic), contains_text("at byte 0: bad magic number"));
  auto trailing = scratch_file("trailing.idx");
  write_bytes(trailing, idx_bytes({2}, "ab") + "x");
  CHECK_THROWS_WITH(cohort::data::read_idx(trailing), contains_text("trailing bytes"));
  CHECK_THROWS_WITH(cohort::data::read_idx(scratch_file("missing.idx")), contains_text("missing.idx: no such file"));
}

TEST_CASE("an IDX header that claims more than the file holds is an error, never an allocation", "[data][idx][bad-input]") {
  auto terabyte = scratch_file("terabyte.idx");  // 2^40 bytes claimed, 3 held
  write_bytes(terabyte, idx_bytes({0xFFFFFF, 0x10000}, "abc"));
  CHECK_THROWS_WITH(cohort::data::read_idx(terabyte),
                    contains_text("at byte 15: short read: expected 1099511562240 data bytes, the file holds 3"));
  auto overflow = scratch_file("overflow.idx");  // 8 dimensions of 2^32 - 1: the product overflows 64 bits
  write_bytes(overflow, idx_bytes(std::vector<std::int64_t>(8, 0xFFFFFFFF), "abc"));
  CHECK_THROWS_WITH(cohort::data::read_idx(overflow), contains_text("dimensions multiply to more than 2^48 elements"));
}

TEST_CASE("CSV files read numeric features and integer labels", "[data][csv]") {
  auto p = scratch_file("ok.csv");
  write_bytes(p, "x1, label ,x2\n0.5,1,2\n\n-1e3,0,3.25\n");
  auto t = cohort::data::read_csv(p);
  CHECK(t.columns == std::vector<std::string>{"x1", "x2"});
  CHECK(t.rows == 2);
  CHECK(t.features == std::vector<float>{0.5f, 2.0f, -1000.0f, 3.25f});
  CHECK(t.labels == std::vector<std::int64_t>{1, 0});
}

TEST_CASE("bad CSV input names the file, the line and the column", "[data][csv]") {
  auto bad = scratch_file("bad.csv");
  write_bytes(bad, "a,label\n1,0\n2x,1\n");
  CHECK_THROWS_WITH(cohort::data::read_csv(bad), contains_text("bad.csv line 3: column 'a': '2x' is not a number"));
  auto count = scratch_file("count.csv");
  write_bytes(count, "a,b,label\n1,2,0\n1,0\n");
  CHECK_THROWS_WITH(cohort::data::read_csv(count), contains_text("line 3: 2 fields, the header has 3"));
  auto label = scratch_file("label.csv");
  write_bytes(label, "a,label\n1,0.5\n");
  CHECK_THROWS_WITH(cohort::data::read_csv(label), contains_text("'0.5' is not an integer label"));
  CHECK_THROWS_WITH(cohort::data::read_csv(label, {.label_column = "y"}), contains_text("no column named 'y'"));
}

TEST_CASE("record files map fixed-size records and shard them without copies", "[data][records]") {
  auto p = scratch_file("records.bin");
  std::string bytes = "HDR!";
  for (int r = 0; r < 10; ++r) bytes += std::string(8, static_cast<char>('a' + r));
  write_bytes(p, bytes);
  cohort::data::record_file f(p, 8, 4);
  REQUIRE(f.size() == 10);
  CHECK(static_cast<char>(f.header()[0]) == 'H');
  CHECK(static_cast<char>(f[3][7]) == 'd');
  auto mine = f.records() | cohort::views::shard(3, 2, cohort::sharding::interleaved{}, 0) | ranges::to<std::vector>();
  REQUIRE(mine.size() == 4);
  CHECK(static_cast<char>(mine[1][0]) == 'f');  // record 5
  CHECK(mine[1].data() == f[5].data());         // the mapped bytes themselves
  write_bytes(p, bytes + "xyz");
  CHECK_THROWS_WITH(cohort::data::record_file(p, 8, 4), contains_text("is not a 4-byte header plus whole 8-byte records"));
}
