"""Runs a serving engine's OWN config resolution on a checkpoint directory and prints one JSON
object: which quant config the engine builds and which method class it picks for the routed
experts, the MTP (draft) experts and a linear layer. Configs and safetensors headers only; no GPU.

Run it with an engine venv's python (scripts/engines/env.sh prints it):

    PY src/engines/resolve.py --engine sglang CHECKPOINT_DIR [--sm 90|100|120]
        [--flag moe-runner-backend=marlin] [--flag quantization=modelopt_fp4] [--env K=V]

--sm fakes the GPU's compute capability by patching torch.cuda's device queries before the
engine is imported (the engines read the SM through them; the JSON says so in `sm_fake`).
Without --sm the engine sees this machine: no CUDA device.

Every step is guarded: an exception is recorded (`error`, with the engine file:line that raised)
and the steps that do not depend on it still run. When a method's constructor raises (a GPU
gate), the class the engine was constructing is still named (`method_from: "constructor"`: the
first method object allocated during that get_quant_method call), and `method_from: "returned"`
means get_quant_method returned normally.

This file is fp4moe's own harness; it calls engine APIs, it contains no engine code.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

SCHEMA = 1
NUM_HIDDEN_LAYERS_DEFAULT = 43


# ---------------------------------------------------------------- helpers

def _where(exc: BaseException) -> str:
    """site-packages-relative file:line of the innermost frame inside an installed package
    (engine first), e.g. vllm/config/model.py:1450."""
    tb = traceback.extract_tb(exc.__traceback__)
    rel = []
    for fr in reversed(tb):
        f = fr.filename.replace("\\", "/")
        if "site-packages/" in f:
            rel.append(f.split("site-packages/", 1)[1] + f":{fr.lineno}")
    for r in rel:
        if r.startswith(("sglang/", "vllm/")):
            return r
    if rel:
        return rel[0]
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""


def _err(exc: BaseException) -> dict:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return {"type": type(exc).__name__, "message": " / ".join(lines)[:600], "at": _where(exc)}


def _cls(obj) -> str | None:
    return None if obj is None else type(obj).__name__


def _fake_sm(sm: int) -> dict:
    """Makes torch report one CUDA device of compute capability sm (e.g. 90 -> (9, 0)).
    Must run before the engine is imported: engines evaluate many probes at import time."""
    import torch

    major, minor = divmod(sm, 10)
    name = f"fp4moe fake sm_{sm}"

    class _Props:
        def __init__(self):
            self.major, self.minor, self.name = major, minor, name
            self.total_memory = 141 * 1024**3
            self.multi_processor_count = 132
            self.gcnArchName = ""
            self.uuid = "GPU-00000000-0000-0000-0000-000000000000"
            self.L2_cache_size = 50 * 1024**2

    patches = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "get_device_capability": lambda device=None: (major, minor),
        "get_device_name": lambda device=None: name,
        "get_device_properties": lambda device=None: _Props(),
        "mem_get_info": lambda device=None: (140 * 1024**3, 141 * 1024**3),
        "get_arch_list": lambda: [f"sm_{sm}"],
        "set_device": lambda device: None,
    }
    for k, v in patches.items():
        setattr(torch.cuda, k, v)
    return {"sm": sm, "method": "torch.cuda device queries patched before engine import",
            "patched": sorted(patches), "torch_cuda_build": torch.version.cuda}


# GPU-only packages the engines import at module level once they believe CUDA is present. Under
# --sm, when such a package is not installed, it is replaced by an inert stand-in (any attribute,
# any call) so the engine's Python dispatch can run; the JSON lists them in `stubbed_modules`.
# (Not flash_attn: transformers looks it up by distribution name and fails on a stand-in.)
GPU_ONLY_MODULES = ("sgl_kernel", "flashinfer", "deep_gemm", "flash_mla", "sgl_flash_mla",
                    "tilelang", "quack", "cutlass", "cuda", "tokenspeed_mla",
                    "humming", "deep_ep", "nvshmem", "torch_memory_saver",
                    "torchao", "vllm_flash_attn", "pynvml")
STUBBED: list = []
STUBBED_OPS: list = []


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_StubObj,), {})

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return True


class _StubObj(metaclass=_StubMeta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _StubObj()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_StubObj,), {})

    def __iter__(self):
        return iter(())


class _StubModule(__import__("types").ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (_StubObj,), {})


def _stub_module(name: str) -> None:
    m = _StubModule(name)
    m.__path__ = []
    m.__file__ = f"<fp4moe stub for {name}>"
    sys.modules[name] = m
    STUBBED.append(name)


def _tolerate_missing_fake_ops() -> None:
    """Engines register fake (meta) kernels for their compiled ops at import time; with the
    compiled library absent those ops do not exist. Skip such registrations (listed in
    `stubbed_ops`); the config path never runs the ops."""
    import torch.library as tlib

    def tolerant_call(fn, label, *a, **k):
        try:
            return fn(*a, **k)
        except (RuntimeError, ValueError, AttributeError) as e:
            if "does not exist" not in str(e) and "no attribute" not in str(e):
                raise
            STUBBED_OPS.append(f"{label} (fake kernel not registered)")
            return None

    for fname in ("register_fake", "impl_abstract"):
        orig = getattr(tlib, fname, None)
        if orig is None:
            continue

        def wrapper(op, *a, _orig=orig, **k):
            res = tolerant_call(_orig, op, op, *a, **k)
            if callable(res) and not a and "func" not in k:  # decorator form
                return lambda fn, _d=res: (tolerant_call(_d, op, fn) or fn)
            return res
        setattr(tlib, fname, wrapper)


def _install_gpu_stubs(engine: str) -> None:
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    pins = {}
    try:
        import importlib.metadata as md
        import re

        for r in md.requires(engine) or []:
            m = re.match(r"([A-Za-z0-9_.-]+)\s*==\s*([^;,\s]+)", r)
            if m:
                pins[m.group(1).lower().replace("-", "_")] = m.group(2)
    except Exception:  # noqa: BLE001
        pass
    kernel_pin = pins.get("sglang_kernel") or pins.get("sgl_kernel")
    versions = {"sgl_kernel": kernel_pin, "flashinfer": pins.get("flashinfer_python")}

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            top = fullname.split(".")[0]
            if top not in GPU_ONLY_MODULES:
                return None
            if "." not in fullname:
                for f in sys.meta_path:
                    if f is self:
                        continue
                    try:
                        if f.find_spec(fullname, path, target) is not None:
                            return None  # really installed: use it
                    except Exception:  # noqa: BLE001
                        continue
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

        def create_module(self, spec):
            m = _StubModule(spec.name)
            m.__path__ = []
            m.__file__ = f"<fp4moe stub for {spec.name}>"
            m.__version__ = versions.get(spec.name.split(".")[0]) or "0.0.0"
            if "." not in spec.name:
                STUBBED.append(spec.name)
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())


class _Allocs:
    """Records every object allocated of the engine's quant-method base class while active, so a
    constructor that raises still tells which class was being built."""

    def __init__(self, base):
        self.base, self.seen, self._orig = base, [], None

    def __enter__(self):
        base, seen = self.base, self.seen
        orig = base.__dict__.get("__new__")
        self._orig = orig

        def __new__(cls, *a, **k):  # noqa: N807
            seen.append(cls.__name__)
            return object.__new__(cls)

        base.__new__ = staticmethod(__new__)
        return self

    def __exit__(self, *exc):
        if self._orig is None:
            del self.base.__new__
        else:
            self.base.__new__ = self._orig
        return False


def _method(qc, layer, prefix: str, base) -> dict:
    out = {"prefix": prefix}
    if qc is None:
        out.update(method=None, method_from="no quant config")
        return out
    with _Allocs(base) as allocs:
        try:
            m = qc.get_quant_method(layer, prefix)
            out.update(method=_cls(m), method_from="returned")
            for attr in ("mxfp4_backend", "nvfp4_backend", "fp8_backend", "backend",
                         "experts_cls", "use_marlin", "use_a16", "uses_input_scales",
                         "activation_key", "enable_flashinfer_trtllm_moe",
                         "enable_flashinfer_cutlass_moe", "use_marlin_fallback"):
                try:
                    v = getattr(m, attr, None) if m is not None else None
                except Exception:  # noqa: BLE001  (a property that needs a GPU)
                    continue
                if isinstance(v, type):
                    v = v.__name__
                elif v is None or callable(v):
                    continue
                out.setdefault("method_attrs", {})[attr] = str(v)
        except Exception as e:  # noqa: BLE001
            out.update(method=allocs.seen[0] if allocs.seen else None,
                       method_from="constructor" if allocs.seen else "none", error=_err(e))
        out["constructed"] = allocs.seen
    return out


def _versions(engine: str) -> dict:
    import importlib.metadata as md

    v = {"python": platform.python_version()}
    for d in (engine, "torch", "transformers"):
        try:
            v[d] = md.version(d)
        except md.PackageNotFoundError:
            v[d] = None
    return v


def _quiet():
    """Engine logs go to stderr; stdout carries only our JSON."""
    return contextlib.redirect_stdout(sys.stderr)


# ---------------------------------------------------------------- SGLang

def resolve_sglang(ckpt: str, flags: dict, out: dict) -> None:
    import torch
    from sglang.srt.server_args import ServerArgs

    kwargs = {"model_path": ckpt, "device": "cuda", "skip_tokenizer_init": True}
    for k, v in flags.items():
        kwargs[k.replace("-", "_")] = v
    try:
        sa = ServerArgs(**kwargs)
    except Exception as e:  # noqa: BLE001
        out["error"] = {"stage": "ServerArgs", **_err(e)}
        return
    try:  # up to 0.5.1x the MoE methods read the process-global server args
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(sa)
    except ImportError:
        pass
    out["server_args_moe_runner_backend"] = getattr(sa, "moe_runner_backend", None)
    out["server_args_quantization"] = getattr(sa, "quantization", None)
    # 0.5.19+: model overrides are declarations, read through resolved_view.
    try:
        from sglang.srt.arg_groups.model_override_base import resolved_view

        rv = resolved_view(sa)
        out["moe_runner_backend"] = getattr(rv, "moe_runner_backend", None)
    except ImportError:
        out["moe_runner_backend"] = getattr(sa, "moe_runner_backend", None)
    except Exception as e:  # noqa: BLE001
        out["moe_runner_backend"] = getattr(sa, "moe_runner_backend", None)
        out.setdefault("warnings", []).append({"stage": "resolved_view", **_err(e)})

    try:
        import sglang.srt.runtime_context as rc  # 0.5.2x

        if hasattr(rc, "publish"):
            rc.publish(sa, role="scheduler")
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001
        out.setdefault("warnings", []).append({"stage": "runtime_context.publish", **_err(e)})

    from sglang.srt.configs.model_config import ModelConfig

    try:
        mc = ModelConfig.from_server_args(sa)
    except Exception as e:  # noqa: BLE001
        out["error"] = {"stage": "ModelConfig.from_server_args", **_err(e)}
        return
    out["quantization"] = mc.quantization
    out["is_fp4_experts"] = getattr(mc, "is_fp4_experts", None)
    out["nvfp4_moe_meta"] = getattr(mc, "nvfp4_moe_meta", "absent (attribute not in this version)")

    try:
        import inspect

        from sglang.srt.layers.moe.utils import get_moe_runner_backend, initialize_moe_config

        if inspect.signature(initialize_moe_config).parameters:
            initialize_moe_config(sa)
        else:
            initialize_moe_config()
        out["moe_runner_backend_effective"] = str(get_moe_runner_backend())
    except Exception as e:  # noqa: BLE001
        out.setdefault("warnings", []).append({"stage": "initialize_moe_config", **_err(e)})

    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import loader

    try:
        qc = loader._get_quantization_config(mc, LoadConfig())
    except Exception as e:  # noqa: BLE001
        out["error"] = {"stage": "loader._get_quantization_config", **_err(e)}
        return
    out["quant_config_class"] = _cls(qc)
    out["quant_config_module"] = type(qc).__module__ if qc is not None else None
    out["quant_config_name"] = qc.get_name() if qc is not None else None
    if qc is not None:
        for attr in ("ignored_layers", "exclude_modules"):
            v = getattr(qc, attr, None)
            if v is not None:
                out.setdefault("quant_config_attrs", {})[attr] = list(v)
        inner = getattr(qc, "nvfp4_config", None)
        if inner is not None:
            out.setdefault("quant_config_attrs", {})["nvfp4_exclude_modules"] = list(
                getattr(inner, "exclude_modules", []) or [])

    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.quantization.base_config import QuantizeMethodBase

    def stub(cls):
        obj = cls.__new__(cls)
        torch.nn.Module.__init__(obj)
        return obj

    moe = stub(FusedMoE)
    backend = str(out.get("moe_runner_backend_effective") or out.get("moe_runner_backend") or "")
    moe.use_triton_kernels = "triton_kernel" in backend
    moe.use_flashinfer_trtllm_moe = "flashinfer_trtllm" in backend
    # SGLang module names: routed experts model.layers.L.mlp.experts; the NextN draft builds
    # mtp.0 as model.decoder (DeepseekV4ForCausalLMNextN); attention model.layers.L.self_attn.
    out["routed"] = _method(qc, moe, "model.layers.3.mlp.experts", QuantizeMethodBase)
    out["mtp"] = _method(qc, moe, "model.decoder.mlp.experts", QuantizeMethodBase)
    lin = stub(LinearBase)
    out["linear"] = _method(qc, lin, "model.layers.3.self_attn.wq_a", QuantizeMethodBase)


# ---------------------------------------------------------------- vLLM

def _vllm_fake_platform(sm: int, out: dict) -> None:
    """vLLM decides the platform from NVML/libcuda; without a driver it is UnspecifiedPlatform.
    Install its CUDA platform with the device capability answered by us."""
    import types

    import vllm.platforms as vp

    # The CUDA platform module imports the compiled op library, which needs libcuda; the config
    # path never calls those ops, so an empty module stands in for it.
    # vLLM's compiled ops are not loadable without libcuda; a few are called at import time to
    # ask what the device supports. Missing ops in vLLM's namespaces answer True ("supported",
    # as the real ops do on the SMs that have the kernel) and are listed in `stubbed_ops`.
    import torch._ops as tops

    orig_getattr = tops._OpNamespace.__getattr__

    def ns_getattr(self, op_name):
        try:
            return orig_getattr(self, op_name)
        except (AttributeError, RuntimeError):
            if getattr(self, "name", "") in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar",
                                             "_C_utils", "_vllm_fa2_C", "_vllm_fa3_C",
                                             "_flashmla_C", "_flashmla_extension_C"):
                STUBBED_OPS.append(f"{self.name}.{op_name}")
                return lambda *a, **k: True if "support" in op_name else _StubObj()
            raise

    tops._OpNamespace.__getattr__ = ns_getattr
    for mod in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn"):
        try:
            __import__(mod)
        except Exception:  # noqa: BLE001
            _stub_module(mod)
    try:
        from vllm.platforms.cuda import CudaPlatform
        from vllm.platforms.interface import DeviceCapability
    except Exception as e:  # noqa: BLE001
        out["sm_fake"]["vllm_platform"] = {"installed": False, **_err(e)}
        return
    major, minor = divmod(sm, 10)
    cls = CudaPlatform

    @classmethod
    def cap(klass, device_id=0):
        return DeviceCapability(major=major, minor=minor)

    cls.get_device_capability = cap
    for name, val in (("get_device_name", f"fp4moe fake sm_{sm}"),
                      ("get_device_total_memory", 141 * 1024**3)):
        if hasattr(cls, name):
            setattr(cls, name, classmethod(lambda klass, device_id=0, _v=val: _v))
    if hasattr(cls, "is_fully_connected"):
        cls.is_fully_connected = classmethod(lambda klass, ids: True)
    vp._current_platform = cls()
    out["sm_fake"]["vllm_platform"] = {"installed": True, "class": "CudaPlatform",
                                       "patched": ["get_device_capability", "get_device_name",
                                                   "get_device_total_memory"]}


def _vllm_moe_config(flags: dict):
    """A FusedMoEConfig for one DeepSeek-V4-Flash MoE layer, built from the dataclass fields the
    installed version declares (they differ between versions)."""
    import dataclasses
    import enum

    import torch
    from vllm.model_executor.layers.fused_moe import config as fmc

    pc_cls = fmc.FusedMoEParallelConfig
    if hasattr(pc_cls, "make_no_parallel"):
        pc = pc_cls.make_no_parallel()
    else:
        vals = {}
        for f in dataclasses.fields(pc_cls):
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            n = f.name
            vals[n] = (False if n.startswith(("use_", "enable_", "is_")) else
                       "naive" if "backend" in n else 0 if "rank" in n else 1)
        pc = pc_cls(**vals)
    known = {
        "num_experts": 256, "experts_per_token": 6, "hidden_dim": 4096,
        "intermediate_size": 2048, "intermediate_size_per_partition": 2048,
        "num_local_experts": 256, "num_logical_experts": 256, "device": "cuda",
        "moe_parallel_config": pc, "in_dtype": torch.bfloat16, "max_num_tokens": 8192,
        "has_bias": False,
    }
    if "moe-backend" in flags:
        known["moe_backend"] = flags["moe-backend"]
    vals = {}
    for f in dataclasses.fields(fmc.FusedMoEConfig):
        if not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name in known:
            vals[f.name] = known[f.name]
        elif required:
            t = f.type if not isinstance(f.type, str) else getattr(fmc, f.type.split("|")[0].strip(), None)
            if isinstance(t, type) and issubclass(t, enum.Enum):
                members = list(t)
                pick = next((m for m in members if m.name.upper() in ("SILU", "DEEPSEEKV4",
                             "RENORMALIZE", "DEEPSEEKV3")), members[0])
                vals[f.name] = pick
            else:
                raise TypeError(f"FusedMoEConfig field {f.name!r} ({f.type}) has no value here")
    for name in ("activation", "routing_method"):
        if name in vals:
            continue
    return fmc.FusedMoEConfig(**vals)


def resolve_vllm(ckpt: str, flags: dict, out: dict, sm: int | None) -> None:
    import torch

    if sm is not None:  # experimental, FP4MOE_VLLM_FAKE_PLATFORM=1: does not get through 0.34's imports
        _vllm_fake_platform(sm, out)
    from vllm.platforms import current_platform

    out["vllm_platform"] = type(current_platform).__name__
    if os.environ.get("FP4MOE_VLLM_CUDA_REGISTRY") and not current_platform.is_cuda():
        # Some versions pick the DeepSeek-V4 quant config class by platform inside
        # get_quantization_config (0.34: CUDA/ROCm get models/deepseek_v41's, which reads
        # `ignore`; other platforms models/deepseek_v4's). Opt-in experiment: answer "CUDA" to
        # that one question. Does not work yet on 0.34: deepseek_v41 calls compiled ops at import
        # (RULES_EVIDENCE.md records that rule from the source instead).
        import vllm.model_executor.layers.quantization as me_quant
        import vllm.model_executor.model_loader.weight_utils as wu

        orig = me_quant.get_quantization_config

        def registry_as_cuda(name, _orig=orig):
            current_platform.is_cuda = lambda: True
            try:
                return _orig(name)
            finally:
                del current_platform.is_cuda

        me_quant.get_quantization_config = registry_as_cuda
        if getattr(wu, "get_quantization_config", None) is orig:
            wu.get_quantization_config = registry_as_cuda
        out["vllm_quant_registry_platform"] = "cuda (answered by the harness)"
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config

    mkw = {"model": ckpt, "tokenizer": ckpt, "skip_tokenizer_init": True, "trust_remote_code": False}
    engine_flags = {}
    for k, v in flags.items():
        if k == "quantization":
            mkw["quantization"] = v
        else:
            engine_flags[k] = v
    try:
        mc = ModelConfig(**mkw)
    except Exception as e:  # noqa: BLE001
        out["error"] = {"stage": "ModelConfig", **_err(e)}
        return
    out["quantization"] = mc.quantization
    try:
        qc = VllmConfig._get_quantization_config(mc, LoadConfig())
    except Exception as e:  # noqa: BLE001
        out["error"] = {"stage": "VllmConfig._get_quantization_config", **_err(e)}
        return
    out["quant_config_class"] = _cls(qc)
    out["quant_config_module"] = type(qc).__module__ if qc is not None else None
    out["quant_config_name"] = qc.get_name() if qc is not None else None

    vkw = {"model_config": mc}
    if "moe-backend" in engine_flags:
        try:
            from vllm.config import KernelConfig

            vkw["kernel_config"] = KernelConfig(moe_backend=engine_flags["moe-backend"])
        except Exception as e:  # noqa: BLE001
            out.setdefault("warnings", []).append({"stage": "KernelConfig", **_err(e)})
    try:
        vc = VllmConfig(**vkw)
    except Exception as e:  # noqa: BLE001
        out.setdefault("warnings", []).append({"stage": "VllmConfig(model_config)", **_err(e)})
        vc = VllmConfig.__new__(VllmConfig)
        object.__setattr__(vc, "model_config", mc)

    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    try:
        from vllm.model_executor.layers.fused_moe import RoutedExperts as MoeCls
    except ImportError:
        from vllm.model_executor.layers.fused_moe import FusedMoE as MoeCls

    def stub(cls):
        obj = cls.__new__(cls)
        torch.nn.Module.__init__(obj)
        return obj

    n_layers = getattr(mc.hf_config, "num_hidden_layers", NUM_HIDDEN_LAYERS_DEFAULT)
    with set_current_vllm_config(vc):
        if qc is not None:
            for attr in ("expert_dtype", "moe_quant_algo", "ignored_layers"):
                try:
                    v = getattr(qc, attr, None)
                    if v is not None:
                        out.setdefault("quant_config_attrs", {})[attr] = (
                            list(v) if isinstance(v, (list, tuple)) else v)
                except Exception as e:  # noqa: BLE001
                    out.setdefault("quant_config_attrs", {})[attr] = {"error": _err(e)}
        moe = stub(MoeCls)
        try:
            moe.moe_config = _vllm_moe_config(engine_flags)
        except Exception as e:  # noqa: BLE001
            moe.moe_config = None
            out.setdefault("warnings", []).append({"stage": "FusedMoEConfig", **_err(e)})
        # vLLM module names: model.layers.L.ffn.experts; the MTP draft builds mtp.i as
        # model.layers.{num_hidden_layers + i}.
        out["routed"] = _method(qc, moe, "model.layers.3.ffn.experts", QuantizeMethodBase)
        out["mtp"] = _method(qc, moe, f"model.layers.{n_layers}.ffn.experts", QuantizeMethodBase)
        lin = stub(LinearBase)
        out["linear"] = _method(qc, lin, "model.layers.3.attn.wq_a", QuantizeMethodBase)


# ---------------------------------------------------------------- main

def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True, choices=["sglang", "vllm"])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--jobs", type=Path, metavar="FILE",
                    help='JSON list of {"checkpoint": DIR, "flags": {NAME: VALUE}}: all resolved in '
                         'this one process (the engine is imported once; --sm applies to all); '
                         'prints a JSON list')
    ap.add_argument("--sm", type=int, choices=[80, 89, 90, 100, 103, 120, 121])
    ap.add_argument("--flag", action="append", default=[], metavar="NAME=VALUE",
                    help="engine CLI option without dashes, e.g. moe-runner-backend=marlin")
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    a = ap.parse_args(argv)

    if (a.checkpoint is None) == (a.jobs is None):
        ap.error("give CHECKPOINT or --jobs FILE")
    envs = dict(e.split("=", 1) for e in a.env)
    os.environ.update(envs)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if a.jobs is not None:
        jobs = json.loads(a.jobs.read_text())
    else:
        jobs = [{"checkpoint": a.checkpoint, "flags": dict(f.split("=", 1) for f in a.flag)}]
    results = []
    sm_fake = None
    with _quiet():
        if a.sm is not None and a.engine == "vllm" and not os.environ.get("FP4MOE_VLLM_FAKE_PLATFORM"):
            ap.error("vLLM: --sm is not supported: vLLM picks its platform from NVML and loads its "
                     "compiled ops on the CUDA platform (import-time op calls and fake-kernel "
                     "registrations), so a faked SM does not get through its imports; run without "
                     "--sm (UnspecifiedPlatform). FP4MOE_VLLM_FAKE_PLATFORM=1 tries anyway.")
        if a.sm is not None:
            sm_fake = _fake_sm(a.sm)
            _install_gpu_stubs(a.engine)
            _tolerate_missing_fake_ops()
        for job in jobs:
            t0 = time.time()
            out: dict = {"schema": SCHEMA, "engine": a.engine,
                         "checkpoint": Path(job["checkpoint"]).name,
                         "flags": dict(job.get("flags") or {}), "env": envs, "sm": a.sm,
                         "sm_fake": dict(sm_fake) if sm_fake else None,
                         "jobs_in_process": len(jobs), "job_index": len(results)}
            try:
                out["versions"] = _versions(a.engine)
                ckpt = str(Path(job["checkpoint"]).resolve())
                if a.engine == "sglang":
                    resolve_sglang(ckpt, out["flags"], out)
                else:
                    resolve_vllm(ckpt, out["flags"], out, a.sm)
            except Exception as e:  # noqa: BLE001
                out["error"] = {"stage": "harness", **_err(e),
                                "traceback": traceback.format_exc()[-3000:]}
            out["stubbed_modules"] = sorted(set(STUBBED))
            if STUBBED_OPS:
                out["stubbed_ops"] = sorted(set(STUBBED_OPS))
            out["seconds"] = round(time.time() - t0, 1)
            results.append(out)
    doc = results if a.jobs is not None else results[0]
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
