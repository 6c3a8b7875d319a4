"""Every op builder against ggml's shape rule: result ne and type, op, sources, op_params words,
in-place results as views, and clear errors for operands the rule rejects."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGMLError, ShapeError
from pyggml.core.ops.conv import calc_conv_output_size
from pyggml.core.ops.custom import custom_op_params
from pyggml.core.tensor import GGMLOp, OpPool, ScaleFlag, ScaleMode, SortOrder, Tensor, UnaryOp
from pyggml.core.types import GGMLType

F32, F16, I32, Q4_0, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.Q4_0, GGMLType.Q8_0


def w(x: float) -> int:
    """A float as the int32 word ggml stores."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def words(t: Tensor, n: int) -> list[int]:
    return [int(x) for x in t.op_params[:n]]


def srcs(t: Tensor) -> list[Tensor]:
    return [s for s in t.src if s is not None]


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 22, no_alloc=True)


def new(ctx: Context, type: GGMLType, *ne: int, name: str = "") -> Tensor:
    return ctx.new_tensor(type, list(ne)).set_name(name)


def check(t: Tensor, op: GGMLOp, ne: list[int], type: GGMLType, sources: list[Tensor]) -> None:
    assert t.op == op
    assert t.ne == ne
    assert t.type == type
    assert srcs(t) == sources
    assert t.src[: len(sources)] == sources  # in order, from src[0]


def check_inplace(t: Tensor, a: Tensor) -> None:
    """An in-place result is a view of `a` with a's layout."""
    assert t.view_src is a and t.view_offs == 0
    assert t.ne == a.ne and t.nb == a.nb


def check_new(t: Tensor) -> None:
    assert t.view_src is None
    assert t.is_contiguous()


# --- binary element-wise ops with broadcasting ---


@pytest.mark.parametrize("name,op", [("add", GGMLOp.ADD), ("sub", GGMLOp.SUB), ("mul", GGMLOp.MUL),
                                     ("div", GGMLOp.DIV)])
def test_binary_broadcasts_b_to_a(ctx: Context, name: str, op: GGMLOp) -> None:
    a = new(ctx, F32, 8, 6, 4, 2)
    b = new(ctx, F32, 8, 1, 2, 1)
    r = getattr(ops, name)(ctx, a, b)
    check(r, op, [8, 6, 4, 2], F32, [a, b])
    check_new(r)
    ri = getattr(ops, name + "_inplace")(ctx, a, b)
    check(ri, op, [8, 6, 4, 2], F32, [a, b])
    check_inplace(ri, a)
    ah = new(ctx, F16, 8, 6)
    assert getattr(ctx, name)(ah, new(ctx, F32, 8, 1)).type == F16  # the result has a's type


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_rejects_b_that_does_not_repeat(ctx: Context, name: str) -> None:
    a = new(ctx, F32, 8, 6, name="x")
    b = new(ctx, F32, 8, 4, name="y")
    with pytest.raises(ShapeError, match=rf"^{name}: b must repeat to a's shape .*'x' F32\[8, 6, 1, 1\], "
                                         r"'y' F32\[8, 4, 1, 1\]"):
        getattr(ctx, name)(a, b)
    with pytest.raises(ShapeError):
        getattr(ctx, name)(b, new(ctx, F32, 8, 6))  # b bigger than a
    assert len(ctx.tensors) == 3  # nothing made on error


def test_add1(ctx: Context) -> None:
    a = new(ctx, F32, 5, 3)
    s = new(ctx, F32, 1)
    check(ctx.add1(a, s), GGMLOp.ADD1, [5, 3, 1, 1], F32, [a, s])
    check_inplace(ctx.add1_inplace(a, s), a)
    with pytest.raises(ShapeError, match="add1: b must be a scalar"):
        ctx.add1(a, new(ctx, F32, 2))


def test_acc_and_set(ctx: Context) -> None:
    a = new(ctx, F32, 8, 6, 2)
    b = new(ctx, F32, 3, 2, 2)
    r = ctx.acc(a, b, 32, 192, 384, 12)
    check(r, GGMLOp.ACC, [8, 6, 2, 1], F32, [a, b])
    assert words(r, 6) == [32, 192, 384, 12, 0, 0]
    check_new(r)
    ri = ctx.acc_inplace(a, b, 32, 192, 384, 12)
    assert words(ri, 5) == [32, 192, 384, 12, 1]
    check_inplace(ri, a)
    s = ctx.set(a, b, 32, 192, 384, 8)
    check(s, GGMLOp.SET, [8, 6, 2, 1], F32, [a, b])
    assert words(s, 5) == [32, 192, 384, 8, 0]
    si = ctx.set_inplace(a, b, 32, 192, 384, 8)
    assert words(si, 5) == [32, 192, 384, 8, 1]
    check_inplace(si, a)
    # set_1d/set_2d take a's own strides for the rest
    assert words(ctx.set_1d(a, b, 4), 5) == [32, 192, 384, 4, 0]
    assert words(ctx.set_1d_inplace(a, b, 4), 5) == [32, 192, 384, 4, 1]
    assert words(ctx.set_2d(a, b, 64, 4), 5) == [64, 192, 384, 4, 0]
    assert words(ctx.set_2d_inplace(a, b, 64, 4), 5) == [64, 192, 384, 4, 1]


def test_acc_and_set_errors(ctx: Context) -> None:
    a = new(ctx, F32, 4, 2, name="a")
    big = new(ctx, F32, 4, 3, name="big")
    with pytest.raises(ShapeError, match="acc: b has 12 elements, more than a's 8"):
        ctx.acc(a, big, 16, 32, 32, 0)
    with pytest.raises(ShapeError, match="set: b has 12 elements, more than a's 8"):
        ctx.set_1d(a, big, 0)
    with pytest.raises(ShapeError, match="acc: a must be contiguous"):
        ctx.acc(ctx.transpose(big), a, 16, 32, 32, 0)


