"""The small ops: SIN, COS, FILL, ARANGE, TRI, CUMSUM, COUNT_EQUAL, L2_NORM, ROLL, PAD_REFLECT_1D,
TIMESTEP_EMBEDDING, REPEAT_BACK, SOLVE_TRI, and the direct convolutions CONV_2D, CONV_2D_DW and
CONV_TRANSPOSE_2D (pyggml.core.ops.conv has the im2col ones: conv_2d there is IM2COL + MUL_MAT).

Shapes, type rules and op_params as llama.cpp 0c1e570's ggml.c builds them; ggml's GGML_ASSERTs become
ShapeError / ArgumentError / UnsupportedTypeError naming the op and the operands.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import as_enum, require, require_arg, same_or_view, set_op
from pyggml.core.ops.conv import calc_conv_output_size
from pyggml.core.ops.params import (
    ArangeParams,
    Conv2dParams,
    ConvTranspose2dParams,
    FillParams,
    NormParams,
    PadReflect1dParams,
    RollParams,
    TimestepEmbeddingParams,
    TriParams,
)
from pyggml.core.tensor import GGMLOp, Tensor, TriType, are_same_shape, can_repeat
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def _require_type(op: str, t: Tensor, *allowed: GGMLType) -> None:
    """UnsupportedTypeError naming the op and operand unless `t` is of one of the `allowed` types."""
    if t.type not in allowed:
        names = ", ".join(a.name for a in allowed)
        raise UnsupportedTypeError(f"{op}: tensor '{t.name}' has type {t.type.name}; ggml takes {names}")


# --- element-wise ---


def sin(ctx: Context, a: Tensor) -> Tensor:
    return set_op(same_or_view(ctx, a, False), GGMLOp.SIN, a)


def sin_inplace(ctx: Context, a: Tensor) -> Tensor:
    return set_op(same_or_view(ctx, a, True), GGMLOp.SIN, a)


def cos(ctx: Context, a: Tensor) -> Tensor:
    return set_op(same_or_view(ctx, a, False), GGMLOp.COS, a)


def cos_inplace(ctx: Context, a: Tensor) -> Tensor:
    return set_op(same_or_view(ctx, a, True), GGMLOp.COS, a)


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool, fn: str) -> Tensor:
    _require_type(fn, a, GGMLType.F32, GGMLType.F16)
    require(a.is_contiguous(), fn, "a must be contiguous", a)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.FILL, a, params=FillParams(c=c))


def fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    """A tensor of a's shape and type with every element c (a is only the shape's source)."""
    return _fill(ctx, a, c, False, "fill")


def fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, True, "fill_inplace")


# --- generators ---


def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    """[start, start + step, ...) below stop: ceil((stop - start) / step) F32 values (computed in float32)."""
    require_arg(stop > start, "arange", f"stop={stop} must be greater than start={start}")
    require_arg(step > 0, "arange", f"step={step} must be positive")
    # ggml: ceilf((stop - start) / step) in float32
    steps = int(math.ceil(float(np.float32(np.float32(stop) - np.float32(start)) / np.float32(step))))
    result = ctx.new_tensor_1d(GGMLType.F32, steps)
    return set_op(result, GGMLOp.ARANGE, params=ArangeParams(start=start, stop=stop, step=step))


def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """[dim, ne0(timesteps)] F32: cos then sin of each timestep at dim/2 frequencies (an odd dim's last is 0)."""
    require_arg(dim > 0, "timestep_embedding", f"dim={dim} must be positive", timesteps)
    require_arg(max_period > 0, "timestep_embedding", f"max_period={max_period} must be positive", timesteps)
    result = ctx.new_tensor_2d(GGMLType.F32, dim, timesteps.ne[0])
    return set_op(result, GGMLOp.TIMESTEP_EMBEDDING, timesteps,
                  params=TimestepEmbeddingParams(dim=dim, max_period=max_period))


# --- masks and sums along rows ---


def tri(ctx: Context, a: Tensor, type: TriType | int) -> Tensor:
    """a with the elements outside the triangle `type` zeroed (square matrices, F32, contiguous)."""
    tt = as_enum(TriType, type, "tri", "type")
    _require_type("tri", a, GGMLType.F32)
    require(a.is_contiguous(), "tri", "a must be contiguous", a)
    require(a.ne[0] == a.ne[1], "tri", "a must be square (ne[0] == ne[1])", a)
    return set_op(ctx.dup_tensor(a), GGMLOp.TRI, a, params=TriParams(type=int(tt)))


def cumsum(ctx: Context, a: Tensor) -> Tensor:
    """The running sum along each row (F32)."""
    _require_type("cumsum", a, GGMLType.F32)
    return set_op(ctx.dup_tensor(a), GGMLOp.CUMSUM, a)


def count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """How many elements of a and b are equal: one I64 (ggml's CPU takes I32 operands)."""
    require(are_same_shape(a, b), "count_equal", "a and b must have the same shape", a, b)
    result = ctx.new_tensor_1d(GGMLType.I64, 1)
    return set_op(result, GGMLOp.COUNT_EQUAL, a, b)


def _l2_norm(ctx: Context, a: Tensor, eps: float, inplace: bool) -> Tensor:
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.L2_NORM, a, params=NormParams(eps=eps))


