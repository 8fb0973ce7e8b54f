#!/usr/bin/env bash
# misuse.sh CASE PROGRAM COHORT_RUN SCRATCH MPIEXEC ARGS...: one case of the misuse catalogue
# (tests/misuse_program.cpp), normally at 3 ranks. A first run commits checkpoints 1 and 2; the
# second resumes, and in its first epoch the last rank misbehaves (rank 0, which owns the run
# directory and writes the checkpoints, for the cases named *_by_rank0). Checked: the exit status, the
# error line on every rank that must print one, the time from the misbehaviour to the end of the
# job (a bound far below ctest's timeout: no hang), and that the checkpoints committed before are
# byte for byte what they were and every committed checkpoint verifies.
set -u
what=$1 prog=$2 run=$3 scratch=$4
shift 4
mpi=("$@")
dir=$scratch/$what
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL ($what): $*"; exit 1; }

# What each case must do: the exit (ok / fail), the lines its output must have, and the bound in
# seconds from the misbehaviour to the end of the job. Cases without --timeout-ms run with the
# default deadline (10 minutes): what they find, the ranks' agreement finds within a step (the
# issue's bound is 60 s; 20 s leaves a loaded machine room and still fails a deadline or a hang).
args=() expect=ok bound=20 patterns=()
base=${what%_by_rank0} bad=2  # the rank that misbehaves, and the others
[ "$base" != "$what" ] && bad=0
others=$( [ $bad = 0 ] && echo "1 2" || echo "0 1")
diverged() { patterns=("rank 0: error: the ranks' control flow diverged: .*$1" "rank 1: error: the ranks' control flow diverged"
                       "rank 2: error: the ranks' control flow diverged"); }
case $base in
  extra_report|extra_report_async) expect=fail; diverged "rank 2 is at report 4" ;;
  early_return) expect=fail; diverged "rank $bad is at the end of the functor" ;;
  extra_backward) expect=fail; diverged "rank 2 is at backward" ;;
  missing_prepare_model) expect=fail; diverged "ranks 0, 1 are at prepare_model 1.*rank 2 is at report 3" ;;
  no_sync_on_one_rank) expect=fail; diverged "rank 2 is at" ;;
  throws|throws_async) expect=fail  # _async: thrown right after report 3, its checkpoint being written
    patterns=("rank 0: error: rank $bad: boom on rank $bad" "rank 1: error: rank $bad: boom on rank $bad"
              "rank 2: error: rank $bad: boom on rank $bad") ;;
  bad_metrics) expect=fail; patterns=("rank [01]: error: rank 2: report\(\) takes a JSON object of metrics"
                                      "rank 2: error: rank 2: report\(\) takes a JSON object of metrics") ;;
  layout_mismatch) expect=fail; patterns=("rank 0: error: model layout differs between ranks: .* on rank 2: every rank must construct the same model"
                                          "rank 1: error: model layout differs" "rank 2: error: model layout differs") ;;
  per_rank_checkpoint_missing) expect=fail
    patterns=("rank 0: error: report 3 passes per-rank checkpoint state .* on ranks 0, 1 but none on rank 2"
              "rank 1: error: report 3 passes per-rank" "rank 2: error: report 3 passes per-rank") ;;
  checkpoint_not_on_rank0) expect=fail
    patterns=("rank 0: error: report 3 passes a checkpoint on rank 2 but not on rank 0" "rank 1: error: report 3 passes"
              "rank 2: error: report 3 passes") ;;
  extra_collective) expect=fail bound=8 args=(--timeout-ms 3000)
    # The odd rank waits in its extra barrier while the others wait in the report's all-reduce;
    # the three deadlines run out within a few ms of each other, so whichever rank notices first
    # ends the job. Either way every rank names where it waits, and one names the deadline.
    patterns=("rank [012]: error: (barrier|iallreduce) #[0-9]+ on '(work|lockstep)' \([0-9]+ bytes\) did not complete within 3000 ms"
              "rank $bad: error: .*barrier #[0-9]+ on 'work' \(0 bytes\).* \(this rank is at 2 reports, [0-9]+ backward passes, 1 prepare_model begun\)")
    for r in $others; do patterns+=("rank $r: error: .*(on 'lockstep'|rank [012] is ending the job)"); done ;;
  sigstop) expect=fail bound=8 args=(--timeout-ms 3000)
    patterns=("rank [01]: error: iallreduce #[0-9]+ on 'lockstep' \(72 bytes\) did not complete within 3000 ms \(this rank is at 3 reports, [0-9]+ backward passes, 1 prepare_model begun\)"
              "rank 0: error: " "rank 1: error: ") ;;
  sigkill) expect=relaunch bound=10 ;;
  rank0_checkpoint|rank0_checkpoint_async|zero_size_batch) expect=ok ;;
  *) fail "unknown case" ;;
