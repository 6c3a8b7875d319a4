"""CPU MUL_MAT and OUT_PROD kernels against references written here, apart from the kernels.

Weights are dequantized with the gguf package; src1 is converted to the weight
type's vec_dot_type (f16/bf16 rounding, or q8_0/q8_1/q8_K quantize then
dequantize, written below after ggml's reference code) and the product is
taken in float64 with numpy. The kernels must agree within ggml's MUL_MAT
NMSE threshold (5e-4) and, since they do ggml's exact block arithmetic, far
more tightly: only float rounding may differ.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from kernel_helpers import BF16, F16, F32, bf16_bits, bf16_values, compile_node, new_ctx, permuted, run, tensor

from pyggml.backends.cpu.kernels import ComputeParams, matmul
from pyggml.backends.cpu.kernels.vec_dot import kinds, quantize_src1
from pyggml.backends.cpu.numerics import ENV_NUMERICS
from pyggml.core.context import Context
from pyggml.core.errors import GGMLError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

Q = GGMLType
QUANT = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ALL = [F32, F16, BF16] + QUANT
GGUF_QUANTIZES = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
# byte offsets of the f16 scale fields in each block (random bytes elsewhere are valid values)
SCALE_FIELDS = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}

NMSE_MAX = 5e-4  # ggml's test-backend-ops threshold for MUL_MAT
TIGHT = 2e-6  # max |error| / max |reference|: float rounding only


@pytest.fixture(autouse=True)
def _reference_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The references below quantize src1 as ggml's reference C: the kernels too (numerics "ref"; the
    "x86" setting has its own references in test_numerics.py)."""
    monkeypatch.setenv(ENV_NUMERICS, "ref")


# --- references ---


