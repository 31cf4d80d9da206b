"""Real MoE configs from outside the corpus (tests/data/outside, provenance in its SOURCES.md):
`fp4moe inspect --json` of each must succeed, match docs/schema/inspect.schema.json, and say what
the configs say, no more: the expectations below were written by reading each config (and, for
the families' module layout, the Hugging Face modeling code named beside them), not by running
the tool."""
import json
import os
import pathlib
import subprocess

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release")) / "fp4moe"
OUTSIDE = ROOT / "tests" / "data" / "outside"
SCHEMA = json.loads((ROOT / "docs" / "schema" / "inspect.schema.json").read_text())

ROLES = ("routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head", "mtp_experts",
         "kv_cache")

# dir -> {summary role: expected scheme, or a set of acceptable ones}, plus "findings": codes that
# must be present and "not": codes that must not. No quantization declared is bf16 (the config
# says so); a role the config cannot name is unknown, never a guessed bf16 or absent.
EXPECT = {
    # llama4: text model under text_config; 16 experts top-1 in every layer (interleave step 1),
    # a shared expert in every MoE block (HF Llama4TextMoe.shared_expert), no quantization.
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": {
        "routed_experts": "bf16", "shared_experts": "bf16", "attention": "bf16",
        "dense_mlp": "absent", "lm_head": "bf16", "mtp_experts": "absent", "kv_cache": "bf16"},
    # interleave_moe_layer_step 2: MoE in layers 1, 3, ..., 47 and a dense MLP
    # (intermediate_size_mlp) in the 24 others.
    "meta-llama__Llama-4-Maverick-17B-128E-Instruct": {
        "routed_experts": "bf16", "shared_experts": "bf16", "attention": "bf16",
        "dense_mlp": "bf16", "lm_head": "bf16", "mtp_experts": "absent", "kv_cache": "bf16"},
    # compressed-tensors FP8 128x128 blocks on every Linear but the ignored attention
    # projections, routers and lm_head; mlp_layer_types: layer 0 dense, 39 sparse; a shared expert
    # (shared_expert_intermediate_size); FP8 per-tensor KV cache.
    "poolside__Laguna-XS.2-FP8": {
        "routed_experts": "fp8_block", "shared_experts": "fp8_block", "attention": "bf16",
        "dense_mlp": "fp8_block", "lm_head": "bf16", "mtp_experts": "absent",
        "kv_cache": "fp8_tensor", "findings": {"names_assumed"}},
    # BF16; 512 experts in every layer (mlp_only_layers empty, decoder_sparse_step 1), a shared
    # expert; no MTP key in this config.
    "Qwen__Qwen3-Next-80B-A3B-Thinking": {
        "routed_experts": "bf16", "shared_experts": "bf16", "attention": "bf16",
        "dense_mlp": "absent", "lm_head": "bf16", "mtp_experts": "absent", "kv_cache": "bf16"},
    # VLM: qwen3_vl_moe_text under text_config, 128 experts, no shared expert, no quantization.
    "Qwen__Qwen3-VL-235B-A22B-Thinking": {
        "routed_experts": "bf16", "shared_experts": "absent", "attention": "bf16",
        "dense_mlp": "absent", "lm_head": "bf16", "mtp_experts": "absent", "kv_cache": "bf16"},
    # No quantization_config in config.json; hf_quant_config.json MIXED_PRECISION with every
    # layer's ffn.experts NVFP4 and *.attn.*, *.ffn.shared_experts.*, head, mtp.* excluded: the
    # excluded modules keep DeepSeek-V4's base (FP8 blocks; MXFP4 experts per expert_dtype fp4).
    "nvidia__DeepSeek-V4-Pro-NVFP4": {
        "routed_experts": "nvfp4", "shared_experts": "fp8_block", "attention": "fp8_block",
        "dense_mlp": "absent", "lm_head": "bf16", "mtp_experts": "mxfp4", "kv_cache": "bf16",
        "findings": {"sidecar_only", "mtp_experts_differ"}},
    # hf_quant_config.json alone: NVFP4 everywhere but the 48 routers and lm_head, FP8 KV cache.
    # Without config.json which roles exist is not known: nothing names a shared expert or a
    # dense MLP (Qwen3-30B-A3B has neither), so both are unknown, not absent, bf16 or a guessed
    # nvfp4; MTP layers cannot be told apart.
    "nvidia__Qwen3-30B-A3B-NVFP4__hf_quant_config_only": {
        "routed_experts": "nvfp4", "shared_experts": "unknown", "attention": "nvfp4",
        "dense_mlp": "unknown", "lm_head": "bf16", "mtp_experts": "unknown",
        "kv_cache": "fp8_tensor", "findings": {"no_config_json"}},
}


def test_every_outside_directory_has_expectations_and_provenance():
    dirs = sorted(p.name for p in OUTSIDE.iterdir() if p.is_dir())
    assert dirs == sorted(EXPECT)
    sources = (OUTSIDE / "SOURCES.md").read_text()
    for d in dirs:
        assert f"`{d}`" in sources, f"{d} has no provenance row in tests/data/outside/SOURCES.md"


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_outside_config_inspects_to_what_it_says(name):
    if not BIN.exists():
        pytest.fail(f"{BIN} not built (build target fp4moe, or set FP4MOE_BUILD_DIR)")
    proc = subprocess.run([str(BIN), "inspect", str(OUTSIDE / name), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    j = json.loads(proc.stdout)
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(j), key=lambda e: e.path)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    codes = {f["code"] for f in j["findings"]}
    print(name, j["summary"], sorted(codes))
    expect = EXPECT[name]
    for role in ROLES:
        want = expect[role]
        want = want if isinstance(want, set) else {want}
        assert j["summary"][role] in want, (role, j["summary"], j["findings"])
    assert expect.get("findings", set()) <= codes, (codes, j["findings"])
    # Nothing this tool cannot read: no error finding, no field of a shape it gave up on.
    assert not [f for f in j["findings"] if f["severity"] == "error"], j["findings"]
    assert "config_field_type" not in codes, j["findings"]
    assert j["tensor_evidence"] == "none" and not j["tensors_checked"]


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_outside_config_plans_against_the_schema(name):
    """plan reads the same configs (configs only): a verdict per engine, never a crash, and what
    it cannot size is unknown (null), not 0."""
    proc = subprocess.run([str(BIN), "plan", str(OUTSIDE / name), "--target", "sm_100", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    plan = json.loads(proc.stdout)
    schema = json.loads((ROOT / "docs" / "schema" / "plan.schema.json").read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(plan), key=lambda e: e.path)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    assert {p["engine"] for p in plan["plans"]} == {"sglang", "vllm", "trtllm"}
    for p in plan["plans"]:
        assert p["bytes_per_token"] is None or p["bytes_per_token"] > 0, p
        assert p["time_us_per_token"] is None or p["time_us_per_token"] > 0, p
