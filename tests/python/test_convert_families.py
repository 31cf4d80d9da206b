"""`fp4moe convert` for every model family it names from model/'s family table: gpt-oss's fused
MXFP4 experts (lossless), Qwen3-MoE and MiniMax-M2 from BF16 or FP8 block-128 (ModelOpt recipe),
compressed-tensors NVFP4 (re-labeled exactly), DeepSeek-V3 names (Kimi-K2, GLM-5) and V4.

Each output is checked four ways: `fp4moe verify` passes on it, an independent numpy/ml_dtypes
oracle dequantizes source and output from the files (read by the Python safetensors package) and
compares them, `fp4moe inspect --json` says nvfp4 for the routed experts with no error finding,
and `fp4moe check` exits 0. A family or layout convert cannot handle is refused in one sentence.
"""
import json
import os
import signal
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from st_io import save as save_file
from test_formats_oracle import oracle_nvfp4

BUILD = Path(os.environ["FP4MOE_BUILD_DIR"])
FP4MOE = BUILD / "fp4moe"
ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus"
F32 = np.float32
E2M1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
# The ModelOpt recipe keeps ~3 bits per element (E2M1 under an E4M3 block scale): the relative L2
# error of Gaussian weights is ~0.1; 0.2 leaves room for a small sample, a broken quantizer is ~1.
QUANTIZE_REL_L2_BOUND = 0.2


def run(*args, env=None):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def ok(*args):
    proc = run(*args)
    assert proc.returncode == 0, f"fp4moe {args} exited {proc.returncode}: {proc.stderr}"
    return proc


