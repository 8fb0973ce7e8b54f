#!/usr/bin/env bash
# expect.sh success|failure REGEX... -- COMMAND...
# Runs COMMAND and checks both how it exits and what it prints (every REGEX, grep -E, must match
# its output): `success` passes on exit 0, as a user's run that finished (ctest's TIMEOUT ends a
# hang); `failure` on a non-zero exit within 120 s (bad input must give a clear error on every
# rank, a non-zero exit, no hang).
# ctest's PASS_REGULAR_EXPRESSION alone would ignore the exit status: a rank that crashes after
# rank 0 printed its line would pass.
set -u
expect=$1
shift
case "$expect" in success | failure) ;; *) echo "usage: expect.sh success|failure REGEX... -- COMMAND..."; exit 2 ;; esac
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
if [ "$expect" = failure ]; then out=$(timeout 120 "$@" 2>&1); else out=$("$@" 2>&1); fi
rc=$?
printf '%s\n' "$out"
[ "$expect" = failure ] && [ $rc -eq 124 ] && { echo "FAIL: timed out after 120 s (a hang)"; exit 1; }
[ "$expect" = failure ] && [ $rc -eq 0 ] && { echo "FAIL: expected a non-zero exit"; exit 1; }
[ "$expect" = success ] && [ $rc -ne 0 ] && { echo "FAIL: expected exit 0, got $rc"; exit 1; }
for p in "${patterns[@]}"; do
  grep -qE -- "$p" <<<"$out" || { echo "FAIL: output does not match: $p"; exit 1; }
done
echo "ok: exit $rc with the expected output"
