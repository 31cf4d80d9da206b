#!/usr/bin/env bash
# The whole test suite: C++ tests (GoogleTest via CTest), Python oracle tests (pytest), the
# sanitizer-built fuzz run, and smoke runs of the benchmarks. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --no-demo

echo "== C++ tests (ctest, release build)"
ctest --preset release -j "$(nproc)"

echo "== Python oracle tests (pytest)"
FP4MOE_BUILD_DIR="$PWD/build/release" .venv/bin/python -m pytest tests/python -q

for extra in scripts/test.d/*.sh; do
  [[ -e "$extra" ]] || continue
  echo "== $extra"
  bash "$extra"
done
