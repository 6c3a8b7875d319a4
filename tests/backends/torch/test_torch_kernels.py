"""Torch kernels against numpy references written here, the MUL_MAT weight policy and its cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyggml.backends.torch import TorchBackend, torch_init
from pyggml.backends.torch.kernels.matmul import HALF_NATIVE_MAX_COLS, product_dtype
from pyggml.backends.torch.precision import PRECISION_DTYPES
from pyggml.core.context import Context
from pyggml.core.errors import OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp
from pyggml.core.types import GGMLType, from_float, to_float
from pyggml.ggml_backend import tensor_get_numpy, tensor_set, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors

F32, F16, BF16, I32, Q8_0, Q4_0 = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q8_0,
                                   GGMLType.Q4_0)


def _graph(ctx: Context, *outs: Tensor) -> Graph:
    g = ctx.new_graph()
    for t in outs:
        g.build_forward_expand(t)
    return g


def _ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def _quantized_values(type: GGMLType, w: np.ndarray) -> np.ndarray:
    """What a quantized weight holds: `w` quantized with ggml's reference and dequantized (f64)."""
    return np.asarray(to_float(type, from_float(type, w.astype(np.float32))), dtype=np.float64).reshape(w.shape)


# --- independent references ---


def test_mul_mat_broadcasts_src0_over_consecutive_src1_matrices(rng: np.random.Generator) -> None:
    """GQA: src0 [k, m, 2, 1] against src1 [k, n, 4, 3] -> src0 matrix i2 // 2 for src1 matrix i2 (not i2 % 2)."""
    tb = torch_init()
    ctx = _ctx()
    a = ctx.new_tensor_4d(F32, 8, 5, 2, 1).set_name("a")
    b = ctx.new_tensor_4d(F32, 8, 3, 4, 3).set_name("b")
    out = ctx.mul_mat(a, b)
    alloc_ctx_tensors(ctx, tb)
    av = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    bv = rng.standard_normal((3, 4, 3, 8)).astype(np.float32)
    tensor_set_numpy(a, av)
    tensor_set_numpy(b, bv)
    tb.graph_compute(_graph(ctx, out))
    want = np.einsum("zinx,zimx->zinm", bv.astype(np.float64), np.repeat(av, 2, axis=1)[[0, 0, 0]])
    assert np.allclose(tensor_get_numpy(out), want, rtol=1e-5, atol=1e-5)


# --- MUL_MAT under each matmul precision (set explicitly: the same checks on every CPU) ---

# max |got - want| / max |want| that each product dtype allows (measured worst over 30 seeds: f32 5e-7,
# f16 1.1e-3, bf16 8e-3 for 64-long dot products of normal values)
PRODUCT_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
PRECISIONS = ["f32", "f16", "bf16"]
NATIVE = HALF_NATIVE_MAX_COLS - 1  # the most src1 columns still multiplied in a half weight's own type
WIDE = HALF_NATIVE_MAX_COLS + 3


