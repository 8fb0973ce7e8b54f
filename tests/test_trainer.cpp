#include <cohort/trainer.hpp>

#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "callback_log.hpp"
#include "catch.hpp"
#include "support.hpp"

namespace {

struct config {
  double lr = 0.1;
  int epochs = 3;
  std::string tag = "x";
  friend bool operator==(config const&, config const&) = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(config, lr, epochs, tag)

std::vector<std::string> lines_of(std::filesystem::path const& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

cohort::run_config quiet(std::filesystem::path const& storage, std::string name = "run") {
  return {.name = std::move(name), .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 30'000};
}

}  // namespace

TEST_CASE("fit returns the last metrics, the history and every rank's return value", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("fit");
  cohort::trainer t{[](cohort::context& ctx, config const& cfg) {
    for (int e = 0; e < cfg.epochs; ++e) ctx.report({{"epoch", e}, {"rank", ctx.world_rank()}});
    return ctx.world_rank() * 2;
  }};
  auto r = t.fit(config{}, quiet(storage));
  REQUIRE(r.ok());
  REQUIRE(r.metrics_history.size() == 3);
  CHECK(r.metrics["epoch"] == 2);
  CHECK(r.metrics["rank"] == 0);  // rank 0's metrics are the ones recorded
  CHECK(r.path == storage / "run");
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));
  for (int k = 0; k < cohort_test::world_size(); ++k) CHECK(r.return_values[static_cast<std::size_t>(k)] == 2 * k);
}

TEST_CASE("reports carry Ray's auto-filled keys into result.json and progress.csv", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("report");
  auto r = cohort::trainer{[](cohort::context& ctx) {
             ctx.report({{"loss", 1.0}});
             ctx.report({{"loss", 0.5}, {"val", {{"acc", 0.8}}}});
           }}.fit(nlohmann::json{{"a", 1}}, quiet(storage));
  REQUIRE(r.ok());
  CHECK(r.metrics_history[0]["training_iteration"] == 1);
  CHECK(r.metrics["training_iteration"] == 2);
  CHECK(r.metrics["time_total_s"].get<double>() >= r.metrics_history[0]["time_total_s"].get<double>());
  CHECK(r.metrics.contains("time_this_iter_s"));
  CHECK(r.metrics["timestamp"].get<std::int64_t>() > 1'600'000'000);
  if (cohort_test::world_rank() == 0) {
    auto rows = lines_of(r.path / "result.json");
    REQUIRE(rows.size() == 2);
    CHECK(nlohmann::json::parse(rows[1]) == r.metrics);
    auto csv = lines_of(r.path / "progress.csv");
    REQUIRE(csv.size() == 3);
    CHECK(csv[0] == "loss,time_this_iter_s,time_total_s,timestamp,training_iteration,val/acc");
    CHECK(nlohmann::json::parse(lines_of(r.path / "params.json")[0] + lines_of(r.path / "params.json")[1] +
                                lines_of(r.path / "params.json")[2]) == nlohmann::json{{"a", 1}});
  }
}

TEST_CASE("the config round-trips through JSON and rank 0's is used everywhere", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("config");
  config mine{.lr = 0.5 + cohort_test::world_rank(), .epochs = 7, .tag = "rank" + std::to_string(cohort_test::world_rank())};
  auto r = cohort::trainer{[](cohort::context&, config const& c) { return c; }}.fit(mine, quiet(storage));
  REQUIRE(r.ok());
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& got : r.return_values) CHECK(got == config{.lr = 0.5, .epochs = 7, .tag = "rank0"});
  // a plain JSON config converts into the functor's type
  auto j = cohort::trainer{[](cohort::context&, config const& c) { return c.epochs; }}.fit(
      nlohmann::json{{"lr", 1.0}, {"epochs", 9}, {"tag", "t"}}, quiet(storage, "json"));
  REQUIRE(j.ok());
  CHECK(j.return_values.front() == 9);
}

TEST_CASE("a config that does not parse is an error on every rank", "[trainer][mpi][bad-input]") {
  auto storage = cohort_test::scratch("badconfig");
  bool ran = false;
  auto r = cohort::trainer{[&](cohort::context&, config const&) { ran = true; }}.fit(
      nlohmann::json{{"lr", "fast"}}, quiet(storage));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("does not parse into"));
  CHECK_THAT(*r.error, contains_text("field 'lr': "));  // the field that does not convert is named
  CHECK_FALSE(ran);
  CHECK_FALSE(std::filesystem::exists(storage / "run" / "params.json"));
}