@pytest.mark.parametrize("name,op", [("sqr", GGMLOp.SQR), ("sqrt", GGMLOp.SQRT), ("log", GGMLOp.LOG)])
def test_same_shape_math(ctx: Context, name: str, op: GGMLOp) -> None:
    a = new(ctx, F16, 6, 5, 4)
    r = getattr(ctx, name)(a)
    check(r, op, [6, 5, 4, 1], F16, [a])
    check_new(r)
    ri = getattr(ctx, name + "_inplace")(a)
    check(ri, op, [6, 5, 4, 1], F16, [a])
    check_inplace(ri, a)


def test_scale_clamp_leaky_relu_params(ctx: Context) -> None:
    a = new(ctx, F32, 6, 5)
    r = ctx.scale(a, 0.125)
    check(r, GGMLOp.SCALE, [6, 5, 1, 1], F32, [a])
    assert words(r, 2) == [w(0.125), 0]
    check_inplace(ctx.scale_inplace(a, 2.0), a)
    sb = ctx.scale_bias(a, 0.5, -2.0)
    assert words(sb, 3) == [w(0.5), w(-2.0), 0]  # today's ggml: [s, b]
    check_new(sb)
    check_inplace(ctx.scale_bias_inplace(a, 0.5, 1.0), a)
    c = ctx.clamp(a, -1.5, 3.0)
    check(c, GGMLOp.CLAMP, [6, 5, 1, 1], F32, [a])
    assert words(c, 3) == [w(-1.5), w(3.0), 0]
    check_new(c)  # today's ggml: a new tensor (ggml of late 2023 clamped in place)
    check_inplace(ctx.clamp_inplace(a, -1.5, 3.0), a)
    lr = ctx.leaky_relu(a, 0.01)
    check(lr, GGMLOp.LEAKY_RELU, [6, 5, 1, 1], F32, [a])
    assert words(lr, 1) == [w(0.01)]
    check_new(lr)
    check_inplace(ctx.leaky_relu(a, 0.1, True), a)


UNARIES = [("abs", UnaryOp.ABS), ("sgn", UnaryOp.SGN), ("neg", UnaryOp.NEG), ("step", UnaryOp.STEP),
           ("tanh", UnaryOp.TANH), ("elu", UnaryOp.ELU), ("relu", UnaryOp.RELU), ("gelu", UnaryOp.GELU),
           ("gelu_quick", UnaryOp.GELU_QUICK), ("silu", UnaryOp.SILU), ("hardswish", UnaryOp.HARDSWISH),
           ("hardsigmoid", UnaryOp.HARDSIGMOID), ("sigmoid", UnaryOp.SIGMOID), ("gelu_erf", UnaryOp.GELU_ERF),
           ("exp", UnaryOp.EXP), ("expm1", UnaryOp.EXPM1), ("softplus", UnaryOp.SOFTPLUS), ("floor", UnaryOp.FLOOR),
           ("ceil", UnaryOp.CEIL), ("round", UnaryOp.ROUND), ("trunc", UnaryOp.TRUNC)]


@pytest.mark.parametrize("name,uop", UNARIES)
def test_unary_shortcuts(ctx: Context, name: str, uop: UnaryOp) -> None:
    a = new(ctx, F32, 7, 3)
    r = getattr(ctx, name)(a)
    check(r, GGMLOp.UNARY, [7, 3, 1, 1], F32, [a])
    assert words(r, 2) == [int(uop), 0]
    check_new(r)
    ri = getattr(ctx, name + "_inplace")(a)
    assert words(ri, 1) == [int(uop)]
    check_inplace(ri, a)
    assert words(ctx.unary(a, uop), 1) == [int(uop)]


def test_xielu_params(ctx: Context) -> None:
    a = new(ctx, F32, 7, 3)
    r = ctx.xielu(a, 0.8, 0.5, 0.5, -1e-6)
    check(r, GGMLOp.UNARY, [7, 3, 1, 1], F32, [a])
    check_new(r)
    # ggml_xielu: [XIELU, beta + softplus(alpha_n), softplus(alpha_p), beta, eps]
    def sp(x: float) -> float:  # softplus
        return float(np.log1p(np.exp(x)))

    assert words(r, 6) == [int(UnaryOp.XIELU), w(0.5 + sp(0.8)), w(sp(0.5)), w(0.5), w(-1e-6), 0]


# --- reductions and sorting ---


def test_sum_sum_rows_mean(ctx: Context) -> None:
    a = new(ctx, F16, 7, 5, 3, 2)
    check(ctx.sum(a), GGMLOp.SUM, [1, 1, 1, 1], F16, [a])
    check(ctx.sum_rows(a), GGMLOp.SUM_ROWS, [1, 5, 3, 2], F16, [a])
    check(ctx.mean(a), GGMLOp.MEAN, [1, 5, 3, 2], F32, [a])


def test_argmax(ctx: Context) -> None:
    a = new(ctx, F32, 10, 4)
    check(ctx.argmax(a), GGMLOp.ARGMAX, [4, 1, 1, 1], I32, [a])
    with pytest.raises(ShapeError, match=r"argmax: a must be a matrix .*\[10, 4, 2, 1\]"):
        ctx.argmax(new(ctx, F32, 10, 4, 2))


def test_argsort_and_top_k(ctx: Context) -> None:
    a = new(ctx, F32, 10, 4, 3)
    r = ctx.argsort(a, SortOrder.DESC)
    check(r, GGMLOp.ARGSORT, [10, 4, 3, 1], I32, [a])
    assert words(r, 2) == [1, 0]
    assert words(ctx.argsort(a), 1) == [0]  # ASC by default
    t = ctx.top_k(a, 3)  # today's TOP_K op
    check(t, GGMLOp.TOP_K, [3, 4, 3, 1], I32, [a])
    assert words(t, 1) == [0]
    with pytest.raises(ArgumentError, match=r"top_k: k=11 must be in \[0, ne\[0\]=10\]"):
        ctx.top_k(a, 11)
    k = ctx.argsort_top_k(a, 3)
    # a view of the first 3 indices of each row of a descending argsort
    assert k.op == GGMLOp.VIEW and k.ne == [3, 4, 3, 1] and k.type == I32
    s = k.src[0]
    assert s is not None and s.op == GGMLOp.ARGSORT and words(s, 1) == [int(SortOrder.DESC)] and s.src[0] is a
    assert k.view_src is s and k.view_offs == 0 and k.nb == s.nb
    with pytest.raises(ArgumentError, match=r"argsort_top_k: k=11 must be in \[0, ne\[0\]=10\]"):
        ctx.argsort_top_k(a, 11)