DTYPES = {"U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64, "F32": np.float32,
          "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
          "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def tensors(d: Path) -> dict:
    """Every tensor of a checkpoint directory, memory-mapped from the safetensors layout (8-byte
    header length, JSON header, data; read here, independent of fp4moe): the synthetic layouts'
    embeddings are GB-sized file holes, which a copying reader would load into memory."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        raw = np.memmap(f, dtype=np.uint8, mode="r")
        n = int.from_bytes(raw[:8].tobytes(), "little")
        header = json.loads(raw[8:8 + n].tobytes())
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = raw[8 + n + begin:8 + n + end].view(DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def unpack_e2m1(packed):
    packed = packed.view(np.uint8)
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2], vals[..., 1::2] = E2M1[packed & 0xF], E2M1[packed >> 4]
    return vals


def dequant_mxfp4(packed, scales):
    """OCP MX: e2m1(q) * 2^(s - 127), 32 elements per scale (FORMATS.md §2); any leading dims."""
    vals = unpack_e2m1(packed)
    s = np.ldexp(F32(1), scales.view(np.uint8).astype(np.int64) - 127).astype(F32)
    return (vals.reshape(*s.shape, 32) * s[..., None]).reshape(vals.shape)


def dequant_nvfp4(packed, block_scales, tensor_scale):
    """ModelOpt: e2m1(q) * float(e4m3 s) * weight_scale_2, 16 elements per scale, in float32."""
    vals = unpack_e2m1(packed)
    s = (block_scales.view(ml_dtypes.float8_e4m3fn).astype(F32) * F32(tensor_scale)).astype(F32)
    return (vals.reshape(*s.shape, 16) * s[..., None]).reshape(vals.shape)


def dequant_fp8_block(q, scale_inv):
    x = q.view(ml_dtypes.float8_e4m3fn).astype(F32)
    s = np.repeat(np.repeat(scale_inv.astype(F32), 128, 0), 128, 1)[: x.shape[0], : x.shape[1]]
    return (x * s).astype(F32)


def check_output(out: Path, tokens=3):
    """(a) verify, (c) inspect --json, (d) check on a converted checkpoint."""
    verify = run("verify", out, "--tokens", tokens, "--json")
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert report["ok"] and report["layers"], report
    for layer in report["layers"]:
        assert layer["expert_scheme"] == "nvfp4", layer
        assert layer["rel_l2_error"] < 1e-4 and layer["routing_mismatches"] == 0, layer
    inspect = ok("inspect", out, "--json")
    manifest = json.loads(inspect.stdout)
    errors = [f for f in manifest.get("findings", []) if f.get("severity") == "error"]
    assert not errors, errors
    # Nothing the conversion's own configs caused (a KV cache said in one file only).
    assert not [f for f in manifest["findings"] if f["code"] == "kv_cache_sidecar"], manifest["findings"]
    assert manifest["summary"]["routed_experts"] == "nvfp4", manifest["summary"]
    routed = [g for g in manifest["modules"] if g.get("role") == "routed_experts"]
    assert routed and all(g["scheme"] == "nvfp4" for g in routed), routed
    check = run("check", out)
    assert check.returncode == 0, check.stdout + check.stderr
    return manifest


def convert(src, dst, *extra):
    proc = ok("convert", src, dst, "--json", *extra)
    assert not list(dst.parent.glob(".*partial*")), "a partial directory was left"
    return json.loads(proc.stdout)


# ---- gpt-oss: fused MXFP4 [E, N, K/32, 16] -> ModelOpt's fused NVFP4 export, losslessly -------

def test_gpt_oss_fused_experts_transcode_losslessly(tmp_path, synth_dir):
    src = synth_dir("gpt-oss-mxfp4")
    dst = tmp_path / "nv"
    report = convert(src, dst)
    t, o = tensors(src), tensors(dst)
    config = json.loads((dst / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "NVFP4", qc
    hf = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "NVFP4" and hf["exclude_modules"] == qc["ignore"], hf
    assert "lm_head" in qc["ignore"] and "model.layers.0.mlp.router" in qc["ignore"], qc["ignore"]
    assert "model.layers.0.self_attn*" in qc["ignore"], qc["ignore"]
    assert not any("experts" in x for x in qc["ignore"]), qc["ignore"]
    fused = sorted(n[: -len("_blocks")] for n in t if n.endswith("_blocks"))
    assert fused and report["modules_transcoded_losslessly"] == len(fused), report
    assert report["report"]["blocks_requantized"] == 0, report["report"]
    for m in fused:
        blocks, scales = t[m + "_blocks"], t[m + "_scales"]
        e, n, kb, _ = blocks.shape
        assert m + "_blocks" not in o and m + "_scales" not in o
        # ModelOpt's fused export: U8 [E, N, K/2], F8_E4M3 [E, N, K/16], scalar F32 scales.
        assert o[m].dtype == np.uint8 and o[m].shape == (e, n, kb * 16)
        assert o[m + "_weight_scale"].dtype == ml_dtypes.float8_e4m3fn
        assert o[m + "_weight_scale"].shape == (e, n, kb * 2)
        assert o[m + "_weight_scale_2"].shape == () and o[m + "_input_scale"].shape == ()
        # (b) every element of every expert is the same number: the interleaved gate/up rows and
        # the nibbles are kept, only the scales are re-expressed (FORMATS.md §4).
        before = dequant_mxfp4(blocks.reshape(e, n, kb * 16), scales)
        after = dequant_nvfp4(o[m], o[m + "_weight_scale"], o[m + "_weight_scale_2"])
        assert np.array_equal(before, after), f"{m}: not lossless"
        assert np.array_equal(o[m], blocks.reshape(e, n, kb * 16)), f"{m}: nibbles changed"
        # Biases carried over unchanged.
        assert np.array_equal(o[m + "_bias"].view(np.uint8), t[m + "_bias"].view(np.uint8))
    for name in t:  # everything else is copied bit for bit
        if not (name.endswith("_blocks") or name.endswith("_scales")):
            assert np.array_equal(o[name].view(np.uint8), t[name].view(np.uint8)), name
    check_output(dst)
    bench = ok("bench", "--checkpoint", dst, "--seconds", "0.01", "--json")
    assert json.loads(bench.stdout), bench.stdout


def test_a_module_left_quantized_is_refused_in_one_sentence(tmp_path, synth_dir):
    """The plain ModelOpt form can only call what it does not convert unquantized: gpt-oss's
    down_proj left MXFP4 would be read as BF16, so convert refuses before writing anything."""
    out = run("convert", synth_dir("gpt-oss-mxfp4"), tmp_path / "nv", "--modules",
              "model.layers.*.mlp.experts.gate_up_proj")
    assert out.returncode == 2, out.stderr
    message = out.stderr.strip()
    assert "down_proj_blocks" in message and "stays quantized" in message, message
    assert "--modules" in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "nv").exists()


def test_gpt_oss_conversion_interrupted_leaves_nothing(tmp_path, synth_dir):
    """The staged output and the interrupt handling hold for the fused layout too: SIGINT
    after a few source tensors (the test hook, no sleeps) exits 130 and leaves no output and no
    partial directory."""
    from test_convert_cli import partials, start_paused
    proc, _ = start_paused([synth_dir("gpt-oss-mxfp4"), tmp_path / "out"], after=5)
    assert len(partials(tmp_path)) == 1, "the partial output exists while paused"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not (tmp_path / "out").exists() and partials(tmp_path) == []


# ---- Qwen3-MoE and MiniMax-M2 from BF16 or FP8 block-128: the ModelOpt recipe ---------------

def quantize_fp8_block(x):
    """FP8 block-128 as the FP8 releases store it: E4M3 codes and F32 weight_scale_inv = amax/448
    per 128x128 block, written in numpy."""
    n, k = x.shape
    gn, gk = -(-n // 128), -(-k // 128)
    scales = np.ones((gn, gk), F32)
    q = np.zeros((n, k), ml_dtypes.float8_e4m3fn)
    for i in range(gn):
        for j in range(gk):
            b = x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = F32(np.abs(b).max())
            s = F32(amax / F32(448)) if amax > 0 else F32(1)
            scales[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (b / s).astype(ml_dtypes.float8_e4m3fn)
    return q, scales


SMALL_VOCAB = 256


def shrink_vocab(t, config):
    """The synthetic layouts' embeddings and LM head are GB-sized file holes, which the Python
    writer would fill with real zeros: a fixture written here gets a 256-token vocabulary (they
    play no part in the MoE layers convert and verify run)."""
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in t:
            t[name] = np.zeros((SMALL_VOCAB, t[name].shape[1]), t[name].dtype)
    config["vocab_size"] = SMALL_VOCAB


QWEN_EXPERT = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
MINIMAX_EXPERT = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def make_family(src_bf16: Path, dst: Path, family: str, fp8: bool, rng):
    """Qwen3-MoE (the bf16 synth layout, Qwen/Qwen3-30B-A3B) as released in BF16 or FP8
    (Qwen/Qwen3-30B-A3B-FP8: every linear but the router and lm_head in 128x128 blocks), or the
    same weights in MiniMax-M2's names and config (MiniMaxAI/MiniMax-M2.5: block_sparse_moe.gate,
    e_score_correction_bias, experts.E.w1/w3/w2, FP8 blocks)."""
    t = tensors(src_bf16)
    config = json.loads((src_bf16 / "config.json").read_text())
    shrink_vocab(t, config)
    out = {}
    for name, x in t.items():
        if family == "minimax":
            name = name.replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")
            if ".mlp.experts." in name:
                name = name.replace(".mlp.experts.", ".block_sparse_moe.experts.")
                for a, b in MINIMAX_EXPERT.items():
                    name = name.replace(f".{a}.", f".{b}.")
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        # Synth leaves attention as file holes (zeros); give it values so quantizing it is real.
        if module and ".self_attn." in module and x.ndim == 2:
            x = (rng.standard_normal(x.shape) * 0.02).astype(ml_dtypes.bfloat16)
        linear = (module is not None and x.ndim == 2 and "embed" not in module
                  and not module.endswith(".gate") and module != "lm_head")
        if fp8 and linear:
            q, s = quantize_fp8_block(x.astype(F32))
            out[name], out[module + ".weight_scale_inv"] = q, s
        else:
            out[name] = x
    if family == "minimax":
        layers = config["num_hidden_layers"]
        experts = config["num_experts"]
        for layer in range(layers):
            out[f"model.layers.{layer}.block_sparse_moe.e_score_correction_bias"] = (
                rng.standard_normal(experts) * 0.05).astype(F32)
        base = json.loads((CORPUS / "MiniMaxAI__MiniMax-M2.5" / "config.json").read_text())
        base.update(hidden_size=config["hidden_size"], intermediate_size=config["moe_intermediate_size"],
                    num_local_experts=experts, num_hidden_layers=layers,
                    num_experts_per_tok=config["num_experts_per_tok"], vocab_size=SMALL_VOCAB)
        config = base
        if not fp8:
            del config["quantization_config"]
    elif fp8:
        config["quantization_config"] = json.loads(
            (CORPUS / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_text())["quantization_config"]
    dst.mkdir()
    save_file(out, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(config))
    return out


def exact_values(t, module):
    if module + ".weight_scale_inv" in t:
        return dequant_fp8_block(t[module + ".weight"], t[module + ".weight_scale_inv"])
    return t[module + ".weight"].astype(F32)


@pytest.mark.parametrize("family", ["qwen3", "minimax"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_qwen3_and_minimax_follow_nvidias_modelopt_form(tmp_path, synth_dir, rng, family, fp8):
    src = tmp_path / "src"
    t = make_family(synth_dir("bf16"), src, family, fp8, rng)
    experts = "block_sparse_moe.experts" if family == "minimax" else "mlp.experts"
    gate, up, down = ("w1", "w3", "w2") if family == "minimax" else ("gate_proj", "up_proj", "down_proj")
    dst = tmp_path / "nv"
    report = convert(src, dst)
    assert report["modules_quantized"] == report["modules_converted"] > 0, report
    o = tensors(dst)
    # NVIDIA's form (tests/data/corpus/nvidia__Qwen3-235B-A22B-NVFP4, nvidia__MiniMax-M2.5-NVFP4).
    hf = json.loads((dst / "hf_quant_config.json").read_text())
    nvidia = "nvidia__MiniMax-M2.5-NVFP4" if family == "minimax" else "nvidia__Qwen3-235B-A22B-NVFP4"
    theirs = json.loads((CORPUS / nvidia / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quantization"]["quant_algo"] == theirs["quant_algo"] == "NVFP4"
    assert hf["quantization"]["group_size"] == theirs["group_size"] == 16
    router = f"model.layers.0.{'block_sparse_moe' if family == 'minimax' else 'mlp'}.gate"
    assert router in theirs["exclude_modules"] and router in hf["quantization"]["exclude_modules"]
    assert "lm_head" in hf["quantization"]["exclude_modules"]
    assert "model.layers.0.self_attn*" in hf["quantization"]["exclude_modules"]
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["ignore"] == hf["quantization"]["exclude_modules"]
    # (b) every converted module against the ModelOpt recipe on its exact source values: w1/w3
    # (gate/up) share weight_scale_2 = max(amax) / (6 * 448), the codes and scales are the
    # recipe's bits, and the dequantized error stays within the recipe's bound.
    prefix = f"model.layers.0.{experts}."
    for e in range(2):
        exact = {w: exact_values(t, f"{prefix}{e}.{w}") for w in (gate, up, down)}
        pair = F32(max(np.abs(exact[gate]).max(), np.abs(exact[up]).max())) / F32(6.0 * 448.0)
        for w in (gate, up, down):
            m = f"{prefix}{e}.{w}"
            ts = pair if w != down else F32(np.abs(exact[w]).max()) / F32(6.0 * 448.0)
            packed, scales, ts_o = oracle_nvfp4(exact[w], ts)
            assert o[m + ".weight_scale_2"] == ts_o, m
            assert np.array_equal(o[m + ".weight"], packed), m
            assert np.array_equal(o[m + ".weight_scale"].view(np.uint8), scales), m
            back = dequant_nvfp4(o[m + ".weight"], o[m + ".weight_scale"], o[m + ".weight_scale_2"])
            rel = np.linalg.norm(back - exact[w]) / np.linalg.norm(exact[w])
            assert rel < QUANTIZE_REL_L2_BOUND, (m, rel)
            assert m + ".weight_scale_inv" not in o
    # An FP8 release keeps attention in FP8 blocks, which NVIDIA's plain form can only call
    # unquantized; NVIDIA's MiniMax-M2.5-NVFP4 (from MiniMaxAI's FP8 release) keeps it in BF16:
    # the exact FP8 values rounded once to nearest even (ml_dtypes' cast), scales dropped.
    attention = [n[:-7] for n in t if ".self_attn." in n and n.endswith(".weight") and t[n].ndim == 2]
    assert attention
    assert report["modules_dequantized_to_bf16"] == (len(attention) if fp8 else 0), report
    for m in attention:
        want = exact_values(t, m).astype(ml_dtypes.bfloat16)
        assert o[m + ".weight"].dtype == ml_dtypes.bfloat16, m
        assert np.array_equal(o[m + ".weight"].view(np.uint16), want.view(np.uint16)), m
        assert m + ".weight_scale_inv" not in o
    check_output(dst)
    if fp8:
        # Or NVFP4 attention too, as NVIDIA's Qwen3-235B-A22B-NVFP4 has it, when asked.
        both = tmp_path / "nv-attn"
        report = convert(src, both, "--modules", f"model.layers.*.{experts}.*", "model.layers.*.self_attn.*")
        assert report["modules_dequantized_to_bf16"] == 0
        assert report["modules_quantized"] == report["modules_converted"] > len(attention), report
        excluded = json.loads((both / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
        assert not [x for x in excluded if "self_attn" in x], excluded
        check_output(both)


# ---- compressed-tensors NVFP4 -> ModelOpt NVFP4: re-labeled, the tensor scale reciprocated ------

CT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                    "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                              "group_size": 16, "symmetric": True, "dynamic": "local"}}},
    "ignore": ["lm_head", "re:.*mlp.gate$"],
}


def test_compressed_tensors_nvfp4_is_relabeled_exactly(tmp_path, synth_dir):
    """nvidia/Qwen3 ModelOpt NVFP4 (the modelopt-nvfp4 synth layout) rewritten in numpy into
    llm-compressor's spelling (weight_packed, weight_global_scale = 1 / weight_scale_2,
    input_global_scale = 1 / input_scale), then converted back: the same bytes, and the tensor
    scale the float32 reciprocal of the global scale."""
    modelopt = synth_dir("modelopt-nvfp4")
    t = tensors(modelopt)
    config = json.loads((modelopt / "config.json").read_text())
    shrink_vocab(t, config)
    ct = {}
    # Synth leaves attention as file holes, scales included (0): an all-zero module, for which
    # the global scale is taken as 1 (any finite value dequantizes its zero codes to zeros).
    def reciprocal(x):
        return np.array([F32(1) / F32(x) if F32(x) != 0 else F32(1)], F32)

    for name, x in t.items():
        if name.endswith(".weight_scale_2"):
            ct[name[: -len(".weight_scale_2")] + ".weight_global_scale"] = reciprocal(x)
        elif name.endswith(".input_scale"):
            ct[name[: -len(".input_scale")] + ".input_global_scale"] = reciprocal(x)
        elif name.endswith(".weight") and name[:-7] + ".weight_scale_2" in t:
            ct[name + "_packed"] = x
        else:
            ct[name] = x
    src = tmp_path / "ct"
    src.mkdir()
    save_file(ct, src / "model.safetensors")
    config.pop("quantization_config", None)
    config["quantization_config"] = CT_CONFIG
    (src / "config.json").write_text(json.dumps(config))
    dst = tmp_path / "nv"
    report = convert(src, dst)
    modules = [n[: -len(".weight_packed")] for n in ct if n.endswith(".weight_packed")]
    assert report["modules_relabeled"] == report["modules_converted"] == len(modules), report
    assert report["input_scales"]["calibrated"] == len(modules), report
    o = tensors(dst)
    for m in modules:
        assert m + ".weight_packed" not in o and m + ".weight_global_scale" not in o
        assert np.array_equal(o[m + ".weight"], ct[m + ".weight_packed"]), m
        assert np.array_equal(o[m + ".weight_scale"].view(np.uint8), ct[m + ".weight_scale"].view(np.uint8))
        gs, igs = ct[m + ".weight_global_scale"][0], ct[m + ".input_global_scale"][0]
        assert o[m + ".weight_scale_2"] == F32(1) / gs, m
        assert o[m + ".input_scale"] == F32(1) / igs, m
        # (b) the dequantized values are the reader's of the source (q * s * (1 / gs) in float32),
        # and within one float32 rounding of q * s / gs.
        after = dequant_nvfp4(o[m + ".weight"], o[m + ".weight_scale"], o[m + ".weight_scale_2"])
        before = dequant_nvfp4(ct[m + ".weight_packed"], ct[m + ".weight_scale"], F32(1) / gs)
        assert np.array_equal(before, after), m
        vals = unpack_e2m1(ct[m + ".weight_packed"]).astype(np.float64)
        s = ct[m + ".weight_scale"].view(ml_dtypes.float8_e4m3fn).astype(np.float64) / np.float64(gs)
        exact = (vals.reshape(*s.shape, 16) * s[..., None]).reshape(vals.shape)
        assert np.allclose(after, exact, rtol=2.0 ** -22, atol=0), m
        # the original ModelOpt tensor scale comes back where 1 / (1 / x) is x in float32
        original = F32(t[m + ".weight_scale_2"])
        if original != 0 and F32(1) / (F32(1) / original) == original:
            assert o[m + ".weight_scale_2"] == t[m + ".weight_scale_2"], m
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "NVFP4", qc
    check_output(dst)


def test_compressed_tensors_with_fp8_blocks_is_refused_in_one_sentence(tmp_path, synth_dir):
    """RedHat's DeepSeek-V4 NVFP4-FP8 export keeps attention in compressed-tensors FP8 blocks (F32
    block scales), which ModelOpt's NVFP4 form cannot declare: exit 2, nothing written."""
    out = run("convert", synth_dir("ct-nvfp4"), tmp_path / "nv")
    assert out.returncode == 2, out.stderr
    message = out.stderr.strip()
    assert "attn" in message and "compressed-tensors checkpoint" in message, message
    assert "cannot be re-labeled exactly" in message, message
    assert "no tensor" not in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "nv").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name]


