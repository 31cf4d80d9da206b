"""fp4moe's codecs and block quantizers against independent oracles.

Element codecs are checked against ml_dtypes over every code and >= 1M random float32 values. The
block recipes are checked against numpy implementations written here from ../shared/FORMATS.md and
ModelOpt's published NVFP4 recipe (not ports of the C++): byte-identical output is required.
"""
import ml_dtypes
import numpy as np
import pytest

import fp4moe

F32 = np.float32

# --------------------------------------------------------------------------------------------
# Element codecs


def random_float32(rng, n):
    """n float32 values from uniformly random bit patterns (every binade, subnormals, NaN, Inf),
    plus the specials every codec must get right."""
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45,
                         np.finfo(F32).max, -np.finfo(F32).max, np.finfo(F32).tiny], F32)
    return np.concatenate([bits.view(F32), specials])


def scaled_uniform(rng, n, lo_exp, hi_exp):
    """Values spread over the binades 2^lo_exp .. 2^hi_exp, both signs: the range of a codec."""
    mant = rng.uniform(1.0, 2.0, n)
    exp = rng.integers(lo_exp, hi_exp + 1, n)
    sign = rng.choice([-1.0, 1.0], n)
    return (sign * np.ldexp(mant, exp)).astype(F32)


def ties(values):
    """Exact midpoints between neighbouring representable magnitudes, both signs."""
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mids = ((v[:-1] + v[1:]) / 2).astype(F32)
    assert np.all(mids.astype(np.float64) == (v[:-1] + v[1:]) / 2), "midpoints must be exact"
    return np.concatenate([mids, -mids])


E2M1_CODES = np.arange(16, dtype=np.uint8)
BYTES = np.arange(256, dtype=np.uint8)


def test_e2m1_every_code_matches_ml_dtypes():
    ours = fp4moe.decode("e2m1", E2M1_CODES)
    # ml_dtypes stores float4 one value per byte, code in the low nibble.
    theirs = E2M1_CODES.view(ml_dtypes.float4_e2m1fn).astype(F32)
    assert ours.view(np.uint32).tolist() == theirs.view(np.uint32).tolist()


@pytest.mark.parametrize("kind,dtype", [("e4m3", ml_dtypes.float8_e4m3fn),
                                        ("e8m0", ml_dtypes.float8_e8m0fnu)])
def test_8bit_every_byte_matches_ml_dtypes(kind, dtype):
    ours = fp4moe.decode(kind, BYTES)
    theirs = BYTES.view(dtype).astype(F32)
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    assert ours[~nan].view(np.uint32).tolist() == theirs[~nan].view(np.uint32).tolist()


def test_ue4m3_is_e4m3_without_sign():
    ours = fp4moe.decode("ue4m3", BYTES)
    e4m3 = BYTES.view(ml_dtypes.float8_e4m3fn).astype(F32)
    assert np.array_equal(ours[:127], e4m3[:127])
    assert np.isnan(ours[127:]).all()  # 0x7F is NaN; signed codes are not valid scales


def test_e2m1_encode_matches_ml_dtypes_on_random_values(rng):
    x = np.concatenate([random_float32(rng, 1_000_000), scaled_uniform(rng, 200_000, -3, 3),
                        ties(fp4moe.decode("e2m1", E2M1_CODES))])
    finite_or_inf = ~np.isnan(x)
    ours = fp4moe.encode("e2m1", x)
    with np.errstate(invalid="ignore"):  # NaN has no E2M1 code; ml_dtypes warns
        theirs = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)  # it saturates E2M1 too
    mismatch = np.nonzero(ours[finite_or_inf] != theirs[finite_or_inf])[0]
    assert mismatch.size == 0, f"first mismatch at {x[finite_or_inf][mismatch[:5]]}"
    # Documented choice: NaN has no E2M1 code; we saturate it to +6 (ml_dtypes gives -0).
    assert (ours[~finite_or_inf] == 0x7).all()


def test_e4m3_encode_matches_ml_dtypes_with_saturation(rng):
    x = np.concatenate([random_float32(rng, 1_000_000), scaled_uniform(rng, 200_000, -12, 9),
                        ties(fp4moe.decode("e4m3", BYTES))])
    ours = fp4moe.encode("e4m3", x)
    # ml_dtypes' cast does not saturate (overflow -> NaN); ours does, as PTX satfinite: clip first.
    clipped = np.where(np.isnan(x), x, np.clip(x, -448.0, 448.0)).astype(F32)
    with np.errstate(invalid="ignore"):
        theirs = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    mismatch = np.nonzero(ours != theirs)[0]
    assert mismatch.size == 0, f"first mismatches {x[mismatch[:5]]}: {ours[mismatch[:5]]} vs {theirs[mismatch[:5]]}"


