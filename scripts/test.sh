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
  timings+=("$(printf '%6d s  %s  (free disk after it: %s)' $((SECONDS - t0)) "$name" "$(free_disk)")")
  echo "== $name: $((SECONDS - t0)) s"
}
# Free space where the tests write, at the start and after each stage: a full disk fails tests in
# ways that look like their own bugs (why pytest keeps little: pyproject.toml's pytest section).
free_disk() { df -h --output=avail "${TMPDIR:-/tmp}" | tail -n 1 | tr -d ' '; }
echo "== free disk in ${TMPDIR:-/tmp} at the start: $(free_disk)"

# The engine environments (scripts/engines/env.sh; used by test.d/engines.sh and wheel.sh) are
# mostly downloads (two PyPI torch builds): on a fresh machine they are built in the background
# from the start, beside the compiles and tests, in a process group of their own that is killed
# if this script exits first. It is waited for before scripts/test.d runs; engines.sh's own
# env.sh calls then find the environments ready, or build them and report why they could not.
engines_log="$(mktemp)"
engines_pid=""
cleanup() {
  [[ -n "$engines_pid" ]] && kill -TERM -- "-$engines_pid" 2>/dev/null
  rm -f "$engines_log"
}
trap cleanup EXIT
if [[ -z "${FP4MOE_SKIP_ENGINES:-}" ]]; then
  setsid bash -c 'for e in sglang vllm; do
      scripts/engines/env.sh "$e" "$(scripts/engines/newest.sh "$e")"
    done
    scripts/engines/cpu_sources.sh' >"$engines_log" 2>&1 &
  engines_pid=$!
fi

stage "setup and release build (scripts/setup.sh --no-demo)" ./scripts/setup.sh --no-demo
stage "C++ tests (ctest, release build)" ctest --preset release -j "$(nproc)"
# pytest-xdist: one worker per core (the tests are independent; each has its own tmp_path).
stage "Python oracle tests (pytest)" \
  env FP4MOE_BUILD_DIR="$PWD/build/release" .venv/bin/python -m pytest tests/python -q -n auto

# The background environments are needed from here on (engines.sh, wheel.sh): wait for them, so
# no env.sh or cpu_sources.sh runs twice at once. A failure here is not fatal: engines.sh builds
# what is missing itself and reports why it could not.
if [[ -n "$engines_pid" ]]; then
  t0=$SECONDS
  if ! wait "$engines_pid"; then
    echo "== the background engine environment build failed (engines.sh retries it):"
    tail -n 20 "$engines_log"
  fi
  engines_pid=""
  echo "== background engine environments (waited $((SECONDS - t0)) s here):"
  grep -E "ready in" "$engines_log" || true
fi

for extra in scripts/test.d/*.sh; do
  [[ -e "$extra" ]] || continue
  stage "$extra" bash "$extra"
done

echo "== stage times"
printf '%s\n' "${timings[@]}"
printf '%6d s  total\n' $((SECONDS - suite_start))
