"""Element-wise ops: binary arithmetic with ggml's broadcasting (b repeats to
a's shape), ADD1, ACC, SET, SQR, SQRT, LOG, CLAMP, LEAKY_RELU, SCALE and the
unary functions (UNARY and its shortcuts relu, gelu, silu, ...), op_params as
ggml.c writes them (`pyggml.core.ops.params`).

Shape rules are ggml's. Where ggml asserts only what its own CPU kernel cannot
do (ADD1's packed rows, ACC's F32-only), the rule is left to the backends'
`supports_op`: pyggml's kernels take strided and F16 operands.

Names shadow a few builtins (abs, set, min/max arguments) on purpose: they are
ggml's names, and callers use them as `ops.abs` or `ctx.abs`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pyggml.core.checks import check_int
from pyggml.core.ops._build import as_enum, require, same_or_view, set_op
from pyggml.core.ops.params import AccParams, ClampParams, LeakyReluParams, ScaleParams, UnaryParams
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp, can_repeat, check_window, nbytes_of, strides

if TYPE_CHECKING:
    from pyggml.core.context import Context


def _binary(ctx: Context, op: GGMLOp, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    require(can_repeat(b, a), op.name.lower(), "b must repeat to a's shape (each a.ne[i] a multiple of b.ne[i])",
            a, b)
    return set_op(same_or_view(ctx, a, inplace), op, a, b)


def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.ADD, a, b, False)


def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.ADD, a, b, True)


def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.SUB, a, b, False)


def sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.SUB, a, b, True)


def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.MUL, a, b, False)


def mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.MUL, a, b, True)


def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.DIV, a, b, False)


def div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, GGMLOp.DIV, a, b, True)


def _scale(ctx: Context, a: Tensor, s: float, b: float, inplace: bool) -> Tensor:
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.SCALE, a, params=ScaleParams(s=s, b=b))


def scale(ctx: Context, a: Tensor, s: float, inplace: bool = False) -> Tensor:
    """a * s; op_params [s, b=0] (f32)."""
    return _scale(ctx, a, s, 0.0, inplace)


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    return _scale(ctx, a, s, 0.0, True)


def scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """a * s + b; op_params [s, b] (f32)."""
    return _scale(ctx, a, s, b, False)


def scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return _scale(ctx, a, s, b, True)


def unary(ctx: Context, a: Tensor, op: UnaryOp, inplace: bool = False) -> Tensor:
    """UNARY with the function in op_params[0] (a ggml_unary_op)."""
    op = as_enum(UnaryOp, op, "unary", "op")
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.UNARY, a, params=UnaryParams(op=op))


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return unary(ctx, a, op, True)


def add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a + b with b a scalar (one element)."""
    require(b.is_scalar(), "add1", "b must be a scalar (ne == [1, 1, 1, 1])", a, b)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.ADD1, a, b)


def add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return add1(ctx, a, b, True)


def _check_window(fn: str, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> None:
    """The window ACC and SET write (b's shape, a's element size, strides nb1..nb3, at `offset`) must lie
    inside the result's bytes (a's own when in place, a contiguous copy's otherwise): ggml's kernels
    assert it; here it is checked before the result exists."""
    nb = [a.element_size()] + [check_int(n, f"{fn}: nb{i + 1}", minimum=0) for i, n in enumerate((nb1, nb2, nb3))]
    size = a.nbytes() if inplace else nbytes_of(a.type, a.ne, strides(a.type, a.ne))
    check_window(f"{fn} of '{b.name}' into '{a.name}'", a.type, b.ne, nb, offset, a, size, "window")


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
        inplace: bool = False) -> Tensor:
    """a, with b added into the window of a at byte `offset` with byte strides nb1..nb3 and b's shape.

    op_params: [nb1, nb2, nb3, offset, inplace] as ggml_acc_impl stores them.
    """
    require(b.nelements() <= a.nelements(), "acc", f"b has {b.nelements()} elements, more than a's {a.nelements()}",
            a, b)
    require(a.is_contiguous(), "acc", "a must be contiguous", a)
    _check_window("acc", a, b, nb1, nb2, nb3, offset, inplace)
    result = same_or_view(ctx, a, inplace)
    return set_op(result, GGMLOp.ACC, a, b, params=AccParams(nb1=nb1, nb2=nb2, nb3=nb3, offset=offset,
                                                            inplace=inplace))


