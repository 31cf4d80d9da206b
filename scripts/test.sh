#!/usr/bin/env bash
# The whole test suite: C++ tests (GoogleTest via CTest), Python oracle tests (pytest), the
# sanitizer-built fuzz run, and smoke runs of the benchmarks. CI runs exactly this (.ci/run).
# Each stage's wall time is printed when it ends and again in a table at the end (CI must stay
# under 45 minutes on a fresh 2-core machine: the table says where the time goes).
set -euo pipefail
cd "$(dirname "$0")/.."

timings=()
suite_start=$SECONDS
stage() {  # stage NAME COMMAND...: runs COMMAND, records its seconds
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  timings+=("$(printf '%6d s  %s' $((SECONDS - t0)) "$name")")
  echo "== $name: $((SECONDS - t0)) s"
}

stage "setup and release build (scripts/setup.sh --no-demo)" ./scripts/setup.sh --no-demo
stage "C++ tests (ctest, release build)" ctest --preset release -j "$(nproc)"
stage "Python oracle tests (pytest)" \
  env FP4MOE_BUILD_DIR="$PWD/build/release" .venv/bin/python -m pytest tests/python -q

for extra in scripts/test.d/*.sh; do
  [[ -e "$extra" ]] || continue
  stage "$extra" bash "$extra"
done

echo "== stage times"
printf '%s\n' "${timings[@]}"
printf '%6d s  total\n' $((SECONDS - suite_start))