def l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """Each row divided by max(its L2 norm, eps)."""
    return _l2_norm(ctx, a, eps, False)


def l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _l2_norm(ctx, a, eps, True)


# --- layout ---


def roll(ctx: Context, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    """a rotated by shift_i along each dimension (element i goes to i + shift, wrapping); |shift_i| < ne[i]."""
    require(a.nb[0] == a.element_size(), "roll", "a's rows must be contiguous (nb[0] == type size)", a)
    for i, s in enumerate((shift0, shift1, shift2, shift3)):
        require_arg(abs(s) < a.ne[i], "roll", f"|shift{i}|={abs(s)} must be less than ne[{i}]={a.ne[i]}", a)
    return set_op(ctx.dup_tensor(a), GGMLOp.ROLL, a,
                  params=RollParams(shift0=shift0, shift1=shift1, shift2=shift2, shift3=shift3))


def pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """Each row padded with its reflection (not repeating the edge): p0 on the left, p1 on the right."""
    require_arg(p0 >= 0 and p1 >= 0, "pad_reflect_1d", f"p0={p0} and p1={p1} must not be negative", a)
    require_arg(p0 < a.ne[0] and p1 < a.ne[0], "pad_reflect_1d",
                f"p0={p0} and p1={p1} must be less than ne[0]={a.ne[0]}", a)
    require(a.is_contiguous(), "pad_reflect_1d", "a must be contiguous", a)
    _require_type("pad_reflect_1d", a, GGMLType.F32)
    result = ctx.new_tensor_4d(a.type, a.ne[0] + p0 + p1, a.ne[1], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.PAD_REFLECT_1D, a, params=PadReflect1dParams(p0=p0, p1=p1))


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """The backward of repeat: a summed over its tiles down to b's shape (of a's type)."""
    require(can_repeat(b, a), "repeat_back", "each dimension of a must be a multiple of b's", a, b)
    result = ctx.new_tensor(a.type, b.ne)
    return set_op(result, GGMLOp.REPEAT_BACK, a)


# --- linear algebra ---


def solve_tri(ctx: Context, a: Tensor, b: Tensor, left: bool, lower: bool, uni: bool) -> Tensor:
    """X with a @ X = b, a lower triangular [n, n, ...], b [k, n, ...] (k right-hand sides), X of b's shape.

    Only left=True, lower=True, uni=False, as ggml."""
    _require_type("solve_tri", a, GGMLType.F32)
    _require_type("solve_tri", b, GGMLType.F32)
    require(a.ne[0] == a.ne[1], "solve_tri", "a must be square (ne[0] == ne[1])", a, b)
    require(a.ne[1] == b.ne[1], "solve_tri", "b must have a's rows (b.ne[1] == a.ne[1])", a, b)
    require(a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "solve_tri", "a and b must have the same batch", a, b)
    require(a.is_contiguous() and b.is_contiguous(), "solve_tri", "a and b must be contiguous", a, b)
    require_arg(bool(left) and bool(lower) and not uni, "solve_tri",
                f"only left=True, lower=True, uni=False are implemented (got {left}, {lower}, {uni})", a, b)
    result = ctx.new_tensor_4d(GGMLType.F32, b.ne[0], b.ne[1], b.ne[2], b.ne[3])
    return set_op(result, GGMLOp.SOLVE_TRI, a, b)


# --- direct convolutions ---


def _check_conv(fn: str, what: str, ins: int, ks: int, s: int, p: int, d: int, *tensors: Tensor) -> None:
    require_arg(s >= 1 and d >= 1 and p >= 0, fn,
                f"{what}: stride {s} and dilation {d} must be >= 1, padding {p} >= 0", *tensors)
    require(calc_conv_output_size(ins, ks, s, p, d) >= 1, fn,
            f"{what}: the kernel ({ks} taps, dilation {d}) is wider than the padded input ({ins} + 2*{p})", *tensors)


def is_contiguous_channels(t: Tensor) -> bool:
    """ggml_is_contiguous_channels: a [W, H, C, N] tensor stored channels innermost (CWHN)."""
    return t.nb[0] > t.nb[2] and t.nb[1] > t.nb[0] and t.nb[2] == t.element_size()


def conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                   d1: int) -> Tensor:
    """CONV_2D without im2col: kernel a [KW, KH, IC, OC] (F32 or F16), input b [W, H, IC, N] (F32) ->
    [OW, OH, OC, N] of b's type."""
    require(a.ne[2] == b.ne[2], "conv_2d_direct", "a.ne[2] (input channels) must equal b.ne[2]", a, b)
    _check_conv("conv_2d_direct", "dim 0", b.ne[0], a.ne[0], s0, p0, d0, a, b)
    _check_conv("conv_2d_direct", "dim 1", b.ne[1], a.ne[1], s1, p1, d1, a, b)
    ne = [calc_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), calc_conv_output_size(b.ne[1], a.ne[1], s1, p1, d1),
          a.ne[3], b.ne[3]]
    result = ctx.new_tensor(b.type, ne)
    return set_op(result, GGMLOp.CONV_2D, a, b, params=Conv2dParams(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1))


def conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                      dilation0: int, dilation1: int) -> Tensor:
    """Depthwise CONV_2D_DW: kernel a [KW, KH, 1, C], input b [W, H, C, N] -> [OW, OH, C, N] of b's type;
    an input stored channels innermost (CWHN) gives a result laid out the same way, as ggml."""
    require(a.ne[2] == 1, "conv_2d_dw_direct", "a.ne[2] must be 1", a, b)
    require(a.ne[3] == b.ne[2], "conv_2d_dw_direct", "a.ne[3] (channels) must equal b.ne[2]", a, b)
    _check_conv("conv_2d_dw_direct", "dim 0", b.ne[0], a.ne[0], stride0, pad0, dilation0, a, b)
    _check_conv("conv_2d_dw_direct", "dim 1", b.ne[1], a.ne[1], stride1, pad1, dilation1, a, b)
    ne = [calc_conv_output_size(b.ne[0], a.ne[0], stride0, pad0, dilation0),
          calc_conv_output_size(b.ne[1], a.ne[1], stride1, pad1, dilation1), b.ne[2], b.ne[3]]
    result = ctx.new_tensor(b.type, ne)
    if is_contiguous_channels(b):
        # CWHN like the input: channels innermost, then W, then H
        ts = result.element_size()
        result.nb[0] = result.ne[2] * ts
        result.nb[1] = result.ne[0] * result.nb[0]
        result.nb[2] = ts
    params = Conv2dParams(s0=stride0, s1=stride1, p0=pad0, p1=pad1, d0=dilation0, d1=dilation1)
    return set_op(result, GGMLOp.CONV_2D_DW, a, b, params=params)


def conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """CONV_TRANSPOSE_2D without padding: kernel a [KW, KH, OC, IC], input b [W, H, IC, N] ->
    [(W - 1) * stride + KW, (H - 1) * stride + KH, OC, N], F32."""
    require(a.ne[3] == b.ne[2], "conv_transpose_2d_p0", "a.ne[3] (input channels) must equal b.ne[2]", a, b)
    require_arg(stride >= 1, "conv_transpose_2d_p0", f"stride={stride} must be >= 1", a, b)
    ne = [(b.ne[0] - 1) * stride + a.ne[0], (b.ne[1] - 1) * stride + a.ne[1], a.ne[2], b.ne[3]]
    result = ctx.new_tensor(GGMLType.F32, ne)
    return set_op(result, GGMLOp.CONV_TRANSPOSE_2D, a, b, params=ConvTranspose2dParams(stride=stride))

__all__ = ["arange", "conv_2d_direct", "conv_2d_dw_direct", "conv_transpose_2d_p0", "cos", "cos_inplace",
           "count_equal", "cumsum", "fill", "fill_inplace", "l2_norm",
           "l2_norm_inplace", "pad_reflect_1d", "repeat_back", "roll", "sin", "sin_inplace", "solve_tri",
           "timestep_embedding", "tri"]
