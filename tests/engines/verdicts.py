"""The engine-oracle verdicts: what each pinned SGLang / vLLM release decided for each fixture,
flag set and (faked) SM, recorded by scripts/engines/refresh_verdicts.sh into verdicts.json.

Helpers for the tests here and for the rules-table tests (tests/python or C++ side):

    from tests.engines.verdicts import load, lookup, core, MATRIX
    doc = load()                         # the whole file (environments, fixtures, verdicts)
    v = lookup(doc, "sglang", "0.5.23", "nvidia-nvfp4", {}, 100)
    v["routed"]["method"]                # "ModelOptNvFp4FusedMoEMethod"
    core(v)                              # the fields a rule must predict (stable across reruns)

Runs with the standard library only (the engine venvs import it too).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERDICTS = HERE / "verdicts.json"

# The pinned matrix. Newest = last of each list (the live test runs those).
VERSIONS = {
    "sglang": ["0.5.13.post1", "0.5.14", "0.5.23"],
    "vllm": ["0.21.0", "0.22.0", "0.34.0"],
}
FIXTURES = ["nvidia-nvfp4", "stock-mxfp4", "nvidia-older-rev", "converted", "converted-w4a16"]
CONVERTED = ["converted", "converted-w4a16"]
FLAGS = {
    "sglang": [{}, {"moe-runner-backend": "marlin"}, {"quantization": "modelopt_fp4"}],
    "vllm": [{}, {"moe-backend": "marlin"}, {"quantization": "modelopt_fp4"}],
}
# SGLang: the SM is faked (resolve.py --sm). vLLM: not fakeable (resolve.py explains), so its
# verdicts are on this machine's UnspecifiedPlatform (sm None); its method class does not depend
# on the SM, the kernel backend inside the method does (RULES_EVIDENCE.md).
SMS = {"sglang": [90, 100, 120], "vllm": [None]}
MATRIX = [(e, v, f, fl, sm) for e in VERSIONS for v in VERSIONS[e] for f in FIXTURES
          for fl in FLAGS[e] for sm in SMS[e]]


def newest(engine: str) -> str:
    return VERSIONS[engine][-1]


def flags_key(flags: dict) -> str:
    """Canonical text of a flag set: '' for defaults, else 'a=b,c=d' sorted."""
    return ",".join(f"{k}={flags[k]}" for k in sorted(flags))


def key(engine: str, version: str, fixture: str, flags: dict, sm) -> str:
    return f"{engine}@{version}|{fixture}|{flags_key(flags)}|sm{sm}"


def load(path: Path = VERDICTS) -> dict:
    doc = json.loads(Path(path).read_text())
    doc["_index"] = {key(v["engine"], v["version"], v["fixture"], v["flags"], v["sm"]): v
                     for v in doc["verdicts"]}
    return doc


def lookup(doc: dict, engine: str, version: str, fixture: str, flags: dict, sm) -> dict | None:
    return doc["_index"].get(key(engine, version, fixture, flags, sm))


def _method_core(m: dict | None) -> dict | None:
    if m is None:
        return None
    c = {"method": m.get("method"), "method_from": m.get("method_from")}
    if m.get("error"):
        c["error_type"] = m["error"].get("type")
    attrs = m.get("method_attrs") or {}
    for a in ("mxfp4_backend", "nvfp4_backend", "experts_cls", "use_a16", "uses_input_scales"):
        if a in attrs:
            c[a] = attrs[a]
    return c


def core(v: dict) -> dict:
    """What a rule must predict: deterministic for a given engine version, fixture, flags, SM."""
    c = {
        "quantization": v.get("quantization"),
        "quant_config_class": v.get("quant_config_class"),
        "quant_config_name": v.get("quant_config_name"),
        "routed": _method_core(v.get("routed")),
        "mtp": _method_core(v.get("mtp")),
        "linear": _method_core(v.get("linear")),
        "error": ({"stage": v["error"].get("stage"), "type": v["error"].get("type")}
                  if v.get("error") else None),
    }
    if v.get("engine") == "sglang":
        c["moe_runner_backend"] = v.get("moe_runner_backend_effective")
        c["nvfp4_moe_meta"] = v.get("nvfp4_moe_meta") is not None and not isinstance(
            v.get("nvfp4_moe_meta"), str)
        c["is_fp4_experts"] = v.get("is_fp4_experts")
    else:
        attrs = v.get("quant_config_attrs") or {}
        c["moe_quant_algo"] = attrs.get("moe_quant_algo")
        c["expert_dtype"] = attrs.get("expert_dtype")
    return c


def config_digest(directory: Path) -> str:
    """sha256 over the checkpoint's JSON configs (what the engines' config paths read)."""
    h = hashlib.sha256()
    for f in sorted(Path(directory).glob("*.json")):
        if f.name == "model.safetensors.index.json":
            continue
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
