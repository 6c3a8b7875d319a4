"""IM2COL_BACK, IM2COL_3D (and conv_3d over it), COL2IM_1D, CONV_3D (ggml_conv_3d_direct) and POOL_2D_BACK.

Shapes, op_params and asserts as llama.cpp 0c1e570's ggml.c builds them (`pyggml.core.ops.params`):
- IM2COL_BACK: Im2colParams [s0, s1, p0, p1, d0, d1, is_2D] (IM2COL's words)
- IM2COL_3D: [s0, s1, s2, p0, p1, p2, d0, d1, d2, IC]
- COL2IM_1D: [s0, oc, p0]
- CONV_3D: [s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc]
- POOL_2D_BACK: Pool2dParams [op, k0, k1, s0, s1, p0, p1] (POOL_2D's words)

3-D layouts (innermost first): a kernel is [KW, KH, KD, IC*OC] (channel index oc*IC + ic), an input
[W, H, D, IC*N] (channel index n*IC + ic).

Where pyggml checks more than ggml's builders (whose kernels would read outside a tensor otherwise):
IM2COL_BACK's gradient must have the shape IM2COL gives for the input shape `ne`; CONV_3D and
POOL_2D_BACK check their windows and planes. IM2COL_3D takes N = ne[3] // IC images of the input, as
ggml does (channels past N*IC are not read; N 0 gives an empty result). ggml.h names IM2COL_BACK's a
"convolution kernel" and b "gradient", but ggml's backward pass and CPU kernel use them the other way
round: a is the gradient, b the kernel, as here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyggml.core.checks import check_instance, check_int, check_real
from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import as_enum, require, require_arg, set_op
from pyggml.core.ops.conv import _check_window, calc_conv_output_size
from pyggml.core.ops.layout import cont, permute, reshape_2d, reshape_4d
from pyggml.core.ops.matmul import mul_mat
from pyggml.core.ops.params import Col2im1dParams, Conv3dParams, Im2col3dParams, Im2colParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, OpPool, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def _shape_arg(fn: str, ne: Sequence[int]) -> list[int]:
    """`ne` (up to 4 sizes, the rest 1) as a list of non-negative ints, or an error naming the op."""
    check_instance(ne, (list, tuple), f"{fn}: argument 'ne'")
    require_arg(1 <= len(ne) <= 4, fn, f"ne must have 1 to 4 sizes, got {len(ne)}")
    out = [check_int(n, f"{fn}: ne[{i}]", minimum=0) for i, n in enumerate(ne)]
    return out + [1] * (4 - len(out))


def im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: Sequence[int], s0: int, s1: int, p0: int, p1: int,
                d0: int, d1: int, is_2D: bool) -> Tensor:
    """The gradient of IM2COL's input: a (IM2COL's output gradient) summed back onto an F32 tensor of shape
    `ne` (IM2COL's input), for a kernel of b's shape (only its shape is used).

    2-D: a [IC*KH*KW, OW, OH, N], b [KW, KH, IC, ...], ne [W, H, IC, N].
    1-D: a [IC*K, OL, N], b [K, IC, ...], ne [L, IC, N].
    """
    shape = _shape_arg("im2col_back", ne)
    if is_2D:
        iw, ih, ic, n = shape
        kw, kh = b.ne[0], b.ne[1]
        require(b.ne[2] == ic, "im2col_back", f"the kernel's channels b.ne[2] must equal ne[2]={ic}", a, b)
        _check_window("im2col_back", "dim 1", ih, kh, s1, p1, d1, a, b)
        oh = calc_conv_output_size(ih, kh, s1, p1, d1)
    else:
        iw, ic, n = shape[0], shape[1], shape[2]
        kw, kh, oh = b.ne[0], 1, 1
        require(b.ne[1] == ic, "im2col_back", f"the kernel's channels b.ne[1] must equal ne[1]={ic}", a, b)
        require_arg(shape[3] == 1, "im2col_back", f"a 1-D input shape must be 3-D (ne[3]={shape[3]})", a, b)
    _check_window("im2col_back", "dim 0", iw, kw, s0, p0, d0, a, b)
    ow = calc_conv_output_size(iw, kw, s0, p0, d0)
    want = [ic * kh * kw, ow, oh, n] if is_2D else [ic * kw, ow, n, 1]
    require(a.ne == want, "im2col_back", f"the gradient a must have IM2COL's output shape {want} for ne={shape}",
            a, b)
    result = ctx.new_tensor(GGMLType.F32, shape)
    return set_op(result, GGMLOp.IM2COL_BACK, a, b,
                  params=Im2colParams(s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1, is_2D=is_2D))


def _check_3d(fn: str, a: Tensor, b: Tensor, spd: tuple[int, ...]) -> list[int]:
    """The output's [OW, OH, OD] for kernel a [KW, KH, KD, ...] over input b [W, H, D, ...], after checking
    the strides, paddings and dilations spd = (s0, s1, s2, p0, p1, p2, d0, d1, d2)."""
    out = []
    for i in range(3):
        s, p, d = spd[i], spd[3 + i], spd[6 + i]
        _check_window(fn, f"dim {i}", b.ne[i], a.ne[i], s, p, d, a, b)
        out.append(calc_conv_output_size(b.ne[i], a.ne[i], s, p, d))
    return out


def _check_channels(fn: str, a: Tensor, b: Tensor, IC: int) -> None:
    require_arg(IC >= 1, fn, f"IC={IC} must be >= 1", a, b)


def im2col_3d(ctx: Context, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
              d0: int, d1: int, d2: int, dst_type: GGMLType = GGMLType.F16) -> Tensor:
    """Unfold the 3-D patches of b [W, H, D, IC*N] for a kernel of a's shape [KW, KH, KD, ...] (only its shape
    is used): [IC*KD*KH*KW, OW, OH, OD*N] of `dst_type` (F16 or F32)."""
    _check_channels("im2col_3d", a, b, IC)
    ow, oh, od = _check_3d("im2col_3d", a, b, (s0, s1, s2, p0, p1, p2, d0, d1, d2))
    ne = [a.ne[0] * a.ne[1] * a.ne[2] * IC, ow, oh, od * (b.ne[3] // IC)]
    result = ctx.new_tensor(dst_type, ne)
    params = Im2col3dParams(s0=s0, s1=s1, s2=s2, p0=p0, p1=p1, p2=p2, d0=d0, d1=d1, d2=d2, IC=IC)
    return set_op(result, GGMLOp.IM2COL_3D, a, b, params=params)


def conv_3d(ctx: Context, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
            d0: int, d1: int, d2: int) -> Tensor:
    """3-D convolution as ggml_conv_3d builds it (IM2COL_3D + MUL_MAT): kernel a [KW, KH, KD, IC*OC], input
    b [W, H, D, IC*N] -> [OW, OH, OD, OC*N] (F32)."""
    require(a.ne[3] % max(IC, 1) == 0, "conv_3d", f"the kernel's a.ne[3] must be a whole number of IC={IC} "
            "channels", a, b)
    cols_type = GGMLType.F32 if a.type == GGMLType.BF16 else GGMLType.F16
    cols = im2col_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, cols_type)  # [IC*KD*KH*KW, OW, OH, OD*N]
    oc, n = a.ne[3] // IC, b.ne[3] // IC
    result = mul_mat(ctx,
                     reshape_2d(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]),  # [.., N*OD*OH*OW]
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2] * IC, oc))  # [IC*KD*KH*KW, OC]
    od = cols.ne[3] // n
    result = reshape_4d(ctx, result, cols.ne[1] * cols.ne[2], od, n, oc)  # [OH*OW, OD, N, OC]
    result = cont(ctx, permute(ctx, result, 0, 1, 3, 2))  # [OH*OW, OD, OC, N]
    return reshape_4d(ctx, result, cols.ne[1], cols.ne[2], od, oc * n)  # [OW, OH, OD, OC*N]


def conv_3d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                   d0: int, d1: int, d2: int, n_channels: int, n_batch: int, n_channels_out: int) -> Tensor:
    """CONV_3D: kernel a [KW, KH, KD, IC*OC] (F32 or F16), input b [W, H, D, IC*N] (F32) -> [OW, OH, OD, OC*N]
    (F32); IC, N, OC are n_channels, n_batch, n_channels_out."""
    c, n, oc = n_channels, n_batch, n_channels_out
    require_arg(min(c, n, oc) >= 1, "conv_3d_direct", f"n_channels={c}, n_batch={n}, n_channels_out={oc} "
                "must be >= 1", a, b)
    require(a.ne[3] == c * oc, "conv_3d_direct", f"a.ne[3] must be n_channels*n_channels_out = {c * oc}", a, b)
    require(b.ne[3] == c * n, "conv_3d_direct", f"b.ne[3] must be n_channels*n_batch = {c * n}", a, b)
    ow, oh, od = _check_3d("conv_3d_direct", a, b, (s0, s1, s2, p0, p1, p2, d0, d1, d2))
    result = ctx.new_tensor(GGMLType.F32, [ow, oh, od, oc * n])
    params = Conv3dParams(s0=s0, s1=s1, s2=s2, p0=p0, p1=p1, p2=p2, d0=d0, d1=d1, d2=d2, c=c, n=n, oc=oc)
    return set_op(result, GGMLOp.CONV_3D, a, b, params=params)


def col2im_1d(ctx: Context, a: Tensor, s0: int, oc: int, p0: int) -> Tensor:
    """Scatter-add the columns a [K*OC, T_in] (a matrix product's output) back to a signal [T_out, OC] of a's
    type, T_out = (T_in - 1)*s0 + K - 2*p0: column t adds its K taps of channel c at t*s0 - p0 onwards."""
    if a.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        raise UnsupportedTypeError(f"col2im_1d: tensor '{a.name}' has type {a.type.name}; ggml takes F32, F16, "
                                   "BF16")
    require(a.is_matrix(), "col2im_1d", "a must be a matrix [K*OC, T_in]", a)
    require(a.is_contiguous(), "col2im_1d", "a must be contiguous", a)
    require_arg(s0 > 0 and oc > 0 and p0 >= 0, "col2im_1d", f"s0={s0} and oc={oc} must be > 0, p0={p0} >= 0", a)
    k = a.ne[0] // oc
    t_out = (a.ne[1] - 1) * s0 + k - 2 * p0
    require(a.ne[0] == k * oc, "col2im_1d", f"a.ne[0] must be a whole number of oc={oc} blocks", a)
    require(k > 0 and t_out > 0, "col2im_1d", f"the kernel size K={k} and output length T_out={t_out} "
            "must be > 0", a)
    result = ctx.new_tensor(a.type, [t_out, oc, 1, 1])
    return set_op(result, GGMLOp.COL2IM_1D, a, params=Col2im1dParams(s0=s0, oc=oc, p0=p0))


def pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: OpPool | int, k0: int, k1: int, s0: int, s1: int,
                 p0: float, p1: float) -> Tensor:
    """The gradient of POOL_2D's input af [W, H, ne2, ne3]: each element of a (the pooled gradient, one plane per
    plane of af) goes to its window's max (MAX) or 1/(k0*k1) of it to each element (AVG); F32 of af's shape."""
    op = as_enum(OpPool, op, "pool_2d_back", "op")
    p0, p1 = check_real(p0, "pool_2d_back: p0", finite=True), check_real(p1, "pool_2d_back: p1", finite=True)
    require_arg(min(k0, k1, s0, s1) >= 1 and min(p0, p1) >= 0, "pool_2d_back",
                f"k=({k0}, {k1}), s=({s0}, {s1}) must be >= 1, p=({p0}, {p1}) >= 0", a, af)
    require(a.ne[2] == af.ne[2] and a.ne[3] == af.ne[3], "pool_2d_back",
            "the gradient a must have af's planes (ne[2], ne[3])", a, af)
    result = ctx.new_tensor(GGMLType.F32, list(af.ne))
    return set_op(result, GGMLOp.POOL_2D_BACK, a, af,
                  params=Pool2dParams(op=op, k0=k0, k1=k1, s0=s0, s1=s1, p0=int(p0), p1=int(p1)))


__all__ = ["col2im_1d", "conv_3d", "conv_3d_direct", "im2col_3d", "im2col_back", "pool_2d_back"]
