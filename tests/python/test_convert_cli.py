"""`fp4moe convert` end to end on small DeepSeek-V4-style checkpoints written by the Python
safetensors package (an independent writer), read back with it, and checked with numpy."""
import hashlib
import json
import os
import resource
import signal
import stat as stat_mod
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fp4moe
from st_io import load as load_file, save as save_file

BUILD = Path(os.environ["FP4MOE_BUILD_DIR"])
FP4MOE = BUILD / "fp4moe"
F32 = np.float32
E2M1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)

STOCK_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}


def mx_expert(rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 0.02).astype(F32)
    packed, scales = fp4moe.quantize_mxfp4(x)
    # DeepSeek-V4 stores the packed nibbles as I8 and the scales as F8_E8M0.
    return packed.view(np.int8), scales.view(ml_dtypes.float8_e8m0fnu)


def make_checkpoint(path: Path, rng, experts=4, hidden=256, width=128, layers=2):
    tensors = {}
    for layer in range(layers):
        for e in range(experts):
            for w, (r, c) in (("w1", (width, hidden)), ("w3", (width, hidden)), ("w2", (hidden, width))):
                packed, scales = mx_expert(rng, r, c)
                tensors[f"layers.{layer}.ffn.experts.{e}.{w}.weight"] = packed
                tensors[f"layers.{layer}.ffn.experts.{e}.{w}.scale"] = scales
        tensors[f"layers.{layer}.ffn.gate.weight"] = rng.standard_normal((experts, hidden)).astype(ml_dtypes.bfloat16)
        tensors[f"layers.{layer}.attn.wq_a.weight"] = rng.standard_normal((128, hidden)).astype(ml_dtypes.float8_e4m3fn)
        tensors[f"layers.{layer}.attn.wq_a.scale"] = np.full((1, hidden // 128), 120, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    packed, scales = mx_expert(rng, width, hidden)
    tensors["mtp.0.ffn.experts.0.w1.weight"] = packed
    tensors["mtp.0.ffn.experts.0.w1.scale"] = scales
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
              "expert_dtype": "fp4", "hidden_size": hidden, "moe_intermediate_size": width,
              "n_routed_experts": experts, "num_hidden_layers": layers, "quantization_config": STOCK_QC}
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text('{"fake": "tokenizer"}')
    return tensors


def run(*args, check=True):
    proc = subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"fp4moe {args} failed ({proc.returncode}): {proc.stderr}")
    return proc


def dequant_mx(packed, scales):
    packed = packed.view(np.uint8)
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2], vals[..., 1::2] = E2M1[packed & 0xF], E2M1[packed >> 4]
    s = np.ldexp(F32(1), scales.view(np.uint8).astype(np.int64) - 127).astype(F32)
    return (vals.reshape(vals.shape[0], -1, 32) * s[..., None]).reshape(vals.shape)


def dequant_nv(packed, block_scales, ts):
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2], vals[..., 1::2] = E2M1[packed & 0xF], E2M1[packed >> 4]
    s = block_scales.astype(F32) * F32(ts)
    return (vals.reshape(vals.shape[0], -1, 16) * s[..., None]).reshape(vals.shape)


