#!/usr/bin/env bash
# Sets up this machine for fp4moe and runs the main job: installs the Debian packages and the
# Python test oracles (into .venv), builds the release preset, then runs `fp4moe demo`.
#   scripts/setup.sh             set up, build, run the demo
#   scripts/setup.sh --no-demo   set up and build only (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(cmake g++ ccache clang libclang-rt-14-dev make pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libre2-dev
              libgtest-dev libgmock-dev libbenchmark-dev libsimde-dev python3-venv)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python oracles (numpy, ml_dtypes, safetensors, pytest) in a project-local virtual environment;
# reinstalled only when the requirements file changes.
requirements=tests/python/requirements.txt
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if ! cmp -s "$requirements" .venv/.requirements.installed 2>/dev/null; then
  echo "setup: installing Python test oracles from $requirements"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" .venv/.requirements.installed
fi

# ccache: scripts/build_wheel.sh compiles the same sources with the same flags and compiler as this
# build, so its compiles are cache hits (and so are rebuilds after a checkout switch). Read by
# CMake when it first configures a build directory.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
fi
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"

if [[ "${1:-}" != "--no-demo" ]]; then
  ./build/release/fp4moe demo
fi
