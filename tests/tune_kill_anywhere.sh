#!/usr/bin/env bash
# tune_kill_anywhere.sh PROGRAM SCRATCH COHORT_RUN MPIEXEC ARGS...: a 12-trial sweep
# (tune_restore_program --sweep) run once uninterrupted, then three times under cohort-run with
# one rank SIGKILLed at a time set by the seed (ranks 0, 1, 2; 0.2, 0.5, 0.8 s after the first
# result). Each relaunch must finish the experiment with the same trials.csv as the uninterrupted
# run (times and paths aside), and no trial may go back further than its latest checkpoint:
# its result.json holds iteration 1 once, and after each break it goes on from the iteration
# it had reached or the one after (a checkpoint is committed with every report).
set -u
prog=$1 scratch=$2 cohort_run=$3
shift 3
rm -rf "$scratch" && mkdir -p "$scratch"

# trials.csv without the columns that differ between runs (times, the trial directories).
stable_csv() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) keep[i] = $i !~ /^(time_this_iter_s|time_total_s|timestamp|logdir)$/ }
           { line = ""; for (i = 1; i <= NF; ++i) if (keep[i]) line = line (line == "" ? "" : ",") $i; print line }' "$1"
}

timeout 120 "$@" "$prog" "$scratch/ref" --sweep >"$scratch/ref.log" 2>&1 || { echo "FAIL: the uninterrupted sweep failed"; tail -20 "$scratch/ref.log"; exit 1; }
grep -q "tune sweep ok" "$scratch/ref.log" || { echo "FAIL: the uninterrupted sweep did not finish"; exit 1; }
stable_csv "$scratch/ref/sweep/trials.csv" >"$scratch/ref.csv"

for seed in 1 2 3; do
  dir=$scratch/seed$seed rank=$((seed - 1)) delay=$(awk -v s=$seed 'BEGIN { print 0.2 + 0.3 * (s - 1) }')
  mkdir -p "$dir"
  timeout 300 "$cohort_run" --max-failures 3 -- "$@" "$prog" "$dir" --sweep >"$dir/run.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do  # the first result (at most 60 s)
    ls "$dir"/sweep/trial_*/result.json >/dev/null 2>&1 && [ -s "$dir/pids/rank_$rank" ] && break
    sleep 0.1
  done
  sleep "$delay"
  kill -9 "$(cat "$dir/pids/rank_$rank")" 2>/dev/null || { echo "FAIL (seed $seed): rank $rank had already ended: lengthen the sweep"; wait $job; exit 1; }
  wait $job
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL (seed $seed): cohort-run exited $rc"; tail -20 "$dir/run.log"; exit 1; }
  grep -q "cohort-run: restart 1 of 3" "$dir/run.log" || { echo "FAIL (seed $seed): the killed job was not relaunched"; tail -20 "$dir/run.log"; exit 1; }
  grep -q "tune sweep ok" "$dir/run.log" || { echo "FAIL (seed $seed): the relaunched sweep did not finish every trial"; tail -20 "$dir/run.log"; exit 1; }
  stable_csv "$dir/sweep/trials.csv" | diff "$scratch/ref.csv" - >"$dir/csv.diff" ||
    { echo "FAIL (seed $seed): trials.csv differs from the uninterrupted run's"; cat "$dir/csv.diff"; exit 1; }
  resumed=0
  for t in "$dir"/sweep/trial_*/result.json; do
    seq=$(sed -E 's/.*"training_iteration":([0-9]+).*/\1/' "$t" | tr '\n' ' ')
    awk -v seq="$seq" 'BEGIN { n = split(seq, it, " "); if (it[1] != 1 || it[n] != 6) exit 1
                               for (i = 2; i <= n; ++i) if (it[i] != it[i-1] + 1 && it[i] != it[i-1]) exit 1 }' ||
      { echo "FAIL (seed $seed): $(basename "$(dirname "$t")") went back further than its latest checkpoint: iterations $seq"; exit 1; }
    [ "$(wc -l <"$t")" -gt 6 ] && resumed=$((resumed + 1))
  done
  echo "seed $seed: rank $rank killed ${delay}s after the first result; relaunched, trials.csv as uninterrupted; $resumed trial(s) redid their last iteration"
done
echo "tune sweep ok after a rank killed at three moments"
