"""The tests' ctypes binding of the C ABI (libfp4moe.so, src/capi): test_capi_bounds.py and the
ASan run of the oracle tests (scripts/test.d/capi_asan.sh) call the C ABI through it. Users get
the `fp4moe` Python module (src/python, pip install) instead; the oracle tests run on both, with
the same functions (conftest.py picks one).

The library is looked up in $FP4MOE_BUILD_DIR, then build/release. Every function takes and
returns numpy arrays. Array arguments are checked before the library is called and never cast or
copied: each must be a numpy array of exactly the dtype named in its docstring, C-contiguous and
aligned, of the size its shape needs. A bad argument raises Fp4moeError (Fp4moeTypeError for a
wrong type or dtype) naming it; the sizes are passed on to the C ABI, which checks them again.
Bad values (NaN, shapes a format rejects) raise Fp4moeError with the library's message.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

__all__ = [
    "Fp4moeError", "Fp4moeTypeError", "encode", "decode", "quantize_nvfp4", "dequantize_nvfp4",
    "quantize_mxfp4", "dequantize_mxfp4", "quantize_fp8_block128", "dequantize_fp8_block128",
    "transcode_mxfp4_to_nvfp4", "linear",
]


class Fp4moeError(ValueError):
    """Bad input: an argument the binding rejects or an error the library reports (the message
    names the argument or tensor and the reason)."""


class Fp4moeTypeError(Fp4moeError, TypeError):
    """An argument of the wrong type or dtype (a cast would turn codes into other codes)."""


# FP4MOE_C_ABI_VERSION of the signatures below (src/capi/fp4moe_c.h).
_ABI_VERSION = 2


def _load() -> ctypes.CDLL:
    root = Path(__file__).resolve().parents[2]
    build = Path(os.environ.get("FP4MOE_BUILD_DIR", root / "build" / "release"))
    lib = ctypes.CDLL(str(build / "libfp4moe.so"))
    # A library built before the sizes joined the ABI would be called with the wrong arguments.
    version = lib.fp4moe_abi_version() if hasattr(lib, "fp4moe_abi_version") else 1
    if version != _ABI_VERSION:
        raise ImportError(f"{build / 'libfp4moe.so'} has C ABI version {version}, this binding "
                          f"needs {_ABI_VERSION}: rebuild it (cmake --build ... --target fp4moe_c)")
    return lib


_lib = _load()
_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_S = ctypes.c_size_t
_I64 = ctypes.c_int64
_F = ctypes.c_float
_STR = ctypes.c_char_p
_ERR = (ctypes.c_char_p, _S)
_ERR_SIZE = 1024

# The C signatures (fp4moe_c.h), so ctypes converts and counts every argument.
_SIGNATURES = {
    "fp4moe_encode": (_STR, _P, _S, _P, _S, _S, *_ERR),
    "fp4moe_decode": (_STR, _P, _S, _P, _S, _S, *_ERR),
    "fp4moe_quantize_nvfp4": (_P, _S, _I64, _I64, _F, _P, _S, _P, _S, _P, *_ERR),
    "fp4moe_dequantize_nvfp4": (_P, _S, _P, _S, _F, _I64, _I64, _P, _S, *_ERR),
    "fp4moe_quantize_mxfp4": (_P, _S, _I64, _I64, ctypes.c_int, _P, _S, _P, _S, *_ERR),
    "fp4moe_dequantize_mxfp4": (_P, _S, _P, _S, _I64, _I64, _P, _S, *_ERR),
    "fp4moe_quantize_fp8_block128": (_P, _S, _I64, _I64, ctypes.c_int, _P, _S, _P, _S, *_ERR),
    "fp4moe_dequantize_fp8_block128": (_P, _S, _P, _S, _I64, _I64, ctypes.c_int, _P, _S, *_ERR),
    "fp4moe_transcode_mxfp4_to_nvfp4": (
        _S, _PP, ctypes.POINTER(_S), _PP, ctypes.POINTER(_S), ctypes.POINTER(_I64),
        ctypes.POINTER(_I64), _PP, ctypes.POINTER(_S), _PP, ctypes.POINTER(_S), _P,
        ctypes.POINTER(_I64), _S, ctypes.POINTER(ctypes.c_double), _S, *_ERR),
    "fp4moe_linear": (_STR, _STR, _STR, _P, _S, _P, _S, _F, _I64, _I64, _P, _S, _I64, _P, _S,
                      *_ERR),
}
for _name, _args in _SIGNATURES.items():
    getattr(_lib, _name).argtypes = list(_args)
    getattr(_lib, _name).restype = ctypes.c_int

_UNITS = {np.dtype(np.uint8): "bytes", np.dtype(np.uint16): "uint16s",
          np.dtype(np.float32): "floats"}


def _array(name: str, a, dtype, ndim: int | None = None) -> np.ndarray:
    """`a` as the C ABI will read it, or an error naming the argument. Never a cast (float32
    scales cast to uint8 are other codes) nor a copy (it would hide a caller's strided view)."""
    dtype = np.dtype(dtype)
    if not isinstance(a, np.ndarray):
        raise Fp4moeTypeError(f"argument '{name}': expected a numpy array of {dtype}, "
                              f"got {type(a).__name__}")
    if a.dtype != dtype:
        raise Fp4moeTypeError(f"argument '{name}': dtype {a.dtype}, expected {dtype}")
    if ndim is not None and a.ndim != ndim:
        raise Fp4moeError(f"argument '{name}': shape {list(a.shape)}, expected {ndim} dimensions")
    if ndim is None and a.ndim < 1:
        raise Fp4moeError(f"argument '{name}': a 0-d array, expected at least 1 dimension")
    if not a.flags.c_contiguous:
        raise Fp4moeError(f"argument '{name}': not C-contiguous (shape {list(a.shape)}, strides "
                          f"{list(a.strides)}); pass np.ascontiguousarray({name})")
    if not a.flags.aligned:
        raise Fp4moeError(f"argument '{name}': not aligned to its {dtype} elements")
    return a


def _check_size(name: str, a: np.ndarray, needed: int, shape) -> None:
    """The size the shape needs, exactly (a larger buffer is a shape mismatch at this level)."""
    if a.size != needed:
        raise Fp4moeError(f"argument '{name}': {a.size} {_UNITS[a.dtype]}, the shape "
                          f"{list(shape)} needs {needed}")


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _call(fn, *args) -> None:
    err = ctypes.create_string_buffer(_ERR_SIZE)
    if fn(*args, err, _ERR_SIZE) != 0:
        raise Fp4moeError(err.value.decode())


_CODE_DTYPES = {"e2m1": np.uint8, "e4m3": np.uint8, "ue4m3": np.uint8, "e8m0": np.uint8,
                "bf16": np.uint16, "fp16": np.uint16}


def encode(kind: str, x: np.ndarray) -> np.ndarray:
    """float32 x (any shape) -> codes of the same shape: uint8, or uint16 for bf16 / fp16."""
    x = _array("x", x, np.float32)
    out = np.empty(x.shape, dtype=_CODE_DTYPES.get(kind, np.uint8))
    _call(_lib.fp4moe_encode, kind.encode(), _ptr(x), x.size, _ptr(out), out.size, x.size)
    return out


def decode(kind: str, codes: np.ndarray) -> np.ndarray:
    """codes (uint8, or uint16 for bf16 / fp16; any shape) -> float32 of the same shape."""
    dtype = _CODE_DTYPES.get(kind)
    if dtype is not None:
        codes = _array("codes", codes, dtype)
    else:  # the library names the unknown kind before it reads anything
        codes = np.zeros(0, np.uint8)
    out = np.empty(codes.shape, dtype=np.float32)
    _call(_lib.fp4moe_decode, kind.encode(), _ptr(codes), codes.size, _ptr(out), out.size,
          codes.size)
    return out


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor [..., cols] as [rows, cols]: rows is the product of the outer dimensions."""
    return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]


def _fp4_scales(name: str, scales: np.ndarray, rows: int, cols: int, block: int) -> np.ndarray:
    scales = _array(name, scales, np.uint8)
    if cols % block == 0:  # otherwise the library reports the shape
        _check_size(name, scales, rows * (cols // block), (rows, cols))
    return scales


def quantize_nvfp4(x: np.ndarray, tensor_scale: float | None = None):
    """float32 x [..., K] -> (packed uint8 [..., K/2], block scales uint8 [..., K/16], tensor
    scale float32)."""
    x = _array("x", x, np.float32)
    rows, cols = _rows_cols(x.shape)
    packed = np.zeros(x.shape[:-1] + (cols // 2,), np.uint8)
    scales = np.zeros(x.shape[:-1] + (cols // 16,), np.uint8)
    ts_out = _F()
    ts_in = float("nan") if tensor_scale is None else float(tensor_scale)
    _call(_lib.fp4moe_quantize_nvfp4, _ptr(x), x.size, rows, cols, ts_in, _ptr(packed),
          packed.size, _ptr(scales), scales.size, ctypes.addressof(ts_out))
    return packed, scales, np.float32(ts_out.value)


def dequantize_nvfp4(packed: np.ndarray, scales: np.ndarray, tensor_scale: float) -> np.ndarray:
    """packed uint8 [..., K/2], UE4M3 scales uint8 (rows * K/16 of them, any shape) -> float32
    [..., K]."""
    packed = _array("packed", packed, np.uint8)
    rows, cols = _rows_cols(packed.shape[:-1] + (packed.shape[-1] * 2,))
    scales = _fp4_scales("scales", scales, rows, cols, 16)
    out = np.empty(packed.shape[:-1] + (cols,), np.float32)
    _call(_lib.fp4moe_dequantize_nvfp4, _ptr(packed), packed.size, _ptr(scales), scales.size,
          float(tensor_scale), rows, cols, _ptr(out), out.size)
    return out


def quantize_mxfp4(x: np.ndarray, rule: str = "ocp_floor"):
    """float32 x [..., K] -> (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32])."""
    x = _array("x", x, np.float32)
    rows, cols = _rows_cols(x.shape)
    rule_id = {"ocp_floor": 0, "round_up": 1}.get(rule)
    if rule_id is None:
        raise Fp4moeError(f"argument 'rule': '{rule}', expected 'ocp_floor' or 'round_up'")
    packed = np.zeros(x.shape[:-1] + (cols // 2,), np.uint8)
    scales = np.zeros(x.shape[:-1] + (cols // 32,), np.uint8)
    _call(_lib.fp4moe_quantize_mxfp4, _ptr(x), x.size, rows, cols, rule_id, _ptr(packed),
          packed.size, _ptr(scales), scales.size)
    return packed, scales


def dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """packed uint8 [..., K/2], E8M0 scales uint8 (rows * K/32 of them, any shape) -> float32
    [..., K]."""
    packed = _array("packed", packed, np.uint8)
    rows, cols = _rows_cols(packed.shape[:-1] + (packed.shape[-1] * 2,))
    scales = _fp4_scales("scales", scales, rows, cols, 32)
    out = np.empty(packed.shape[:-1] + (cols,), np.float32)
    _call(_lib.fp4moe_dequantize_mxfp4, _ptr(packed), packed.size, _ptr(scales), scales.size,
          rows, cols, _ptr(out), out.size)
    return out


def _fp8_grid(rows: int, cols: int) -> tuple[int, int]:
    return (rows + 127) // 128, (cols + 127) // 128


def quantize_fp8_block128(x: np.ndarray, ue8m0: bool = False):
    """2-D float32 x [N, K] -> (E4M3 codes uint8 [N, K], scales [ceil(N/128), ceil(K/128)]:
    float32, or E8M0 uint8 when ue8m0)."""
    x = _array("x", x, np.float32, ndim=2)
    rows, cols = x.shape
    q = np.zeros(x.shape, np.uint8)
    scales = np.zeros(_fp8_grid(rows, cols), np.uint8 if ue8m0 else np.float32)
    _call(_lib.fp4moe_quantize_fp8_block128, _ptr(x), x.size, rows, cols, int(ue8m0), _ptr(q),
          q.size, _ptr(scales), scales.size)
    return q, scales


def dequantize_fp8_block128(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """E4M3 codes uint8 [N, K] and scales [ceil(N/128), ceil(K/128)] (any shape of that size):
    float32 multipliers, or uint8 E8M0 codes (the dtype picks the variant) -> float32 [N, K]."""
    q = _array("q", q, np.uint8, ndim=2)
    dtype = scales.dtype if isinstance(scales, np.ndarray) else np.float32
    if dtype not in (np.uint8, np.float32):
        raise Fp4moeTypeError(f"argument 'scales': dtype {dtype}, expected float32 (F32 "
                              f"multipliers) or uint8 (E8M0 codes)")
    ue8m0 = dtype == np.uint8
    scales = _array("scales", scales, dtype)
    rows, cols = q.shape
    if rows > 0 and cols > 0:  # otherwise the library reports the shape
        _check_size("scales", scales, int(np.prod(_fp8_grid(rows, cols))), q.shape)
    out = np.empty(q.shape, np.float32)
    _call(_lib.fp4moe_dequantize_fp8_block128, _ptr(q), q.size, _ptr(scales), scales.size, rows,
          cols, int(ue8m0), _ptr(out), out.size)
    return out


def transcode_mxfp4_to_nvfp4(tensors):
    """tensors: list of (packed uint8 [..., K/2], E8M0 scales uint8, rows * K/32 of them) sharing
    one tensor scale.

    Returns (list of (packed, block_scales), tensor_scale, report dict)."""
    srcs = []
    for i, (p, s) in enumerate(tensors):
        p = _array(f"tensors[{i}].packed", p, np.uint8)
        rows, cols = _rows_cols(p.shape[:-1] + (p.shape[-1] * 2,))
        srcs.append((p, _fp4_scales(f"tensors[{i}].scales", s, rows, cols, 32), rows, cols))
    n = len(srcs)
    outs = [(np.zeros_like(p), np.zeros(p.shape[:-1] + (p.shape[-1] // 8,), np.uint8))
            for p, _, _, _ in srcs]
    arr = lambda vals, t: (t * n)(*vals)  # noqa: E731
    counts = (_I64 * 4)()
    errors = (ctypes.c_double * 2)()
    ts = _F()
    _call(_lib.fp4moe_transcode_mxfp4_to_nvfp4, n,
          arr([_ptr(p) for p, _, _, _ in srcs], _P), arr([p.size for p, _, _, _ in srcs], _S),
          arr([_ptr(s) for _, s, _, _ in srcs], _P), arr([s.size for _, s, _, _ in srcs], _S),
          arr([r for _, _, r, _ in srcs], _I64), arr([c for _, _, _, c in srcs], _I64),
          arr([_ptr(p) for p, _ in outs], _P), arr([p.size for p, _ in outs], _S),
          arr([_ptr(s) for _, s in outs], _P), arr([s.size for _, s in outs], _S),
          ctypes.addressof(ts), counts, len(counts), errors, len(errors))
    report = dict(blocks_total=counts[0], blocks_lossless=counts[1], blocks_requantized=counts[2],
                  blocks_all_zero=counts[3], max_abs_error=errors[0], max_rel_error=errors[1])
    return outs, np.float32(ts.value), report


# Per weight format: K elements per byte of a packed row, the scales' dtype, K per scale (FP8
# block: a 128x128 grid, any K).
_LINEAR_FORMATS = {"nvfp4": (2, np.uint8, 16), "mxfp4": (2, np.uint8, 32),
                   "fp8_block": (1, np.float32, None)}


def linear(fmt: str, precision: str, packed: np.ndarray, scales: np.ndarray, x: np.ndarray,
           tensor_scale: float = 1.0, isa: str | None = None) -> np.ndarray:
    """y [m, n] = x [m, k] . W^T through the CPU kernels; W in checkpoint layout ("nvfp4":
    packed uint8 [n, k/2] + UE4M3 uint8 [n, k/16] + tensor_scale; "mxfp4": packed + E8M0 uint8
    [n, k/32]; "fp8_block": E4M3 codes uint8 [n, k] + float32 scales [ceil(n/128),
    ceil(k/128)]; scales may have any shape of that size). x: float32 [m, k]. precision "w4a16"
    (exact) or "w4a8" (FP4 formats only); isa None = the best the host has."""
    packed = _array("packed", packed, np.uint8, ndim=2)
    if fmt in _LINEAR_FORMATS:
        k_per_byte, scale_dtype, block = _LINEAR_FORMATS[fmt]
        n, k = packed.shape[0], packed.shape[1] * k_per_byte
        scales = _array("scales", scales, scale_dtype)
        if block is None:
            _check_size("scales", scales, int(np.prod(_fp8_grid(n, k))), (n, k))
        elif k % block == 0:  # otherwise the library reports K
            _check_size("scales", scales, n * (k // block), (n, k))
    else:  # the library names the unknown format before it reads any buffer
        n, k = packed.shape[0], packed.shape[1] * 2
        scales = np.zeros(0, np.uint8)
    x = _array("x", x, np.float32, ndim=2)
    m = x.shape[0]
    if x.shape[1] != k:
        raise Fp4moeError(f"argument 'x': shape {list(x.shape)}, the weights [{n}, {k}] want "
                          f"[m, {k}]")
    y = np.empty((m, n), np.float32)
    _call(_lib.fp4moe_linear, fmt.encode(), precision.encode(), isa.encode() if isa else None,
          _ptr(packed), packed.size, _ptr(scales), scales.size, float(tensor_scale), n, k, _ptr(x),
          x.size, m, _ptr(y), y.size)
    return y
