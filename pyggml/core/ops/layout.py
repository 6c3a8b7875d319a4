"""Ops that copy, view or rearrange data: DUP, CPY, CONT, RESHAPE, VIEW,
PERMUTE, TRANSPOSE, GET_ROWS, REPEAT, CONCAT, DIAG, PAD, UPSCALE.

Shapes and op_params as ggml.c builds them (CONCAT along any
dimension, PAD with left and right padding per dimension, UPSCALE with a scale
mode); op_params through `pyggml.core.ops.params`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.checks import check_int
from pyggml.core.ops._build import require, require_arg, same_or_view, set_op
from pyggml.core.ops.params import ConcatParams, PadParams, PermuteParams, UpscaleParams, ViewParams
from pyggml.core.tensor import GGML_MAX_DIMS, GGMLOp, ScaleFlag, ScaleMode, Tensor, can_repeat, check_ne
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def dup(ctx: Context, a: Tensor, inplace: bool = False) -> Tensor:
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.DUP, a)


def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    return dup(ctx, a, True)


def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy `a` into `b` (converting type); the result is a view of `b`."""
    require(a.nelements() == b.nelements(), "cpy", "the tensors must have the same number of elements", a, b)
    result = ctx.view_tensor(b)
    if b.name:
        result.format_name("%s (copy of %s)", b.name, a.name)
    else:
        result.format_name("%s (copy)", a.name)
    return set_op(result, GGMLOp.CPY, a, b)


def cont(ctx: Context, a: Tensor) -> Tensor:
    result = ctx.dup_tensor(a)
    result.format_name("%s (cont)", a.name)
    return set_op(result, GGMLOp.CONT, a)


def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    ne = check_ne([ne0, ne1, ne2, ne3], "cont_4d")
    require(a.nelements() == ne0 * ne1 * ne2 * ne3, "cont_4d", f"{a.nelements()} elements cannot take "
            f"shape {ne}", a)
    result = ctx.new_tensor_impl(a.type, ne, what="cont_4d")
    result.format_name("%s (cont)", a.name)
    return set_op(result, GGMLOp.CONT, a)


def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return cont_4d(ctx, a, ne0, 1, 1, 1)


def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, ne2, 1)


def _reshape(ctx: Context, a: Tensor, ne: list[int], fn: str) -> Tensor:
    ne = check_ne(ne, fn)[: len(ne)]
    require(a.is_contiguous(), fn, "only contiguous tensors can be reshaped", a)
    n = 1
    for x in ne:
        n *= x
    require(a.nelements() == n, fn, f"{a.nelements()} elements cannot take shape {ne}", a)
    result = ctx.new_tensor_impl(a.type, ne, a, 0, what=fn)
    result.format_name("%s (reshaped)", a.name)
    return set_op(result, GGMLOp.RESHAPE, a)