def test_convert_is_lossless_and_engine_readable(tmp_path, rng):
    src = tmp_path / "dsv4-mxfp4"
    source = make_checkpoint(src, rng)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    proc = run("convert", src, tmp_path / "out", "--to", "nvfp4", "--json")
    report = json.loads(proc.stdout)
    assert report["modules_converted"] == 2 * 4 * 3
    assert report["report"]["blocks_requantized"] == 0
    assert report["report"]["lossless_fraction"] == 1.0
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    for layer in range(2):
        for e in range(4):
            ts = {}
            for w in ("w1", "w3", "w2"):
                m = f"layers.{layer}.ffn.experts.{e}.{w}"
                assert f"{m}.scale" not in out
                assert out[f"{m}.weight"].dtype == np.uint8
                assert out[f"{m}.weight_scale"].dtype == ml_dtypes.float8_e4m3fn
                assert out[f"{m}.weight_scale_2"].shape == () and out[f"{m}.weight_scale_2"].dtype == F32
                ts[w] = out[f"{m}.weight_scale_2"]
                assert np.array_equal(out[f"{m}.weight"], source[f"{m}.weight"].view(np.uint8))
                assert np.array_equal(
                    dequant_nv(out[f"{m}.weight"], out[f"{m}.weight_scale"], ts[w]),
                    dequant_mx(source[f"{m}.weight"], source[f"{m}.scale"]))
            assert ts["w1"] == ts["w3"], "gate and up share weight_scale_2"
    # Untouched tensors are copied bit for bit, MTP experts stay MXFP4.
    for name in ("layers.0.attn.wq_a.weight", "layers.1.ffn.gate.weight", "mtp.0.ffn.experts.0.w1.weight",
                 "mtp.0.ffn.experts.0.w1.scale"):
        assert out[name].tobytes() == source[name].tobytes()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    qc = config["quantization_config"]
    # The default dialect is what the DeepSeek-V4 paths of SGLang >= 0.5.14 and vLLM >= 0.22 route to
    # NVFP4: moe_quant_algo exactly "NVFP4", which declares FP4 activations, so every converted
    # module has an input_scale: here the documented uncalibrated default, amax 6 * 448 -> 1.0.
    assert qc["quant_method"] == "fp8" and qc["moe_quant_algo"] == "NVFP4"
    assert qc["quant_algo"] == "MIXED_PRECISION" and "mtp.*" in qc["ignore"] and qc["group_size"] == 16
    assert qc["quantized_layers"]["layers.1.ffn.experts"] == {"quant_algo": "NVFP4", "group_size": 16}
    assert qc["config_groups"]["group_0"]["input_activations"]["num_bits"] == 4
    assert "UNCALIBRATED" in qc["producer"]["note"]
    scales = {k: v for k, v in out.items() if k.endswith(".input_scale")}
    assert len(scales) == 2 * 4 * 3 and not any(k.startswith("mtp.") for k in scales)
    assert all(v.dtype == F32 and v.shape == () and v == F32(6 * 448) / F32(6 * 448) for v in scales.values())
    assert report["dialect"] == "NVFP4"
    assert report["input_scales"] == {"calibrated": 0, "uncalibrated_default": 24, "default_value": 1.0}
    hf = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "MIXED_PRECISION"
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"fake": "tokenizer"}'
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before, "source must not change"
    # The converted checkpoint inspects as NVFP4 routed experts, weight-only, with no error finding.
    manifest = json.loads(run("inspect", tmp_path / "out", "--json").stdout)
    assert manifest["summary"]["routed_experts"] == "nvfp4"
    assert manifest["summary"]["mtp_experts"] == "mxfp4"
    assert not [f for f in manifest["findings"] if f["severity"] == "error"], manifest["findings"]


