// Validation on ranks of its own (run_config::validators): the last ranks validate every
// committed checkpoint together while the others train. Run at 1-4 ranks: 2 ranks train 1 and
// validate on 1, 3 ranks train on 2 and validate on 1, 4 ranks train on 2 and validate on 2.
#include <cohort/trainer.hpp>

#include <fstream>
#include <stdexcept>
#include <string>

#include "../catch.hpp"
#include "../support.hpp"

namespace {

cohort::run_config quiet_run(std::filesystem::path const& storage, std::string name) {
  return {.name = std::move(name), .storage_path = storage.string(), .verbose = 0, .abort_timeout_ms = 30'000};
}

/// A replicated checkpoint holding `value` in the file "value".
cohort::checkpoint_payload value_checkpoint(int value) {
  return {[value](std::filesystem::path const& dir, int) { std::ofstream(dir / "value") << value; }};
}

int value_of(cohort::checkpoint const& c) {
  int v = -1;
  std::ifstream(c.path() / "value") >> v;
  return v;
}

/// How many validators a world of `n` ranks gets in these tests.
int validators_for(int n) { return n >= 4 ? 2 : 1; }

}  // namespace

TEST_CASE("validator ranks validate every committed checkpoint together while the others train", "[trainer][mpi][checkpointing][validation]") {
  // Catches: validators that train (or count in the trainers' world), a checkpoint validated by
  // one validator only or not at all (the all-reduce over the validators would differ or hang),
  // validator metrics not merged into the retained checkpoints or not ranking them, a report's own
  // validate_fn dropped beside the validators', and validator ranks returning another result.
  int const world = cohort_test::world_size();
  if (world < 2) {
    SUCCEED("one rank: nothing left to train beside a validator (the error is tested below)");
    return;
  }
  auto const mode = GENERATE(cohort::checkpoint_mode::sync, cohort::checkpoint_mode::async);
  int const validators = validators_for(world), trainers = world - validators;
  auto const storage = cohort_test::scratch("validators");
  auto run = quiet_run(storage, mode == cohort::checkpoint_mode::sync ? "sync" : "async");
  run.checkpoint_mode = mode;
  run.validators = {.ranks = validators, .validate = [](cohort::checkpoint const& c, cohort::validator_context& ctx) {
                      // Each validator scores its share; one all-reduce over the validators.
                      std::int64_t score = static_cast<std::int64_t>(value_of(c)) * (ctx.world_rank() + 1);
                      ctx.comm().allreduce(&score, 1, cohort::comm::reduce_op::sum);
                      return nlohmann::json{{"val_score", score},
                                            {"validators", ctx.world_size()},
                                            {"validated_on", cohort_test::world_rank()}};
                    }};
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             for (int i = 1; i <= 4; ++i) {
                               auto own = [](cohort::checkpoint const& c) { return nlohmann::json{{"own", value_of(c)}}; };
                               ctx.report({{"loss", 1.0 / i}}, value_checkpoint(i), own);
                             }
                             return ctx.world_size();
                           },
                           cohort::checkpointing::keep_best{.num_to_keep = 2, .metric = "val_score", .order = cohort::order::max}}
               .fit(nlohmann::json::object(), run);
  REQUIRE(r.ok());
  REQUIRE(r.metrics_history.size() == 4);
  CHECK(r.metrics["training_iteration"] == 4);
  bool const validating = cohort_test::world_rank() >= trainers;
  CHECK(r.return_values.size() == (validating ? 0u : static_cast<std::size_t>(trainers)));
  for (auto const& v : r.return_values) CHECK(v == trainers);  // the functor saw the trainers only
  // keep_best by the validators' metric: checkpoints 4 and 3, best first.
  REQUIRE(r.best_checkpoints.size() == 2);
  int const sum_of_ranks = validators * (validators + 1) / 2;
  for (int k = 0; k < 2; ++k) {
    auto const& m = r.best_checkpoints[static_cast<std::size_t>(k)].metrics;
    int const iteration = 4 - k;
    CHECK(m["training_iteration"] == iteration);
    CHECK(m["val_score"] == iteration * sum_of_ranks);
    CHECK(m["validators"] == validators);
    CHECK(m["validated_on"] == trainers);  // the first validator answers
    CHECK(m["own"] == iteration);          // the report's own validate_fn, merged too
  }
  REQUIRE(r.checkpoint);
  CHECK(r.checkpoint->metrics["val_score"] == 4 * sum_of_ranks);
  if (cohort_test::world_rank() == 0) {
    std::ifstream in(r.checkpoint->path / "validation.json");
    REQUIRE(in);
    CHECK(nlohmann::json::parse(in)["val_score"] == 4 * sum_of_ranks);
  }
}

