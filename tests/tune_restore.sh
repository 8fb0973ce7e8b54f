#!/usr/bin/env bash
# tune_restore.sh PROGRAM SCRATCH MPIEXEC ARGS...: a tuning run killed by SIGKILL mid-experiment,
# then rerun with the same name: it finishes every trial exactly once (tune_restore_program.cpp).
set -u
prog=$1 scratch=$2
shift 2
rm -rf "$scratch" && mkdir -p "$scratch"
timeout 120 "$@" "$prog" "$scratch" --kill-once >/dev/null 2>&1 && { echo "FAIL: the first run was not killed"; exit 1; }
[ -f "$scratch/killed.marker" ] || { echo "FAIL: the first run did not reach the kill"; exit 1; }
[ -f "$scratch/restore/experiment_state.json" ] || { echo "FAIL: no experiment state was written"; exit 1; }
timeout 120 "$@" "$prog" "$scratch"
