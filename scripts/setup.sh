# Sourced by scripts/quickstart and scripts/test: installs what is missing (apt, idempotent),
# allows mpirun as root where the scripts run as root, and configures the build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}

packages=(build-essential cmake ninja-build ccache zlib1g-dev libtorch-dev libopenmpi-dev openmpi-bin
          librange-v3-dev libxxhash-dev catch2 libbenchmark-dev nlohmann-json3-dev dataset-fashion-mnist)
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

# Open MPI refuses to run as root unless told; containers and CI run as root.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

configure() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
}
