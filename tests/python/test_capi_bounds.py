"""Bounds at the C ABI boundary (src/capi, tests/python/fp4moe_capi.py).

Two independent checks, each tested on its own:
- the binding: every entry point rejects a too-small (or wrongly shaped) array, a wrong dtype and a
  non-contiguous view before calling the library, with an error naming the argument;
- the C ABI: called directly through ctypes with sizes that bypass the binding, every function
  rejects a too-small or null buffer, per pointer argument, before it reads or writes it.
Every buffer is allocated at exactly its (short) size, so a missing C-side check is a
heap-buffer-overflow under ASan: scripts/test.d/capi_asan.sh runs this file against an ASan build
of libfp4moe.so (FP4MOE_EXPECT_ASAN=1 makes test_runs_under_asan_when_asked insist on it).
"""
from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import fp4moe_capi as fp4moe  # the C ABI, whichever binding conftest.py gives the other tests

F32, U8, U16 = np.float32, np.uint8, np.uint16
UNITS = {np.dtype(U8): "bytes", np.dtype(U16): "uint16s", np.dtype(F32): "floats",
         np.dtype(np.int64): "int64s", np.dtype(np.float64): "doubles"}
# Dtypes a caller may pass by mistake, per expected dtype: the sign-flipped storage of the same
# bytes (DeepSeek-V4 stores packed FP4 as I8) and a float of another width (the cast the binding
# used to make silently turned float32 scales into other codes).
WRONG_DTYPES = {np.dtype(U8): [np.int8, F32], np.dtype(U16): [np.int16, np.float16],
                np.dtype(F32): [np.float64, np.float16]}


def test_runs_under_asan_when_asked():
    """The ASan script sets FP4MOE_EXPECT_ASAN=1: then the sanitizer runtime must be loaded (it is
    preloaded, its symbols are global) and the library must come from FP4MOE_BUILD_DIR."""
    if os.environ.get("FP4MOE_EXPECT_ASAN") != "1":
        pytest.skip("not asked to run under ASan (FP4MOE_EXPECT_ASAN=1)")
    assert hasattr(ctypes.CDLL(None), "__asan_init"), "ASan runtime not loaded (LD_PRELOAD?)"
    loaded = Path(fp4moe._lib._name).resolve()
    assert loaded.parent == Path(os.environ["FP4MOE_BUILD_DIR"]).resolve(), loaded


# --------------------------------------------------------------------------------------------
# The binding's checks


def strided(a: np.ndarray) -> np.ndarray:
    """A non-contiguous view with a's shape and values (every other element of a wider array)."""
    assert a.ndim >= 1 and a.shape[-1] > 1, "a last dimension of 1 would still be contiguous"
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    return view


def short(dtype, needed: int) -> np.ndarray:
    """One element short, allocated at exactly that size."""
    return np.zeros(needed - 1, dtype)


def size_message(arg: str, got: int, dtype, needed: int) -> str:
    return (rf"^argument '{re.escape(arg)}': {got} {UNITS[np.dtype(dtype)]}, the shape "
            rf"\[[0-9, ]+\] needs {needed}$")


@dataclass
class Case:
    """One entry point: `call` takes the array arguments by name; `arrays` are valid ones."""
    call: Callable[..., object]
    arrays: dict[str, np.ndarray]
    # Per argument, a replacement of the wrong size or shape and the message it must give.
    bad_size: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)


def nvfp4_case() -> Case:
    packed, scales = np.zeros((4, 16), U8), np.full((4, 2), 0x38, U8)  # W [4, 32]
    return Case(lambda packed, scales: fp4moe.dequantize_nvfp4(packed, scales, 1.0),
                {"packed": packed, "scales": scales},
                {"packed": (np.array(7, U8), "argument 'packed': a 0-d array"),
                 "scales": (short(U8, 8), size_message("scales", 7, U8, 8))})


def mxfp4_case() -> Case:
    packed, scales = np.zeros((4, 32), U8), np.full((4, 2), 127, U8)  # W [4, 64]
    return Case(fp4moe.dequantize_mxfp4, {"packed": packed, "scales": scales},
                {"packed": (np.array(7, U8), "argument 'packed': a 0-d array"),
                 "scales": (short(U8, 8), size_message("scales", 7, U8, 8))})