def test_convert_dialects_and_activation_amax(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=2)
    # Weight-only: ModelOpt's W4A16_NVFP4, no input_scale, no activation declaration.
    run("convert", src, tmp_path / "w4a16", "--dialect", "w4a16_nvfp4")
    qc = json.loads((tmp_path / "w4a16" / "config.json").read_text())["quantization_config"]
    assert qc["moe_quant_algo"] == "W4A16_NVFP4"
    assert qc["quantized_layers"]["layers.0.ffn.experts"]["quant_algo"] == "W4A16_NVFP4"
    assert qc["config_groups"]["group_0"]["input_activations"] is None
    out = load_file(str(tmp_path / "w4a16" / "model.safetensors"))
    assert not any(k.endswith("input_scale") for k in out), "weight-only: no invented input_scale"
    manifest = json.loads(run("inspect", tmp_path / "w4a16", "--json").stdout)
    assert manifest["summary"]["routed_experts"] == "nvfp4"

    # Calibrated: per module glob, first match wins; input_scale = amax / (6 * 448), ModelOpt's rule.
    amax = {"format": "fp4moe.activation_amax.v1",
            "amax": [{"modules": "layers.1.ffn.experts.*.w2", "amax": 812.5},
                     {"modules": "layers.1.ffn.experts.*", "amax": 9.25},
                     {"modules": "layers.0.*", "amax": 3.0}]}
    (tmp_path / "amax.json").write_text(json.dumps(amax))
    proc = run("convert", src, tmp_path / "cal", "--activation-amax", tmp_path / "amax.json", "--json")
    assert json.loads(proc.stdout)["input_scales"] == {"calibrated": 12, "uncalibrated_default": 0,
                                                        "default_value": None}
    out = load_file(str(tmp_path / "cal" / "model.safetensors"))
    expect = {"layers.1.ffn.experts.0.w2": 812.5, "layers.1.ffn.experts.1.w1": 9.25,
              "layers.1.ffn.experts.1.w3": 9.25, "layers.0.ffn.experts.0.w2": 3.0}
    for module, a in expect.items():
        assert out[f"{module}.input_scale"] == F32(a / (6 * 448)), module
    qc = json.loads((tmp_path / "cal" / "config.json").read_text())["quantization_config"]
    assert "UNCALIBRATED" not in qc["producer"]["note"]
    manifest = json.loads(run("inspect", tmp_path / "cal", "--json").stdout)
    assert not [f for f in manifest["findings"] if f["severity"] == "error"], manifest["findings"]
    # `fp4moe check` tells the uncalibrated default from a calibration, by the values alone.
    report = json.loads(run("check", tmp_path / "cal", "--json").stdout)
    assert "input_scale_default" not in [f["id"] for f in report["findings"]], report["findings"]
    run("convert", src, tmp_path / "default")
    report = json.loads(run("check", tmp_path / "default", "--json").stdout)
    found = [f for f in report["findings"] if f["id"] == "input_scale_default"]
    assert found and found[0]["count"] == 12 and found[0]["severity"] == "warning", report["findings"]

    # Bad calibration input: exit 2, the file and the reason named, nothing written.
    def bad(name, content, *extra, says):
        (tmp_path / name).write_text(content)
        p = run("convert", src, tmp_path / f"o-{name}", "--activation-amax", tmp_path / name, *extra, check=False)
        assert p.returncode == 2 and says in p.stderr, (name, p.returncode, p.stderr)
        assert not (tmp_path / f"o-{name}").exists()
    bad("gap.json", json.dumps({"format": "fp4moe.activation_amax.v1",
                                "amax": [{"modules": "layers.0.*", "amax": 1.0}]}),
        says="no entry matches module 'layers.1.ffn.experts.0.w1'")
    bad("neg.json", json.dumps({"format": "fp4moe.activation_amax.v1",
                                "amax": [{"modules": "*", "amax": -1}]}), says="amax[0]: amax must be finite and > 0")
    bad("nan.json", '{"format": "fp4moe.activation_amax.v1", "amax": [{"modules": "*", "amax": NaN}]}',
        says="amax[0]: needs \"amax\", a number")
    bad("fmt.json", json.dumps({"amax": []}), says="not an activation amax file")
    bad("broken.json", "{", says="broken.json")
    bad("w4a16.json", json.dumps(amax), "--dialect", "w4a16_nvfp4", says="weight-only dialect")
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name], "no temporary left behind"


