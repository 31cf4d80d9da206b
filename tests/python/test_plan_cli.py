"""`fp4moe plan`: routing per target on real corpus configs and synthetic checkpoints, the roofline
arithmetic, the HTML page, and bad input."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus"
FP4MOE = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"


def run(*args):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True, timeout=300)


def plan_json(path, target):
    proc = run("plan", path, "--target", target, "--json")
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)


def routed(plan):
    return [m for m in plan["modules"] if m["role"] == "routed_experts"]


# The DeepSeek-V4 layouts `synth` writes have one routed-expert group per projection (w1, w2, w3).
DSV4_ROUTED_GROUPS = ["layers.*.ffn.experts.*.w1", "layers.*.ffn.experts.*.w2",
                      "layers.*.ffn.experts.*.w3"]


@pytest.mark.parametrize("target,path", [("sm_120", "CUDA cores only"), ("sm_100", "native FP4 tensor cores"),
                                         ("sm_90", "W4A16 tensor cores (Marlin-class)")])
def test_stock_dsv4_mxfp4_routes(target, path):
    proc, plan = plan_json(CORPUS / "deepseek-ai__DeepSeek-V4-Flash", target)
    assert proc.returncode == 0, proc.stderr
    assert {m["path"] for m in routed(plan)} == {path}
    codes = {f["code"] for f in plan["findings"]}
    assert ("slow_path" in codes) == (target == "sm_120")


@pytest.mark.parametrize("target,path", [("sm_120", "native FP4 tensor cores"), ("sm_100", "native FP4 tensor cores"),
                                         ("sm_90", "W4A16 tensor cores (Marlin-class)"),
                                         ("sm_80", "W4A16 tensor cores (Marlin-class)")])
def test_nvidia_dsv4_nvfp4_routes(target, path):
    proc, plan = plan_json(CORPUS / "nvidia__DeepSeek-V4-Flash-NVFP4", target)
    assert proc.returncode == 0
    assert {m["path"] for m in routed(plan)} == {path}
    # MTP experts stay MXFP4 (ignored by the NVFP4 section) and must not get the NVFP4 kernel.
    mtp = [m for m in plan["modules"] if m["role"] == "mtp_experts"]
    assert mtp and all(m["scheme"] == "mxfp4" and "NVFP4" not in m["kernel"] for m in mtp)
    fp8 = [m for m in plan["modules"] if m["role"] == "attention"]
    assert fp8 and all(m["path"] == ("W8A16 tensor cores" if target == "sm_80" else "FP8 tensor cores") for m in fp8)


def test_roofline_arithmetic_on_a_synthetic_checkpoint(tmp_path):
    assert run("synth", "dsv4-nvfp4", tmp_path / "c", "--layers", "1", "--experts", "8").returncode == 0
    proc, plan = plan_json(tmp_path / "c", "sm_100")
    assert proc.returncode == 0
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    manifest = json.loads(run("inspect", tmp_path / "c", "--json").stdout)
    assert sorted(m["name"] for m in routed(plan)) == DSV4_ROUTED_GROUPS
    for m in routed(plan):
        group = next(g for g in manifest["modules"] if g["name"] == m["name"])
        expected = group["bytes"] * config["num_experts_per_tok"] / config["n_routed_experts"]
        assert m["bytes_per_token"] == pytest.approx(expected)
        # Memory-bound at batch 1: bytes over the B200's 8000 GB/s.
        assert m["time_us"] == pytest.approx(expected / 8000e9 * 1e6)
    assert plan["bytes_per_token"] == pytest.approx(
        sum(m["bytes_per_token"] for m in plan["modules"] if not m["role"].startswith("mtp")))


def test_cpu_names_this_hosts_kernels(tmp_path):
    assert run("synth", "dsv4-mxfp4", tmp_path / "c", "--layers", "1", "--experts", "6").returncode == 0
    proc, plan = plan_json(tmp_path / "c", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert plan["device"]["memory_gbps"] > 0
    assert sorted(m["name"] for m in routed(plan)) == DSV4_ROUTED_GROUPS
    assert all(m["path"] == "CPU SIMD" and "mxfp4" in m["kernel"] for m in routed(plan))
    shared = [m for m in plan["modules"] if m["role"] == "shared_experts"]
    assert shared and all("fp8" in m["kernel"] for m in shared)


def test_scheme_without_kernel_is_an_error(tmp_path):
    assert run("synth", "bf16", tmp_path / "c", "--layers", "1", "--experts", "4").returncode == 0
    proc, plan = plan_json(tmp_path / "c", "cpu")
    assert proc.returncode == 1
    assert any(f["code"] == "no_kernel" and f["severity"] == "error" for f in plan["findings"])


def test_html_is_self_contained(tmp_path):
    page = tmp_path / "plan.html"
    proc = run("plan", CORPUS / "deepseek-ai__DeepSeek-V4-Flash", "--target", "sm_120", "--html", page)
    assert proc.returncode == 0
    html = page.read_text()
    assert "<svg" in html and "sm_120" in html and "sm_90" in html
    for banned in ("<script", "src=", "href=", "@import", "url("):
        assert banned not in html


def test_bad_input():
    unknown = run("plan", CORPUS / "deepseek-ai__DeepSeek-V4-Flash", "--target", "sm_75")
    assert unknown.returncode == 2 and "unknown target 'sm_75'" in unknown.stderr
    missing = run("plan", CORPUS / "no-such-model", "--target", "sm_90")
    assert missing.returncode == 1 and "no-such-model" in missing.stderr
