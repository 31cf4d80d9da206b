"""`fp4moe doctor`: finds an engine (a git checkout, site-packages, an interpreter), reads its
source markers and history, runs its own config resolution in a subprocess with a timeout, and
says what it will do with the checkpoint. Fake engines are built here; a real one is used when
FP4MOE_ENGINE_SGLANG_PY / FP4MOE_ENGINE_VLLM_PY name an engine venv's python
(scripts/engines/env.sh), and must agree with tests/engines/verdicts.json."""
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FP4MOE = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"

MODEL_CONFIG_WITH_PR = '''class ModelConfig:
    def __init__(self, qc):
        self.nvfp4_moe_meta = None
        if str(qc.get("moe_quant_algo", "")).upper() == "NVFP4":
            self.nvfp4_moe_meta = {}
'''


def run(*args, timeout=120):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


def tree_digest(path):
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        if ".git" in p.parts:
            continue
        h.update(str(p.relative_to(path)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def write_sglang(root, with_pr):
    """An SGLang package under root/sglang with (or without) PR #25820's source markers."""
    pkg = root / "sglang"
    (pkg / "srt" / "configs").mkdir(parents=True)
    (pkg / "srt" / "layers" / "quantization").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "configs" / "deepseek_v4.py").write_text("def try_detect_fp4_experts(path):\n    pass\n")
    (pkg / "srt" / "configs" / "model_config.py").write_text(
        MODEL_CONFIG_WITH_PR if with_pr else "class ModelConfig:\n    pass\n")
    (pkg / "srt" / "layers" / "quantization" / "modelopt_quant.py").write_text(
        "class HybridFp8NvFp4Config:\n    pass\n" if with_pr else "# no hybrid here\n")


@pytest.fixture(scope="module")
def ckpt(module_tmp):
    d = module_tmp("d") / "nvfp4"
    assert run("synth", "dsv4-nvfp4", d, "--layers", "1", "--experts", "4").returncode == 0
    return d


@pytest.fixture(scope="module")
def checkouts(module_tmp):
    """Two SGLang checkouts tagged v0.5.13.post1: one without PR #25820, one with it backported."""
    base = module_tmp("git")
    out = {}
    for name, with_pr in (("without", False), ("with", True)):
        repo = base / name
        (repo / "python").mkdir(parents=True)
        write_sglang(repo / "python", False)
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "Release v0.5.13.post1")
        git(repo, "tag", "v0.5.13.post1")
        if with_pr:
            write_sglang(repo / "python2", True)
            for f in ("srt/configs/model_config.py", "srt/layers/quantization/modelopt_quant.py"):
                (repo / "python" / "sglang" / f).write_text((repo / "python2" / "sglang" / f).read_text())
            subprocess.run(["rm", "-rf", str(repo / "python2")], check=True)
            git(repo, "commit", "-qam", "[NVIDIA] Support NVFP4 MoE for DeepSeek-V4 (#25820)")
        else:
            (repo / "README.md").write_text("x\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", "docs: readme")
        out[name] = repo
    return out


def doctor_json(*args):
    proc = run("doctor", *args, "--json")
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)


def test_checkout_without_pr_25820_is_wrong_and_fast(ckpt, checkouts):
    before = tree_digest(checkouts["without"]), tree_digest(ckpt)
    t0 = time.monotonic()
    proc, doc = doctor_json(ckpt, "--engine", checkouts["without"])
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 1.0 or os.environ.get("FP4MOE_SLOW_HOST"), elapsed
    (e,) = doc["engines"]
    assert e["engine"] == "sglang" and e["kind"] == "git checkout" and e["version"] == "0.5.13.post1"
    pr = next(p for p in e["prs"] if p["id"] == "25820")
    assert pr["present"] is False and "no commit" in pr["evidence"]
    markers = {m["id"]: m for m in e["markers"]}
    assert not markers["nvfp4_moe_meta"]["present"] and markers["dsv4_expert_probe"]["line"] == 1
    routed = [m for m in e["modules"] if m["role"] == "routed_experts"]
    assert routed and all(m["outcome"] == "wrong" and m["method"] == "Fp8MoEMethod" for m in routed)
    assert any("#25820" in f for m in routed for f in m["fixes"])
    assert doc["verdict"] == "wrong"
    assert (tree_digest(checkouts["without"]), tree_digest(ckpt)) == before  # nothing modified
    text = run("doctor", ckpt, "--engine", checkouts["without"]).stdout
    assert "NOT in this engine" in text and "WRONG" in text


