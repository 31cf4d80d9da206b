"""Lossless MXFP4 -> NVFP4 transcoding (FORMATS.md §4), checked with numpy dequantization."""
import ml_dtypes
import numpy as np
import pytest

import fp4moe

F32 = np.float32
E2M1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)


def dequant_mx(packed, scales):
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2] = E2M1[packed & 0xF]
    vals[..., 1::2] = E2M1[packed >> 4]
    blocks = vals.reshape(-1, 32)
    return (blocks * np.ldexp(F32(1), scales.reshape(-1).astype(np.int64) - 127)[:, None]).astype(F32)


def dequant_nv(packed, block_scales, ts):
    vals = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    vals[..., 0::2] = E2M1[packed & 0xF]
    vals[..., 1::2] = E2M1[packed >> 4]
    s = block_scales.reshape(-1).view(ml_dtypes.float8_e4m3fn).astype(F32)
    return (vals.reshape(-1, 16) * (s * F32(ts))[:, None]).astype(F32)


def random_mx(rng, rows, cols, k_lo, k_hi, zero_fraction=0.1):
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    half_blocks = packed.reshape(-1, 8)
    zero = rng.random(half_blocks.shape[0]) < zero_fraction
    half_blocks[zero] = rng.choice([0x00, 0x08, 0x80, 0x88], (zero.sum(), 8))  # +-0 nibbles
    scales = rng.integers(k_lo, k_hi + 1, (rows, cols // 32), dtype=np.int64).astype(np.uint8)
    return packed, scales


def nonzero_halves(packed):
    return (packed.reshape(-1, 8) & 0x77).any(axis=1)


@pytest.mark.parametrize("rows,cols", [(1, 32), (3, 64), (17, 2880), (64, 2048)])
def test_in_window_is_bit_exact(rng, rows, cols):
    packed, scales = random_mx(rng, rows, cols, 110, 127)  # 18 binades: the whole window
    (out,), ts, report = fp4moe.transcode_mxfp4_to_nvfp4([(packed, scales)])
    nv_packed, nv_scales = out
    assert np.array_equal(nv_packed, packed), "nibbles must be kept verbatim"
    assert np.array_equal(dequant_nv(nv_packed, nv_scales, ts).view(np.uint32),
                          dequant_mx(packed, scales).reshape(-1, 16).view(np.uint32))
    nz = nonzero_halves(packed)
    k_max = scales.reshape(-1).repeat(2)[nz].max()
    assert ts == np.ldexp(F32(1), int(k_max) - 127 - 8)
    assert report["blocks_total"] == rows * cols // 16
    assert report["blocks_lossless"] == nz.sum()
    assert report["blocks_all_zero"] == (~nz).sum()
    assert report["blocks_requantized"] == 0 and report["max_abs_error"] == 0


def test_gate_and_up_share_one_tensor_scale(rng):
    w1 = random_mx(rng, 32, 512, 115, 120)
    w3 = random_mx(rng, 32, 512, 118, 125)
    outs, ts, report = fp4moe.transcode_mxfp4_to_nvfp4([w1, w3])
    k_max = max(w[1].reshape(-1).repeat(2)[nonzero_halves(w[0])].max() for w in (w1, w3))
    assert ts == np.ldexp(F32(1), int(k_max) - 127 - 8)
    for (packed, scales), (nv_packed, nv_scales) in zip((w1, w3), outs):
        assert np.array_equal(dequant_nv(nv_packed, nv_scales, ts),
                              dequant_mx(packed, scales).reshape(-1, 16))
    assert report["blocks_requantized"] == 0


def test_gpt_oss_layout_experts_blocks(rng):
    # gpt-oss stores [E, N, K/32, 16] bytes and [E, N, K/32] scales: the same bytes as [E*N, K/2].
    e, n, k = 4, 90, 2880
    packed = rng.integers(0, 256, (e, n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(118, 128, (e, n, k // 32), dtype=np.int64).astype(np.uint8)
    (out,), ts, report = fp4moe.transcode_mxfp4_to_nvfp4([(packed.reshape(e * n, k // 2), scales)])
    assert report["blocks_lossless"] + report["blocks_all_zero"] == e * n * k // 16
    assert np.array_equal(dequant_nv(*out, ts), dequant_mx(packed.reshape(e * n, -1), scales).reshape(-1, 16))


def test_out_of_window_blocks_are_requantized_within_bound(rng):
    packed, scales = random_mx(rng, 48, 1024, 90, 127, zero_fraction=0.05)  # 38 binades
    (out,), ts, report = fp4moe.transcode_mxfp4_to_nvfp4([(packed, scales)])
    nz = nonzero_halves(packed)
    k = scales.reshape(-1).repeat(2).astype(np.int64)
    k_max = k[nz].max()
    outside = nz & (k_max - k > 17)
    assert report["blocks_requantized"] == outside.sum() > 0
    assert report["blocks_lossless"] == (nz & ~outside).sum()
    exact = dequant_mx(packed, scales).reshape(-1, 16)
    got = dequant_nv(*out, ts)
    assert np.array_equal(got[~outside], exact[~outside])
    # Stated bound: an out-of-window block is below 2^-10 of the range and is quantized with the
    # smallest block scale 2^-9, so each element is off by at most half a step of 2^(k_max-17).
    bound = float(ts) * 2.0**-10
    err = np.abs(got[outside].astype(np.float64) - exact[outside])
    assert err.max() <= bound
    assert report["max_abs_error"] == pytest.approx(err.max(), rel=0, abs=0)


def test_nan_scale_is_an_error_with_position(rng):
    packed, scales = random_mx(rng, 4, 128, 120, 125)
    scales[2, 3] = 0xFF
    with pytest.raises(fp4moe.Fp4moeError, match=r"E8M0 scale 0xFF \(NaN\) at row 2, block 3"):
        fp4moe.transcode_mxfp4_to_nvfp4([(packed, scales)])


def test_quantized_then_transcoded_roundtrip(rng):
    x = rng.standard_normal((128, 4096)).astype(F32)
    packed, scales = fp4moe.quantize_mxfp4(x)
    (out,), ts, report = fp4moe.transcode_mxfp4_to_nvfp4([(packed, scales)])
    assert report["blocks_requantized"] == 0
    assert np.array_equal(fp4moe.dequantize_nvfp4(*out, float(ts)),
                          fp4moe.dequantize_mxfp4(packed, scales))
