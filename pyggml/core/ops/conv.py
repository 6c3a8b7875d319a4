"""Convolution and pooling: IM2COL, conv_1d/conv_2d (IM2COL + MUL_MAT, as ggml
builds them), CONV_TRANSPOSE_1D, POOL_1D, POOL_2D.

Layouts (ggml's, innermost first): a 1-D kernel is [K, IC, OC] and its input
[L, IC, N]; a 2-D kernel [KW, KH, IC, OC] and its input [W, H, IC, N].

op_params as ggml.c stores them (`pyggml.core.ops.params`):
- IM2COL: [s0, s1, p0, p1, d0, d1, is_2D]
- CONV_TRANSPOSE_1D: [s0, p0, d0]
- POOL_1D: [op, k0, s0, p0]; POOL_2D: [op, k0, k1, s0, s1, p0, p1]

Where pyggml differs from ggml, and why:
- conv_1d with a batch N > 1: ggml reshapes the MUL_MAT result [N*OL, OC]
  straight to [OL, OC, N], which mixes up batch and channel when N > 1 (conv_2d
  has the fix: a permute). For N == 1 pyggml builds exactly ggml's graph; for
  N > 1 it reshapes to [.., N, OC] and adds PERMUTE + CONT, as conv_2d does.
- CONV_TRANSPOSE_1D takes any p0 >= 0 and d0 >= 1 (ggml asserts p0 == 0 and
  d0 == 1, a limit of its kernel; pyggml's kernel has no such limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.checks import check_real
from pyggml.core.ops._build import as_enum, require, require_arg, set_op
from pyggml.core.ops.layout import cont, permute, reshape_2d, reshape_3d, reshape_4d
from pyggml.core.ops.matmul import mul_mat
from pyggml.core.ops.params import ConvTranspose1dParams, Im2colParams, Pool1dParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, OpPool, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def calc_conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size: (ins + 2p - d(ks - 1) - 1) / s + 1, C's division (toward zero: a kernel up to
    s - 1 taps wider than the padded input still gives one output, its taps past the input reading zeros)."""
    span = ins + 2 * p - d * (ks - 1) - 1
    return (span // s if span >= 0 else -(-span // s)) + 1


def calc_conv_transpose_1d_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_transpose_1d_output_size: (ins - 1)s - 2p + d(ks - 1) + 1."""
    return (ins - 1) * s - 2 * p + d * (ks - 1) + 1


def calc_pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    """ggml_calc_pool_output_size: (ins + 2p - ks) / s + 1 (p may be a float in ggml's signature)."""
    return int((ins + 2 * p - ks) / s) + 1


def _check_window(fn: str, what: str, ins: int, ks: int, s: int, p: int | float, d: int, *tensors: Tensor) -> None:
    require_arg(s >= 1 and d >= 1 and p >= 0, fn,
                f"{what}: stride {s} and dilation {d} must be >= 1, padding {p} >= 0", *tensors)
    require(ins + 2 * p - d * (ks - 1) - 1 >= 0, fn,
            f"{what}: the kernel ({ks} taps, dilation {d}) is wider than the padded input ({ins} + 2*{p})", *tensors)


# --- im2col ---


def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           is_2D: bool, dst_type: GGMLType = GGMLType.F16) -> Tensor:
    """Unfold the input's patches into rows for a kernel of a's shape, as `dst_type` (F16 or F32).

    2-D: a [KW, KH, IC, OC], b [W, H, IC, N] -> [IC*KH*KW, OW, OH, N].
    1-D: a [K, IC, OC], b [L, IC, N] -> [IC*K, OL, N].
    """
    if is_2D:
        require(a.ne[2] == b.ne[2], "im2col", "the kernel's channels a.ne[2] must equal the input's b.ne[2]", a, b)
        _check_window("im2col", "dim 1", b.ne[1], a.ne[1], s1, p1, d1, a, b)
    else:
        require(a.ne[1] == b.ne[1], "im2col", "the kernel's channels a.ne[1] must equal the input's b.ne[1]", a, b)
        require(b.ne[3] == 1, "im2col", "a 1-D input must be 3-D (b.ne[3] == 1)", b)
    _check_window("im2col", "dim 0", b.ne[0], a.ne[0], s0, p0, d0, a, b)
    oh = calc_conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2D else 0
    ow = calc_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    if is_2D:
        ne = [a.ne[2] * a.ne[1] * a.ne[0], ow, oh, b.ne[3]]
    else:
        ne = [a.ne[1] * a.ne[0], ow, b.ne[2], 1]
    result = ctx.new_tensor(dst_type, ne)
    return set_op(result, GGMLOp.IM2COL, a, b,
                  params=Im2colParams(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1, is_2D=is_2D))


# --- convolutions ---


def _cols_type(kernel: Tensor) -> GGMLType:
    """The type ggml's conv_1d/conv_2d unfold into: F32 for a BF16 kernel, else F16."""
    return GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16


def conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """1-D convolution: kernel a [K, IC, OC], input b [L, IC, N] -> [OL, OC, N] (F32)."""
    cols = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, _cols_type(a))  # [IC*K, OL, N]
    ol, n, oc = cols.ne[1], cols.ne[2], a.ne[2]
    result = mul_mat(ctx,
                     reshape_2d(ctx, cols, cols.ne[0], n * ol),  # [IC*K, N*OL]
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1], oc))  # [IC*K, OC]
    # result: [N*OL, OC]
    if n == 1:
        return reshape_3d(ctx, result, ol, oc, n)
    return cont(ctx, permute(ctx, reshape_3d(ctx, result, ol, n, oc), 0, 2, 1, 3))


