#!/usr/bin/env bash
# Usage: scripts/engines/refresh_verdicts.sh [ENGINE@VERSION ...]
#
# Runs every pinned engine release (tests/engines/verdicts.py: VERSIONS; default all of them, or
# the ones named) on every fixture (tests/engines/fixtures: NVIDIA's DeepSeek-V4-Flash-NVFP4, the
# stock DeepSeek-V4-Flash, NVIDIA's older revision, and the output of our own `fp4moe convert`
# built now), under each flag set (FLAGS) and each faked SM (SMS), through the engine's own config
# resolution (src/engines/resolve.py, one process per version and SM), and merges the results
# into tests/engines/verdicts.json (entries of versions not re-run are kept), with the exact
# engine/torch/transformers/Python versions of every environment.
#
# Needs: the project venv (.venv: numpy, ml_dtypes, safetensors), the fp4moe binary
# ($FP4MOE_BUILD_DIR/fp4moe, default build/release), PyPI for the engine envs (scripts/engines/env.sh,
# cached). FP4MOE_RESOLVE_TIMEOUT (s, default 1500) bounds each resolver process.
# FP4MOE_VERDICT_FIXTURES="a b" limits the run to those fixtures (verdicts are merged per
# (engine, version, fixture, flags, sm); the others already in the file are kept).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
py_project=${FP4MOE_PROJECT_PYTHON:-$root/.venv/bin/python}
bin=${FP4MOE_BUILD_DIR:-$root/build/release}/fp4moe
timeout_s=${FP4MOE_RESOLVE_TIMEOUT:-1500}
fixtures=${FP4MOE_VERDICT_FIXTURES:-$("$py_project" -c 'import sys; sys.path.insert(0, "tests/engines"); import verdicts as v; print(*v.FIXTURES)')}
export FP4MOE_VERDICT_FIXTURES=$fixtures
conv_args=()
if [[ " $fixtures " == *" converted"* ]]; then
  [[ -x "$bin" ]] || { echo "refresh_verdicts: no fp4moe binary at $bin (set FP4MOE_BUILD_DIR)" >&2; exit 2; }
  conv_args=(--converted-with "$bin")
fi

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <("$py_project" -c '
import sys; sys.path.insert(0, "tests/engines"); import verdicts as v
print("\n".join(f"{e}@{x}" for e in v.VERSIONS for x in v.VERSIONS[e]))')
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fp4moe-verdicts.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "refresh_verdicts: fixtures in $work/fx" >&2
"$py_project" tests/engines/fixtures.py "$work/fx" "${conv_args[@]}" >&2

mkdir -p "$work/out"
for t in "${targets[@]}"; do
  engine=${t%@*} version=${t#*@}
  py=$(scripts/engines/env.sh "$engine" "$version" | tail -n1)
  "$py_project" - "$engine" "$work/fx" > "$work/jobs-$engine.json" <<'PYEOF'
import json, sys
sys.path.insert(0, "tests/engines")
import verdicts as v
engine, fx = sys.argv[1], sys.argv[2]
import os
names = os.environ["FP4MOE_VERDICT_FIXTURES"].split()
print(json.dumps([{"checkpoint": f"{fx}/{f}", "flags": fl} for f in names for fl in v.FLAGS[engine]]))
PYEOF
  # One resolver process per SM, run side by side (each imports the engine once).
  pids=() outs=()
  for sm in $("$py_project" -c 'import sys; sys.path.insert(0, "tests/engines"); import verdicts as v; print(*v.SMS[sys.argv[1]])' "$engine"); do
    out="$work/out/$engine-$version-sm$sm.json"
    log="$work/out/$engine-$version-sm$sm.log"
    echo "refresh_verdicts: $engine $version sm_$sm" >&2
    smarg=(); [[ $sm == None ]] || smarg=(--sm "$sm")
    timeout "$timeout_s" "$py" src/engines/resolve.py --engine "$engine" "${smarg[@]}" \
      --jobs "$work/jobs-$engine.json" > "$out" 2> "$log" &
    pids+=($!) outs+=("$out")
  done
  s0=$SECONDS
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      echo "refresh_verdicts: resolver failed or timed out (${outs[$i]}); log tail:" >&2
      tail -n 20 "${outs[$i]%.json}.log" >&2
      rm -f "${outs[$i]}"
    fi
  done
  echo "refresh_verdicts:   $engine $version: $((SECONDS - s0)) s" >&2
done

# Merge under a lock: two refreshes may run side by side.
mkdir -p "${FP4MOE_ENGINE_CACHE:-$HOME/.cache/fp4moe/engines}"
exec 8>"${FP4MOE_ENGINE_CACHE:-$HOME/.cache/fp4moe/engines}/.verdicts.lock"
flock 8
"$py_project" - "$work" "$bin" <<'PYEOF'
import datetime, json, platform, sys
from pathlib import Path
sys.path.insert(0, "tests/engines")
import verdicts as V
work, binary = Path(sys.argv[1]), sys.argv[2]
path = V.VERDICTS
old = json.loads(path.read_text()) if path.exists() else {"verdicts": [], "environments": {}}
new, envs = [], {}
for f in sorted((work / "out").glob("*.json")):
    for r in json.loads(f.read_text()):
        r["version"] = r["versions"][r["engine"]]
        r["fixture"] = r.pop("checkpoint")
        r.pop("job_index", None)
        new.append(r)
        envs[f'{r["engine"]}@{r["version"]}'] = {k: r["versions"][k] for k in r["versions"]}
K = lambda v: V.key(v["engine"], v["version"], v["fixture"], v["flags"], v["sm"])
fresh = {K(v) for v in new}
kept = [v for v in old.get("verdicts", []) if K(v) not in fresh]
environments = dict(old.get("environments", {}))
environments.update(envs)
fixtures = dict(old.get("fixtures", {}))
for name in V.FIXTURES:
    d = work / "fx" / name
    if d.is_dir():
        fixtures[name] = {"config_sha256": V.config_digest(d)}
        if name in V.CONVERTED:
            import fixtures as FX
            fixtures[name]["built_with"] = ("fp4moe synth dsv4-mxfp4 DIR --full-size; fp4moe convert "
                                            "DIR OUT --to nvfp4 " + " ".join(FX.CONVERTED_ARGS[name])).strip()
doc = {
    "schema": 1,
    "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "generator": "scripts/engines/refresh_verdicts.sh",
    "host": {"machine": platform.machine(), "gpu": None},
    "matrix": {"versions": V.VERSIONS, "fixtures": V.FIXTURES, "flags": V.FLAGS,
               "sms": {e: [s for s in V.SMS[e]] for e in V.SMS}},
    "fixtures": fixtures,
    "environments": dict(sorted(environments.items())),
    "verdicts": sorted(kept + new, key=lambda v: (v["engine"], v["version"], v["fixture"],
                                                  V.flags_key(v["flags"]), v["sm"])),
}
path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
missing = [k for k in (V.key(*m) for m in V.MATRIX) if k not in {V.key(v["engine"], v["version"],
           v["fixture"], v["flags"], v["sm"]) for v in doc["verdicts"]}]
print(f"refresh_verdicts: wrote {path} ({len(doc['verdicts'])} verdicts; "
      f"{len(missing)} of the matrix missing)", file=sys.stderr)
PYEOF
exec 8>&-   # release the merge lock before the (slow, sparse) temporary tree is removed