# ---- DeepSeek-V3 names (Kimi-K2, GLM-5) and DeepSeek-V4 by default -----------------------------

def fnmatch_any(name, patterns):
    from fnmatch import fnmatchcase
    return any(fnmatchcase(name, p) for p in patterns)


def language(config):
    return config["text_config"] if "text_config" in config and "hidden_size" not in config else config


def assert_nvidia_v3_form(src, dst, nvidia, dialect="nvfp4", prefix=""):
    """The output's configs key by key against NVIDIA's NVFP4 release of the family
    (tests/data/corpus): ModelOpt's plain NVFP4 form, not DeepSeek-V4's (no quant_method fp8,
    MIXED_PRECISION or moe_quant_algo, which DeepSeek-V3 loaders never read); exclusions that cover
    attention, the MTP layer and lm_head as NVIDIA spells them; nothing left FP8; the MTP layer
    not converted; inspect and check of the output warn of nothing it caused."""
    algo = {"nvfp4": "NVFP4", "w4a16_nvfp4": "W4A16_NVFP4"}[dialect]
    src_config = json.loads((src / "config.json").read_text())
    config = json.loads((dst / "config.json").read_text())
    ours = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]
    qc = config["quantization_config"]
    theirs_config = json.loads((CORPUS / nvidia / "config.json").read_text())
    if (CORPUS / nvidia / "hf_quant_config.json").exists():
        theirs = json.loads((CORPUS / nvidia / "hf_quant_config.json").read_text())["quantization"]
        theirs_exclude = theirs["exclude_modules"]
    else:  # nvidia/Kimi-K2.5-NVFP4: config.json only
        theirs = theirs_config["quantization_config"]
        theirs_exclude = theirs["ignore"]
        assert qc["quant_method"] == theirs["quant_method"] == "modelopt", qc
        if dialect == "nvfp4":
            assert qc["config_groups"] == theirs["config_groups"], qc["config_groups"]
        assert "quantization_config" not in config.get("text_config", {}), config["text_config"]
    # The keys NVIDIA writes, with NVIDIA's values where the output is the same thing.
    assert set(ours) == {"quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"}, ours
    assert ours["quant_algo"] == algo and theirs["quant_algo"] == "NVFP4", (ours, theirs)
    assert ours["group_size"] == theirs.get("group_size", 16) == 16
    assert ours["kv_cache_quant_algo"] is None  # the KV cache is not quantized by convert
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == algo, qc
    assert qc["ignore"] == ours["exclude_modules"], qc
    for key in ("moe_quant_algo", "quantized_layers", "weight_block_size", "scale_fmt"):
        assert key not in qc and key not in ours, key
    exclude = ours["exclude_modules"]
    # lm_head, attention (one `self_attn*` entry per layer), the MTP layer (`model.layers.N*`).
    theirs_prefix = "language_model." if "text_config" in theirs_config else ""
    assert f"{theirs_prefix}lm_head" in theirs_exclude
    src_names = set(tensors(src))
    if f"{prefix}lm_head.weight" in src_names:
        assert f"{prefix}lm_head" in exclude, exclude
    n = language(src_config)["num_hidden_layers"]
    their_n = language(theirs_config)["num_hidden_layers"]
    if language(theirs_config).get("num_nextn_predict_layers"):
        assert f"model.layers.{their_n}*" in theirs_exclude, theirs_exclude
    if any(x.startswith(f"{prefix}model.layers.{n}.") for x in src_names):
        assert f"{prefix}model.layers.{n}*" in exclude, exclude
    assert fnmatch_any(f"{theirs_prefix}model.layers.0.self_attn.kv_b_proj", theirs_exclude)
    o = tensors(dst)
    for name, x in o.items():
        module = name[: -len(".weight")]
        if ".self_attn." in name and name.endswith(".weight") and x.ndim == 2:
            assert fnmatch_any(module, exclude), (module, exclude)
            layer = module.split(".self_attn.")[0]
            assert f"{layer}.self_attn*" in exclude or f"{layer}*" in exclude, exclude
        # Nothing left FP8: E4M3 only as NVFP4 block scales, no FP8 block scales at all.
        assert x.dtype != ml_dtypes.float8_e4m3fn or name.endswith(".weight_scale"), name
        assert not name.endswith(".weight_scale_inv"), name
        # Every NVFP4 module is declared (not excluded), every other linear excluded.
        if name.endswith(".weight") and x.ndim == 2 and "embed" not in name:
            assert fnmatch_any(module, exclude) == (module + ".weight_scale" not in o), module
    # The MTP layer's routed experts stay as they are (BF16 now, FP8 before), as NVIDIA leaves them.
    mtp_expert = f"{prefix}model.layers.{n}.mlp.experts.0.gate_proj.weight"
    if mtp_expert in src_names:
        assert o[mtp_expert].dtype == ml_dtypes.bfloat16, o[mtp_expert].dtype
        assert mtp_expert[:-7] + ".weight_scale" not in o
    # inspect and check of the output: no warning the output caused (the flagged default
    # input_scale of the nvfp4 dialect is documented; holes of the synthetic source stay holes).
    manifest = json.loads(ok("inspect", dst, "--json").stdout)
    warned = [f for f in manifest["findings"] if f["severity"] != "info"]
    assert not warned, warned
    report = json.loads(run("check", dst, "--json").stdout)
    source_ids = {f["id"] for f in json.loads(run("check", src, "--json").stdout)["findings"]}
    allowed = (source_ids & {"all_zero_tensor"}) | ({"input_scale_default"} if dialect == "nvfp4" else set())
    assert {f["id"] for f in report["findings"]} <= allowed, report["findings"]