TEST_CASE("a wrong worker count is an error on every rank", "[trainer][mpi][bad-input]") {
  auto storage = cohort_test::scratch("workers");
  int const n = cohort_test::world_size();
  auto r = cohort::trainer{[](cohort::context&) {}, cohort::scaling::cpu{.num_workers = n + 1}}.fit(
      nlohmann::json::object(), quiet(storage));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("mpirun -np " + std::to_string(n + 1)));
}

TEST_CASE("an unwritable storage path is an error on every rank", "[trainer][mpi][bad-input]") {
  auto storage = cohort_test::scratch("unwritable");
  if (cohort_test::world_rank() == 0) {
    std::filesystem::create_directories(storage);
    std::ofstream(storage / "file") << "not a directory";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto r = cohort::trainer{[](cohort::context&) {}}.fit(nlohmann::json::object(), quiet(storage / "file"));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("cannot create run directory"));
  CHECK_THAT(*r.error, contains_text("storage_path"));
}

TEST_CASE("an exception on one rank fails the run on every rank", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("throw");
  int const last = cohort_test::world_size() - 1;
  auto r = cohort::trainer{[&](cohort::context& ctx) {
             if (ctx.world_rank() == last) throw std::runtime_error("boom on the last rank");
             ctx.report({{"ok", 1}});
           }}.fit(nlohmann::json::object(), quiet(storage));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("boom on the last rank"));
  CHECK(r.return_values.empty());
}

TEST_CASE("unequal report counts fail on every rank", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("counts");
  auto r = cohort::trainer{[](cohort::context& ctx) {
             ctx.report({{"a", 1}});
             if (ctx.world_rank() == 0) ctx.report({{"a", 2}});
           }}.fit(nlohmann::json::object(), quiet(storage));
  if (cohort_test::world_size() == 1) {  // one rank cannot differ from itself: two reports, no error
    REQUIRE(r.ok());
    CHECK(r.metrics_history.size() == 2);
    return;
  }
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("same number of times"));
}

TEST_CASE("the context places every rank and shards by the policy", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("context");
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             auto idx = ctx.shard_indices(10, 0);
                             return nlohmann::json{{"rank", ctx.world_rank()},
                                                   {"size", ctx.world_size()},
                                                   {"local", ctx.local_rank()},
                                                   {"local_size", ctx.local_world_size()},
                                                   {"node", ctx.node_rank()},
                                                   {"name", ctx.experiment_name()},
                                                   {"device", ctx.device().str()},
                                                   {"first", idx.front()},
                                                   {"count", idx.size()}};
                           },
                           cohort::sharding::contiguous{}}
               .fit(nlohmann::json::object(), quiet(storage, "ctx"));
  REQUIRE(r.ok());
  int const n = cohort_test::world_size();
  REQUIRE(r.return_values.size() == static_cast<std::size_t>(n));
  std::size_t per = (10 + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
  for (int k = 0; k < n; ++k) {
    auto const& v = r.return_values[static_cast<std::size_t>(k)];
    CHECK(v["rank"] == k);
    CHECK(v["size"] == n);
    CHECK(v["local"] == k);  // one host in the tests
    CHECK(v["local_size"] == n);
    CHECK(v["node"] == 0);
    CHECK(v["name"] == "ctx");
    CHECK(v["device"] == "cpu");
    CHECK(v["count"] == per);
    CHECK(v["first"] == (static_cast<std::size_t>(k) * per) % 10);
  }
}