# --- layout ops ---


def test_dup_cpy_cont(ctx: Context) -> None:
    a = new(ctx, F32, 4, 3, name="a")
    check(ctx.dup(a), GGMLOp.DUP, [4, 3, 1, 1], F32, [a])
    check_inplace(ctx.dup_inplace(a), a)
    b = new(ctx, F16, 12, name="b")
    c = ctx.cpy(a, b)
    check(c, GGMLOp.CPY, [12, 1, 1, 1], F16, [a, b])
    check_inplace(c, b)  # the copy's result is a view of its destination
    assert c.name == "b (copy of a)"
    with pytest.raises(ShapeError, match="cpy: the tensors must have the same number of elements"):
        ctx.cpy(a, new(ctx, F16, 11))
    t = ctx.transpose(a)
    ct = ctx.cont(t)
    check(ct, GGMLOp.CONT, [3, 4, 1, 1], F32, [t])
    check_new(ct)
    check(ctx.cont_2d(t, 6, 2), GGMLOp.CONT, [6, 2, 1, 1], F32, [t])
    check(ctx.cont_4d(t, 1, 2, 3, 2), GGMLOp.CONT, [1, 2, 3, 2], F32, [t])
    with pytest.raises(ShapeError, match=r"cont_4d: 12 elements cannot take shape \[5, 1, 1, 1\]"):
        ctx.cont_1d(t, 5)


def test_reshape(ctx: Context) -> None:
    a = new(ctx, F32, 6, 4, name="a")
    r = ctx.reshape_3d(a, 2, 3, 4)
    check(r, GGMLOp.RESHAPE, [2, 3, 4, 1], F32, [a])
    assert r.view_src is a and r.nb == [4, 8, 24, 96]
    assert ctx.reshape(a, new(ctx, I32, 24)).ne == [24, 1, 1, 1]
    assert ctx.reshape_4d(a, 1, 2, 3, 4).ne == [1, 2, 3, 4]
    with pytest.raises(ShapeError, match=r"reshape_2d: 24 elements cannot take shape \[5, 5\]"):
        ctx.reshape_2d(a, 5, 5)
    with pytest.raises(ShapeError, match="reshape_1d: only contiguous tensors can be reshaped"):
        ctx.reshape_1d(ctx.transpose(a), 24)


def test_permute_rejects_non_permutations(ctx: Context) -> None:
    a = new(ctx, F32, 2, 3, 4, 5)
    with pytest.raises(ShapeError, match=r"permute: axes \[0, 0, 1, 2\] are not a permutation"):
        ctx.permute(a, 0, 0, 1, 2)
    with pytest.raises(ShapeError):
        ctx.permute(a, 0, 1, 2, 4)


def test_get_rows(ctx: Context) -> None:
    a = new(ctx, Q4_0, 64, 10, 3)
    idx = new(ctx, I32, 5, 3)
    r = ctx.get_rows(a, idx)
    check(r, GGMLOp.GET_ROWS, [64, 5, 3, 1], F32, [a, idx])  # quantized rows come out F32
    ai = new(ctx, I32, 4, 10)
    assert ctx.get_rows(ai, new(ctx, I32, 2)).type == I32
    with pytest.raises(ShapeError, match="get_rows: indices must be I32"):
        ctx.get_rows(a, new(ctx, F32, 5, 3))
    with pytest.raises(ShapeError, match=r"get_rows: a.ne\[2\] must equal b.ne\[1\]"):
        ctx.get_rows(a, new(ctx, I32, 5, 2))


def test_repeat_concat_diag_pad_upscale(ctx: Context) -> None:
    a = new(ctx, F32, 4, 1, 2)
    b = new(ctx, F16, 8, 3, 2, 2)
    check(ctx.repeat(a, b), GGMLOp.REPEAT, [8, 3, 2, 2], F32, [a])
    with pytest.raises(ShapeError, match="repeat: each dimension of b must be a multiple of a's"):
        ctx.repeat(b, a)
    c1 = new(ctx, F32, 4, 3, 2)
    c2 = new(ctx, F32, 4, 3, 5)
    cat = ctx.concat(c1, c2, 2)
    check(cat, GGMLOp.CONCAT, [4, 3, 7, 1], F32, [c1, c2])
    assert words(cat, 2) == [2, 0]  # the dimension in op_params[0]
    c0 = ctx.concat(c1, new(ctx, F32, 6, 3, 2), 0)
    check(c0, GGMLOp.CONCAT, [10, 3, 2, 1], F32, [c1, c0.src[1]])
    assert words(c0, 1) == [0]
    with pytest.raises(ShapeError, match="concat: the dimensions other than 2 must match"):
        ctx.concat(c1, new(ctx, F32, 4, 2, 2), 2)
    with pytest.raises(ShapeError, match="concat: a and b must have the same type"):
        ctx.concat(c1, new(ctx, F16, 4, 3, 2), 2)
    with pytest.raises(ArgumentError, match=r"concat: dim=4 must be in \[0, 4\)"):
        ctx.concat(c1, c2, 4)
    row = new(ctx, F32, 5, 1, 3)
    check(ctx.diag(row), GGMLOp.DIAG, [5, 5, 3, 1], F32, [row])
    with pytest.raises(ShapeError, match="diag: a must be a row"):
        ctx.diag(c1)
    p = ctx.pad(c1, 1, 0, 2, 3)
    check(p, GGMLOp.PAD, [5, 3, 4, 4], F32, [c1])
    assert words(p, 10) == [0, 1, 0, 0, 0, 2, 0, 3, 0, 0]  # ggml_pad is ggml_pad_ext with right padding only
    pe = ctx.pad_ext(c1, 1, 2, 3, 0, 0, 1, 0, 0)
    check(pe, GGMLOp.PAD, [7, 6, 3, 1], F32, [c1])
    assert words(pe, 10) == [1, 2, 3, 0, 0, 1, 0, 0, 0, 0]
    assert words(ctx.pad_circular(c1, 1, 0, 0, 0), 10) == [0, 1, 0, 0, 0, 0, 0, 0, 1, 0]  # word 8: circular
    with pytest.raises(ArgumentError, match="pad_ext: paddings must be >= 0"):
        ctx.pad_ext(c1, -1, 0, 0, 0, 0, 0, 0, 0)
    up = ctx.upscale(c1, 3)
    check(up, GGMLOp.UPSCALE, [12, 9, 2, 1], F32, [c1])
    assert words(up, 2) == [int(ScaleMode.NEAREST), 0]  # op_params[0]: the scale mode
    assert words(ctx.upscale(c1, 2, ScaleMode.BICUBIC), 1) == [2]
    assert words(ctx.upscale(c1, 2, ScaleMode.BILINEAR | ScaleFlag.ANTIALIAS), 1) == [513]  # flags as ggml_upscale
    with pytest.raises(ArgumentError, match="interpolate: ANTIALIAS works with BILINEAR only"):
        ctx.upscale(c1, 2, ScaleMode.NEAREST | ScaleFlag.ANTIALIAS)
    ue = ctx.upscale_ext(c1, 5, 7, 3, 2, ScaleMode.BILINEAR)
    check(ue, GGMLOp.UPSCALE, [5, 7, 3, 2], F32, [c1])
    assert words(ctx.interpolate(c1, 5, 7, 2, 1, ScaleMode.BILINEAR | 256), 1) == [257]  # | ALIGN_CORNERS
    with pytest.raises(ArgumentError, match="upscale: scale factor must be > 1, got 1"):
        ctx.upscale(c1, 1)
    with pytest.raises(ArgumentError, match="interpolate: ANTIALIAS works with BILINEAR only"):
        ctx.interpolate(c1, 5, 7, 2, 1, 512)


