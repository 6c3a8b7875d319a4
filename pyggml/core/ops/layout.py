"""Ops that copy, view or rearrange data: DUP, CPY, CONT, RESHAPE, VIEW,
PERMUTE, TRANSPOSE, GET_ROWS, REPEAT, CONCAT, DIAG, PAD, UPSCALE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.checks import check_int
from pyggml.core.ops._build import int64_words, require, same_or_view, set_op
from pyggml.core.tensor import GGML_MAX_DIMS, GGMLOp, Tensor, can_repeat, check_ne
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
    return set_op(result, GGMLOp.VIEW, a, params=int64_words(offset))


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
    return set_op(result, GGMLOp.PERMUTE, a, params=axes)


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
    require(b.ne[3] == 1, "get_rows", "b.ne[3] must be 1", b)
    type = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    result = ctx.new_tensor_4d(type, a.ne[0], b.ne[0], b.ne[1], b.ne[2])
    return set_op(result, GGMLOp.GET_ROWS, a, b)


def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile `a` to the shape of `b`."""
    require(can_repeat(a, b), "repeat", "each dimension of b must be a multiple of a's", a, b)
    result = ctx.new_tensor(a.type, b.ne)
    return set_op(result, GGMLOp.REPEAT, a)


def concat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Join along dimension 2 (ggml of late 2023 concatenates only there)."""
    require(a.ne[0] == b.ne[0] and a.ne[1] == b.ne[1] and a.ne[3] == b.ne[3], "concat",
            "dimensions 0, 1 and 3 must match", a, b)
    result = ctx.new_tensor_4d(a.type, a.ne[0], a.ne[1], a.ne[2] + b.ne[2], a.ne[3])
    return set_op(result, GGMLOp.CONCAT, a, b)


def diag(ctx: Context, a: Tensor) -> Tensor:
    """A row vector to a diagonal matrix."""
    require(a.ne[1] == 1, "diag", "a must be a row (ne[1] == 1)", a)
    result = ctx.new_tensor_4d(a.type, a.ne[0], a.ne[0], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.DIAG, a)


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zero-pad at the end of each dimension."""
    require(min(p0, p1, p2, p3) >= 0, "pad", f"paddings must be >= 0, got {[p0, p1, p2, p3]}", a)
    result = ctx.new_tensor_4d(a.type, a.ne[0] + p0, a.ne[1] + p1, a.ne[2] + p2, a.ne[3] + p3)
    return set_op(result, GGMLOp.PAD, a)


def upscale(ctx: Context, a: Tensor, scale_factor: int) -> Tensor:
    """Nearest-neighbour upscale of dimensions 0 and 1 by an integer factor."""
    require(scale_factor >= 1, "upscale", f"scale factor must be >= 1, got {scale_factor}", a)
    result = ctx.new_tensor_4d(a.type, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.UPSCALE, a, params=[scale_factor])
