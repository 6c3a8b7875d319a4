"""CPU kernels of the element-wise ops against numpy references written here from ggml's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import (
    BF16,
    F16,
    F32,
    as4,
    assert_close,
    build,
    compile_node,
    manual_node,
    new_ctx,
    permuted,
    run,
    stored,
    tensor,
    transposed,
)

from pyggml.backends.cpu.kernels import ComputeParams, element_math
from pyggml.backends.cpu.kernels import elementwise as ew
from pyggml.core.errors import GGMLError, OutOfBoundsError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, UnaryOp
from pyggml.core.types import GGMLType

TYPES = [F32, F16]


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml's repeat: b's element i lands at every i + k*ne (written with np.tile)."""
    b = as4(b)
    reps = tuple(n // m for n, m in zip(shape, b.shape, strict=True))
    return np.tile(b, reps)


BINARY = {
    GGMLOp.ADD: ("add", np.add),
    GGMLOp.SUB: ("sub", np.subtract),
    GGMLOp.MUL: ("mul", np.multiply),
    GGMLOp.DIV: ("div", np.divide),
}

# (src0 shape, src1 shape) in numpy order
BROADCASTS = [
    ((2, 3, 4, 8), (2, 3, 4, 8)),  # same shape
    ((2, 3, 4, 8), (1, 1, 1, 8)),  # a row over all rows
    ((2, 3, 4, 8), (1, 3, 1, 8)),  # per-ne2 rows
    ((2, 3, 4, 8), (1, 1, 2, 8)),  # ne1 = 2 tiles ne1 = 4 (not numpy broadcasting)
    ((2, 3, 4, 8), (1, 1, 1, 4)),  # ne0 = 4 tiles inside each row of 8
    ((2, 3, 6, 8), (2, 1, 3, 2)),  # several tiled dims at once
    ((1, 1, 5, 7), (1, 1, 1, 1)),  # scalar
]


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("types", [(F32, F32), (F16, F16), (F16, F32)])
def test_binary_broadcast(op: GGMLOp, shapes: tuple, types: tuple, rng: np.random.Generator) -> None:
    sa, sb = shapes
    ta, tb = types
    a = rng.uniform(0.5, 2.0, sa).astype(np.float32)
    b = rng.uniform(0.5, 2.0, sb).astype(np.float32) * rng.choice([-1, 1], sb)
    ctx = new_ctx()
    name, fn = BINARY[op]
    node = getattr(ctx, name)(tensor(ctx, ta, a), tensor(ctx, tb, b))
    want = fn(stored(ta, a), tile_to(stored(tb, b), sa))
    assert_close(run(node), stored(node.type, want), node.type)


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("type", TYPES)
def test_binary_non_contiguous(op: GGMLOp, type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.uniform(0.5, 2.0, (2, 3, 4, 6)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (1, 3, 2, 6)).astype(np.float32)
    ctx = new_ctx()
    name, fn = BINARY[op]
    ta = permuted(ctx, type, a, "a")
    tb = transposed(ctx, type, b, "b")
    assert not ta.is_contiguous() and not tb.is_contiguous()
    node = getattr(ctx, name)(ta, tb)
    want = fn(stored(type, a), tile_to(stored(type, b), a.shape))
    assert_close(run(node), stored(type, want), type)


@pytest.mark.parametrize("type", TYPES)
def test_add_inplace_writes_into_src0(type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((1, 5)).astype(np.float32)
    ctx = new_ctx()
    ta = tensor(ctx, type, a)
    node = ctx.add_inplace(ta, tensor(ctx, type, b))
    run(node)
    assert_close(stored(F32, ta.numpy()), stored(type, stored(type, a) + stored(type, b)), type)


def test_binary_plan_runs_again_with_new_inputs(rng: np.random.Generator) -> None:
    ctx = new_ctx()
    ta = tensor(ctx, F32, np.zeros((2, 4), np.float32))
    tb = tensor(ctx, F32, np.zeros((1, 4), np.float32))
    node = ctx.mul(ta, tb)
    fn = compile_node(node)
    for _ in range(3):
        a = rng.standard_normal((2, 4)).astype(np.float32)
        b = rng.standard_normal((1, 4)).astype(np.float32)
        ta.numpy()[...] = a
        tb.numpy()[...] = b
        fn()
        assert_close(node.numpy(), a * b, F32)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("src1_type", [F32, F16])
def test_add1(type: GGMLType, src1_type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.standard_normal((2, 3, 7)).astype(np.float32)
    ctx = new_ctx()
    s = tensor(ctx, src1_type, np.array([1.75], np.float32))
    node = build(ctx, "add1", transposed(ctx, type, a), s, op=GGMLOp.ADD1)
    assert_close(run(node), stored(type, stored(type, a) + 1.75), type)


def _acc_params(shape_dst: tuple, esize: int, offset_elems: int) -> list[int]:
    ne0, ne1 = shape_dst[-1], shape_dst[-2]
    nb1 = ne0 * esize
    nb2 = nb1 * ne1
    nb3 = nb2 * (shape_dst[-3] if len(shape_dst) > 2 else 1)
    return [nb1, nb2, nb3, offset_elems * esize]


@pytest.mark.parametrize("type", TYPES)
def test_acc(type: GGMLType, rng: np.random.Generator) -> None:
    a = rng.standard_normal((2, 5, 8)).astype(np.float32)
    b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    esize = 4 if type == F32 else 2
    nb1, nb2, nb3, offset = _acc_params(a.shape, esize, 1 * 8 + 2)  # start at row 1, column 2
    ctx = new_ctx()
    ta, tb = tensor(ctx, type, a), tensor(ctx, F32, b)
    if hasattr(ctx, "acc"):
        node = ctx.acc(ta, tb, nb1, nb2, nb3, offset)
    else:
        node = manual_node(ctx, GGMLOp.ACC, [ta, tb], [nb1, nb2, nb3, offset, 0])
    want = stored(type, a).copy()
    want[:, 1:3, 2:5] += b
    assert_close(run(node), stored(type, want), type)
    assert_close(stored(F32, ta.numpy()), stored(type, a), type)  # src0 untouched


def test_acc_window_out_of_bounds_raises(rng: np.random.Generator) -> None:
    ctx = new_ctx()
    ta = tensor(ctx, F32, np.zeros((2, 4), np.float32))
    tb = tensor(ctx, F32, np.zeros((2, 4), np.float32))
    node = manual_node(ctx, GGMLOp.ACC, [ta, tb], [16, 32, 32, 4, 0])
    with pytest.raises(OutOfBoundsError):
        compile_node(node)


# --- unary math ---


def gelu_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


UNARY_REF = {
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: np.sign,
    UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float64),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.exp(x) - 1.0),
    UnaryOp.RELU: lambda x: np.where(x > 0, x, 0.0),
    UnaryOp.GELU: gelu_ref,
    UnaryOp.GELU_QUICK: lambda x: x / (1.0 + np.exp(-1.702 * x)),
    UnaryOp.SILU: lambda x: x / (1.0 + np.exp(-x)),
    UnaryOp.HARDSWISH: lambda x: x * np.minimum(1.0, np.maximum(0.0, (x + 3.0) / 6.0)),
    UnaryOp.HARDSIGMOID: lambda x: np.minimum(1.0, np.maximum(0.0, (x + 3.0) / 6.0)),
    UnaryOp.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
    UnaryOp.EXP: np.exp,
    UnaryOp.EXPM1: np.expm1,
    UnaryOp.SOFTPLUS: lambda x: np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))),
    UnaryOp.GELU_ERF: lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),  # C's roundf: halves away from zero
    UnaryOp.TRUNC: np.trunc,
}


