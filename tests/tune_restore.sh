#!/usr/bin/env bash
# tune_restore.sh PROGRAM SCRATCH MPIEXEC ARGS...: a tuning run killed by SIGKILL mid-experiment,
# then rerun with the same name: it finishes every trial exactly once; the same after SIGTERM,
# which must stop the run with exit code 75 (tune_restore_program.cpp).
set -u
prog=$1 scratch=$2
shift 2
for how in kill term; do
  dir=$scratch/$how
  rm -rf "$dir" && mkdir -p "$dir"
  timeout 120 "$@" "$prog" "$dir" --$how-once >"$dir/first.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] || { echo "FAIL ($how): the first run was not stopped"; exit 1; }
  [ -f "$dir/hurt.marker" ] || { echo "FAIL ($how): the first run did not reach the signal"; exit 1; }
  [ -f "$dir/restore/experiment_state.json" ] || { echo "FAIL ($how): no experiment state was written"; exit 1; }
  if [ $how = term ]; then
    [ $rc -eq 75 ] || { echo "FAIL (term): exit code $rc, expected 75"; cat "$dir/first.log"; exit 1; }
    grep -q "stopped by SIGTERM" "$dir/first.log" || { echo "FAIL (term): no rank said it stopped on SIGTERM"; exit 1; }
  fi
  out=$(timeout 120 "$@" "$prog" "$dir" 2>&1)
  printf '%s\n' "$out" | grep -v "^$" | tail -3
  grep -q "tune restore ok" <<<"$out" || { echo "FAIL ($how): the rerun did not finish every trial exactly once"; exit 1; }
done
echo "tune restore ok after SIGKILL and after SIGTERM"
