#!/usr/bin/env bash
# Installs cohort from the build tree into a scratch prefix, builds tests/package against it with
# find_package(cohort), and runs it. With an expected LibTorch version, the consumer must have
# found a LibTorch and trained on that version; further arguments go to the consumer's cmake
# (e.g. -DTorch_DIR=... to name another LibTorch).
#   check.sh <build dir> <work dir> [<expected LibTorch version> [<cmake argument>...]]
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd) work=$2 expected=${3:-}
shift $(( $# < 3 ? $# : 3 ))
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" "$@" >/dev/null
cmake --build "$work/consumer"
"$work/consumer/consumer" "$work/runs"
test -s "$work/runs/consumer/result.json"
echo "find_package(cohort) works from an install prefix"
if [ -n "$expected" ]; then
  [ -x "$work/consumer/consumer_torch" ] || { echo "error: the consumer found no LibTorch (expected $expected)"; exit 1; }
  out=$("$work/consumer/consumer_torch" "$work/runs")
  echo "$out"
  [ "$out" = "consumer_torch trained on LibTorch $expected" ] || { echo "error: expected LibTorch $expected"; exit 1; }
fi