def unary_ref(uop: UnaryOp, type: GGMLType, x: np.ndarray) -> np.ndarray:
    """What ggml's CPU computes: GELU and GELU_QUICK of f32 data through its f16 tables (f16 in, f16 out; GELU
    0 below -10 and x above 10), everything else by the formula."""
    x = np.asarray(x, np.float64)
    if uop not in (UnaryOp.GELU, UnaryOp.GELU_QUICK) or type != F32:
        return UNARY_REF[uop](x)
    y = UNARY_REF[uop](x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
    if uop == UnaryOp.GELU:
        y = np.where(x <= -10, 0.0, np.where(x >= 10, x, y))
    return y


@pytest.mark.parametrize("uop", list(UNARY_REF))
@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_unary(uop: UnaryOp, type: GGMLType, layout: str, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 4, 10)) * 3).astype(np.float32)
    x[0, 0, :3] = [0.0, -0.0, 0.0]
    x[0, 1, :2] = [-12.0, 11.0]  # GELU's shortcuts
    ctx = new_ctx()
    t = tensor(ctx, type, x) if layout == "contiguous" else transposed(ctx, type, x)
    node = ctx.unary(t, uop)
    xs = stored(type, x).astype(np.float64)
    assert_close(run(node), stored(type, unary_ref(uop, type, xs)), type)


def test_round_halves_away_from_zero() -> None:
    x = np.array([[0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 3.0, -0.0]], np.float32)
    ctx = new_ctx()
    out = run(ctx.unary(tensor(ctx, F32, x), UnaryOp.ROUND))
    assert out.ravel().tolist() == [1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.0, -0.0, 3.0, -0.0]