@pytest.mark.parametrize("layout,lossless", [("dsv3-fp8", False), ("dsv4-mxfp4", True)])
def test_deepseek_family_defaults(tmp_path, synth_dir, layout, lossless):
    src = synth_dir(layout)
    dst = tmp_path / "nv"
    report = convert(src, dst)
    t, o = tensors(src), tensors(dst)
    if lossless:
        assert report["modules_transcoded_losslessly"] == report["modules_converted"] > 0
        assert report["report"]["blocks_requantized"] == 0
        for name in (n for n in t if n.endswith(".weight") and ".ffn.experts." in n and "mtp" not in n):
            m = name[: -len(".weight")]
            before = dequant_mxfp4(t[name], t[m + ".scale"])
            after = dequant_nvfp4(o[name], o[m + ".weight_scale"], o[m + ".weight_scale_2"])
            assert np.array_equal(before, after), m
    else:
        assert report["modules_quantized"] == report["modules_converted"] > 0
        m = "model.layers.3.mlp.experts.0.down_proj"
        m = m if m + ".weight" in t else sorted(n for n in t if ".mlp.experts.0.down_proj.weight" in n)[0][:-7]
        exact = dequant_fp8_block(t[m + ".weight"], t[m + ".weight_scale_inv"])
        back = dequant_nvfp4(o[m + ".weight"], o[m + ".weight_scale"], o[m + ".weight_scale_2"])
        assert np.linalg.norm(back - exact) / np.linalg.norm(exact) < QUANTIZE_REL_L2_BOUND
        assert_nvidia_v3_form(src, dst, "nvidia__DeepSeek-V3.1-NVFP4")
    check_output(dst)


