"""The CPU backend's `numerics` option: each setting forced, against numpy written here (and, for the
ops ggml computes with its vector code, against real libggml bit for bit).

"x86" follows ggml's AVX2 code (ggml-cpu/arch/x86/quants.c of llama.cpp 0c1e570): src1 quantized to
Q8_0/Q8_1 with 127/amax and round-half-to-even, and the Q8_0, Q4_0 and Q5_0 x Q8_0 and Q4_1 x Q8_1 dots
summed in its float order (one 8-lane FMA accumulator, hsum_float_8, Q4_1's summs by FMA, added last): the
quants and scales must be equal bit for bit, and so must the products (against ggml's AVX2 arithmetic
written here). "ref" follows ggml's reference C (1/d and roundf; Q5_0's dot in its order). Both are checked
on every machine; which one a backend takes by default is the host's. CPY to Q8_0 rounds by the setting
too. ggml_v_expf (both x86 variants) is checked against its source with exact FMAs, the scalar exp against
libm; ROPE, SOFT_MAX, SILU, SWIGLU, RMS_NORM, row-by-row F16 FLASH_ATTN_EXT and MUL_MAT of Q8_0, Q4_0, Q4_1
and Q5_0 weights (and Q4_K and Q6_K mat-vecs) under "x86" against libggml itself (built for this host), bit
for bit.
"""

from __future__ import annotations

from fractions import Fraction

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from kernel_helpers import F32, new_ctx, run, tensor

from pyggml.backends.cpu import CPUBackend, cpu_init
from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.backends.cpu.kernels.vec_dot import quantize_src1
from pyggml.backends.cpu.numerics import (
    ENV_FMA_CHAINS,
    ENV_NUMERICS,
    NUMERICS_CHOICES,
    host_fma_chains,
    host_numerics,
    host_x86_level,
    resolve_numerics,
    resolve_x86_level,
)
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend
from pyggml.testing.op_check import OpCase

CODES = {"ref": quantize_src1.ROUND_REF, "x86": quantize_src1.ROUND_X86}


# --- numpy references of the two quantizers (per block of 32, float32 arithmetic) ---


def q8_blocks(x: np.ndarray, rounding: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quants (n, 32) int, d (n,) unrounded float32, s (n,) = f16(sum(q) * d) as float32) of x's blocks."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        if rounding == "x86":  # quantize_row_q8_0/q8_1 (AVX2): id = 127 / max, _mm256_round_ps (half to even)
            mul = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
            q = np.rint(b * mul[:, None])
        else:  # quantize_row_q8_0_ref/q8_1_ref: id = 1 / d, roundf (half away from zero)
            mul = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
            p = (b * mul[:, None]).astype(np.float64)
            q = np.sign(p) * np.floor(np.abs(p) + 0.5)
    q = q.astype(np.int64)
    s = (q.sum(axis=1).astype(np.float32) * d).astype(np.float16).astype(np.float32)
    return q, d, s


