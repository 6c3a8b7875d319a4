"""What every op builder shares: result tensors and shape errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.tensor import GGMLOp, Tensor, shape_str

if TYPE_CHECKING:
    from pyggml.core.context import Context


def require(cond: bool, op: str, message: str, *tensors: Tensor) -> None:
    """Raise ShapeError naming the op, the rule and the operands' shapes unless `cond`."""
    if not cond:
        operands = ", ".join(shape_str(t) for t in tensors)
        raise ShapeError(f"{op}: {message} ({operands})" if tensors else f"{op}: {message}")


def require_arg(cond: bool, op: str, message: str, *tensors: Tensor) -> None:
    """Raise ArgumentError (an op parameter out of range) naming the op and the operands unless `cond`."""
    if not cond:
        operands = ", ".join(shape_str(t) for t in tensors)
        raise ArgumentError(f"{op}: {message} ({operands})" if tensors else f"{op}: {message}")


def set_op(result: Tensor, op: GGMLOp, *srcs: Tensor | None, params: list[int | float] | None = None) -> Tensor:
    """Make `result` the node of `op` over `srcs` (in order, ggml's src[0], src[1], ...)."""
    result.op = op
    for i, s in enumerate(srcs):
        result.src[i] = s
    if params:
        result.set_op_params(params)
    return result


def same_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    """ggml's `inplace ? ggml_view_tensor(ctx, a) : ggml_dup_tensor(ctx, a)`."""
    return ctx.view_tensor(a) if inplace else ctx.dup_tensor(a)


def int64_words(value: int) -> list[int]:
    """A size_t/int64 op param as two int32 words (little endian), as ggml stores it."""
    value &= (1 << 64) - 1
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return [lo - (1 << 32) if lo >= 1 << 31 else lo, hi - (1 << 32) if hi >= 1 << 31 else hi]


def words_int64(lo: int, hi: int) -> int:
    return (lo & 0xFFFFFFFF) | ((hi & 0xFFFFFFFF) << 32)