def _held_in(values: np.ndarray, dtype: torch.dtype) -> bool:
    """Whether every value is exactly a `dtype` number (a product formed in dtype, then widened into dst)."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return bool(torch.equal(t.to(dtype).to(torch.float32), t))


def _assert_formed_in(got: np.ndarray, dtype: torch.dtype) -> None:
    """The result was rounded to `dtype` and to nothing narrower (f16 holds every bf16 number of this range)."""
    assert _held_in(got, dtype), f"the result is not rounded to {dtype}"
    narrower = {torch.float32: torch.float16, torch.float16: torch.bfloat16}.get(dtype)
    if narrower is not None:
        assert not _held_in(got, narrower), f"the result is rounded to {narrower}, not formed in {dtype}"


@pytest.mark.parametrize("wtype, n_cols, precision, want", [
    (F32, 1, "bf16", torch.float32), (F32, WIDE, "f16", torch.float32),
    *[(w, n, "f32", torch.float32) for w in (F16, BF16, Q8_0, Q4_0) for n in (1, WIDE)],
    (BF16, 1, "bf16", torch.bfloat16), (BF16, WIDE, "bf16", torch.bfloat16),
    (F16, 1, "bf16", torch.float16), (F16, NATIVE, "bf16", torch.float16), (F16, WIDE, "bf16", torch.float32),
    (F16, 1, "f16", torch.float16), (F16, WIDE, "f16", torch.float16),
    (BF16, NATIVE, "f16", torch.bfloat16), (BF16, WIDE, "f16", torch.float32),
    (Q8_0, 1, "bf16", torch.bfloat16), (Q4_0, WIDE, "bf16", torch.bfloat16),
    (Q8_0, WIDE, "f16", torch.float16), (Q4_0, 1, "f16", torch.float16),
])
def test_product_dtype_table(wtype: GGMLType, n_cols: int, precision: str, want: torch.dtype) -> None:
    """The rule of kernels.matmul's docstring, case by case."""
    assert product_dtype(wtype, n_cols, precision) == want


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("wtype", [F16, BF16])
@pytest.mark.parametrize("n_cols", [1, NATIVE, WIDE])
def test_mul_mat_half_weights_round_src1_to_the_weight_type(wtype: GGMLType, n_cols: int, precision: str,
                                                           rng: np.random.Generator) -> None:
    """Every path (native half, widened to f32) multiplies the weight's values by src1 rounded to the
    weight's type, as ggml; the result is formed in the dtype the precision gives, with its rounding."""
    tb = torch_init(matmul_precision=precision)
    ctx = _ctx()
    a = ctx.new_tensor_2d(wtype, 64, 6).set_name("w")
    b = ctx.new_tensor_2d(F32, 64, n_cols).set_name("x")
    out = ctx.mul_mat(a, b)
    alloc_ctx_tensors(ctx, tb)
    wv = rng.standard_normal((6, 64)).astype(np.float32)
    xv = rng.standard_normal((n_cols, 64)).astype(np.float32)
    tensor_set_numpy(a, wv)
    tensor_set_numpy(b, xv)
    tb.graph_compute(_graph(ctx, out))
    tdt = torch.float16 if wtype == F16 else torch.bfloat16
    w_held = torch.from_numpy(wv).to(tdt).double().numpy()
    x_rounded = torch.from_numpy(xv).to(tdt).double().numpy()
    want = x_rounded @ w_held.T
    got = tensor_get_numpy(out)
    cdt = product_dtype(wtype, n_cols, precision)
    assert np.abs(got - want).max() <= PRODUCT_TOL[cdt] * np.abs(want).max()
    _assert_formed_in(got, cdt)
    # a widened weight is kept in f32 by the cache; a native one is read as it is
    assert [e.value.dtype for e in tb.weight_cache.entries.values()] == ([] if cdt == tdt else [torch.float32])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("wtype", [Q8_0, Q4_0])
@pytest.mark.parametrize("n_cols", [1, 3, WIDE])
def test_mul_mat_quantized_weights_are_dequantized_exactly(wtype: GGMLType, n_cols: int, precision: str,
                                                          rng: np.random.Generator) -> None:
    """Dequantized exactly (ggml's arithmetic), then held in the precision's dtype: exact in f32, rounded
    in f16/bf16 (the cached weight has that dtype, and so has every product)."""
    tb = torch_init(matmul_precision=precision)
    assert tb.matmul_precision == precision
    ctx = _ctx()
    a = ctx.new_tensor_2d(wtype, 64, 4).set_name("w")
    b = ctx.new_tensor_2d(F32, 64, n_cols).set_name("x")
    out = ctx.mul_mat(a, b)
    alloc_ctx_tensors(ctx, tb)
    wv = rng.standard_normal((4, 64)).astype(np.float32)
    xv = rng.standard_normal((n_cols, 64)).astype(np.float32)
    tensor_set_numpy(a, wv)
    tensor_set_numpy(b, xv)
    tb.graph_compute(_graph(ctx, out))
    want = xv.astype(np.float64) @ _quantized_values(wtype, wv).T
    got = tensor_get_numpy(out)
    cdt = tb.matmul_dtype
    assert np.abs(got - want).max() <= PRODUCT_TOL[cdt] * np.abs(want).max()
    nmse = np.sum((got - want) ** 2) / np.sum(want**2)
    assert nmse < {"f32": 1e-12, "f16": 1e-6, "bf16": 1e-4}[precision]
    _assert_formed_in(got, cdt)
    assert [e.value.dtype for e in tb.weight_cache.entries.values()] == [cdt]


