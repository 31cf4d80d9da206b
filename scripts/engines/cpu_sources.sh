#!/usr/bin/env bash
# Usage: scripts/engines/cpu_sources.sh
#
# Fetches, once, the sources the CPU engine rules (src/engines/rules/{llamacpp,ktkernel}.json) cite,
# at the pinned releases, and unpacks them OUTSIDE the clone:
#   ${FP4MOE_CPU_ENGINE_SRC:-$HOME/.cache/fp4moe/cpu-engine-src}/llamacpp-0.3.36  (llama-cpp-python's
#       sdist: its vendor/llama.cpp, whose paths the llama.cpp rules cite)
#   .../ktkernel-0.7.2  (the kt-kernel wheel: its kt_kernel/ Python layer)
# tests/python/test_cpu_engine_sources.py then checks every cited file:line and every error
# message a rule quotes against them. Unpacked into a temporary directory and renamed into place,
# so an interrupted run leaves nothing under the final name. The last line printed is the root.
set -euo pipefail
root=${FP4MOE_CPU_ENGINE_SRC:-$HOME/.cache/fp4moe/cpu-engine-src}
mkdir -p "$root"
fetch() {  # NAME DIST VERSION PIP_FLAGS...
  local name=$1 dist=$2 version=$3
  shift 3
  local dest="$root/$name-$version"
  [[ -d $dest ]] && return 0
  local tmp
  tmp=$(mktemp -d "$root/.$name-$version.XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download -q --disable-pip-version-check --no-deps "$@" "$dist==$version" -d "$tmp/dl"
  mkdir "$tmp/src"
  local file
  file=$(ls "$tmp"/dl/*)
  case "$file" in
    *.whl) python3 -m zipfile -e "$file" "$tmp/src" ;;
    *.tar.gz) tar xzf "$file" -C "$tmp/src" --strip-components=1 ;;
    *) echo "cpu_sources.sh: unexpected download $file" >&2; return 1 ;;
  esac
  mv "$tmp/src" "$dest"
}
fetch llamacpp llama-cpp-python 0.3.36 --no-binary :all:
fetch ktkernel kt-kernel 0.7.2 --only-binary :all: --python-version 3.11 --platform manylinux_2_35_x86_64
echo "$root"
