#!/usr/bin/env bash
# expect_failure.sh REGEX... -- COMMAND...
# Passes when COMMAND exits non-zero and its output matches every REGEX (grep -E): bad input must
# give a clear error on every rank and a non-zero exit.
set -u
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
out=$(timeout 120 "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ $rc -eq 124 ] && { echo "FAIL: timed out (a hang)"; exit 1; }
[ $rc -eq 0 ] && { echo "FAIL: expected a non-zero exit"; exit 1; }
for p in "${patterns[@]}"; do
  grep -qE -- "$p" <<<"$out" || { echo "FAIL: output does not match: $p"; exit 1; }
done
echo "ok: exit $rc with the expected messages"
