"""CLI contract of `fp4moe inspect`: JSON shape, exit status 0 on findings, 2 on unreadable input."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release"))
BIN = BUILD / "fp4moe"
CORPUS = ROOT / "tests" / "data" / "corpus"
SUMMARY_KEYS = {"routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head",
                "mtp_experts", "kv_cache"}
SCHEMES = {"nvfp4", "mxfp4", "fp8_block", "fp8_tensor", "fp8_channel", "mxfp8", "int4", "bf16",
           "absent", "unknown"}


def run(*args):
    # A missing build fails, never skips: a skipped suite reads as a passing one.
    if not BIN.exists():
        pytest.fail(f"{BIN} not built (build target fp4moe, or set FP4MOE_BUILD_DIR)")
    return subprocess.run([str(BIN), "inspect", *map(str, args)], capture_output=True, text=True)


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.iterdir() if p.is_dir()))
def test_every_corpus_dir_gives_the_json_contract(name):
    r = run(CORPUS / name, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert SUMMARY_KEYS <= set(j["summary"])
    assert set(j["summary"].values()) <= SCHEMES
    for f in j["findings"]:
        assert f["severity"] in {"error", "warning", "info"} and f["code"] and f["message"]


def test_nvidia_deepseek_v4_summary():
    j = json.loads(run(CORPUS / "nvidia__DeepSeek-V4-Flash-NVFP4", "--json").stdout)
    assert j["summary"]["routed_experts"] == "nvfp4"
    assert j["summary"]["mtp_experts"] == "mxfp4"
    assert any(f["code"] == "quant_method_hides_moe_format" for f in j["findings"])


def test_table_output(tmp_path):
    r = run(CORPUS / "openai__gpt-oss-20b")
    assert r.returncode == 0
    assert "routed_experts" in r.stdout and "mxfp4" in r.stdout and "findings" in r.stdout


@pytest.mark.parametrize("text", ["{not json", '{"quantization_config": {"quant_method": 8}}',
                                  '{"quantization_config": {"quant_method": "compressed-tensors",'
                                  ' "config_groups": {"g": {"targets": ["re:("]}}}}'])
def test_malformed_or_contradictory_json_exits_2(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    r = run(tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip()


def test_missing_directory_exits_2(tmp_path):
    assert run(tmp_path / "nope").returncode == 2


def test_python_literals_read_the_same_with_or_without_weights(tmp_path):
    """One JSON reader for every command: a config with Python's Infinity/NaN literals (real
    Nemotron configs have them) inspected alone used to pass and, once a .safetensors file was
    present, fail in the checkpoint reader."""
    import numpy as np
    from st_io import save as save_file
    config = ('{"model_type": "qwen3_moe", "num_hidden_layers": 1, "num_experts": 2, '
              '"router_clip": Infinity, "eps": -Infinity, "x": NaN, "note": "NaN stays text"}')
    (tmp_path / "config.json").write_text(config)
    alone = run(tmp_path, "--json")
    assert alone.returncode == 0, alone.stderr
    save_file({"model.layers.0.mlp.experts.0.down_proj.weight": np.zeros((4, 4), np.float32)},
              str(tmp_path / "model.safetensors"))
    with_weights = run(tmp_path, "--json")
    assert with_weights.returncode == 0, with_weights.stderr
    assert json.loads(alone.stdout)["dialect"] == json.loads(with_weights.stdout)["dialect"]