def test_convert_engine_check(tmp_path, rng):
    """--engine: the engine rules must route the output's experts right before it is published."""
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=1)
    proc = run("convert", src, tmp_path / "ok", "--engine", "sglang@0.5.14,vllm@0.34.0", "--json")
    lines = json.loads(proc.stdout)["engine_rules"]
    routed = [l for l in lines if "routed_experts" in l]
    assert any(l.startswith("SGLang 0.5.14") and "ModelOptNvFp4FusedMoEMethod (ok)" in l for l in routed), lines
    assert any(l.startswith("vLLM 0.34.0") and "ModelOptNvFp4FusedMoE (ok)" in l for l in routed), lines
    # Where the engines disagree, --engine decides: vLLM 0.22's Fp8Config never reads `ignore`, so
    # MXFP4 MTP experts would get its NVFP4 method (vLLM #49133), while SGLang's hybrid keeps MTP
    # on an MXFP4 method: for vLLM 0.22 convert the MTP experts too, for SGLang leave them.
    mtp_left = run("convert", src, tmp_path / "v22", "--engine", "vllm@0.22.0", check=False)
    assert mtp_left.returncode == 1 and "#49133" in mtp_left.stderr and "mtp_experts" in mtp_left.stderr
    both = ("--modules", "layers.*.ffn.experts.*", "mtp.*.ffn.experts.*")
    run("convert", src, tmp_path / "v22", "--engine", "vllm@0.22.0", *both)
    sglang = run("convert", src, tmp_path / "s23", "--engine", "sglang@0.5.23", *both, check=False)
    assert sglang.returncode == 1 and "mtp_experts" in sglang.stderr
    assert not (tmp_path / "s23").exists()
    # Before PR #25820 no dialect routes NVFP4 experts right: nothing is written, exit 1, the fix named.
    old = run("convert", src, tmp_path / "old", "--engine", "sglang@0.5.13.post1", check=False)
    assert old.returncode == 1 and "PR #25820" in old.stderr and "rule sglang.dsv4.fp4_probe_as_mxfp4" in old.stderr
    # The weight-only dialect is what vLLM's DeepSeek-V4 path does not read.
    w4a16 = run("convert", src, tmp_path / "w4a16", "--dialect", "w4a16_nvfp4", "--engine", "vllm",
                check=False)
    assert w4a16.returncode == 1 and "Mxfp4MoEMethod" in w4a16.stderr
    # A CPU engine's rules check the output too: llama.cpp's converter cannot turn DeepSeek-V4 NVFP4
    # experts into a GGUF, so converting for it publishes nothing.
    llama = run("convert", src, tmp_path / "llama", "--engine", "llamacpp", check=False)
    assert llama.returncode == 1 and "rule llamacpp.dsv4.nvfp4_refused" in llama.stderr, llama.stderr
    assert "Missing routed expert tensors" in llama.stderr
    unknown = run("convert", src, tmp_path / "unknown", "--engine", "sglang@9.9", check=False)
    assert unknown.returncode == 2 and "sglang@9.9" in unknown.stderr
    for name in ("old", "w4a16", "llama", "unknown"):
        assert not (tmp_path / name).exists()
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name], "no temporary left behind"


def test_convert_bad_input(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=1, layers=1)
    # Bad input or usage exits 2 (the exit-code table in `fp4moe convert --help`).
    missing = run("convert", tmp_path / "nope", tmp_path / "o1", check=False)
    assert missing.returncode == 2 and "not a checkpoint directory" in missing.stderr
    inside = run("convert", src, src / "sub", check=False)
    assert inside.returncode == 2 and "inside" in inside.stderr
    (tmp_path / "exists").mkdir()
    exists = run("convert", src, tmp_path / "exists", check=False)
    assert exists.returncode == 2 and "--force" in exists.stderr
    run("convert", src, tmp_path / "nv")
    again = run("convert", tmp_path / "nv", tmp_path / "o2", check=False)
    assert again.returncode == 2 and "layers.0.ffn.experts.0.w1" in again.stderr
    assert "already NVFP4" in again.stderr
    to_mx = run("convert", src, tmp_path / "o5", "--to", "mxfp4", check=False)
    assert to_mx.returncode == 2 and "already MXFP4" in to_mx.stderr
    nothing = run("convert", src, tmp_path / "o3", "--modules", "nomatch.*", check=False)
    assert nothing.returncode == 2 and "matches the module patterns (nomatch.*)" in nothing.stderr
    unknown = run("convert", src, tmp_path / "o4", "--to", "int4", check=False)
    assert unknown.returncode == 2
    # --force replaces a checkpoint, never a directory that holds something else.
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    not_ckpt = run("convert", src, tmp_path / "home", "--force", check=False)
    assert not_ckpt.returncode == 2 and "not an empty directory or a checkpoint" in not_ckpt.stderr
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine"
    for name in ("o1", "o2", "o3", "o4", "o5"):
        assert not (tmp_path / name).exists()
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name], "no temporary left behind"


