"""inspect on configs at the scale of the largest real ones: per-expert `quantized_layers` and
exclusion lists of ~25,000 entries, written here in two real dialects (ModelOpt's
hf_quant_config.json MIXED_PRECISION, compressed-tensors `ignore`). Each per-expert entry must be
judged against the module it names: no "matches no module" or "bare name" finding for entries that
name their module exactly, and the quantized/unquantized split follows the lists. The time is a
benchmark figure (bench_inspect BM_InspectHugeConfigs), not asserted here."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("FP4MOE_BUILD_DIR", Path(__file__).resolve().parents[2] / "build" / "release"))
FP4MOE = BUILD / "fp4moe"

LAYERS, EXPERTS, QUANTIZED_LAYERS = 94, 128, 65  # Qwen3-235B-A22B's shape
PROJ = ("gate_proj", "up_proj", "down_proj")
BASE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 4096,
        "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": LAYERS,
        "num_experts": EXPERTS, "num_experts_per_tok": 8, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": 128, "decoder_sparse_step": 1, "norm_topk_prob": True,
        "vocab_size": 151936, "torch_dtype": "bfloat16"}


def expert(layer, e, proj):
    return f"model.layers.{layer}.mlp.experts.{e}.{proj}"


def inspect(path):
    proc = subprocess.run([str(FP4MOE), "inspect", str(path), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def experts_by_scheme(manifest):
    counts = {}
    for m in manifest["modules"]:
        if m["role"] == "routed_experts":
            counts[m["scheme"]] = counts.get(m["scheme"], 0) + m["module_count"]
    return counts


def test_modelopt_per_expert_lists(tmp_path):
    layers, exclude = {}, []
    for layer in range(LAYERS):
        exclude.append(f"model.layers.{layer}.mlp.gate")
        for e in range(EXPERTS):
            for proj in PROJ:
                if layer < QUANTIZED_LAYERS:
                    layers[expert(layer, e, proj)] = {"quant_algo": "NVFP4", "group_size": 16}
                else:
                    exclude.append(expert(layer, e, proj))
    assert len(layers) == 24_960
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.35.0"},
         "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                          "quantized_layers": layers, "exclude_modules": exclude}}))
    manifest = inspect(tmp_path)
    codes = {f["code"] for f in manifest["findings"]}
    assert not codes & {"pattern_semantics", "pattern_unmatched", "roles_unnamed"}, manifest["findings"]
    per_layer = EXPERTS * len(PROJ)
    assert experts_by_scheme(manifest) == {"nvfp4": QUANTIZED_LAYERS * per_layer,
                                           "bf16": (LAYERS - QUANTIZED_LAYERS) * per_layer}
    assert manifest["summary"]["kv_cache"] == "fp8_tensor"


def test_compressed_tensors_per_expert_ignore(tmp_path):
    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
           "symmetric": True, "dynamic": False}
    ignore = ["lm_head"] + [f"re:.*layers\\.{layer}\\.mlp\\.gate$" for layer in range(LAYERS)]
    ignore += [expert(layer, e, proj) for layer in range(QUANTIZED_LAYERS) for e in range(EXPERTS)
               for proj in PROJ]
    config = dict(BASE, quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": fp4, "input_activations": fp4}},
        "ignore": ignore})
    (tmp_path / "config.json").write_text(json.dumps(config))
    manifest = inspect(tmp_path)
    codes = {f["code"] for f in manifest["findings"]}
    assert not codes & {"pattern_semantics", "pattern_unmatched", "roles_unnamed"}, manifest["findings"]
    per_layer = EXPERTS * len(PROJ)
    # The ignored experts stay BF16; every other Linear (the later layers' experts) is NVFP4.
    assert experts_by_scheme(manifest) == {"bf16": QUANTIZED_LAYERS * per_layer,
                                           "nvfp4": (LAYERS - QUANTIZED_LAYERS) * per_layer}
    assert manifest["summary"]["lm_head"] == "bf16"


@pytest.mark.parametrize("sibling", ["experts.1.gate_proj", "experts.0.gate_proj"])
def test_a_per_expert_entry_naming_a_missing_module_is_still_reported(tmp_path, sibling):
    """The expert-0 stand-in must not hide an entry that names no module at all."""
    layers = {expert(0, e, p): {"quant_algo": "NVFP4", "group_size": 16}
              for e in range(EXPERTS) for p in PROJ}
    layers[f"model.layers.0.mlp.{sibling}_typo"] = {"quant_algo": "NVFP4", "group_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE, num_hidden_layers=1)))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.35.0"},
         "quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers}}))
    manifest = inspect(tmp_path)
    unmatched = [f for f in manifest["findings"] if f["code"] == "pattern_unmatched"]
    assert unmatched and f"{sibling}_typo" in unmatched[0]["message"], manifest["findings"]
