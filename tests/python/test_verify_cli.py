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
from conftest import SYNTH_SCHEMES, quantized_synth_layouts
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


# The nested levels, lowest first (kernels/types.h).
ISAS = ("scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_int8")
# The level whose kernel an exact (W4A16) plan runs when asked for each ISA: every exact family has
# kernels up to avx512 and none for avx512_vnni, avx512_bf16 or amx_int8, so those step down
# (kernels/kernel_list.inc).
EXACT_LEVEL = {"scalar": "scalar", "avx2": "avx2", "avx512": "avx512", "avx512_vnni": "avx512",
               "avx512_bf16": "avx512", "amx_int8": "avx512"}
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
    assert bad_layer.returncode == 2 and "layer 7" in bad_layer.stderr  # bad input


def test_verify_bad_input(tmp_path, rng):
    missing = run("verify", tmp_path / "nothing")
    assert missing.returncode == 2 and "nothing" in missing.stderr
    make_dsv4(tmp_path / "mx", rng, layers=1)
    cfg = json.loads((tmp_path / "mx" / "config.json").read_text())
    cfg["scoring_func"] = "cosine"
    (tmp_path / "mx" / "config.json").write_text(json.dumps(cfg))
    unknown = run("verify", tmp_path / "mx")
    assert unknown.returncode == 2 and "scoring_func" in unknown.stderr


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
    assert missing.returncode == 2 and "nothing" in missing.stderr


# ---- Every family and layout: the synthetic layouts of `fp4moe synth` and MiniMax-M2 ----------

ROOT = Path(__file__).resolve().parents[2]
CORRUPT = {"FP4MOE_TEST_CORRUPT_KERNEL_WEIGHTS": "1"}


def run_env(env, *args):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def checked_report(proc):
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    for layer in report["layers"]:
        print(f"  layer {layer['layer']}: {layer['expert_scheme']}/{layer['shared_scheme']} rel L2 "
              f"{layer['rel_l2_error']:.3e}, ties {layer['routing_ties']}, ok {layer['ok']}")
    return report


@pytest.mark.parametrize("layout", quantized_synth_layouts())
def test_verify_every_synth_layout_and_a_corrupted_kernel_weight_fails(layout, synth_dir):
    d = synth_dir(layout)
    good = run("verify", d, "--tokens", 3, "--json")
    assert good.returncode == 0, good.stderr
    report = checked_report(good)
    assert report["ok"] and report["layers"], report
    for layer in report["layers"]:
        assert (layer["expert_scheme"], layer["shared_scheme"]) == SYNTH_SCHEMES[layout], layer
        assert layer["rel_l2_error"] < 1e-4 and layer["routing_mismatches"] == 0, layer
        assert layer["max_abs_reference"] > 0, layer
    kernels = report["layers"][0]["kernels"]
    if layout == "gpt-oss-mxfp4":
        assert "softmax over the top-k logits" in kernels and "swiglu-oai" in kernels, kernels
        assert "clamp 7" in kernels, kernels
    # The same checkpoint with the kernel path's weights corrupted (the reference reads the file):
    # verify must fail, so the passing run above means something.
    bad = run_env(CORRUPT, "verify", d, "--tokens", 3, "--json")
    assert bad.returncode == 1, bad.stderr
    report = checked_report(bad)
    assert not report["ok"]
    assert all(not layer["ok"] for layer in report["layers"]), report


def test_verify_bf16_experts_say_why_in_one_sentence(synth_dir):
    out = run("verify", synth_dir("bf16"), "--json")
    assert out.returncode == 1, out.stderr  # no kernel on the path
    message = out.stderr.strip()
    assert "BF16 (not quantized)" in message and "MXFP4, NVFP4 and FP8 block-128" in message, message
    assert "no tensor" not in message and len(message.splitlines()) == 1, message
    assert json.loads(out.stdout)["error"]["kind"] == "failed"


def minimax_config(nvfp4, hidden, inter, experts, layers):
    corpus = ROOT / "tests" / "data" / "corpus"
    name = "nvidia__MiniMax-M2.5-NVFP4" if nvfp4 else "MiniMaxAI__MiniMax-M2.5"
    config = json.loads((corpus / name / "config.json").read_text())
    config.update(hidden_size=hidden, intermediate_size=inter, num_local_experts=experts,
                  num_hidden_layers=layers)
    return config


def make_minimax(path: Path, rng, nvfp4, layers=2, experts=16, hidden=256, inter=128):
    """MiniMax-M2.5 as released (FP8 128x128 blocks, F32 weight_scale_inv) or as NVIDIA's ModelOpt
    NVFP4 export, in the real names: model.layers.L.block_sparse_moe.{gate, e_score_correction_bias,
    experts.E.w1/w2/w3}; sigmoid scoring, selection bias, top-8, renormalized, no shared expert."""
    t = {}
    for layer in range(layers):
        p = f"model.layers.{layer}.block_sparse_moe."
        t[p + "gate.weight"] = (rng.standard_normal((experts, hidden)) * 0.1).astype(ml_dtypes.bfloat16)
        t[p + "e_score_correction_bias"] = (rng.standard_normal(experts) * 0.05).astype(F32)
        for e in range(experts):
            for w, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
                x = (rng.standard_normal(shape) * 0.05).astype(F32)
                m = f"{p}experts.{e}.{w}."
                if nvfp4:
                    packed, scales, ts = fp4moe.quantize_nvfp4(x)
                    t[m + "weight"] = packed
                    t[m + "weight_scale"] = scales.view(ml_dtypes.float8_e4m3fn)
                    t[m + "weight_scale_2"] = np.array(ts, F32)
                    t[m + "input_scale"] = np.array(16 / (6 * 448), F32)
                else:
                    q, scales = fp4moe.quantize_fp8_block128(x)
                    t[m + "weight"] = q.view(ml_dtypes.float8_e4m3fn)
                    t[m + "weight_scale_inv"] = scales
    path.mkdir()
    save(t, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(minimax_config(nvfp4, hidden, inter, experts, layers)))