def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Reshape `a` to the shape of `b`."""
    return _reshape(ctx, a, list(b.ne), "reshape")


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape(ctx, a, [ne0], "reshape_1d")


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape(ctx, a, [ne0, ne1], "reshape_2d")


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape(ctx, a, [ne0, ne1, ne2], "reshape_3d")


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3], "reshape_4d")


def _view(ctx: Context, a: Tensor, fn: str, ne: list[int], nb_outer: list[int], offset: int) -> Tensor:
    """ggml_view_impl: a view of `a` with shape `ne`, strides nb1.. from `nb_outer` (the rest as ggml's
    view_1d/2d/3d fill them, `strides`) at byte `offset` from `a`'s first byte.

    The one place a view's layout is made: strides are ints >= 0 here; `Context.new_tensor_impl` checks
    ne and offset and that the view's bytes lie inside its source's memory (against the root of a chain
    of views), so a kernel writing the view never writes outside its source.
    """
    nb_outer = [check_int(n, f"{fn}: nb{i + 1}", minimum=0) for i, n in enumerate(nb_outer)]
    result = ctx.new_tensor_impl(a.type, ne, a, offset, nb=[a.element_size(), *nb_outer], what=fn)
    result.format_name("%s (view)", a.name)
    return set_op(result, GGMLOp.VIEW, a, params=ViewParams(offset=offset))


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    return _view(ctx, a, "view_1d", [ne0], [], offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    return _view(ctx, a, "view_2d", [ne0, ne1], [nb1], offset)


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    return _view(ctx, a, "view_3d", [ne0, ne1, ne2], [nb1, nb2], offset)


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
            nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _view(ctx, a, "view_4d", [ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset)


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Move dimension i of `a` to position axis_i (ggml's convention, not numpy's)."""
    axes = [axis0, axis1, axis2, axis3]
    require(all(0 <= x < GGML_MAX_DIMS for x in axes) and len(set(axes)) == GGML_MAX_DIMS,
            "permute", f"axes {axes} are not a permutation of 0..3", a)
    result = ctx.view_tensor(a)
    result.format_name("%s (permuted)", a.name)
    ne = [0] * GGML_MAX_DIMS
    nb = [0] * GGML_MAX_DIMS
    for i, x in enumerate(axes):
        ne[x] = a.ne[i]
        nb[x] = a.nb[i]
    result.ne = ne
    result.nb = nb
    return set_op(result, GGMLOp.PERMUTE, a, params=PermuteParams(axis0=axis0, axis1=axis1, axis2=axis2, axis3=axis3))


def transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap dimensions 0 and 1 (a view)."""
    result = ctx.view_tensor(a)
    result.format_name("%s (transposed)", a.name)
    result.ne[0], result.ne[1] = a.ne[1], a.ne[0]
    result.nb[0], result.nb[1] = a.nb[1], a.nb[0]
    return set_op(result, GGMLOp.TRANSPOSE, a)


def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of `a` picked by the I32 indices in `b`: [a.ne0, b.ne0, b.ne1, b.ne2]."""
    require(b.type == GGMLType.I32, "get_rows", "indices must be I32", b)
    require(a.ne[2] == b.ne[1], "get_rows", "a.ne[2] must equal b.ne[1]", a, b)
    require(a.ne[3] == b.ne[2], "get_rows", "a.ne[3] must equal b.ne[2]", a, b)
    require(b.ne[3] == 1, "get_rows", "b.ne[3] must be 1", b)
    type = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    result = ctx.new_tensor_4d(type, a.ne[0], b.ne[0], b.ne[1], b.ne[2])
    return set_op(result, GGMLOp.GET_ROWS, a, b)


def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile `a` to the shape of `b`."""
    require(can_repeat(a, b), "repeat", "each dimension of b must be a multiple of a's", a, b)
    result = ctx.new_tensor(a.type, b.ne)
    return set_op(result, GGMLOp.REPEAT, a)


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """Join a and b along dimension `dim` (the others must match); dim in op_params[0]."""
    require_arg(0 <= dim < GGML_MAX_DIMS, "concat", f"dim={dim} must be in [0, {GGML_MAX_DIMS})", a, b)
    require(a.type == b.type, "concat", "a and b must have the same type", a, b)
    require(all(a.ne[d] == b.ne[d] for d in range(GGML_MAX_DIMS) if d != dim), "concat",
            f"the dimensions other than {dim} must match", a, b)
    ne = [a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(GGML_MAX_DIMS)]
    result = ctx.new_tensor(a.type, ne)
    return set_op(result, GGMLOp.CONCAT, a, b, params=ConcatParams(dim=dim))


def diag(ctx: Context, a: Tensor) -> Tensor:
    """A row vector to a diagonal matrix."""
    require(a.ne[1] == 1, "diag", "a must be a row (ne[1] == 1)", a)
    result = ctx.new_tensor_4d(a.type, a.ne[0], a.ne[0], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.DIAG, a)


def _pad(ctx: Context, a: Tensor, params: PadParams, fn: str) -> Tensor:
    left, right = params.left(), params.right()
    require_arg(min(left + right) >= 0, fn, f"paddings must be >= 0, got left {list(left)}, right {list(right)}",
                a)
    if params.circular:
        require_arg(all(lp <= n and rp <= n for lp, rp, n in zip(left, right, a.ne, strict=True)), fn,
                    "circular padding wraps around once at most: each padding must be <= its dimension", a)
    ne = [a.ne[d] + left[d] + right[d] for d in range(GGML_MAX_DIMS)]
    result = ctx.new_tensor_impl(a.type, ne, what=fn)
    return set_op(result, GGMLOp.PAD, a, params=params)


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zero-pad at the end of each dimension (ggml_pad: ggml_pad_ext with right padding only)."""
    return _pad(ctx, a, PadParams(rp0=p0, rp1=p1, rp2=p2, rp3=p3), "pad")


