#include <cohort/comm/any.hpp>
#include <cohort/comm/deadline.hpp>
#include <cohort/comm/mpi.hpp>
#include <cohort/detail/lockstep.hpp>

#include <string>
#include <vector>

#include "../catch.hpp"

using cohort::detail::checkpoint_kind;
using cohort::detail::fingerprint;
using cohort::detail::step;

TEST_CASE("ranks at the same step do not diverge", "[lockstep]") {
  std::vector<fingerprint> all(3, fingerprint{step::backward, 7, 1, 6, 2});
  all[1].checkpoint = checkpoint_kind::replicated;  // not part of the control flow
  CHECK_FALSE(cohort::detail::find_divergence(all));
}

TEST_CASE("a rank one report ahead is named with what each rank was doing", "[lockstep]") {
  std::vector<fingerprint> all{{step::backward, 41, 1, 40, 3}, {step::backward, 41, 1, 40, 3}, {step::report, 4, 1, 40, 3}};
  auto d = cohort::detail::find_divergence(all);
  REQUIRE(d);
  CHECK_FALSE(d->peer_failed);
  CHECK(d->message ==
        "the ranks' control flow diverged: ranks 0, 1 are at backward 41 (after 3 reports, 40 backward passes, 1 "
        "prepare_model); rank 2 is at report 4 (after 3 reports, 40 backward passes, 1 prepare_model): every rank must "
        "call prepare_model(), run synchronised backward passes and call report() the same number of times, in the "
        "same order (look for an extra or missing call, or an early return, on one rank)");
}

TEST_CASE("the same step with different counts diverges too", "[lockstep]") {
  std::vector<fingerprint> all{{step::report, 3, 1, 9, 2}, {step::report, 4, 1, 9, 3}};
  auto d = cohort::detail::find_divergence(all);
  REQUIRE(d);
  CHECK(d->message.find("rank 0 is at report 3") != std::string::npos);
  CHECK(d->message.find("rank 1 is at report 4") != std::string::npos);
}

TEST_CASE("a failed rank makes the divergence the other ranks' stop, not their error", "[lockstep]") {
  std::vector<fingerprint> all{{step::report, 2, 1, 9, 1}, {step::failed, 1, 1, 8, 1}, {step::end, 1, 1, 9, 2}};
  auto d = cohort::detail::find_divergence(all);
  REQUIRE(d);
  CHECK(d->peer_failed);
  CHECK(d->message.rfind("stopped because rank 1 failed: rank 0 is at report 2", 0) == 0);
  CHECK(d->message.find("rank 2 is at the end of the functor") != std::string::npos);
}

TEST_CASE("a replicated checkpoint on rank 0 only is Ray's idiom, not a gap", "[lockstep]") {
  std::vector<fingerprint> all(3, fingerprint{step::report, 5});
  all[0].checkpoint = checkpoint_kind::replicated;
  CHECK_FALSE(cohort::detail::checkpoint_gap(all, 5));
  all[0].checkpoint = checkpoint_kind::none;
  all[2].checkpoint = checkpoint_kind::replicated;
  auto gap = cohort::detail::checkpoint_gap(all, 5);
  REQUIRE(gap);
  CHECK(gap->rfind("report 5 passes a checkpoint on rank 2 but not on rank 0", 0) == 0);
}

TEST_CASE("per-rank checkpoint state missing on some ranks names them", "[lockstep]") {
  std::vector<fingerprint> all(4, fingerprint{step::report, 2});
  all[0].checkpoint = all[2].checkpoint = checkpoint_kind::per_rank;
  auto gap = cohort::detail::checkpoint_gap(all, 2);
  REQUIRE(gap);
  CHECK(gap->rfind("report 2 passes per-rank checkpoint state (checkpoint_payload::scope = per_rank) on ranks 0, 2 but "
                   "none on ranks 1, 3",
                   0) == 0);
  for (auto& f : all) f.checkpoint = checkpoint_kind::per_rank;
  CHECK_FALSE(cohort::detail::checkpoint_gap(all, 2));
}

TEST_CASE("a collective past its deadline is named with its kind, number, bytes and the rank's position", "[comm][deadline]") {
  cohort::comm::collective c{"allreduce", "work", 12, 4096};
  CHECK(cohort::comm::describe(c) == "allreduce #12 on 'work' (4096 bytes)");
  auto line = cohort::comm::timeout_message(2, c, 3000, "3 reports, 41 backward passes, 1 prepare_model begun");
  CHECK(line.rfind("[cohort] rank 2: error: allreduce #12 on 'work' (4096 bytes) did not complete within 3000 ms (this "
                   "rank is at 3 reports, 41 backward passes, 1 prepare_model begun): ",
                   0) == 0);
  CHECK(line.find("raise run_config.collective_timeout_ms") != std::string::npos);
  CHECK(line.find('\n') == std::string::npos);
}

TEST_CASE("every rank learns the same agreement, and the same divergence", "[lockstep][mpi]") {
  auto world = cohort::comm::mpi::world();
  int const r = world.rank(), n = world.size();
  cohort::detail::lockstep steps(cohort::comm::any(world.split(0, r)));
  steps.agree(step::prepare_model);
  steps.start(step::backward);
  CHECK(steps.pending() == (n > 1));
  steps.finish();
  // Ray's idiom: the checkpoint on rank 0 only; a stop signal on the last rank reaches every rank.
  auto a = steps.agree_report(r == 0 ? checkpoint_kind::replicated : checkpoint_kind::none, r == n - 1 ? 15 : 0, 1);
  CHECK(a.any_checkpoint);
  CHECK(a.signal == 15);
  if (n > 1) {
    // Per-rank state missing on the last rank: the same error on every rank.
    std::string err;
    try {
      steps.agree_report(r == n - 1 ? checkpoint_kind::none : checkpoint_kind::per_rank, 0, 2);
    } catch (cohort::error const& e) {
      err = e.what();
    }
    CHECK(err.find("but none on rank " + std::to_string(n - 1)) != std::string::npos);
    // The last rank one backward pass ahead: every rank throws the same diverged.
    std::string message;
    try {
      if (r == n - 1) steps.agree(step::backward);
      else steps.agree(step::end);
    } catch (cohort::detail::diverged const& d) {
      message = d.what();
    }
    CHECK(steps.broken());
    CHECK(message.find("rank " + std::to_string(n - 1) + " is at backward 2") != std::string::npos);
    auto all = cohort::comm::allgather_strings(world, message);
    for (auto const& m : all) CHECK(m == message);
  }
}
