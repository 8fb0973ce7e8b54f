#include <cohort/data/csv.hpp>
#include <cohort/data/idx.hpp>
#include <cohort/data/record_file.hpp>
#include <cohort/sharding/views.hpp>

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <chrono>
#include <iterator>
#include <optional>
#include <set>
#include <string>

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

/// COHORT_CACHE_DIR set to `dir` (nullptr: unset) for one scope, then as it was.
struct cache_dir_guard {
  explicit cache_dir_guard(char const* dir) {
    if (char const* v = std::getenv("COHORT_CACHE_DIR")) before = v;
    if (dir) setenv("COHORT_CACHE_DIR", dir, 1);
    else unsetenv("COHORT_CACHE_DIR");
  }
  ~cache_dir_guard() {
    if (before) setenv("COHORT_CACHE_DIR", before->c_str(), 1);
    else unsetenv("COHORT_CACHE_DIR");
  }
  std::optional<std::string> before;
};

TEST_CASE("a gzipped IDX file is inflated once and read through its plain copy after", "[data][idx]") {
  auto const cache = scratch_file("cache");
  std::filesystem::remove_all(cache);
  cache_dir_guard guard(cache.c_str());
  CHECK(cohort::data::idx_cache_dir() == cache / "idx");
  // A gzipped file of our own: 2 x 3 bytes.
  auto const gz = scratch_file("six.idx.gz");
  {
    auto const plain = idx_bytes({2, 3}, "abcdef");
    gzFile f = gzopen(gz.c_str(), "wb");
    REQUIRE(f);
    REQUIRE(gzwrite(f, plain.data(), static_cast<unsigned>(plain.size())) == static_cast<int>(plain.size()));
    gzclose(f);
  }
  auto const first = cohort::data::read_idx(gz);
  CHECK(first.dims == std::vector<std::int64_t>{2, 3});
  std::vector<std::filesystem::path> copies;
  for (auto const& e : std::filesystem::directory_iterator(cache / "idx")) copies.push_back(e.path());
  REQUIRE(copies.size() == 1);  // no temporary file left
  CHECK(copies[0].filename().string().starts_with("six.idx-"));
  std::ifstream in(copies[0], std::ios::binary);
  std::string const copy((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(copy == idx_bytes({2, 3}, "abcdef"));  // plain IDX, header and data
  // The second read takes the copy: a copy changed by hand (same size, still IDX) is what it returns.
  write_bytes(copies[0], idx_bytes({2, 3}, "uvwxyz"));
  auto const edited = cohort::data::read_idx(gz);
  CHECK(std::string(edited.data.begin(), edited.data.end()) == "uvwxyz");
  // A damaged copy is made again from the gzipped file.
  write_bytes(copies[0], "PK garbage");
  auto const again = cohort::data::read_idx(gz);
  CHECK(std::string(again.data.begin(), again.data.end()) == "abcdef");
  in.close();
  std::ifstream remade(copies[0], std::ios::binary);
  CHECK(std::string((std::istreambuf_iterator<char>(remade)), std::istreambuf_iterator<char>()) == idx_bytes({2, 3}, "abcdef"));
  // A file rewritten in place gets a copy of its own.
  std::filesystem::last_write_time(gz, std::filesystem::last_write_time(gz) + std::chrono::seconds(5));
  CHECK(cohort::data::read_idx(gz).data.size() == 6);
  CHECK(std::distance(std::filesystem::directory_iterator(cache / "idx"), std::filesystem::directory_iterator{}) == 2);
  // An empty COHORT_CACHE_DIR turns the copies off; without it, XDG's cache folder, then HOME's.
  cache_dir_guard off("");
  CHECK(cohort::data::idx_cache_dir().empty());
  std::filesystem::remove_all(cache);
  CHECK(cohort::data::read_idx(gz).data.size() == 6);
  CHECK_FALSE(std::filesystem::exists(cache));
  cache_dir_guard unset(nullptr);
  if (char const* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    CHECK(cohort::data::idx_cache_dir() == std::filesystem::path(xdg) / "cohort" / "idx");
  else if (char const* home = std::getenv("HOME"); home && *home)
    CHECK(cohort::data::idx_cache_dir() == std::filesystem::path(home) / ".cache" / "cohort" / "idx");
}

TEST_CASE("the plain copy's name changes with the file's path, size and time", "[data][idx][pure]") {
  using cohort::data::idx_cache_name;
  auto const a = idx_cache_name("/d/train-images-idx3-ubyte.gz", 100, 7);
  CHECK(a.starts_with("train-images-idx3-ubyte-"));
  CHECK(a.ends_with("-100-7"));
  CHECK(idx_cache_name("/d/train-images-idx3-ubyte.gz", 100, 7) == a);
  CHECK(idx_cache_name("/e/train-images-idx3-ubyte.gz", 100, 7) != a);
  CHECK(idx_cache_name("/d/train-images-idx3-ubyte.gz", 101, 7) != a);
  CHECK(idx_cache_name("/d/train-images-idx3-ubyte.gz", 100, 8) != a);
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