def fp8_dequantize_case(ue8m0: bool) -> Case:
    q = np.zeros((3, 130), U8)  # scale grid 1 x 2
    scales = np.full((1, 2), 127, U8) if ue8m0 else np.ones((1, 2), F32)
    return Case(fp4moe.dequantize_fp8_block128, {"q": q, "scales": scales},
                {"q": (np.zeros(390, U8), r"argument 'q': shape \[390\], expected 2 dimensions"),
                 "scales": (short(scales.dtype, 2), size_message("scales", 1, scales.dtype, 2))})


def x_case(fn, x_shape, ndim_any: bool) -> Case:
    x = np.ones(x_shape, F32)
    bad = (np.array(1, F32), "argument 'x': a 0-d array") if ndim_any else (
        np.ones(x.size, F32), rf"argument 'x': shape \[{x.size}\], expected 2 dimensions")
    return Case(fn, {"x": x}, {"x": bad})


def transcode_case() -> Case:
    # Two tensors, the second one bad: the message must name which.
    first = (np.zeros((2, 32), U8), np.full((2, 2), 127, U8))

    def call(packed, scales):
        return fp4moe.transcode_mxfp4_to_nvfp4([first, (packed, scales)])
    return Case(call, {"packed": np.zeros((3, 32), U8), "scales": np.full((3, 2), 127, U8)},
                {"packed": (np.array(7, U8), r"argument 'tensors\[1\].packed': a 0-d array"),
                 "scales": (short(U8, 6), size_message("tensors[1].scales", 5, U8, 6))})