def conv_1d_ph(ctx: Context, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """conv_1d with "half" padding (a.ne[0] / 2)."""
    return conv_1d(ctx, a, b, s, a.ne[0] // 2, d)


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """2-D convolution: kernel a [KW, KH, IC, OC], input b [W, H, IC, N] -> [OW, OH, OC, N] (F32)."""
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, _cols_type(a))  # [IC*KH*KW, OW, OH, N]
    ow, oh, n, oc = cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3]
    result = mul_mat(ctx,
                     reshape_2d(ctx, cols, cols.ne[0], n * oh * ow),  # [IC*KH*KW, N*OH*OW]
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], oc))  # [IC*KH*KW, OC]
    # result: [N*OH*OW, OC]
    if n == 1:
        return reshape_4d(ctx, result, ow, oh, oc, n)
    return cont(ctx, permute(ctx, reshape_4d(ctx, result, ow, oh, n, oc), 0, 1, 3, 2))


def conv_2d_sk_p0(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """conv_2d with stride = kernel size, no padding (patch embedding)."""
    return conv_2d(ctx, a, b, a.ne[0], a.ne[1], 0, 0, 1, 1)


def conv_2d_s1_ph(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """conv_2d with stride 1 and "half" padding (a.ne[0] / 2, a.ne[1] / 2)."""
    return conv_2d(ctx, a, b, 1, 1, a.ne[0] // 2, a.ne[1] // 2, 1, 1)


def conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """Transposed 1-D convolution: kernel a [K, OC, IC], input b [L, IC] -> [OL, OC] (F32)."""
    require(b.is_matrix(), "conv_transpose_1d", "the input b must be a matrix [L, IC]", b)
    require(a.ne[2] == b.ne[1], "conv_transpose_1d", "the kernel's a.ne[2] must equal the input's channels b.ne[1]",
            a, b)
    require(a.ne[3] == 1, "conv_transpose_1d", "the kernel must be 3-D (a.ne[3] == 1)", a)
    require_arg(s0 >= 1 and d0 >= 1 and p0 >= 0, "conv_transpose_1d",
                f"stride {s0} and dilation {d0} must be >= 1, padding {p0} >= 0", a, b)
    ol = calc_conv_transpose_1d_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    require(ol > 0, "conv_transpose_1d", f"the output length {ol} is not positive", a, b)
    result = ctx.new_tensor_4d(GGMLType.F32, ol, a.ne[1], b.ne[2], 1)
    return set_op(result, GGMLOp.CONV_TRANSPOSE_1D, a, b, params=ConvTranspose1dParams(s0=s0, p0=p0, d0=d0))


# --- pooling ---


def pool_1d(ctx: Context, a: Tensor, op: OpPool | int, k0: int, s0: int, p0: int) -> Tensor:
    """Pool each row over windows of k0 with stride s0 and padding p0: [OL, ne1, ne2, ne3] (F32)."""
    op = as_enum(OpPool, op, "pool_1d", "op")
    require_arg(k0 >= 1 and s0 >= 1 and p0 >= 0, "pool_1d", f"k0={k0}, s0={s0} must be >= 1, p0={p0} >= 0", a)
    require(a.ne[0] + 2 * p0 - k0 >= 0, "pool_1d", f"window {k0} is wider than the padded row ({a.ne[0]} + 2*{p0})",
            a)
    ol = calc_pool_output_size(a.ne[0], k0, s0, p0)
    result = ctx.new_tensor_4d(GGMLType.F32, ol, a.ne[1], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.POOL_1D, a, params=Pool1dParams(op=op, k0=k0, s0=s0, p0=p0))


def pool_2d(ctx: Context, a: Tensor, op: OpPool | int, k0: int, k1: int, s0: int, s1: int,
            p0: float, p1: float) -> Tensor:
    """Pool each plane over k0 x k1 windows: [OW, OH, ne2, ne3] (F32); paddings stored as ints as ggml does."""
    op = as_enum(OpPool, op, "pool_2d", "op")
    p0, p1 = check_real(p0, "pool_2d: p0", finite=True), check_real(p1, "pool_2d: p1", finite=True)
    require_arg(min(k0, k1, s0, s1) >= 1 and min(p0, p1) >= 0, "pool_2d",
                f"k=({k0}, {k1}), s=({s0}, {s1}) must be >= 1, p=({p0}, {p1}) >= 0", a)
    require(a.ne[0] + 2 * p0 - k0 >= 0 and a.ne[1] + 2 * p1 - k1 >= 0, "pool_2d",
            f"window {k0}x{k1} is larger than the padded plane ({a.ne[0]} + 2*{p0}) x ({a.ne[1]} + 2*{p1})", a)
    ow = calc_pool_output_size(a.ne[0], k0, s0, p0)
    oh = calc_pool_output_size(a.ne[1], k1, s1, p1)
    result = ctx.new_tensor_4d(GGMLType.F32, ow, oh, a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.POOL_2D, a,
                  params=Pool2dParams(op=op, k0=k0, k1=k1, s0=s0, s1=s1, p0=int(p0), p1=int(p1)))


__all__ = [
    "calc_conv_output_size", "calc_conv_transpose_1d_output_size", "calc_pool_output_size",
    "conv_1d", "conv_1d_ph", "conv_2d", "conv_2d_s1_ph", "conv_2d_sk_p0", "conv_transpose_1d",
    "im2col", "pool_1d", "pool_2d",
]