def quantize(kind: GGMLType, x: np.ndarray, rounding: str) -> tuple[np.ndarray, ...]:
    """quantize_src1.quantize_rows' split arrays for float32 rows x."""
    n, k = x.shape
    yq, yd, ys, yb = (np.zeros((n, k), np.int8), np.zeros((n, k // 32), np.float32),
                      np.zeros((n, k // 32), np.float32), np.zeros((n, k // 16), np.int32))
    quantize_src1.quantize_rows(int(kind), np.ascontiguousarray(x), yq, yd, ys, yb, CODES[rounding])
    return yq, yd, ys, yb


def src1_rows(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Gaussian rows, an all-zero block, and a block that makes the two roundings differ: exact halves (a
    block of max 127 scales by exactly 1 on both paths: 2.5 is 2 on x86, 3 by roundf)."""
    x = (rng.standard_normal((n, k)) * 2).astype(np.float32)
    x[0, 32:64] = 0  # an all-zero block
    x[1, :32] = np.float32(0.5) + np.arange(32, dtype=np.float32)
    x[1, 31] = 127  # max 127: d = 1, both multipliers exactly 1, the values are halves
    return x


@pytest.mark.parametrize("rounding", NUMERICS_CHOICES)
@pytest.mark.parametrize("kind", [GGMLType.Q8_0, GGMLType.Q8_1])
def test_quantize_rows_equal_the_numpy_reference(kind: GGMLType, rounding: str, rng: np.random.Generator) -> None:
    x = src1_rows(rng, 6, 512)
    yq, yd, ys, yb = quantize(kind, x, rounding)
    q, d, s = q8_blocks(x, rounding)
    np.testing.assert_array_equal(yq.reshape(-1, 32), q)
    np.testing.assert_array_equal(yd.reshape(-1), d.astype(np.float16).astype(np.float32))
    if kind == GGMLType.Q8_1:
        np.testing.assert_array_equal(ys.reshape(-1), s)
    np.testing.assert_array_equal(yb.reshape(-1), q.reshape(-1, 16).sum(axis=1))


@pytest.mark.parametrize("rounding", NUMERICS_CHOICES)
@pytest.mark.parametrize("kind", [GGMLType.Q8_0, GGMLType.Q8_1])
def test_quantize_rows_with_inf_or_nan_take_the_block_by_block_loop(kind: GGMLType, rounding: str,
                                                                     rng: np.random.Generator) -> None:
    """A row holding an inf or NaN is quantized block by block with ggml's left-to-right MAX (where a NaN's
    place matters); the finite rows beside it keep the 32-lane path's (the reference's) bits."""
    x = src1_rows(rng, 5, 256)
    x[2, 40] = np.inf
    x[3, 3] = np.nan  # early in its block: MAX(amax, NaN) is NaN, then the later values win again
    x[4, 31] = np.nan  # last in its block: the block's amax is NaN
    yq, yd, ys, yb = quantize(kind, x, rounding)
    want_q, want_b = np.zeros_like(yq), np.zeros_like(yb)
    for r in (2, 3, 4):
        for b in range(8):
            d, total = quantize_src1.q8_block_scalar(x, want_q, want_b, r, b, CODES[rounding])
            np.testing.assert_array_equal(yd[r, b], np.float32(np.float16(d)))
            if kind == GGMLType.Q8_1:
                with np.errstate(over="ignore", invalid="ignore"):  # f16(inf * ...) as ggml's conversion
                    s = np.float32(np.float16(np.float32(total) * d))
                np.testing.assert_array_equal(ys[r, b], s)
    np.testing.assert_array_equal(yq[2:], want_q[2:])
    np.testing.assert_array_equal(yb[2:], want_b[2:])
    # rows 0 and 1 are finite: the numpy reference's bits
    q, d, _ = q8_blocks(x[:2], rounding)
    np.testing.assert_array_equal(yq[:2].reshape(-1, 32), q)
    np.testing.assert_array_equal(yd[:2].reshape(-1), d.astype(np.float16).astype(np.float32))
    # the NaN early in row 3's block 0 does not poison the block's scale: ggml's MAX drops it again
    assert np.isfinite(yd[3, 0]) and np.isnan(yd[4, 0])
    assert yd[2, 1] == np.inf


@pytest.mark.slow
def test_quantize_rows_refuses_strided_rows(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 64)).astype(np.float32)[::2]
    yq, yd, ys, yb = (np.zeros((2, 64), np.int8), np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32),
                      np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        quantize_src1.quantize_rows(int(GGMLType.Q8_0), x, yq, yd, ys, yb, quantize_src1.ROUND_X86)


def test_the_two_roundings_differ_where_expected(rng: np.random.Generator) -> None:
    x = src1_rows(rng, 64, 512)
    ref, x86 = quantize(GGMLType.Q8_0, x, "ref")[0], quantize(GGMLType.Q8_0, x, "x86")[0]
    assert list(ref[1, :4]) == [1, 2, 3, 4] and list(x86[1, :4]) == [0, 2, 2, 4]  # 0.5, 1.5, 2.5, 3.5
    differ = np.count_nonzero(ref != x86)
    # the crafted halves (16 of row 1's block), and rarely (~1e-5 of gaussian values: a product within an
    # ulp of a half) others
    assert 16 <= differ < 16 + ref.size // 1000
    assert np.abs(ref.astype(int) - x86).max() == 1


def test_q8_0_quants_equal_ggml_reference_code_under_ref(rng: np.random.Generator) -> None:
    """"ref" against the gguf package's port of quantize_row_q8_0_ref (a third implementation)."""
    x = src1_rows(rng, 4, 256)
    yq, yd, _, _ = quantize(GGMLType.Q8_0, x, "ref")
    want = gguf.quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(4, 8, 34)
    np.testing.assert_array_equal(yq.reshape(4, 8, 32), want[:, :, 2:].view(np.int8))
    np.testing.assert_array_equal(yd, want[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32))


# --- ggml's AVX2 dot products, float for float ---


def _f32(v: Fraction | float) -> float:
    """The float32 nearest to an exact value, ties to even (no double rounding: neighbours compared exactly)."""
    exact = Fraction(v)
    f = np.float32(float(exact))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]

    def key(c: np.float32) -> tuple[Fraction, int]:
        return abs(Fraction(float(c)) - exact), int(np.array(c, np.float32).view(np.uint32)) & 1

    return float(min(cands, key=key))


def fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once to float32 (the FMA instruction)."""
    return _f32(Fraction(a) * Fraction(b) + Fraction(c))


def add(a: float, b: float) -> float:
    return float(np.float32(a) + np.float32(b))


def mul(a: float, b: float) -> float:
    return float(np.float32(a) * np.float32(b))


def hsum_float_8(acc: list[float]) -> float:
    """ggml's hsum_float_8: high half plus low half, then movehl, then movehdup."""
    r = [add(acc[4 + i], acc[i]) for i in range(4)]
    r = [add(r[0], r[2]), add(r[1], r[3])]
    return add(r[0], r[1])


def avx2_dot(values: np.ndarray, dw: np.ndarray, yq: np.ndarray, yd: np.ndarray,
             mins: np.ndarray | None = None, ys: np.ndarray | None = None) -> float:
    """One row: ggml_vec_dot_q8_0_q8_0 (values signed) or ggml_vec_dot_q4_1_q8_1 (values 0..15, mins, s)."""
    acc = [0.0] * 8
    summs = 0.0
    for b in range(values.shape[0]):
        if mins is not None:
            assert ys is not None
            summs = fma(float(mins[b]), float(ys[b]), summs)
        d = mul(float(dw[b]), float(yd[b]))
        prods = values[b].astype(np.int64) * yq[b].astype(np.int64)
        for lane in range(8):
            acc[lane] = fma(d, float(np.float32(prods[4 * lane:4 * lane + 4].sum())), acc[lane])
    return add(hsum_float_8(acc), summs)


def _f16_field(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def q5_0_values(blocks: np.ndarray) -> np.ndarray:
    """The values (-16..15, value t: nibble t | bit t of qh << 4, minus 16) of Q5_0 blocks (..., 22)."""
    qh = blocks[..., 2:6].copy().view("<u4")[..., 0].astype(np.int64)
    qs = blocks[..., 6:].astype(np.int64)
    nibbles = np.concatenate([qs & 15, qs >> 4], axis=-1)
    return nibbles + 16 * ((qh[..., None] >> np.arange(32)) & 1) - 16


@pytest.mark.parametrize("wtype", [GGMLType.Q8_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q4_0])
def test_x86_products_equal_ggml_avx2_arithmetic_bit_for_bit(wtype: GGMLType, rng: np.random.Generator) -> None:
    M, N, K = 7, 3, 512  # 16 blocks: also more than quant_loops' 4-block unroll of the "ref" path
    qt = GGMLQuantizationType(int(wtype))
    stored = gguf.quants.quantize(rng.standard_normal((M, K)).astype(np.float32), qt)
    x = src1_rows(rng, N, K)
    ctx = new_ctx(8)
    w = ctx.new_tensor(wtype, [K, M])
    w.numpy()[...] = stored.reshape(w.numpy().shape)
    got = run(ctx.mul_mat(w, tensor(ctx, F32, x[None, None])), ComputeParams(numerics="x86"))[0, 0]

    vdt = GGMLType.Q8_1 if wtype == GGMLType.Q4_1 else GGMLType.Q8_0
    yq, yd, ys, _ = quantize(vdt, x, "x86")
    size = {GGMLType.Q8_0: 34, GGMLType.Q4_1: 20, GGMLType.Q5_0: 22, GGMLType.Q4_0: 18}[wtype]
    blocks = stored.reshape(M, K // 32, size)
    dw = _f16_field(blocks, 0)
    if wtype == GGMLType.Q8_0:
        values = blocks[..., 2:].copy().view(np.int8)
        mins = None
    elif wtype == GGMLType.Q5_0:  # ggml_vec_dot_q5_0_q8_0: values nibble | 0xF0 where the bit is clear, as Q8_0's
        values = q5_0_values(blocks)
        mins = None
    elif wtype == GGMLType.Q4_0:  # ggml_vec_dot_q4_0_q8_0: values nibble - 8, as Q8_0's
        qs = blocks[..., 2:].astype(np.int64)
        values = np.concatenate([qs & 15, qs >> 4], axis=-1) - 8
        mins = None
    else:
        qs = blocks[..., 4:]
        values = np.concatenate([qs & 15, qs >> 4], axis=-1)  # low nibbles are values 0..15, high 16..31
        mins = _f16_field(blocks, 2)
    want = np.array([[avx2_dot(values[m], dw[m], yq[n].reshape(-1, 32), yd[n],
                               None if mins is None else mins[m], ys[n]) for m in range(M)] for n in range(N)],
                    np.float32)
    np.testing.assert_array_equal(got, want)
    # "ref" quantizes some of these rows differently: the products move (this data is not a no-op test)
    ref = run(ctx.mul_mat(w, tensor(ctx, F32, x[None, None])), ComputeParams(numerics="ref"))[0, 0]
    assert not np.array_equal(ref, got)


# --- the option ---


def test_q5_0_ref_products_sum_in_ggml_reference_order(rng: np.random.Generator) -> None:
    """Q5_0 under "ref": ggml_vec_dot_q5_0_q8_0's reference C, `sumf += (d_w * d_y) * sumi` block after
    block in float32, no FMA (the bits pyggml's Q5_0 rows always gave there)."""
    M, N, K = 7, 5, 512
    stored = gguf.quants.quantize(rng.standard_normal((M, K)).astype(np.float32), GGMLQuantizationType.Q5_0)
    x = src1_rows(rng, N, K)
    ctx = new_ctx(8)
    w = ctx.new_tensor(GGMLType.Q5_0, [K, M])
    w.numpy()[...] = stored.reshape(w.numpy().shape)
    got = run(ctx.mul_mat(w, tensor(ctx, F32, x[None, None])), ComputeParams(numerics="ref"))[0, 0]
    yq, yd, _, _ = quantize(GGMLType.Q8_0, x, "ref")
    blocks = stored.reshape(M, K // 32, 22)
    values, dw = q5_0_values(blocks), _f16_field(blocks, 0)
    want = np.zeros((N, M), np.float32)
    for n in range(N):
        sumi = (values * yq[n].reshape(-1, 32).astype(np.int64)).sum(axis=-1)  # (M, blocks), exact
        for b in range(K // 32):
            want[n] += (dw[:, b] * yd[n, b]) * sumi[:, b].astype(np.float32)  # float32 throughout
    np.testing.assert_array_equal(got, want)


def test_resolution_argument_then_environment_then_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_numerics("X86 ", {}) == "x86"
    assert resolve_numerics(None, {ENV_NUMERICS: "ref"}) == "ref"
    assert resolve_numerics("x86", {ENV_NUMERICS: "ref"}) == "x86"
    assert resolve_numerics(None, {}) == host_numerics()
    with pytest.raises(ArgumentError, match="allowed: x86, ref"):
        resolve_numerics("avx", {})
    with pytest.raises(ArgumentError, match=ENV_NUMERICS):
        resolve_numerics(None, {ENV_NUMERICS: "fast"})
    monkeypatch.setenv(ENV_NUMERICS, "ref")
    assert ComputeParams().numerics == "ref"
    assert CPUBackend(1).numerics == "ref"
    assert cpu_init(1, numerics="x86").numerics == "x86"


def test_fma_chains_follow_the_host_s_gcc_tuning_unless_set() -> None:
    from llvmlite import binding

    assert host_fma_chains({ENV_FMA_CHAINS: "0"}) is False
    assert host_fma_chains({ENV_FMA_CHAINS: " 1"}) is True
    assert host_fma_chains({}) is not binding.get_host_cpu_name().startswith("znver")
    with pytest.raises(ArgumentError, match=ENV_FMA_CHAINS):
        host_fma_chains({ENV_FMA_CHAINS: "yes"})


def test_the_host_x86_level_names_avx512_fp16_above_bf16() -> None:
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    level = host_x86_level()
    assert (level == "avx512fp16") == bool(features.get("avx512f") and features.get("avx512bf16")
                                           and features.get("avx512fp16"))
    assert resolve_x86_level("AVX512FP16") == "avx512fp16"
    assert ComputeParams(x86_level="avx512fp16").x86_level == "avx512fp16"


def test_host_default_is_x86_where_numba_targets_avx2_and_fma() -> None:
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    if features.get("avx2", False) and features.get("fma", False):
        assert host_numerics() == "x86"


def test_backend_plans_carry_the_setting(rng: np.random.Generator) -> None:
    """A backend's setting reaches its kernels: its Q4_1 product equals the kernel's under that setting,
    and the two settings give different products here."""
    ctx = new_ctx(8)
    K, M = 256, 16
    w = ctx.new_tensor(GGMLType.Q4_1, [K, M])
    w.numpy()[...] = gguf.quants.quantize(rng.standard_normal((M, K)).astype(np.float32),
                                          GGMLQuantizationType.Q4_1).reshape(w.numpy().shape)
    node = ctx.mul_mat(w, tensor(ctx, F32, src1_rows(rng, 2, K)[None, None]))
    graph = ctx.new_graph()
    graph.build_forward_expand(node)
    got = {}
    for rounding in NUMERICS_CHOICES:
        backend = cpu_init(1, numerics=rounding)
        backend.graph_compute(graph)
        backend.free()
        got[rounding] = node.numpy()[0, 0].copy()
        np.testing.assert_array_equal(got[rounding], run(node, ComputeParams(numerics=rounding))[0, 0])
    assert not np.array_equal(got["x86"], got["ref"])


# --- ggml's vector exp, against numpy (exact FMAs by fractions) ---


def _expf_ggml(x: float, lanes: int) -> float:
    """ggml_v_expf (vec.h) one lane, written from its source: 16 lanes AVX512, 8 lanes AVX2 (main range)."""
    c = {k: float(np.float32(float.fromhex(v))) for k, v in (
        ("r", "0x1.8p23"), ("log2e", "0x1.715476p+0"), ("hi", "0x1.62e4p-1"), ("lo", "0x1.7f7d1cp-20"),
        ("p5", "0x1.0e4020p-7"), ("p4", "0x1.573e2ep-5"), ("p3", "0x1.555e66p-3"), ("p2", "0x1.fffdb6p-2"),
        ("p1", "0x1.ffffecp-1"))}
    z = fma(x, c["log2e"], c["r"])
    n = float(np.float32(z) - np.float32(c["r"]))
    b = fma(-n, c["lo"], fma(-n, c["hi"], x))
    u = mul(b, b)
    hi = fma(fma(c["p5"], b, c["p4"]), u, fma(c["p3"], b, c["p2"]))
    if lanes == 16:
        return _f32(Fraction(fma(hi, u, fma(c["p1"], b, 1.0))) * Fraction(2) ** int(n))
    k = float(np.float32(2.0) ** int(n))
    return fma(fma(hi, u, mul(c["p1"], b)), k, k)


@pytest.mark.parametrize("lanes", [16, 8])
def test_vector_exp_equals_its_source(lanes: int, rng: np.random.Generator) -> None:
    from pyggml.backends.cpu.kernels.simd_math import v_expf

    x = np.concatenate([rng.uniform(-80, 80, 300), rng.standard_normal(200)]).astype(np.float32)
    got = np.array([v_expf(v, lanes) for v in x], np.float32)
    want = np.array([_expf_ggml(float(v), lanes) for v in x], np.float32)
    np.testing.assert_array_equal(got, want)
    assert v_expf(np.float32(-np.inf), lanes) == 0.0 and v_expf(np.float32(200.0), lanes) == np.inf


def test_scalar_exp_is_libm() -> None:
    """"ref" (lanes 0): libm's expf, as ggml's scalar code and the tail of every row."""
    import ctypes

    from pyggml.backends.cpu.kernels.simd_math import v_expf

    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    x = np.linspace(-30, 30, 997, dtype=np.float32)
    np.testing.assert_array_equal(np.array([v_expf(v, 0) for v in x], np.float32),
                                  np.array([libm.expf(float(v)) for v in x], np.float32))




def _tree_sum_py(v: list[float]) -> float:
    """Lanes summed by halves in float32 (lanes i and i + w/2 first), as ggml's horizontal adds."""
    v = [np.float32(x) for x in v]
    while len(v) > 1:
        h = len(v) // 2
        v = [np.float32(v[i] + v[i + h]) for i in range(h)]
    return float(v[0])


@pytest.mark.parametrize("lanes", [16, 8, 0])
def test_softmax_row_sums_in_ggml_order(lanes: int, rng: np.random.Generator) -> None:
    """ggml_vec_soft_max_f32 written out: blocks of `lanes` by the vector exp, each block summed in float by
    halves and added in double, the tail (and lanes 0, all of it) by libm's expf added value by value."""
    from pyggml.backends.cpu.kernels.simd_math import softmax_exp_rows, v_expf

    t = rng.uniform(-20, 5, (3, 53)).astype(np.float32)  # 53: blocks and a tail for both widths
    mx = t.max(axis=1)
    got, sums = t.copy(), np.empty(3)
    softmax_exp_rows(got, mx, sums, lanes)
    for r in range(3):
        e = [np.float32(v_expf(np.float32(v - mx[r]), lanes if i < 53 - 53 % max(lanes, 1) else 0))
             for i, v in enumerate(t[r])]
        n_simd = 53 - 53 % lanes if lanes else 0
        total = 0.0
        for i in range(0, n_simd, max(lanes, 1)):
            total += _tree_sum_py(e[i:i + lanes])
        for i in range(n_simd, 53):
            total += float(e[i])
        np.testing.assert_array_equal(got[r], np.array(e, np.float32))
        assert sums[r] == total
# --- ops against real ggml, bit for bit (x86: libggml is built for this host, -march=native) ---


def _bits_differ(case: OpCase, backend: Backend, reference: Backend) -> tuple[int, int] | None:
    """(elements whose bits differ, elements) of one op_check case on `backend` and `reference`; None if
    either cannot compute it."""
    from pyggml.alloc import alloc_ctx_tensors
    from pyggml.core.context import Context
    from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set_numpy
    from pyggml.testing import op_check as T

    ctx1, ctx2 = Context(mem_size=1 << 22, no_alloc=True), Context(mem_size=1 << 22, no_alloc=True)
    g1, out1 = T._graph_of(case, ctx1)
    g2, out2 = T._graph_of(case, ctx2)
    if T._unsupported(backend, g1) is not None or T._unsupported(reference, g2) is not None:
        return None
    bufs = [alloc_ctx_tensors(ctx1, backend), alloc_ctx_tensors(ctx2, reference)]
    try:
        rng = np.random.default_rng(T._seed(case))
        for leaf1, leaf2 in zip(g1.leafs, g2.leafs, strict=True):
            values = case.inits.get(leaf1.name, T.default_values)(rng, leaf1)
            tensor_set_numpy(leaf1, values)
            tensor_set_numpy(leaf2, values)
        backend.graph_compute(g1)
        reference.graph_compute(g2)
        a, b = np.ascontiguousarray(tensor_get_numpy(out1)), np.ascontiguousarray(tensor_get_numpy(out2))
    finally:
        for buf in bufs:
            if buf is not None:
                buf.free()
    bits = np.dtype(f"u{a.itemsize}")
    return int(np.count_nonzero(a.view(bits) != b.view(bits))), a.size


def _row_by_row_fa(desc: str) -> bool:
    """FLASH_ATTN_EXT cases with F16 K/V that ggml walks row by row (see attention.py)."""
    fields = dict(kv.split("=", 1) for kv in desc.split(",") if "=" in kv and not kv.startswith("nr23"))
    return (fields.get("type_KV") == "f16" and int(fields["nb"]) < 64
            and not (int(fields["nb"]) == 1 and int(fields["kv"]) >= 512))


# (label, which of its cases): the ops and shapes whose x86 bits pyggml reproduces
BIT_EXACT = {
    "ROPE": lambda d: d.startswith("type=f32") and "ext_factor=1" not in d,
    "SOFT_MAX": lambda d: d.startswith("type=f32"),
    "SILU": lambda d: "transposed" not in d,
    "SWIGLU": lambda d: "[1,3,1,1]" not in d,
    "RMS_NORM": lambda d: d.startswith("type=f32"),
    "FLASH_ATTN_EXT": _row_by_row_fa,
    # the weight types whose rows follow ggml's AVX2 vec_dot (the type table's cols_x86 and reference_dot_x86; Q2_0's
    # x86 vec_dot is the generic one), src1 F32 quantized here; Q4_K and Q6_K from 8 columns in the order of
    # ggml-cpu's tiled matmul (tiled)
    "MUL_MAT": lambda d: "type_b=f32" in d
    and d.split(",type_b=")[0] in ("type_a=q8_0", "type_a=q4_0", "type_a=q4_1", "type_a=q5_0", "type_a=q4_K",
                                   "type_a=q6_K", "type_a=q1_0", "type_a=q2_0", "type_a=nvfp4", "type_a=tq2_0",
                                   "type_a=tq1_0"),
}


@pytest.mark.parametrize("label", sorted(BIT_EXACT))
def test_x86_ops_equal_libggml_bit_for_bit(label: str, ggml_reference: Backend) -> None:
    from pyggml.testing import op_check as T

    if host_numerics() != "x86":
        pytest.skip("libggml takes its x86 SIMD paths only on AVX2+FMA hosts")
    backend = cpu_init(1, numerics="x86")
    try:
        cases = [c for c in T.select(T.all_cases(), label) if BIT_EXACT[label](c.desc)]
        assert cases
        results = {c.desc: _bits_differ(c, backend, ggml_reference) for c in cases}
    finally:
        backend.free()
    assert {d: r for d, r in results.items() if r is not None and r[0]} == {}
    assert any(r is not None for r in results.values())


@pytest.mark.parametrize("numerics", NUMERICS_CHOICES)
def test_cpy_to_q8_0_rounds_by_the_setting(numerics: str, rng: np.random.Generator) -> None:
    """CPY (and SET_ROWS: the same from_float) to Q8_0: ggml-cpu's SIMD row under "x86", the reference row
    under "ref"; the crafted halves make them differ."""
    from pyggml.core import quants

    x = src1_rows(rng, 2, 64)
    ctx = new_ctx(4)
    q = ctx.new_tensor_2d(GGMLType.Q8_0, 64, 2)
    run(ctx.cpy(tensor(ctx, F32, x), q), ComputeParams(numerics=numerics))
    yq, yd, _, _ = quantize(GGMLType.Q8_0, x, numerics)
    got = q.numpy()[0, 0].reshape(2, 2, 34)
    np.testing.assert_array_equal(got[..., 2:].view(np.int8).reshape(2, 64), yq)
    np.testing.assert_array_equal(got[..., :2].copy().view(np.float16)[..., 0].astype(np.float32), yd)
    assert np.array_equal(got.reshape(2, -1), quants.from_float(GGMLType.Q8_0, x)) == (numerics == "ref")


def _max_left_to_right(row: np.ndarray) -> np.float32:
    """ggml_vec_max_f32: MAX(max, x) = max > x ? max : x, from -inf, left to right."""
    mx = np.float32(-np.inf)
    for x in row:
        mx = mx if mx > x else x
    return mx


@pytest.mark.parametrize("n", [0, 5, 16, 37, 256])
def test_row_max_is_ggml_max(n: int, rng: np.random.Generator) -> None:
    """SOFT_MAX's row maximum in 16 lanes equals ggml's left-to-right MAX, NaN behaviour included (a NaN is
    forgotten by the next value unless it comes last), and -inf rows and signed zeros."""
    from pyggml.backends.cpu.kernels.simd_math import row_max

    rows = [rng.standard_normal(n).astype(np.float32), np.full(n, -np.inf, np.float32),
            np.zeros(n, np.float32) * np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)]
    if n:
        for at in {0, n // 2, n - 1}:
            r = rng.standard_normal(n).astype(np.float32)
            r[at] = np.nan
            rows.append(r)
    for row in rows:
        got, want = row_max(row, n), _max_left_to_right(row)
        assert (np.isnan(got) and np.isnan(want)) or got == want, (row, got, want)
    assert np.isnan(row_max(np.array([1, 2, np.nan], np.float32), 3))  # last: MAX keeps it
    assert row_max(np.array([np.nan, 1, 2], np.float32), 3) == 2  # earlier: forgotten