# --- matrix products ---


def test_mul_mat_shape(ctx: Context) -> None:
    a = new(ctx, Q4_0, 64, 10)  # K=64, M=10
    b = new(ctx, F32, 64, 7)  # K=64, N=7
    r = ctx.mul_mat(a, b)
    check(r, GGMLOp.MUL_MAT, [10, 7, 1, 1], F32, [a, b])
    check_new(r)


def test_mul_mat_broadcasts_a_over_dims_2_and_3(ctx: Context) -> None:
    a = new(ctx, F16, 32, 6, 2, 1)  # 2 heads of K=32, M=6
    b = new(ctx, F32, 32, 5, 8, 3)  # 8 x 3 batches
    check(ctx.mul_mat(a, b), GGMLOp.MUL_MAT, [6, 5, 8, 3], F32, [a, b])


def test_mul_mat_errors(ctx: Context) -> None:
    a = new(ctx, F32, 32, 6, 3, name="w")
    with pytest.raises(ShapeError, match=r"^mul_mat: a.ne\[0\] must equal b.ne\[0\].*'w' F32\[32, 6, 3, 1\], "
                                         r"'x' F32\[16, 5, 3, 1\]"):
        ctx.mul_mat(a, new(ctx, F32, 16, 5, 3, name="x"))
    with pytest.raises(ShapeError, match="mul_mat"):
        ctx.mul_mat(a, new(ctx, F32, 32, 5, 4))  # 4 batches are not a multiple of 3
    t = ctx.transpose(new(ctx, F32, 6, 32))
    with pytest.raises(ShapeError, match="mul_mat: a must not be transposed"):
        ctx.mul_mat(t, new(ctx, F32, 32, 5))


def test_out_prod(ctx: Context) -> None:
    a = new(ctx, F32, 6, 8, 2)
    b = new(ctx, F32, 5, 8, 4)
    check(ctx.out_prod(a, b), GGMLOp.OUT_PROD, [6, 5, 4, 1], F32, [a, b])  # ggml 0c1e570: ne2 = b.ne[2], a broadcast
    with pytest.raises(ShapeError, match=r"out_prod: a.ne\[1\] must equal b.ne\[1\]"):
        ctx.out_prod(a, new(ctx, F32, 5, 7, 4))


# --- norms, soft_max, masks ---


@pytest.mark.parametrize("name,op", [("norm", GGMLOp.NORM), ("rms_norm", GGMLOp.RMS_NORM)])
def test_norms(ctx: Context, name: str, op: GGMLOp) -> None:
    a = new(ctx, F32, 16, 4, 2)
    r = getattr(ctx, name)(a, 1e-5)
    check(r, op, [16, 4, 2, 1], F32, [a])
    assert words(r, 2) == [w(1e-5), 0]
    check_new(r)
    ri = getattr(ctx, name + "_inplace")(a, 1e-6)
    assert words(ri, 1) == [w(1e-6)]
    check_inplace(ri, a)


def test_group_norm(ctx: Context) -> None:
    a = new(ctx, F32, 8, 8, 32, 1)
    r = ctx.group_norm(a, 8, 1e-6)
    check(r, GGMLOp.GROUP_NORM, [8, 8, 32, 1], F32, [a])
    assert words(r, 3) == [8, w(1e-6), 0]  # today's ggml: [n_groups, eps]
    check_inplace(ctx.group_norm_inplace(a, 4, 1e-5), a)
    with pytest.raises(ArgumentError, match="group_norm: n_groups must be >= 1, got 0"):
        ctx.group_norm(a, 0, 1e-6)


def test_soft_max_variants(ctx: Context) -> None:
    a = new(ctx, F32, 32, 8, 4)
    r = ctx.soft_max(a)
    check(r, GGMLOp.SOFT_MAX, [32, 8, 4, 1], F32, [a])
    assert r.src[1] is None
    assert words(r, 2) == [w(1.0), 0]
    check_new(r)
    check_inplace(ctx.soft_max_inplace(a), a)
    mask = new(ctx, F32, 32, 8)
    e = ctx.soft_max_ext(a, mask, 0.125)
    check(e, GGMLOp.SOFT_MAX, [32, 8, 4, 1], F32, [a, mask])
    assert e.src[1] is mask
    assert words(e, 3) == [w(0.125), w(0.0), 0]  # [scale, max_bias]
    alibi = ctx.soft_max_ext(a, mask, 1.0, 8.0)  # ALiBi: max_bias > 0
    assert words(alibi, 2) == [w(1.0), w(8.0)]
    assert ctx.soft_max_ext(a, new(ctx, F32, 32, 12), 1.0).src[1] is not None  # more mask rows than a's
    assert ctx.soft_max_ext(a, new(ctx, F16, 32, 8, 2), 1.0).src[1] is not None  # F16, broadcast over dim 2
    assert ctx.soft_max_ext(a, None, 0.5).src[1] is None
    check_inplace(ctx.soft_max_ext_inplace(a, mask, 0.5), a)
    sinks = new(ctx, F32, 4)
    ops.soft_max_add_sinks(e, sinks)
    assert e.src[2] is sinks


