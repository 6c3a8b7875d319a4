"""Element-wise ops: binary arithmetic with ggml's broadcasting (b repeats to
a's shape), unary functions, and SCALE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.ops._build import require, same_or_view, set_op
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp, can_repeat

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


def scale(ctx: Context, a: Tensor, s: float, inplace: bool = False) -> Tensor:
    """a * s, with the float in op_params[0] (ggml's ggml_scale since Dec 2023)."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.SCALE, a, params=[float(s)])


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    return scale(ctx, a, s, True)


def unary(ctx: Context, a: Tensor, op: UnaryOp, inplace: bool = False) -> Tensor:
    """UNARY with the function in op_params[0]."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.UNARY, a, params=[int(op)])


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return unary(ctx, a, op, True)