def test_e8m0_encode_matches_ml_dtypes_in_range(rng):
    x = np.concatenate([random_float32(rng, 1_000_000), scaled_uniform(rng, 200_000, -127, 126),
                        np.ldexp(1.5, np.arange(-127, 127)).astype(F32)])  # exact ties
    ours = fp4moe.encode("e8m0", x)
    # ml_dtypes rounds every float32 subnormal in (2^-127, 2^-126) up to 2^-126 (its bit trick
    # treats the subnormal's leading zero as a mantissa bit); ours rounds to the nearer power as in
    # every other binade. That interval is checked separately below.
    tiny = np.ldexp(F32(1), -126)
    in_range = np.isfinite(x) & (x >= tiny) & (x < np.ldexp(1.5, 127))
    theirs = x[in_range].astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(ours[in_range], theirs)
    sub = ~np.isnan(x) & (x >= np.ldexp(F32(1), -127)) & (x < tiny)
    expected_sub = np.where(x[sub] >= np.ldexp(1.5, -127), 1, 0).astype(np.uint8)
    assert np.array_equal(ours[sub], expected_sub)
    # Documented choices outside ml_dtypes' range (it gives NaN): saturate to 2^-127 / 2^127.
    low = ~np.isnan(x) & (x < np.ldexp(F32(1), -127))
    high = ~np.isnan(x) & (x >= np.ldexp(1.5, 127))
    assert (ours[low] == 0x00).all() and (ours[high] == 0xFE).all()
    assert (ours[np.isnan(x)] == 0xFF).all()


def test_bf16_and_fp16_encode_match_references(rng):
    x = random_float32(rng, 1_000_000)
    finite = ~np.isnan(x)
    bf16 = fp4moe.encode("bf16", x)
    assert np.array_equal(bf16[finite], x[finite].astype(ml_dtypes.bfloat16).view(np.uint16))
    fp16 = fp4moe.encode("fp16", x)
    with np.errstate(over="ignore"):  # overflow to Inf is the IEEE result being checked
        assert np.array_equal(fp16[finite], x[finite].astype(np.float16).view(np.uint16))
    assert np.isnan(fp4moe.decode("bf16", bf16[~finite])).all()
    assert np.isnan(fp4moe.decode("fp16", fp16[~finite])).all()


# --------------------------------------------------------------------------------------------
# Numpy oracles of the block recipes, written from FORMATS.md §2.

E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
ROUND_UP_AT = np.array([0.75, 1.75, 3.5], F32)  # midpoints whose upper neighbour has the even code


def oracle_cast_e2m1_modelopt(v):
    """ModelOpt's _cast_fp4: sign from v < 0; index by the rounding bounds; midpoints go to the
    even code. NaN sorts past every bound (code 7), as searchsorted orders NaN last."""
    a = np.abs(v)
    code = np.searchsorted(E2M1_BOUNDS, a, side="left").astype(np.uint8)
    code += np.isin(a, ROUND_UP_AT).astype(np.uint8)
    return code | ((v < 0).astype(np.uint8) << 3)


