"""The rules against the engines: for every default-flag cell of the pinned matrix
(tests/engines/verdicts.py: MATRIX), the routed-expert method class that fp4moe's engine rules
predict (`fp4moe plan --engine E@V --target sm_NN --json` on the fixture) beside the one the
engine's own code chose (tests/engines/verdicts.json, recorded by
scripts/engines/refresh_verdicts.sh).

    python3 tests/engines/agreement.py --binary build/release/fp4moe [--converted] [--json]

prints one Markdown table (engine, version, checkpoint, SM, predicted, engine chose, agree);
--converted also builds the converted fixtures (our own `fp4moe convert` output, ~1 min). The
test tests/python/test_plan_cli.py::test_rules_predict_the_recorded_engine_verdicts asserts every
row agrees. Standard library only.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fixtures as fx  # noqa: E402
import verdicts as vd  # noqa: E402

# Where the harness (src/engines/resolve.py) and a served engine differ, the rule follows the
# served engine and the gap is named here; such rows are printed but not counted as disagreement.
HARNESS_GAPS = {
    ("vllm", "0.34.0", "nvidia-older-rev"):
        "resolve.py asks with the unmapped prefix; the DeepSeek-V4 model applies its WeightsMapper "
        "(layers. -> model.layers.) first, and then the routed experts get ModelOptNvFp4FusedMoE "
        "(../shared/ENGINES_RESEARCH.md 5.4, run with the mapper)",
}


def predicted_methods(binary: Path, ckpt: Path, engine: str, version: str, sm) -> set:
    target = f"sm_{sm}" if sm else "sm_100"
    proc = subprocess.run([str(binary), "plan", str(ckpt), "--target", target, "--engine",
                           f"{engine}@{version}", "--json"], capture_output=True, text=True,
                          timeout=300)
    doc = json.loads(proc.stdout)
    return {m["method"] for m in doc["plans"][0]["modules"] if m["role"] == "routed_experts"}


def rows(binary: Path, checkpoints: dict) -> list[dict]:
    """One row per default-flag matrix cell whose fixture is in `checkpoints` ({name: dir}) and
    whose engine got as far as choosing a method."""
    doc = vd.load()
    out = []
    for engine, version, fixture, flags, sm in vd.MATRIX:
        if flags or fixture not in checkpoints:
            continue
        v = vd.lookup(doc, engine, version, fixture, flags, sm)
        if v is None or not isinstance(v.get("routed"), dict) or (
                v.get("error") and not v.get("quant_config_class")):
            continue  # the engine did not get as far as choosing (recorded with its error)
        chose = v["routed"]["method"] or "None"
        predicted = predicted_methods(binary, checkpoints[fixture], engine, version, sm)
        gap = HARNESS_GAPS.get((engine, version, fixture))
        out.append({"engine": engine, "version": version, "checkpoint": fixture,
                    "sm": sm, "predicted": sorted(predicted), "engine_chose": chose,
                    "agree": predicted == {chose}, "harness_gap": gap})
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--converted", action="store_true",
                    help="also the converted fixtures (builds them with --binary)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fp4moe-agreement.") as tmp:
        tmp = Path(tmp)
        cks = {name: fx.materialize(name, tmp / name) for name in fx.STATIC}
        if a.converted:
            cks.update(fx.converted_checkpoints(a.binary, tmp))
        table = rows(a.binary, cks)
    if a.json:
        print(json.dumps(table, indent=1))
    else:
        print("| engine | version | checkpoint | SM | rules predict | engine's code chose | agree |")
        print("|---|---|---|---|---|---|---|")
        for r in table:
            agree = "yes" if r["agree"] else ("harness gap" if r["harness_gap"] else "**NO**")
            sm = f"sm_{r['sm']}" if r["sm"] else "any (UnspecifiedPlatform)"
            print(f"| {r['engine']} | {r['version']} | {r['checkpoint']} | {sm} | "
                  f"{', '.join(r['predicted'])} | {r['engine_chose']} | {agree} |")
    bad = [r for r in table if not r["agree"] and not r["harness_gap"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
