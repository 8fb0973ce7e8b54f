#!/usr/bin/env bash
# Builds tests/package (a user's project) with find_package(cohort), from an install prefix (cohort
# installed from the build tree into a scratch prefix) or from the build tree itself
# (-Dcohort_DIR=<build dir>), and checks what it got:
#   <LibTorch version>  consumer runs, and consumer_torch trained on that LibTorch (from a build
#                       tree: consumer_torch configured, not compiled)
#   core                consumer runs, and no LibTorch was taken (consumer_torch not built)
#   nccl                consumer runs, and consumer_nccl was built against NCCL and runs
#   fail:<text>         the consumer's configure fails, saying <text>
# The consumer builds at $COHORT_OPT (scripts/test: -O1), else -O3.
# Further arguments go to the consumer's cmake (e.g. -DTorch_DIR=..., -DCOHORT_CONSUMER_COMPONENTS=nccl).
#   check.sh <build dir> <work dir> prefix|build <expect> [<cmake argument>...]
set -euo pipefail
build=$1 work=$2 from=$3 expect=$4 src=$(cd "$(dirname "$0")" && pwd)
shift 4
rm -rf "$work" && mkdir -p "$work"
case "$from" in
  prefix) cmake --install "$build" --prefix "$work/prefix" >/dev/null
          where=(-DCMAKE_PREFIX_PATH="$work/prefix") ;;
  build) where=(-Dcohort_DIR="$build") ;;
  *) echo "error: '$from': say prefix or build" >&2; exit 2 ;;
esac
if ! cmake -S "$src" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="${COHORT_OPT:--O3} -DNDEBUG" "${where[@]}" "$@" >"$work/configure.log" 2>&1; then
  if [[ "$expect" == fail:* ]] && grep -qF -- "${expect#fail:}" "$work/configure.log"; then
    echo "ok: find_package(cohort) from the $from failed as expected: ${expect#fail:}"
    exit 0
  fi
  cat "$work/configure.log"; echo "error: the consumer's configure failed"; exit 1
fi
if [[ "$expect" == fail:* ]]; then
  cat "$work/configure.log"; echo "error: the consumer's configure succeeded; expected it to fail with: ${expect#fail:}"; exit 1
fi
# From a build tree, cohort::torch is configured but its consumer not compiled: the prefix test
# compiles and trains with it (a LibTorch translation unit is minutes of CI on two cores).
torch_built=yes
if [ "$from" = build ] && [[ "$expect" =~ ^[0-9] ]]; then
  torch_built=no
  targets=$(ninja -C "$work/consumer" -t targets all)  # not piped into grep -q: pipefail and SIGPIPE
  grep -q '^consumer_torch:' <<<"$targets" ||
    { echo "error: the build tree gave no cohort::torch (expected LibTorch $expect)"; exit 1; }
  cmake --build "$work/consumer" --target consumer
else
  cmake --build "$work/consumer"
fi
"$work/consumer/consumer" "$work/runs"
test -s "$work/runs/consumer/result.json"
case "$expect" in
  core) [ ! -e "$work/consumer/consumer_torch" ] || { echo "error: the consumer took a LibTorch; expected the core alone"; exit 1; } ;;
  nccl) [ -x "$work/consumer/consumer_nccl" ] || { echo "error: cohort::nccl was not made"; exit 1; }
        "$work/consumer/consumer_nccl" ;;
  *) [ $torch_built = yes ] || { echo "ok: find_package(cohort) works from the $from (cohort::torch configured, $expect)"; exit 0; }
     [ -x "$work/consumer/consumer_torch" ] || { echo "error: the consumer found no LibTorch (expected $expect)"; exit 1; }
     out=$("$work/consumer/consumer_torch" "$work/runs")
     echo "$out"
     [ "$out" = "consumer_torch trained on LibTorch $expect" ] || { echo "error: expected LibTorch $expect"; exit 1; } ;;
esac
echo "ok: find_package(cohort) works from the $from ($expect)"