TEST_CASE("a trainer runs on a split communicator", "[trainer][mpi]") {
  auto storage = cohort_test::scratch("split");
  auto world = cohort::comm::mpi::world();
  auto group = world.split(world.rank() % 2, world.rank());
  auto r = cohort::trainer{[](cohort::context& ctx) { return ctx.world_size(); }}.fit(
      nlohmann::json::object(), quiet(storage, "group" + std::to_string(world.rank() % 2)), group);
  REQUIRE(r.ok());
  CHECK(r.return_values.size() == static_cast<std::size_t>(group.size()));
  CHECK(r.return_values.front() == group.size());
}

TEST_CASE("storage that some hosts cannot see is named with those ranks and hosts", "[trainer][pure]") {
  std::vector<std::string> const hosts{"h1", "h1", "h2", "h3"};
  CHECK_FALSE(cohort::detail::unshared_storage_error({true, true, true, true}, hosts, "/s/run").has_value());
  auto e = cohort::detail::unshared_storage_error({true, true, false, false}, hosts, "/s/run");
  REQUIRE(e.has_value());
  CHECK(*e == "storage_path is not shared by every host: rank 2 on h2, rank 3 on h3 cannot see the run directory /s/run "
              "that rank 0 made on h1: set run_config.storage_path to a folder every host mounts (NFS or a parallel file system)");
  std::vector<bool> many(20, false);
  many[0] = true;
  auto m = cohort::detail::unshared_storage_error(many, std::vector<std::string>(20, "x"), "/s");
  REQUIRE(m.has_value());
  CHECK_THAT(*m, contains_text("rank 8 on x and 11 more cannot see"));
}

TEST_CASE("storage every rank sees passes the check on one host", "[trainer][mpi]") {
  auto world = cohort::comm::mpi::world();
  auto dir = cohort_test::scratch("shared_storage");
  std::filesystem::create_directories(dir);
  CHECK_FALSE(cohort::detail::check_shared_storage(world, dir, std::vector<std::string>(static_cast<std::size_t>(world.size()), "here")).has_value());
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(std::filesystem::is_empty(dir));  // the probe file is removed
}

namespace {

/// Three steps from the resumed one: each writes a checkpoint directory of its own (step.txt by
/// rank 0, shards/rank_<k> by every rank: storage every rank sees) under `base(ctx, step)` and
/// passes it to report() on rank 0 only, Ray's idiom. Returns the step it resumed from.
auto directory_steps(std::function<std::filesystem::path(cohort::context&, int)> base) {
  return [base](cohort::context& ctx) {
    int start = 0;
    if (auto const& ck = ctx.checkpoint()) std::ifstream(ck->as_directory() / "step.txt") >> start;
    for (int step = start + 1; step <= start + 3; ++step) {
      auto const dir = base(ctx, step);
      if (ctx.world_rank() == 0) std::filesystem::create_directories(dir / "shards");
      ctx.comm().barrier();
      std::ofstream(dir / "shards" / ("rank_" + std::to_string(ctx.world_rank()))) << step;
      if (ctx.world_rank() == 0) {
        std::ofstream(dir / "step.txt") << step;
        ctx.report({{"step", step}}, cohort::checkpoint::from_directory(dir));
      } else {
        ctx.report({{"step", step}});
      }
    }
    return start;
  };
}

/// What a checkpoint directory holds: step.txt and every rank's shard, each with `step`.
void check_directory_checkpoint(std::filesystem::path const& ck, int step) {
  CHECK_FALSE(cohort::checkpointing::verify(ck));
  int got = 0;
  std::ifstream(ck / "step.txt") >> got;
  CHECK(got == step);
  for (int k = 0; k < cohort_test::world_size(); ++k) {
    int shard = 0;
    std::ifstream(ck / "shards" / ("rank_" + std::to_string(k))) >> shard;
    CHECK(shard == step);
  }
}

}  // namespace

