#!/usr/bin/env bash
# commit_kill.sh PROGRAM SCRATCH KILLS: the commit-kill loop. Runs tests/commit_kill_program.cpp
# (one process, an MPI singleton, so that SIGKILL reaches the writer itself and not a launcher),
# waits until it trains, lets it commit for a random 0-299 ms (each commit writes 256 KiB in 4
# pieces 2 ms apart, the manifest, fsyncs, renames, and drops a checkpoint into .trash, deleted
# beside the next commit), SIGKILLs it, and notes where the kill landed from what it left: files
# in .staging without a manifest (data files), a manifest in .staging (its fsyncs and the rename),
# neither (between commits), and a non-empty .trash (retention's delete under way). Then the next run must resume from the latest checkpoint_NNNNNN
# that has a manifest (read back, every byte checked by the program), with no checkpoint skipped
# or moved aside as corrupt, and result.json must hold the row of every committed checkpoint (the
# row is appended before the commit); and so on KILLS times. ctest runs 20 kills; by hand, 200 or more:
#   tests/commit_kill.sh build-test/tests/cohort_commit_kill_program /tmp/commit_kill 200
set -u
prog=$1 scratch=$2 kills=$3
run=$scratch/run
rm -rf "$scratch" && mkdir -p "$scratch"
i=0
fail() { echo "FAIL (run $i): $*"; exit 1; }
# The latest committed checkpoint: checkpoint_NNNNNN with its manifest (written before the rename).
latest() {
  local c last=""
  for c in "$run"/checkpoint_[0-9][0-9][0-9][0-9][0-9][0-9]/manifest.json; do [ -f "$c" ] && last=$(basename "$(dirname "$c")"); done
  echo "$last"
}
declare -A landed=()
expect="fresh run"
for ((i = 1; i <= kills + 1; ++i)); do
  log=$scratch/run_$i.log
  : >"$log"
  "$prog" --storage "$scratch" --bytes 262144 >"$log" 2>&1 &
  pid=$!
  for ((w = 0; w < 6000; ++w)); do  # until it trains (at most 60 s)
    grep -qx training "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  grep -qx training "$log" || { kill -9 "$pid" 2>/dev/null; cat "$log"; fail "the run did not start training"; }
  grep -qx "$expect" "$log" || { kill -9 "$pid"; fail "expected '$expect' after the last kill; the run said: $(head -3 "$log" | tr '\n' ' ')"; }
  if grep -q "skipping checkpoint" "$log" || compgen -G "$run/*.corrupt" >/dev/null; then
    kill -9 "$pid"; fail "a committed checkpoint did not verify: $(grep "skipping" "$log")"
  fi
  if [ $i -gt "$kills" ]; then  # the last run only checks the resume
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    break
  fi
  sleep "0.$(printf '%03d' $((RANDOM % 300)))"
  kill -9 "$pid" 2>/dev/null || fail "the run ended before the kill: $(tail -3 "$log" | tr '\n' ' ')"
  wait "$pid" 2>/dev/null
  where="between commits"
  for s in "$run"/.staging/*/; do
    [ -d "$s" ] || continue
    if [ -f "$s/manifest.json" ]; then where="manifest written, before the rename"
    elif compgen -G "$s*" >/dev/null; then where="data files"
    else where="staging folder made"; fi
  done
  compgen -G "$run/.trash/*" >/dev/null && where="$where, retention's delete under way"
  landed[$where]=$((${landed[$where]:-0} + 1))
  last=$(latest)
  if [ -n "$last" ]; then  # every committed checkpoint has its row: result.json reached its step
    rows=$(grep -o '"training_iteration":[0-9]*' "$run/result.json" | cut -d: -f2 | sort -n | tail -1)
    [ "${rows:-0}" -ge $((10#${last#checkpoint_})) ] ||
      fail "$last was committed but result.json's last row is iteration ${rows:-none} (killed: $where)"
  fi
  expect=${last:+resumed from $last at step $((10#${last#checkpoint_}))}
  expect=${expect:-fresh run}
done
echo "where the $kills kills landed: $(for k in "${!landed[@]}"; do echo "$k ${landed[$k]}"; done | sort | tr '\n' ';')"
echo "ok: $kills kills mid-commit, each resumed from the latest committed checkpoint"
