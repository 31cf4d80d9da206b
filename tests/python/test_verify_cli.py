"""`fp4moe verify` on small DeepSeek-V4-style checkpoints (written with the safetensors package),
before and after `fp4moe convert`, and on checkpoints that must fail."""
import json
import os
import re
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


ISAS = ("scalar", "avx2", "avx512", "avx512_vnni")  # the nested levels, lowest first (kernels/types.h)
# The level whose kernel an exact (W4A16) plan runs when asked for each ISA: every exact family has
# kernels up to avx512 and none for avx512_vnni, so that one steps down (kernels/kernel_list.inc).
EXACT_LEVEL = {"scalar": "scalar", "avx2": "avx2", "avx512": "avx512", "avx512_vnni": "avx512"}
# One plan in MoeLayer::describe(): "<format> [N=.., K=..] -> <kernel> (<isa>: <why>; host: ...)".
PLAN = re.compile(r"-> (\w+) \((\w+): ([^;]*)(?:; (no exact kernel for \w+, so \w+))?;")


def plans(layer_json):
    """(kernel, isa, why, step-down note) of each plan the layer describes: routed gate and down,
    shared gate."""
    found = PLAN.findall(layer_json["kernels"])
    assert len(found) == 3, layer_json["kernels"]
    return found


def test_verify_every_isa_and_layer_selection(tmp_path, rng):
    make_dsv4(tmp_path / "mx", rng, layers=3)
    kernels = {}  # ISA asked for -> the three plans' kernel names
    for isa in ISAS:
        out = run("verify", tmp_path / "mx", "--layers", "2", "--isa", isa, "--json")
        if out.returncode != 0:
            # The levels are nested: once the host lacks one, it lacks every one above it.
            assert "is not supported by this host" in out.stderr, (isa, out.stderr)
            continue
        assert list(kernels) == list(ISAS[:ISAS.index(isa)]), f"host runs {isa}, not all below it"
        report = json.loads(out.stdout)
        assert report["ok"] and [l["layer"] for l in report["layers"]] == [2]
        used = EXACT_LEVEL[isa]
        found = plans(report["layers"][0])
        for kernel, kernel_isa, why, step_down in found:
            assert kernel_isa == used and kernel.endswith("_" + used), (isa, kernel, kernel_isa)
            assert why == "requested by the caller", (isa, why)
            # describe() names the step down when the family has no kernel at the level asked for.
            assert step_down == ("" if used == isa else f"no exact kernel for {isa}, so {used}"), isa
        kernels[isa] = [k for k, _, _, _ in found]
    supported = list(kernels)
    assert supported[:1] == ["scalar"], "scalar must run on every host"
    # Without --isa: the host's best level, the same kernels as asking for it by name (unless
    # FP4MOE_ISA in the environment forces one).
    if not os.environ.get("FP4MOE_ISA"):
        best = run("verify", tmp_path / "mx", "--layers", "2", "--json")
        assert best.returncode == 0, best.stderr
        best_plans = plans(json.loads(best.stdout)["layers"][0])
        assert [k for k, _, _, _ in best_plans] == kernels[supported[-1]], (supported, best_plans)
        assert all(why == "best ISA of this host" for _, _, why, _ in best_plans), best_plans
    print(f"verify ran on {supported}")
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