TEST_CASE("checkpoint_mode::no_upload commits a directory checkpoint where it was written, without a copy", "[trainer][mpi][checkpointing]") {
  // Catches: a directory copied (its source still there) instead of moved, a checkpoint missing a
  // rank's files, retention that does not apply to it, a resume that does not find it.
  auto const storage = cohort_test::scratch("no_upload");
  auto const in_run = [](cohort::context& ctx, int step) { return ctx.run_path() / ("mine_" + std::to_string(step)); };
  auto run = quiet(storage);
  run.checkpoint_mode = cohort::checkpoint_mode::no_upload;
  auto r = cohort::trainer{directory_steps(in_run), cohort::checkpointing::keep_last{.num_to_keep = 2}}.fit(nlohmann::json::object(), run);
  REQUIRE(r.ok());
  REQUIRE(r.checkpoint);
  CHECK(r.checkpoint->path == storage / "run" / "checkpoint_000003");
  check_directory_checkpoint(r.checkpoint->path, 3);
  if (cohort_test::world_rank() == 0) {
    for (int step : {1, 2, 3}) CHECK_FALSE(std::filesystem::exists(storage / "run" / ("mine_" + std::to_string(step))));  // moved
    CHECK_FALSE(std::filesystem::exists(storage / "run" / "checkpoint_000001"));  // keep_last 2
    CHECK(std::filesystem::exists(storage / "run" / "checkpoint_000002"));
  }
  auto again = cohort::trainer{directory_steps(in_run), cohort::checkpointing::keep_last{.num_to_keep = 2}}.fit(nlohmann::json::object(), run);
  REQUIRE(again.ok());
  REQUIRE(again.return_values.size() == static_cast<std::size_t>(cohort_test::world_size()));  // a loop over none checks nothing
  for (auto const& v : again.return_values) CHECK(v == 3);  // every rank resumed from step 3
  check_directory_checkpoint(again.checkpoint->path, 6);
}

TEST_CASE("in sync mode a directory checkpoint is copied into the run (Ray's upload), its source left as it is", "[trainer][mpi][checkpointing]") {
  auto const storage = cohort_test::scratch("dir_upload");
  auto const outside = [storage](cohort::context&, int step) { return storage / ("outside_" + std::to_string(step)); };
  auto r = cohort::trainer{directory_steps(outside)}.fit(nlohmann::json::object(), quiet(storage));
  REQUIRE(r.ok());
  check_directory_checkpoint(r.checkpoint->path, 3);
  check_directory_checkpoint(storage / "run" / "checkpoint_000001", 1);
  if (cohort_test::world_rank() == 0) CHECK(std::filesystem::exists(storage / "outside_3" / "step.txt"));  // copied, not moved
}

