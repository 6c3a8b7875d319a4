"""GLU, SET_ROWS, ADD_ID and MUL_MAT_ID: builders' shapes, op_params and errors; CPU kernels against numpy
formulas written here; and every op checker case of these ops against real ggml (skipped only without a C
compiler)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import compile_node, new_ctx, run, stored, tensor, values_of

from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.capi import core as capi
from pyggml.core.context import Context
from pyggml.core.errors import OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import GLUParams
from pyggml.core.tensor import GGMLOp, GLUOp
from pyggml.core.types import GGMLType, from_float, to_float
from pyggml.ggml_backend import Backend, tensor_get_numpy, tensor_set_numpy
from pyggml.testing import op_check
from pyggml.testing.cases_glu_rows_moe import glu_rows_moe_cases

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
rng = np.random.default_rng(11)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


# --- numpy formulas (float64), independent of the kernels ---


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf)


def ref_glu(op: GLUOp, x: np.ndarray, g: np.ndarray, alpha: float = 0.0, limit: float = 0.0) -> np.ndarray:
    x, g = x.astype(np.float64), g.astype(np.float64)
    if op == GLUOp.REGLU:
        return np.where(x > 0, x, 0.0) * g
    if op == GLUOp.GEGLU:
        return _gelu(x) * g
    if op == GLUOp.SWIGLU:
        return _silu(x) * g
    if op == GLUOp.GEGLU_ERF:
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))) * g
    if op == GLUOp.GEGLU_QUICK:
        return x / (1.0 + np.exp(-1.702 * x)) * g
    x = np.minimum(x, limit)
    g = np.clip(g, -limit, limit)
    if op == GLUOp.SWIGLU_OAI:
        return x / (1.0 + np.exp(-alpha * x)) * (g + 1.0)
    return _silu(x) * g  # SWIGLU_CLAMP


# --- builders ---


def test_glu_builders_shapes_and_params() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 9, 4, 3, 2)
    fused = ctx.swiglu(a)
    assert fused.ne == [4, 4, 3, 2] and fused.op == GGMLOp.GLU and fused.src[0] is a and fused.src[1] is None
    assert GLUParams.of(fused) == GLUParams(op=GLUOp.SWIGLU, swapped=False)
    assert fused.get_op_params_i32(0) == int(GLUOp.SWIGLU) and fused.get_op_params_i32(1) == 0
    assert ctx.geglu_swapped(a).get_op_params_i32(1) == 1
    b = ctx.new_tensor_4d(F32, 9, 4, 3, 2)
    split = ctx.reglu_split(a, b)
    assert split.ne == a.ne and split.src[1] is b
    oai = ctx.swiglu_oai(a, b, 1.702, 7.0)
    assert oai.get_op_params_i32(0) == int(GLUOp.SWIGLU_OAI)
    assert oai.get_op_params_f32(2) == pytest.approx(1.702) and oai.get_op_params_f32(3) == 7.0
    clamp = ctx.swiglu_clamp(a, b, 3.5)
    assert clamp.get_op_params_f32(2) == 0.0 and clamp.get_op_params_f32(3) == 3.5
    assert ctx.glu(a, GLUOp.GEGLU_ERF, True).get_op_params_i32(1) == 1
    for name in ("reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"):
        assert getattr(capi, f"ggml_{name}")(ctx, a).ne == [4, 4, 3, 2]
        assert getattr(capi, f"ggml_{name}_swapped")(ctx, a).get_op_params_i32(1) == 1
        assert getattr(capi, f"ggml_{name}_split")(ctx, a, b).ne == a.ne
    assert capi.ggml_get_glu_op(capi.ggml_glu_split(ctx, a, b, GLUOp.GEGLU)) == GLUOp.GEGLU


def test_glu_builder_errors() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 8, 4, 1, 1)
    with pytest.raises(ShapeError, match="glu_split"):
        ctx.glu_split(a, ctx.new_tensor_4d(F32, 8, 3, 1, 1), GLUOp.SWIGLU)
    with pytest.raises(UnsupportedTypeError, match="swiglu_split"):
        ctx.swiglu_split(a, ctx.new_tensor_4d(F16, 8, 4, 1, 1))
    with pytest.raises(ShapeError, match="contiguous"):
        ctx.swiglu(ctx.transpose(a))
    with pytest.raises(Exception, match="GLUOp"):
        ctx.glu(a, 9, False)


def test_set_rows_builder_is_a_view_of_a() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F16, 8, 10, 2, 1)
    b = ctx.new_tensor_4d(F32, 8, 3, 2, 1)
    c = ctx.new_tensor_4d(I64, 3, 1, 1, 1)
    r = capi.ggml_set_rows(ctx, a, b, c)
    assert r.op == GGMLOp.SET_ROWS and r.view_src is a and r.ne == a.ne and r.type == F16
    assert r.src[0] is b and r.src[1] is c and r.src[2] is a  # ggml's order
    with pytest.raises(UnsupportedTypeError, match="set_rows"):
        ctx.set_rows(a, b, ctx.new_tensor_4d(F32, 3, 1, 1, 1))
    with pytest.raises(ShapeError, match="set_rows"):
        ctx.set_rows(a, b, ctx.new_tensor_4d(I32, 4, 1, 1, 1))
    with pytest.raises(UnsupportedTypeError, match="set_rows"):
        ctx.set_rows(a, ctx.new_tensor_4d(BF16, 8, 3, 2, 1), c)


def test_moe_builders() -> None:
    ctx = new_ctx()
    as_ = ctx.new_tensor_4d(GGMLType.Q8_0, 64, 5, 4, 1)
    b = ctx.new_tensor_4d(F32, 64, 1, 3, 1)
    ids = ctx.new_tensor_4d(I32, 2, 3, 1, 1)
    mm = capi.ggml_mul_mat_id(ctx, as_, b, ids)
    assert mm.ne == [5, 2, 3, 1] and mm.type == F32 and mm.src[:3] == [as_, b, ids]
    with pytest.raises(ShapeError, match="mul_mat_id"):
        ctx.mul_mat_id(as_, ctx.new_tensor_4d(F32, 64, 1, 4, 1), ids)
    with pytest.raises(UnsupportedTypeError, match="mul_mat_id"):
        ctx.mul_mat_id(as_, b, ctx.new_tensor_4d(I64, 2, 3, 1, 1))
    a = ctx.new_tensor_4d(F32, 6, 2, 3, 1)
    ad = capi.ggml_add_id(ctx, a, ctx.new_tensor_4d(F32, 6, 4, 1, 1), ids)
    assert ad.ne == a.ne and ad.op == GGMLOp.ADD_ID and ad.src[2] is ids
    with pytest.raises(ShapeError, match="add_id"):
        ctx.add_id(a, ctx.new_tensor_4d(F32, 5, 4, 1, 1), ids)


# --- CPU kernels against numpy ---


# the types of ggml-cpu's kernel of each GLU function
GLU_TYPES = {GLUOp.SWIGLU_OAI: (F32,), GLUOp.SWIGLU_CLAMP: (F32, F16)}


@pytest.mark.parametrize(("op", "type"), [(op, t) for op in GLUOp for t in GLU_TYPES.get(op, (F32, F16, BF16))])
@pytest.mark.parametrize("form", ["fused", "swapped", "split"])
def test_glu_kernel(op: GLUOp, type: GGMLType, form: str) -> None:
    ctx = new_ctx()
    alpha, limit = 1.702, 0.8
    if form == "split":
        xv, gv = rand(2, 3, 5, 17, lo=-3, hi=3), rand(2, 3, 5, 17, lo=-3, hi=3)
        x, g = tensor(ctx, type, xv), tensor(ctx, type, gv)
        if op == GLUOp.SWIGLU_OAI:
            node = ctx.swiglu_oai(x, g, alpha, limit)
        elif op == GLUOp.SWIGLU_CLAMP:
            node = ctx.swiglu_clamp(x, g, limit)
        else:
            node = ctx.glu_split(x, g, op)
        xs, gs = stored(type, xv), stored(type, gv)
    else:
        av = rand(2, 3, 5, 35, lo=-3, hi=3)  # odd ne0: the last element is in neither half
        a = tensor(ctx, type, av)
        node = ctx.glu(a, op, form == "swapped")
        if op in (GLUOp.SWIGLU_OAI, GLUOp.SWIGLU_CLAMP):  # the fused form with the parameters set by hand
            node.set_op_params([int(op), int(form == "swapped"), alpha, limit])
        s = stored(type, av)
        xs, gs = s[..., :17], s[..., 17:34]
        if form == "swapped":
            xs, gs = gs, xs
    want = ref_glu(op, xs, gs, alpha, limit)
    got = run(node)
    tol = {F32: 2e-3, F16: 6e-3, BF16: 3e-2}[type]  # GEGLU's f16 table rounds the activation
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _set_rows_case(dst_type: GGMLType, idx_type: GGMLType, src_type: GGMLType = F32) -> None:
    ctx = new_ctx()
    n = 64 if dst_type not in (F32, F16, BF16) else 6
    base = rand(3, 4, 9, n)
    if dst_type in (F32, F16, BF16):
        a = tensor(ctx, dst_type, base)
        a_vals = stored(dst_type, base)
    else:
        a = ctx.new_tensor_4d(dst_type, n, 9, 4, 3)
        a.numpy()[...] = from_float(dst_type, base)
        a_vals = to_float(dst_type, from_float(dst_type, base))
    bv = rand(3, 4, 5, n)
    b = tensor(ctx, src_type, bv)
    idx = np.stack([rng.permutation(9)[:5] for _ in range(2)]).reshape(1, 1, 2, 5)  # c [5, 2, 1]: dims 2, 3 broadcast
    c = ctx.new_tensor_4d(idx_type, 5, 2, 1, 1)
    c.numpy()[...] = idx
    node = ctx.set_rows(a, b, c)
    compile_node(node)()
    want = a_vals.copy()
    b_stored = stored(src_type, bv)
    for i3 in range(3):
        for i2 in range(4):
            for i in range(5):
                want[i3, i2, idx[0, 0, i2 % 2, i]] = b_stored[i3, i2, i]
    if dst_type in (F32, F16, BF16):
        want = stored(dst_type, want)
        got = values_of(a)
    else:
        # rows written are the quantized values of b's rows; untouched rows keep a's bytes
        want = to_float(dst_type, from_float(dst_type, want))
        got = to_float(dst_type, a.numpy())
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dst_type", [F32, F16, BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                                      GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4])
@pytest.mark.parametrize("idx_type", [I64, I32])
def test_set_rows_kernel(dst_type: GGMLType, idx_type: GGMLType) -> None:
    _set_rows_case(dst_type, idx_type)


def test_set_rows_f16_values() -> None:
    _set_rows_case(F16, I64, src_type=F16)
    _set_rows_case(F32, I32, src_type=F16)


@pytest.mark.parametrize(("dst_type", "src_type"), [(F32, F32), (F16, F32), (F16, F16)])
@pytest.mark.parametrize("idx_type", [I64, I32])
@pytest.mark.parametrize("n", [1, 5])
def test_set_rows_one_matrix(dst_type: GGMLType, src_type: GGMLType, idx_type: GGMLType, n: int) -> None:
    """One matrix of F32/F16 rows (a KV-cache write: its own fast path): one row, or 5 with a repeated index
    (the last row written stays); a row index out of range, either way, raises."""
    ctx = new_ctx()
    base = rand(9, 6)
    a = tensor(ctx, dst_type, base)
    bv = rand(n, 6)
    idx = np.array([7] if n == 1 else [3, 0, 8, 3, 5])
    c = ctx.new_tensor_1d(idx_type, n)
    c.numpy()[...] = idx
    compile_node(ctx.set_rows(a, tensor(ctx, src_type, bv), c))()
    want = stored(dst_type, base).copy()
    for i, r in enumerate(idx):
        want[r] = stored(src_type, bv)[i]
    np.testing.assert_array_equal(values_of(a)[0, 0], stored(dst_type, want))
    for bad in (9, -1):
        c.numpy()[...] = np.where(np.arange(n) == n - 1, bad, idx)
        with pytest.raises(OutOfBoundsError, match=f"row index {bad} outside"):
            compile_node(ctx.set_rows(a, tensor(ctx, src_type, bv), c))()


@pytest.mark.parametrize("bad", [4, -1])
@pytest.mark.parametrize("matrices", [1, 2])  # one matrix: the 2-D path; two: the general one
def test_set_rows_out_of_range(bad: int, matrices: int) -> None:
    ctx = new_ctx()
    before = rand(matrices, 4, 3)
    a = tensor(ctx, F32, before)
    b = tensor(ctx, F32, rand(matrices, 2, 3))
    c = tensor(ctx, I32, np.array([[1, bad]], np.int32))
    node = ctx.set_rows(a, b, c)
    with pytest.raises(OutOfBoundsError, match=f"row index {bad} outside"):
        run(node)
    np.testing.assert_array_equal(node.numpy().reshape(before.shape), before)  # checked before any write


@pytest.mark.parametrize("type_a", [F32, F16, BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K])
@pytest.mark.parametrize("b_rows", [1, 2])
@pytest.mark.parametrize("n_tok", [5, 40])  # few rows per expert and many (F32: BLAS; else vec_dot loops)
def test_mul_mat_id_kernel(type_a: GGMLType, b_rows: int, n_tok: int) -> None:
    ctx = new_ctx()
    k, m, n_as, n_used = 256, 7, 4, 2
    wv = rand(1, n_as, m, k)
    if type_a in (F32, F16, BF16):
        w = tensor(ctx, type_a, wv)
        w_vals = stored(type_a, wv)
    else:
        w = ctx.new_tensor_4d(type_a, k, m, n_as, 1)
        w.numpy()[...] = from_float(type_a, wv)
        w_vals = to_float(type_a, from_float(type_a, wv))
    xv = rand(1, n_tok, b_rows, k)
    x = tensor(ctx, F32, xv)
    ids = np.stack([rng.permutation(n_as)[:n_used] for _ in range(n_tok)]).astype(np.int32)
    idt = tensor(ctx, I32, ids)
    got = run(ctx.mul_mat_id(w, x, idt))
    want = np.zeros((1, n_tok, n_used, m))
    for t in range(n_tok):
        for e in range(n_used):
            want[0, t, e] = w_vals[0, ids[t, e]].astype(np.float64) @ xv[0, t, e % b_rows].astype(np.float64)
    nmse = float(np.sum((got - want) ** 2) / np.sum(want ** 2))
    assert nmse < 5e-4, nmse  # src1 goes through the weights' vec_dot_type, as in ggml


@pytest.mark.parametrize("type_a", [F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K])
def test_mul_mat_id_groups_rows_by_expert_as_mul_mat(type_a: GGMLType) -> None:
    """A prompt's rows grouped by expert: each expert's rows go through MUL_MAT's vec_dot loops over that many
    columns, so an expert with fewer rows than MUL_MAT's BLAS_MIN_COLS gives exactly MUL_MAT of its matrix and
    those rows; one with more (where MUL_MAT would take BLAS) is checked against float64."""
    ctx = new_ctx()
    k, m, n_as, n_tok = 256, 24, 5, 20
    wv = rand(1, n_as, m, k)
    w = ctx.new_tensor_4d(type_a, k, m, n_as, 1)
    w.numpy()[...] = wv.astype(np.float16) if type_a == F16 else from_float(type_a, wv)
    w_vals = stored(F16, wv) if type_a == F16 else to_float(type_a, from_float(type_a, wv))
    xv = rand(1, n_tok, 1, k)
    # expert 3 on every token (20 rows); experts 0, 1, 4 share the second slot (7, 7, 6 rows); 2 unused
    ids = np.stack([np.full(n_tok, 3), np.array([0, 1, 4] * 6 + [0, 1])], axis=1).astype(np.int32)
    got = run(ctx.mul_mat_id(w, tensor(ctx, F32, xv), tensor(ctx, I32, ids)))[0]
    for e in (0, 1, 4):
        t, j = np.nonzero(ids == e)
        we = ctx.new_tensor_2d(type_a, k, m)
        we.numpy()[...] = w.numpy()[0, e]
        # F16: ggml's MUL_MAT takes tinyBLAS from 2 columns, MUL_MAT_ID vec_dot rows (batch-invariant MUL_MAT's)
        want = run(ctx.mul_mat(we, tensor(ctx, F32, xv[0, t, 0])),
                   ComputeParams(batch_invariant=type_a == F16))[0, 0]
        np.testing.assert_array_equal(got[t, j], want, err_msg=f"expert {e}")
    want3 = xv[0, :, 0].astype(np.float64) @ w_vals[0, 3].astype(np.float64).T
    nmse = float(np.sum((got[:, 0] - want3) ** 2) / np.sum(want3 ** 2))
    assert nmse < 5e-4, nmse


def test_add_id_kernel() -> None:
    ctx = new_ctx()
    av, bv = rand(1, 3, 2, 6), rand(1, 1, 5, 6)
    ids = np.array([[4, 0], [1, 1], [3, 2]], np.int32)
    got = run(ctx.add_id(tensor(ctx, F32, av), tensor(ctx, F32, bv), tensor(ctx, I32, ids)))
    want = av + bv[0, 0][ids][None]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(OutOfBoundsError, match="ADD_ID"):
        run(ctx.add_id(tensor(ctx, F32, av), tensor(ctx, F32, bv), tensor(ctx, I32, ids + 3)))


def test_cpu_backend_supports() -> None:
    backend = cpu_init(n_threads=1)
    try:
        ctx = new_ctx()
        a = ctx.new_tensor_4d(BF16, 8, 2, 1, 1)
        assert backend.supports_op(ctx.swiglu(a))
        assert not backend.supports_op(ctx.swiglu_oai(a, a, 1.0, 1.0))  # F32 only in ggml's CPU
        k = ctx.new_tensor_4d(GGMLType.Q4_0, 32, 4, 1, 1)
        assert backend.supports_op(ctx.set_rows(k, ctx.new_tensor_4d(F32, 32, 1, 1, 1),
                                                ctx.new_tensor_4d(I64, 1, 1, 1, 1)))
    finally:
        backend.free()


# --- in a graph: the result of SET_ROWS aliases a ---


def test_set_rows_in_allocated_graph() -> None:
    """The KV-cache write: a cache in its own buffer, SET_ROWS of a computed tensor into it, a reader of the
    result; and SET_ROWS into a computed tensor, which the graph allocator must keep alive as the view's source."""
    backend = cpu_init(n_threads=1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    cache = ctx.new_tensor_2d(F16, 8, 6).set_name("k_cache")
    x = ctx.new_tensor_2d(F32, 8, 2).set_name("x")
    idx = ctx.new_tensor_1d(I64, 2).set_name("idx")
    a0 = ctx.new_tensor_2d(F32, 8, 6).set_name("a0")
    written = ctx.set_rows(cache, ctx.scale(x, 2.0), idx)
    out1 = ctx.scale(written, 1.0)
    a = ctx.scale(a0, 3.0)  # a computed tensor: its memory is the graph allocator's
    out2 = ctx.scale(ctx.set_rows(a, x, idx), 1.0)
    gf = ctx.new_graph()
    gf.build_forward_expand(out1)
    gf.build_forward_expand(out2)
    talloc = TensorAllocator.new_from_backend(backend, 1 << 16)
    cv, xv, av = rand(6, 8), rand(2, 8), rand(6, 8)
    iv = np.array([5, 1], np.int64)
    try:
        for t, v in ((cache, cv.astype(np.float16)), (x, xv), (idx, iv), (a0, av)):
            talloc.alloc(t)
            tensor_set_numpy(t, v)
        GraphAllocator().alloc_graph(talloc, gf)
        backend.graph_compute(gf)
        want = cv.astype(np.float16).astype(np.float32)
        want[iv] = (2 * xv).astype(np.float16)
        np.testing.assert_array_equal(tensor_get_numpy(cache).astype(np.float32).reshape(6, 8), want)
        np.testing.assert_array_equal(tensor_get_numpy(out1).reshape(6, 8), want)
        want2 = 3 * av
        want2[iv] = xv
        np.testing.assert_allclose(tensor_get_numpy(out2).reshape(6, 8), want2, rtol=1e-6)
    finally:
        talloc.buffer.free()
        backend.free()


# --- against real ggml ---


@pytest.mark.parametrize("label", sorted({c.label for c in glu_rows_moe_cases()}))
def test_against_ggml(label: str, ggml_reference: Backend) -> None:
    results = op_check.run_cases([c for c in glu_rows_moe_cases() if c.label == label], ggml_reference)
    bad = [(r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad
