"""`fp4moe synth` output read by the Python safetensors package: real tensor names, dtypes and
shape relations, and expert data that an independent numpy decoder finds valid."""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest
from safetensors import safe_open

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release"))
BIN = BUILD / "fp4moe"

HIDDEN, INTER = 4096, 2048  # DeepSeek-V4-Flash hidden_size, moe_intermediate_size
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
WEIGHT_STD = 0.02
# 4-bit elements keep ~3 bits: the decoded std lands within ~25% of the sample's; zeros (holes), a
# wrong scale bias or a scale from another format are off by 2x or more.
STD_TOLERANCE = 0.35


def binary():
    """The fp4moe CLI; a missing build fails, never skips (a skipped suite reads as a passing one)."""
    if not BIN.exists():
        pytest.fail(f"{BIN} not built (build target fp4moe, or set FP4MOE_BUILD_DIR)")
    return str(BIN)


def synth(tmp_path, layout, *args):
    out = tmp_path / layout
    r = subprocess.run([binary(), "synth", layout, str(out), *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "tensors" in r.stdout and "bytes on disk" in r.stdout, r.stdout
    return out


def tensors(path):
    """name -> (dtype, shape) through the safetensors package's own header parser."""
    out = {}
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (s.get_dtype(), list(s.get_shape()))
    return out


def raw(path, name):
    """A tensor's bytes, read at the offsets of the (single) shard's header."""
    shard = path / "model.safetensors"
    with open(shard, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + n + begin)
        return np.frombuffer(f.read(end - begin), np.uint8)


def mxfp4_decode(packed, scales, rows, cols):
    """Independent MXFP4 decoder: element 2i in the low nibble, E8M0 scale 2^(s-127) per 32."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(rows, cols)
    scale = np.exp2(scales.astype(np.float32) - 127).reshape(rows, cols // 32)
    return E2M1[codes] * np.repeat(scale, 32, axis=1)


def check_gaussian_like(w):
    assert np.all(np.isfinite(w))
    assert abs(float(w.mean())) < 0.1 * WEIGHT_STD
    assert abs(float(w.std()) - WEIGHT_STD) < STD_TOLERANCE * WEIGHT_STD


def test_dsv4_mxfp4_names_dtypes_shapes_and_data(tmp_path):
    out = synth(tmp_path, "dsv4-mxfp4", "--layers", 2, "--experts", 3, "--seed", 5)
    t = tensors(out)
    for layer in range(2):
        for e in range(3):
            p = f"layers.{layer}.ffn.experts.{e}."
            for w, (n, k) in {"w1": (INTER, HIDDEN), "w3": (INTER, HIDDEN),
                              "w2": (HIDDEN, INTER)}.items():
                assert t[p + w + ".weight"] == ("I8", [n, k // 2])
                assert t[p + w + ".scale"] == ("F8_E8M0", [n, k // 32])
        g = f"layers.{layer}.ffn."
        assert t[g + "gate.weight"] == ("BF16", [3, HIDDEN])
        assert t[g + "gate.bias"] == ("F32", [3])
        assert t[g + "shared_experts.w1.weight"] == ("F8_E4M3", [INTER, HIDDEN])
        assert t[g + "shared_experts.w1.scale"] == ("F8_E8M0", [INTER // 128, HIDDEN // 128])
        assert t[g + "shared_experts.w2.scale"] == ("F8_E8M0", [HIDDEN // 128, INTER // 128])
    assert "mtp.0.ffn.experts.2.w2.weight" in t
    assert t["embed.weight"][0] == "BF16" and t["head.weight"][0] == "BF16"
    config = json.loads((out / "config.json").read_text())
    assert config["n_routed_experts"] == 3 and config["num_hidden_layers"] == 2
    assert config["expert_dtype"] == "fp4" and config["num_hash_layers"] == 0

    name = "layers.1.ffn.experts.2.w2"
    w = mxfp4_decode(raw(out, name + ".weight"), raw(out, name + ".scale"), HIDDEN, INTER)
    check_gaussian_like(w)
    # The F32 score bias and BF16 router are finite, non-trivial values.
    bias = raw(out, "layers.0.ffn.gate.bias").view(np.float32)
    assert np.all(np.isfinite(bias)) and np.any(bias != 0)


def test_dsv4_nvfp4_uses_modelopt_names_and_keeps_mtp_mxfp4(tmp_path):
    out = synth(tmp_path, "dsv4-nvfp4", "--layers", 1, "--experts", 2)
    t = tensors(out)
    p = "layers.0.ffn.experts.1.w1"
    assert t[p + ".weight"] == ("U8", [INTER, HIDDEN // 2])
    assert t[p + ".weight_scale"] == ("F8_E4M3", [INTER, HIDDEN // 16])
    assert t[p + ".weight_scale_2"] == ("F32", [])
    assert t[p + ".input_scale"] == ("F32", [])
    assert t["mtp.0.ffn.experts.1.w1.weight"] == ("I8", [INTER, HIDDEN // 2])
    hf = json.loads((out / "hf_quant_config.json").read_text())
    assert list(hf["quantization"]["quantized_layers"]) == ["layers.0.ffn.experts"]
    assert json.loads((out / "config.json").read_text())["quantization_config"][
        "moe_quant_algo"] == "NVFP4"
    scale_2 = raw(out, p + ".weight_scale_2").view(np.float32)[0]
    assert 0 < scale_2 < 1e-3  # amax of a 0.02-std sample / (6 * 448)


def test_gpt_oss_fused_expert_blocks(tmp_path):
    out = synth(tmp_path, "gpt-oss-mxfp4", "--layers", 1, "--experts", 4)
    t = tensors(out)
    h = i = 2880
    p = "model.layers.0.mlp.experts."
    assert t[p + "gate_up_proj_blocks"] == ("U8", [4, 2 * i, h // 32, 16])
    assert t[p + "gate_up_proj_scales"] == ("U8", [4, 2 * i, h // 32])
    assert t[p + "gate_up_proj_bias"] == ("BF16", [4, 2 * i])
    assert t[p + "down_proj_blocks"] == ("U8", [4, h, i // 32, 16])
    w = mxfp4_decode(raw(out, p + "down_proj_blocks"), raw(out, p + "down_proj_scales"),
                     4 * h, i)
    check_gaussian_like(w)


def test_ct_nvfp4_uses_compressed_tensors_names(tmp_path):
    out = synth(tmp_path, "ct-nvfp4", "--layers", 1, "--experts", 1)
    t = tensors(out)
    p = "model.layers.0.ffn.experts.0.down_proj"
    assert t[p + ".weight_packed"] == ("U8", [HIDDEN, INTER // 2])
    assert t[p + ".weight_scale"] == ("F8_E4M3", [HIDDEN, INTER // 16])
    assert t[p + ".weight_global_scale"] == ("F32", [1])
    assert t[p + ".input_global_scale"] == ("F32", [1])
    assert t["model.layers.0.attn.wq_b.weight_scale"][0] == "F32"
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"


def test_unknown_layout_is_exit_status_2(tmp_path):
    r = subprocess.run([binary(), "synth", "int3", str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "unknown synthetic layout" in r.stderr


def test_list_layouts_is_the_help_list_and_the_tests_table():
    """`--list-layouts` prints the names `--help` describes, and the tests' one table of what
    each layout holds (conftest.SYNTH_SCHEMES) has a row for each, no more."""
    from conftest import SYNTH_CORPUS, SYNTH_SCHEMES

    listed = subprocess.run([binary(), "synth", "--list-layouts"], capture_output=True,
                            text=True, check=True).stdout.split()
    helped = subprocess.run([binary(), "synth", "--help"], capture_output=True, text=True,
                            check=True).stdout
    described = [line.split(":")[0].strip() for line in helped.splitlines()
                 if line.startswith("  ") and ": " in line and "/" in line.split(":", 1)[1]]
    assert listed and len(set(listed)) == len(listed)
    assert set(listed) <= set(described), (listed, described)
    assert set(SYNTH_SCHEMES) == set(listed) == set(SYNTH_CORPUS)
    for corpus_dir in SYNTH_CORPUS.values():
        assert (ROOT / "tests" / "data" / "corpus" / corpus_dir / "config.json").exists()
    bare = subprocess.run([binary(), "synth"], capture_output=True, text=True)
    assert bare.returncode == 2 and "--list-layouts" in bare.stderr


MINIMAX_HIDDEN, MINIMAX_INTER = 3072, 1536  # MiniMax-M2.5 hidden_size, intermediate_size


@pytest.mark.parametrize("nvfp4", [True, False], ids=["nvfp4", "fp8"])
def test_minimax_layouts_have_the_real_names_and_configs(tmp_path, nvfp4):
    layout = "minimax-nvfp4" if nvfp4 else "minimax-fp8"
    out = synth(tmp_path, layout, "--layers", 3, "--experts", 4)
    t = tensors(out)
    h, i = MINIMAX_HIDDEN, MINIMAX_INTER
    for layer in range(3):
        p = f"model.layers.{layer}.block_sparse_moe."
        assert t[p + "gate.weight"] == ("BF16", [4, h])
        assert t[p + "e_score_correction_bias"] == ("F32", [4])
        for e in range(4):
            for w, shape in (("w1", [i, h]), ("w3", [i, h]), ("w2", [h, i])):
                m = f"{p}experts.{e}.{w}."
                if nvfp4:
                    assert t[m + "weight"] == ("U8", [shape[0], shape[1] // 2])
                    assert t[m + "weight_scale"] == ("F8_E4M3", [shape[0], shape[1] // 16])
                    assert t[m + "weight_scale_2"] == ("F32", [])
                    assert t[m + "input_scale"] == ("F32", [])
                else:
                    assert t[m + "weight"] == ("F8_E4M3", shape)
                    grid = [(shape[0] + 127) // 128, (shape[1] + 127) // 128]
                    assert t[m + "weight_scale_inv"] == ("F32", grid)
        q = t[f"model.layers.{layer}.self_attn.q_proj.weight"]
        assert q[0] == ("BF16" if nvfp4 else "F8_E4M3"), q
    assert not any(k.startswith("model.layers.3.") for k in t)  # three layers, not the real 62
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["num_local_experts"] == 4
    assert config["model_type"] == "minimax_m2"
    if nvfp4:
        hf = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
        expected = ["lm_head"] + sorted(f"model.layers.{l}.{m}" for l in range(3)
                                        for m in ("block_sparse_moe.gate", "self_attn*"))
        assert hf["exclude_modules"] == expected
        assert config["quantization_config"]["ignore"] == expected
        assert len(config["attn_type_list"]) == 3
    else:
        assert not (out / "hf_quant_config.json").exists()
        assert config["quantization_config"]["weight_block_size"] == [128, 128]
