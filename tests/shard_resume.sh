#!/usr/bin/env bash
# shard_resume.sh COHORT_RUN PROGRAM SCRATCH MPIEXEC ARGS...
# Training from WebDataset tar shards (fault_program --shards: sharding::shards with a shuffle
# buffer, 2 decode threads), checkpointed after batch 2 of every epoch. One rank SIGKILLed before
# report 3 and the job relaunched by cohort-run resumes mid-epoch from checkpoint 2 and must end
# with bitwise the parameters of the uninterrupted run: the loader's position restored the shard
# order, the place in each shard and the shuffle buffer's contents (a resume that restarted the
# epoch, or read any sample out of turn, trains on other batches and ends elsewhere).
set -u
run=$1 prog=$2 scratch=$3
shift 3
mpi=("$@")
rm -rf "$scratch" && mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
common=(--storage "$scratch" --shards "$scratch/shards" --report-at-batch 2 --epochs 4)

timeout 120 "${mpi[@]}" "$prog" "${common[@]}" --name straight || fail "the uninterrupted run failed"
out=$(timeout 240 "$run" --max-failures 2 -- "${mpi[@]}" "$prog" "${common[@]}" --name relaunched --kill-at 3 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "cohort-run|error|resumed" | head -5
[ $rc -eq 0 ] || fail "cohort-run did not complete the killed run (exit $rc)"
grep -qE "resumed at epoch 1 with [0-9]+ ranks \(saved with [0-9]+\), [1-9][0-9]* samples of the epoch seen" <<<"$out" ||
  fail "the relaunched run did not resume mid-epoch from checkpoint 2"
cmp -s "$scratch/straight.params.json" "$scratch/relaunched.params.json" || fail "the relaunched run's parameters differ"
echo "ok: training from shards relaunched after SIGKILL mid-epoch equals the uninterrupted run bitwise"
