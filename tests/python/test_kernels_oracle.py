"""The CPU GEMM kernels (exact W4A16 for NVFP4, MXFP4 and FP8 block-128, and the W4A8 family)
through fp4moe.linear, against numpy oracles written from the spec: weights decoded with ml_dtypes
from checkpoint-layout codes, the W4A8 activation quantization (kernels/types.h) written out again
in numpy."""
import ml_dtypes
import numpy as np
import pytest

import fp4moe

F32 = np.float32
BLOCK = {"nvfp4": 16, "mxfp4": 32}


def random_weights(rng, fmt, n, k):
    """Random checkpoint-layout codes: every nibble, scales without NaN; and W in float64."""
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, k)
    e2m1 = nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    block = BLOCK[fmt]
    if fmt == "nvfp4":
        scales = rng.integers(0x08, 0x7F, size=(n, k // block), dtype=np.uint8)  # UE4M3, no NaN
        scale_values = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        tensor_scale = float(F32(rng.uniform(0.01, 2.0)))
        # ModelOpt's order: e2m1 * (s * tensor_scale), the product in float32.
        per_block = (scale_values.astype(F32) * F32(tensor_scale)).astype(np.float64)
    else:
        scales = rng.integers(110, 140, size=(n, k // block), dtype=np.uint8)  # E8M0
        per_block = scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
        tensor_scale = 1.0
    w = e2m1 * np.repeat(per_block, block, axis=1)
    return packed, scales, tensor_scale, w


def quantize_activations(x, block):
    """The W4A8 rule: per block, scale = amax / 127 and q = round-half-even(x * (127 / amax)),
    all in float32 (tiny blocks pre-scaled by 2^64, never hit by these inputs)."""
    m, k = x.shape
    xb = x.reshape(m, k // block, block).astype(F32)
    amax = np.abs(xb).max(axis=-1)
    assert (amax > F32(2.0**-64)).all()
    inv = (F32(127.0) / amax).astype(F32)
    q = np.rint((xb * inv[..., None]).astype(F32)).astype(np.int32)
    scale = (amax / F32(127.0)).astype(F32)
    return q, scale


SHAPES = [(1, 9, 256), (3, 64, 64), (8, 17, 512), (17, 40, 96)]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_exact_kernels_match_float64(rng, fmt, m, n, k):
    packed, scales, ts, w = random_weights(rng, fmt, n, k)
    x = rng.standard_normal((m, k)).astype(F32)
    want = x.astype(np.float64) @ w.T
    abs_sum = np.abs(x.astype(np.float64)) @ np.abs(w).T
    for isa in (None, "scalar"):
        got = fp4moe.linear(fmt, "w4a16", packed, scales, x, ts, isa=isa)
        # Any FP32 summation order of k products: (k + 4) * 2^-24 of the abs-sum.
        np.testing.assert_array_less(np.abs(got - want), (k + 4) * 2.0**-24 * abs_sum + 1e-30)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_w4a8_kernels_match_the_numpy_w4a8_rule(rng, fmt, m, n, k):
    packed, scales, ts, w = random_weights(rng, fmt, n, k)
    block = BLOCK[fmt]
    x = rng.standard_normal((m, k)).astype(F32)
    x[0, :block] *= 1e4  # one outlier block
    q, s = quantize_activations(x, block)
    x_hat = (q * s[..., None].astype(np.float64)).reshape(m, k)
    want_hat = x_hat @ w.T
    abs_hat = np.abs(x_hat) @ np.abs(w).T
    exact = x.astype(np.float64) @ w.T
    # The stated W4A8 bound against the exact product: sum over blocks of (amax / 254) * sum |w|.
    amax = np.abs(x.reshape(m, k // block, block)).max(axis=-1).astype(np.float64)
    wsum = np.abs(w).reshape(n, k // block, block).sum(axis=-1)
    bound = (amax / 254.0) @ wsum.T
    best = fp4moe.linear(fmt, "w4a8", packed, scales, x, ts)
    scalar = fp4moe.linear(fmt, "w4a8", packed, scales, x, ts, isa="scalar")
    np.testing.assert_array_equal(best, scalar)  # every ISA gives the scalar kernel's bits
    blocks = k // block
    np.testing.assert_array_less(np.abs(best - want_hat), (blocks + 4) * 2.0**-24 * abs_hat + 1e-30)
    np.testing.assert_array_less(np.abs(best - exact), bound * (1 + 1e-6) + 1e-6 * np.abs(exact) + 1e-30)


def random_fp8_weights(rng, n, k):
    """Random FP8 block-128 weights: E4M3 codes [n, k] (every byte but the NaNs 0x7F / 0xFF) and
    F32 scales [ceil(n/128), ceil(k/128)]; and W in float64."""
    q = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0
    grid = ((n + 127) // 128, (k + 127) // 128)
    scales = rng.uniform(1e-3, 1e-2, size=grid).astype(F32)
    per_element = np.repeat(np.repeat(scales, 128, axis=0), 128, axis=1)[:n, :k]
    w = q.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * per_element.astype(np.float64)
    return q, scales, w


# Partial 128-blocks along both N and K, one block, several blocks.
FP8_SHAPES = SHAPES + [(2, 130, 300), (5, 128, 128), (1, 257, 129)]


@pytest.mark.parametrize("m,n,k", FP8_SHAPES)
def test_exact_fp8_block_kernels_match_float64(rng, m, n, k):
    q, scales, w = random_fp8_weights(rng, n, k)
    x = rng.standard_normal((m, k)).astype(F32)
    want = x.astype(np.float64) @ w.T
    abs_sum = np.abs(x.astype(np.float64)) @ np.abs(w).T
    for isa in (None, "scalar"):
        got = fp4moe.linear("fp8_block", "w4a16", q, scales, x, isa=isa)
        # Any FP32 summation order of k products, plus one rounding per scale product: as above.
        np.testing.assert_array_less(np.abs(got - want), (k + 4) * 2.0**-24 * abs_sum + 1e-30)


def test_w4a8_rejects_fp8_weights(rng):
    # The FP8 weights are valid (the exact product runs), so only the W4A8 eligibility check of the
    # dispatch layer (LinearPlan::create) can reject them, and with its own message.
    q, scales, w = random_fp8_weights(rng, 8, 64)
    x = rng.standard_normal((1, 64)).astype(F32)
    exact = fp4moe.linear("fp8_block", "w4a16", q, scales, x)
    assert np.isfinite(exact).all() and np.abs(exact).max() > 0
    with pytest.raises(fp4moe.Fp4moeError, match=r"no W4A8 fp8_block kernel \(W4A8 covers the FP4"):
        fp4moe.linear("fp8_block", "w4a8", q, scales, x)


def test_bad_names_are_errors(rng):
    packed, scales, ts, _ = random_weights(rng, "mxfp4", 8, 64)
    x = rng.standard_normal((1, 64)).astype(F32)
    fp4moe.linear("mxfp4", "w4a8", packed, scales, x)  # the same call with good names runs
    with pytest.raises(fp4moe.Fp4moeError, match="unknown precision 'w4a4'"):
        fp4moe.linear("mxfp4", "w4a4", packed, scales, x)
    with pytest.raises(fp4moe.Fp4moeError, match="unknown format 'fp8'"):
        fp4moe.linear("fp8", "w4a8", packed, scales, x)
    with pytest.raises(fp4moe.Fp4moeError, match="unknown ISA 'sse9'"):
        fp4moe.linear("mxfp4", "w4a8", packed, scales, x, isa="sse9")
