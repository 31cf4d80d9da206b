"""Python binding of fp4moe's format layer (ctypes over libfp4moe.so, the C ABI in src/capi).

The library is looked up in $FP4MOE_BUILD_DIR, then build/release. Every function takes and
returns numpy arrays; bad input raises Fp4moeError with the library's message.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

__all__ = [
    "Fp4moeError", "encode", "decode", "quantize_nvfp4", "dequantize_nvfp4", "quantize_mxfp4",
    "dequantize_mxfp4", "quantize_fp8_block128", "dequantize_fp8_block128",
    "transcode_mxfp4_to_nvfp4",
]


class Fp4moeError(ValueError):
    """Bad input reported by the library (the message names the tensor and the reason)."""


def _load() -> ctypes.CDLL:
    root = Path(__file__).resolve().parents[2]
    build = Path(os.environ.get("FP4MOE_BUILD_DIR", root / "build" / "release"))
    return ctypes.CDLL(str(build / "libfp4moe.so"))


_lib = _load()
_P = ctypes.c_void_p
_ERR_SIZE = 1024


def _ptr(a: np.ndarray) -> int:
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data


def _call(fn, *args) -> None:
    err = ctypes.create_string_buffer(_ERR_SIZE)
    if fn(*args, err, ctypes.c_size_t(_ERR_SIZE)) != 0:
        raise Fp4moeError(err.value.decode())


_BYTE_KINDS = {"e2m1", "e4m3", "ue4m3", "e8m0"}


def encode(kind: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.uint8 if kind in _BYTE_KINDS else np.uint16)
    if _lib.fp4moe_encode(kind.encode(), _P(_ptr(x)), _P(_ptr(out)), ctypes.c_size_t(x.size)):
        raise Fp4moeError(f"unknown kind {kind}")
    return out


def decode(kind: str, codes: np.ndarray) -> np.ndarray:
    codes = np.ascontiguousarray(codes, dtype=np.uint8 if kind in _BYTE_KINDS else np.uint16)
    out = np.empty(codes.shape, dtype=np.float32)
    if _lib.fp4moe_decode(kind.encode(), _P(_ptr(codes)), _P(_ptr(out)), ctypes.c_size_t(codes.size)):
        raise Fp4moeError(f"unknown kind {kind}")
    return out


def _rows_cols(x: np.ndarray) -> tuple[int, int]:
    cols = x.shape[-1] if x.ndim else 1
    return (x.size // cols if cols else 0), cols


def quantize_nvfp4(x: np.ndarray, tensor_scale: float | None = None):
    """Returns (packed uint8 [..., K/2], block scales uint8 [..., K/16], tensor scale float32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = _rows_cols(x)
    packed = np.zeros(x.shape[:-1] + (max(cols // 2, 0),), np.uint8)
    scales = np.zeros(x.shape[:-1] + (max(cols // 16, 0),), np.uint8)
    ts_out = ctypes.c_float()
    ts_in = float("nan") if tensor_scale is None else float(tensor_scale)
    _call(_lib.fp4moe_quantize_nvfp4, _P(_ptr(x)), ctypes.c_int64(rows), ctypes.c_int64(cols),
          ctypes.c_float(ts_in), _P(_ptr(packed)), _P(_ptr(scales)), ctypes.byref(ts_out))
    return packed, scales, np.float32(ts_out.value)


def dequantize_nvfp4(packed: np.ndarray, scales: np.ndarray, tensor_scale: float) -> np.ndarray:
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.uint8)
    cols = packed.shape[-1] * 2
    out = np.empty(packed.shape[:-1] + (cols,), np.float32)
    _call(_lib.fp4moe_dequantize_nvfp4, _P(_ptr(packed)), _P(_ptr(scales)),
          ctypes.c_float(tensor_scale), ctypes.c_int64(out.size // cols), ctypes.c_int64(cols),
          _P(_ptr(out)))
    return out


def quantize_mxfp4(x: np.ndarray, rule: str = "ocp_floor"):
    """Returns (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = _rows_cols(x)
    packed = np.zeros(x.shape[:-1] + (max(cols // 2, 0),), np.uint8)
    scales = np.zeros(x.shape[:-1] + (max(cols // 32, 0),), np.uint8)
    rule_id = {"ocp_floor": 0, "round_up": 1}[rule]
    _call(_lib.fp4moe_quantize_mxfp4, _P(_ptr(x)), ctypes.c_int64(rows), ctypes.c_int64(cols),
          ctypes.c_int(rule_id), _P(_ptr(packed)), _P(_ptr(scales)))
    return packed, scales


def dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.uint8)
    cols = packed.shape[-1] * 2
    out = np.empty(packed.shape[:-1] + (cols,), np.float32)
    _call(_lib.fp4moe_dequantize_mxfp4, _P(_ptr(packed)), _P(_ptr(scales)),
          ctypes.c_int64(out.size // cols), ctypes.c_int64(cols), _P(_ptr(out)))
    return out


def _fp8_grid(rows: int, cols: int) -> tuple[int, int]:
    return (rows + 127) // 128, (cols + 127) // 128


def quantize_fp8_block128(x: np.ndarray, ue8m0: bool = False):
    """2-D x [N, K] -> (E4M3 codes uint8 [N, K], scales [ceil(N/128), ceil(K/128)])."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    q = np.zeros(x.shape, np.uint8)
    scales = np.zeros(_fp8_grid(rows, cols), np.uint8 if ue8m0 else np.float32)
    _call(_lib.fp4moe_quantize_fp8_block128, _P(_ptr(x)), ctypes.c_int64(rows),
          ctypes.c_int64(cols), ctypes.c_int(int(ue8m0)), _P(_ptr(q)), _P(_ptr(scales)))
    return q, scales


def dequantize_fp8_block128(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    q = np.ascontiguousarray(q, dtype=np.uint8)
    ue8m0 = scales.dtype == np.uint8
    scales = np.ascontiguousarray(scales)
    out = np.empty(q.shape, np.float32)
    _call(_lib.fp4moe_dequantize_fp8_block128, _P(_ptr(q)), _P(_ptr(scales)),
          ctypes.c_int64(q.shape[0]), ctypes.c_int64(q.shape[1]), ctypes.c_int(int(ue8m0)),
          _P(_ptr(out)))
    return out


def transcode_mxfp4_to_nvfp4(tensors):
    """tensors: list of (packed [..., K/2], E8M0 scales [..., K/32]) sharing one tensor scale.

    Returns (list of (packed, block_scales), tensor_scale, report dict)."""
    n = len(tensors)
    srcs = [(np.ascontiguousarray(p, np.uint8), np.ascontiguousarray(s, np.uint8)) for p, s in tensors]
    outs = [(np.zeros_like(p), np.zeros(p.shape[:-1] + (p.shape[-1] // 8,), np.uint8)) for p, _ in srcs]
    arr = lambda vals, t: (t * n)(*vals)  # noqa: E731
    rows = arr([p.size // p.shape[-1] for p, _ in srcs], ctypes.c_int64)
    cols = arr([p.shape[-1] * 2 for p, _ in srcs], ctypes.c_int64)
    counts = (ctypes.c_int64 * 4)()
    errors = (ctypes.c_double * 2)()
    ts = ctypes.c_float()
    _call(_lib.fp4moe_transcode_mxfp4_to_nvfp4, ctypes.c_size_t(n),
          arr([_ptr(p) for p, _ in srcs], _P), arr([_ptr(s) for _, s in srcs], _P), rows, cols,
          arr([_ptr(p) for p, _ in outs], _P), arr([_ptr(s) for _, s in outs], _P),
          ctypes.byref(ts), counts, errors)
    report = dict(blocks_total=counts[0], blocks_lossless=counts[1], blocks_requantized=counts[2],
                  blocks_all_zero=counts[3], max_abs_error=errors[0], max_rel_error=errors[1])
    return outs, np.float32(ts.value), report


def linear(fmt: str, precision: str, packed: np.ndarray, scales: np.ndarray, x: np.ndarray,
           tensor_scale: float = 1.0, isa: str | None = None) -> np.ndarray:
    """y [m, n] = x [m, k] . W^T through the CPU kernels; W in checkpoint layout ("nvfp4":
    packed [n, k/2] + UE4M3 [n, k/16] + tensor_scale; "mxfp4": packed + E8M0 [n, k/32]).
    precision "w4a16" (exact) or "w4a8"; isa None = the best the host has."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    scales = np.ascontiguousarray(scales, dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = packed.shape[0], packed.shape[1] * 2
    m = x.shape[0]
    if x.shape != (m, k):
        raise Fp4moeError(f"x has shape {x.shape}, the weights want [m, {k}]")
    y = np.empty((m, n), np.float32)
    _call(_lib.fp4moe_linear, ctypes.c_char_p(fmt.encode()), ctypes.c_char_p(precision.encode()),
          ctypes.c_char_p(isa.encode()) if isa else None, _P(_ptr(packed)), _P(_ptr(scales)),
          ctypes.c_float(tensor_scale), ctypes.c_int64(n), ctypes.c_int64(k), _P(_ptr(x)),
          ctypes.c_int64(m), _P(_ptr(y)))
    return y