def test_xielu(rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 9)) * 2).astype(np.float32)
    ctx = new_ctx()
    node = ctx.xielu(tensor(ctx, F32, x), 0.8, 0.8, 0.5, -1e-6)
    xs = x.astype(np.float64)
    alpha_n, alpha_p, beta, eps = 0.5 + np.log1p(np.exp(0.8)), np.log1p(np.exp(0.8)), 0.5, -1e-6
    want = np.where(xs > 0, alpha_p * xs * xs + beta * xs, (np.expm1(np.minimum(xs, eps)) - xs) * alpha_n + beta * xs)
    assert_close(run(node), want, F32, atol=1e-5)


@pytest.mark.parametrize("uop", [UnaryOp.GELU, UnaryOp.SILU, UnaryOp.RELU])
def test_unary_inplace(uop: UnaryOp, rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 6)).astype(np.float32)
    ctx = new_ctx()
    t = tensor(ctx, F32, x)
    node = ctx.unary_inplace(t, uop)
    run(node)
    assert_close(stored(F32, t.numpy()), unary_ref(uop, F32, x), F32, atol=1e-6)


SIMPLE = {
    GGMLOp.SQR: ("sqr", np.square),
    GGMLOp.SQRT: ("sqrt", np.sqrt),
    GGMLOp.LOG: ("log", np.log),
}


@pytest.mark.parametrize("op", list(SIMPLE))
@pytest.mark.parametrize("type", TYPES)
def test_sqr_sqrt_log(op: GGMLOp, type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.uniform(0.1, 4.0, (2, 3, 5)).astype(np.float32)
    ctx = new_ctx()
    name, fn = SIMPLE[op]
    node = build(ctx, name, transposed(ctx, type, x), op=op)
    assert_close(run(node), stored(type, fn(stored(type, x).astype(np.float64))), type)


@pytest.mark.parametrize("type", TYPES)
def test_scale(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.scale(transposed(ctx, type, x), 0.125)
    assert_close(run(node), stored(type, stored(type, x) * 0.125), type)
    node = ctx.scale_bias(transposed(ctx, type, x), 0.125, -1.5)  # today's SCALE: x * s + b
    assert_close(run(node), stored(type, stored(type, x) * 0.125 - 1.5), type)


@pytest.mark.parametrize("type", TYPES)
def test_clamp(type: GGMLType, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 9)) * 2).astype(np.float32)
    ctx = new_ctx()
    t = transposed(ctx, type, x)
    if hasattr(ctx, "clamp"):
        node = ctx.clamp(t, -0.5, 1.25)
    else:
        node = manual_node(ctx, GGMLOp.CLAMP, [t], [-0.5, 1.25])
    want = np.maximum(np.minimum(stored(type, x), 1.25), -0.5)
    assert_close(run(node), stored(type, want), type)


@pytest.mark.parametrize("type", TYPES)
def test_leaky_relu(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 9)).astype(np.float32)
    ctx = new_ctx()
    t = transposed(ctx, type, x)
    if hasattr(ctx, "leaky_relu"):
        node = ctx.leaky_relu(t, 0.05, False)
    else:
        node = manual_node(ctx, GGMLOp.LEAKY_RELU, [t], [0.05])
    xs = stored(type, x).astype(np.float64)
    assert_close(run(node), stored(type, np.where(xs > 0, xs, 0.05 * xs)), type)


# --- BF16, as ggml-cpu's binary_op and unary_op take it ---


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("types", [(BF16, BF16, BF16), (BF16, F32, BF16), (BF16, F32, F32)])
def test_binary_bf16_as_ggml(op: GGMLOp, types: tuple, rng: np.random.Generator) -> None:
    """src0 (src1) widened, the f32 arithmetic, its result rounded once to dst's type (nearest even)."""
    ta, tb, td = types
    sa, sb = (2, 3, 4, 8), (1, 3, 1, 4)
    a = rng.uniform(0.5, 2.0, sa).astype(np.float32)
    b = (rng.uniform(0.5, 2.0, sb) * rng.choice([-1, 1], sb)).astype(np.float32)
    ctx = new_ctx()
    node = manual_node(ctx, op, [tensor(ctx, ta, a), transposed(ctx, tb, b)], type=td)
    assert ew.supports(node)
    want = BINARY[op][1](stored(ta, a), tile_to(stored(tb, b), sa))  # float32 arithmetic
    np.testing.assert_array_equal(run(node), stored(td, want))


@pytest.mark.parametrize("uop", list(UNARY_REF))
@pytest.mark.parametrize("dst_type", [BF16, F32])
def test_unary_bf16(uop: UnaryOp, dst_type: GGMLType, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((3, 4, 10)) * 3).astype(np.float32)
    ctx = new_ctx()
    node = manual_node(ctx, GGMLOp.UNARY, [transposed(ctx, BF16, x)], [int(uop)], type=dst_type)
    assert ew.supports(node)
    xs = stored(BF16, x).astype(np.float64)
    assert_close(run(node), stored(dst_type, UNARY_REF[uop](xs)), BF16)