def test_soft_max_errors(ctx: Context) -> None:
    a = new(ctx, F32, 32, 8, 4, name="kq")
    with pytest.raises(ShapeError, match=r"soft_max_ext: the mask must have a's rows.*'kq'.*'m' F32\[16, 8"):
        ctx.soft_max_ext(a, new(ctx, F32, 16, 8, name="m"), 1.0)
    with pytest.raises(ShapeError, match="soft_max_ext: the mask must have a's rows"):
        ctx.soft_max_ext(a, new(ctx, F32, 32, 7), 1.0)  # fewer rows than a's
    with pytest.raises(ShapeError, match="the mask must broadcast over a's dims 2 and 3"):
        ctx.soft_max_ext(a, new(ctx, F32, 32, 8, 3), 1.0)
    with pytest.raises(ArgumentError, match="max_bias=8.0 > 0 \\(ALiBi\\) needs a mask"):
        ctx.soft_max_ext(a, None, 1.0, 8.0)
    with pytest.raises(ShapeError, match="soft_max: a must be contiguous"):
        ctx.soft_max(ctx.transpose(a))


@pytest.mark.parametrize("name,op", [("diag_mask_inf", GGMLOp.DIAG_MASK_INF),
                                     ("diag_mask_zero", GGMLOp.DIAG_MASK_ZERO)])
def test_diag_masks(ctx: Context, name: str, op: GGMLOp) -> None:
    a = new(ctx, F32, 10, 6, 4)
    r = getattr(ctx, name)(a, 4)
    check(r, op, [10, 6, 4, 1], F32, [a])
    assert words(r, 2) == [4, 0]
    check_new(r)
    ri = getattr(ctx, name + "_inplace")(a, 3)
    assert words(ri, 1) == [3]
    check_inplace(ri, a)


# --- rope ---


