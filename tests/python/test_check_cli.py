"""`fp4moe check` end to end: clean checkpoints with real data in six families (written by the
Python safetensors package, quantized here by an independent numpy implementation of the recipes in
FORMATS.md), then every finding id of the table injected alone at a known tensor, row and block."""
import copy
import json
import os
import re
import subprocess
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conftest import synth_layouts
from st_io import save as save_file

BUILD = Path(os.environ["FP4MOE_BUILD_DIR"])
FP4MOE = BUILD / "fp4moe"
ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu

# ---------------------------------------------------------------------------------------------
# Numerics, written from FORMATS.md sections 1 and 2 (not fp4moe's quantizer).

E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)
E2M1_VALUES = np.concatenate([E2M1_GRID, -E2M1_GRID])  # code -> value, code 8..15 negative
NVFP4_MAX_SCALE = F32(6 * 448)


def e2m1_codes(x):
    """Round to nearest E2M1, ties to the even code, saturating at 6; sign in bit 3 (also -0)."""
    a = np.minimum(np.abs(x.astype(F32)), F32(6))
    d = np.abs(a[..., None] - E2M1_GRID)
    cand = d == d.min(-1, keepdims=True)
    even = cand & (np.arange(8) % 2 == 0)
    code = np.where(even.any(-1), even.argmax(-1), cand.argmax(-1)).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << 3)


