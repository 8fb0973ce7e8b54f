#!/usr/bin/env bash
# run.sh TEST_PROGRAM RANKS...
# Runs an MPI test program built with -DCOHORT_SANITIZE=address,undefined at each rank count:
# AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer, every report fatal, Open
# MPI's own leaks suppressed by lsan.supp (each entry explained there). Fails on any report.
set -u
prog=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -shared -fPIC -o "$work/no_dlclose.so" "$here/no_dlclose.c" || exit 1
preload="$(gcc -print-file-name=libasan.so):$work/no_dlclose.so"  # the ASan runtime must come first
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0
export LSAN_OPTIONS=suppressions=$here/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
status=0
for n in "$@"; do
  log=$work/ranks$n.log
  timeout 900 mpirun -np "$n" --oversubscribe -x LD_PRELOAD="$preload" -x ASAN_OPTIONS -x LSAN_OPTIONS -x UBSAN_OPTIONS \
    "$prog" >"$log" 2>&1
  rc=$?
  reports=$(grep -cE "runtime error:|ERROR: (AddressSanitizer|LeakSanitizer)" "$log")
  summary=$(grep -aoE "(All tests passed.*|test cases:.*)" "$log" | head -1)
  echo "sanitizers, $n rank(s): exit $rc, $reports report(s); $summary"
  if [ $rc -ne 0 ] || [ "$reports" -ne 0 ]; then
    grep -E -A12 "runtime error:|ERROR: (AddressSanitizer|LeakSanitizer)|FAILED" "$log" | head -60
    status=1
  fi
done
[ $status -eq 0 ] && echo "ok: no sanitizer report at $* rank(s)"
exit $status