def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return acc(ctx, a, b, nb1, nb2, nb3, offset, True)


def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
        inplace: bool = False) -> Tensor:
    """a, with the window at byte `offset` (byte strides nb1..nb3, b's shape) replaced by b.

    op_params: [nb1, nb2, nb3, offset, inplace] as ggml_set_impl stores them.
    """
    require(a.nelements() >= b.nelements(), "set", f"b has {b.nelements()} elements, more than a's {a.nelements()}",
            a, b)
    _check_window("set", a, b, nb1, nb2, nb3, offset, inplace)
    result = same_or_view(ctx, a, inplace)
    return set_op(result, GGMLOp.SET, a, b, params=AccParams(nb1=nb1, nb2=nb2, nb3=nb3, offset=offset,
                                                            inplace=inplace))


def set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return set(ctx, a, b, nb1, nb2, nb3, offset, True)


def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, False)


def set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, True)


def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, False)


def set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, True)


def _same_shape_op(ctx: Context, op: GGMLOp, a: Tensor, inplace: bool) -> Tensor:
    return set_op(same_or_view(ctx, a, inplace), op, a)


def sqr(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.SQR, a, False)


def sqr_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.SQR, a, True)


def sqrt(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.SQRT, a, False)


def sqrt_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.SQRT, a, True)


def log(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.LOG, a, False)


def log_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _same_shape_op(ctx, GGMLOp.LOG, a, True)


def clamp(ctx: Context, a: Tensor, min: float, max: float, inplace: bool = False) -> Tensor:
    """Clamp to [min, max]; op_params [min, max] as f32 (a new tensor, or a view of `a` in place)."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.CLAMP, a, params=ClampParams(min=min, max=max))


def clamp_inplace(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    return clamp(ctx, a, min, max, True)


def leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """x if x > 0 else negative_slope * x; the slope f32 in op_params[0]."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.LEAKY_RELU, a,
                  params=LeakyReluParams(negative_slope=negative_slope))


# --- unary shortcuts (UNARY with the function in op_params[0]) ---


def abs(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ABS)


def abs_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ABS, True)


def sgn(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SGN)


def sgn_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SGN, True)


def neg(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.NEG)


def neg_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.NEG, True)


def step(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.STEP)


def step_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.STEP, True)


def tanh(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.TANH)


def tanh_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.TANH, True)


def elu(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ELU)


def elu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ELU, True)


def relu(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.RELU)


def relu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.RELU, True)


def gelu(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU)


def gelu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU, True)


def gelu_quick(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU_QUICK)


def gelu_quick_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU_QUICK, True)


def silu(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SILU)


def silu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SILU, True)


def hardswish(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.HARDSWISH)


def hardswish_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.HARDSWISH, True)


def hardsigmoid(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.HARDSIGMOID)


def hardsigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.HARDSIGMOID, True)


def sigmoid(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SIGMOID)


def sigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SIGMOID, True)


def gelu_erf(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU_ERF)


def gelu_erf_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.GELU_ERF, True)


def exp(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.EXP)


def exp_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.EXP, True)


def expm1(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.EXPM1)


def expm1_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.EXPM1, True)


def softplus(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SOFTPLUS)


def softplus_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.SOFTPLUS, True)


def floor(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.FLOOR)


def floor_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.FLOOR, True)


def ceil(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.CEIL)


def ceil_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.CEIL, True)


def round(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ROUND)


def round_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.ROUND, True)


def trunc(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.TRUNC)


def trunc_inplace(ctx: Context, a: Tensor) -> Tensor:
    return unary(ctx, a, UnaryOp.TRUNC, True)


def xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    """xIELU (ggml_xielu): UNARY XIELU with [op, beta + softplus(alpha_n), softplus(alpha_p), beta, eps]."""
    def softplus_f32(x: float) -> float:  # ggml_compute_softplus_f32: log(1 + exp(x)), x itself above 20
        return x if x > 20.0 else math.log1p(math.exp(x))

    params = UnaryParams(op=UnaryOp.XIELU, alpha_n=beta + softplus_f32(alpha_n), alpha_p=softplus_f32(alpha_p),
                         beta=beta, eps=eps)
    return set_op(ctx.dup_tensor(a), GGMLOp.UNARY, a, params=params)
