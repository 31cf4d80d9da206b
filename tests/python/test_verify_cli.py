"""`fp4moe verify` on small DeepSeek-V4-style checkpoints (written with the safetensors package),
before and after `fp4moe convert`, and on checkpoints that must fail."""
import json
import os
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fp4moe
from st_io import load, save

FP4MOE = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"
F32 = np.float32


def mx(rng, rows, cols, std=0.05):
    packed, scales = fp4moe.quantize_mxfp4((rng.standard_normal((rows, cols)) * std).astype(F32))
    return packed.view(np.int8), scales.view(ml_dtypes.float8_e8m0fnu)


def fp8_block(rng, rows, cols, std=0.05):
    q, scales = fp4moe.quantize_fp8_block128((rng.standard_normal((rows, cols)) * std).astype(F32), ue8m0=True)
    return q.view(ml_dtypes.float8_e4m3fn), scales.view(ml_dtypes.float8_e8m0fnu)


def make_dsv4(path: Path, rng, layers=2, experts=8, top_k=3, hidden=256, inter=128):
    t = {}
    for layer in range(layers):
        p = f"layers.{layer}.ffn."
        for e in range(experts):
            for w, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
                t[f"{p}experts.{e}.{w}.weight"], t[f"{p}experts.{e}.{w}.scale"] = mx(rng, *shape)
        for w, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
            t[f"{p}shared_experts.{w}.weight"], t[f"{p}shared_experts.{w}.scale"] = fp8_block(rng, *shape)
        t[f"{p}gate.weight"] = (rng.standard_normal((experts, hidden)) * 0.1).astype(ml_dtypes.bfloat16)
        t[f"{p}gate.bias"] = (rng.standard_normal(experts) * 0.01).astype(F32)
    path.mkdir()
    save(t, path / "model.safetensors")
    config = {"model_type": "deepseek_v4", "expert_dtype": "fp4", "hidden_size": hidden,
              "moe_intermediate_size": inter, "n_routed_experts": experts, "num_experts_per_tok": top_k,
              "n_shared_experts": 1, "num_hidden_layers": layers, "num_hash_layers": 0,
              "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
              "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
              "quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0", "fmt": "e4m3",
                                      "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}
    (path / "config.json").write_text(json.dumps(config))
    return t


def run(*args):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_verify_mxfp4_then_converted_nvfp4(tmp_path, rng):
    make_dsv4(tmp_path / "mx", rng)
    before = run("verify", tmp_path / "mx", "--tokens", "5", "--json")
    assert before.returncode == 0, before.stderr
    report = json.loads(before.stdout)
    assert report["ok"] and [l["layer"] for l in report["layers"]] == [0, 1]
    assert all(l["expert_scheme"] == "mxfp4" and l["shared_scheme"] == "fp8_block" for l in report["layers"])
    assert all(l["rel_l2_error"] < 1e-4 for l in report["layers"])
    assert run("convert", tmp_path / "mx", tmp_path / "nv").returncode == 0
    after = json.loads(run("verify", tmp_path / "nv", "--tokens", "5", "--json").stdout)
    assert after["ok"] and all(l["expert_scheme"] == "nvfp4" for l in after["layers"])


def test_verify_every_isa_and_layer_selection(tmp_path, rng):
    make_dsv4(tmp_path / "mx", rng, layers=3)
    out = run("verify", tmp_path / "mx", "--layers", "2", "--isa", "scalar", "--json")
    assert out.returncode == 0, out.stderr
    assert [l["layer"] for l in json.loads(out.stdout)["layers"]] == [2]
    bad_layer = run("verify", tmp_path / "mx", "--layers", "7")
    assert bad_layer.returncode == 1 and "layer 7" in bad_layer.stderr


def test_verify_bad_input(tmp_path, rng):
    missing = run("verify", tmp_path / "nothing")
    assert missing.returncode == 1 and "nothing" in missing.stderr
    make_dsv4(tmp_path / "mx", rng, layers=1)
    cfg = json.loads((tmp_path / "mx" / "config.json").read_text())
    cfg["scoring_func"] = "cosine"
    (tmp_path / "mx" / "config.json").write_text(json.dumps(cfg))
    unknown = run("verify", tmp_path / "mx")
    assert unknown.returncode == 1 and "scoring_func" in unknown.stderr


def test_bench_on_a_checkpoints_own_layers(tmp_path, rng):
    make_dsv4(tmp_path / "mx", rng, layers=2)
    proc = run("bench", "--checkpoint", tmp_path / "mx", "--layers", "1", "--seconds", "0.05", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (layer,) = result["layers"]
    assert layer["layer"] == 1 and layer["expert_scheme"] == "mxfp4" and layer["calls"] >= 8
    assert layer["bandwidth_gbps"] > 0 and layer["bytes_per_call"] > 0
    assert layer["ratio_to_bound"] == pytest.approx(layer["us"] / layer["bound_us"])
    assert layer["precision"] == "w4a16"
    w4a8 = run("bench", "--checkpoint", tmp_path / "mx", "--layers", "0", "--seconds", "0.05", "--json",
               "--precision", "w4a8")
    assert w4a8.returncode == 0, w4a8.stderr
    (layer,) = json.loads(w4a8.stdout)["layers"]
    assert layer["precision"] == "w4a8" and layer["calls"] >= 8 and layer["us"] > 0
    both = run("bench", "--checkpoint", tmp_path / "mx", "--gemv")
    assert both.returncode == 2 and "exactly one" in both.stderr
    missing = run("bench", "--checkpoint", tmp_path / "nothing")
    assert missing.returncode == 1 and "nothing" in missing.stderr