def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int) -> Tensor:
    """Zero-pad before (lp) and after (rp) each dimension; op_params [lp0, rp0, lp1, rp1, ..., circular=0]."""
    return _pad(ctx, a, PadParams(lp0=lp0, rp0=rp0, lp1=lp1, rp1=rp1, lp2=lp2, rp2=rp2, lp3=lp3, rp3=rp3),
                "pad_ext")


def pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Pad at the end of each dimension with the tensor wrapped around (a torus)."""
    return _pad(ctx, a, PadParams(rp0=p0, rp1=p1, rp2=p2, rp3=p3, circular=True), "pad_circular")


def pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
                     lp3: int, rp3: int) -> Tensor:
    return _pad(ctx, a, PadParams(lp0=lp0, rp0=rp0, lp1=lp1, rp1=rp1, lp2=lp2, rp2=rp2, lp3=lp3, rp3=rp3,
                                  circular=True), "pad_ext_circular")


def interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                mode: int = ScaleMode.NEAREST) -> Tensor:
    """a resized to [ne0, ne1, ne2, ne3] (F32): `mode` a ScaleMode, or'd with ScaleFlag bits."""
    fn = "interpolate"
    require_arg((mode & 0xFF) < len(ScaleMode), fn, f"mode={mode}: the low byte is no ScaleMode "
                f"({', '.join(f'{m.name}={int(m)}' for m in ScaleMode)})", a)
    known = int(ScaleFlag.ALIGN_CORNERS | ScaleFlag.ANTIALIAS)
    require_arg(mode >= 0 and (mode & ~0xFF & ~known) == 0, fn, f"mode={mode} has unknown flag bits", a)
    require_arg(not mode & ScaleFlag.ANTIALIAS or (mode & 0xFF) == ScaleMode.BILINEAR, fn,
                "ANTIALIAS works with BILINEAR only", a)
    require(a.type == GGMLType.F32, fn, "a must be F32", a)
    ne = check_ne([ne0, ne1, ne2, ne3], fn)
    require_arg(all(n > 0 for n in ne) or a.nelements() == 0, fn, f"the new shape {ne} must not be empty", a)
    result = ctx.new_tensor(a.type, ne)
    return set_op(result, GGMLOp.UPSCALE, a, params=UpscaleParams(mode=int(mode)))


def upscale(ctx: Context, a: Tensor, scale_factor: int, mode: ScaleMode | int = ScaleMode.NEAREST) -> Tensor:
    """Dimensions 0 and 1 times an integer factor > 1 (ggml_upscale): `mode` a ScaleMode, or'd with ScaleFlag
    bits as interpolate takes them."""
    mode = check_int(mode, "upscale: argument 'mode'")
    require_arg(scale_factor > 1, "upscale", f"scale factor must be > 1, got {scale_factor}", a)
    return interpolate(ctx, a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3], mode)


def upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                mode: ScaleMode | int = ScaleMode.NEAREST) -> Tensor:
    """a resized to [ne0, ne1, ne2, ne3] (ggml_upscale_ext): `mode` as interpolate takes it."""
    mode = check_int(mode, "upscale_ext: argument 'mode'")
    return interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)
