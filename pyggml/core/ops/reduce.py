"""Reductions and sorting: SUM, SUM_ROWS, MEAN, ARGMAX, ARGSORT, TOP_K, and
argsort_top_k (ARGSORT plus a view, as ggml builds it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.ops._build import as_enum, require, require_arg, set_op
from pyggml.core.ops.layout import view_4d
from pyggml.core.ops.params import ArgsortParams
from pyggml.core.tensor import GGMLOp, SortOrder, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

INT32_MAX = 2**31 - 1


def sum(ctx: Context, a: Tensor) -> Tensor:
    """The sum of all elements: a 1-element tensor of a's type."""
    result = ctx.new_tensor_1d(a.type, 1)
    return set_op(result, GGMLOp.SUM, a)


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """The sum of each row: [1, ne1, ne2, ne3] of a's type."""
    result = ctx.new_tensor_4d(a.type, 1, a.ne[1], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.SUM_ROWS, a)


def mean(ctx: Context, a: Tensor) -> Tensor:
    """The mean of each row: [1, ne1, ne2, ne3], F32."""
    result = ctx.new_tensor_4d(GGMLType.F32, 1, a.ne[1], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.MEAN, a)


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """The index of the largest element of each row of a matrix: [ne1], I32."""
    require(a.is_matrix(), "argmax", "a must be a matrix (ne[2] == ne[3] == 1)", a)
    require(a.ne[0] <= INT32_MAX, "argmax", f"rows of {a.ne[0]} elements do not fit int32 indices", a)
    result = ctx.new_tensor_1d(GGMLType.I32, a.ne[1])
    return set_op(result, GGMLOp.ARGMAX, a)


def argsort(ctx: Context, a: Tensor, order: SortOrder | int = SortOrder.ASC) -> Tensor:
    """The indices that sort each row (I32, a's shape); the order in op_params[0]."""
    order = as_enum(SortOrder, order, "argsort", "order")
    require(a.ne[0] <= INT32_MAX, "argsort", f"rows of {a.ne[0]} elements do not fit int32 indices", a)
    result = ctx.new_tensor(GGMLType.I32, a.ne)
    return set_op(result, GGMLOp.ARGSORT, a, params=ArgsortParams(order=order))


def argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """The indices of the k largest elements of each row, largest first: a view of the first k columns of a
    descending argsort ([k, ne1, ne2, ne3], I32)."""
    require_arg(0 <= k <= a.ne[0], "argsort_top_k", f"k={k} must be in [0, ne[0]={a.ne[0]}]", a)
    result = argsort(ctx, a, SortOrder.DESC)
    return view_4d(ctx, result, k, result.ne[1], result.ne[2], result.ne[3],
                   result.nb[1], result.nb[2], result.nb[3], 0)


def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """TOP_K: the indices of the k largest elements of each row ([k, ne1, ne2, ne3], I32), in no particular
    order (ggml's kernel swaps the first two on purpose: sort them if the order matters)."""
    require_arg(0 <= k <= a.ne[0], "top_k", f"k={k} must be in [0, ne[0]={a.ne[0]}]", a)
    require(a.ne[0] <= INT32_MAX, "top_k", f"rows of {a.ne[0]} elements do not fit int32 indices", a)
    result = ctx.new_tensor_4d(GGMLType.I32, k, a.ne[1], a.ne[2], a.ne[3])
    return set_op(result, GGMLOp.TOP_K, a)


__all__ = ["argmax", "argsort", "argsort_top_k", "mean", "sum", "sum_rows", "top_k"]
