#!/usr/bin/env bash
# tensorboard_check.sh SCRATCH VENV QUICKSTART FASHION_MNIST TUNE_FASHION_MNIST MPIEXEC ARGS...
# (MPIEXEC ARGS...: how to launch 2 ranks):
# the events files of real runs, read by PyPI's tensorboard (EventAccumulator, read_events.py):
# the quickstart (a console line per report), Fashion-MNIST (async checkpoints; run again for one
# more epoch, it resumes and writes a second file) and a sweep of tune_fashion_mnist (every trial
# directory), each at 2 ranks; every numeric metric of each result.json must be a scalar with the
# same values at the same steps. The venv (pinned in
# requirements-tensorboard.txt) is made once and reused; where it cannot be made (no network),
# the test says why and exits 77, which CTest counts as skipped.
set -u
scratch=$1 venv=$2 quickstart=$3 fashion_mnist=$4 tune=$5
shift 5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
requirements=$here/requirements-tensorboard.txt
fail() { echo "FAIL: $*"; exit 1; }

bash "$here/../make_venv.sh" "$venv" "$requirements" || exit $?

rm -rf "$scratch" && mkdir -p "$scratch"
runs=$scratch/runs
run() {  # NAME COMMAND...: one run, its output kept in NAME.log
  local name=$1 rc
  shift
  timeout 120 "$@" >"$scratch/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { tail -20 "$scratch/$name.log"; fail "$name exited $rc"; }
}
run quickstart "$@" "$quickstart" --storage "$runs/quickstart"
run fashion_mnist "$@" "$fashion_mnist" --epochs 2 --max-train 512 --storage "$runs" --name fashion_mnist
run fashion_mnist_resumed "$@" "$fashion_mnist" --epochs 3 --max-train 512 --storage "$runs" --name fashion_mnist
n=$(ls "$runs/fashion_mnist" | grep -c '^events\.out\.tfevents\.')
[ "$n" -eq 2 ] || fail "the resumed Fashion-MNIST run has $n events files, expected 2 (one per attempt)"
run sweep "$@" "$tune" --samples 2 --max-epochs 2 --max-train 256 --storage "$runs" --name sweep

dirs=("$runs"/quickstart/* "$runs/fashion_mnist" "$runs"/sweep/trial_*)
[ ${#dirs[@]} -eq 4 ] || fail "expected 4 run directories (quickstart, fashion_mnist, 2 trials), found: ${dirs[*]}"
"$venv/bin/python" "$here/read_events.py" "${dirs[@]}" || exit 1
echo "ok: tensorboard events of ${#dirs[@]} run directories read by tensorboard $("$venv/bin/python" -c 'import tensorboard; print(tensorboard.__version__)')"