TEST_CASE("a directory checkpoint outside the run in no_upload mode, or holding a link, is an error on every rank", "[trainer][mpi][checkpointing][bad-input]") {
  auto const storage = cohort_test::scratch("dir_checkpoint_bad");
  auto run = quiet(storage, "outside");
  run.checkpoint_mode = cohort::checkpoint_mode::no_upload;
  auto const outside = [storage](cohort::context&, int step) { return storage / ("elsewhere_" + std::to_string(step)); };
  auto r = cohort::trainer{directory_steps(outside)}.fit(nlohmann::json::object(), run);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("checkpoint_mode::no_upload moves the checkpoint within the run directory"));
  CHECK_THAT(*r.error, contains_text("write it under ctx.run_path(), or use checkpoint_mode::sync to copy it"));
  CHECK_FALSE(r.checkpoint);
  if (cohort_test::world_rank() == 0) CHECK(std::filesystem::exists(storage / "elsewhere_1" / "step.txt"));  // not touched

  // A link in the directory: it could lead anywhere, so it is refused, in every mode.
  auto const linked = [](cohort::context& ctx, int step) {
    auto dir = ctx.run_path() / ("linked_" + std::to_string(step));
    if (ctx.world_rank() == 0) {
      std::filesystem::create_directories(dir);
      std::error_code ec;
      std::filesystem::create_symlink("/etc/passwd", dir / "passwd", ec);
    }
    return dir;
  };
  for (auto mode : {cohort::checkpoint_mode::no_upload, cohort::checkpoint_mode::sync}) {
    auto bad = quiet(storage, mode == cohort::checkpoint_mode::sync ? "link_sync" : "link_no_upload");
    bad.checkpoint_mode = mode;
    auto l = cohort::trainer{directory_steps(linked)}.fit(nlohmann::json::object(), bad);
    REQUIRE_FALSE(l.ok());
    CHECK_THAT(*l.error, contains_text("passwd: a symbolic link in the checkpoint directory"));
    CHECK_FALSE(l.checkpoint);
  }
}

TEST_CASE("in no_upload mode a directory checkpoint that is not committed is moved back, not lost", "[trainer][mpi][checkpointing][bad-input]") {
  // Catches: the only copy of a user's checkpoint left in .staging (deleted by the next attempt)
  // when another rank's write fails after rank 0 moved the directory in.
  if (cohort_test::world_size() < 2) {
    SUCCEED("one rank: no second rank whose write can fail (the case runs at 2-4 ranks)");
    return;
  }
  auto const storage = cohort_test::scratch("no_upload_undo");
  auto run = quiet(storage);
  run.checkpoint_mode = cohort::checkpoint_mode::no_upload;
  auto r = cohort::trainer{[](cohort::context& ctx) {
    auto const dir = ctx.run_path() / "mine";
    if (ctx.world_rank() == 0) {
      std::filesystem::create_directories(dir);
      std::ofstream(dir / "weights.bin") << "precious";
      ctx.report({{"step", 1}}, cohort::checkpoint::from_directory(dir));
    } else {
      ctx.report({{"step", 1}}, cohort::checkpoint_payload{[](std::filesystem::path const&, int) {
        throw std::runtime_error("no space left on this rank's disk");
      }});
    }
  }}.fit(nlohmann::json::object(), run);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("no space left on this rank's disk"));
  CHECK_FALSE(r.checkpoint);
  if (cohort_test::world_rank() == 0) {
    std::string got;
    std::ifstream(storage / "run" / "mine" / "weights.bin") >> got;
    CHECK(got == "precious");  // moved back where it was written
    CHECK_FALSE(std::filesystem::exists(storage / "run" / "mine" / "manifest.json"));
    CHECK_FALSE(std::filesystem::exists(storage / "run" / "checkpoint_000001"));
  }
}