def test_rms_norm_soft_max_mask_rope_neox(rng: np.random.Generator) -> None:
    tb = torch_init()
    ctx = _ctx()
    x = ctx.new_tensor_3d(F32, 8, 3, 2).set_name("x")
    mask = ctx.new_tensor_2d(F32, 8, 3).set_name("mask")
    pos = ctx.new_tensor_1d(I32, 2).set_name("pos")
    norm = ctx.rms_norm(x, 1e-5)
    sm = ctx.soft_max_ext(x, mask, 0.5)
    rope = ctx.rope(x, pos, 4, 2)  # NeoX over the first 4 of 8 dims
    g = _graph(ctx, norm, sm, rope)
    alloc_ctx_tensors(ctx, tb)
    xv = rng.standard_normal((2, 3, 8)).astype(np.float32)
    mv = np.where(rng.random((3, 8)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mv[:, 0] = 0.0
    tensor_set_numpy(x, xv)
    tensor_set_numpy(mask, mv)
    tensor_set_numpy(pos, [3, 7])
    tb.graph_compute(g)
    x64 = xv.astype(np.float64)
    want_norm = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-5)
    assert np.allclose(tensor_get_numpy(norm), want_norm, rtol=1e-5, atol=1e-6)
    z = x64 * 0.5 + mv
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    assert np.allclose(tensor_get_numpy(sm), e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
    want_rope = x64.copy()
    for i2, p in enumerate([3, 7]):
        for k in range(2):
            ang = p * 10000.0 ** (-2 * k / 4)
            c, s = np.cos(ang), np.sin(ang)
            x0, x1 = x64[i2, :, k], x64[i2, :, k + 2]
            want_rope[i2, :, k], want_rope[i2, :, k + 2] = x0 * c - x1 * s, x0 * s + x1 * c
    assert np.allclose(tensor_get_numpy(rope), want_rope, rtol=1e-5, atol=1e-5)


def test_get_rows_quantized_and_bounds(rng: np.random.Generator) -> None:
    tb = torch_init()
    ctx = _ctx()
    a = ctx.new_tensor_2d(Q4_0, 64, 5).set_name("table")
    idx = ctx.new_tensor_1d(I32, 3).set_name("idx")
    out = ctx.get_rows(a, idx).set_name("rows")
    g = _graph(ctx, out)
    alloc_ctx_tensors(ctx, tb)
    av = rng.standard_normal((5, 64)).astype(np.float32)
    tensor_set_numpy(a, av)
    tensor_set_numpy(idx, [4, 0, 4])
    tb.graph_compute(g)
    assert np.array_equal(tensor_get_numpy(out), _quantized_values(Q4_0, av)[[4, 0, 4]].astype(np.float32))
    tensor_set_numpy(idx, [1, 5, 0])
    with pytest.raises(OutOfBoundsError, match="'rows': row index 5 outside \\[0, 5\\)"):
        tb.graph_compute(g)


def test_unary_and_in_place_add(rng: np.random.Generator) -> None:
    tb = torch_init()
    ctx = _ctx()
    x = ctx.new_tensor_2d(F32, 6, 4).set_name("x")
    y = ctx.new_tensor_1d(F32, 6).set_name("y")
    gelu = ctx.unary(x, UnaryOp.GELU)
    silu = ctx.unary(x, UnaryOp.SILU)
    relu = ctx.unary(x, UnaryOp.RELU)
    g = _graph(ctx, gelu, silu, relu)
    g.build_forward_expand(ctx.add_inplace(x, y))  # after the unaries read x
    alloc_ctx_tensors(ctx, tb)
    xv = rng.standard_normal((4, 6)).astype(np.float32)
    yv = rng.standard_normal(6).astype(np.float32)
    tensor_set_numpy(x, xv)
    tensor_set_numpy(y, yv)
    tb.graph_compute(g)
    x64 = xv.astype(np.float64)
    x16 = xv.astype(np.float16).astype(np.float64)  # GELU through f16, as ggml's table (|x| < 10 here)
    want_gelu = (0.5 * x16 * (1 + np.tanh(np.sqrt(2 / np.pi) * x16 * (1 + 0.044715 * x16**2)))).astype(np.float16)
    assert np.allclose(tensor_get_numpy(gelu), want_gelu, rtol=1e-3, atol=1e-6)
    assert np.allclose(tensor_get_numpy(silu), x64 / (1 + np.exp(-x64)), rtol=1e-5, atol=1e-6)
    assert np.array_equal(tensor_get_numpy(relu), np.maximum(xv, 0))
    assert np.allclose(tensor_get_numpy(x), xv + yv, rtol=1e-6)


# --- supports_op is exact ---


def test_supports_op_types() -> None:
    tb = torch_init()
    ctx = _ctx()
    f32 = ctx.new_tensor_2d(F32, 64, 4)
    assert tb.supports_op(ctx.mul_mat(ctx.new_tensor_2d(Q8_0, 64, 4), f32))
    assert tb.supports_op(ctx.mul_mat(ctx.new_tensor_2d(GGMLType.Q4_1, 64, 4), f32))  # host to_float
    assert not tb.supports_op(ctx.mul_mat(ctx.new_tensor_2d(GGMLType.Q8_K, 256, 4), ctx.new_tensor_2d(F32, 256, 4)))
    assert not tb.supports_op(ctx.mul_mat(ctx.new_tensor_2d(Q8_0, 64, 4), ctx.new_tensor_2d(F16, 64, 4)))
    assert tb.supports_op(ctx.mul_mat(ctx.new_tensor_2d(F16, 64, 4), ctx.new_tensor_2d(F16, 64, 4)))
    assert tb.supports_op(ctx.cpy(f32, ctx.new_tensor_2d(BF16, 64, 4)))
    assert not tb.supports_op(ctx.cpy(f32, ctx.new_tensor_2d(Q8_0, 64, 4)))
    assert tb.supports_op(ctx.get_rows(ctx.new_tensor_2d(GGMLType.Q5_0, 64, 4), ctx.new_tensor_1d(I32, 2)))
    assert not tb.supports_op(ctx.get_rows(ctx.new_tensor_2d(GGMLType.Q8_K, 256, 4), ctx.new_tensor_1d(I32, 2)))
    assert not tb.supports_op(ctx.unary(f32, UnaryOp.TANH))
    assert tb.supports_op(ctx.unary(f32, UnaryOp.SILU))
    assert not tb.supports_op(ctx.sub(f32, f32))
    assert tb.supports_op(ctx.view_1d(f32, 4, 0)) and tb.supports_op(ctx.transpose(f32))
    # mode 4 (2023's GLM) is no mode of today's ggml
    assert not tb.supports_op(ctx.rope(ctx.new_tensor_3d(F32, 8, 2, 3), ctx.new_tensor_1d(I32, 3), 8, 4))


def test_kernels_raise_their_error_classes() -> None:
    from pyggml.backends.torch.kernels.matmul import mul_mat_problem

    ctx = _ctx()
    node = ctx.mul_mat(ctx.new_tensor_2d(GGMLType.Q8_K, 256, 4), ctx.new_tensor_2d(F32, 256, 2))
    cls, reason = mul_mat_problem(node)  # type: ignore[misc]
    assert cls is UnsupportedTypeError and "Q8_K" in reason
    node = ctx.mul_mat(ctx.new_tensor_2d(F32, 8, 4), ctx.new_tensor_2d(F32, 8, 2))
    node.ne = [4, 3, 1, 1]
    cls, reason = mul_mat_problem(node)  # type: ignore[misc]
    assert cls is ShapeError and "dst ne" in reason


# --- the weight cache ---


def _matmul_setup(tb: TorchBackend, wtype: GGMLType, n_cols: int = 8, rng_seed: int = 0) -> tuple:
    rng = np.random.default_rng(rng_seed)
    ctx = _ctx()
    w = ctx.new_tensor_2d(wtype, 64, 4).set_name("w")
    x = ctx.new_tensor_2d(F32, 64, n_cols).set_name("x")
    out = ctx.mul_mat(w, x)
    buf = alloc_ctx_tensors(ctx, tb)
    wv = rng.standard_normal((4, 64)).astype(np.float32)
    xv = rng.standard_normal((n_cols, 64)).astype(np.float32)
    tensor_set_numpy(w, wv)
    tensor_set_numpy(x, xv)
    return ctx, buf, w, x, out, wv, xv


def _assert_product(got: np.ndarray, want: np.ndarray, dtype: torch.dtype) -> None:
    """`got` is `want` within what products formed in `dtype` allow (PRODUCT_TOL, relative to max |want|)."""
    assert np.abs(got - want).max() <= PRODUCT_TOL[dtype] * np.abs(want).max()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_weight_cache_converts_once_and_forgets_on_set(precision: str) -> None:
    tb = torch_init(matmul_precision=precision)
    cdt = tb.matmul_dtype
    ctx, buf, w, x, out, wv, xv = _matmul_setup(tb, Q8_0)
    plan = tb.graph_plan_create(_graph(ctx, out))
    cache = tb.weight_cache
    for _ in range(3):
        tb.graph_plan_compute(plan)
    assert (cache.misses, cache.hits, len(cache.entries)) == (1, 2, 1)
    _assert_product(tensor_get_numpy(out), xv @ _quantized_values(Q8_0, wv).T, cdt)
    # new weights through tensor_set: the cached dequantization must not be used
    wv2 = -2 * wv[::-1].copy()
    tensor_set_numpy(w, wv2)
    assert len(cache.entries) == 0
    tb.graph_plan_compute(plan)
    _assert_product(tensor_get_numpy(out), xv @ _quantized_values(Q8_0, wv2).T, cdt)
    # a partial write (one row's bytes) also invalidates; setting x (same buffer, other bytes) does not
    tensor_set_numpy(x, xv * 2)
    assert len(cache.entries) == 1
    row = np.asarray(from_float(Q8_0, np.full((1, 64), 0.5, np.float32)), dtype=np.uint8)
    tensor_set(w, row, offset=w.nb[1] * 2)
    assert len(cache.entries) == 0
    tb.graph_plan_compute(plan)
    wv3 = _quantized_values(Q8_0, wv2)
    wv3[2] = np.asarray(to_float(Q8_0, row), dtype=np.float64).ravel()  # 0.5 as Q8_0 holds it
    _assert_product(tensor_get_numpy(out), (2 * xv) @ wv3.T, cdt)
    buf.free()


def test_weight_cache_forgets_bytes_a_graph_writes() -> None:
    """A widened F16 weight is cached by one plan; another plan CPYs new values into it."""
    tb = torch_init(matmul_precision="f32")  # F16 weights widened to f32 (and cached)
    ctx, buf, w, x, out, wv, xv = _matmul_setup(tb, F16, n_cols=HALF_NATIVE_MAX_COLS + 4)
    src = ctx.new_tensor_2d(F32, 64, 4).set_name("src")
    write = ctx.cpy(src, w)
    buf2 = alloc_ctx_tensors(ctx, tb)
    use_w = tb.graph_plan_create(_graph(ctx, out))
    write_w = tb.graph_plan_create(_graph(ctx, write))
    tb.graph_plan_compute(use_w)
    assert len(tb.weight_cache.entries) == 1
    new = np.full((4, 64), 0.25, np.float32)
    tensor_set_numpy(src, new)
    tb.graph_plan_compute(write_w)
    assert len(tb.weight_cache.entries) == 0
    tb.graph_plan_compute(use_w)
    x_h = xv.astype(np.float16).astype(np.float64)
    assert np.allclose(tensor_get_numpy(out), x_h @ new.T, rtol=1e-5, atol=1e-5)
    buf.free()
    buf2.free()


def test_weight_a_plan_writes_is_converted_each_time() -> None:
    """CPY into an F16 weight and MUL_MAT with it in one graph: never from the cache (another plan filled it)."""
    tb = torch_init(matmul_precision="f32")  # F16 weights widened to f32 (and cached)
    ctx, buf, w, x, out, wv, xv = _matmul_setup(tb, F16, n_cols=HALF_NATIVE_MAX_COLS + 4)
    src = ctx.new_tensor_2d(F32, 64, 4).set_name("src")
    write = ctx.cpy(src, w)
    out2 = ctx.mul_mat(write, x).set_name("out2")
    buf2 = alloc_ctx_tensors(ctx, tb)
    plan = tb.graph_plan_create(_graph(ctx, out2))
    reader = tb.graph_plan_create(_graph(ctx, out))  # caches w as it is before each write
    x_h = xv.astype(np.float16).astype(np.float64)
    for k in (1.0, -3.0):
        tb.graph_plan_compute(reader)
        assert len(tb.weight_cache.entries) == 1
        tensor_set_numpy(src, np.full((4, 64), k, np.float32))
        tb.graph_plan_compute(plan)
        assert np.allclose(tensor_get_numpy(out2), x_h @ np.full((4, 64), k).T, rtol=1e-5)
    assert len(tb.weight_cache.entries) == 0
    buf.free()
    buf2.free()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_weight_cache_limit_and_buffer_free(precision: str) -> None:
    cdt = PRECISION_DTYPES[precision]
    one = 4 * 64 * cdt.itemsize  # bytes of one dequantized 4x64 weight in the precision's dtype
    tb = torch_init(weight_cache_bytes=one, matmul_precision=precision)
    ctx, buf, w, x, out, wv, xv = _matmul_setup(tb, Q8_0)
    w2 = ctx.new_tensor_2d(Q8_0, 64, 4).set_name("w2")
    out2 = ctx.mul_mat(w2, x)
    buf2 = alloc_ctx_tensors(ctx, tb)
    tensor_set_numpy(w2, wv * 3)
    plan = tb.graph_plan_create(_graph(ctx, out, out2))
    tb.graph_plan_compute(plan)
    cache = tb.weight_cache
    assert len(cache.entries) == 1 and cache.nbytes == one  # the second evicted the first
    tb.graph_plan_compute(plan)
    _assert_product(tensor_get_numpy(out2), xv @ _quantized_values(Q8_0, wv * 3).T, cdt)
    _assert_product(tensor_get_numpy(out), xv @ _quantized_values(Q8_0, wv).T, cdt)
    buf2.free()
    assert all(e.buffer is not buf2 for e in cache.entries.values())
    buf.free()
    assert len(cache.entries) == 0 and cache.nbytes == 0
    tiny = torch_init(weight_cache_bytes=16, matmul_precision=precision)
    ctx, buf, w, x, out, wv, xv = _matmul_setup(tiny, Q4_0)
    tiny.graph_compute(_graph(ctx, out))
    assert len(tiny.weight_cache.entries) == 0  # larger than the limit: converted, not kept
    _assert_product(tensor_get_numpy(out), xv @ _quantized_values(Q4_0, wv).T, cdt)


def test_views_only_graph_computes_nothing() -> None:
    tb = torch_init()
    ctx = _ctx()
    a = ctx.new_tensor_2d(F32, 4, 4)
    v = ctx.transpose(ctx.reshape_2d(a, 8, 2))
    alloc_ctx_tensors(ctx, tb)
    plan = tb.graph_plan_create(_graph(ctx, v))
    assert plan.computes == [] and v.op == GGMLOp.TRANSPOSE


# --- MUL_MAT_ID: the experts the ids pick, each converted once ---


def _mul_mat_id_setup(tb: TorchBackend, rng: np.random.Generator, ids: np.ndarray
                      ) -> tuple[Context, Tensor, Tensor, Tensor, np.ndarray, np.ndarray]:
    """Six Q8_0 experts [64, 4], src1 [64, 1, n_tokens] (one row for every slot), ids [n_used, n_tokens]."""
    n_tokens, n_used = ids.shape
    ctx = _ctx()
    w = ctx.new_tensor_3d(Q8_0, 64, 4, 6).set_name("experts")
    x = ctx.new_tensor_3d(F32, 64, 1, n_tokens).set_name("x")
    i = ctx.new_tensor_2d(I32, n_used, n_tokens).set_name("ids")
    out = ctx.mul_mat_id(w, x, i)
    alloc_ctx_tensors(ctx, tb)
    wv = rng.standard_normal((6, 4, 64)).astype(np.float32)
    xv = rng.standard_normal((n_tokens, 1, 64)).astype(np.float32)
    tensor_set_numpy(w, wv)
    tensor_set_numpy(x, xv)
    tensor_set_numpy(i, ids.astype(np.int32))
    return ctx, w, i, out, _quantized_values(Q8_0, wv.reshape(24, 64)).reshape(6, 4, 64), xv


def _mul_mat_id_want(experts: np.ndarray, xv: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """dst [n_tokens, n_used, M]: token t's slot s is expert ids[t, s] times the token's row."""
    return np.stack([[experts[e] @ xv[t, 0] for e in row] for t, row in enumerate(ids)])


def test_mul_mat_id_converts_only_the_picked_experts_each_once(rng: np.random.Generator) -> None:
    tb = torch_init(matmul_precision="f32")
    ids = np.array([[4, 1], [1, 0], [4, 1]])  # experts 0, 1, 4; 1 and 4 twice
    ctx, w, i, out, experts, xv = _mul_mat_id_setup(tb, rng, ids)
    plan = tb.graph_plan_create(_graph(ctx, out))
    cache = tb.weight_cache
    tb.graph_plan_compute(plan)
    assert (cache.misses, cache.hits) == (3, 0)
    assert sorted(e.start for e in cache.entries.values()) == [k * w.nb[2] for k in (0, 1, 4)]
    _assert_product(tensor_get_numpy(out), _mul_mat_id_want(experts, xv, ids), torch.float32)
    ids2 = np.array([[5, 4], [0, 4], [1, 5]])  # 0, 1, 4 cached; 5 new
    tensor_set_numpy(i, ids2.astype(np.int32))
    tb.graph_plan_compute(plan)
    assert (cache.misses, cache.hits, len(cache.entries)) == (4, 3, 4)
    _assert_product(tensor_get_numpy(out), _mul_mat_id_want(experts, xv, ids2), torch.float32)
    # new bytes in expert 4 drop its conversion only
    new4 = rng.standard_normal((4, 64)).astype(np.float32)
    tensor_set(w, np.asarray(from_float(Q8_0, new4), dtype=np.uint8), offset=4 * w.nb[2])
    assert sorted(e.start for e in cache.entries.values()) == [k * w.nb[2] for k in (0, 1, 5)]
    tb.graph_plan_compute(plan)
    experts[4] = _quantized_values(Q8_0, new4)
    _assert_product(tensor_get_numpy(out), _mul_mat_id_want(experts, xv, ids2), torch.float32)


def test_mul_mat_id_experts_a_plan_writes_are_converted_each_time(rng: np.random.Generator) -> None:
    """SET_ROWS into expert 2's rows and MUL_MAT_ID with the experts in one graph: never from the cache."""
    tb = torch_init(matmul_precision="f32")
    ids = np.array([[2, 3], [3, 2]])
    ctx, w, i, out, experts, xv = _mul_mat_id_setup(tb, rng, ids)
    src = ctx.new_tensor_2d(F32, 64, 4).set_name("src")
    rows = ctx.new_tensor_1d(I32, 4).set_name("rows")
    written = ctx.set_rows(ctx.reshape_2d(w, 64, 24), src, rows)
    out2 = ctx.mul_mat_id(ctx.reshape_3d(written, 64, 4, 6), out.src[1], i)
    alloc_ctx_tensors(ctx, tb)
    tensor_set_numpy(rows, np.arange(8, 12, dtype=np.int32))
    plan = tb.graph_plan_create(_graph(ctx, out2))
    for k in (1.0, -3.0):
        new2 = k * rng.standard_normal((4, 64)).astype(np.float32)
        tensor_set_numpy(src, new2)
        tb.graph_plan_compute(plan)
        assert len(tb.weight_cache.entries) == 0
        experts[2] = _quantized_values(Q8_0, new2)
        _assert_product(tensor_get_numpy(out2), _mul_mat_id_want(experts, xv, ids), torch.float32)
