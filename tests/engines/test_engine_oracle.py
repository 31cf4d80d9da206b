"""Engine-oracle tests: the engines' own config-resolution code decides, not our reading of it.

(a) tests/engines/verdicts.json (written by scripts/engines/refresh_verdicts.sh from real runs of
    the pinned SGLang and vLLM releases) is well-formed and covers the whole matrix.
(b) LIVE: the newest pinned SGLang and vLLM, installed in their cached venvs
    (FP4MOE_ENGINE_SGLANG_PY / FP4MOE_ENGINE_VLLM_PY, set by scripts/test.d/engines.sh), run
    src/engines/resolve.py on the fixtures and on the output of our own `fp4moe convert`, built
    now; every verdict must equal the recorded one for that version (verdicts.core()).

Runs in the project venv (.venv); the engines run in their own venvs through subprocesses.
The rules-table tests load the same verdicts through tests/engines/verdicts.py (load/lookup/core).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import fixtures as FX  # noqa: E402
import verdicts as V  # noqa: E402

RESOLVE_TIMEOUT = int(os.environ.get("FP4MOE_RESOLVE_TIMEOUT", "1500"))
ENGINE_PY_VARS = {"sglang": "FP4MOE_ENGINE_SGLANG_PY", "vllm": "FP4MOE_ENGINE_VLLM_PY"}


@pytest.fixture(scope="module")
def doc():
    assert V.VERDICTS.exists(), "tests/engines/verdicts.json missing: run scripts/engines/refresh_verdicts.sh"
    return V.load()


# ------------------------------------------------------------------ (a) recorded verdicts

def test_verdicts_cover_the_matrix(doc):
    have = set(doc["_index"])
    missing = [V.key(*m) for m in V.MATRIX if V.key(*m) not in have]
    assert not missing, f"{len(missing)} verdicts missing, e.g. {missing[:5]}"


def test_verdicts_are_well_formed(doc):
    assert doc["schema"] == 1
    for k in ("generated_utc", "environments", "fixtures", "verdicts", "matrix"):
        assert k in doc, k
    for name in V.FIXTURES:
        assert len(doc["fixtures"][name]["config_sha256"]) == 64
    for v in doc["verdicts"]:
        where = V.key(v["engine"], v["version"], v["fixture"], v["flags"], v["sm"])
        env = doc["environments"][f'{v["engine"]}@{v["version"]}']
        assert v["versions"] == env, where
        for k in ("python", "torch", "transformers", v["engine"]):
            assert env.get(k), (where, k)
        # The harness itself must not have failed; an engine error is a verdict and has a stage.
        assert (v.get("error") or {}).get("stage") != "harness", (where, v["error"])
        if v.get("error"):
            assert v["error"]["type"] and v["error"]["stage"], where
        else:
            assert v.get("quant_config_class"), where
            for part in ("routed", "mtp", "linear"):
                m = v[part]
                assert m["method_from"] in ("returned", "constructor", "none"), (where, part)
                if m["method_from"] == "constructor":
                    assert m["method"] and m.get("error"), (where, part)
        if v["engine"] == "sglang":
            assert v["sm_fake"] and v["sm_fake"]["sm"] == v["sm"], where


def test_verdicts_match_the_pinned_versions(doc):
    for e, versions in V.VERSIONS.items():
        for ver in versions:
            assert doc["environments"][f"{e}@{ver}"][e] == ver


def test_headline_verdicts(doc):
    """The facts issue 11 turns on, as recorded from the engines (guards against a refresh that
    silently records a broken harness)."""
    L = lambda *a: V.lookup(doc, *a)  # noqa: E731
    # SGLang before #25820 sends NVIDIA's NVFP4 experts to the MXFP4 expert method.
    old = L("sglang", "0.5.13.post1", "nvidia-nvfp4", {}, 100)
    assert old["quant_config_class"] == "Fp8Config" and old["routed"]["method"] != "ModelOptNvFp4FusedMoEMethod"
    for ver in ("0.5.14", V.newest("sglang")):
        new = L("sglang", ver, "nvidia-nvfp4", {}, 100)
        assert new["quant_config_class"] == "HybridFp8NvFp4Config"
        assert new["routed"]["method"] == "ModelOptNvFp4FusedMoEMethod"
    # vLLM before #42209 vs after.
    assert L("vllm", "0.21.0", "nvidia-nvfp4", {}, None)["routed"]["method"] == "Mxfp4MoEMethod"
    for ver in ("0.22.0", V.newest("vllm")):
        assert L("vllm", ver, "nvidia-nvfp4", {}, None)["routed"]["method"] == "ModelOptNvFp4FusedMoE"


# ------------------------------------------------------------------ (b) live, newest engines

def _engine_python(engine: str) -> str:
    var = ENGINE_PY_VARS[engine]
    py = os.environ.get(var)
    if not py:
        pytest.skip(f"{var} is not set: the live engine-oracle test needs the newest {engine} venv "
                    f"(scripts/test.d/engines.sh creates it with scripts/engines/env.sh and sets it)")
    assert Path(py).exists(), f"{var}={py} does not exist"
    return py


def _binary() -> Path:
    b = Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release")) / "fp4moe"
    assert b.exists(), f"fp4moe binary missing at {b} (set FP4MOE_BUILD_DIR)"
    return b


@pytest.fixture(scope="module")
def live_fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-fixtures")
    for name in FX.STATIC:
        FX.materialize(name, root / name)
    FX.converted_checkpoints(_binary(), root)
    return root


def run_resolver(py: str, engine: str, jobs: list, sm, tmp: Path) -> list:
    jf = tmp / f"jobs-{engine}-{sm}.json"
    jf.write_text(json.dumps(jobs))
    cmd = [py, str(HERE.parent.parent / "src" / "engines" / "resolve.py"), "--engine", engine, "--jobs", str(jf)]
    if sm is not None:
        cmd += ["--sm", str(sm)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT)
    assert p.returncode == 0, f"resolver failed ({p.returncode}): {p.stderr[-3000:]}"
    return json.loads(p.stdout)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_live_newest_engine_matches_recorded_verdicts(engine, doc, live_fixtures, tmp_path):
    py = _engine_python(engine)
    version = V.newest(engine)
    for name in V.CONVERTED:
        assert V.config_digest(live_fixtures / name) == doc["fixtures"][name]["config_sha256"], (
            f"fp4moe convert now writes a different config for {name} than the one the verdicts "
            "were recorded for; rerun scripts/engines/refresh_verdicts.sh (and review the "
            "engines' new verdicts)")
    for name in FX.STATIC:
        assert V.config_digest(live_fixtures / name) == doc["fixtures"][name]["config_sha256"], name
    jobs = [{"checkpoint": str(live_fixtures / f), "flags": fl}
            for f in V.FIXTURES for fl in V.FLAGS[engine]]
    mismatches = []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(V.SMS[engine])) as pool:  # one process per SM
        runs = list(pool.map(lambda sm: (sm, run_resolver(py, engine, jobs, sm, tmp_path)),
                             V.SMS[engine]))
    for sm, results in runs:
        for got in results:
            assert got["versions"][engine] == version, (
                f"{ENGINE_PY_VARS[engine]} runs {engine} {got['versions'][engine]}, "
                f"the verdicts' newest is {version}")
            want = V.lookup(doc, engine, version, got["checkpoint"], got["flags"], sm)
            assert want is not None, (got["checkpoint"], got["flags"], sm)
            if V.core(got) != V.core(want):
                mismatches.append({"key": V.key(engine, version, got["checkpoint"], got["flags"], sm),
                                   "recorded": V.core(want), "live": V.core(got)})
    assert not mismatches, json.dumps(mismatches, indent=1)


def test_rules_predict_every_recorded_verdict_including_our_converted_output(live_fixtures):
    """tests/engines/agreement.py over every fixture, the converted ones (built now by our own
    convert) included: the method class the rules predict equals the one the engine's code chose,
    for every pinned version and SM (tests/python/test_plan_cli.py does the static fixtures only)."""
    from agreement import rows  # noqa: E402 (tests/engines is on sys.path, above)

    table = rows(_binary(), {name: live_fixtures / name for name in V.FIXTURES})
    assert {r["checkpoint"] for r in table} >= set(V.CONVERTED), table
    bad = [r for r in table if not r["agree"] and not r["harness_gap"]]
    assert not bad, json.dumps(bad, indent=1)
