#!/usr/bin/env bash
# webdataset_interop.sh VENV MPIEXEC ARGS... TESTS: shards written by PyPI's webdataset read by
# cohort, and cohort's read by webdataset. Makes the venv (pinned in requirements-webdataset.txt;
# Skipped with the reason where it cannot be made), then runs the hidden core test that does both
# with COHORT_TEST_PYTHON naming the venv's python; passes when it passed and both halves printed.
set -u
venv=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/../make_venv.sh" "$venv" "$here/requirements-webdataset.txt" || exit $?
out=$(COHORT_TEST_PYTHON=$venv/bin/python "$@" "[webdataset]" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: the test exited $rc"; exit 1; }
grep -q "webdataset wrote 20 samples" <<<"$out" || { echo "FAIL: webdataset did not write the shards"; exit 1; }
grep -q "webdataset read 25 samples" <<<"$out" || { echo "FAIL: webdataset did not read cohort's shards"; exit 1; }
echo "ok: webdataset and cohort read each other's shards"