def test_checkout_with_pr_25820_backported(ckpt, checkouts):
    proc, doc = doctor_json(ckpt, "--engine", checkouts["with"])
    assert proc.returncode == 0, proc.stdout
    (e,) = doc["engines"]
    pr = next(p for p in e["prs"] if p["id"] == "25820")
    assert pr["present"] is True and "#25820" in pr["evidence"]
    assert any("backport" in n for n in e["notes"])
    markers = {m["id"]: m for m in e["markers"]}
    assert markers["nvfp4_moe_meta"]["present"] and markers["nvfp4_moe_meta"]["line"] > 0
    routed = [m for m in e["modules"] if m["role"] == "routed_experts"]
    assert all(m["method"] == "ModelOptNvFp4FusedMoEMethod" and m["outcome"] == "ok" for m in routed)


def test_site_packages_version_from_dist_info(ckpt, tmp_path):
    site = tmp_path / "site-packages"
    write_sglang(site, True)
    info = site / "sglang-0.5.14.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.14\n")
    proc, doc = doctor_json(ckpt, "--engine", site)
    assert proc.returncode == 0, proc.stdout
    (e,) = doc["engines"]
    assert e["kind"] == "site-packages" and e["version"] == "0.5.14"
    assert "dist-info/METADATA" in e["version_source"]
    # The package directory itself works too.
    proc, doc = doctor_json(ckpt, "--engine", site / "sglang")
    assert doc["engines"][0]["version"] == "0.5.14"


def sglang_site(tmp_path, version="0.5.14"):
    site = tmp_path / "site-packages"
    write_sglang(site, True)
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Name: sglang\nVersion: {version}\n")
    return site


def test_target_names_the_kernel_per_architecture(ckpt, tmp_path):
    """--target / --gpu (plan's table and parsing): the rules' backend for that architecture."""
    site = sglang_site(tmp_path)
    # No target: said, and no kernel is named.
    proc, doc = doctor_json(ckpt, "--engine", site)
    assert doc["target"]["name"] is None and doc["target"]["from"].startswith("none")
    assert all(m["kernel"] is None for m in doc["engines"][0]["modules"])
    assert "target: none" in run("doctor", ckpt, "--engine", site).stdout
    # sm_100 (B200 by default): SGLang 0.5.14 runs NVIDIA's NVFP4 experts on the TRT-LLM-gen
    # routed kernel (native FP4), the MTP experts on the SM100-only MXFP4 kernel: all right.
    proc, doc = doctor_json(ckpt, "--engine", site, "--target", "sm_100")
    assert proc.returncode == 0, proc.stdout
    assert doc["target"] == {"name": "sm_100", "from": "--target sm_100", "gpu": "B200", "gpu_count": 1}
    (e,) = doc["engines"]
    routed = [m for m in e["modules"] if m["role"] == "routed_experts"]
    assert routed and all(m["kernel"]["backend"] == "sglang.moe.nvfp4.trtllm_routed.sm100" and
                          m["kernel"]["path"] == "native FP4 tensor cores" for m in routed)
    assert all(any(a["flags"] == "--moe-runner-backend marlin" for a in m["alternatives"]) for m in routed)
    mtp = [m for m in e["modules"] if m["role"] == "mtp_experts"]
    assert mtp and all(m["outcome"] == "ok" and m["kernel"]["backend"] == "sglang.moe.mxfp4_hybrid_mtp"
                       for m in mtp)
    # sm_120 (an RTX PRO 6000 pair): 0.5.14 keeps DeepSeek-V4's SM120 auto -> Marlin W4A16 for the
    # routed experts, and the MTP experts' kernel does not run there: exit 1 with the fix.
    proc, doc = doctor_json(ckpt, "--engine", site, "--gpu", "RTX PRO 6000x2")
    assert proc.returncode == 1, proc.stdout
    assert doc["target"]["name"] == "sm_120" and doc["target"]["gpu_count"] == 2
    assert doc["target"]["from"] == "--gpu RTX PRO 6000x2 (sm_120)"
    (e,) = doc["engines"]
    routed = [m for m in e["modules"] if m["role"] == "routed_experts"]
    assert all(m["kernel"]["backend"] == "sglang.moe.nvfp4.sm120_auto_marlin" and
               m["kernel"]["path"] == "W4A16 tensor cores (Marlin-class)" for m in routed)
    mtp = [m for m in e["modules"] if m["role"] == "mtp_experts"]
    assert mtp and all(m["outcome"] == "fails" and "runs only on sm_100" in m["why"] for m in mtp)
    assert any("#40173" in f for m in mtp for f in m["fixes"])
    text = run("doctor", ckpt, "--engine", site, "--target", "sm_120").stdout
    assert "target: sm_120 from --target sm_120" in text and "kernel on sm_120: Marlin W4A16 NVFP4" in text
    # Bad input: plan's own messages, exit 2, before anything else is read.
    for args, message in ((("--target", "sm_75"), "unknown target 'sm_75'"),
                          (("--gpu", "V100"), "unknown GPU 'V100'"),
                          (("--gpu", "B200", "--target", "sm_120"), "--gpu B200 is sm_100, not --target sm_120"),
                          (("--target", "cpu"), "plan DIR --target cpu")):
        proc = run("doctor", ckpt, "--engine", site, *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


def test_vllm_before_pr_42209(ckpt, tmp_path):
    site = tmp_path / "site-packages"
    (site / "vllm" / "model_executor" / "models").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "model_executor" / "models" / "deepseek_v4.py").write_text("class DeepseekV4FP8Config:\n    pass\n")
    info = site / "vllm-0.21.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: vllm\nVersion: 0.21.0\n")
    proc, doc = doctor_json(ckpt, "--engine", site)
    assert proc.returncode == 1
    (e,) = doc["engines"]
    assert next(p for p in e["prs"] if p["id"] == "42209")["present"] is False
    routed = [m for m in e["modules"] if m["role"] == "routed_experts"]
    assert all(m["method"] == "Mxfp4MoEMethod" and m["outcome"] == "wrong" for m in routed)


