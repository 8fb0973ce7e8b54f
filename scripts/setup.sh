# Sourced by scripts/quickstart and scripts/test: installs what is missing (apt, idempotent), puts
# LibTorch in place, allows mpirun as root where the scripts run as root, and configures the build.
#
# LibTorch (COHORT_LIBTORCH):
#   pypi    (default) PyPI's torch wheel, pinned in scripts/requirements-torch.txt, installed once
#           into the project's .venv (about 1.3 GB on disk, 20-60 s; reused afterwards).
#   debian  Debian's libtorch-dev (1.13), as a distribution user has it; about 2x slower per step.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
libtorch=${COHORT_LIBTORCH:-pypi}

packages=(build-essential cmake ninja-build ccache zlib1g-dev libopenmpi-dev openmpi-bin
          librange-v3-dev libxxhash-dev catch2 libbenchmark-dev nlohmann-json3-dev dataset-fashion-mnist
          libarchive-dev libturbojpeg0-dev libcurl4-openssl-dev)
# What the tests alone need (scripts/test sets it): the multi-host and Slurm tests' tools.
packages+=(${extra_packages:-})
case "$libtorch" in
  pypi) packages+=(python3-venv) ;;
  debian) packages+=(libtorch-dev) ;;
  *) echo "error: COHORT_LIBTORCH=$libtorch: unknown; use pypi (the default) or debian" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The torch wheel in .venv, installed again only when scripts/requirements-torch.txt changes.
torch_args=()
if [ "$libtorch" = pypi ]; then
  venv=$root/.venv requirements=$root/scripts/requirements-torch.txt
  if ! cmp -s "$requirements" "$venv/cohort-requirements-torch.txt" 2>/dev/null; then
    echo "installing LibTorch from PyPI into $venv ($(grep -m1 '^torch==' "$requirements"))"
    [ -x "$venv/bin/pip" ] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-deps --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/cohort-requirements-torch.txt"
  fi
  torch_args=(-DTorch_DIR="$(echo "$venv"/lib/python3*/site-packages/torch/share/cmake/Torch)")
else
  torch_args=(-DTorch_DIR=/usr/lib/$(gcc -print-multiarch)/cmake/Torch)
fi

# Open MPI refuses to run as root unless told; containers and CI run as root.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The optimisation level (COHORT_OPT, default -O3, CMake's Release): scripts/test builds its test
# trees at -O0 (its guarded benchmarks and the ThreadSanitizer tree at -O1), which compiles the
# LibTorch-heavy translation units that dominate CI's time in 20-50% less time; benchmarks and
# the examples' figures come from -O3 builds. Passed on every configure, so that a build folder
# never keeps a level from an earlier run.
configure() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="${COHORT_OPT:--O3} -DNDEBUG" \
        "${torch_args[@]}" "$@" >/dev/null
}