def roundf(v: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero (in float64, where |v| + 0.5 is exact)."""
    v = np.asarray(v, dtype=np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def q8_1_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q8_1_ref per block of 32: quants q, d rounded to f16, and s = f16(sum(q) * d) from the
    unrounded d (today's block_q8_1: d and s are ggml_half)."""
    b = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf(b * inv).astype(np.float32)
    s = (q.sum(axis=1, keepdims=True) * d).astype(np.float16).astype(np.float32)
    return q, d.astype(np.float16).astype(np.float32), s


def q8_1_values(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_1_ref then dequantize: q * f16(d)."""
    q, d, _ = q8_1_parts(x)
    return (q * d).reshape(x.shape)


def q8_1_min_term(wtype: GGMLType, stored: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What ggml's Q4_1/Q5_1 dot adds beyond dequantized weights times q8_1_values: m * (s - d * sum(q)) per
    block (stored: raw weight blocks (..., M, row bytes), m the f16 at byte 2 of each block)."""
    q, d, s = q8_1_parts(x)
    corr = (s - d * q.sum(axis=1, keepdims=True)).reshape(x.shape[:-1] + (-1,)).astype(np.float64)
    size = TYPE_TRAITS[wtype].type_size
    m = stored.reshape(stored.shape[:-1] + (-1, size))[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return reference(m, corr)


def q8_K_values(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref (iscale = -127/max, nearest_int, MIN 127; -128/max until 2024) then dequantize."""
    b = x.astype(np.float32).reshape(-1, 256)
    first = np.argmax(np.abs(b), axis=1)  # first index of the largest |x|, as ggml's strict '>'
    vmax = b[np.arange(b.shape[0]), first][:, None]
    out = np.zeros_like(b)
    nz = vmax[:, 0] != 0
    iscale = (np.float32(-127) / vmax[nz]).astype(np.float32)
    q = np.minimum(127, np.rint((iscale * b[nz]).astype(np.float32)))
    out[nz] = q.astype(np.float32) * (np.float32(1) / iscale)
    return out.reshape(x.shape)


def q8_0_values(x: np.ndarray) -> np.ndarray:
    flat = x.astype(np.float32).reshape(-1, x.shape[-1])
    return gguf.quants.dequantize(gguf.quants.quantize(flat, GGMLQuantizationType.Q8_0),
                                  GGMLQuantizationType.Q8_0).reshape(x.shape)


def src1_as_vec_dot(wtype: GGMLType, x: np.ndarray) -> np.ndarray:
    """The values ggml multiplies the weights by: src1 converted to the weight type's vec_dot_type."""
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    if vdt == F32:
        return x.astype(np.float32)
    if vdt == F16:
        return x.astype(np.float16).astype(np.float32)
    if vdt == BF16:
        return bf16_values(bf16_bits(x))
    return {Q.Q8_0: q8_0_values, Q.Q8_1: q8_1_values, Q.Q8_K: q8_K_values}[vdt](x)


def random_weights(wtype: GGMLType, shape: tuple[int, ...], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(stored form, float32 values) of a weight tensor; shape in numpy order (..., M, K)."""
    values = rng.standard_normal(shape).astype(np.float32)
    if wtype == F32:
        return values, values
    if wtype == F16:
        h = values.astype(np.float16)
        return h, h.astype(np.float32)
    if wtype == BF16:
        bits = bf16_bits(values)
        return bits, bf16_values(bits)
    qt = GGMLQuantizationType(int(wtype))
    flat = values.reshape(-1, shape[-1])
    if wtype in GGUF_QUANTIZES:
        raw = gguf.quants.quantize(flat, qt)
    else:
        bs, ts = TYPE_TRAITS[wtype].blck_size, TYPE_TRAITS[wtype].type_size
        blocks = rng.integers(0, 256, (flat.shape[0], shape[-1] // bs, ts), dtype=np.uint8)
        for off in SCALE_FIELDS[wtype]:
            d = rng.uniform(0.002, 0.02, blocks.shape[:2]).astype(np.float16)
            blocks[:, :, off:off + 2] = d.view(np.uint8).reshape(blocks.shape[:2] + (2,))
        raw = blocks.reshape(flat.shape[0], -1)
    deq = gguf.quants.dequantize(raw, qt)
    return raw.reshape(shape[:-1] + (-1,)), deq.reshape(shape)


def reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """MUL_MAT in float64: w (ne03, ne02, M, K), x (ne13, ne12, N, K) -> (ne13, ne12, N, M), ggml broadcasting."""
    r3, r2 = x.shape[0] // w.shape[0], x.shape[1] // w.shape[1]
    out = np.zeros(x.shape[:3] + (w.shape[2],))
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            out[i3, i2] = x[i3, i2].astype(np.float64) @ w[i3 // r3, i2 // r2].T.astype(np.float64)
    return out


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sum((got - want) ** 2) / max(np.sum(want ** 2), 1e-30))


def assert_matches(got: np.ndarray, want: np.ndarray, tight: float = TIGHT) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got))
    assert nmse(got, want) < NMSE_MAX
    rel = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert rel < tight, rel


# --- building nodes ---


def weight_tensor(ctx: Context, wtype: GGMLType, stored: np.ndarray, name: str = "w") -> Tensor:
    """A contiguous weight tensor (numpy order (ne3, ne2, M, K)) holding `stored` (raw blocks for quantized)."""
    shape = stored.shape
    k = shape[-1] if not TYPE_TRAITS[wtype].is_quantized else (
        shape[-1] // TYPE_TRAITS[wtype].type_size * TYPE_TRAITS[wtype].blck_size)
    t = ctx.new_tensor(wtype, [k] + list(shape[:-1][::-1]))
    t.set_name(name)
    t.numpy()[...] = stored.reshape(t.numpy().shape)
    return t


def permuted_weights(ctx: Context, wtype: GGMLType, stored: np.ndarray) -> Tensor:
    """A weight tensor (numpy order (ne3, ne2, M, K)) made by permuting dims 1 and 2 of a contiguous one."""
    base = weight_tensor(ctx, wtype, np.ascontiguousarray(np.swapaxes(stored, 1, 2)), "w.base")
    return ctx.permute(base, 0, 2, 1, 3)


def src1_tensor(ctx: Context, x: np.ndarray, layout: str) -> Tensor:
    """F32 src1 holding x (numpy order (ne3, ne2, N, K)), contiguous, transposed (via cont'd base) or permuted."""
    if layout == "contiguous":
        return tensor(ctx, F32, x, "x")
    if layout == "permuted":
        return permuted(ctx, F32, x, "x")
    # a view whose rows are strided: K^T of a contiguous (K, N) tensor, as ggml_transpose
    base = tensor(ctx, F32, np.ascontiguousarray(np.swapaxes(x, -1, -2)), "x.base")
    t = ctx.transpose(base)
    assert not t.is_contiguous()
    return t


CASES = {
    # name: (M, K, N, (ne03, ne02), (ne13, ne12), src1 layout)
    "matvec": (48, 512, 1, (1, 1), (1, 1), "contiguous"),
    "n8": (40, 512, 8, (1, 1), (1, 1), "contiguous"),
    "n33-blas": (40, 512, 33, (1, 1), (1, 1), "contiguous"),
    "broadcast": (24, 256, 3, (1, 2), (2, 4), "contiguous"),
    "transposed-src1": (32, 256, 5, (1, 1), (1, 1), "transposed"),
    "permuted": (16, 256, 4, (1, 3), (1, 3), "permuted"),
    "k96": (32, 96, 2, (1, 1), (1, 1), "contiguous"),
}


# every type with every case, except K=96 for the K-quants (rows must be whole 256-element blocks)
MUL_MAT_PARAMS = [(t, c) for t in ALL for c in CASES if CASES[c][1] % TYPE_TRAITS[t].blck_size == 0]


@pytest.mark.parametrize(("wtype", "case"), MUL_MAT_PARAMS)
def test_mul_mat(wtype: GGMLType, case: str, rng: np.random.Generator) -> None:
    M, K, N, (ne03, ne02), (ne13, ne12), layout = CASES[case]
    ctx = new_ctx(64)
    stored, wvals = random_weights(wtype, (ne03, ne02, M, K), rng)
    w = permuted_weights(ctx, wtype, stored) if layout == "permuted" else weight_tensor(ctx, wtype, stored)
    x = rng.standard_normal((ne13, ne12, N, K)).astype(np.float32)
    node = ctx.mul_mat(w, src1_tensor(ctx, x, layout))
    assert matmul.supports(node)
    got = run(node)
    want = reference(wvals, src1_as_vec_dot(wtype, x))
    if TYPE_TRAITS[wtype].vec_dot_type == Q.Q8_1:
        want += q8_1_min_term(wtype, stored, x)
    assert_matches(got, want)


@pytest.mark.parametrize("wtype", [Q.Q4_0, Q.Q8_0])
@pytest.mark.parametrize("n", [1, 8, 33])
def test_q4_0_q8_0_exact_block_arithmetic(wtype: GGMLType, n: int, rng: np.random.Generator) -> None:
    """ggml's vec_dot: integer block sums scaled by f16 scales; only float rounding may differ (~1e-6)."""
    ctx = new_ctx(64)
    stored, wvals = random_weights(wtype, (1, 1, 64, 1024), rng)
    x = rng.standard_normal((1, 1, n, 1024)).astype(np.float32)
    got = run(ctx.mul_mat(weight_tensor(ctx, wtype, stored), tensor(ctx, F32, x)))
    want = reference(wvals, q8_0_values(x))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-6
    # per element too: every output within a few float32 rounding steps of its own magnitude scale
    assert np.all(np.abs(got - want) <= 1e-6 * np.abs(want).max())


@pytest.mark.parametrize("wtype", [Q.Q4_1, Q.Q5_0, Q.Q5_1, F32])
def test_exact_and_blas_paths_agree(wtype: GGMLType, rng: np.random.Generator,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The same product through the direct kernels and through dequantized tiles + BLAS (several tiles)."""
    K = 512
    stored, _ = random_weights(wtype, (1, 1, 50, K), rng)
    x = rng.standard_normal((1, 1, 12, K)).astype(np.float32)
    results = []
    for min_cols, tile_bytes in ((10**9, matmul.TILE_BYTES), (1, 4 * K * 16)):
        monkeypatch.setattr(matmul, "BLAS_MIN_COLS", min_cols)
        monkeypatch.setattr(matmul, "F32_BLAS_MIN_COLS", min_cols)
        monkeypatch.setattr(matmul, "TILE_BYTES", tile_bytes)  # 16 rows per tile: 50 rows take 4 tiles
        ctx = new_ctx(32)
        results.append(run(ctx.mul_mat(weight_tensor(ctx, wtype, stored), tensor(ctx, F32, x))))
    assert nmse(results[1], results[0]) < 1e-11


@pytest.mark.parametrize("wtype", [Q.Q4_0, Q.Q4_K, F16, BF16, F32])
@pytest.mark.parametrize(("M", "N"), [(100, 3), (1000, 1), (200, 1)])
def test_thread_counts_give_identical_results(wtype: GGMLType, M: int, N: int, rng: np.random.Generator) -> None:
    """Rows split in work items the 2 and 3 threads take: decode columns and a few, rows not a multiple of it."""
    stored, _ = random_weights(wtype, (1, 1, M, 256), rng)
    x = rng.standard_normal((1, 1, N, 256)).astype(np.float32)
    got = []
    for n_threads in (1, 2, 3):
        ctx = new_ctx(16)
        got.append(run(ctx.mul_mat(weight_tensor(ctx, wtype, stored), tensor(ctx, F32, x)),
                       ComputeParams(n_threads=n_threads)))
    assert np.any(got[0] != 0)
    for other in got[1:]:  # each output is one row's dot: chunking cannot change it
        np.testing.assert_array_equal(got[0], other)


def test_f32_weights_take_ggml_s_float_orders(rng: np.random.Generator) -> None:
    """F32 weights as ggml-cpu: llamafile's tinyBLAS where llamafile_sgemm takes the product (2+ columns of a
    contiguous src1, K a multiple of its step, rows a multiple of 4), else ggml_vec_dot_f32's rows (with a tail after
    the last whole step here: K = 100); "ref" the generic loop. Each close to the float64 product."""
    from pyggml.backends.cpu.kernels.vec_dot import half_orders as ho
    from pyggml.backends.cpu.kernels.vec_dot.kinds import F32 as F32_KIND

    def order(x86: bool, n: int, M: int, K: int, gemm: bool) -> str:
        return ho.order_of_kind(ho.half_kind(F32_KIND, x86, "avx512", n, M, K, gemm)).name

    assert order(True, 1, 40, 128, True) == "vec_dot_f32_avx512"
    assert order(True, 8, 40, 128, True) == "tinyblas_avx512"
    assert order(True, 8, 40, 100, True) == order(True, 8, 42, 128, True) == "vec_dot_f32_avx512"
    assert order(True, 8, 40, 128, False) == "vec_dot_f32_avx512"  # src1 not contiguous
    assert order(False, 8, 40, 128, True) == "generic"
    ctx = new_ctx(16)
    K = 100
    w = tensor(ctx, F32, rng.standard_normal((1, 1, 40, K)).astype(np.float32))
    for n in (1, 31, 32):
        x = rng.standard_normal((1, 1, n, K)).astype(np.float32)
        node = ctx.mul_mat(w, tensor(ctx, F32, x))
        for numerics in ("x86", "ref"):
            compile_node(node, ComputeParams(n_threads=2, numerics=numerics))()
            want = x[0, 0].astype(np.float64) @ w.numpy()[0, 0].astype(np.float64).T
            np.testing.assert_allclose(node.numpy()[0, 0], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q5_1, Q.Q4_K, F16, BF16])
def test_src1_already_in_vec_dot_type(wtype: GGMLType, rng: np.random.Generator) -> None:
    """src1 given in the vec_dot_type (ggml skips the conversion): Q8_0/Q8_1/Q8_K blocks, F16, BF16."""
    vdt = TYPE_TRAITS[wtype].vec_dot_type
    ctx = new_ctx(32)
    K, N = 512, 3
    stored, wvals = random_weights(wtype, (1, 1, 20, K), rng)
    x = rng.standard_normal((1, 1, N, K)).astype(np.float32)
    b = ctx.new_tensor(vdt, [K, N])
    if vdt == F16:
        b.numpy()[...] = x.astype(np.float16)
    elif vdt == BF16:
        b.numpy()[...] = bf16_bits(x)
    elif vdt == Q.Q8_0:
        b.numpy()[...] = gguf.quants.quantize(x[0, 0], GGMLQuantizationType.Q8_0)
    else:
        # Q8_1 / Q8_K blocks through the kernels' own quantizer (checked bit-exact in test_quantize_rows_*)
        nb = K // TYPE_TRAITS[vdt].blck_size
        yq, yd, ys, yb = (np.zeros((N, K), np.int8), np.zeros((N, nb), np.float32),
                          np.zeros((N, nb), np.float32), np.zeros((N, K // 16), np.int32))
        quantize_src1.quantize_rows(int(vdt), x[0, 0].copy(), yq, yd, ys, yb, quantize_src1.ROUND_REF)
        if vdt == Q.Q8_1:
            blocks = np.zeros((N, nb), matmul._Q8_DTYPES[vdt])
            blocks["d"], blocks["s"], blocks["qs"] = yd, ys, yq.reshape(N, nb, 32)
        else:
            blocks = np.zeros((N, nb), matmul._Q8_DTYPES[vdt])
            blocks["d"], blocks["qs"] = yd, yq.reshape(N, nb, 256)
            blocks["bsums"] = yb.reshape(N, nb, 16)
        b.numpy()[...] = blocks.view(np.uint8).reshape(1, 1, N, -1)
    node = ctx.mul_mat(weight_tensor(ctx, wtype, stored), b)
    assert matmul.supports(node)
    want = reference(wvals, src1_as_vec_dot(wtype, x))
    if vdt == Q.Q8_1:
        want += q8_1_min_term(wtype, stored, x)
    assert_matches(run(node), want)


def test_prepared_kernel_reads_inputs_at_compute_time(rng: np.random.Generator) -> None:
    ctx = new_ctx(16)
    stored, wvals = random_weights(Q.Q4_0, (1, 1, 16, 64), rng)
    w = weight_tensor(ctx, Q.Q4_0, stored)
    b = tensor(ctx, F32, np.zeros((2, 64), np.float32))
    node = ctx.mul_mat(w, b)
    fn = compile_node(node)
    for _ in range(2):
        x = rng.standard_normal((1, 1, 2, 64)).astype(np.float32)
        b.numpy()[...] = x
        stored2, wvals = random_weights(Q.Q4_0, (1, 1, 16, 64), rng)
        w.numpy()[...] = stored2
        fn()
        assert_matches(node.numpy().copy(), reference(wvals, q8_0_values(x)))


# --- the src1 quantizers, bit for bit ---


def test_quantize_rows_q8_0_is_ggml_reference(rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 256)).astype(np.float32) * 3
    x[0, :32] = 0  # an all-zero block
    x[1, :32] = np.arange(32) - 15.5  # halves after scaling: roundf rounds them away from zero
    yq, yd, ys, yb = (np.zeros((5, 256), np.int8), np.zeros((5, 8), np.float32), np.zeros((5, 8), np.float32),
                      np.zeros((5, 16), np.int32))
    quantize_src1.quantize_rows(int(Q.Q8_0), x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
    want = gguf.quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(5, 8, 34)
    np.testing.assert_array_equal(yq.reshape(5, 8, 32), want[:, :, 2:].view(np.int8))
    np.testing.assert_array_equal(yd, want[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32))
    np.testing.assert_array_equal(yb, yq.reshape(5, 16, 16).sum(-1))


def test_quantize_rows_q8_1_and_q8_K_are_ggml_reference(rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 512)) * 2).astype(np.float32)
    x[2, 256:] = 0  # an all-zero super-block
    x[1, 7], x[1, 9] = 50.0, -50.0  # the first extreme maps to -127 (-128 until 2024), its opposite to 127
    for vdt, values, nb in ((Q.Q8_1, q8_1_values, 16), (Q.Q8_K, q8_K_values, 2)):
        yq, yd, ys, yb = (np.zeros((3, 512), np.int8), np.zeros((3, nb), np.float32),
                          np.zeros((3, nb), np.float32), np.zeros((3, 32), np.int32))
        quantize_src1.quantize_rows(int(vdt), x, yq, yd, ys, yb, quantize_src1.ROUND_REF)
        bs = 512 // nb
        got = (yq.reshape(3, nb, bs).astype(np.float32) * yd[:, :, None]).reshape(3, 512)
        np.testing.assert_array_equal(got, values(x))
        np.testing.assert_array_equal(yb, yq.reshape(3, 32, 16).astype(np.int32).sum(-1))
        if vdt == Q.Q8_1:
            _, d16, s16 = q8_1_parts(x)
            np.testing.assert_array_equal(yd, d16.reshape(3, nb))
            np.testing.assert_array_equal(ys, s16.reshape(3, nb))
    assert yq[1, 7] == -127 and yq[1, 9] == 127


def test_quantize_rows_q8_K_vector_passes_match_the_block_by_block_quantizer(rng: np.random.Generator) -> None:
    """The row quantizer's vectorized passes against its value-by-value block path (quantize_row_q8_K_ref's loop),
    bit for bit, on ties of magnitude, infinities, NaNs and zero blocks."""
    x = (rng.standard_normal((6, 1024)) * 3).astype(np.float32)
    x[0, 5], x[0, 7] = 100.0, -100.0  # the first of the largest magnitudes sets the sign
    x[1, 9], x[1, 3] = -100.0, 100.0
    x[2, 300] = np.inf
    x[3, 10], x[3, 600] = np.nan, -np.inf  # a NaN block, and an infinite one
    x[4, :256] = -0.0
    x[5, 256:512] = np.nan
    shapes = (((6, 1024), np.int8), ((6, 4), np.float32), ((6, 4), np.float32), ((6, 64), np.int32))
    yq, yd, ys, yb = (np.full(shape, 7, dtype) for shape, dtype in shapes)
    quantize_src1.quantize_rows(int(Q.Q8_K), x, yq, yd, ys, yb, quantize_src1.ROUND_X86)
    wq, wd, wb = (np.full(shape, 7, dtype) for shape, dtype in (shapes[0], shapes[1], shapes[3]))
    for r in range(6):
        for b in range(4):
            quantize_src1._quantize_q8_K_block_scalar(x, wq, wd, wb, r, b)
    np.testing.assert_array_equal(yq, wq)
    np.testing.assert_array_equal(yd.view(np.uint32), wd.view(np.uint32))
    np.testing.assert_array_equal(yb, wb)
    assert yq[0, 5] == -127 and yq[0, 7] == 127 and yq[1, 3] == -127 and yq[1, 9] == 127


def test_round_rows_to_f16_and_bf16(rng: np.random.Generator) -> None:
    x = (rng.standard_normal(1000) * 100).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf]
    h = x.copy()
    quantize_src1.round_rows(kinds.F16, h)
    np.testing.assert_array_equal(h, x.astype(np.float16).astype(np.float32))
    b = x.copy()
    quantize_src1.round_rows(kinds.BF16, b)
    np.testing.assert_array_equal(b[3:], bf16_values(bf16_bits(x[3:])))
    assert np.isnan(b[0]) and b[1] == np.inf and b[2] == -np.inf


# --- OUT_PROD ---


def out_prod_reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """w (ne03, ne02, K, ne00), x (ne13, ne12, K, ne10), ne12 and ne13 multiples of w's -> (ne13, ne12, ne10,
    ne00)."""
    r3, r2 = x.shape[0] // w.shape[0], x.shape[1] // w.shape[1]
    out = np.zeros((x.shape[0], x.shape[1], x.shape[3], w.shape[3]))
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            out[i3, i2] = x[i3, i2].T.astype(np.float64) @ w[i3 // r3, i2 // r2].astype(np.float64)
    return out


@pytest.mark.parametrize("wtype", ALL)
@pytest.mark.parametrize("layout", ["contiguous", "broadcast", "broadcast_dim2", "permuted"])
def test_out_prod(wtype: GGMLType, layout: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    ne00 = 256
    K, ne10 = 20, 7
    dims = {"contiguous": ((1, 2), (1, 2)), "broadcast": ((1, 2), (3, 2)), "broadcast_dim2": ((1, 2), (2, 6)),
            "permuted": ((1, 3), (1, 3))}
    w_dims, x_dims = dims[layout]
    monkeypatch.setattr(matmul, "TILE_BYTES", 4 * ne00 * 8)  # 8 rows per tile: K=20 takes 3, summed
    ctx = new_ctx(32)
    stored, wvals = random_weights(wtype, w_dims + (K, ne00), rng)
    x = rng.standard_normal(x_dims + (K, ne10)).astype(np.float32)
    a = weight_tensor(ctx, wtype, stored)
    b = permuted(ctx, F32, x, "x") if layout == "permuted" else tensor(ctx, F32, x, "x")
    node = ctx.out_prod(a, b)
    assert node.op == GGMLOp.OUT_PROD and matmul.supports(node)
    assert_matches(run(node), out_prod_reference(wvals, x))


@pytest.mark.parametrize("wtype", [F32, F16, Q.Q4_0])
@pytest.mark.parametrize("xtype", [F16, BF16])
def test_out_prod_half_src1(wtype: GGMLType, xtype: GGMLType, rng: np.random.Generator) -> None:
    ctx = new_ctx(16)
    stored, wvals = random_weights(wtype, (1, 2, 6, 64), rng)
    x = rng.standard_normal((1, 2, 6, 5)).astype(np.float32)
    b = tensor(ctx, xtype, x)
    xs = x.astype(np.float16).astype(np.float32) if xtype == F16 else bf16_values(bf16_bits(x))
    assert_matches(run(ctx.out_prod(weight_tensor(ctx, wtype, stored), b)), out_prod_reference(wvals, xs))


# --- what is (not) supported ---


def _node(ctx: Context, op: GGMLOp, a: Tensor, b: Tensor, ne: list[int], dtype: GGMLType = F32) -> Tensor:
    out = ctx.new_tensor(dtype, ne)
    out.op = op
    out.src[0], out.src[1] = a, b
    return out


def test_supports_follows_ggml_types() -> None:
    ctx = new_ctx(4)
    for wtype in ALL:
        assert matmul.supports(ctx.mul_mat(ctx.new_tensor_2d(wtype, 256, 4), ctx.new_tensor_2d(F32, 256, 2)))
        vdt = TYPE_TRAITS[wtype].vec_dot_type
        assert matmul.supports(ctx.mul_mat(ctx.new_tensor_2d(wtype, 256, 4), ctx.new_tensor_2d(vdt, 256, 2)))
    # Q8_1 and Q8_K have no vec_dot in ggml: only dot-product partners
    for wtype in (Q.Q8_1, Q.Q8_K, Q.I32):
        assert not matmul.supports(ctx.mul_mat(ctx.new_tensor_2d(wtype, 256, 4), ctx.new_tensor_2d(F32, 256, 2)))
    # src1 must be F32 or the weights' vec_dot_type
    assert not matmul.supports(ctx.mul_mat(ctx.new_tensor_2d(Q.Q4_0, 256, 4), ctx.new_tensor_2d(F16, 256, 2)))
    assert not matmul.supports(ctx.mul_mat(ctx.new_tensor_2d(F32, 256, 4), ctx.new_tensor_2d(F16, 256, 2)))
    # dst must be F32
    a, b = ctx.new_tensor_2d(F16, 32, 4), ctx.new_tensor_2d(F32, 32, 2)
    assert not matmul.supports(_node(ctx, GGMLOp.MUL_MAT, a, b, [4, 2], F16))
    # OUT_PROD: src1 F32/F16/BF16, src0 any type with rows, broadcast over src1's dims 2 and 3
    a, b = ctx.new_tensor_3d(Q.Q4_K, 256, 6, 2), ctx.new_tensor_3d(F32, 5, 6, 2)
    assert matmul.supports(ctx.out_prod(a, b))
    assert not matmul.supports(ctx.out_prod(ctx.new_tensor_2d(F32, 8, 6), ctx.new_tensor_2d(Q.Q8_0, 32, 6)))
    node = ctx.out_prod(ctx.new_tensor_3d(F32, 8, 6, 1), ctx.new_tensor_3d(F32, 5, 6, 2))
    assert node.ne == [8, 5, 2, 1] and matmul.supports(node)  # ggml's dst takes src1's ne2
    node.ne[2] = 1
    assert not matmul.supports(node)


def test_unsupported_node_raises_naming_op_and_types() -> None:
    ctx = new_ctx(4)
    node = ctx.mul_mat(ctx.new_tensor_2d(Q.Q8_K, 256, 4), ctx.new_tensor_2d(F32, 256, 2))
    node.set_name("logits")
    with pytest.raises(UnsupportedTypeError, match=r"MUL_MAT 'logits'.*Q8_K"):
        compile_node(node)
    node = ctx.mul_mat(ctx.new_tensor_2d(Q.Q4_0, 256, 4), ctx.new_tensor_2d(F16, 256, 2))
    with pytest.raises(GGMLError, match=r"F16.*F32 or Q8_0"):
        compile_node(node)
