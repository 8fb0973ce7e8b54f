#!/usr/bin/env bash
# run.sh TEST_PROGRAM RANKS... [-- PROGRAM_ARGS...]
# Runs an MPI test program built with -DCOHORT_SANITIZE=... at each rank count, under the
# sanitizers it was built with (read from the runtime it links):
#   address,undefined  AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer; Open
#                      MPI's end-of-process memory suppressed by lsan.supp (each entry explained).
#   thread             ThreadSanitizer; reports from inside Open MPI (not instrumented)
#                      suppressed by tsan.supp (each entry explained). OpenMP and LibTorch's
#                      intra-op pool are held to one thread: libgomp is not instrumented either,
#                      and cohort's code run on its pool would be reported for races TSan cannot
#                      see ordered. A forked child may not start threads (die_after_fork=0 lets
#                      it try; TSan does not support it, so such tests are left out by the caller).
# Every report is counted and fails the run, as does a failing test. PROGRAM_ARGS (e.g. a Catch2
# test spec) are passed to the program. With COHORT_SANITIZER_KEEP_LOGS=DIR each rank count's
# whole log is copied into DIR (only the first reports are printed); COHORT_SANITIZER_OPTIONS is
# appended to ASan's and LSan's options (deeper allocation stacks, for one).
set -u
prog=$1
shift
ranks=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  ranks+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -shared -fPIC -o "$work/no_dlclose.so" "$here/no_dlclose.c" || exit 1

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if readelf -d "$prog" | grep -q 'NEEDED.*libtsan'; then
  sanitizer=thread
  # The TSan runtime must come first. One OpenMP / intra-op thread: libgomp is not instrumented,
  # so the synchronisation of its pool is invisible to TSan (OMP_THREAD_LIMIT also caps the
  # at::set_num_threads(n) fit() calls).
  preload="$(gcc -print-file-name=libtsan.so):$work/no_dlclose.so"
  export TSAN_OPTIONS="suppressions=$here/tsan.supp:halt_on_error=0:exitcode=66:history_size=4:second_deadlock_stack=1:die_after_fork=0"
  export OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1 MKL_NUM_THREADS=1
  env_names=(TSAN_OPTIONS OMP_NUM_THREADS OMP_THREAD_LIMIT MKL_NUM_THREADS)
  pattern="WARNING: ThreadSanitizer|ERROR: ThreadSanitizer|FATAL: ThreadSanitizer"
else
  sanitizer=address,undefined
  preload="$(gcc -print-file-name=libasan.so):$work/no_dlclose.so"  # the ASan runtime must come first
  # Each allocation's stack is unwound from its debug info (fast_unwind_on_malloc=0): Open MPI's
  # leaked strings come from glibc's vasprintf, which has no frame pointer to follow, and only the
  # full unwinder reaches the Open MPI frame that lsan.supp names. 10 frames of it (not ASan's
  # 30) reach it, and take the runs from 342 to 243 s (the core and LibTorch tests at 1 and 3
  # ranks, 2 cores). COHORT_SANITIZER_OPTIONS (e.g. malloc_context_size=30) is appended to both.
  export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=10:abort_on_error=0${COHORT_SANITIZER_OPTIONS:+:$COHORT_SANITIZER_OPTIONS}
  export LSAN_OPTIONS=suppressions=$here/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0:malloc_context_size=10${COHORT_SANITIZER_OPTIONS:+:$COHORT_SANITIZER_OPTIONS}
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  env_names=(ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS)
  pattern="runtime error:|ERROR: (AddressSanitizer|LeakSanitizer)"
fi
exports=()
for v in "${env_names[@]}"; do exports+=(-x "$v"); done

status=0
for n in "${ranks[@]}"; do
  log=$work/ranks$n.log
  start=$SECONDS
  timeout 1500 mpirun -np "$n" --oversubscribe -x LD_PRELOAD="$preload" "${exports[@]}" "$prog" "$@" >"$log" 2>&1
  rc=$?
  reports=$(grep -acE "$pattern" "$log")
  summary=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -aoE "(All tests passed.*|test cases:.*)" | head -1)
  echo "$sanitizer, $(basename "$prog"), $n rank(s): exit $rc, $reports report(s), $((SECONDS - start)) s; $summary"
  if [ $rc -ne 0 ] || [ "$reports" -ne 0 ]; then
    grep -aE -A40 "$pattern|FAILED" "$log" | head -200
    status=1
  fi
  [ -n "${COHORT_SANITIZER_KEEP_LOGS:-}" ] && cp "$log" "$COHORT_SANITIZER_KEEP_LOGS/$(basename "$prog").ranks$n.log"
done
[ $status -eq 0 ] && echo "ok: no $sanitizer report at ${ranks[*]} rank(s)"
exit $status
