#include <cohort/checkpointing/checkpoint.hpp>
#include <cohort/checkpointing/resume.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "../catch.hpp"
#include "../support.hpp"

namespace fs = std::filesystem;
using namespace cohort::checkpointing;

// A disk that fails fsync: this program's own fsync, which the linker takes over the C library's
// for every call in it (cohort is header-only, so its writer's calls are this program's). It
// fails with EIO for the one path armed (the file or directory an fd was opened at) and passes
// every other call to the kernel.
namespace fsync_fault {
std::mutex mutex;
std::string armed_path;  // empty: nothing fails
std::atomic<int> failures{0};

/// Arms the fault for `p` (exactly that path) until the guard ends.
struct armed {
  explicit armed(fs::path const& p) {
    std::lock_guard lock(mutex);
    armed_path = fs::weakly_canonical(p).string();
    failures = 0;
  }
  ~armed() {
    std::lock_guard lock(mutex);
    armed_path.clear();
  }
};
}  // namespace fsync_fault

extern "C" int fsync(int fd) {
  {
    std::lock_guard lock(fsync_fault::mutex);
    if (!fsync_fault::armed_path.empty()) {
      char target[4096];
      auto const n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target - 1);
      if (n > 0 && std::string(target, static_cast<std::size_t>(n)) == fsync_fault::armed_path) {
        ++fsync_fault::failures;
        errno = EIO;
        return -1;
      }
    }
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

namespace {

fs::path fresh_dir(std::string const& what) {
  auto d = fs::temp_directory_path() / "cohort_tests" / (what + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void commit_one(fs::path const& run, std::int64_t iteration, std::size_t bytes, char fill = 'x') {
  auto staging = run / ".staging" / dir_name(iteration);
  fs::create_directories(staging / "sub");
  std::ofstream(staging / "model.bin", std::ios::binary) << std::string(bytes, fill);
  std::ofstream(staging / "sub" / "rank1.bin", std::ios::binary) << "per-rank state";
  commit(staging, run / dir_name(iteration), {{"training_iteration", iteration}});
}

}  // namespace

TEST_CASE("a committed checkpoint lists every file with size and checksum and verifies", "[checkpointing][pure]") {
  auto run = fresh_dir("commit");
  commit_one(run, 3, 1000);
  auto dir = run / "checkpoint_000003";
  REQUIRE(fs::is_directory(dir));
  CHECK_FALSE(fs::exists(run / ".staging" / "checkpoint_000003"));
  CHECK_FALSE(verify(dir).has_value());
  auto ck = cohort::checkpoint::from_directory(dir);
  CHECK(ck.metadata()["training_iteration"] == 3);
  CHECK(fs::exists(ck.as_directory() / "sub" / "rank1.bin"));
}

TEST_CASE("files from write_checked, large (synced as written) and small, are listed with plain ones", "[checkpointing][pure]") {
  auto run = fresh_dir("write_checked");
  auto staging = run / ".staging" / dir_name(1);
  fs::create_directories(staging / "sub");
  std::string const small = "{\"values\": [1, 2]}";
  std::string const large(large_file_bytes + 3, 'L');
  write_checked(staging / "state.json", small.data(), small.size());
  write_checked(staging / "model.safetensors", {{large.data(), 100}, {large.data() + 100, large.size() - 100}});
  std::ofstream(staging / "sub" / "rank1.bin", std::ios::binary) << "per-rank state";
  commit(staging, run / dir_name(1), {});
  auto const dir = run / dir_name(1);
  CHECK_FALSE(verify(dir).has_value());
  std::ifstream in(dir / "manifest.json");
  auto const manifest = nlohmann::json::parse(in);
  std::map<std::string, std::uint64_t> listed;
  for (auto const& f : manifest["files"]) listed[f["name"].get<std::string>()] = f["size"].get<std::uint64_t>();
  CHECK(listed == std::map<std::string, std::uint64_t>{{"model.safetensors", large.size()}, {"state.json", small.size()}, {"sub/rank1.bin", 14}});
  for (auto const& f : manifest["files"]) CHECK(f["xxh3"] == file_hash(dir / f["name"].get<std::string>()));
  CHECK_FALSE(detail::take_written(staging / "model.safetensors").has_value());  // commit took the records
}

TEST_CASE("a corrupt, truncated or unlisted checkpoint is skipped for the previous good one", "[checkpointing][pure]") {
  auto run = fresh_dir("corrupt");
  commit_one(run, 1, 100);
  commit_one(run, 2, 100);
  std::ostringstream warnings;
  SECTION("wrong checksum") {
    std::fstream f(run / "checkpoint_000002" / "model.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('!');
  }
  SECTION("truncated file") { fs::resize_file(run / "checkpoint_000002" / "model.bin", 50); }
  SECTION("corrupt manifest") { std::ofstream(run / "checkpoint_000002" / "manifest.json") << "{ not json"; }
  SECTION("missing file") { fs::remove(run / "checkpoint_000002" / "sub" / "rank1.bin"); }
  auto good = latest_good(run, &warnings);
  REQUIRE(good.has_value());
  CHECK(good->path().filename() == "checkpoint_000001");
  CHECK_THAT(warnings.str(), contains_text("skipping checkpoint " + (run / "checkpoint_000002").string()));
}

TEST_CASE("a writer killed mid-write never damages the latest committed checkpoint", "[checkpointing][pure]") {
  auto run = fresh_dir("kill9");
  commit_one(run, 1, 4 << 20);
  int started[2];  // the child writes a byte as it begins each checkpoint
  REQUIRE(pipe(started) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // keeps committing large checkpoints until killed
    close(started[0]);
    for (std::int64_t i = 2;; ++i) {
      char const c = 's';
      if (write(started[1], &c, 1) != 1) _exit(2);
      commit_one(run, i, 8 << 20, static_cast<char>('a' + i % 26));
    }
  }
  close(started[1]);
  // Killed as checkpoint 3 begins, so checkpoint 2 was committed and 3 is being written (an
  // event, not a sleep: on a busy machine a fixed delay could end before checkpoint 2 began).
  char c = 0;
  for (int n = 0; n < 2; ++n) REQUIRE(read(started[0], &c, 1) == 1);
  kill(child, SIGKILL);
  close(started[0]);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  auto good = latest_good(run);
  REQUIRE(good.has_value());
  // Checkpoint 2 at least (3 too, only where the kill came after its commit).
  CHECK(good->path().filename().string() >= dir_name(2));
  CHECK_FALSE(verify(good->path()).has_value());
  for (auto const& d : committed(run)) CHECK_FALSE(verify(d).has_value());  // no committed dir is partial
}

TEST_CASE("a full disk fails cohort's writer with an error naming the file, and commits nothing", "[checkpointing][pure]") {
  auto run = fresh_dir("diskfull");
  commit_one(run, 1, 100);
  int message_pipe[2];
  REQUIRE(pipe(message_pipe) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // a file size limit of 64 KiB stands in for a full disk
    close(message_pipe[0]);
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    setrlimit(RLIMIT_FSIZE, &lim);
    try {
      auto staging = run / ".staging" / dir_name(2);
      fs::create_directories(staging);
      std::string const bytes(1 << 20, 'y');
      write_checked(staging / "model.bin", bytes.data(), bytes.size());  // cohort's writer: a short write, then EFBIG
      commit(staging, run / dir_name(2), {});
      _exit(0);
    } catch (cohort::error const& e) {
      std::string const m = e.what();
      if (write(message_pipe[1], m.data(), m.size()) < 0) _exit(4);
      _exit(3);
    }
  }
  close(message_pipe[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = read(message_pipe[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<std::size_t>(n));
  close(message_pipe[0]);
  int status = 0;
  waitpid(child, &status, 0);
  // Catches a writer that takes a short write for a whole one, or an error without the file.
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK_THAT(message, contains_text("could not write " + (run / ".staging" / dir_name(2) / "model.bin").string() +
                                    " (65536 bytes written): check free space"));
  CHECK_FALSE(fs::exists(run / dir_name(2)));
  CHECK(latest_good(run)->path().filename() == dir_name(1));
}

TEST_CASE("a failed fsync fails cohort's writer or commit with an error naming the path, and loses nothing committed", "[checkpointing][pure]") {
  // Catches a writer or commit that ignores fsync's result (a checkpoint reported durable that a
  // power cut could take), and a failure that leaves a partial checkpoint named as committed.
  auto run = fresh_dir("fsync_fails");
  commit_one(run, 1, 100);
  auto const staging = run / ".staging" / dir_name(2);
  fs::create_directories(staging);
  SECTION("a large file, synced by write_checked as it is written") {
    std::string const bytes(large_file_bytes + 1, 'y');
    fsync_fault::armed fault(staging / "model.bin");
    CHECK_THROWS_WITH(write_checked(staging / "model.bin", bytes.data(), bytes.size()),
                      "fsync of " + (staging / "model.bin").string() + " failed: check free space");
    CHECK(fsync_fault::failures == 1);
    CHECK_FALSE(fs::exists(run / dir_name(2)));
  }
  SECTION("a small file, synced by commit") {
    std::string const bytes(100, 'y');
    write_checked(staging / "state.bin", bytes.data(), bytes.size());
    fsync_fault::armed fault(staging / "state.bin");
    CHECK_THROWS_WITH(commit(staging, run / dir_name(2), {}),
                      "fsync of " + (staging / "state.bin").string() + " failed: check free space");
    CHECK(fsync_fault::failures == 1);
    CHECK_FALSE(fs::exists(run / dir_name(2)));
  }
  SECTION("the run directory, after the rename") {
    std::string const bytes(100, 'y');
    write_checked(staging / "state.bin", bytes.data(), bytes.size());
    fsync_fault::armed fault(run);
    CHECK_THROWS_WITH(commit(staging, run / dir_name(2), {}), "fsync of " + run.string() + " failed: check free space");
    CHECK(fsync_fault::failures == 1);
    // The rename happened and the checkpoint is whole: a resume may take it, as it verifies.
    CHECK_FALSE(verify(run / dir_name(2)).has_value());
  }
  // Whatever failed, checkpoint 1 is as it was.
  CHECK_FALSE(verify(run / dir_name(1)).has_value());
  CHECK(latest_good(run).has_value());
}

TEST_CASE("manifest names that would lead outside the checkpoint directory are refused", "[checkpointing][pure][bad-input]") {
  for (std::string name : std::vector<std::string>{"../outside", "/etc/passwd", "a/../../b", "", "a//b", "./a", "a\\b", "sub/", "..",
                                                  std::string("a\0b", 3)}) {
    INFO(name);
    CHECK(unsafe_name(name).has_value());
  }
  for (std::string name : std::vector<std::string>{"model.bin", "sub/rank1.bin", "a.b/c..d", "...x"}) {
    INFO(name);
    CHECK_FALSE(unsafe_name(name).has_value());
  }
}

TEST_CASE("a hostile or unknown manifest is skipped for the previous good checkpoint", "[checkpointing][pure][bad-input]") {
  auto run = fresh_dir("hostile");
  commit_one(run, 1, 100);
  commit_one(run, 2, 100);
  auto const outside = run / "outside.bin";  // what a hostile manifest points at, outside checkpoint_000002
  std::ofstream(outside) << "secret";
  auto const dir = run / "checkpoint_000002";
  auto edit = [&](auto change) {
    nlohmann::json m;
    {
      std::ifstream in(dir / "manifest.json");
      m = nlohmann::json::parse(in);
    }
    for (auto& f : m["files"])
      if (f["name"] == "model.bin") change(m, f);
    std::ofstream(dir / "manifest.json", std::ios::trunc) << m.dump();
  };
  auto point_outside = [&](nlohmann::json& f, std::string const& name) {  // a listing that would verify if followed
    f["name"] = name;
    f["size"] = 6;
    f["xxh3"] = file_hash(outside);
  };
  std::string expect;
  SECTION("a name with ..") {
    edit([&](nlohmann::json&, nlohmann::json& f) { point_outside(f, "../outside.bin"); });
    expect = "file name '../outside.bin' has a '..' component";
  }
  SECTION("an absolute name") {
    edit([&](nlohmann::json&, nlohmann::json& f) { point_outside(f, outside.string()); });
    expect = "is absolute";
  }
  SECTION("a symbolic link pointing out") {
    fs::remove(dir / "model.bin");
    fs::create_symlink(outside, dir / "model.bin");
    edit([&](nlohmann::json&, nlohmann::json& f) { point_outside(f, "model.bin"); });
    expect = "a symbolic link (a checkpoint holds plain files only)";
  }
  SECTION("a linked folder on the way") {
    fs::remove_all(dir / "sub");
    fs::create_directory_symlink(run, dir / "sub");
    edit([&](nlohmann::json&, nlohmann::json& f) { point_outside(f, "sub/outside.bin"); });
    expect = "sub: a symbolic link";
  }
  SECTION("a folder where a file should be") {
    fs::remove(dir / "model.bin");
    fs::create_directory(dir / "model.bin");
    expect = "model.bin: not a regular file";
  }
  SECTION("an unknown format") {
    edit([&](nlohmann::json& m, nlohmann::json&) { m["format"] = 99; });
    expect = "format 99 is not one this build reads (1)";
  }
  SECTION("no format") {
    edit([&](nlohmann::json& m, nlohmann::json&) { m.erase("format"); });
    expect = "field 'format' is missing or not an integer";
  }
  SECTION("a size that is not a byte count") {
    edit([&](nlohmann::json&, nlohmann::json& f) { f["size"] = "100"; });
    expect = "entry 'model.bin': field 'size' is missing or not a byte count";
  }
  SECTION("a name that is not a string") {
    edit([&](nlohmann::json&, nlohmann::json& f) { f["name"] = 7; });
    expect = "an entry of 'files' has no string 'name'";
  }
  auto problem = verify(dir);
  REQUIRE(problem.has_value());
  CHECK_THAT(*problem, contains_text(expect));
  std::ostringstream warnings;
  auto good = latest_good(run, &warnings);
  REQUIRE(good.has_value());
  CHECK(good->path().filename() == "checkpoint_000001");
  CHECK_THAT(warnings.str(), contains_text("skipping checkpoint " + dir.string()));
  CHECK(fs::exists(outside));
}

TEST_CASE("a run starting over a crashed attempt removes its .staging and .trash and resumes from its latest", "[checkpointing][pure]") {
  // Catches: leftovers of a crashed attempt that stay forever (a half-written checkpoint in
  // .staging, a dropped one retention had renamed into .trash but not yet deleted), or removing
  // them by a rule that also takes a committed checkpoint (docs/checkpointing.md's layout).
  auto run = fresh_dir("leftovers");
  commit_one(run, 1, 100);
  commit_one(run, 2, 100);
  fs::create_directories(run / ".staging" / "attempt_b_checkpoint_000003");
  std::ofstream(run / ".staging" / "attempt_b_checkpoint_000003" / "model.bin") << "half";
  fs::create_directories(run / ".trash" / "attempt_a_checkpoint_000000");
  std::ofstream(run / ".trash" / "attempt_a_checkpoint_000000" / "model.bin") << "dropped";
  retained kept;
  auto const point = resume_point(run, "", kept);
  CHECK(point.at("path") == (run / "checkpoint_000002").string());
  CHECK(point.at("iteration") == 2);
  CHECK_FALSE(fs::exists(run / ".staging"));
  CHECK_FALSE(fs::exists(run / ".trash"));
  CHECK(committed(run) == std::vector<fs::path>{run / "checkpoint_000001", run / "checkpoint_000002"});
  for (auto const& d : committed(run)) CHECK_FALSE(verify(d).has_value());
}

TEST_CASE("a link named like a checkpoint is neither resumed from nor listed for retention", "[checkpointing][pure][bad-input]") {
  auto run = fresh_dir("linked");
  auto elsewhere = fresh_dir("linked_elsewhere");
  commit_one(run, 1, 100);
  commit_one(elsewhere, 5, 100);
  fs::create_directory_symlink(elsewhere / "checkpoint_000005", run / "checkpoint_000005");
  CHECK(committed(run) == std::vector<fs::path>{run / "checkpoint_000001"});
  auto good = latest_good(run);
  REQUIRE(good.has_value());
  CHECK(good->path().filename() == "checkpoint_000001");
}
