"""Reductions and sorting: SUM, SUM_ROWS, MEAN, ARGMAX, ARGSORT, and top_k
(ARGSORT plus a view, as ggml builds it)."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from pyggml.core.ops._build import as_enum, require, require_arg, set_op
from pyggml.core.ops.layout import view_4d
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

INT32_MAX = 2**31 - 1


class SortOrder(IntEnum):
    """ggml's `enum ggml_sort_order` (GGML_SORT_ASC, GGML_SORT_DESC)."""

    ASC = 0
    DESC = 1


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
    result = ctx.new_tensor_1d(GGMLType.I32, a.ne[1])
    return set_op(result, GGMLOp.ARGMAX, a)


def argsort(ctx: Context, a: Tensor, order: SortOrder | int = SortOrder.ASC) -> Tensor:
    """The indices that sort each row (I32, a's shape); the order in op_params[0]."""
    order = as_enum(SortOrder, order, "argsort", "order")
    require(a.ne[0] <= INT32_MAX, "argsort", f"rows of {a.ne[0]} elements do not fit int32 indices", a)
    result = ctx.new_tensor(GGMLType.I32, a.ne)
    return set_op(result, GGMLOp.ARGSORT, a, params=[int(order)])


def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """The indices of the k largest elements of each row: a view of the first k columns of a
    descending argsort ([k, ne1, ne2, ne3], I32)."""
    require_arg(0 <= k <= a.ne[0], "top_k", f"k={k} must be in [0, ne[0]={a.ne[0]}]", a)
    result = argsort(ctx, a, SortOrder.DESC)
    return view_4d(ctx, result, k, result.ne[1], result.ne[2], result.ne[3],
                   result.nb[1], result.nb[2], result.nb[3], 0)


__all__ = ["SortOrder", "argmax", "argsort", "mean", "sum", "sum_rows", "top_k"]
