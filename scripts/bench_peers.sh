#!/usr/bin/env bash
# Peer benchmark: installs the pinned peers (kt-kernel, and ggml as built by llama-cpp-python) into
# a cached virtual environment outside the clone, builds our side (fp4moe, bench_peaks), then runs
# bench/peers/peers.py there: peer and fp4moe interleaved on the same shapes, one table.
#   scripts/bench_peers.sh [--json] [--quick] [--no-build] [other peers.py options, see --help]
# --no-build: use the fp4moe and bench_peaks already in the build directory.
# Environment: FP4MOE_PEER_CACHE (default ~/.cache/fp4moe/peers), FP4MOE_BUILD_DIR (default
# build/peers, configured Release with the benchmarks on), FP4MOE_PEER_JOBS (build jobs, nproc).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

# The pins. ggml is compiled for this CPU (GGML_NATIVE), so the CPU's flags are part of the key.
pins=(kt-kernel==0.7.2 llama-cpp-python==0.3.36)
cmake_args="-DGGML_NATIVE=ON -DGGML_CPU=ON -DGGML_CPU_REPACK=ON -DGGML_OPENMP=ON"
cmake_args+=" -DGGML_BACKEND_DL=OFF"
cmake_args+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
cmake_args+=" -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release"
python=${PYTHON:-python3}
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
key=$(printf '%s\n' "${pins[@]}" "$cmake_args" "$("$python" -c 'import sys; print(sys.version)')" \
        "$cpu_flags" "layout-1" | sha256sum | cut -c1-16)
cache=${FP4MOE_PEER_CACHE:-$HOME/.cache/fp4moe/peers}
venv=$cache/$key
jobs=${FP4MOE_PEER_JOBS:-$(nproc)}

# Build into a temporary directory and rename it into place only when complete, so an
# interrupted or failed install leaves nothing that looks usable; a later run starts over.
if [[ ! -f $venv/.complete ]]; then
  mkdir -p "$cache"
  # One installer per key at a time; a partial directory left by a killed one is removed.
  exec 9>"$cache/.lock-$key"
  flock 9
fi
if [[ ! -f $venv/.complete ]]; then
  rm -rf "$cache/.partial-$key-"*
  tmp=$(mktemp -d "$cache/.partial-$key-XXXXXX")
  chmod 755 "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  echo "bench_peers: installing ${pins[*]} into $venv (ggml builds from source: minutes)" >&2
  "$python" -m venv "$tmp"
  "$tmp/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  # kt-kernel pulls torch (its Python API takes torch tensors) from PyPI.
  "$tmp/bin/python" -m pip install -q --disable-pip-version-check "${pins[0]}" >&2
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
    "$tmp/bin/python" -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python \
    --no-cache-dir "${pins[1]}" >&2
  # The venv is moved after it is built: write nothing that holds its temporary path
  # (peers.py runs as "$venv/bin/python", which finds its site-packages relative to itself).
  printf '%s\n' "${pins[@]}" "$cmake_args" > "$tmp/.pins"
  touch "$tmp/.complete"
  rm -rf "$venv"  # an incomplete one (no .complete) from before the lock existed
  mv -T "$tmp" "$venv"
  trap - EXIT INT TERM
fi
exec 9>&-

# Our side: a Release build with the benchmarks on (fp4moe and bench_peaks).
build=${FP4MOE_BUILD_DIR:-$repo/build/peers}
args=()
no_build=0
for a in "$@"; do
  if [[ $a == --no-build ]]; then no_build=1; else args+=("$a"); fi
done
if ((!no_build)); then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release >&2
  fi
  cmake --build "$build" -j "$jobs" --target fp4moe bench_peaks >&2
fi

exec "$venv/bin/python" "$repo/bench/peers/peers.py" --fp4moe "$build/fp4moe" \
  --peaks "$build/bench_peaks" "${args[@]}"