esac

first=none
[[ $what == rank0_checkpoint* ]] && first=$what  # the idiom commits the checkpoints the resume reads
suffix=""
[[ $base == *_async ]] && suffix=_async
timeout 120 "${mpi[@]}" "$prog" --storage "$dir" --name run --case "$first$([ $first = none ] && echo "$suffix")" --epochs 2 \
  >"$dir/first.log" 2>&1 || { cat "$dir/first.log"; fail "the first run (2 epochs) failed"; }
for c in 1 2; do [ -f "$dir/run/checkpoint_00000$c/manifest.json" ] || fail "the first run did not commit checkpoint $c"; done
before=$(cd "$dir/run" && find checkpoint_000001 checkpoint_000002 -type f | sort | xargs sha256sum)

if [ $expect = relaunch ]; then
  out=$(timeout 150 "$run" --max-failures 1 -- "${mpi[@]}" "$prog" --storage "$dir" --name run --case "$what" "${args[@]}" 2>&1)
else
  out=$(timeout 150 "${mpi[@]}" "$prog" --storage "$dir" --name run --case "$what" "${args[@]}" 2>&1)
fi
rc=$?
end=$(date +%s%3N)
printf '%s\n' "$out" | grep -E "error|cohort-run|resumed|mpirun" | head -12
[ $rc -eq 124 ] && fail "timed out: a hang"
case $expect in
  ok|relaunch) [ $rc -eq 0 ] || fail "exit $rc, expected 0" ;;
  fail) [ $rc -ne 0 ] || fail "exit 0, expected a failure" ;;
esac
for p in "${patterns[@]}"; do grep -qE -- "$p" <<<"$out" || fail "the output does not match: $p"; done
if [ $expect != ok ]; then
  [ -f "$dir/run.t0" ] || fail "the last rank did not reach its misbehaviour"
  ms=$((end - $(cat "$dir/run.t0")))
  echo "the job ended $ms ms after the misbehaviour (bound ${bound} s)"
  [ $ms -le $((bound * 1000)) ] || fail "took $ms ms, more than $bound s"
fi
if [ $expect = relaunch ]; then
  grep -qE "rank [$others]: error: SIGTERM received while waiting in .* on 'lockstep'.*a rank died" <<<"$out" ||
    grep -qE "mpirun noticed that process rank $bad .* exited on signal 9" <<<"$out" || fail "no error line for the killed rank"
  grep -q "cohort-run: restart 1 of 1 because" <<<"$out" || fail "cohort-run did not relaunch"
  [ "$(grep -c "resumed from checkpoint_000002" <<<"$out")" -eq 2 ] || fail "the relaunched run did not resume from checkpoint 2"
fi
if [ $expect != fail ]; then
  [ -f "$dir/run/checkpoint_000004/manifest.json" ] || fail "the run did not commit checkpoint 4"
  grep -q "resumed from checkpoint_000002" <<<"$out" || fail "the second run did not resume from checkpoint 2"
fi
after=$(cd "$dir/run" && find checkpoint_000001 checkpoint_000002 -type f | sort | xargs sha256sum)
[ "$before" = "$after" ] || fail "checkpoints 1 and 2 changed"
for c in "$dir"/run/checkpoint_*; do
  "${mpi[@]:0:2}" 1 "$prog" --verify "$c" >/dev/null 2>&1 || fail "$(basename "$c") does not verify"
done
echo "ok: $what (exit $rc)"
