#!/usr/bin/env bash
# Builds dist/fp4moe-<version>-<tag>.whl (the module and the `fp4moe` tool; pyproject.toml) with
# the build backend pinned in pyproject.toml's [build-system], installed into a temporary virtual
# environment. The CMake build lives in build/wheel/<tag> and is kept, so a rebuild compiles only
# what changed. Needs the Debian packages scripts/setup.sh installs; the wheel's users need none.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
# The pins have one home: pyproject.toml's build-system.requires.
mapfile -t backend < <(python3 -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
"$tools/venv/bin/python" -m pip install -q --disable-pip-version-check "${backend[@]}"

rm -f dist/fp4moe-*.whl
# ccache (scripts/setup.sh installs it): the library's and the tool's sources compile with the
# same flags as the release preset's, so after scripts/setup.sh's build they are cache hits, if
# the compiler is named the same: ccache hashes its path, and the preset's CMake picks c++ where
# scikit-build-core would pass g++ (the same GCC; 0 hits of 190 in a CI run before this).
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CXX="${CXX:-c++}"
fi
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$tools/venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-build-isolation \
  --no-deps -w dist .
wheel=(dist/fp4moe-*.whl)
echo "build_wheel: ${wheel[0]} ($(du -h "${wheel[0]}" | cut -f1)) in $(( $(date +%s) - start )) s"