def pack(codes):
    """Element 2i in the low nibble, 2i+1 in the high nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed):
    packed = packed.view(np.uint8)
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2], vals[..., 1::2] = E2M1_VALUES[packed & 0xF], E2M1_VALUES[packed >> 4]
    return vals


def e4m3(x):
    """E4M3 round to nearest even (ml_dtypes), saturating at +-448."""
    return np.clip(x.astype(F32), -448, 448).astype(E4M3)


def nvfp4(w, scale_2=None, ct=False):
    """NVIDIA's recipe: scale_2 = amax / (6 * 448); block scale e4m3(amax_block / (6 * scale_2)),
    1.0 for a zero block; q = e2m1(x / (s * scale_2)). ct: compressed-tensors' op order with the
    reciprocal global scale. Returns (packed U8 [N, K/2], F8_E4M3 [N, K/16], scale_2)."""
    w = w.astype(F32)
    n, k = w.shape
    if scale_2 is None:
        scale_2 = F32(np.abs(w).max()) / NVFP4_MAX_SCALE
    scale_2 = F32(scale_2)
    blocks = w.reshape(n, k // 16, 16)
    bamax = np.abs(blocks).max(-1)
    if ct:
        glob = NVFP4_MAX_SCALE / F32(np.abs(w).max()) if scale_2 is None else F32(1) / scale_2
        s = e4m3(glob * (bamax / F32(6)))
    else:
        s = e4m3(bamax / (F32(6) * scale_2))
    s = np.where(bamax == 0, F32(1).astype(E4M3), s)
    q = e2m1_codes(blocks / (s.astype(F32)[..., None] * scale_2))
    return pack(q.reshape(n, k)), s, scale_2


def dequant_nvfp4(packed, scales, scale_2):
    vals = unpack(packed)
    n, k = vals.shape
    s = scales.astype(F32) * F32(scale_2)
    return (vals.reshape(n, k // 16, 16) * s[..., None]).reshape(n, k)


def mxfp4(w):
    """OCP MX v1.0 floor rule: X = 2^(floor(log2(amax)) - 2); q = e2m1(x / X). Returns the packed
    bytes [..., K/2] and the E8M0 codes [..., K/32] as U8."""
    w = w.astype(F32)
    blocks = w.reshape(w.shape[:-1] + (w.shape[-1] // 32, 32))
    bamax = np.abs(blocks).max(-1)
    e = np.where(bamax > 0, np.floor(np.log2(np.where(bamax > 0, bamax, 1))) - 2, 0).astype(np.int64)
    e = np.clip(e, -127, 127)
    q = e2m1_codes(blocks / np.ldexp(F32(1), e)[..., None].astype(F32))
    return pack(q.reshape(w.shape)), (e + 127).astype(np.uint8)


def dequant_mxfp4(packed, codes):
    vals = unpack(packed)
    blocks = vals.reshape(vals.shape[:-1] + (vals.shape[-1] // 32, 32))
    s = np.ldexp(F32(1), codes.view(np.uint8).astype(np.int64) - 127).astype(F32)
    return (blocks * s[..., None]).reshape(vals.shape)


def fp8_block(w, e8m0=False):
    """DeepSeek-V3 128x128 blocks: scale_inv = amax / 448 (F32) per tile, q = e4m3(x / s).
    e8m0: the scale rounded up to a power of two (scale_fmt ue8m0, DeepSeek-V4 `.scale`)."""
    n, k = w.shape
    gr, gc = -(-n // 128), -(-k // 128)
    s = np.zeros((gr, gc), F32)
    q = np.zeros((n, k), E4M3)
    for i in range(gr):
        for j in range(gc):
            tile = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].astype(F32)
            amax = F32(np.abs(tile).max())
            sc = amax / F32(448) if amax > 0 else F32(1)
            if e8m0:
                sc = F32(np.ldexp(1.0, int(np.ceil(np.log2(sc)))))
            s[i, j] = sc
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = e4m3(tile / sc)
    if e8m0:
        return q, (np.log2(s).astype(np.int64) + 127).astype(np.uint8).view(E8M0)
    return q, s


def dequant_fp8_block(q, s):
    n, k = q.shape
    full = np.repeat(np.repeat(s.astype(F32), 128, 0), 128, 1)[:n, :k]
    return q.astype(F32) * full


def gauss(rng, rows, cols, std=0.02):
    return (rng.standard_normal((rows, cols)) * std).astype(F32)


# ---------------------------------------------------------------------------------------------
# Checkpoints in memory: tensors, configs, optional shards.

class Ckpt:
    def __init__(self, family, tensors, configs, meta=None):
        self.family = family
        self.tensors = tensors
        self.configs = configs
        self.meta = meta or {}
        self.shards = None  # tensor name -> shard file name, or None for one model.safetensors

    def copy(self):
        c = Ckpt(self.family, {k: v.copy() for k, v in self.tensors.items()},
                 copy.deepcopy(self.configs), copy.deepcopy(self.meta))
        c.shards = dict(self.shards) if self.shards else None
        return c

    def write(self, path):
        path.mkdir(parents=True)
        for name, obj in self.configs.items():
            (path / name).write_text(json.dumps(obj, indent=1))
        if self.shards is None:
            save_file(self.tensors, path / "model.safetensors")
            return path
        by_shard = {}
        for name, shard in self.shards.items():
            by_shard.setdefault(shard, {})[name] = self.tensors[name]
        for shard, tensors in by_shard.items():
            save_file(tensors, path / shard)
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(t.nbytes for t in self.tensors.values())},
             "weight_map": dict(sorted(self.shards.items()))}))
        return path


def put_nvfp4(t, module, packed, scales, scale_2, input_scale, ct=False):
    if ct:
        t[f"{module}.weight_packed"] = packed
        t[f"{module}.weight_scale"] = scales
        t[f"{module}.weight_global_scale"] = np.array([F32(1) / F32(scale_2)], F32)
        t[f"{module}.input_global_scale"] = np.array([F32(1) / F32(input_scale)], F32)
    else:
        t[f"{module}.weight"] = packed
        t[f"{module}.weight_scale"] = scales
        t[f"{module}.weight_scale_2"] = np.array(scale_2, F32)
        t[f"{module}.input_scale"] = np.array(input_scale, F32)


def nvfp4_experts(rng, t, prefix, hidden, inter, ct=False, shared_scale=True):
    """gate/up/down of one expert; gate and up share weight_scale_2 (max of their amax / 2688),
    as ModelOpt and llm-compressor export them for the fused gate_up GEMM."""
    g, u, d = gauss(rng, inter, hidden), gauss(rng, inter, hidden), gauss(rng, hidden, inter)
    shared = F32(max(np.abs(g).max(), np.abs(u).max())) / NVFP4_MAX_SCALE
    for proj, w in (("gate_proj", g), ("up_proj", u), ("down_proj", d)):
        s2 = shared if proj != "down_proj" and shared_scale else None
        packed, scales, scale_2 = nvfp4(w, s2, ct=ct)
        put_nvfp4(t, f"{prefix}.{proj}", packed, scales, scale_2,
                  F32(rng.uniform(0.5, 2.0) / 448 / 6), ct=ct)


def bf16(rng, *shape):
    return (rng.standard_normal(shape) * 0.02).astype(BF16)


def modelopt_nvfp4(rng, arch="qwen3_moe", layers=2, experts=4, hidden=128, inter=64):
    """ModelOpt NVFP4 (nvidia/Qwen3-*-NVFP4, nvidia/DeepSeek-R1-FP4 names): W4A4 experts (and
    DeepSeek shared experts), BF16 attention, routers and head listed in the exclusions."""
    t = {}
    dsv3 = arch == "deepseek_v3"
    for layer in range(layers):
        p = f"model.layers.{layer}"
        for e in range(experts):
            nvfp4_experts(rng, t, f"{p}.mlp.experts.{e}", hidden, inter)
        if dsv3:
            nvfp4_experts(rng, t, f"{p}.mlp.shared_experts", hidden, inter)
        t[f"{p}.mlp.gate.weight"] = bf16(rng, experts, hidden)
        attn = ("q_a_proj", "o_proj") if dsv3 else ("q_proj", "o_proj")
        for a in attn:
            t[f"{p}.self_attn.{a}.weight"] = bf16(rng, hidden, hidden)
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, BF16)
    t["model.embed_tokens.weight"] = bf16(rng, 64, hidden)
    t["model.norm.weight"] = np.ones(hidden, BF16)
    t["lm_head.weight"] = bf16(rng, 64, hidden)
    exclude = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]
    config = {"architectures": ["DeepseekV3ForCausalLM" if dsv3 else "Qwen3MoeForCausalLM"],
              "model_type": arch, "hidden_size": hidden, "moe_intermediate_size": inter,
              "num_hidden_layers": layers,
              "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                      "group_size": 16, "kv_cache_quant_algo": None,
                                      "ignore": list(exclude)}}
    if dsv3:
        config.update({"n_routed_experts": experts, "n_shared_experts": 1,
                       "first_k_dense_replace": 0, "num_nextn_predict_layers": 0})
    else:
        config.update({"num_experts": experts, "decoder_sparse_step": 1})
    hfq = {"producer": {"name": "modelopt", "version": "0.29.0"},
           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                            "exclude_modules": list(exclude)}}
    return Ckpt("modelopt-" + arch, t, {"config.json": config, "hf_quant_config.json": hfq},
                {"layers": layers, "experts": experts})


def ct_nvfp4(rng, layers=2, experts=4, hidden=128, inter=64):
    """compressed-tensors nvfp4-pack-quantized (RedHatAI/*-NVFP4): weight_packed, weight_scale,
    weight_global_scale = 2688 / amax, W4A4 with input_global_scale; gate/up share the global
    scale (llm-compressor fuses it)."""
    t = {}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        for e in range(experts):
            nvfp4_experts(rng, t, f"{p}.mlp.experts.{e}", hidden, inter, ct=True)
        t[f"{p}.mlp.gate.weight"] = bf16(rng, experts, hidden)
        for a in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{p}.self_attn.{a}.weight"] = bf16(rng, hidden, hidden)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, BF16)
    t["model.embed_tokens.weight"] = bf16(rng, 64, hidden)
    t["lm_head.weight"] = bf16(rng, 64, hidden)
    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
              "symmetric": True, "dynamic": False}
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "hidden_size": hidden, "moe_intermediate_size": inter, "num_hidden_layers": layers,
              "num_experts": experts, "decoder_sparse_step": 1,
              "quantization_config": {
                  "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                  "quantization_status": "compressed",
                  "config_groups": {"group_0": {
                      "targets": ["Linear"], "format": "nvfp4-pack-quantized", "weights": scheme,
                      "input_activations": dict(scheme, dynamic="local")}},
                  "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*self_attn.*"]}}
    return Ckpt("ct-nvfp4", t, {"config.json": config}, {"layers": layers, "experts": experts})


def gpt_oss_mxfp4(rng, layers=3, experts=4, hidden=128, inter=64):
    """gpt-oss: fused experts, gate_up_proj_blocks U8 [E, 2I, H/32, 16] + _scales U8 [E, 2I, H/32],
    down_proj likewise, BF16 biases; attention, router, embeddings and head BF16 and listed in
    modules_to_not_convert."""
    t = {}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        for proj, (n, k) in (("gate_up_proj", (2 * inter, hidden)), ("down_proj", (hidden, inter))):
            w = (rng.standard_normal((experts, n, k)) * 0.02).astype(F32)
            packed, codes = mxfp4(w)
            t[f"{p}.mlp.experts.{proj}_blocks"] = packed.reshape(experts, n, k // 32, 16)
            t[f"{p}.mlp.experts.{proj}_scales"] = codes
            t[f"{p}.mlp.experts.{proj}_bias"] = bf16(rng, experts, n)
        t[f"{p}.mlp.router.weight"] = bf16(rng, experts, hidden)
        t[f"{p}.mlp.router.bias"] = bf16(rng, experts)
        for a in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{p}.self_attn.{a}.weight"] = bf16(rng, hidden, hidden)
            t[f"{p}.self_attn.{a}.bias"] = bf16(rng, hidden)
        t[f"{p}.self_attn.sinks"] = bf16(rng, 8)
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, BF16)
    t["model.embed_tokens.weight"] = bf16(rng, 64, hidden)
    t["model.norm.weight"] = np.ones(hidden, BF16)
    t["lm_head.weight"] = bf16(rng, 64, hidden)
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_local_experts": experts, "experts_per_token": 2,
              "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"]}}
    return Ckpt("gpt-oss-mxfp4", t, {"config.json": config},
                {"layers": layers, "experts": experts, "inter": inter, "hidden": hidden})


def dsv4_mxfp4(rng, layers=2, experts=4, hidden=256, width=128):
    """DeepSeek-V4 stock: routed experts w1/w2/w3 I8 [N, K/2] + F8_E8M0 .scale [N, K/32]; attention
    FP8 with E8M0 128x128 scales; MTP experts MXFP4; config quant_method fp8 + expert_dtype fp4."""
    t = {}

    def expert(name, n, k):
        packed, codes = mxfp4(gauss(rng, n, k))
        t[f"{name}.weight"] = packed.view(np.int8)
        t[f"{name}.scale"] = codes.view(E8M0)

    for layer in range(layers):
        for e in range(experts):
            for w, (n, k) in (("w1", (width, hidden)), ("w3", (width, hidden)),
                              ("w2", (hidden, width))):
                expert(f"layers.{layer}.ffn.experts.{e}.{w}", n, k)
        t[f"layers.{layer}.ffn.gate.weight"] = bf16(rng, experts, hidden)
        q, s = fp8_block(gauss(rng, 128, hidden), e8m0=True)
        t[f"layers.{layer}.attn.wq_a.weight"] = q
        t[f"layers.{layer}.attn.wq_a.scale"] = s
        t[f"layers.{layer}.attn_norm.weight"] = np.ones(hidden, BF16)
    expert("mtp.0.ffn.experts.0.w1", width, hidden)
    t["embed.weight"] = bf16(rng, 64, hidden)
    t["head.weight"] = bf16(rng, 64, hidden)
    t["norm.weight"] = np.ones(hidden, BF16)
    config = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
              "expert_dtype": "fp4", "hidden_size": hidden, "moe_intermediate_size": width,
              "n_routed_experts": experts, "num_hidden_layers": layers,
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "scale_fmt": "ue8m0",
                                      "weight_block_size": [128, 128]}}
    return Ckpt("dsv4-mxfp4", t, {"config.json": config}, {"layers": layers, "experts": experts})


def dsv3_fp8(rng, layers=2, experts=4, hidden=320, inter=200):
    """DeepSeek-V3 FP8 block: weight F8_E4M3 + weight_scale_inv F32 [ceil(N/128), ceil(K/128)];
    sizes that are not multiples of 128 so the grids have partial tiles."""
    t = {}

    def fp8(name, n, k):
        q, s = fp8_block(gauss(rng, n, k))
        t[f"{name}.weight"] = q
        t[f"{name}.weight_scale_inv"] = s

    for layer in range(layers):
        p = f"model.layers.{layer}"
        for e in list(range(experts)) + ["shared"]:
            base = f"{p}.mlp.shared_experts" if e == "shared" else f"{p}.mlp.experts.{e}"
            for proj, (n, k) in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                 ("down_proj", (hidden, inter))):
                fp8(f"{base}.{proj}", n, k)
        fp8(f"{p}.self_attn.q_a_proj", 192, hidden)
        t[f"{p}.mlp.gate.weight"] = bf16(rng, experts, hidden)
        t[f"{p}.mlp.gate.e_score_correction_bias"] = np.zeros(experts, F32)
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, BF16)
    t["model.embed_tokens.weight"] = bf16(rng, 64, hidden)
    t["lm_head.weight"] = bf16(rng, 64, hidden)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "hidden_size": hidden, "moe_intermediate_size": inter, "num_hidden_layers": layers,
              "n_routed_experts": experts, "n_shared_experts": 1, "first_k_dense_replace": 0,
              "num_nextn_predict_layers": 0,
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]}}
    return Ckpt("dsv3-fp8", t, {"config.json": config}, {"layers": layers, "experts": experts})


def modelopt_fp8(rng, layers=2, experts=4, hidden=128, inter=64):
    """ModelOpt FP8 per-tensor: weight F8_E4M3 + weight_scale F32 scalar (amax / 448) +
    input_scale. gate and up keep separate scales: engines requantize them to the larger one."""
    ck = modelopt_nvfp4(rng, "qwen3_moe", layers, experts, hidden, inter)
    t = ck.tensors
    for name in [n for n in t if n.endswith(".weight_scale_2")]:
        m = name[:-len(".weight_scale_2")]
        n, k = t[f"{m}.weight"].shape[0], t[f"{m}.weight"].shape[1] * 2
        w = gauss(rng, n, k)
        s = F32(np.abs(w).max()) / F32(448)
        del t[f"{m}.weight_scale_2"]
        t[f"{m}.weight"], t[f"{m}.weight_scale"] = e4m3(w / s), np.array(s, F32)
    ck.configs["config.json"]["quantization_config"]["quant_algo"] = "FP8"
    ck.configs["hf_quant_config.json"]["quantization"]["quant_algo"] = "FP8"
    ck.family = "modelopt-fp8"
    return ck


BUILDERS = {
    "modelopt-qwen3": lambda rng: modelopt_nvfp4(rng, "qwen3_moe"),
    "modelopt-dsv3": lambda rng: modelopt_nvfp4(rng, "deepseek_v3"),
    "ct-nvfp4": ct_nvfp4,
    "gpt-oss-mxfp4": gpt_oss_mxfp4,
    "dsv4-mxfp4": dsv4_mxfp4,
    "dsv3-fp8": dsv3_fp8,
    "modelopt-fp8": modelopt_fp8,
}
_CACHE = {}


def clean(name, seed=20261129):
    """The clean checkpoint of a family (built once per seed, copied per test)."""
    key = (name, seed)
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[name](np.random.default_rng(seed))
    return _CACHE[key].copy()


# ---------------------------------------------------------------------------------------------
# Running check.

def run(*args, timeout=60):
    return subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def check(path, *args):
    proc = run("check", path, "--json", *args)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr}\n{proc.stdout}"
    return proc.returncode, json.loads(proc.stdout)


def ids(report):
    return [f["id"] for f in report["findings"]]


def finding(report, fid):
    found = [f for f in report["findings"] if f["id"] == fid]
    assert found, f"{fid} not reported: {ids(report)}"
    return found[0]


def help_ids():
    text = run("check", "--help").stdout
    footer = re.search(r"Finding ids \(severity\): (.*?)\. docs/CHECK.md", text, re.S)
    assert footer, text
    return {m.group(1): m.group(2) for m in re.finditer(r"(\w+) \((error|warning|info)\)",
                                                        footer.group(1))}


SEVERITY = {}


def severity(fid):
    if not SEVERITY:
        SEVERITY.update(help_ids())
    return SEVERITY[fid]


def assert_only(report, rc, fid, tensor=None, row=None, block=None):
    """Exactly finding `fid` (and nothing else), with an example at tensor/row/block."""
    assert ids(report) == [fid], json.dumps(report["findings"], indent=1)
    f = finding(report, fid)
    assert f["severity"] == severity(fid)
    assert rc == (1 if f["severity"] == "error" else 0)
    assert report["verdict"] == ("errors" if rc == 1 else "warnings")
    assert f["count"] >= 1 and f["summary"] and f["consequence"] and f["fix"]
    if tensor is not None:
        places = [(e["tensor"], e["row"], e["block"]) for e in f["examples"]]
        assert (tensor, row, block) in places, places
    return f


# ---------------------------------------------------------------------------------------------
# Clean checkpoints: no finding at all, sampled and in full.

@pytest.mark.parametrize("family", list(BUILDERS))
def test_clean_checkpoint_has_no_finding(tmp_path, family):
    path = clean(family).write(tmp_path / family)
    for args in ((), ("--full",)):
        rc, report = check(path, *args)
        assert rc == 0 and report["findings"] == [] and report["verdict"] == "clean", \
            json.dumps(report["findings"], indent=1)
        assert report["schema_version"] == 1
        assert report["modules_checked"] > 0 and report["tensors_never_written"] == 0
        assert report["sampled"] == (args == ())
    # The text report says the same.
    proc = run("check", path)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: no findings"), proc.stdout


def test_clean_checkpoints_inspect_without_errors(tmp_path):
    """The fixtures are what inspect recognizes: a guard that the families are well formed."""
    expected = {"modelopt-qwen3": "nvfp4", "modelopt-dsv3": "nvfp4", "ct-nvfp4": "nvfp4",
                "gpt-oss-mxfp4": "mxfp4", "dsv4-mxfp4": "mxfp4", "dsv3-fp8": "fp8_block",
                "modelopt-fp8": "fp8_tensor"}
    for family, scheme in expected.items():
        path = clean(family).write(tmp_path / family)
        proc = run("inspect", path, "--json")
        assert proc.returncode == 0, proc.stderr
        manifest = json.loads(proc.stdout)
        assert manifest["summary"]["routed_experts"] == scheme, (family, manifest["summary"])
        assert not [f for f in manifest["findings"] if f["severity"] == "error"], \
            (family, manifest["findings"])


# ---------------------------------------------------------------------------------------------
# One defect at a time. Each case: (finding id, family, injector, extra check arguments); the
# injector edits the clean checkpoint and returns the expected example (tensor, row, block).

def set_code(ck, name, index, code):
    a = ck.tensors[name]
    u = a.view(np.uint8).copy()
    u[index] = code
    ck.tensors[name] = u.view(a.dtype)


def set_value(ck, name, index, value):
    a = ck.tensors[name].copy()
    a[index] = value
    ck.tensors[name] = a


def scale_2_name(layer, e, proj):
    return f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight_scale_2"


def inj_nan_e4m3(ck):
    name = "model.layers.1.mlp.experts.2.up_proj.weight_scale"
    set_code(ck, name, (37, 5), 0x7F)
    return name, 37, 5


def inj_nan_e8m0(ck):
    name = "layers.0.ffn.experts.3.w2.scale"
    set_code(ck, name, (200, 2), 0xFF)
    return name, 200, 2


def inj_nan_gpt_oss(ck):
    # The scale tensor is [E, N, G]; its rows are numbered e * N + n.
    name = "model.layers.2.mlp.experts.gate_up_proj_scales"
    n = ck.tensors[name].shape[1]
    set_code(ck, name, (3, 17, 1), 0xFF)
    return name, 3 * n + 17, 1


def inj_nan_fp8_attention(ck):
    name = "layers.1.attn.wq_a.scale"
    set_code(ck, name, (0, 1), 0xFF)
    return name, 0, 1


def inj_ws2_nan(ck):
    name = scale_2_name(1, 3, "down_proj")
    ck.tensors[name] = np.array(np.nan, F32)
    return name, None, None


def inj_ws2_inf(ck):
    name = scale_2_name(0, 1, "gate_proj")
    ck.tensors[name] = np.array(np.inf, F32)
    return name, None, None


def inj_fp8_weight_scale_nan(ck):
    name = "model.layers.0.mlp.experts.3.up_proj.weight_scale"
    ck.tensors[name] = np.array(np.nan, F32)
    return name, None, None


def inj_fp8_weight_scale_times_1000(ck):
    name = "model.layers.1.mlp.experts.0.gate_proj"
    ck.tensors[f"{name}.weight_scale"] = (ck.tensors[f"{name}.weight_scale"] * F32(1000)).astype(F32)
    return f"{name}.weight", None, None


def inj_scale_inv_inf(ck):
    name = "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv"
    set_value(ck, name, (2, 1), np.inf)
    return name, 2, 1


def inj_scale_inv_nan(ck):
    name = "model.layers.0.self_attn.q_a_proj.weight_scale_inv"
    set_value(ck, name, (1, 0), np.nan)
    return name, 1, 0


def inj_ws2_zero(ck):
    name = scale_2_name(1, 0, "down_proj")
    ck.tensors[name] = np.array(0.0, F32)
    return name, None, None


def inj_ws2_negative(ck):
    name = scale_2_name(0, 2, "up_proj")
    ck.tensors[name] = -ck.tensors[name]
    return name, None, None


def inj_global_negative(ck):
    name = "model.layers.1.mlp.experts.1.down_proj.weight_global_scale"
    ck.tensors[name] = -ck.tensors[name]
    return name, None, None


def inj_input_scale_zero(ck):
    name = "model.layers.0.mlp.experts.3.down_proj.input_scale"
    ck.tensors[name] = np.array(0.0, F32)
    return name, None, None


def inj_input_scale_all_one(ck):
    """Every NVFP4 activation scale set to 1.0: the placeholder an uncalibrated export writes."""
    names = sorted(n for n in ck.tensors if n.endswith(".input_scale"))
    assert len(names) > 1
    for n in names:
        ck.tensors[n] = np.array(1.0, F32)
    return names[0], None, None


def inj_scale_inv_zero(ck):
    name = "model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv"
    set_value(ck, name, (1, 2), 0.0)
    return name, 1, 2


def inj_scale_inv_negative(ck):
    name = "model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv"
    set_value(ck, name, (0, 0), -ck.tensors[name][0, 0])
    return name, 0, 0


def inj_e4m3_negative(ck):
    # A UE4M3 block scale with its sign bit set: no quantizer writes it.
    name = "model.layers.0.mlp.experts.0.down_proj.weight_scale"
    code = int(ck.tensors[name].view(np.uint8)[100, 3])
    set_code(ck, name, (100, 3), code | 0x80)
    return name, 100, 3


def inj_modelopt_reciprocal(ck):
    # weight_scale_2 holding compressed-tensors' 2688 / amax.
    name = scale_2_name(1, 1, "gate_proj")
    ck.tensors[name] = np.array(F32(1) / ck.tensors[name], F32)
    return name, None, None


def inj_ct_multiplier(ck):
    # weight_global_scale holding ModelOpt's amax / 2688.
    name = "model.layers.0.mlp.experts.2.down_proj.weight_global_scale"
    ck.tensors[name] = (F32(1) / ck.tensors[name]).astype(F32)
    return name, None, None


def inj_drop_input_scale(ck):
    name = "model.layers.1.mlp.experts.0.down_proj"
    del ck.tensors[f"{name}.input_scale"]
    return f"{name}.weight", None, None


def inj_drop_input_global_scale(ck):
    name = "model.layers.0.mlp.experts.3.gate_proj"
    del ck.tensors[f"{name}.input_global_scale"]
    return f"{name}.weight_packed", None, None


def inj_input_scale_nan(ck):
    name = "model.layers.0.mlp.experts.2.up_proj.input_scale"
    ck.tensors[name] = np.array(np.nan, F32)
    return name, None, None


def inj_exclude_nothing_modelopt(ck):
    pattern = "model.layers.*.mlp.shared_expert"
    ck.configs["hf_quant_config.json"]["quantization"]["exclude_modules"].append(pattern)
    ck.configs["config.json"]["quantization_config"]["ignore"].append(pattern)
    return pattern, None, None


def inj_exclude_nothing_gpt_oss(ck):
    pattern = "model.layers.*.self_attention"  # gpt-oss names it self_attn
    ck.configs["config.json"]["quantization_config"]["modules_to_not_convert"].append(pattern)
    return pattern, None, None


def inj_excluded_lm_head(ck, rng_seed=7):
    # lm_head exported in NVFP4 although both configs exclude it.
    rng = np.random.default_rng(rng_seed)
    del ck.tensors["lm_head.weight"]
    packed, scales, s2 = nvfp4(gauss(rng, 64, 128))
    put_nvfp4(ck.tensors, "lm_head", packed, scales, s2, F32(0.001))
    return "lm_head.weight", None, None


def inj_quantized_router(ck):
    # DeepSeek-V4 keeps the router gate BF16; here it holds MXFP4 that no config declares.
    rng = np.random.default_rng(8)
    name = "layers.1.ffn.gate"
    packed, codes = mxfp4(gauss(rng, *ck.tensors[f"{name}.weight"].shape))
    ck.tensors[f"{name}.weight"] = packed.view(np.int8)
    ck.tensors[f"{name}.scale"] = codes.view(E8M0)
    return f"{name}.weight", None, None


def inj_bf16_expert(ck):
    rng = np.random.default_rng(9)
    name = "model.layers.1.mlp.experts.3.down_proj"
    shape = ck.tensors[f"{name}.weight"].shape
    for suffix in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
        del ck.tensors[f"{name}.{suffix}"]
    ck.tensors[f"{name}.weight"] = bf16(rng, shape[0], shape[1] * 2)
    return f"{name}.weight", None, None


def inj_zero_tensor(ck):
    name = "model.layers.0.mlp.experts.1.up_proj.weight"
    ck.tensors[name] = np.zeros_like(ck.tensors[name])
    return name, None, None


def inj_zero_tensor_gpt_oss(ck):
    name = "model.layers.1.mlp.experts.down_proj_blocks"
    ck.tensors[name] = np.zeros_like(ck.tensors[name])
    return name, None, None


def inj_zero_blocks(ck):
    # Three quarters of the blocks of every row zeroed (bytes 0x00 and 0x88: +0 and -0 pairs).
    name = "layers.1.ffn.experts.2.w2.weight"
    a = ck.tensors[name].view(np.uint8).copy()
    q = a.shape[1] * 3 // 4
    a[:, :q] = 0
    a[::2, :q:2] = 0x88
    ck.tensors[name] = a.view(np.int8)
    return name, None, None


def inj_per_channel_broadcast(ck):
    # One scale per output channel copied into every block of the row (8 blocks: K = 128).
    name = "model.layers.1.mlp.experts.1.up_proj.weight_scale"
    u = ck.tensors[name].view(np.uint8)
    row_max = u.max(axis=1, keepdims=True)
    ck.tensors[name] = np.broadcast_to(row_max, u.shape).copy().view(E4M3)
    return name, None, None


def inj_per_channel_broadcast_mx(ck):
    name = "layers.0.ffn.experts.1.w1.scale"
    u = ck.tensors[name].view(np.uint8)
    ck.tensors[name] = np.broadcast_to(u.max(axis=1, keepdims=True), u.shape).copy().view(E8M0)
    return name, None, None


def inj_transposed_grid(ck):
    # Scales constant down each block column, varying along K: a grid written column-major.
    name = "model.layers.0.mlp.experts.2.gate_proj.weight_scale"
    u = ck.tensors[name].view(np.uint8)
    ck.tensors[name] = np.broadcast_to(u.max(axis=0, keepdims=True), u.shape).copy().view(E4M3)
    return name, None, None


def inj_fp8_nan_weight(ck):
    name = "model.layers.1.mlp.experts.3.gate_proj.weight"
    set_code(ck, name, (150, 300), 0x7F)
    return name, 150, 2


def inj_fp8_nan_weight_attention(ck):
    name = "layers.0.attn.wq_a.weight"
    set_code(ck, name, (5, 130), 0xFF)
    return name, 5, 1


def inj_scale_2_times_1000(ck):
    name = scale_2_name(1, 2, "down_proj")
    ck.tensors[name] = (ck.tensors[name] * F32(1000)).astype(F32)
    return "model.layers.1.mlp.experts.2.down_proj.weight", None, None


def inj_e8m0_plus_10(ck):
    name = "layers.0.ffn.experts.2.w2"
    u = ck.tensors[f"{name}.scale"].view(np.uint8)
    ck.tensors[f"{name}.scale"] = (u + 10).astype(np.uint8).view(E8M0)
    return f"{name}.weight", None, None


def inj_shape_group32(ck):
    name = "model.layers.0.mlp.experts.1.down_proj.weight_scale"
    u = ck.tensors[name].view(np.uint8)
    ck.tensors[name] = u[:, ::2].copy().view(E4M3)  # [N, K/32]: the MX grid
    return name, None, None


def inj_shape_transposed(ck):
    name = "model.layers.1.mlp.experts.0.gate_proj.weight_scale"
    ck.tensors[name] = ck.tensors[name].T.copy()  # [K/16, N]: same element count
    return name, None, None


def inj_shape_fp8_grid(ck):
    name = "model.layers.0.mlp.experts.2.up_proj.weight_scale_inv"
    ck.tensors[name] = ck.tensors[name][:, :2].copy()  # [2, 2] for K = 320 needs [2, 3]
    return name, None, None


def inj_shape_gpt_oss(ck):
    name = "model.layers.1.mlp.experts.gate_up_proj_scales"
    ck.tensors[name] = ck.tensors[name][:, :, :3].copy()
    return name, None, None


def inj_shape_scale_2_vector(ck):
    # A per-channel weight_scale_2 [N] where ModelOpt stores one float.
    name = scale_2_name(0, 3, "down_proj")
    n = ck.tensors[name.replace("weight_scale_2", "weight")].shape[0]
    ck.tensors[name] = np.full(n, ck.tensors[name], F32)
    return name, None, None


def inj_shape_mx_rows(ck):
    name = "layers.1.ffn.experts.0.w3.scale"
    ck.tensors[name] = ck.tensors[name][:-1].copy()  # one row short
    return name, None, None


CASES = [
    ("scale_shape_mismatch", "modelopt-qwen3", inj_shape_group32, ()),
    ("scale_shape_mismatch", "ct-nvfp4", inj_shape_transposed, ()),
    ("scale_shape_mismatch", "dsv3-fp8", inj_shape_fp8_grid, ()),
    ("scale_shape_mismatch", "gpt-oss-mxfp4", inj_shape_gpt_oss, ()),
    ("scale_shape_mismatch", "dsv4-mxfp4", inj_shape_mx_rows, ()),
    ("scale_shape_mismatch", "modelopt-dsv3", inj_shape_scale_2_vector, ()),
    ("scale_nan_code", "modelopt-qwen3", inj_nan_e4m3, ()),
    ("scale_nan_code", "dsv4-mxfp4", inj_nan_e8m0, ()),
    ("scale_nan_code", "gpt-oss-mxfp4", inj_nan_gpt_oss, ()),
    ("scale_nan_code", "dsv4-mxfp4", inj_nan_fp8_attention, ()),
    ("scale_not_finite", "modelopt-dsv3", inj_ws2_nan, ()),
    ("scale_not_finite", "modelopt-qwen3", inj_ws2_inf, ()),
    ("scale_not_finite", "dsv3-fp8", inj_scale_inv_inf, ()),
    ("scale_not_finite", "dsv3-fp8", inj_scale_inv_nan, ()),
    ("scale_not_finite", "modelopt-fp8", inj_fp8_weight_scale_nan, ()),
    ("tensor_scale_nonpositive", "modelopt-qwen3", inj_ws2_zero, ()),
    ("tensor_scale_nonpositive", "modelopt-dsv3", inj_ws2_negative, ()),
    ("tensor_scale_nonpositive", "ct-nvfp4", inj_global_negative, ()),
    ("tensor_scale_nonpositive", "modelopt-qwen3", inj_input_scale_zero, ()),
    ("block_scale_nonpositive", "dsv3-fp8", inj_scale_inv_zero, ()),
    ("block_scale_nonpositive", "dsv3-fp8", inj_scale_inv_negative, ()),
    ("block_scale_nonpositive", "modelopt-qwen3", inj_e4m3_negative, ()),
    ("global_scale_convention", "modelopt-qwen3", inj_modelopt_reciprocal, ()),
    ("global_scale_convention", "ct-nvfp4", inj_ct_multiplier, ()),
    ("input_scale_default", "modelopt-qwen3", inj_input_scale_all_one, ()),
    ("w4a4_without_input_scale", "modelopt-qwen3", inj_drop_input_scale, ()),
    ("w4a4_without_input_scale", "ct-nvfp4", inj_drop_input_global_scale, ()),
    ("w4a4_without_input_scale", "modelopt-dsv3", inj_input_scale_nan, ()),
    ("exclude_matches_nothing", "modelopt-qwen3", inj_exclude_nothing_modelopt, ()),
    ("exclude_matches_nothing", "gpt-oss-mxfp4", inj_exclude_nothing_gpt_oss, ()),
    ("excluded_but_quantized", "modelopt-dsv3", inj_excluded_lm_head, ()),
    ("quantized_but_not_declared", "dsv4-mxfp4", inj_quantized_router, ()),
    ("declared_but_not_quantized", "modelopt-qwen3", inj_bf16_expert, ()),
    ("all_zero_tensor", "modelopt-qwen3", inj_zero_tensor, ()),
    ("all_zero_tensor", "gpt-oss-mxfp4", inj_zero_tensor_gpt_oss, ()),
    ("all_zero_blocks_share", "dsv4-mxfp4", inj_zero_blocks, ()),
    ("scale_range_suspicious", "modelopt-qwen3", inj_per_channel_broadcast, ()),
    ("scale_range_suspicious", "dsv4-mxfp4", inj_per_channel_broadcast_mx, ()),
    ("scale_range_suspicious", "modelopt-dsv3", inj_transposed_grid, ()),
    ("dequant_not_finite", "dsv3-fp8", inj_fp8_nan_weight, ("--full",)),
    ("dequant_not_finite", "dsv4-mxfp4", inj_fp8_nan_weight_attention, ("--full",)),
    ("weight_magnitude_outlier", "modelopt-qwen3", inj_scale_2_times_1000, ()),
    ("weight_magnitude_outlier", "dsv4-mxfp4", inj_e8m0_plus_10, ()),
    ("weight_magnitude_outlier", "modelopt-fp8", inj_fp8_weight_scale_times_1000, ()),
]


@pytest.mark.parametrize("fid,family,inject,args", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2].__name__[4:]}" for c in CASES])
def test_injected_defect_is_found_alone(tmp_path, fid, family, inject, args):
    ck = clean(family)
    tensor, row, block = inject(ck)
    path = ck.write(tmp_path / "ck")
    rc, report = check(path, *args)
    assert_only(report, rc, fid, tensor, row, block)


def test_global_scale_convention_detail_reads_both_ways(tmp_path):
    ck = clean("modelopt-qwen3")
    name = scale_2_name(1, 1, "gate_proj")
    module = name[:-len(".weight_scale_2")]
    true_scale = float(ck.tensors[name])
    dequant = dequant_nvfp4(ck.tensors[f"{module}.weight"], ck.tensors[f"{module}.weight_scale"],
                            true_scale)
    inj_modelopt_reciprocal(ck)
    _, report = check(ck.write(tmp_path / "ck"))
    detail = finding(report, "global_scale_convention")["examples"][0]["detail"]
    # Read as the divisor it is, the implied |w|max is 6 * largest block scale * scale_2: the
    # largest dequantized magnitude (an E2M1 6 sits in the block holding the amax).
    amax = re.search(r"as a divisor, \|w\|max = ([0-9.e+-]+)", detail)
    assert amax, detail
    assert float(amax.group(1)) == pytest.approx(float(np.abs(dequant).max()), rel=1e-2)


def test_gate_up_scale_mismatch_counts_per_layer_and_worst_ratio(tmp_path, rng):
    ck = clean("modelopt-qwen3")
    # Re-export three experts with separate gate/up scales (and one up projection 3x larger).
    hit = {(0, 1): 1.0, (0, 3): 3.0, (1, 2): 1.0}
    ratios = {}
    for (layer, e), gain in hit.items():
        for proj, scale in (("gate_proj", 1.0), ("up_proj", gain)):
            m = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
            w = gauss(rng, 64, 128) * F32(scale)
            packed, scales, s2 = nvfp4(w)
            ck.tensors[f"{m}.weight"], ck.tensors[f"{m}.weight_scale"] = packed, scales
            ck.tensors[f"{m}.weight_scale_2"] = np.array(s2, F32)
        g = float(ck.tensors[scale_2_name(layer, e, "gate_proj")])
        u = float(ck.tensors[scale_2_name(layer, e, "up_proj")])
        ratios[(layer, e)] = max(g, u) / min(g, u)
    rc, report = check(ck.write(tmp_path / "ck"))
    f = assert_only(report, rc, "gate_up_scale_mismatch",
                    scale_2_name(0, 3, "gate_proj"), None, None)
    assert f["count"] == 3
    worst = max(ratios.values())
    m = re.search(r"3 of 8 gate/up pairs in 2 of 2 layers differ; worst ratio ([0-9.]+)",
                  f["summary"])
    assert m, f["summary"]
    assert float(m.group(1)) == pytest.approx(worst, rel=1e-3)
    # The worst pair comes first, with its layer's count.
    first = f["examples"][0]
    assert first["tensor"] == scale_2_name(0, 3, "gate_proj")
    assert "model.layers.0: 2 of 4 pairs differ" in first["detail"]
    by_tensor = {e["tensor"]: e["detail"] for e in f["examples"]}
    assert "model.layers.1: 1 of 4 pairs differ" in \
        by_tensor[scale_2_name(1, 2, "gate_proj")]


def test_zero_sample_is_confirmed_on_the_whole_tensor(tmp_path):
    # Every sampled row zero but one row is not: not an all-zero tensor, a zero-block share.
    ck = clean("dsv3-fp8")
    name = "model.layers.1.mlp.experts.0.down_proj.weight"
    a = np.zeros_like(ck.tensors[name].view(np.uint8))
    a[-1] = ck.tensors[name].view(np.uint8)[-1]
    ck.tensors[name] = a.view(E4M3)
    path = ck.write(tmp_path / "ck")
    rc, report = check(path, "--sample-rows", "4")
    f = assert_only(report, rc, "all_zero_blocks_share", name, None, None)
    rc, report = check(path, "--full")
    assert_only(report, rc, "all_zero_blocks_share", name, None, None)
    a[-1] = 0x80  # -0 everywhere: all zero
    ck.tensors[name] = a.view(E4M3)
    rc, report = check(ck.write(tmp_path / "ck2"))
    assert_only(report, rc, "all_zero_tensor", name, None, None)


def test_rows_of_different_magnitude_are_not_a_broadcast(tmp_path, rng):
    # Real weights differ in scale from row to row; their MX scale rows are not constant by that
    # alone (scale_range_suspicious judges against chance and asks for lines of 8+ blocks).
    ck = clean("dsv4-mxfp4")
    for name in [n for n in ck.tensors if re.fullmatch(r"layers\.\d+\.ffn\.experts\.\d+\.w[13]\.weight", n)]:
        n, k = ck.tensors[name].shape[0], ck.tensors[name].shape[1] * 2
        std = 0.02 * np.exp2(np.round(rng.uniform(0, 3, (n, 1))) + 0.5)
        packed, codes = mxfp4((rng.standard_normal((n, k)) * std).astype(F32))
        ck.tensors[name] = packed.view(np.int8)
        ck.tensors[name.replace(".weight", ".scale")] = codes.view(E8M0)
    rc, report = check(ck.write(tmp_path / "ck"), "--full")
    assert rc == 0 and report["findings"] == [], report["findings"]


def test_w4a16_needs_no_input_scale(tmp_path):
    ck = clean("modelopt-qwen3")
    for name in [n for n in ck.tensors if n.endswith(".input_scale")]:
        del ck.tensors[name]
    ck.configs["config.json"]["quantization_config"]["quant_algo"] = "W4A16_NVFP4"
    ck.configs["hf_quant_config.json"]["quantization"]["quant_algo"] = "W4A16_NVFP4"
    rc, report = check(ck.write(tmp_path / "ck"))
    assert rc == 0 and report["findings"] == [], report["findings"]


def test_text_report_and_threads(tmp_path):
    ck = clean("dsv4-mxfp4")
    inj_nan_e8m0(ck)
    path = ck.write(tmp_path / "ck")
    proc = run("check", path)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("FAIL: 1 error finding and 0 warnings")
    assert "error [scale_nan_code]" in proc.stdout
    assert "layers.0.ffn.experts.3.w2.scale row 200 block 2: code 0xFF" in proc.stdout
    reports = [check(path, "--threads", t)[1] for t in ("1", "2")]
    for r in reports:
        r.pop("seconds")
        r.pop("memory_bound_bytes")  # per thread
    assert reports[0] == reports[1]


def test_seed_picks_reproducible_rows(tmp_path):
    # A NaN FP8 weight in one row: with half the rows sampled, some seeds see it and some do not,
    # and each seed gives the same report every time.
    ck = clean("dsv3-fp8")
    name = "model.layers.0.mlp.experts.1.up_proj.weight"
    set_code(ck, name, (123, 45), 0x7F)
    path = ck.write(tmp_path / "ck")
    seen = {}
    for seed in range(10):
        runs = [check(path, "--seed", str(seed), "--sample-rows", "100")[1] for _ in range(2)]
        for r in runs:
            r.pop("seconds")
        assert runs[0] == runs[1], f"seed {seed} is not reproducible"
        seen[seed] = ids(runs[0])
        assert seen[seed] in ([], ["dequant_not_finite"]), seen[seed]
        if seen[seed]:
            f = finding(runs[0], "dequant_not_finite")
            assert [(e["tensor"], e["row"], e["block"]) for e in f["examples"]] == [(name, 123, 0)]
    assert {bool(v) for v in seen.values()} == {True, False}, seen


def test_bad_input_exits_2(tmp_path):
    assert run("check", tmp_path / "nope").returncode == 2
    (tmp_path / "empty").mkdir()
    proc = run("check", tmp_path / "empty", "--json")
    err = json.loads(proc.stdout)  # the error object of docs/schema/error.schema.json
    assert proc.returncode == 2 and err["schema_version"] == 1
    assert err["error"]["kind"] == "bad_input" and "no *.safetensors" in err["error"]["message"]
    ck = clean("ct-nvfp4")
    path = ck.write(tmp_path / "badconfig")
    (path / "config.json").write_text("{ not json")
    proc = run("check", path)
    assert proc.returncode == 2 and "config.json" in proc.stderr
    path = sharded().write(tmp_path / "badindex")
    (path / "model.safetensors.index.json").write_text('{"weight_map": []}')
    proc = run("check", path)
    assert proc.returncode == 2 and "weight_map" in proc.stderr
    assert run("check").returncode == 2
    assert run("check", path, "--sample-rows", "0").returncode == 2


# ---------------------------------------------------------------------------------------------
# Shards: a truncated shard and an index naming a missing shard are one finding each; the
# other shards are still checked.

def sharded(family="modelopt-qwen3"):
    ck = clean(family)
    # Layer 1's experts 2 and 3 in shard 3, the rest of layer 1 in shard 2, everything else in 1.
    ck.shards = {}
    for name in ck.tensors:
        shard = 1
        if name.startswith("model.layers.1."):
            shard = 3 if re.match(r"model\.layers\.1\.mlp\.experts\.[23]\.", name) else 2
        ck.shards[name] = f"model-0000{shard}-of-00003.safetensors"
    return ck


def modules_in(ck, shard=None):
    names = {n.rsplit(".", 1)[0] for n in ck.tensors if n.endswith(".weight_scale")}
    return {m for m in names if shard is None or ck.shards[m + ".weight"] == shard}


def test_sharded_clean(tmp_path):
    ck = sharded()
    rc, report = check(ck.write(tmp_path / "ck"))
    assert rc == 0 and report["findings"] == []
    assert report["modules_checked"] == len(modules_in(ck))


def test_truncated_shard(tmp_path):
    ck = sharded()
    path = ck.write(tmp_path / "ck")
    shard = "model-00003-of-00003.safetensors"
    data = (path / shard).read_bytes()
    (path / shard).write_bytes(data[:len(data) - 1000])
    rc, report = check(path)
    f = assert_only(report, rc, "shard_unreadable", shard, None, None)
    assert f["count"] == 1
    assert report["modules_checked"] == len(modules_in(ck)) - len(modules_in(ck, shard))


def test_not_safetensors_shard(tmp_path):
    ck = sharded()
    path = ck.write(tmp_path / "ck")
    shard = "model-00002-of-00003.safetensors"
    (path / shard).write_bytes(b"<html>Not Found</html>")
    rc, report = check(path)
    assert_only(report, rc, "shard_unreadable", shard, None, None)
    assert report["modules_checked"] == len(modules_in(ck)) - len(modules_in(ck, shard))


def test_index_names_missing_shard(tmp_path):
    ck = sharded()
    path = ck.write(tmp_path / "ck")
    shard = "model-00003-of-00003.safetensors"
    (path / shard).unlink()
    rc, report = check(path)
    f = assert_only(report, rc, "shard_missing", shard, None, None)
    assert f["count"] == 1
    assert report["modules_checked"] == len(modules_in(ck)) - len(modules_in(ck, shard))


# ---------------------------------------------------------------------------------------------
# A sparse, header-only checkpoint: every tensor a file hole, reported quickly without reading.

def test_sparse_full_size_checkpoint(tmp_path):
    path = tmp_path / "sparse"
    proc = run("synth", "dsv4-mxfp4", path, "--full-size", timeout=120)
    assert proc.returncode == 0, proc.stderr
    start = time.monotonic()
    rc, report = check(path)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"check of a sparse checkpoint took {elapsed:.1f} s"
    f = assert_only(report, rc, "all_zero_tensor")
    assert report["tensors_never_written"] == f["count"] > 1000
    assert report["weight_bytes_read"] == 0
    assert "never written" in f["examples"][0]["detail"]
    assert report["bytes_total"] > 100e9


def sparsify(path, block=4096):
    """Rewrites a file leaving every all-zero 4 KiB block unwritten (a hole)."""
    data = path.read_bytes()
    zero = bytes(block)
    with open(path, "wb") as f:
        for off in range(0, len(data), block):
            chunk = data[off:off + block]
            if chunk == zero[:len(chunk)] and len(chunk) == block:
                f.seek(off + block)
            else:
                f.seek(off)
                f.write(chunk)
        f.truncate(len(data))


def test_scales_are_read_when_weights_are_holes(tmp_path):
    # Header-only weights with real scales (bench_check's layout): every weight is reported as
    # never written and every scale is still read in full, so a NaN scale is still found.
    ck = modelopt_nvfp4(np.random.default_rng(3), hidden=256, inter=128)
    weights = [n for n in ck.tensors if re.fullmatch(r".*experts\.\d+\.\w+_proj\.weight", n)]
    for name in weights:
        ck.tensors[name] = np.zeros_like(ck.tensors[name])
    nan_at = "model.layers.0.mlp.experts.1.down_proj.weight_scale"
    set_code(ck, nan_at, (200, 7), 0x7F)
    path = ck.write(tmp_path / "ck")
    sparsify(path / "model.safetensors")
    rc, report = check(path)
    assert ids(report) == ["scale_nan_code", "all_zero_tensor"], report["findings"]
    assert rc == 1
    nan = finding(report, "scale_nan_code")
    assert [(e["tensor"], e["row"], e["block"]) for e in nan["examples"]] == [(nan_at, 200, 7)]
    assert finding(report, "all_zero_tensor")["count"] == len(weights) == \
        report["tensors_never_written"]
    assert all(e["detail"] == "a file hole: never written"
               for e in finding(report, "all_zero_tensor")["examples"])
    scales = sum(a.nbytes for n, a in ck.tensors.items()
                 if n.rsplit(".", 1)[0] + ".weight" in weights and not n.endswith(".weight"))
    assert report["scale_bytes_read"] == scales and report["weight_bytes_read"] == 0
    assert report["modules_checked"] == len(weights)


# ---------------------------------------------------------------------------------------------
# Property: a NaN scale code at a random tensor, row and block is found exactly there.

NAN_FAMILIES = ("modelopt-qwen3", "ct-nvfp4", "gpt-oss-mxfp4", "dsv4-mxfp4")


def one_byte_scales(ck):
    """Block-scale tensors of one byte per scale (FP8 weights have the same dtypes: by name)."""
    return sorted(n for n, a in ck.tensors.items()
                  if n.endswith((".scale", ".weight_scale", "_scales")) and a.dtype.itemsize == 1)


def test_random_nan_scale_is_found_at_its_place(tmp_path, rng):
    seed = int(rng.integers(1 << 31))
    print(f"[property seed {seed}]")
    r = np.random.default_rng(seed)
    for trial in range(12):
        family = NAN_FAMILIES[trial % len(NAN_FAMILIES)]
        ck = clean(family)
        name = str(r.choice(one_byte_scales(ck)))
        a = ck.tensors[name]
        index = tuple(int(r.integers(d)) for d in a.shape)
        e4m3_scale = a.dtype == np.dtype(E4M3)
        code = int(r.choice([0x7F, 0xFF])) if e4m3_scale else 0xFF
        set_code(ck, name, index, code)
        row = int(np.ravel_multi_index(index[:-1], a.shape[:-1]))
        rc, report = check(ck.write(tmp_path / f"t{trial}"), "--seed", str(seed))
        where = f"seed {seed} trial {trial}: {name} {index} code {code:#x}"
        assert ids(report) == ["scale_nan_code"], (where, report["findings"])
        f = finding(report, "scale_nan_code")
        assert rc == 1 and f["count"] == 1, where
        assert [(e["tensor"], e["row"], e["block"]) for e in f["examples"]] == \
            [(name, row, index[-1])], where


# ---------------------------------------------------------------------------------------------
# Check's values against an independent numpy dequantization.

def rms_of(ck, module):
    t = ck.tensors
    if f"{module}.weight_scale_2" in t:
        w = dequant_nvfp4(t[f"{module}.weight"], t[f"{module}.weight_scale"],
                          t[f"{module}.weight_scale_2"])
    elif f"{module}.weight_scale_inv" in t:
        w = dequant_fp8_block(t[f"{module}.weight"], t[f"{module}.weight_scale_inv"])
    else:
        w = dequant_mxfp4(t[f"{module}.weight"], t[f"{module}.scale"])
    return float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))


@pytest.mark.parametrize("family,inject,peer", [
    ("modelopt-qwen3", inj_scale_2_times_1000, r"model\.layers\.\d+\.mlp\.experts\.\d+\.down_proj"),
    ("dsv4-mxfp4", inj_e8m0_plus_10, r"layers\.\d+\.ffn\.experts\.\d+\.w2"),
])
def test_outlier_rms_matches_numpy(tmp_path, family, inject, peer):
    ck = clean(family)
    tensor, _, _ = inject(ck)
    _, report = check(ck.write(tmp_path / "ck"), "--full")
    detail = finding(report, "weight_magnitude_outlier")["examples"][0]["detail"]
    m = re.search(r"RMS ([0-9.e+-]+), ([0-9.e+-]+)x the median ([0-9.e+-]+) of (\d+) peers", detail)
    assert m, detail
    module = tensor[:-len(".weight")]
    peers = sorted(n[:-len(".weight")] for n in ck.tensors
                   if re.fullmatch(peer + r"\.weight", n))
    rms = {p: rms_of(ck, p) for p in peers}
    median = sorted(rms.values())[len(rms) // 2]
    assert int(m.group(4)) == len(peers)
    assert float(m.group(1)) == pytest.approx(rms[module], rel=1e-3)
    assert float(m.group(3)) == pytest.approx(median, rel=1e-3)


def test_dequant_not_finite_position_matches_numpy(tmp_path):
    ck = clean("dsv3-fp8")
    name = "model.layers.0.mlp.experts.0.down_proj.weight"
    places = [(7, 5), (300, 199), (130, 64)]
    for r, c in places:
        set_code(ck, name, (r, c), 0xFF)
    rc, report = check(ck.write(tmp_path / "ck"), "--full")
    f = assert_only(report, rc, "dequant_not_finite")
    w = dequant_fp8_block(ck.tensors[name], ck.tensors[name.replace("weight", "weight_scale_inv")])
    rows, cols = np.nonzero(~np.isfinite(w))
    expected = sorted({(name, int(r), int(c) // 128) for r, c in zip(rows, cols)})
    assert f["count"] == len(places)
    assert sorted((e["tensor"], e["row"], e["block"]) for e in f["examples"]) == expected


# ---------------------------------------------------------------------------------------------
# The finding table, --help and docs/CHECK.md agree, and every id has a fixture here.

SEPARATE_TESTS = {
    "shard_unreadable": "test_truncated_shard",
    "shard_missing": "test_index_names_missing_shard",
    "gate_up_scale_mismatch": "test_gate_up_scale_mismatch_counts_per_layer_and_worst_ratio",
}


def doc_ids():
    text = (ROOT / "docs" / "CHECK.md").read_text()
    return re.findall(r"^### `(\w+)`", text, re.M), text


def test_every_finding_id_has_an_injection_fixture():
    covered = {c[0] for c in CASES} | set(SEPARATE_TESTS)
    assert covered == set(help_ids())


def test_docs_list_exactly_the_help_ids():
    listed, text = doc_ids()
    assert listed == list(help_ids()), "docs/CHECK.md and `fp4moe check --help` disagree"
    # The generated part is what the binary prints from the table, byte for byte.
    generated = run("check", "--findings-md").stdout
    begin, end = "<!-- BEGIN GENERATED: fp4moe check --findings-md -->\n", \
        "<!-- END GENERATED -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == generated, \
        "regenerate docs/CHECK.md: fp4moe check --findings-md"
    # Each id names its fixture in this file, and that fixture exists.
    fixtures = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", text, re.M))
    assert set(fixtures) == set(listed)
    names = set(globals())
    for fid, where in fixtures.items():
        for fn in re.findall(r"`(\w+)`", where):
            assert fn in names, f"docs/CHECK.md names fixture {fn} for {fid}: not in this file"


@pytest.mark.parametrize("layout", synth_layouts())
def test_every_synthetic_layout_and_its_conversion_has_no_error_finding(tmp_path, layout):
    """fp4moe's own synthetic layouts (real data for the MoE, file holes elsewhere) and, where
    convert applies, their conversions: no error finding, and the holes are reported as never
    written (zero F32 block scales over a never-written weight are not a defect of their own)."""
    src = tmp_path / layout
    subprocess.run([str(FP4MOE), "synth", layout, str(src)], check=True, capture_output=True)
    proc = run("check", src, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report["findings"]
    assert {f["id"] for f in report["findings"]} <= {"all_zero_tensor"}, report["findings"]
    assert report["tensors_never_written"] > 0
    if layout in ("dsv4-mxfp4",):
        out = tmp_path / "converted"
        subprocess.run([str(FP4MOE), "convert", str(src), str(out)], check=True,
                       capture_output=True)
        converted = json.loads(run("check", out, "--json").stdout)
        assert converted["verdict"] != "errors", converted["findings"]
        assert converted["modules_checked"] == report["modules_checked"]
