"""The corpus verdicts: what the newest pinned SGLang and vLLM decided for every real checkpoint's
configs in tests/data/corpus (configs only, no safetensors) and for the plain ModelOpt NVFP4 form
that `fp4moe convert` writes for the non-DeepSeek-V4 families (built at test time), recorded by
scripts/engines/corpus_verdicts.py into corpus_verdicts.json.

    from tests.engines import corpus as C
    doc = C.load()
    v = C.lookup(doc, "sglang", "nvidia__GLM-5.1-NVFP4", 100)
    v["routed"]                     # "ModelOptNvFp4FusedMoEMethod"

Standard library only (the engine venvs import it too).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = ROOT / "tests" / "data" / "corpus"
CORPUS_VERDICTS = HERE / "corpus_verdicts.json"
sys.path.insert(0, str(HERE))
import verdicts as V  # noqa: E402

# SGLang: SM faked (resolve.py --sm); vLLM: UnspecifiedPlatform (resolve.py explains).
SMS = {"sglang": [90, 100, 120], "vllm": [None]}
# fp4moe convert's output, built now: "converted:LAYOUT" (default dialect) and
# "converted-w4a16:LAYOUT" (--dialect w4a16_nvfp4), from `fp4moe synth LAYOUT --layers 1
# --experts 4`.
CONVERTED = {
    "converted:dsv3-fp8": ("dsv3-fp8", []),
    "converted:minimax-fp8": ("minimax-fp8", []),
    "converted:bf16": ("bf16", []),
    "converted:gpt-oss-mxfp4": ("gpt-oss-mxfp4", []),
    "converted-w4a16:dsv3-fp8": ("dsv3-fp8", ["--dialect", "w4a16_nvfp4"]),
}
# The live test (test_corpus_verdicts.py) re-runs these: one per dialect, few architectures
# (vLLM inspects each architecture in a subprocess, the slow part).
LIVE = ["nvidia__DeepSeek-V3.1-NVFP4", "nvidia__GLM-5.1-NVFP4", "deepseek-ai__DeepSeek-V3",
        "openai__gpt-oss-20b", "nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
        "converted:dsv3-fp8"]


def corpus_dirs() -> dict:
    return {p.name: p for p in sorted(CORPUS.iterdir()) if p.is_dir()}


def build_converted(binary, dest: Path, names=None) -> dict:
    """{name: dir} of fp4moe convert's output, built with `binary` under dest."""
    out = {}
    dest.mkdir(parents=True, exist_ok=True)
    for name, (layout, args) in CONVERTED.items():
        if names is not None and name not in names:
            continue
        src = dest / ("src-" + layout)
        if not src.exists():
            subprocess.run([str(binary), "synth", layout, str(src), "--layers", "1", "--experts",
                            "4"], check=True, capture_output=True, timeout=600)
        dst = dest / name.replace(":", "__")
        if dst.exists():
            shutil.rmtree(dst)
        subprocess.run([str(binary), "convert", str(src), str(dst), *args], check=True,
                       capture_output=True, timeout=600)
        out[name] = dst
    return out


def short_error(err: dict | None) -> dict | None:
    if not err:
        return None
    return {"stage": err.get("stage"), "type": err.get("type"), "at": err.get("at"),
            "message": (err.get("message") or "")[:240]}


def entry(raw: dict, name: str) -> dict:
    """The recorded fields of one resolver result."""
    m = lambda part: (raw.get(part) or {}).get("method")  # noqa: E731
    e = {"engine": raw["engine"], "version": raw["versions"][raw["engine"]],
         "checkpoint": name, "sm": raw["sm"], "quantization": raw.get("quantization"),
         "quant_config_class": raw.get("quant_config_class"), "routed": m("routed"),
         "linear": m("linear"), "error": short_error(raw.get("error")),
         "routed_error": short_error((raw.get("routed") or {}).get("error"))}
    if raw["engine"] == "sglang":
        e["moe_runner_backend"] = raw.get("moe_runner_backend_effective")
    return e


def core(e: dict) -> dict:
    """What must stay equal between the recorded and a live run."""
    c = {k: e.get(k) for k in ("quantization", "quant_config_class", "routed", "linear",
                               "moe_runner_backend")}
    c["error"] = (e["error"] or {}).get("type") if e.get("error") else None
    c["routed_error"] = (e["routed_error"] or {}).get("type") if e.get("routed_error") else None
    return c


def engine_chose(v: dict) -> str | None:
    """The routed-expert method class the engine chose ("None": it built none, the module runs
    unquantized), or None where it stopped before choosing (an error, no quant config, or the
    harness could not ask). A class whose constructor raised on this GPU-less machine is named
    (resolve.py: method_from "constructor")."""
    if v["error"] or not v["quant_config_class"]:
        return None
    if v["routed"]:  # also when its constructor then refused this machine (no GPU): named
        return v["routed"]
    return None if v.get("routed_error") else "None"


# Where the harness and a served engine differ, the rules follow the served engine (as in
# agreement.py's HARNESS_GAPS): (engine, checkpoint) -> why.
HARNESS_GAPS = {
    ("vllm", "nvidia__DeepSeek-V4-Flash-NVFP4__older-rev-no-quantization_config"):
        "resolve.py asks with the unmapped prefix; the DeepSeek-V4 model applies its WeightsMapper "
        "first, and then the routed experts get ModelOptNvFp4FusedMoE (agreement.py)",
    **{(e, "peaceh-nv_TRTLLM__DeepSeek-R1-FP4-hf_quant_config"):
       "the corpus keeps only this checkpoint's hf_quant_config.json, no config.json: neither "
       "engine can open the directory, so it was not asked; the rule is the one the NVIDIA "
       "DeepSeek-V3.1 NVFP4 config (the same shape: hf_quant_config.json only) was run against"
       for e in ("sglang", "vllm")},
}

# Corpus rows whose routed experts the rules still leave unknown although the engine chose a
# method (engine -> checkpoint -> why); the test keeps this list exact.
STILL_UNKNOWN = {
    "sglang": {
        "deepseek-ai__DeepSeek-V4-Flash":
            "SGLang's DeepSeek-V4 FP4 expert probe reads a routed expert's safetensors header "
            "(rule sglang.dsv4.fp4_probe_as_mxfp4 needs tensor.routed_expert_dtype); the corpus "
            "holds configs only",
    },
}


def key(engine: str, checkpoint: str, sm) -> str:
    return f"{engine}|{checkpoint}|sm{sm}"


def load(path: Path = CORPUS_VERDICTS) -> dict:
    doc = json.loads(Path(path).read_text())
    doc["_index"] = {key(v["engine"], v["checkpoint"], v["sm"]): v for v in doc["verdicts"]}
    return doc


def lookup(doc: dict, engine: str, checkpoint: str, sm) -> dict | None:
    return doc["_index"].get(key(engine, checkpoint, sm))


config_digest = V.config_digest