TEST_CASE("a directory checkpoint that reads other than it is, or is the run's own, is refused", "[checkpointing][pure][bad-input]") {
  // Catches: a '..' after a link, which the kernel resolves elsewhere than the path reads; a
  // directory holding the run (copied into itself); a committed checkpoint passed again (its
  // manifest.json would be listed and then overwritten: a checkpoint that never verifies).
  using cohort::checkpointing::directory_checkpoint_problem;
  auto const root = cohort_test::scratch("dir_checkpoint_problem") / ("rank_" + std::to_string(cohort_test::world_rank()));
  auto const run = root / "run";
  std::filesystem::create_directories(run / "ok" / "sub");
  std::filesystem::create_directories(run / "checkpoint_000001");
  std::filesystem::create_directories(root / "elsewhere" / "mine");
  std::filesystem::create_directory_symlink(root / "elsewhere", run / "link");
  std::ofstream(run / "checkpoint_000001" / "manifest.json") << "{}";
  std::ofstream(run / "ok" / "sub" / "w.bin") << "w";
  for (bool in_place : {false, true}) {
    CHECK_FALSE(directory_checkpoint_problem(run / "ok", run, in_place));
    CHECK_FALSE(directory_checkpoint_problem(run / "ok" / "", run, in_place));
    CHECK_THAT(*directory_checkpoint_problem(run / "link" / ".." / "ok", run, in_place), contains_text("has a '..' component"));
    CHECK_THAT(*directory_checkpoint_problem(run, run, in_place), contains_text("holds the run directory"));
    CHECK_THAT(*directory_checkpoint_problem(root, run, in_place), contains_text("holds the run directory"));
    CHECK_THAT(*directory_checkpoint_problem(run / "checkpoint_000001", run, in_place), contains_text("inside the run's own checkpoint_000001"));
    CHECK_THAT(*directory_checkpoint_problem(run / "missing", run, in_place), contains_text("does not exist"));
    CHECK_THAT(*directory_checkpoint_problem(run / "ok" / "sub" / "w.bin", run, in_place), contains_text("is not a directory"));
    CHECK_THAT(*directory_checkpoint_problem(run / "link", run, in_place), contains_text("is a symbolic link"));
  }
  CHECK_THAT(*directory_checkpoint_problem(run / "link" / "mine", run, true), contains_text("is reached through the symbolic link"));
  CHECK_FALSE(directory_checkpoint_problem(root / "elsewhere" / "mine", run, false));  // sync: anywhere
  std::ofstream(run / "ok" / "manifest.json") << "{}";
  CHECK_THAT(*directory_checkpoint_problem(run / "ok", run, false), contains_text("has a manifest.json at its top"));
}

TEST_CASE("a trainer's callbacks: the run's start or restore, each row, each checkpoint, its end, on rank 0", "[trainer][mpi]") {
  // Catches: callbacks called on every rank, checkpoints not told, a resumed run told as new,
  // a failed run told as complete.
  auto storage = cohort_test::scratch("fit_callbacks");
  cohort_test::event_log events;
  auto fn = [](cohort::context& ctx, nlohmann::json const& cfg) {
    int const start = static_cast<int>(ctx.checkpoint() ? ctx.checkpoint()->metadata().at("training_iteration").get<std::int64_t>() : 0);
    for (int i = start + 1; i <= 3; ++i) {
      if (i == 2) ctx.report({{"i", i}}, cohort::checkpoint_payload{[](std::filesystem::path const& dir, int) { std::ofstream(dir / "x"); }});
      else ctx.report({{"i", i}});
      if (cfg.value("fail_at", 0) == i) throw std::runtime_error("failed at " + std::to_string(i));
    }
  };
  cohort::trainer t{fn, events};
  auto run = cohort::run_config{.name = "run", .storage_path = storage.string(), .verbose = 0};
  auto first = t.fit(nlohmann::json{{"fail_at", 3}}, run);
  CHECK(!first.ok());
  auto second = t.fit(nlohmann::json{{"fail_at", 0}}, run);  // resumes from checkpoint 2
  REQUIRE(second.ok());
  if (cohort_test::world_rank() != 0) {
    CHECK(events.log->empty());
    return;
  }
  std::vector<std::string> expected = {"start run",    "trial run {\"fail_at\":3}", "result run 1", "result run 2",
                                       "checkpoint run checkpoint_000002", "result run 3"};
  auto const& log = *events.log;
  REQUIRE(log.size() == expected.size() + 2 + 5);
  CHECK(std::vector<std::string>(log.begin(), log.begin() + 6) == expected);
  CHECK_THAT(log[6], contains_text("error run: "));  // and why
  CHECK_THAT(log[6], contains_text("failed at 3"));
  CHECK(log[7] == "end run");
  CHECK(std::vector<std::string>(log.begin() + 8, log.end()) ==
        std::vector<std::string>{"start run", "restore run checkpoint_000002", "result run 3", "complete run", "end run"});
}
