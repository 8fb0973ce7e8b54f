#!/usr/bin/env bash
# The vcpkg overlay port ports/cohort, tested without vcpkg (which cannot be installed here):
#  (a) ports/cohort/vcpkg.json against vcpkg's manifest rules (vcpkg_manifest.py, which first
#      checks that each rule rejects a manifest that breaks it);
#  (b) the real portfile.cmake, run by cmake -P with vcpkg_stubs.cmake standing in for vcpkg's
#      helper functions: the configure and install it asks for, vcpkg's config fix-up and its
#      post-build checks, into <work dir>/packages/cohort_x64-linux;
#  (c) a consumer of that tree whose CMakeLists.txt is the lines of ports/cohort/usage, built
#      from test_package/main.cpp and run at 2 ranks under mpirun.
# Exit 77 (skipped) when python3 is missing.
#   vcpkg.sh <source dir> <work dir>
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: vcpkg.sh <source dir> <work dir>" >&2
  exit 2
fi
src=$(cd "$1" 2>/dev/null && pwd) || { echo "error: source dir $1 does not exist" >&2; exit 2; }
port=$src/ports/cohort
[ -f "$port/portfile.cmake" ] || { echo "error: $src has no ports/cohort/portfile.cmake: not cohort's source dir" >&2; exit 2; }
command -v python3 >/dev/null || { echo "skipped: python3 not found (needed to check vcpkg.json)"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
start=$SECONDS

# (a)
python3 "$here/vcpkg_manifest.py" --self-test
python3 "$here/vcpkg_manifest.py" "$port/vcpkg.json" "$port/portfile.cmake" "$src/CMakeLists.txt" "$src/LICENSE"

# (b)
if ! cmake -DPORTFILE="$port/portfile.cmake" -DWORK="$work" -P "$here/vcpkg_stubs.cmake" >"$work/portfile.log" 2>&1; then
  cat "$work/portfile.log"
  echo "error: the portfile failed under the vcpkg stand-ins (log: $work/portfile.log)"
  exit 1
fi
if grep -q "Warning" "$work/portfile.log"; then
  cat "$work/portfile.log"
  echo "error: the portfile ran with warnings (vcpkg prints them as well)"
  exit 1
fi
packages=$work/packages/cohort_x64-linux
for f in share/cohort/cohort-config.cmake share/cohort/copyright share/cohort/usage include/cohort/cohort.hpp tools/cohort/cohort-run; do
  [ -e "$packages/$f" ] || { echo "error: the port installed no $f"; exit 1; }
done
# A package names no folder of the machine that built it (vcpkg checks its own build folders only).
if leak=$(grep -rlF -e "$src" -e "$work/buildtrees" "$packages"); then
  echo "$leak"; echo "error: the installed files above name the builder's folders ($src)"; exit 1
fi
echo "portfile.cmake installed cohort to $packages ($(find "$packages" -type f | wc -l) files)"

# (c) The consumer: add_executable, then the usage text's first block of indented lines.
consumer=$work/consumer
rm -rf "$consumer" && mkdir -p "$consumer"
cp "$src/test_package/main.cpp" "$consumer/main.cpp"
{
  echo "cmake_minimum_required(VERSION 3.20)"
  echo "project(vcpkg_consumer LANGUAGES CXX)"
  awk '/^    / { print substr($0, 5); seen = 1; next } seen { exit }' "$packages/share/cohort/usage" |
    sed 's/^target_link_libraries/add_executable(main main.cpp)\ntarget_link_libraries/'
  echo 'file(WRITE ${CMAKE_BINARY_DIR}/mpiexec.txt "${MPIEXEC_EXECUTABLE};${MPIEXEC_NUMPROC_FLAG}")'
} >"$consumer/CMakeLists.txt"
grep -q "^find_package(cohort" "$consumer/CMakeLists.txt" && grep -q "^target_link_libraries(main PRIVATE cohort::cohort)" "$consumer/CMakeLists.txt" ||
  { cat "$consumer/CMakeLists.txt"; echo "error: ports/cohort/usage has no find_package/target_link_libraries block"; exit 1; }
if ! { cmake -S "$consumer" -B "$consumer/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$packages" &&
       cmake --build "$consumer/build"; } >"$work/consumer.log" 2>&1; then
  tail -30 "$work/consumer.log"
  echo "error: the consumer of the port's usage did not build (log: $work/consumer.log)"
  exit 1
fi
IFS=';' read -r mpiexec numproc_flag <"$consumer/build/mpiexec.txt" || true  # no final newline
[ -x "$mpiexec" ] || { echo "error: cohort's config found no mpiexec (MPIEXEC_EXECUTABLE is '$mpiexec')"; exit 1; }
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
rm -rf "$work/runs"
out=$("$mpiexec" "$numproc_flag" 2 "$consumer/build/main" "$work/runs" 2 2>&1) || { echo "$out"; echo "error: the consumer failed at 2 ranks"; exit 1; }
echo "$out"
[ "$out" = "cohort test_package: 2 ranks, all-reduce 3" ] || { echo "error: unexpected output from the consumer"; exit 1; }
echo "vcpkg port: manifest checked, portfile installed through the stand-ins, usage consumer ran at 2 ranks in $((SECONDS - start)) s"