def test_convert_nan_scale_leaves_nothing(tmp_path, rng):
    src = tmp_path / "src"
    tensors = make_checkpoint(src, rng, experts=2, layers=1)
    name = "layers.0.ffn.experts.1.w2.scale"
    bad = tensors[name].view(np.uint8).copy()
    bad[3, 1] = 0xFF
    tensors[name] = bad.view(ml_dtypes.float8_e8m0fnu)
    save_file(tensors, str(src / "model.safetensors"))
    # `fp4moe check` refuses the source before anything is written, quoting the finding...
    proc = run("convert", src, tmp_path / "out", check=False)
    assert proc.returncode == 2
    assert "[scale_nan_code]" in proc.stderr and "--allow-findings scale_nan_code" in proc.stderr
    assert "layers.0.ffn.experts.1.w2.scale row 3 block 1" in proc.stderr
    assert not (tmp_path / "out").exists()
    # ...and allowed on purpose, the conversion itself stops at the NaN block, leaving nothing.
    proc = run("convert", src, tmp_path / "out", "--allow-findings", "scale_nan_code", check=False)
    assert proc.returncode == 2
    assert "layers.0.ffn.experts.1.w2.weight" in proc.stderr and "row 3, block 1" in proc.stderr
    assert not (tmp_path / "out").exists()
    unknown = run("convert", src, tmp_path / "out", "--allow-findings", "no_such_id", check=False)
    assert unknown.returncode == 2 and "unknown finding id 'no_such_id'" in unknown.stderr
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_convert_force_replaces(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=1, layers=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    (tmp_path / "out" / "stale.txt").write_text("old")
    run("convert", src, tmp_path / "out", "--force")
    assert not (tmp_path / "out" / "stale.txt").exists()
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == [], "old one removed"


def test_convert_refuses_config_that_contradicts_tensors(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=1, layers=1)
    # The config claims ModelOpt NVFP4 experts; the tensors are MXFP4 (I8 + E8M0 per 32).
    config = json.loads((src / "config.json").read_text())
    config.pop("expert_dtype")
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    (src / "config.json").write_text(json.dumps(config))
    proc = run("convert", src, tmp_path / "out", check=False)
    assert proc.returncode == 2
    assert "refusing to convert" in proc.stderr and "[config_tensor_mismatch]" in proc.stderr
    assert not (tmp_path / "out").exists()


def start_paused(args, after, env=None, **popen):
    """Starts `fp4moe convert` with the test hook that stops it after `after` source tensors and
    returns once it says so: the signal then arrives at a known point, not after a sleep."""
    env = dict(os.environ, FP4MOE_TEST_PAUSE_AFTER_TENSORS=str(after), **(env or {}))
    # The child starts as from a terminal, SIGINT at its default action: a shell starts background
    # jobs (`bash .ci/run &`) with SIGINT ignored, the ignore is inherited across exec, and convert
    # keeps an inherited ignore on purpose (test_an_inherited_ignored_sigint_is_kept).
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc = subprocess.Popen([str(FP4MOE), "convert", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **popen)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "paused after" in line:
            return proc, lines
    proc.wait(timeout=60)
    raise AssertionError(f"convert never paused (exit {proc.returncode}): {''.join(lines)}")


def partials(parent):
    return sorted(p for p in parent.iterdir() if ".partial-" in p.name)


def test_convert_interrupted_leaves_nothing(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=2)
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        proc, _ = start_paused([src, tmp_path / "out"], after=3)
        assert len(partials(tmp_path)) == 1, "the partial output exists while paused"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == status, err
        assert "interrupted, stopping and removing partial output" in err
        assert not (tmp_path / "out").exists()
        assert partials(tmp_path) == []


def tree_digest(root: Path):
    """Every entry under root: relative path, type, mode and content hash (what 'exactly as it
    was' means for a destination)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (
            stat_mod.S_IFMT(st.st_mode), stat_mod.S_IMODE(st.st_mode),
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
    return out


def _limit_file_size(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
    return apply


@pytest.mark.parametrize("failure", ["bad_source_tensor", "write_error", "sigint", "sigterm",
                                     "sigkill"])
def test_convert_force_never_loses_the_old_destination(tmp_path, rng, failure):
    """The failure-point matrix: a good earlier conversion in DST, then `convert --force` that
    fails at one point; DST must be bit-identical afterwards and no partial output may remain
    (after SIGKILL it remains, and the next convert reports it and --clean-partial removes it)."""
    good = tmp_path / "good"
    make_checkpoint(good, rng, experts=4, layers=3)
    out = tmp_path / "out"
    run("convert", good, out)
    before = tree_digest(out)
    assert before and all(v[2] for k, v in before.items() if k.endswith(".safetensors"))

    src = good
    if failure == "bad_source_tensor":
        # A NaN E8M0 scale in the last layer: conversion fails midway, after tensors were written.
        src = tmp_path / "bad"
        tensors = make_checkpoint(src, np.random.default_rng(1), experts=4, layers=3)
        name = "layers.2.ffn.experts.3.w2.scale"
        codes = tensors[name].view(np.uint8).copy()
        codes[5, 2] = 0xFF
        tensors[name] = codes.view(ml_dtypes.float8_e8m0fnu)
        save_file(tensors, str(src / "model.safetensors"))
        proc = run("convert", src, out, "--force", "--allow-findings", "scale_nan_code", check=False)
        assert proc.returncode == 2, proc.stderr
        assert "layers.2.ffn.experts.3.w2.weight" in proc.stderr and "row 5, block 2" in proc.stderr
    elif failure == "write_error":
        # Writes past 64 KiB fail with EFBIG, as on a full disk: an I/O failure exits 1.
        proc = subprocess.run([str(FP4MOE), "convert", str(src), str(out), "--force"],
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=_limit_file_size(64 << 10))
        assert proc.returncode == 1, proc.stderr
        assert "write failed" in proc.stderr or "ftruncate failed" in proc.stderr, proc.stderr
    else:
        sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[failure]
        proc, _ = start_paused([src, out, "--force"], after=7)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        expected = {"sigint": 130, "sigterm": 143, "sigkill": -signal.SIGKILL}[failure]
        assert proc.returncode == expected, err

    assert tree_digest(out) == before, "the old destination is exactly as it was"
    left = partials(tmp_path)
    if failure != "sigkill":
        assert left == [], "no partial output left"
        return
    # SIGKILL leaves the partial output; the next convert into the same parent reports it with
    # its size and leaves it; --clean-partial removes it.
    assert len(left) == 1
    note = run("convert", good, tmp_path / "second")
    assert str(left[0]) in note.stderr and "GB on disk" in note.stderr
    assert "--clean-partial" in note.stderr and partials(tmp_path) == left
    clean = run("convert", good, tmp_path / "third", "--clean-partial")
    assert "removed stale partial output " + str(left[0]) in clean.stderr
    assert partials(tmp_path) == []
    assert tree_digest(tmp_path / "third") == tree_digest(tmp_path / "second")


def test_a_live_conversion_is_not_reported_as_stale(tmp_path, rng):
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=2)
    paused, _ = start_paused([src, tmp_path / "a"], after=2)
    try:
        other = run("convert", src, tmp_path / "b", "--clean-partial")
        assert "partial output" not in other.stderr, other.stderr
        assert len(partials(tmp_path)) == 1, "the live run's directory was not touched"
    finally:
        paused.send_signal(signal.SIGINT)
        paused.communicate(timeout=60)
    assert paused.returncode == 130 and partials(tmp_path) == []


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_outputs_have_mkdir_modes(tmp_path, rng, mask):
    """Directories 0777 and files 0666 less the umask, for convert and synth output alike."""
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=1, layers=1)
    umask = lambda: os.umask(mask)  # noqa: E731
    for args in (["convert", src, tmp_path / "conv"],
                 ["synth", "dsv4-mxfp4", tmp_path / "syn", "--layers", "1", "--experts", "2"]):
        proc = subprocess.run([str(FP4MOE), *map(str, args)], capture_output=True, text=True,
                              timeout=120, preexec_fn=umask)
        assert proc.returncode == 0, proc.stderr
    for out in (tmp_path / "conv", tmp_path / "syn"):
        assert stat_mod.S_IMODE(out.stat().st_mode) == 0o777 & ~mask, out
        files = list(out.iterdir())
        assert files
        for f in files:
            assert stat_mod.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f


# bf16_dsv4's config keeps DeepSeek-V4's `quant_method: fp8` while its routed experts are BF16 (a
# dequantized export to requantize): `fp4moe check` reports that as declared_but_not_quantized,
# and converting it anyway is what --allow-findings is for.
ALLOW_BF16_EXPERTS = ("--allow-findings", "declared_but_not_quantized")


def bf16_dsv4(path, rng, experts=2, hidden=256, width=128):
    """A DeepSeek-V4-named checkpoint whose routed experts are BF16 and shared expert FP8 block."""
    t = {}
    for e in range(experts):
        for w, shape in (("w1", (width, hidden)), ("w3", (width, hidden)), ("w2", (hidden, width))):
            t[f"layers.0.ffn.experts.{e}.{w}.weight"] = (
                rng.standard_normal(shape) * (0.02 if w != "w3" else 0.05)).astype(ml_dtypes.bfloat16)
    for w, shape in (("w1", (width, hidden)), ("w3", (width, hidden)), ("w2", (hidden, width))):
        q, scales = fp4moe.quantize_fp8_block128((rng.standard_normal(shape) * 0.03).astype(F32), ue8m0=True)
        t[f"layers.0.ffn.shared_experts.{w}.weight"] = q.view(ml_dtypes.float8_e4m3fn)
        t[f"layers.0.ffn.shared_experts.{w}.scale"] = scales.view(ml_dtypes.float8_e8m0fnu)
    path.mkdir()
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v4", "hidden_size": hidden, "moe_intermediate_size": width,
        "n_routed_experts": experts, "num_hidden_layers": 1, "quantization_config": STOCK_QC}))
    return t


def modelopt_oracle(x, tensor_scale):
    """NVFP4 by ModelOpt's recipe, written in numpy (test_formats_oracle.oracle_nvfp4)."""
    from test_formats_oracle import oracle_nvfp4
    return oracle_nvfp4(x, tensor_scale)


def test_bf16_and_fp8_to_nvfp4_follow_modelopt(tmp_path, rng):
    src = tmp_path / "bf16"
    t = bf16_dsv4(src, rng)
    proc = run("convert", src, *ALLOW_BF16_EXPERTS, tmp_path / "nv", "--modules", "layers.*.ffn.experts.*",
               "layers.*.ffn.shared_experts.*", "--json")
    report = json.loads(proc.stdout)
    assert report["modules_quantized"] == 9 and report["modules_transcoded_losslessly"] == 0
    assert 0 < report["max_quantize_rel_error"] < 0.2  # FP4 keeps ~3 bits: ~10% relative error
    out = load_file(str(tmp_path / "nv" / "model.safetensors"))
    for prefix in ("layers.0.ffn.experts.0.", "layers.0.ffn.experts.1.", "layers.0.ffn.shared_experts."):
        if "shared" in prefix:
            exact = {w: fp4moe.dequantize_fp8_block128(t[prefix + w + ".weight"].view(np.uint8),
                                                       t[prefix + w + ".scale"].view(np.uint8))
                     for w in ("w1", "w3", "w2")}
        else:
            exact = {w: t[prefix + w + ".weight"].astype(F32) for w in ("w1", "w3", "w2")}
        # w1 and w3 share weight_scale_2 = max(amax(w1), amax(w3)) / (6 * 448); w2 has its own.
        shared_scale = F32(max(np.abs(exact["w1"]).max(), np.abs(exact["w3"]).max())) / F32(6.0 * 448.0)
        for w in ("w1", "w3", "w2"):
            ts = shared_scale if w != "w2" else F32(np.abs(exact["w2"]).max()) / F32(6.0 * 448.0)
            packed, scales, ts_o = modelopt_oracle(exact[w], ts)
            assert out[prefix + w + ".weight_scale_2"] == ts_o
            assert np.array_equal(out[prefix + w + ".weight"], packed)
            assert np.array_equal(out[prefix + w + ".weight_scale"].view(np.uint8), scales)
            assert prefix + w + ".scale" not in out


def test_bf16_to_mxfp4_writes_the_stock_layout(tmp_path, rng):
    src = tmp_path / "bf16"
    t = bf16_dsv4(src, rng)
    proc = run("convert", src, *ALLOW_BF16_EXPERTS, tmp_path / "mx", "--to", "mxfp4", "--json")
    assert json.loads(proc.stdout)["modules_quantized"] == 6
    out = load_file(str(tmp_path / "mx" / "model.safetensors"))
    from test_formats_oracle import oracle_mxfp4
    for e in range(2):
        for w in ("w1", "w3", "w2"):
            name = f"layers.0.ffn.experts.{e}.{w}"
            packed, scales = oracle_mxfp4(t[name + ".weight"].astype(F32))
            assert out[name + ".weight"].dtype == np.int8
            assert np.array_equal(out[name + ".weight"].view(np.uint8), packed)
            assert np.array_equal(out[name + ".scale"].view(np.uint8), scales)
    config = json.loads((tmp_path / "mx" / "config.json").read_text())
    assert config["expert_dtype"] == "fp4"
    manifest = json.loads(run("inspect", tmp_path / "mx", "--json").stdout)
    assert manifest["summary"]["routed_experts"] == "mxfp4"
    # Back to NVFP4: now losslessly.
    back = json.loads(run("convert", tmp_path / "mx", tmp_path / "nv", "--json").stdout)
    assert back["modules_transcoded_losslessly"] == 6 and back["report"]["blocks_requantized"] == 0
    partial = run("convert", src, *ALLOW_BF16_EXPERTS, tmp_path / "p", "--to", "mxfp4", "--modules", "layers.0.ffn.experts.0.*",
                  check=False)
    assert partial.returncode == 2 and "expert_dtype" in partial.stderr


def test_force_never_replaces_a_file_or_what_a_path_only_seems_to_name(tmp_path, rng):
    """Found in review: `convert SRC myfile/ --force` deleted the file, and `lnk/../victim` was
    checked as one path and replaced as another. Every check now acts on the path the kernel
    renames (the parent resolved through symlinks), and only a checkpoint directory is replaced."""
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=1, layers=1)
    (tmp_path / "myfile").write_text("precious")
    proc = run("convert", src, str(tmp_path / "myfile") + "/", "--force", check=False)
    assert proc.returncode == 2, proc.stderr
    assert (tmp_path / "myfile").read_text() == "precious"
    # lnk -> deep/a, so lnk/../victim is deep/victim (a checkpoint) and not ./victim (a thesis).
    (tmp_path / "deep" / "a").mkdir(parents=True)
    (tmp_path / "deep" / "victim").mkdir()
    (tmp_path / "deep" / "victim" / "config.json").write_text("{}")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "thesis.txt").write_text("years of work")
    (tmp_path / "lnk").symlink_to(tmp_path / "deep" / "a")
    run("convert", src, f"{tmp_path}/lnk/../victim", "--force")
    assert (tmp_path / "victim" / "thesis.txt").read_text() == "years of work"
    assert (tmp_path / "deep" / "victim" / "model.safetensors").exists()


def test_an_inherited_ignored_sigint_is_kept(tmp_path, rng):
    """nohup and background jobs start convert with SIGINT ignored: it stays ignored (the run goes
    on), and SIGTERM still stops it cleanly."""
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=2)
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc, _ = start_paused([src, tmp_path / "out"], after=3, preexec_fn=ignore)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)  # delivered in order: the SIGINT was already discarded
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.count("interrupted, stopping") == 1, err
    assert partials(tmp_path) == [] and not (tmp_path / "out").exists()


def test_an_interrupt_with_stderr_gone_still_cleans_up(tmp_path, rng):
    """Found in review: Ctrl-C reaches `fp4moe convert ... 2>&1 | tee log` whole; with the reader
    gone, SIGPIPE killed convert before it removed its partial output."""
    src = tmp_path / "src"
    make_checkpoint(src, rng, experts=2, layers=2)
    proc, _ = start_paused([src, tmp_path / "out"], after=3)
    proc.stderr.close()  # the pipe's reader is gone: every later write to stderr gets EPIPE
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode == 130
    assert partials(tmp_path) == [] and not (tmp_path / "out").exists()
