#include <cohort/data/jpeg.hpp>
#include <cohort/data/shard_set.hpp>
#include <cohort/data/shard_writer.hpp>
#include <cohort/data/tar_shard.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../support.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<std::byte> bytes_of(std::string const& s) {
  std::vector<std::byte> b(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) b[i] = static_cast<std::byte>(s[i]);
  return b;
}

/// A fresh directory for this rank (the pure tests repeat on every rank).
fs::path rank_dir(std::string const& what) {
  auto dir = cohort_test::scratch(what) / std::to_string(cohort_test::world_rank());
  fs::create_directories(dir);
  return dir;
}

/// Writes `n` samples ("000000.txt" = "sample 0", "000000.cls" = "0" ...) into shards of `per`.
cohort::data::shard_set write_samples(fs::path const& dir, std::size_t n, std::size_t per) {
  cohort::data::shard_writer w(dir, {.prefix = "train", .samples_per_shard = per});
  for (std::size_t i = 0; i < n; ++i) {
    char key[24];
    std::snprintf(key, sizeof key, "%06zu", i);
    auto text = bytes_of("sample " + std::to_string(i));
    auto cls = bytes_of(std::to_string(i % 10));
    w.write(key, {{"txt", text}, {"cls", cls}});
  }
  return w.close();
}

}  // namespace

TEST_CASE("a shard writer's samples read back by key and member, with the index beside them", "[data][shards]") {
  auto dir = rank_dir("shards_roundtrip");
  auto written = write_samples(dir, 25, 10);
  REQUIRE(written.shards.size() == 3);
  CHECK(written.samples_per_shard() == std::vector<std::size_t>{10, 10, 5});
  CHECK(fs::exists(dir / "index.json"));
  CHECK(fs::exists(dir / "train-000002.tar"));

  cohort::data::tar_shard t(dir / "train-000001.tar");
  auto s = t.next();
  REQUIRE(s);
  CHECK(s->key == "000010");
  CHECK(s->text("txt") == "sample 10");
  CHECK(s->text("cls") == "0");
  CHECK(s->members.size() == 2);
  CHECK(t.skip());  // 000011, its bytes seeked past
  auto s12 = t.next();
  REQUIRE(s12);
  CHECK(s12->key == "000012");
  CHECK(s12->text("txt") == "sample 12");
  CHECK_THROWS_WITH(s12->member("jpg"), contains_text("sample '000012' has no member 'jpg' (it has txt, cls)"));

  auto by_glob = cohort::data::shard_set::from_glob((dir / "train-*.tar").string());
  CHECK(by_glob.size() == 25);
  CHECK(by_glob.samples_per_shard() == written.samples_per_shard());
  std::ofstream(dir / "list.txt") << "# the training shards\ntrain-000002.tar\n\n" << (dir / "train-000000.tar").string() << "\n";
  auto listed = cohort::data::shard_set::from_list_file(dir / "list.txt");
  CHECK(listed.samples_per_shard() == std::vector<std::size_t>{5, 10});
}

TEST_CASE("shards without an index are counted once and the count cached", "[data][shards]") {
  auto dir = rank_dir("shards_count");
  write_samples(dir, 13, 4);
  fs::remove(dir / "index.json");
  auto counted = cohort::data::shard_set::from_glob((dir / "*.tar").string());
  CHECK(counted.samples_per_shard() == std::vector<std::size_t>{4, 4, 4, 1});
  CHECK(fs::exists(dir / "index.json"));  // written back
  CHECK(cohort::data::count_samples(dir / "train-000001.tar") == 4);
}

TEST_CASE("bad shards are one clear error naming the shard and the cause", "[data][shards][bad-input]") {
  auto dir = rank_dir("shards_bad");
  write_samples(dir, 8, 4);
  using cohort::data::shard_set;
  CHECK_THROWS_WITH(shard_set::from_glob((dir / "nothing-*.tar").string()), contains_text("no shard matches"));
  std::ofstream(dir / "missing.txt") << "train-000000.tar\ntrain-000009.tar\n";
  CHECK_THROWS_WITH(shard_set::from_list_file(dir / "missing.txt"), contains_text("train-000009.tar: shard not found"));

  // An index that disagrees with its shard (the shard was rewritten since).
  auto const size0 = fs::file_size(dir / "train-000000.tar");
  fs::resize_file(dir / "train-000000.tar", size0 + 512);
  CHECK_THROWS_WITH(shard_set::from_glob((dir / "train-*.tar").string()),
                    contains_text("train-000000.tar has " + std::to_string(size0 + 512) + " bytes but"));

  // A truncated shard: the reader names the shard, the member and the cause.
  fs::resize_file(dir / "train-000001.tar", 1024 + 100);  // two samples' first header, then part of a member
  auto read_all = [&] {
    cohort::data::tar_shard t(dir / "train-000001.tar");
    while (t.next()) {
    }
  };
  CHECK_THROWS_WITH(read_all(), contains_text("train-000001.tar") && contains_text("truncated"));

  // Not a tar at all.
  std::ofstream(dir / "junk.tar") << std::string(2000, 'x');
  auto read_junk = [&] {
    cohort::data::tar_shard t(dir / "junk.tar");
    t.next();
  };
  CHECK_THROWS_WITH(read_junk(), contains_text("junk.tar") && contains_text("corrupt"));
  std::ofstream(dir / "index.json") << "{\"format\": \"something else\"}";
  CHECK_THROWS_WITH(shard_set::from_glob((dir / "train-000000.tar").string()), contains_text("not a cohort shard index"));
}