def linear_case(fmt: str) -> Case:
    m, n, k = 2, 8, 64
    if fmt == "fp8_block":
        k = 256  # a 1 x 2 scale grid
        packed, scales, scale_count = np.zeros((n, k), U8), np.ones((1, 2), F32), 2
    else:
        block = 16 if fmt == "nvfp4" else 32
        scale_count = n * k // block
        packed, scales = np.zeros((n, k // 2), U8), np.full((n, k // block), 0x38, U8)

    def call(packed, scales, x):
        return fp4moe.linear(fmt, "w4a16", packed, scales, x, isa="scalar")
    return Case(call, {"packed": packed, "scales": scales, "x": np.ones((m, k), F32)},
                {"packed": (packed.reshape(-1), r"argument 'packed': shape \[\d+\], expected 2"),
                 "scales": (short(scales.dtype, scale_count),
                            size_message("scales", scale_count - 1, scales.dtype, scale_count)),
                 "x": (np.ones((m, k - 1), F32), rf"argument 'x': shape \[2, {k - 1}\], the "
                                                 rf"weights \[8, {k}\] want \[m, {k}\]")})


CASES = {
    "encode": lambda: x_case(lambda x: fp4moe.encode("e2m1", x), (2, 8), True),
    "encode_bf16": lambda: x_case(lambda x: fp4moe.encode("bf16", x), (2, 8), True),
    "decode": lambda: Case(lambda codes: fp4moe.decode("e2m1", codes), {"codes": np.zeros(8, U8)},
                           {"codes": (np.array(1, U8), "argument 'codes': a 0-d array")}),
    "decode_bf16": lambda: Case(lambda codes: fp4moe.decode("bf16", codes),
                                {"codes": np.zeros(8, U16)},
                                {"codes": (np.array(1, U16), "argument 'codes': a 0-d array")}),
    "quantize_nvfp4": lambda: x_case(fp4moe.quantize_nvfp4, (4, 32), True),
    "dequantize_nvfp4": nvfp4_case,
    "quantize_mxfp4": lambda: x_case(fp4moe.quantize_mxfp4, (4, 64), True),
    "dequantize_mxfp4": mxfp4_case,
    "quantize_fp8_block128": lambda: x_case(fp4moe.quantize_fp8_block128, (3, 130), False),
    "quantize_fp8_block128_ue8m0": lambda: x_case(
        lambda x: fp4moe.quantize_fp8_block128(x, ue8m0=True), (3, 130), False),
    "dequantize_fp8_block128": lambda: fp8_dequantize_case(False),
    "dequantize_fp8_block128_ue8m0": lambda: fp8_dequantize_case(True),
    "transcode_mxfp4_to_nvfp4": transcode_case,
    "linear_nvfp4": lambda: linear_case("nvfp4"),
    "linear_mxfp4": lambda: linear_case("mxfp4"),
    "linear_fp8_block": lambda: linear_case("fp8_block"),
}


def case_args():
    return [(c, a) for c, make in CASES.items() for a in make().arrays]


def arg_name(case: str, arg: str) -> str:
    """The name the binding's message gives `arg` (transcode's bad tensor is the second one)."""
    return f"tensors[1].{arg}" if case.startswith("transcode") else arg


@pytest.mark.parametrize("case", CASES)
def test_valid_arguments_pass(case):
    c = CASES[case]()
    c.call(**c.arrays)


@pytest.mark.parametrize("case,arg", case_args())
def test_bad_size_or_shape_names_the_argument(case, arg):
    c = CASES[case]()
    bad, message = c.bad_size[arg]
    with pytest.raises(fp4moe.Fp4moeError, match=message):
        c.call(**{**c.arrays, arg: bad})


@pytest.mark.parametrize("case,arg", case_args())
def test_wrong_dtype_names_the_argument(case, arg):
    c = CASES[case]()
    good = c.arrays[arg]
    for dtype in WRONG_DTYPES[good.dtype]:
        if case.startswith("dequantize_fp8") and arg == "scales" and dtype in (U8, F32):
            continue  # the two scale dtypes pick the variant: both are right
        name = re.escape(arg_name(case, arg))
        with pytest.raises(fp4moe.Fp4moeTypeError, match=rf"^argument '{name}': dtype ") as info:
            c.call(**{**c.arrays, arg: good.astype(dtype)})
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(fp4moe.Fp4moeTypeError,
                       match=rf"^argument '{re.escape(arg_name(case, arg))}': expected a numpy"):
        c.call(**{**c.arrays, arg: good.tolist()})


def test_wrong_dtype_in_transcode_names_the_tensor():
    good = (np.zeros((2, 32), U8), np.full((2, 2), 127, U8))
    for i, bad in ((0, (good[0].astype(np.int8), good[1])), (1, (good[0], good[1].astype(F32)))):
        tensors = [good, good]
        tensors[i] = bad
        what = "packed" if i == 0 else "scales"
        with pytest.raises(fp4moe.Fp4moeTypeError, match=rf"^argument 'tensors\[{i}\].{what}'"):
            fp4moe.transcode_mxfp4_to_nvfp4(tensors)


def test_fp8_dequantize_scales_of_another_dtype_is_an_error():
    with pytest.raises(fp4moe.Fp4moeTypeError, match=r"argument 'scales': dtype float64, "
                                                     r"expected float32 .* or uint8"):
        fp4moe.dequantize_fp8_block128(np.zeros((3, 130), U8), np.ones((1, 2)))


@pytest.mark.parametrize("case,arg", case_args())
def test_non_contiguous_names_the_argument(case, arg):
    c = CASES[case]()
    with pytest.raises(fp4moe.Fp4moeError,
                       match=rf"^argument '{re.escape(arg_name(case, arg))}': not C-contiguous"):
        c.call(**{**c.arrays, arg: strided(c.arrays[arg])})


def test_misaligned_view_names_the_argument():
    raw = np.zeros(4 * 128 + 1, U8)
    x = raw[1:].view(F32).reshape(4, 32)  # float32 elements at an odd address
    assert not x.flags.aligned
    with pytest.raises(fp4moe.Fp4moeError, match="^argument 'x': not aligned"):
        fp4moe.quantize_nvfp4(x)


def test_the_issue_example_is_rejected():
    # dequantize_nvfp4(packed[4, 16], scales=buf[:1]) used to read 7 bytes past a 1-byte array.
    buf = np.zeros(1, U8)
    with pytest.raises(fp4moe.Fp4moeError,
                       match=r"^argument 'scales': 1 bytes, the shape \[4, 32\] needs 8$"):
        fp4moe.dequantize_nvfp4(np.zeros((4, 16), U8), buf[:1], 1.0)


def test_unknown_names_are_the_librarys_errors():
    with pytest.raises(fp4moe.Fp4moeError, match="unknown kind 'e9m9'"):
        fp4moe.encode("e9m9", np.ones(4, F32))
    with pytest.raises(fp4moe.Fp4moeError, match="unknown kind 'e9m9'"):
        fp4moe.decode("e9m9", np.ones(4, U8))
    with pytest.raises(fp4moe.Fp4moeError, match="argument 'rule'"):
        fp4moe.quantize_mxfp4(np.ones((1, 32), F32), "nearest")


# --------------------------------------------------------------------------------------------
# The C ABI's own checks, through ctypes (the binding's checks bypassed)

LIB = fp4moe._lib


class Buffers:
    """Buffers for one C call, each allocated at exactly the size passed with it: `short` gets one
    element fewer (and that smaller size), `null` a NULL pointer with the full size."""

    def __init__(self, specs: dict[str, tuple[type, int]], short: str | None = None,
                 null: str | None = None):
        self.specs = specs
        self.arrays, self.sizes = {}, {}
        for name, (dtype, needed) in specs.items():
            size = needed - 1 if name == short else needed
            self.arrays[name] = None if name == null else np.zeros(size, dtype)
            self.sizes[name] = size

    def ptr(self, name: str):
        a = self.arrays[name]
        return None if a is None else a.ctypes.data

    def __call__(self, name: str):
        """(pointer, size) for a buffer argument and its size argument."""
        return self.ptr(name), self.sizes[name]


def err():
    buf = ctypes.create_string_buffer(512)
    return buf, (buf, len(buf))


def run(call, b: Buffers):
    buf, e = err()
    return call(b, e), buf.value.decode()


@dataclass
class CCase:
    specs: dict[str, tuple[type, int]]  # every pointer argument with a size: dtype, needed
    call: Callable  # (Buffers, (error, error_size)) -> return code
    nullable_only: tuple[str, ...] = ()  # pointer arguments without a size (one element)


def codec_case(fn, kind: bytes, code_dtype):
    def call(b, e):
        if fn == "encode":
            return LIB.fp4moe_encode(kind, *b("x"), *b("codes"), 8, *e)
        return LIB.fp4moe_decode(kind, *b("codes"), *b("x"), 8, *e)
    return CCase({"x": (F32, 8), "codes": (code_dtype, 8)}, call)


def quantize_nvfp4_call(b, e):
    return LIB.fp4moe_quantize_nvfp4(*b("x"), 4, 32, float("nan"), *b("packed"),
                                     *b("block_scales"), b.ptr("tensor_scale_out"), *e)


def transcode_call(b, e):
    n = 2
    ptrs = lambda name: (ctypes.c_void_p * n)(*[b.ptr(f"{name}[{i}]") for i in range(n)])  # noqa
    sizes = lambda name: (ctypes.c_size_t * n)(*[b.sizes[f"{name}[{i}]"] for i in range(n)])  # noqa
    counts, errors = b.arrays["counts_out"], b.arrays["errors_out"]
    return LIB.fp4moe_transcode_mxfp4_to_nvfp4(
        n, ptrs("packed"), sizes("packed"), ptrs("scales"), sizes("scales"),
        (ctypes.c_int64 * n)(2, 3), (ctypes.c_int64 * n)(64, 32), ptrs("out_packed"),
        sizes("out_packed"), ptrs("out_block_scales"), sizes("out_block_scales"),
        b.ptr("tensor_scale_out"),
        None if counts is None else counts.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
        b.sizes["counts_out"],
        None if errors is None else errors.ctypes.data_as(ctypes.POINTER(ctypes.c_double)),
        b.sizes["errors_out"], *e)


def transcode_specs():
    """Two tensors [2, 64] and [3, 32] (the shapes transcode_call passes), and the report."""
    specs = {}
    for i, (rows, cols) in enumerate([(2, 64), (3, 32)]):
        elements = rows * cols
        specs.update({f"packed[{i}]": (U8, elements // 2), f"scales[{i}]": (U8, elements // 32),
                      f"out_packed[{i}]": (U8, elements // 2),
                      f"out_block_scales[{i}]": (U8, elements // 16)})
    return {**specs, "counts_out": (np.int64, 4), "errors_out": (np.float64, 2),
            "tensor_scale_out": (F32, 1)}


def linear_ccase(fmt: bytes, precision: bytes = b"w4a16"):
    m, n, k = 2, 130, 64  # FP8: a 2 x 1 scale grid
    if fmt == b"fp8_block":
        weights = {"packed": (U8, n * k), "scales": (F32, 2)}
    else:
        block = 16 if fmt == b"nvfp4" else 32
        weights = {"packed": (U8, n * k // 2), "scales": (U8, n * k // block)}

    def call(b, e):
        return LIB.fp4moe_linear(fmt, precision, b"scalar", *b("packed"), *b("scales"), 1.0, n, k,
                                 *b("x"), m, *b("y"), *e)
    return CCase({**weights, "x": (F32, m * k), "y": (F32, m * n)}, call)


C_CASES = {
    "encode_e2m1": codec_case("encode", b"e2m1", U8),
    "encode_bf16": codec_case("encode", b"bf16", U16),
    "decode_e2m1": codec_case("decode", b"e2m1", U8),
    "decode_fp16": codec_case("decode", b"fp16", U16),
    "quantize_nvfp4": CCase({"x": (F32, 128), "packed": (U8, 64), "block_scales": (U8, 8),
                             "tensor_scale_out": (F32, 1)}, quantize_nvfp4_call,
                            nullable_only=("tensor_scale_out",)),
    "dequantize_nvfp4": CCase(
        {"packed": (U8, 64), "block_scales": (U8, 8), "out": (F32, 128)},
        lambda b, e: LIB.fp4moe_dequantize_nvfp4(*b("packed"), *b("block_scales"), 1.0, 4, 32,
                                                 *b("out"), *e)),
    "quantize_mxfp4": CCase(
        {"x": (F32, 256), "packed": (U8, 128), "scales": (U8, 8)},
        lambda b, e: LIB.fp4moe_quantize_mxfp4(*b("x"), 4, 64, 0, *b("packed"), *b("scales"), *e)),
    "dequantize_mxfp4": CCase(
        {"packed": (U8, 128), "scales": (U8, 8), "out": (F32, 256)},
        lambda b, e: LIB.fp4moe_dequantize_mxfp4(*b("packed"), *b("scales"), 4, 64, *b("out"),
                                                 *e)),
    "quantize_fp8_block128": CCase(
        {"x": (F32, 390), "q": (U8, 390), "scales": (F32, 2)},
        lambda b, e: LIB.fp4moe_quantize_fp8_block128(*b("x"), 3, 130, 0, *b("q"), *b("scales"),
                                                      *e)),
    "quantize_fp8_block128_ue8m0": CCase(
        {"x": (F32, 390), "q": (U8, 390), "scales": (U8, 2)},
        lambda b, e: LIB.fp4moe_quantize_fp8_block128(*b("x"), 3, 130, 1, *b("q"), *b("scales"),
                                                      *e)),
    "dequantize_fp8_block128": CCase(
        {"q": (U8, 390), "scales": (F32, 2), "out": (F32, 390)},
        lambda b, e: LIB.fp4moe_dequantize_fp8_block128(*b("q"), *b("scales"), 3, 130, 0,
                                                        *b("out"), *e)),
    "dequantize_fp8_block128_ue8m0": CCase(
        {"q": (U8, 390), "scales": (U8, 2), "out": (F32, 390)},
        lambda b, e: LIB.fp4moe_dequantize_fp8_block128(*b("q"), *b("scales"), 3, 130, 1,
                                                        *b("out"), *e)),
    "transcode_mxfp4_to_nvfp4": CCase(transcode_specs(), transcode_call,
                                      nullable_only=("tensor_scale_out",)),
    "linear_nvfp4": linear_ccase(b"nvfp4"),
    "linear_mxfp4": linear_ccase(b"mxfp4"),
    "linear_mxfp4_w4a8": linear_ccase(b"mxfp4", b"w4a8"),
    "linear_fp8_block": linear_ccase(b"fp8_block"),
}


def c_args(sized_only: bool):
    return [(c, a) for c, case in C_CASES.items() for a in case.specs
            if not (sized_only and a in case.nullable_only)]


@pytest.mark.parametrize("case", C_CASES)
def test_c_exact_sizes_pass(case):
    c = C_CASES[case]
    rc, message = run(c.call, Buffers(c.specs))
    assert rc == 0, message


@pytest.mark.parametrize("case,arg", c_args(sized_only=True))
def test_c_too_small_buffer_is_an_error_naming_it(case, arg):
    c = C_CASES[case]
    dtype, needed = c.specs[arg]
    rc, message = run(c.call, Buffers(c.specs, short=arg))
    assert rc == 1
    needer = r"the report" if arg in ("counts_out", "errors_out") else r"the shape \[[0-9, ]+\]"
    assert re.fullmatch(rf"argument '{re.escape(arg)}': {needed - 1} "
                        rf"{UNITS[np.dtype(dtype)]}, {needer} needs {needed}", message), message


@pytest.mark.parametrize("case,arg", c_args(sized_only=False))
def test_c_null_buffer_is_an_error_naming_it(case, arg):
    c = C_CASES[case]
    rc, message = run(c.call, Buffers(c.specs, null=arg))
    assert rc == 1
    assert message.startswith(f"argument '{arg}' is null"), message


def test_c_null_arrays_of_transcode_are_errors():
    # One empty tensor [0, 32]: its buffers may be NULL (nothing is needed), its arrays may not.
    arrays = {"packed": (ctypes.c_void_p * 1)(), "packed_sizes": (ctypes.c_size_t * 1)(0),
              "scales": (ctypes.c_void_p * 1)(), "scales_sizes": (ctypes.c_size_t * 1)(0),
              "rows": (ctypes.c_int64 * 1)(0), "cols": (ctypes.c_int64 * 1)(32),
              "out_packed": (ctypes.c_void_p * 1)(), "out_packed_sizes": (ctypes.c_size_t * 1)(0),
              "out_block_scales": (ctypes.c_void_p * 1)(),
              "out_block_scales_sizes": (ctypes.c_size_t * 1)(0)}
    counts, errors, ts = (ctypes.c_int64 * 4)(), (ctypes.c_double * 2)(), ctypes.c_float()

    def call(args):
        buf, e = err()
        rc = LIB.fp4moe_transcode_mxfp4_to_nvfp4(1, *args.values(), ctypes.addressof(ts), counts,
                                                 4, errors, 2, *e)
        return rc, buf.value.decode()

    assert call(arrays) == (0, "")
    for name in arrays:
        rc, message = call({**arrays, name: None})
        assert rc == 1 and message == f"argument '{name}' is null, count 1 needs 1 entries"


def test_c_overflowing_shapes_are_errors_before_any_access():
    buf, e = err()
    huge = 2**62
    assert LIB.fp4moe_quantize_nvfp4(None, 2**64 - 1, huge, 64, 1.0, None, 2**64 - 1, None,
                                     2**64 - 1, None, *e) == 1
    assert re.fullmatch(rf"the shape \[{huge}, 64\] has more elements than fit int64_t",
                        buf.value.decode()), buf.value
    assert LIB.fp4moe_dequantize_fp8_block128(None, 0, None, 0, huge, huge, 0, None, 0, *e) == 1
    assert b"has more elements than fit int64_t" in buf.value
    assert LIB.fp4moe_linear(b"mxfp4", b"w4a16", None, None, 0, None, 0, 1.0, huge, 64, None, 0,
                             1, None, 0, *e) == 1
    assert b"has more elements than fit int64_t" in buf.value


def test_c_unknown_kind_is_an_error_with_a_message():
    x, codes = np.zeros(4, F32), np.zeros(4, U8)
    for fn in (LIB.fp4moe_encode, LIB.fp4moe_decode):
        buf, e = err()
        # n = 0: nothing to convert, the kind is still checked.
        assert fn(b"e9m9", x.ctypes.data, 4, codes.ctypes.data, 4, 0, *e) == 1
        assert buf.value.startswith(b"unknown kind 'e9m9'")
        assert fn(None, x.ctypes.data, 4, codes.ctypes.data, 4, 4, *e) == 1
        assert buf.value == b"argument 'kind' is null"


def test_abi_version_of_header_binding_and_library_agree():
    header = (Path(__file__).resolve().parents[2] / "src" / "capi" / "fp4moe_c.h").read_text()
    declared = int(re.search(r"#define FP4MOE_C_ABI_VERSION (\d+)", header).group(1))
    assert declared == fp4moe._ABI_VERSION == LIB.fp4moe_abi_version()


def test_c_error_buffer_is_optional_and_truncated():
    x = np.zeros(4, F32)
    assert LIB.fp4moe_encode(b"e9m9", x.ctypes.data, 4, x.ctypes.data, 4, 4, None, 0) == 1
    small = ctypes.create_string_buffer(8)
    assert LIB.fp4moe_encode(b"e9m9", x.ctypes.data, 4, x.ctypes.data, 4, 4, small, 8) == 1
    assert small.value == b"unknown"  # 7 characters and the NUL
