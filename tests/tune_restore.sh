#!/usr/bin/env bash
# tune_restore.sh PROGRAM SCRATCH MPIEXEC ARGS...: a tuning run killed by SIGKILL mid-experiment,
# then rerun with the same name: it finishes every trial exactly once, exits 0 on every rank, and
# each trial interrupted with a checkpoint resumes from its own latest committed one, loaded once
# (finished trials and trials without one load none); the same after SIGTERM, which must stop the
# run with exit code 75 (tune_restore_program.cpp).
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
  # Each trial's latest committed checkpoint (a checkpoint_* folder with its manifest) when it stopped.
  declare -A latest=()
  for t in "$dir"/restore/trial_*/; do
    t=${t%/}
    for c in "$t"/checkpoint_*/manifest.json; do [ -f "$c" ] && latest[$t]=$(basename "$(dirname "$c")"); done
  done
  [ ${#latest[@]} -gt 0 ] || { echo "FAIL ($how): no trial had committed a checkpoint when the first run stopped"; exit 1; }
  out=$(timeout 120 "$@" "$prog" "$dir" 2>&1)
  rc=$?
  printf '%s\n' "$out" | grep -v "^$" | tail -3
  [ $rc -eq 0 ] || { echo "FAIL ($how): the rerun exited $rc (a rank failed)"; printf '%s\n' "$out" | tail -20; exit 1; }
  grep -q "tune restore ok" <<<"$out" || { echo "FAIL ($how): the rerun did not finish every trial exactly once"; exit 1; }
  for t in "$dir"/restore/trial_*; do
    lr=$(tr -d " \n" <"$t/params.json" | sed -E 's/.*"lr":([-+.e0-9]+).*/\1/')
    loaded=$(cat "$t/loaded_checkpoints.txt" 2>/dev/null || true)
    want=${latest[$t]:-}
    if [ -z "$want" ] || [ "$want" = checkpoint_000006 ]; then
      # No checkpoint (started from scratch) or the last one (finished before the stop): nothing to load.
      [ -z "$loaded" ] || [ "$loaded" = "$lr $want" ] || { echo "FAIL ($how): $(basename "$t") loaded '$loaded', where it had ${want:-no checkpoint}"; exit 1; }
    else
      [ "$loaded" = "$lr $want" ] ||
        { echo "FAIL ($how): $(basename "$t") (lr $lr) resumed from '${loaded:-nothing}', not from its latest checkpoint, $want, once"; exit 1; }
    fi
  done
  echo "$how: $(for t in "${!latest[@]}"; do echo "$(basename "$t"):${latest[$t]#checkpoint_}"; done | sort | tr '\n' ' ')resumed as committed"
done
echo "tune restore ok after SIGKILL and after SIGTERM"