TEST_CASE("a validator that throws records validation_error for that checkpoint; the run goes on", "[trainer][mpi][checkpointing][validation]") {
  // Catches: a validator's failure failing the run or hanging the other validators and rank 0,
  // and the failure not named in the checkpoint's metrics.
  int const world = cohort_test::world_size();
  if (world < 2) {
    SUCCEED("one rank: nothing left to train beside a validator");
    return;
  }
  int const validators = validators_for(world);
  auto const storage = cohort_test::scratch("validator_throws");
  auto run = quiet_run(storage, "run");
  run.validators = {.ranks = validators, .validate = [](cohort::checkpoint const& c, cohort::validator_context& ctx) {
                      if (value_of(c) == 2 && ctx.world_rank() == ctx.world_size() - 1)
                        throw std::runtime_error("the validation set is missing");
                      return nlohmann::json{{"checked", value_of(c)}};
                    }};
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             for (int i = 1; i <= 3; ++i) ctx.report({{"step", i}}, value_checkpoint(i));
                           }}
               .fit(nlohmann::json::object(), run);
  REQUIRE(r.ok());
  REQUIRE(r.best_checkpoints.size() == 3);  // keep_all: newest first
  CHECK(r.best_checkpoints[0].metrics["checked"] == 3);
  auto const& failed = r.best_checkpoints[1].metrics;
  REQUIRE(failed.contains("validation_error"));
  CHECK_THAT(failed["validation_error"].get<std::string>(), contains_text("a validator failed") &&
                                                                contains_text("the validation set is missing"));
  CHECK_FALSE(failed.contains("checked"));
  CHECK(r.best_checkpoints[2].metrics["checked"] == 1);
}

TEST_CASE("a training failure ends the validators with the same error", "[trainer][mpi][checkpointing][validation]") {
  // Catches: validator ranks left waiting for checkpoints (a hang) when the trainers fail.
  int const world = cohort_test::world_size();
  if (world < 2) {
    SUCCEED("one rank: nothing left to train beside a validator");
    return;
  }
  auto const storage = cohort_test::scratch("validators_fail");
  auto run = quiet_run(storage, "run");
  run.validators = {.ranks = validators_for(world),
                    .validate = [](cohort::checkpoint const&, cohort::validator_context&) { return nlohmann::json::object(); }};
  auto r = cohort::trainer{[](cohort::context& ctx) {
                             ctx.report({{"step", 1}}, value_checkpoint(1));
                             if (ctx.world_rank() == 0) throw std::runtime_error("out of memory at step 2");
                             ctx.report({{"step", 2}});
                           }}
               .fit(nlohmann::json::object(), run);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(*r.error, contains_text("out of memory at step 2"));
  if (cohort_test::world_rank() == 0)  // the committed checkpoint is kept
    CHECK(std::filesystem::exists(storage / "run" / "checkpoint_000001" / "value"));
}

TEST_CASE("validator ranks that leave none to train, or come without a function, are an error on every rank", "[trainer][mpi][checkpointing][validation][bad-input]") {
  // Catches: a job of validators only (no trainer sends checkpoints: a hang), negative counts,
  // and validator ranks with nothing to run.
  int const world = cohort_test::world_size();
  auto const storage = cohort_test::scratch("validators_bad");
  auto const ok_fn = [](cohort::checkpoint const&, cohort::validator_context&) { return nlohmann::json::object(); };
  auto const fit_with = [&](cohort::validator_options v) {
    auto run = quiet_run(storage, "run");
    run.validators = std::move(v);
    return cohort::trainer{[](cohort::context& ctx) { ctx.report({{"step", 1}}); }}.fit(nlohmann::json::object(), run);
  };
  auto all = fit_with({.ranks = world, .validate = ok_fn});
  REQUIRE_FALSE(all.ok());
  CHECK_THAT(*all.error, contains_text("run_config.validators.ranks = " + std::to_string(world)) &&
                             contains_text("at least one rank must train"));
  auto negative = fit_with({.ranks = -1, .validate = ok_fn});
  REQUIRE_FALSE(negative.ok());
  CHECK_THAT(*negative.error, contains_text("run_config.validators.ranks = -1"));
  if (world >= 2) {
    auto no_fn = fit_with({.ranks = 1});
    REQUIRE_FALSE(no_fn.ok());
    CHECK_THAT(*no_fn.error, contains_text("set run_config.validators.validate"));
  }
}

TEST_CASE("validator_problem names the count and the fix", "[checkpointing][pure][validation]") {
  auto const fn = [](cohort::checkpoint const&, cohort::validator_context&) { return nlohmann::json::object(); };
  CHECK_FALSE(cohort::checkpointing::validator_problem({}, 1));
  CHECK_FALSE(cohort::checkpointing::validator_problem({.ranks = 1, .validate = fn}, 3));
  CHECK_FALSE(cohort::checkpointing::validator_problem({.ranks = 2, .validate = fn}, 3));
  CHECK(cohort::checkpointing::validator_problem({.ranks = 3, .validate = fn}, 3) ==
        "run_config.validators.ranks = 3 with 3 ranks: give between 0 and 2 (at least one rank must train), or start more ranks");
  CHECK(cohort::checkpointing::validator_problem({.ranks = 1}, 2) ==
        "run_config.validators.ranks = 1 without a validate function: set run_config.validators.validate");
  // rank 0 asks the validators from its validation thread, beside the training thread's collectives
  CHECK(cohort::checkpointing::validator_problem({.ranks = 1, .validate = fn}, 2, MPI_THREAD_SERIALIZED) ==
        "run_config.validators needs MPI initialised with MPI_THREAD_MULTIPLE: let cohort::environment initialise MPI");
  CHECK_FALSE(cohort::checkpointing::validator_problem({}, 2, MPI_THREAD_SINGLE));  // no validators: no thread
}