@pytest.mark.parametrize("nvfp4", [False, True], ids=["fp8", "nvfp4"])
def test_verify_minimax(tmp_path, rng, nvfp4):
    make_minimax(tmp_path / "mm", rng, nvfp4)
    out = run("verify", tmp_path / "mm", "--tokens", 5, "--json")
    assert out.returncode == 0, out.stderr
    report = checked_report(out)
    assert [l["layer"] for l in report["layers"]] == [0, 1]
    scheme = "nvfp4" if nvfp4 else "fp8_block"
    for layer in report["layers"]:
        assert layer["ok"] and layer["expert_scheme"] == scheme and layer["shared_scheme"] == "none"
        assert "sigmoid top-8 of 16, renormalized" in layer["kernels"], layer["kernels"]
    bad = run_env(CORRUPT, "verify", tmp_path / "mm", "--tokens", 5, "--json")
    assert bad.returncode == 1 and not json.loads(bad.stdout)["ok"], bad.stderr


def test_verify_an_unknown_family_names_it_in_one_sentence(tmp_path, rng):
    d = tmp_path / "nemotron"
    d.mkdir()
    t = {"backbone.layers.1.mixer.experts.0.up_proj.weight": np.zeros((64, 32), np.uint8),
         "backbone.layers.1.mixer.gate.weight": np.zeros((4, 64), ml_dtypes.bfloat16)}
    save(t, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "nemotron_h", "hidden_size": 64,
                                               "num_hidden_layers": 2, "n_routed_experts": 4,
                                               "num_experts_per_tok": 2}))
    for args in (("verify", d), ("bench", "--checkpoint", d, "--seconds", 0.01)):
        out = run(*args)
        assert out.returncode == 2, out.stderr
        message = out.stderr.strip()
        assert "model_type 'nemotron_h'" in message and "block_sparse_moe" in message, message
        assert "no tensor" not in message and len(message.splitlines()) == 1, message


def quantized(rng, fmt, shape, m, t):
    """One linear `m` ("...gate_proj.") of random weights in `fmt`, written into t."""
    x = (rng.standard_normal(shape) * 0.05).astype(F32)
    if fmt == "nvfp4":
        packed, scales, ts = fp4moe.quantize_nvfp4(x)
        t[m + "weight"], t[m + "weight_scale"] = packed, scales.view(ml_dtypes.float8_e4m3fn)
        t[m + "weight_scale_2"] = np.array(ts, F32)
    else:
        q, scales = fp4moe.quantize_fp8_block128(x)
        t[m + "weight"], t[m + "weight_scale_inv"] = q.view(ml_dtypes.float8_e4m3fn), scales


def make_v3_family(path: Path, rng, corpus_dir, fmt, prefix="", experts=16, hidden=256, inter=128):
    """A DeepSeek-V3-named checkpoint from a real config of the family (Kimi-K2.5 keeps it under
    text_config and its tensors under language_model.): one dense layer, then one MoE layer with
    sigmoid scoring, a selection bias, top-8 and one shared expert."""
    config = json.loads((ROOT / "tests" / "data" / "corpus" / corpus_dir / "config.json").read_text())
    text = config.get("text_config", config)
    text.update(hidden_size=hidden, moe_intermediate_size=inter, n_routed_experts=experts,
                num_hidden_layers=2, first_k_dense_replace=1, n_shared_experts=1, n_group=1,
                topk_group=1)
    t = {}
    p = f"{prefix}model.layers.1.mlp."
    t[p + "gate.weight"] = (rng.standard_normal((experts, hidden)) * 0.1).astype(ml_dtypes.bfloat16)
    t[p + "gate.e_score_correction_bias"] = (rng.standard_normal(experts) * 0.05).astype(F32)
    for e in [f"experts.{e}." for e in range(experts)] + ["shared_experts."]:
        for w, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                         ("down_proj", (hidden, inter))):
            quantized(rng, fmt, shape, f"{p}{e}{w}.", t)
    path.mkdir()
    save(t, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config))
    return text


@pytest.mark.parametrize("corpus_dir,fmt,prefix", [
    ("nvidia__Kimi-K2.5-NVFP4", "nvfp4", "language_model."),  # VLM wrapper, text_config
    ("zai-org__GLM-5-FP8", "fp8_block", ""),
    ("moonshotai__Kimi-K2-Instruct", "fp8_block", ""),
])
def test_verify_kimi_and_glm_share_the_v3_names(tmp_path, rng, corpus_dir, fmt, prefix):
    text = make_v3_family(tmp_path / "m", rng, corpus_dir, fmt, prefix)
    out = run("verify", tmp_path / "m", "--tokens", 5, "--json")
    assert out.returncode == 0, out.stderr
    (layer,) = checked_report(out)["layers"]
    assert layer["layer"] == 1 and layer["ok"], layer
    assert (layer["expert_scheme"], layer["shared_scheme"]) == (fmt, fmt), layer
    scale = f"x{text['routed_scaling_factor']:.6f}"
    assert "sigmoid top-8 of 16, renormalized" in layer["kernels"] and scale in layer["kernels"], layer
    bench = run("bench", "--checkpoint", tmp_path / "m", "--seconds", 0.02, "--json")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["layers"][0]["expert_scheme"] == fmt
