"""Engine-oracle fixtures: real DeepSeek-V4 configs plus a small safetensors file holding the few
tensors the engines' config resolution probes, with the real dtypes and shapes (data all zeros).

Runs in the project venv (numpy, ml_dtypes, safetensors). Used by the refresh script and the tests:

    python tests/engines/fixtures.py DEST_ROOT            # writes DEST_ROOT/<fixture>/ for each
    python tests/engines/fixtures.py DEST_ROOT --only NAME
    python tests/engines/fixtures.py DEST_ROOT --converted-with build/release/fp4moe

The configs are stored under tests/engines/fixtures/<name>/ (copied verbatim from
tests/data/corpus, provenance in tests/data/corpus/SOURCES.md). The tensors are generated here,
so nothing large is committed. The output of our own `fp4moe convert` is built with the binary at
test time (converted_checkpoints()).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"

# DeepSeek-V4-Flash shapes (config.json): hidden 4096, moe_intermediate 2048, q_lora 1024,
# one shared expert. Experts: w1/w3 [inter, hidden], w2 [hidden, inter].
H, I, Q_LORA = 4096, 2048, 1024
EXPERT_MATS = (("w1", I, H), ("w2", H, I), ("w3", I, H))

F8E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F8E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _nvfp4(prefix: str, n: int, k: int) -> dict:
    """ModelOpt NVFP4: U8 [n, k/2], F8_E4M3 [n, k/16], F32 scalars weight_scale_2, input_scale."""
    return {
        f"{prefix}.weight": np.zeros((n, k // 2), np.uint8),
        f"{prefix}.weight_scale": np.zeros((n, k // 16), F8E4M3),
        f"{prefix}.weight_scale_2": np.ones((), np.float32),
        f"{prefix}.input_scale": np.ones((), np.float32),
    }


def _mxfp4(prefix: str, n: int, k: int) -> dict:
    """DeepSeek-V4 stock MXFP4: I8 [n, k/2] (two E2M1 per byte), F8_E8M0 `.scale` [n, k/32]."""
    return {
        f"{prefix}.weight": np.zeros((n, k // 2), np.int8),
        f"{prefix}.scale": np.full((n, k // 32), 127, np.uint8).view(F8E8M0),
    }


def _fp8_block(prefix: str, n: int, k: int) -> dict:
    """FP8 E4M3 128x128 blocks with UE8M0 `.scale` (DeepSeek-V4 attention / shared experts)."""
    return {
        f"{prefix}.weight": np.zeros((n, k), F8E4M3),
        f"{prefix}.scale": np.full(((n + 127) // 128, (k + 127) // 128), 127, np.uint8).view(F8E8M0),
    }


def tensors_for(routed: str) -> dict:
    """One routed expert of layer 0 in `routed` form (nvfp4 | mxfp4), the MTP layer's expert 0 in
    MXFP4 (NVIDIA leaves mtp.* as shipped), one attention linear and one shared-expert linear."""
    t: dict = {}
    for w, n, k in EXPERT_MATS:
        t.update((_nvfp4 if routed == "nvfp4" else _mxfp4)(f"layers.0.ffn.experts.0.{w}", n, k))
        t.update(_mxfp4(f"mtp.0.ffn.experts.0.{w}", n, k))
    t.update(_fp8_block("layers.0.attn.wq_a", Q_LORA, H))
    t.update(_fp8_block("layers.0.ffn.shared_experts.w1", I, H))
    return t


# fixture name -> (corpus directory the configs were copied from, routed-expert form on disk)
STATIC = {
    "nvidia-nvfp4": ("nvidia__DeepSeek-V4-Flash-NVFP4", "nvfp4"),
    "stock-mxfp4": ("deepseek-ai__DeepSeek-V4-Flash", "mxfp4"),
    "nvidia-older-rev": ("nvidia__DeepSeek-V4-Flash-NVFP4__older-rev-no-quantization_config", "nvfp4"),
}
# The output of our own convert, built at test time (never stored): the default dialect
# (`moe_quant_algo: NVFP4`, with input_scale) and the weight-only one (`--dialect w4a16_nvfp4`).
CONVERTED = "converted"
CONVERTED_W4A16 = "converted-w4a16"
CONVERTED_ARGS = {CONVERTED: [], CONVERTED_W4A16: ["--dialect", "w4a16_nvfp4"]}
ALL = list(STATIC) + list(CONVERTED_ARGS)


def save_safetensors(tensors: dict, directory: Path) -> None:
    """model.safetensors plus model.safetensors.index.json (sorted keys, as the real shards'
    indexes are), written with the safetensors package."""
    arrays = {k: np.require(v, requirements="C") for k, v in sorted(tensors.items())}  # keeps 0-d
    specs = {k: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape),
                                       data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in arrays.items()}
    safetensors.serialize_file(specs, str(directory / "model.safetensors"), {"format": "pt"})
    index = {"metadata": {"total_size": sum(a.nbytes for a in arrays.values())},
             "weight_map": {k: "model.safetensors" for k in arrays}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def materialize(name: str, dest: Path) -> Path:
    """Writes fixture `name` into dest (created; must not exist) and returns it."""
    _, routed = STATIC[name]
    dest.mkdir(parents=True)
    for f in sorted((FIXTURES / name).iterdir()):
        if f.suffix == ".json":
            shutil.copyfile(f, dest / f.name)
    save_safetensors(tensors_for(routed), dest)
    return dest


def converted_checkpoints(binary: str | os.PathLike, dest_root: Path) -> dict:
    """The output of our own convert, built now: `fp4moe synth dsv4-mxfp4 --full-size` (sparse,
    the real layout, dtypes and shapes; ~50 s) then `fp4moe convert --to nvfp4` once per dialect in
    CONVERTED_ARGS. Returns {name: directory}. The engines read only configs and headers."""
    src = dest_root / ".synth-dsv4-mxfp4"
    subprocess.run([str(binary), "synth", "dsv4-mxfp4", str(src), "--full-size"], check=True,
                   stdout=subprocess.DEVNULL, timeout=900)
    out = {}
    for name, extra in CONVERTED_ARGS.items():
        subprocess.run([str(binary), "convert", str(src), str(dest_root / name), "--to", "nvfp4",
                        *extra], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=1800)
        out[name] = dest_root / name
    shutil.rmtree(src, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dest_root", type=Path)
    ap.add_argument("--only", choices=list(STATIC))
    ap.add_argument("--converted-with", metavar="FP4MOE_BINARY",
                    help="also build the converted fixtures with this fp4moe binary")
    a = ap.parse_args(argv)
    for name in [a.only] if a.only else list(STATIC):
        print(materialize(name, a.dest_root / name))
    if a.converted_with:
        for d in converted_checkpoints(a.converted_with, a.dest_root).values():
            print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
