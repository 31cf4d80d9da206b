#!/usr/bin/env bash
# Usage: scripts/engines/env.sh ENGINE VERSION      (ENGINE = sglang | vllm)
#
# Creates, once, a cached virtual environment holding a pinned serving-engine release from PyPI,
# the PyPI torch that release requires (torchvision pinned to match, so pip never upgrades torch)
# and the engine's other declared dependencies minus its GPU-only packages (kernels, flashinfer,
# CUDA toolkits: nothing the engine's config-resolution path imports). The engine itself is
# installed with --no-deps and its requirements are re-read from its own metadata, filtered by the
# deny list below and installed with the torch pin in the same resolver run.
#
# The environment lives OUTSIDE the clone:
#   ${FP4MOE_ENGINE_CACHE:-$HOME/.cache/fp4moe/engines}/<engine>-<version>-<hash of the pin list>
# and the last line printed is its python. Built in a temporary directory next to it under an
# exclusive lock and renamed into place at the end, so an interrupted or concurrent run never
# leaves a half-built environment under the final name (a stale temporary directory is removed by
# the next run). The venv is only ever run as `<dir>/bin/python` (never through console-script
# shebangs), which is what makes the rename safe.
#
# Environment: FP4MOE_ENGINE_CACHE (cache root), FP4MOE_ENGINE_PYTHON (base interpreter,
# default python3; its major.minor is part of the hash), PIP_* as usual (the pip cache is shared,
# so torch is downloaded once per torch version).
set -euo pipefail

usage() { echo "usage: $0 sglang|vllm VERSION" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
engine=$1 version=$2

# ---- pins: one line per supported (engine, version) -------------------------------------------
# torch is the engine's own pin (Requires-Dist torch==...); torchvision is the release built for
# that torch; extra pins fix what the engine leaves open and the config path depends on.
case "$engine@$version" in
  sglang@0.5.13.post1) torch=2.11.0 tv=0.26.0 extra="" ;;
  sglang@0.5.14)       torch=2.11.0 tv=0.26.0 extra="" ;;
  sglang@0.5.23)       torch=2.14.1 tv=0.29.1 extra="" ;;
  vllm@0.21.0)         torch=2.11.0 tv=0.26.0 extra="transformers==5.8.1" ;;
  vllm@0.22.0)         torch=2.11.0 tv=0.26.0 extra="transformers==5.8.1" ;;
  vllm@0.34.0)         torch=2.14.0 tv=0.29.0 extra="transformers==5.19.0" ;;
  *) echo "env.sh: no pins for $engine $version (known: sglang 0.5.13.post1 0.5.14 0.5.23;" \
          "vllm 0.21.0 0.22.0 0.34.0); add a line to the case table in $0" >&2; exit 2 ;;
esac

# GPU-only or media packages the config path never imports (normalized names, fnmatch patterns).
deny="flashinfer* sglang-kernel sgl-* flash-attn* nvidia-cutlass-dsl* nvidia-mathdx nvidia-cudnn-frontend
nvshmem4py* quack-kernels tilelang tokenspeed* torch-memory-saver torchao torchaudio torchcodec cuda-python
humming-kernels kernels decord* av pynvvideocodec nvtx fastsafetensors instanttensor deepseek-recipe
sgl-deep-ep sgl-flash-mla py-spy"
recipe_rev=1   # bump when the build recipe below changes meaning

base_python=${FP4MOE_ENGINE_PYTHON:-python3}
pyver=$("$base_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pinlist="rev=$recipe_rev py=$pyver $engine==$version torch==$torch torchvision==$tv $extra deny=[$(echo $deny)]"
hash=$(printf '%s' "$pinlist" | sha256sum | cut -c1-10)

cache=${FP4MOE_ENGINE_CACHE:-$HOME/.cache/fp4moe/engines}
name="$engine-$version-$hash"
dest="$cache/$name"
mkdir -p "$cache"

ready() { [[ -f "$dest/.fp4moe-complete" ]] && "$dest/bin/python" -c 'import sys' 2>/dev/null; }
if ready; then echo "$dest/bin/python"; exit 0; fi

exec 9>"$cache/.$name.lock"
if ! flock -n 9; then
  echo "env.sh: another run is building $name; waiting" >&2
  flock 9
fi
if ready; then echo "$dest/bin/python"; exit 0; fi

# Holding the lock: any temporary directory for this name is a killed run's.
rm -rf "$cache/.$name.tmp-"* "$dest.old"
[[ -e "$dest" ]] && mv "$dest" "$dest.old" && rm -rf "$dest.old"   # incomplete leftover
tmp=$(mktemp -d "$cache/.$name.tmp-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
echo "env.sh: building $name ($pinlist)" >&2

"$base_python" -m venv "$tmp"
py="$tmp/bin/python"
pip=("$py" -m pip --disable-pip-version-check --no-input)
"${pip[@]}" install -q --upgrade "pip>=24" >&2

# 1. the engine alone, to read its own requirement list
"${pip[@]}" install -q --no-deps "$engine==$version" >&2

# 2. its requirements minus the deny list (markers evaluated for this interpreter, extras dropped)
mapfile -t reqs < <("$py" - "$engine" "$deny" "$extra" <<'EOF'
import fnmatch, importlib.metadata as md, re, sys
from pip._vendor.packaging.requirements import Requirement
engine, deny, extra = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pinned = {norm(Requirement(e).name) for e in extra} | {"torch", "torchvision"}
for line in md.requires(engine) or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    n = norm(r.name)
    if n in pinned or any(fnmatch.fnmatch(n, d) for d in deny):
        continue
    print(str(r).split(";")[0].strip())
for e in extra:
    print(e)
EOF
)
"${pip[@]}" install -q "torch==$torch" "torchvision==$tv" "${reqs[@]}" >&2

# 3. sanity: torch is still the pinned one, and the engine's metadata is there
"$py" - "$engine" "$torch" <<'EOF' >&2
import importlib.metadata as md, sys
engine, want = sys.argv[1], sys.argv[2]
have = md.version("torch")
if have != want:
    sys.exit(f"env.sh: torch is {have}, expected {want} (a dependency upgraded it)")
import torch, transformers  # noqa: F401  (imports without a GPU)
print(f"env.sh: {engine} {md.version(engine)}, torch {have}, transformers {transformers.__version__}")
EOF
{ echo "$pinlist"; "${pip[@]}" freeze; } > "$tmp/fp4moe-env.txt"
touch "$tmp/.fp4moe-complete"
mv -T "$tmp" "$dest"
trap - EXIT
echo "env.sh: $name ready in $((SECONDS - t0)) s" >&2
echo "$dest/bin/python"