def test_rope_params(ctx: Context) -> None:
    a = new(ctx, F32, 64, 8, 5)  # head_dim 64, 8 heads, 5 tokens
    pos = new(ctx, I32, 5)
    r = ctx.rope(a, pos, 64, 2)
    check(r, GGMLOp.ROPE, [64, 8, 5, 1], F32, [a, pos])
    check_new(r)
    # today's ggml_rope_impl: [n_past=0, n_dims, mode, n_ctx=0, n_ctx_orig, 6 floats, sections[4], n_offs]
    assert words(r, 16) == [0, 64, 2, 0, 0, w(10000.0), w(1.0), w(0.0), w(1.0), w(0.0), w(0.0), 0, 0, 0, 0, 0]
    assert words(ctx.rope(a, pos, 64, 2, 512), 16) == words(r, 16)  # 2023's n_ctx argument is unused
    c = ctx.rope_custom(a, pos, 32, 0, 2048, 500000.0, 0.25, 1.0, 0.9, 32.0, 1.0)
    want = [0, 32, 0, 0, 2048, w(500000.0), w(0.25), w(1.0), w(0.9), w(32.0), w(1.0), 0, 0, 0, 0, 0]
    assert words(c, 16) == want
    ff = new(ctx, F32, 16)
    e = ctx.rope_ext(a, pos, ff, 32, 0, 2048, 500000.0, 0.25, 1.0, 0.9, 32.0, 1.0)
    check(e, GGMLOp.ROPE, [64, 8, 5, 1], F32, [a, pos, ff])
    assert words(e, 16) == want
    check_inplace(ctx.rope_inplace(a, pos, 64, 0), a)
    ci = ctx.rope_custom_inplace(a, pos, 32, 0, 2048, 500000.0, 0.25, 1.0, 0.9, 32.0, 1.0)
    check_inplace(ci, a)
    assert words(ci, 16) == want
    check_inplace(ctx.rope_ext_inplace(a, pos, None, 32, 0, 2048, 500000.0, 0.25, 1.0, 0.9, 32.0, 1.0), a)
    pos4 = new(ctx, I32, 20)  # multi-rope: 4 positions per token
    m = ctx.rope_multi(a, pos4, None, 32, [8, 4, 4, 0], 8, 2048, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert words(m, 16)[:3] == [0, 32, 8] and words(m, 16)[11:] == [8, 4, 4, 0, 0]  # sections in 11..14
    check_inplace(ctx.rope_multi_inplace(a, pos4, None, 32, [8, 4, 4, 0], 40, 2048, 1e4, 1.0, 0.0, 1.0, 32.0,
                                         1.0), a)
    assert ops.rope_set_offset(ctx.rope(a, pos, 32, 2), 16).op_params[15] == 16  # n_offs in word 15


def test_rope_errors(ctx: Context) -> None:
    a = new(ctx, F32, 64, 8, 5, name="q")
    with pytest.raises(ShapeError, match=r"rope: b.ne\[0\]=4 must be 1 position\(s\) for each of a.ne\[2\]=5"):
        ctx.rope(a, new(ctx, I32, 4, name="pos"), 64, 0)
    with pytest.raises(ShapeError, match="rope: positions b must be I32"):
        ctx.rope(a, new(ctx, F32, 5), 64, 0)
    with pytest.raises(ShapeError, match="rope_inplace: positions b must be a vector"):
        ctx.rope_inplace(a, new(ctx, I32, 5, 2), 64, 0)
    with pytest.raises(ArgumentError, match="rope: mode=1: mode & 1 is no longer supported"):
        ctx.rope(a, new(ctx, I32, 5), 64, 1)
    with pytest.raises(ShapeError, match=r"rope: b.ne\[0\]=5 must be 4 position\(s\)"):
        ctx.rope_multi(a, new(ctx, I32, 5), None, 32, [8, 4, 4, 0], 8, 0, 1e4, 1.0, 0.0, 1.0, 0.0, 0.0)
    with pytest.raises(ShapeError, match="the frequency factors c must be F32 with at least n_dims/2=32"):
        ctx.rope_ext(a, new(ctx, I32, 5), new(ctx, F32, 16), 64, 0, 0, 1e4, 1.0, 0.0, 1.0, 0.0, 0.0)
    with pytest.raises(ArgumentError, match="rope_set_offset: n_offs=8 must be even, >= 0, and n_offs"):
        ops.rope_set_offset(ctx.rope(a, new(ctx, I32, 5), 64, 0), 8)


# --- convolution and pooling ---


def test_im2col_2d(ctx: Context) -> None:
    k = new(ctx, F16, 3, 3, 4, 8)  # KW, KH, IC, OC
    x = new(ctx, F32, 10, 9, 4, 2)  # W, H, IC, N
    r = ctx.im2col(k, x, 2, 1, 1, 0, 1, 2, True)
    # OW = (10 + 2 - 2 - 1)/2 + 1 = 5; OH = (9 + 0 - 4 - 1)/1 + 1 = 5
    check(r, GGMLOp.IM2COL, [36, 5, 5, 2], F16, [k, x])
    assert words(r, 8) == [2, 1, 1, 0, 1, 2, 1, 0]
    assert ctx.im2col(k, x, 1, 1, 0, 0, 1, 1, True, F32).type == F32


def test_im2col_1d(ctx: Context) -> None:
    k = new(ctx, F16, 3, 4, 8)  # K, IC, OC
    x = new(ctx, F32, 12, 4, 2)  # L, IC, N
    r = ctx.im2col(k, x, 2, 0, 1, 0, 1, 0, False)
    check(r, GGMLOp.IM2COL, [12, 6, 2, 1], F16, [k, x])  # OL = (12 + 2 - 2 - 1)/2 + 1 = 6
    assert words(r, 7) == [2, 0, 1, 0, 1, 0, 0]


def test_im2col_errors(ctx: Context) -> None:
    k = new(ctx, F16, 3, 3, 4, 8, name="k")
    with pytest.raises(ShapeError, match=r"im2col: the kernel's channels a.ne\[2\] must equal the input's b.ne\[2\]"):
        ctx.im2col(k, new(ctx, F32, 10, 9, 3, 1), 1, 1, 0, 0, 1, 1, True)
    with pytest.raises(ShapeError, match="wider than the padded input"):
        ctx.im2col(k, new(ctx, F32, 2, 9, 4, 1), 1, 1, 0, 0, 1, 1, True)
    with pytest.raises(ArgumentError, match="stride 0 and dilation 1 must be >= 1"):
        ctx.im2col(k, new(ctx, F32, 10, 9, 4, 1), 0, 1, 0, 0, 1, 1, True)


def test_conv_1d_is_im2col_and_mul_mat(ctx: Context) -> None:
    k = new(ctx, F16, 3, 4, 8)  # K, IC, OC
    x = new(ctx, F32, 12, 4, 1)  # L, IC, N=1
    r = ctx.conv_1d(k, x, 1, 1, 1)
    assert r.ne == [12, 8, 1, 1] and r.type == F32
    # ggml's graph: RESHAPE(MUL_MAT(RESHAPE(IM2COL(k, x)), RESHAPE(k)))
    assert r.op == GGMLOp.RESHAPE
    mm = r.src[0]
    assert mm is not None and mm.op == GGMLOp.MUL_MAT and mm.ne == [12, 8, 1, 1]
    cols, kr = mm.src[0], mm.src[1]
    assert cols is not None and kr is not None
    assert cols.op == GGMLOp.RESHAPE and cols.ne == [12, 12, 1, 1]
    assert cols.src[0] is not None and cols.src[0].op == GGMLOp.IM2COL
    assert kr.op == GGMLOp.RESHAPE and kr.src[0] is k and kr.ne == [12, 8, 1, 1]
    ph = ctx.conv_1d_ph(k, x, 2, 1)
    im = ph.src[0].src[0].src[0]  # type: ignore[union-attr]
    assert words(im, 7) == [2, 0, 1, 0, 1, 0, 0]  # padding a.ne[0] / 2 = 1
    assert ph.ne == [6, 8, 1, 1]


def test_conv_2d_shapes(ctx: Context) -> None:
    k = new(ctx, F16, 3, 3, 4, 8)
    x1 = new(ctx, F32, 10, 9, 4, 1)
    r = ctx.conv_2d(k, x1, 1, 1, 1, 1, 1, 1)
    assert r.op == GGMLOp.RESHAPE and r.ne == [10, 9, 8, 1] and r.type == F32
    x2 = new(ctx, F32, 10, 9, 4, 3)
    r2 = ctx.conv_2d(k, x2, 2, 2, 0, 0, 1, 1)
    assert r2.ne == [4, 4, 8, 3]
    assert r2.op == GGMLOp.CONT and r2.src[0] is not None and r2.src[0].op == GGMLOp.PERMUTE
    sk = ctx.conv_2d_sk_p0(new(ctx, F16, 2, 2, 4, 8), new(ctx, F32, 8, 6, 4, 1))
    assert sk.ne == [4, 3, 8, 1]
    s1 = ctx.conv_2d_s1_ph(k, x1)
    assert s1.ne == [10, 9, 8, 1]


def test_conv_output_size_divides_as_c_does() -> None:
    # ggml_calc_conv_output_size is C integer division: toward zero, so a kernel (taps, dilation) up to
    # stride - 1 wider than the padded input still has one output
    assert calc_conv_output_size(1, 3, 5, 2, 4) == 1  # (1 + 4 - 8 - 1) / 5 + 1: -4 / 5 is 0
    assert calc_conv_output_size(1, 3, 2, 0, 4) == -3  # (1 - 8 - 1) / 2 + 1: no output, the builders refuse it
    assert calc_conv_output_size(141, 11, 3, 5, 2) == 44  # (141 + 10 - 20 - 1) / 3 + 1


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _im2col_ref(x: np.ndarray, kh: int, kw: int, s: tuple[int, int], p: tuple[int, int],
                d: tuple[int, int]) -> np.ndarray:
    """x (N, IC, H, W) -> (N, OH, OW, IC*KH*KW), ggml's im2col layout."""
    n, ic, h, wd = x.shape
    oh = (h + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
    ow = (wd + 2 * p[0] - d[0] * (kw - 1) - 1) // s[0] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (p[1], p[1]), (p[0], p[0])))
    out = np.zeros((n, oh, ow, ic, kh, kw), np.float32)
    for y in range(kh):
        for z in range(kw):
            y0, z0 = y * d[1], z * d[0]
            out[:, :, :, :, y, z] = xp[:, :, y0: y0 + s[1] * (oh - 1) + 1: s[1],
                                       z0: z0 + s[0] * (ow - 1) + 1: s[0]].transpose(0, 2, 3, 1)
    return out.reshape(n, oh, ow, ic * kh * kw)


def _conv_ref(x: np.ndarray, k: np.ndarray, s: tuple[int, int], p: tuple[int, int],
              d: tuple[int, int]) -> np.ndarray:
    """x (N, IC, H, W), k (OC, IC, KH, KW) -> (N, OC, OH, OW), written straight from the definition."""
    n, ic, h, wd = x.shape
    oc, _, kh, kw = k.shape
    oh = (h + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
    ow = (wd + 2 * p[0] - d[0] * (kw - 1) - 1) // s[0] + 1
    out = np.zeros((n, oc, oh, ow))
    for i in range(oh):
        for j in range(ow):
            for y in range(kh):
                for z in range(kw):
                    iy, iz = i * s[1] + y * d[1] - p[1], j * s[0] + z * d[0] - p[0]
                    if 0 <= iy < h and 0 <= iz < wd:
                        out[:, :, i, j] += x[:, :, iy, iz] @ k[:, :, y, z].T
    return out


def _eval_conv_graph(ctx: Context, result: Tensor, x: np.ndarray, k: np.ndarray, kh: int, kw: int,
                     s: tuple[int, int], p: tuple[int, int], d: tuple[int, int]) -> np.ndarray:
    """Compute the conv graph's nodes with numpy (views read through their strides) and return the result."""
    g = ctx.new_graph()
    g.build_forward_expand(result)
    for node in g.nodes:
        if node.op == GGMLOp.IM2COL:
            node.numpy()[...] = _im2col_ref(x, kh, kw, s, p, d).reshape(node.numpy().shape)
        elif node.op == GGMLOp.MUL_MAT:
            a, b = node.src[0].numpy()[0, 0], node.src[1].numpy()[0, 0]  # type: ignore[union-attr]
            node.numpy()[0, 0] = b.astype(np.float32) @ a.astype(np.float32).T
        elif node.op == GGMLOp.CONT:
            node.numpy()[...] = node.src[0].numpy()  # type: ignore[union-attr]
        else:
            assert node.op in (GGMLOp.RESHAPE, GGMLOp.PERMUTE)  # views: nothing to compute
    return result.numpy()


@pytest.mark.parametrize("n", [1, 3])
def test_conv_2d_graph_computes_a_convolution(n: int, rng: np.random.Generator) -> None:
    ctx = Context(mem_size=1 << 22)
    x = rng.standard_normal((n, 3, 7, 8)).astype(np.float32)
    k = rng.standard_normal((5, 3, 3, 2)).astype(np.float32)
    tk = ctx.new_tensor_4d(F32, 2, 3, 3, 5)
    tk.numpy()[...] = k
    tx = ctx.new_tensor_4d(F32, 8, 7, 3, n)
    tx.numpy()[...] = x
    r = ctx.conv_2d(tk, tx, 2, 1, 1, 0, 1, 2)
    r.numpy()  # allocated in the arena
    got = _eval_conv_graph(ctx, r, x, k, 3, 2, (2, 1), (1, 0), (1, 2))
    want = _conv_ref(f16(x), k, (2, 1), (1, 0), (1, 2))  # IM2COL's result is F16
    assert got.shape == want.shape  # (N, OC, OH, OW) = reversed [OW, OH, OC, N]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2])
def test_conv_1d_graph_computes_a_convolution(n: int, rng: np.random.Generator) -> None:
    ctx = Context(mem_size=1 << 22)
    x = rng.standard_normal((n, 3, 11)).astype(np.float32)
    k = rng.standard_normal((4, 3, 3)).astype(np.float32)
    tk = ctx.new_tensor_3d(F32, 3, 3, 4)
    tk.numpy()[0] = k
    tx = ctx.new_tensor_3d(F32, 11, 3, n)
    tx.numpy()[0] = x
    r = ctx.conv_1d(tk, tx, 2, 1, 2)
    assert r.ne == [5, 4, n, 1]  # OL = (11 + 2 - 4 - 1)/2 + 1 = 5
    got = _eval_conv_graph(ctx, r, x[:, :, None, :], k[:, :, None, :], 1, 3, (2, 1), (1, 0), (2, 1))
    want = _conv_ref(f16(x)[:, :, None, :], k[:, :, None, :], (2, 1), (1, 0), (2, 1))[:, :, 0, :]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_1d(ctx: Context) -> None:
    k = new(ctx, F16, 3, 8, 4)  # K, OC, IC
    x = new(ctx, F32, 10, 4)  # L, IC
    r = ctx.conv_transpose_1d(k, x, 2, 0, 1)
    check(r, GGMLOp.CONV_TRANSPOSE_1D, [21, 8, 1, 1], F32, [k, x])  # (10 - 1)*2 + (3 - 1) + 1
    assert words(r, 4) == [2, 0, 1, 0]
    with pytest.raises(ShapeError, match=r"conv_transpose_1d: the kernel's a.ne\[2\] must equal"):
        ctx.conv_transpose_1d(k, new(ctx, F32, 10, 3), 1, 0, 1)
    with pytest.raises(ShapeError, match="the input b must be a matrix"):
        ctx.conv_transpose_1d(k, new(ctx, F32, 10, 4, 2), 1, 0, 1)


def test_pools(ctx: Context) -> None:
    a = new(ctx, F32, 12, 4, 3, 2)
    p1 = ctx.pool_1d(a, OpPool.AVG, 3, 2, 1)
    check(p1, GGMLOp.POOL_1D, [6, 4, 3, 2], F32, [a])  # (12 + 2 - 3)/2 + 1 = 6
    assert words(p1, 5) == [1, 3, 2, 1, 0]
    p2 = ctx.pool_2d(a, OpPool.MAX, 2, 3, 2, 1, 0, 1)
    check(p2, GGMLOp.POOL_2D, [6, 4, 3, 2], F32, [a])  # (12 - 2)/2 + 1 = 6, (4 + 2 - 3)/1 + 1 = 4
    assert words(p2, 8) == [0, 2, 3, 2, 1, 0, 1, 0]
    with pytest.raises(ShapeError, match=r"pool_1d: window 15 is wider than the padded row \(12 \+ 2\*1\)"):
        ctx.pool_1d(a, OpPool.MAX, 15, 1, 1)
    with pytest.raises(ArgumentError, match="pool_2d"):
        ctx.pool_2d(a, OpPool.MAX, 2, 2, 0, 1, 0, 0)
    with pytest.raises(ValueError):
        ctx.pool_1d(a, 7, 2, 2, 0)  # not a OpPool


# --- custom ops ---


def test_map_custom(ctx: Context) -> None:
    a = new(ctx, F32, 4, 3)
    b = new(ctx, F32, 4, 3)
    c = new(ctx, I32, 2)

    def fun(*args: object) -> None:
        pass

    r1 = ctx.map_custom1(a, fun, 2, "ud")
    check(r1, GGMLOp.MAP_CUSTOM1, [4, 3, 1, 1], F32, [a])
    check_new(r1)
    assert words(r1, 7) == [0, 0, 2, 0, 0, 0, 0]  # ggml's {fun, n_tasks, userdata}: n_tasks in word 2
    p = custom_op_params(r1)
    assert p.fun is fun and p.n_tasks == 2 and p.userdata == "ud"
    r2 = ctx.map_custom2(a, b, fun)
    check(r2, GGMLOp.MAP_CUSTOM2, [4, 3, 1, 1], F32, [a, b])
    assert custom_op_params(r2).n_tasks == -1 and custom_op_params(r2).userdata is None
    r3 = ctx.map_custom3_inplace(a, b, c, fun, 1, None)
    check(r3, GGMLOp.MAP_CUSTOM3, [4, 3, 1, 1], F32, [a, b, c])
    check_inplace(r3, a)
    check_inplace(ctx.map_custom1_inplace(a, fun), a)
    check_inplace(ctx.map_custom2_inplace(a, b, fun), a)
    assert ctx.map_custom3(a, b, c, fun).view_src is None
    with pytest.raises(ArgumentError, match="map_custom1: fun must be callable, got int"):
        ctx.map_custom1(a, 3, 1, None)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="n_tasks must be > 0 or GGML_N_TASKS_MAX"):
        ctx.map_custom2(a, b, fun, 0)
    with pytest.raises(ArgumentError, match="is not a custom node"):
        custom_op_params(a)


def test_custom(ctx: Context) -> None:
    a = new(ctx, F32, 4, 3)
    b = new(ctx, F16, 2)

    def fun(*args: object) -> None:
        pass

    r = ctx.custom_4d(F16, 5, 2, 1, 1, [a, b], fun, 3, "ud")
    check(r, GGMLOp.CUSTOM, [5, 2, 1, 1], F16, [a, b])
    check_new(r)
    assert words(r, 4) == [0, 0, 3, 0]
    assert custom_op_params(r).userdata == "ud"
    ri = ctx.custom_inplace(a, [b], fun)
    check(ri, GGMLOp.CUSTOM, [4, 3, 1, 1], F32, [a, b])
    check_inplace(ri, a)
    with pytest.raises(ArgumentError, match="custom_4d: 10 args, at most 9"):
        ctx.custom_4d(F32, 1, 1, 1, 1, [a] * 10, fun)


# --- all builders are reachable both ways ---


def test_every_builder_is_a_context_method() -> None:
    from pyggml.core.ops import OpBuilders

    methods = {n for n in vars(OpBuilders) if not n.startswith("_")}
    for name in methods:
        assert getattr(ops, name) is getattr(OpBuilders, name), name
    expected = {"add1", "acc_inplace", "set_2d_inplace", "log_inplace", "clamp", "leaky_relu", "hardsigmoid_inplace",
                "sum", "sum_rows", "mean", "argmax", "argsort", "top_k", "norm", "rms_norm_inplace",
                "group_norm_inplace", "soft_max", "soft_max_ext", "soft_max_inplace", "diag_mask_zero_inplace",
                "rope", "rope_inplace", "rope_custom", "rope_custom_inplace", "rope_ext", "im2col", "conv_1d",
                "conv_1d_ph", "conv_2d", "conv_2d_sk_p0", "conv_2d_s1_ph", "conv_transpose_1d", "pool_1d", "pool_2d",
                "map_custom1", "map_custom2_inplace", "map_custom3", "custom_4d", "custom_inplace", "pad_ext",
                "upscale_ext", "interpolate", "scale_bias", "argsort_top_k", "sigmoid", "xielu"}
    assert expected <= methods


def test_errors_leave_the_context_untouched(ctx: Context) -> None:
    a = new(ctx, F32, 8, 6)
    b = new(ctx, F32, 7, 2)
    q = new(ctx, F32, 8, 2, 3)
    pos = new(ctx, I32, 2)
    kern = new(ctx, F32, 3, 3, 4, 2)  # 4 input channels, q has 3
    n, used = len(ctx.tensors), ctx.used_mem()
    failing = [
        lambda: ctx.mul_mat(a, b),
        lambda: ctx.add(a, b),
        lambda: ctx.top_k(a, 9),
        lambda: ctx.rope(q, pos, 8, 0),
        lambda: ctx.argmax(q),
        lambda: ctx.conv_2d(kern, q, 1, 1, 0, 0, 1, 1),
        lambda: ctx.pool_1d(a, OpPool.MAX, 9, 1, 0),
        lambda: ctx.soft_max_ext(a, b, 1.0),
    ]
    for f in failing:
        with pytest.raises(GGMLError):
            f()
    assert len(ctx.tensors) == n
    assert ctx.used_mem() == used
