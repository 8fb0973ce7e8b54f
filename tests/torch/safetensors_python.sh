#!/usr/bin/env bash
# safetensors_python.sh VENV MPIEXEC ARGS... TESTS: the model.safetensors cohort writes, read by
# PyPI's safetensors. Makes the venv (pinned in requirements-safetensors.txt; Skipped with the
# reason where it cannot be made), then runs the C++ test that writes the files with
# COHORT_TEST_PYTHON naming the venv's python, so its Python half runs; passes when the test
# passed and printed "python read" (Python read the files).
set -u
venv=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/../make_venv.sh" "$venv" "$here/requirements-safetensors.txt" || exit $?
out=$(COHORT_TEST_PYTHON=$venv/bin/python "$@" "model weights are a safetensors file that safetensors (and so Python) reads" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: the test exited $rc"; exit 1; }
grep -q "python read \['l1.bias'" <<<"$out" || { echo "FAIL: the Python read did not run"; exit 1; }
echo "ok: python read cohort's safetensors files"
