#!/usr/bin/env bash
# conan create of the repository's conanfile.py, offline: Conan (pinned, from PyPI) in a venv in
# <work dir>, a Conan home there with no remote, nlohmann_json, range-v3, xxhash, zlib and catch2
# exported from packaging/conan/system (wrappers of Debian's packages), then the package built and
# its test_package (a copy in <work dir>, so nothing is written into the source tree) built with
# find_package(cohort) and run at 2 ranks under mpirun. Exit 77 (skipped) when Conan cannot be
# installed.
#   conan.sh <source dir> <work dir>
set -euo pipefail
conan_version=2.34.0  # the Conan 2 release this was last checked with
if [ $# -ne 2 ]; then
  echo "usage: conan.sh <source dir> <work dir>" >&2
  exit 2
fi
src=$(cd "$1" 2>/dev/null && pwd) || { echo "error: source dir $1 does not exist" >&2; exit 2; }
[ -f "$src/conanfile.py" ] || { echo "error: $src has no conanfile.py: not cohort's source dir" >&2; exit 2; }
mkdir -p "$2"
work=$(cd "$2" && pwd)
start=$SECONDS

# Conan, installed once per work dir and again when the pin changes.
venv=$work/venv
if [ "$("$venv/bin/conan" --version 2>/dev/null)" != "Conan version $conan_version" ]; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >"$work/venv.log" 2>&1 ||
     ! "$venv/bin/pip" install -q --disable-pip-version-check "conan==$conan_version" >>"$work/venv.log" 2>&1; then
    echo "skipped: cannot install conan==$conan_version from PyPI into a venv (no network or no python3-venv; see $work/venv.log)"
    exit 77
  fi
fi
conan=$venv/bin/conan

# A fresh Conan home with no remote: only what is exported here can be used.
export CONAN_HOME=$work/conan_home
rm -rf "$CONAN_HOME" && mkdir -p "$CONAN_HOME"
echo '{"remotes": []}' >"$CONAN_HOME/remotes.json"
"$conan" profile detect >/dev/null 2>&1
: >"$work/export.log"
for name in nlohmann_json range-v3 xxhash zlib catch2; do
  "$conan" export "$src/packaging/conan/system" --name "$name" >>"$work/export.log" 2>&1 ||
    { tail -5 "$work/export.log"; echo "error: conan export of the system $name failed"; exit 1; }
done

rm -rf "$work/test_package" && cp -r "$src/test_package" "$work/test_package"
if ! "$conan" create "$src" -s compiler.cppstd=20 --build=missing --test-folder "$work/test_package" >"$work/create.log" 2>&1; then
  tail -40 "$work/create.log"
  echo "error: conan create failed (log: $work/create.log)"
  exit 1
fi
grep -E "^Full package reference: cohort/" "$work/create.log"
if ! grep -qx "cohort test_package: 2 ranks, all-reduce 3" "$work/create.log"; then
  tail -20 "$work/create.log"
  echo "error: conan create passed but test_package did not report its 2-rank run (log: $work/create.log)"
  exit 1
fi
grep -x "cohort test_package: 2 ranks, all-reduce 3" "$work/create.log"
echo "conan create (Conan $conan_version) built cohort and ran its test_package at 2 ranks in $((SECONDS - start)) s"