def fake_interpreter(tmp_path, body):
    """A python whose `sglang` (and `torch`) run `body` on import; find_spec still locates them."""
    lib = tmp_path / "lib"
    for pkg in ("sglang", "torch"):
        (lib / pkg).mkdir(parents=True)
        (lib / pkg / "__init__.py").write_text(body)
    (lib / "sglang" / "srt" / "configs").mkdir(parents=True)
    (lib / "sglang" / "srt" / "configs" / "deepseek_v4.py").write_text("def try_detect_fp4_experts(p):\n    pass\n")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={lib} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    return py, lib


def test_engine_that_hangs_on_import(ckpt, tmp_path):
    py, lib = fake_interpreter(tmp_path, "import time\ntime.sleep(600)\n")
    before = tree_digest(lib), tree_digest(ckpt)
    t0 = time.monotonic()
    proc, doc = doctor_json(ckpt, "--python", py, "--timeout", "3")
    assert time.monotonic() - t0 < 30
    (e,) = doc["engines"]
    assert e["engine"] == "sglang"
    assert any(m["present"] for m in e["markers"])  # the marker evidence is still reported
    res = e["resolution"]
    assert res["ran"] and not res["ok"] and "SGLang hung" in res["error"]
    assert (tree_digest(lib), tree_digest(ckpt)) == before


def test_engine_that_crashes_on_import(ckpt, tmp_path):
    py, _ = fake_interpreter(tmp_path, "raise RuntimeError('no CUDA here')\n")
    proc, doc = doctor_json(ckpt, "--python", py, "--timeout", "60")
    res = doc["engines"][0]["resolution"]
    assert res["ran"] and not res["ok"] and "SGLang" in res["error"]
    assert "no CUDA here" in res["error"] or "RuntimeError" in res["error"]


def test_bad_input(ckpt, tmp_path):
    proc = run("doctor", ckpt, "--engine", tmp_path)
    assert proc.returncode == 2 and "not an SGLang, vLLM or TensorRT-LLM" in proc.stderr
    proc = run("doctor", ckpt, "--engine", tmp_path / "missing")
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    proc = run("doctor", ckpt, "--python", tmp_path / "no-python")
    assert proc.returncode == 2 and "cannot be run" in proc.stderr
    empty = tmp_path / "empty-python"
    empty.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} -I \"$@\"\n")
    empty.chmod(0o755)
    proc = run("doctor", ckpt, "--python", empty)
    assert proc.returncode == 2 and "imports none of" in proc.stderr
    proc = run("doctor", tmp_path / "no-ckpt", "--engine", tmp_path)
    assert proc.returncode == 2
    proc = run("doctor", ckpt, "--engine", tmp_path, "--python", sys.executable)
    assert proc.returncode == 2 and "not both" in proc.stderr


# ---- a real engine, when an engine venv is there ---------------------------------------------

REAL = [(e, os.environ.get(f"FP4MOE_ENGINE_{e.upper()}_PY")) for e in ("sglang", "vllm")]


@pytest.mark.parametrize("engine,py", REAL)
def test_real_engine_agrees_with_the_verdicts(engine, py, tmp_path):
    if not py:
        pytest.skip(f"FP4MOE_ENGINE_{engine.upper()}_PY is not set (scripts/engines/env.sh)")
    sys.path.insert(0, str(ROOT))
    from tests.engines import fixtures as fx  # noqa: E402
    ckpt = fx.materialize("nvidia-nvfp4", tmp_path / "nvidia-nvfp4")
    proc, doc = doctor_json(ckpt, "--python", py, "--timeout", "900")
    assert doc is not None, proc.stderr
    e = next(x for x in doc["engines"] if x["engine"] == engine)
    res = e["resolution"]
    assert res["ok"], res
    predicted = {m["role"]: m["method"] for m in e["modules"] if m["role"] == "routed_experts"}
    assert res["methods"]["routed_experts"] == predicted["routed_experts"], (res, predicted)