def pack(codes):
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def oracle_nvfp4(x, tensor_scale=None):
    x = x.astype(F32)
    if tensor_scale is None:
        tensor_scale = F32(np.max(np.abs(x))) / F32(6.0 * 448.0)
    ts = F32(tensor_scale)
    blocks = x.reshape(-1, 16)
    if ts == 0:  # all-zero tensor: fp4moe's documented choice (ModelOpt divides 0 by 0)
        return (np.zeros(x.shape[:-1] + (x.shape[-1] // 2,), np.uint8),
                np.full(x.shape[:-1] + (x.shape[-1] // 16,), 0x38, np.uint8), ts)
    ratio = (np.max(np.abs(blocks), axis=1) / (F32(6.0) * ts)).astype(F32)
    ratio[ratio == 0] = 1.0
    scale_codes = ratio.astype(ml_dtypes.float8_e4m3fn)
    divisor = (scale_codes.astype(F32) * ts).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (blocks / divisor[:, None]).astype(F32)
    codes = oracle_cast_e2m1_modelopt(scaled)
    return (pack(codes).reshape(x.shape[:-1] + (x.shape[-1] // 2,)),
            scale_codes.view(np.uint8).reshape(x.shape[:-1] + (x.shape[-1] // 16,)), ts)


def oracle_mxfp4(x, rule="ocp_floor"):
    x = x.astype(F32)
    blocks = x.reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1).astype(F32)
    with np.errstate(divide="ignore"):
        if rule == "ocp_floor":
            _, e = np.frexp(amax)
            exp = e.astype(np.int64) - 1 - 2
        else:
            ratio = (amax / F32(6.0)).astype(F32)
            m, e = np.frexp(ratio)
            exp = e.astype(np.int64) - 1 + (m != 0.5)
    exp = np.where(amax == 0, 0, np.clip(exp, -127, 127))
    scale = np.ldexp(F32(1.0), exp).astype(F32)
    codes = (blocks / scale[:, None]).astype(F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return (pack(codes).reshape(x.shape[:-1] + (x.shape[-1] // 2,)),
            (exp + 127).astype(np.uint8).reshape(x.shape[:-1] + (x.shape[-1] // 32,)))


def e2m1_values(packed):
    lut = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), F32)
    out[..., 0::2] = lut[packed & 0xF]
    out[..., 1::2] = lut[packed >> 4]
    return out


def awkward_tensor(rng, shape, kind):
    x = rng.standard_normal(shape).astype(F32)
    flat = x.reshape(-1)
    if kind == "zero_blocks":
        flat[: 3 * 32] = 0.0
        flat[-32:] = -0.0
    elif kind == "outlier":
        flat[rng.integers(flat.size)] = 3.0e4
    elif kind == "denormal":
        flat *= F32(1e-39)  # float32 subnormal range
    elif kind == "huge_outlier_tiny_rest":
        flat *= F32(1e-30)
        flat[0] = 1.0e30
    elif kind == "wide_range":
        flat *= np.ldexp(F32(1), rng.integers(-40, 40, flat.size)).astype(F32)
    return x


SHAPES = [(1, 32), (3, 64), (7, 160), (2, 3, 96), (33, 4096), (5, 1, 2880)]
KINDS = ["normal", "zero_blocks", "outlier", "denormal", "huge_outlier_tiny_rest", "wide_range"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_nvfp4_byte_identical_to_modelopt_recipe(rng, shape, kind):
    x = awkward_tensor(rng, shape, kind)
    packed, scales, ts = fp4moe.quantize_nvfp4(x)
    o_packed, o_scales, o_ts = oracle_nvfp4(x)
    assert ts.view(np.uint32) == o_ts.view(np.uint32)
    assert np.array_equal(scales, o_scales)
    assert np.array_equal(packed, o_packed)
    # Dequantization is e2m1 * (scale * tensor_scale), ModelOpt's order.
    expected = e2m1_values(o_packed).reshape(-1, 16) * (
        o_scales.reshape(-1).view(ml_dtypes.float8_e4m3fn).astype(F32) * o_ts)[:, None]
    got = fp4moe.dequantize_nvfp4(packed, scales, float(ts))
    assert np.array_equal(got.reshape(-1, 16).view(np.uint32), expected.astype(F32).view(np.uint32))


def test_nvfp4_shared_tensor_scale_for_w1_w3(rng):
    w1 = rng.standard_normal((64, 256)).astype(F32)
    w3 = 4 * rng.standard_normal((64, 256)).astype(F32)
    shared = F32(max(np.abs(w1).max(), np.abs(w3).max())) / F32(6.0 * 448.0)
    for w in (w1, w3):
        packed, scales, ts = fp4moe.quantize_nvfp4(w, tensor_scale=shared)
        o_packed, o_scales, _ = oracle_nvfp4(w, shared)
        assert ts == shared and np.array_equal(packed, o_packed) and np.array_equal(scales, o_scales)


def test_nvfp4_all_zero_tensor():
    packed, scales, ts = fp4moe.quantize_nvfp4(np.zeros((2, 32), F32))
    assert ts == 0 and (packed == 0).all() and (scales == 0x38).all()


@pytest.mark.parametrize("rule", ["ocp_floor", "round_up"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_mxfp4_byte_identical_to_ocp_recipe(rng, rule, shape, kind):
    x = awkward_tensor(rng, shape, kind)
    packed, scales = fp4moe.quantize_mxfp4(x, rule)
    o_packed, o_scales = oracle_mxfp4(x, rule)
    assert np.array_equal(scales, o_scales)
    assert np.array_equal(packed, o_packed)
    expected = e2m1_values(o_packed).reshape(-1, 32) * np.ldexp(
        F32(1), o_scales.reshape(-1).astype(np.int64) - 127).astype(F32)[:, None]
    got = fp4moe.dequantize_mxfp4(packed, scales)
    assert np.array_equal(got.reshape(-1, 32), expected.astype(F32))


def test_mxfp4_round_up_never_clips_and_ocp_may(rng):
    x = rng.standard_normal((64, 256)).astype(F32) * 10
    block_max = np.abs(x.reshape(-1, 32)).max(axis=1)
    ratio = {}
    for rule in ("round_up", "ocp_floor"):
        _, scales = fp4moe.quantize_mxfp4(x, rule)
        ratio[rule] = block_max / np.ldexp(1.0, scales.reshape(-1).astype(np.int64) - 127)
    # Round-up: the block max lands in (3, 6], never past E2M1's largest value.
    assert (ratio["round_up"] <= 6).all() and (ratio["round_up"] > 3).all()
    # OCP floor: in [4, 8), so maxima above 6 clip (up to 25%), as FORMATS.md warns.
    assert (ratio["ocp_floor"] >= 4).all() and (ratio["ocp_floor"] < 8).all()
    assert (ratio["ocp_floor"] > 6).any()


def oracle_fp8_block(x, ue8m0):
    rows, cols = x.shape
    gr, gc = (rows + 127) // 128, (cols + 127) // 128
    q = np.zeros(x.shape, np.uint8)
    scales = np.zeros((gr, gc), np.uint8 if ue8m0 else F32)
    for i in range(gr):
        for j in range(gc):
            blk = x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = F32(np.abs(blk).max())
            if ue8m0:
                m, e = np.frexp((amax / F32(448)).astype(F32))
                exp = 0 if amax == 0 else int(e) - 1 + int(m != 0.5)
                scale = np.ldexp(F32(1), exp).astype(F32)
                scales[i, j] = exp + 127
            else:
                scale = F32(1) if amax == 0 else F32(amax / F32(448))
                scales[i, j] = scale
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (
                (blk / scale).astype(F32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    return q, scales


@pytest.mark.parametrize("shape", [(1, 1), (128, 128), (129, 257), (300, 64)])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("zero_block", [False, True])
def test_fp8_block128_matches_deepseek_recipe(rng, shape, ue8m0, zero_block):
    x = rng.standard_normal(shape).astype(F32) * 3
    gc = (shape[1] + 127) // 128
    # With zero_block, the whole block (0, gc // 2) of the scale grid is zero: a full 128x128 block
    # of (129, 257), the partial [:128, :64] of (300, 64), the whole tensor of one-block shapes.
    zero = (slice(0, 128), slice(128 * (gc // 2), 128 * (gc // 2) + 128))
    if zero_block:
        x[zero] = 0
    q, scales = fp4moe.quantize_fp8_block128(x, ue8m0)
    o_q, o_scales = oracle_fp8_block(x, ue8m0)
    assert np.array_equal(scales, o_scales) and np.array_equal(q, o_q)
    if zero_block:
        # An all-zero block gets scale 1.0 (E8M0 code 127) and zero codes (block.h).
        assert scales[0, gc // 2] == (127 if ue8m0 else F32(1.0)), scales
        assert not q[zero].any()
    else:
        assert (scales != (127 if ue8m0 else 1.0)).all(), "a random block got the zero-block scale"
    deq = fp4moe.dequantize_fp8_block128(q, scales)
    scale_full = (np.ldexp(F32(1), o_scales.astype(np.int64) - 127).astype(F32) if ue8m0 else o_scales)
    scale_full = np.repeat(np.repeat(scale_full, 128, 0), 128, 1)[: shape[0], : shape[1]]
    assert np.array_equal(deq, o_q.view(ml_dtypes.float8_e4m3fn).astype(F32) * scale_full)


# --------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_names_tensor_and_position():
    with pytest.raises(fp4moe.Fp4moeError, match="not a multiple of the NVFP4 block size 16"):
        fp4moe.quantize_nvfp4(np.ones((2, 40), F32))
    with pytest.raises(fp4moe.Fp4moeError, match="not a multiple of the MXFP4 block size 32"):
        fp4moe.quantize_mxfp4(np.ones((2, 48), F32))
    x = np.ones((4, 64), F32)
    x[2, 17] = np.nan
    with pytest.raises(fp4moe.Fp4moeError, match=r"NaN at element \[2, 17\]"):
        fp4moe.quantize_mxfp4(x)
    x[2, 17] = -np.inf
    with pytest.raises(fp4moe.Fp4moeError, match=r"Inf at element \[2, 17\]"):
        fp4moe.quantize_fp8_block128(x)
    with pytest.raises(fp4moe.Fp4moeError, match=r"Inf at element 145"):
        fp4moe.quantize_nvfp4(x)
