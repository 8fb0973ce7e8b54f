#!/usr/bin/env bash
# make_venv.sh VENV REQUIREMENTS: makes a Python venv at VENV with the pinned REQUIREMENTS from
# PyPI, once (kept while REQUIREMENTS is unchanged). Where it cannot (no python3-venv, no
# network), it says why and exits 77, which the tests that call it pass on for CTest to count as
# skipped.
set -u
venv=$1 requirements=$2
cmp -s "$requirements" "$venv/cohort-requirements.txt" 2>/dev/null && exit 0
rm -rf "$venv"
python=$(command -v /usr/bin/python3 python3 | head -1)
out=$("$python" -m venv "$venv" 2>&1) || { echo "SKIPPED: cannot make a Python venv ($python -m venv: $(tail -1 <<<"$out"))"; exit 77; }
out=$("$venv/bin/pip" install -q --disable-pip-version-check --timeout 15 --retries 1 -r "$requirements" 2>&1) || {
  rm -rf "$venv"
  echo "SKIPPED: cannot install $(basename "$requirements") from PyPI into a venv (no network?): $(grep -E "^ERROR" <<<"$out" | tail -1)"
  exit 77
}
cp "$requirements" "$venv/cohort-requirements.txt"
