"""The corpus verdicts (tests/engines/corpus_verdicts.json, scripts/engines/corpus_verdicts.py):
well-formed, and LIVE: the newest pinned SGLang (SM faked 90, 100, 120) and vLLM re-run their own
config resolution on a few corpus directories and on `fp4moe convert`'s plain ModelOpt NVFP4 output
(corpus.LIVE), one process per engine and SM, and must choose what was recorded. The rules-table
side (every recorded corpus verdict predicted by `fp4moe plan`) is
tests/python/test_plan_cli.py::test_rules_predict_the_recorded_corpus_verdicts; here the converted
entries, built now, get the same check."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import corpus as C  # noqa: E402

ENGINE_PY_VARS = {"sglang": "FP4MOE_ENGINE_SGLANG_PY", "vllm": "FP4MOE_ENGINE_VLLM_PY"}


def _binary() -> Path:
    b = Path(os.environ.get("FP4MOE_BUILD_DIR", C.ROOT / "build" / "release")) / "fp4moe"
    assert b.exists(), f"fp4moe binary missing at {b} (set FP4MOE_BUILD_DIR)"
    return b


@pytest.fixture(scope="module")
def doc():
    assert C.CORPUS_VERDICTS.exists(), "run scripts/engines/corpus_verdicts.py"
    return C.load()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return C.build_converted(_binary(), tmp_path_factory.mktemp("corpus-converted"))


def test_corpus_verdicts_are_well_formed(doc):
    assert doc["schema"] == 1
    for engine, sms in C.SMS.items():
        assert len(doc["versions"][engine]) == 1
        for name in doc["checkpoints"]:
            for sm in sms:
                v = C.lookup(doc, engine, name, sm)
                assert v is not None, (engine, name, sm)
                assert v["version"] == doc["versions"][engine][0]
                assert (v["error"] or {}).get("stage") != "harness" or v["routed"] is None
    assert set(C.CONVERTED) <= set(doc["checkpoints"])
    assert set(C.LIVE) <= set(doc["checkpoints"])


def test_converted_configs_are_the_recorded_ones(doc, converted):
    for name, d in converted.items():
        assert C.config_digest(d) == doc["checkpoints"][name]["config_sha256"], (
            f"fp4moe convert now writes a different config for {name}: rerun "
            "scripts/engines/corpus_verdicts.py and review the engines' verdicts")


def test_rules_predict_the_converted_verdicts(doc, converted):
    bad = []
    for name, d in converted.items():
        for engine, sms in C.SMS.items():
            for sm in sms:
                v = C.lookup(doc, engine, name, sm)
                proc = subprocess.run(
                    [str(_binary()), "plan", str(d), "--engine", f"{engine}@{v['version']}",
                     "--target", f"sm_{sm}" if sm else "sm_100", "--json"],
                    capture_output=True, text=True, timeout=300)
                plan = json.loads(proc.stdout)["plans"][0]
                got = {m["method"] for m in plan["modules"] if m["role"] == "routed_experts"}
                if got != {v["routed"]}:
                    bad.append((engine, name, sm, sorted(got), v["routed"]))
    assert not bad, bad


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_live_newest_engine_matches_recorded_corpus_verdicts(engine, doc, converted, tmp_path):
    py = os.environ.get(ENGINE_PY_VARS[engine])
    if not py:
        pytest.skip(f"{ENGINE_PY_VARS[engine]} is not set (scripts/test.d/engines.sh sets it)")
    dirs = {n: (converted[n] if n in converted else C.CORPUS / n) for n in C.LIVE}
    by_dir = {Path(d).name: n for n, d in dirs.items()}
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"checkpoint": str(d), "flags": {}} for d in dirs.values()]))

    def run(sm):
        cmd = [py, str(C.ROOT / "src" / "engines" / "resolve.py"), "--engine", engine, "--jobs",
               str(jobs)] + (["--sm", str(sm)] if sm else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        return sm, json.loads(p.stdout)

    with ThreadPoolExecutor(max_workers=len(C.SMS[engine])) as pool:
        runs = list(pool.map(run, C.SMS[engine]))
    mismatches = []
    for sm, results in runs:
        for raw in results:
            got = C.entry(raw, by_dir[raw["checkpoint"]])
            assert got["version"] == doc["versions"][engine][0], got["version"]
            want = C.lookup(doc, engine, got["checkpoint"], sm)
            if C.core(got) != C.core(want):
                mismatches.append({"key": C.key(engine, got["checkpoint"], sm),
                                   "recorded": C.core(want), "live": C.core(got)})
    assert not mismatches, json.dumps(mismatches, indent=1)