@pytest.mark.parametrize("uop", [UnaryOp.GELU, UnaryOp.GELU_QUICK])
def test_bf16_gelu_is_computed_directly(uop: UnaryOp) -> None:
    """As ggml_vec_gelu_bf16: the formula in f32, not ggml's f16 tables (whose f16 results lose bits of the
    tiny values at 1e-6 and 5e-8: f16 subnormals)."""
    x = np.array([[1e-6, 5e-8, -1.5, 0.75, 3.0]], np.float32)
    ctx = new_ctx()
    got = run(ctx.unary(tensor(ctx, BF16, x), uop))
    fn = element_math.ufunc("gelu" if uop == UnaryOp.GELU else "gelu_quick")
    np.testing.assert_array_equal(got, as4(stored(BF16, fn(x))))
    table = fn(x.astype(np.float16).astype(np.float32))
    assert (got[0, 0, 0, :2] != stored(BF16, stored(F16, table))[0, :2]).any()


@pytest.mark.parametrize("op", list(SIMPLE))
def test_sqr_sqrt_log_bf16(op: GGMLOp, rng: np.random.Generator) -> None:
    x = rng.uniform(0.1, 4.0, (2, 3, 5)).astype(np.float32)
    ctx = new_ctx()
    name, fn = SIMPLE[op]
    node = build(ctx, name, transposed(ctx, BF16, x), op=op)
    np.testing.assert_array_equal(run(node), as4(stored(BF16, fn(stored(BF16, x)))))


def test_scale_bf16(rng: np.random.Generator) -> None:
    """ggml's scale_bf16: x * s + b in f32, rounded once."""
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    ctx = new_ctx()
    node = ctx.scale_bias(tensor(ctx, BF16, x), 0.375, -1.25)
    xs = stored(BF16, x)
    np.testing.assert_array_equal(run(node), as4(stored(BF16, xs * np.float32(0.375) + np.float32(-1.25))))


def test_bf16_combinations_ggml_does_not_compute_are_refused() -> None:
    ctx = new_ctx()
    f32, f16, bf16 = (ctx.new_tensor_2d(t, 8, 2) for t in (F32, F16, BF16))
    nodes = [manual_node(ctx, GGMLOp.ADD, [f32, bf16], type=F32),  # a BF16 src1 with another src0
             manual_node(ctx, GGMLOp.MUL, [bf16, bf16], type=F32),
             manual_node(ctx, GGMLOp.SUB, [bf16, f16], type=BF16),
             manual_node(ctx, GGMLOp.UNARY, [f32], [int(UnaryOp.TANH)], type=BF16),  # into BF16 from F32
             manual_node(ctx, GGMLOp.UNARY, [bf16], [int(UnaryOp.TANH)], type=F16),
             manual_node(ctx, GGMLOp.CLAMP, [bf16], [-1.0, 1.0]),  # ggml's CLAMP: F32, F16
             manual_node(ctx, GGMLOp.ADD1, [bf16, ctx.new_tensor_1d(F32, 1)])]
    for node in nodes:
        before = node.numpy().copy()
        assert not ew.supports(node), node.op
        with pytest.raises(UnsupportedTypeError, match=node.op.name):
            compile_node(node)
        assert np.array_equal(node.numpy(), before)


def test_supports_and_type_errors() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2)
    b = ctx.new_tensor_2d(F32, 32, 2)
    node = ctx.add(a, b)
    assert not ew.supports(node)
    with pytest.raises(UnsupportedTypeError, match="ADD"):
        compile_node(node)
    assert ew.supports(ctx.add(b, b))
    assert ew.supports(ctx.unary(b, UnaryOp.GELU))
    bad = ctx.unary(b, UnaryOp.GELU)
    bad.op_params[0] = 99  # no ggml_unary_op
    assert not ew.supports(bad)
    with pytest.raises(GGMLError):
        compile_node(bad)


def test_scratch_is_shared_through_the_work_area(rng: np.random.Generator) -> None:
    ctx = new_ctx()
    x = rng.standard_normal((8, 16)).astype(np.float32)
    params = ComputeParams()
    n1 = ctx.unary(tensor(ctx, F32, x), UnaryOp.GELU)
    n2 = ctx.unary(tensor(ctx, F32, x), UnaryOp.SILU)
    f1, f2 = compile_node(n1, params), compile_node(n2, params)
    f1()
    f2()
    assert params.work.size >= x.nbytes
    assert_close(n1.numpy(), unary_ref(UnaryOp.GELU, F32, x), F32, atol=1e-6)
    assert_close(n2.numpy(), x / (1 + np.exp(-x.astype(np.float64))), F32, atol=1e-6)