# ---- What convert cannot handle: one sentence, exit 2, nothing written -------------------------

def test_an_unknown_family_is_named_in_one_sentence(tmp_path):
    d = tmp_path / "nemotron"
    d.mkdir()
    save_file({"backbone.layers.1.mixer.experts.0.up_proj.weight": np.zeros((64, 32), ml_dtypes.bfloat16),
               "backbone.layers.1.mixer.gate.weight": np.zeros((4, 64), ml_dtypes.bfloat16)},
              d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "nemotron_h", "hidden_size": 64,
                                               "num_hidden_layers": 2, "n_routed_experts": 4,
                                               "num_experts_per_tok": 2}))
    out = run("convert", d, tmp_path / "nv")
    assert out.returncode == 2, out.stderr
    message = out.stderr.strip()
    assert "model_type 'nemotron_h'" in message and "block_sparse_moe" in message, message
    assert "--modules" in message, message
    assert "no tensor" not in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "nv").exists()


V3_FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                 "weight_block_size": [128, 128]}


@pytest.mark.parametrize("corpus_dir,nvidia,prefix", [
    ("zai-org__GLM-5-FP8", "nvidia__GLM-5-NVFP4", ""),
    ("moonshotai__Kimi-K2-Instruct", "nvidia__Kimi-K2.5-NVFP4", ""),
    # Kimi-K2.5's VLM wrapper (text_config, language_model.), its experts in FP8 blocks here.
    ("moonshotai__Kimi-K2.5", "nvidia__Kimi-K2.5-NVFP4", "language_model."),
])
def test_kimi_and_glm_convert_through_the_v3_names(tmp_path, rng, corpus_dir, nvidia, prefix):
    """GLM-5 and Kimi-K2 (real configs, FP8 block-128 tensors in DeepSeek-V3's names, written by
    test_verify_cli.make_v3_family): the routed experts by default, by the ModelOpt recipe, in
    NVIDIA's plain ModelOpt form of the family (nvidia/GLM-5-NVFP4, nvidia/Kimi-K2.5-NVFP4)."""
    from test_verify_cli import make_v3_family
    text = make_v3_family(tmp_path / "src", rng, corpus_dir, "fp8_block", prefix)
    if prefix:  # the INT4 compressed-tensors release's declaration, made FP8 blocks
        config = json.loads((tmp_path / "src" / "config.json").read_text())
        config["text_config"]["quantization_config"] = V3_FP8_CONFIG
        (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    report = convert(tmp_path / "src", tmp_path / "nv")
    # The routed experts and, as NVIDIA's releases of the family, the shared expert.
    assert report["modules_quantized"] == report["modules_converted"] == 16 * 3 + 3, report
    t, o = tensors(tmp_path / "src"), tensors(tmp_path / "nv")
    for m in (f"{prefix}model.layers.1.mlp.experts.3.down_proj",
              f"{prefix}model.layers.1.mlp.shared_experts.down_proj"):
        exact = dequant_fp8_block(t[m + ".weight"], t[m + ".weight_scale_inv"])
        packed, scales, ts = oracle_nvfp4(exact, F32(np.abs(exact).max()) / F32(6.0 * 448.0))
        assert o[m + ".weight_scale_2"] == ts and np.array_equal(o[m + ".weight"], packed)
        assert np.array_equal(o[m + ".weight_scale"].view(np.uint8), scales)
    assert_nvidia_v3_form(tmp_path / "src", tmp_path / "nv", nvidia, prefix=prefix)
    check_output(tmp_path / "nv", tokens=5)


# ---- The MTP layer, and converting a converted checkpoint again --------------------------------

def test_v3_mtp_layer_is_converted_only_when_named(tmp_path, synth_dir):
    """The MTP layer (model.layers.{num_hidden_layers}) is left out by default, as NVIDIA's
    DeepSeek-V3.1-NVFP4 leaves `model.layers.61*`; --modules names it, and then the exclusions list
    what is left of that layer module by module instead of excluding the whole layer."""
    src = synth_dir("dsv3-fp8")
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    dst = tmp_path / "nv"
    report = convert(src, dst, "--modules", "model.layers.*.mlp.experts.*")
    o = tensors(dst)
    mtp = f"model.layers.{n}.mlp.experts.0.gate_proj"
    assert o[mtp + ".weight"].dtype == np.uint8 and mtp + ".weight_scale" in o
    assert report["modules_converted"] == 2 * 8 * 3, report  # layer 1 and the MTP layer
    exclude = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert f"model.layers.{n}*" not in exclude and f"model.layers.{n}.self_attn*" in exclude, exclude
    assert f"model.layers.{n}.mlp.shared_experts.gate_proj" in exclude, exclude  # BF16 now
    for name in o:
        if name.endswith(".weight_scale"):
            assert not fnmatch_any(name[: -len(".weight_scale")], exclude), name
    manifest = json.loads(ok("inspect", dst, "--json").stdout)
    assert manifest["summary"]["mtp_experts"] == "nvfp4", manifest["summary"]
    assert not [f for f in manifest["findings"] if f["severity"] != "info"], manifest["findings"]
    assert run("check", dst).returncode == 0


def quantized_layers(d):
    """quantized_layers of config.json and hf_quant_config.json, which must agree."""
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    hf = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    assert qc.get("quantized_layers") == hf.get("quantized_layers"), (qc, hf)
    assert qc["quant_algo"] == hf["quant_algo"], (qc, hf)
    return qc["quant_algo"], qc.get("quantized_layers"), hf["exclude_modules"]


def test_reconvert_keeps_the_earlier_quantized_layers_deepseek_v4(tmp_path, synth_dir):
    """NVIDIA's DeepSeek-V4-Flash-NVFP4 layout (routed experts NVFP4, MTP experts MXFP4) converted
    again with the MTP experts: the routed experts' quantized_layers entries stay (without them
    the engines would read those NVFP4 experts as the FP8 base) beside the new MTP entry."""
    src = synth_dir("dsv4-nvfp4")
    before = json.loads((src / "config.json").read_text())["quantization_config"]["quantized_layers"]
    assert before
    dst = tmp_path / "nv"
    convert(src, dst, "--modules", "mtp.*.ffn.experts.*")
    algo, layers, exclude = quantized_layers(dst)
    assert algo == "MIXED_PRECISION"
    for key, entry in before.items():
        assert layers.get(key) == entry, (key, layers)
    assert layers["mtp.0.ffn.experts"] == {"quant_algo": "NVFP4", "group_size": 16}, layers
    assert "mtp.*" not in exclude, exclude
    manifest = json.loads(ok("inspect", dst, "--json").stdout)
    assert manifest["summary"]["routed_experts"] == manifest["summary"]["mtp_experts"] == "nvfp4"
    assert not [f for f in manifest["findings"] if f["severity"] == "error"], manifest["findings"]
    assert run("check", dst).returncode == 0


def test_reconvert_keeps_the_earlier_quantized_layers_plain_form(tmp_path, rng):
    """A DeepSeek-V3-family checkpoint converted in steps: the modules quantized by an earlier run
    stay declared. In one dialect the plain form declares them all; where the dialects differ it
    is ModelOpt's MIXED_PRECISION form, and a source that already has quantized_layers keeps its
    entries."""
    from test_verify_cli import make_v3_family
    make_v3_family(tmp_path / "src", rng, "moonshotai__Kimi-K2-Instruct", "fp8_block")
    shared = "model.layers.1.mlp.shared_experts."
    first = tmp_path / "first"  # routed experts, weight-only
    convert(tmp_path / "src", first, "--modules", "model.layers.*.mlp.experts.*",
            "--dialect", "w4a16_nvfp4")
    algo, layers, exclude = quantized_layers(first)
    assert (algo, layers) == ("W4A16_NVFP4", None) and shared + "down_proj" in exclude, exclude
    # The same dialect again: still the plain form, the routed experts declared, not excluded.
    plain = tmp_path / "plain"
    convert(first, plain, "--modules", shared + "*", "--dialect", "w4a16_nvfp4")
    algo, layers, exclude = quantized_layers(plain)
    assert (algo, layers) == ("W4A16_NVFP4", None), (algo, layers)
    assert exclude == ["model.layers.1.mlp.gate"], exclude
    check_output(plain, tokens=5)
    # The other dialect for the shared gate/up: MIXED_PRECISION, the earlier modules declared.
    second = tmp_path / "second"
    convert(first, second, "--modules", shared + "gate_proj", shared + "up_proj")
    algo, layers, exclude = quantized_layers(second)
    w4a16, nvfp4 = ({"quant_algo": a, "group_size": 16} for a in ("W4A16_NVFP4", "NVFP4"))
    assert algo == "MIXED_PRECISION"
    assert layers == {"model.layers.1.mlp.experts": w4a16, shared + "gate_proj": nvfp4,
                      shared + "up_proj": nvfp4}, layers
    assert shared + "down_proj" in exclude and not [x for x in exclude if ".experts" in x], exclude
    manifest = json.loads(ok("inspect", second, "--json").stdout)
    assert not [f for f in manifest["findings"] if f["severity"] == "error"], manifest["findings"]
    # A source with quantized_layers: its entries stay beside the new one.
    third = tmp_path / "third"
    convert(second, third, "--modules", shared + "down_proj")
    algo, layers3, exclude = quantized_layers(third)
    assert algo == "MIXED_PRECISION" and layers3 == {**layers, shared + "down_proj": nvfp4}, layers3
    assert exclude == ["model.layers.1.mlp.gate"], exclude
    check_output(third, tokens=5)
