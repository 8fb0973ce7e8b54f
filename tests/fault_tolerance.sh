#!/usr/bin/env bash
# fault_tolerance.sh COHORT_RUN PROGRAM SCRATCH MPIEXEC ARGS...
# 1. an uninterrupted run; 2. the same run with one rank SIGKILLed before report 3, relaunched by
# cohort-run: it must resume from checkpoint 2 (the latest committed; the run is deterministic, so
# equal final parameters alone would also pass a resume from checkpoint 1 or from scratch) and
# finish with bitwise the same parameters; 3. SIGTERM on one rank before report 3: every rank stops
# with exit code 75 after committing checkpoint 3, and the rerun resumes from checkpoint 3 and
# finishes with the same parameters; 4. a run that fails every time: cohort-run gives up after --max-failures
# restarts, with the run's exit code and the reason.
set -u
run=$1 prog=$2 scratch=$3
shift 3
mpi=("$@")
rm -rf "$scratch" && mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }

timeout 120 "${mpi[@]}" "$prog" --storage "$scratch" --name straight || fail "the uninterrupted run failed"

out=$(timeout 240 "$run" --max-failures 2 -- "${mpi[@]}" "$prog" --storage "$scratch" --name relaunched --kill-at 3 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "cohort-run|error" | head -5
[ $rc -eq 0 ] || fail "cohort-run did not complete the killed run (exit $rc)"
grep -q "cohort-run: restart 1 of 2 because a process was killed\|cohort-run: restart 1 of 2 because it exited" <<<"$out" || fail "cohort-run did not say why it restarted"
resumed=$(grep "^resumed at epoch" <<<"$out")
[ "$(grep -c . <<<"$resumed")" -eq 1 ] || fail "the relaunch resumed $(grep -c . <<<"$resumed") times, not once: $resumed"
grep -q "^resumed at epoch 2 with .*, from checkpoint_000002$" <<<"$resumed" ||
  fail "the relaunch after SIGKILL before report 3 did not resume from checkpoint 2, the latest committed: ${resumed:-no resume line}"
cmp -s "$scratch/straight.params.json" "$scratch/relaunched.params.json" || fail "the relaunched run's parameters differ"

out=$(timeout 120 "${mpi[@]}" "$prog" --storage "$scratch" --name preempted --term-at 3 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "error" | head -5
[ $rc -eq 75 ] || fail "SIGTERM: exit $rc, where 75 (EX_TEMPFAIL: preempted, rerun to resume) is promised"
n=$(grep -c "error: stopped by SIGTERM after report 3" <<<"$out")
[ "$n" -ge 1 ] || fail "no rank said it stopped on SIGTERM after report 3"
[ -d "$scratch/preempted/checkpoint_000003" ] || fail "checkpoint 3 was not committed before stopping"
[ ! -d "$scratch/preempted/checkpoint_000004" ] || fail "the run went on past the stop"
out=$(timeout 120 "${mpi[@]}" "$prog" --storage "$scratch" --name preempted 2>&1) || { echo "$out" | tail -20; fail "the rerun after SIGTERM failed"; }
grep -q "^resumed at epoch 3 with .*, from checkpoint_000003$" <<<"$out" ||
  fail "the rerun after SIGTERM did not resume from checkpoint 3: $(grep "^resumed" <<<"$out" || echo no resume line)"
cmp -s "$scratch/straight.params.json" "$scratch/preempted.params.json" || fail "the resumed run's parameters differ"

# More workers asked for than started: every attempt fails (exit 1) the same way.
out=$(timeout 120 "$run" --max-failures 2 -- "${mpi[@]}" "$prog" --storage "$scratch" --name never --min-workers 99 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "cohort-run gave up with exit $rc, not the run's 1"
[ "$(grep -c "cohort-run: restart [12] of 2 because it exited with code 1" <<<"$out")" -eq 2 ] || fail "cohort-run did not restart twice"
grep -q "cohort-run: giving up after 2 restart(s): it exited with code 1" <<<"$out" || fail "cohort-run did not say it gave up"
echo "ok: relaunch after SIGKILL and resume after SIGTERM both equal the uninterrupted run; cohort-run gives up after 2 restarts"