TEST_CASE("JPEG images encode and decode, and a corrupt one is an error", "[data][jpeg]") {
  std::vector<std::uint8_t> grey(28 * 28);
  for (std::size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<std::uint8_t>((i * 7) % 256 / 2 + 60);
  auto jpg = cohort::data::encode_jpeg(grey, {28, 28, 1}, 100);
  auto size = cohort::data::jpeg_header(jpg, {.channels = 1});
  CHECK(size.width == 28);
  CHECK(size.height == 28);
  std::vector<std::uint8_t> back(28 * 28);
  cohort::data::decode_jpeg_into(jpg, size, back.data());
  int worst = 0;
  for (std::size_t i = 0; i < grey.size(); ++i) worst = std::max(worst, std::abs(int(back[i]) - int(grey[i])));
  CHECK(worst < 24);  // lossy, but close at quality 100
  auto rgb = cohort::data::jpeg_header(jpg, {.channels = 3});
  CHECK(rgb.channels == 3);

  auto broken = jpg;
  broken.resize(broken.size() / 3);
  std::vector<std::uint8_t> out(28 * 28);
  CHECK_THROWS_WITH(cohort::data::decode_jpeg_into(broken, size, out.data()), contains_text("corrupt JPEG"));
  CHECK_THROWS_WITH(cohort::data::jpeg_header(bytes_of("not an image")), contains_text("not a JPEG"));
  CHECK_THROWS_WITH(cohort::data::jpeg_header(jpg, {.channels = 1, .max_pixels = 100}), contains_text("28x28 pixels"));
}

// Hidden ([.]): run by ctest's data.webdataset_interop, which makes a venv with PyPI's webdataset
// and names its python in COHORT_TEST_PYTHON.
TEST_CASE("webdataset's shards read in cohort, and cohort's in webdataset", "[.][webdataset]") {
  char const* python = std::getenv("COHORT_TEST_PYTHON");
  REQUIRE(python);
  auto dir = rank_dir("shards_webdataset");
  auto const py = [&](std::string const& code) {
    auto cmd = std::string(python) + " -c \"" + code + "\" " + dir.string();
    return std::system(cmd.c_str());
  };
  // webdataset writes 20 samples in shards of 7; cohort counts and reads them.
  REQUIRE(py("import sys, webdataset as wds\n"
             "with wds.ShardWriter(sys.argv[1] + '/py-%06d.tar', maxcount=7, verbose=0) as w:\n"
             "    [w.write({'__key__': '%06d' % i, 'txt': 'sample %d' % i, 'cls': i % 10}) for i in range(20)]\n"
             "print('webdataset wrote 20 samples')") == 0);
  auto set = cohort::data::shard_set::from_glob((dir / "py-*.tar").string());
  CHECK(set.samples_per_shard() == std::vector<std::size_t>{7, 7, 6});
  std::size_t i = 0;
  for (auto const& s : set.shards) {
    cohort::data::tar_shard t(s.path);
    while (auto smp = t.next()) {
      char key[24];
      std::snprintf(key, sizeof key, "%06zu", i);
      CHECK(smp->key == key);
      CHECK(smp->text("txt") == "sample " + std::to_string(i));
      CHECK(smp->text("cls") == std::to_string(i % 10));
      ++i;
    }
  }
  CHECK(i == 20);
  // cohort writes 25 samples in shards of 10; webdataset reads them in order.
  write_samples(dir, 25, 10);
  CHECK(py("import sys, glob, webdataset as wds\n"
           "n = 0\n"
           "for i, s in enumerate(wds.WebDataset(sorted(glob.glob(sys.argv[1] + '/train-*.tar')), shardshuffle=False)):\n"
           "    assert s['__key__'] == '%06d' % i and s['txt'] == b'sample %d' % i and s['cls'] == b'%d' % (i % 10), s\n"
           "    n += 1\n"
           "assert n == 25, n\n"
           "print('webdataset read', n, 'samples')") == 0);
}
