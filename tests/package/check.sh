#!/usr/bin/env bash
# Installs cohort from the build tree into a scratch prefix, builds tests/package against it with
# find_package(cohort), and runs it.
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd) work=$2
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer"
"$work/consumer/consumer" "$work/runs"
test -s "$work/runs/consumer/result.json"
echo "find_package(cohort) works from an install prefix"
