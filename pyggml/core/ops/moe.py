"""Mixture of experts: MUL_MAT_ID (each token's rows through its chosen experts' matrices) and ADD_ID
(each row plus its expert's bias row)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import require, set_op
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def _require_i32_ids(op: str, ids: Tensor) -> None:
    if ids.type != GGMLType.I32:
        raise UnsupportedTypeError(f"{op}: ids '{ids.name}' has type {ids.type.name}; it must be I32")


def mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: as_ [K, M, n_expert], b [K, n_b, n_tokens], ids [n_used, n_tokens] (I32) ->
    [M, n_used, n_tokens] F32: c[:, e, t] = as_[:, :, ids[e, t]] x b[:, e % n_b, t]."""
    op = "mul_mat_id"
    require(not as_.is_transposed(), op, "as must not be transposed", as_)
    _require_i32_ids(op, ids)
    require(as_.ne[3] == 1, op, "as must be 3-D (one matrix per expert)", as_)
    require(b.ne[3] == 1, op, "b must be 3-D", b)
    require(ids.ne[2] == 1 and ids.ne[3] == 1, op, "ids must be 2-D", ids)
    require(ids.ne[1] == b.ne[2], op, "ids.ne[1] must equal b.ne[2] (an expert list per token)", ids, b)
    require(as_.ne[0] == b.ne[0], op, "as.ne[0] must equal b.ne[0]", as_, b)
    require(b.ne[1] > 0 and ids.ne[0] % b.ne[1] == 0, op, "ids.ne[0] must be a multiple of b.ne[1]", ids, b)
    result = ctx.new_tensor(GGMLType.F32, [as_.ne[1], ids.ne[0], b.ne[2], 1])
    return set_op(result, GGMLOp.MUL_MAT_ID, as_, b, ids)


def add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_add_id: a[:, i1, i2] + b[:, ids[i1, i2]] (a [n, n_used, n_tokens], b [n, n_expert])."""
    op = "add_id"
    require(a.ne[0] == b.ne[0], op, "a.ne[0] must equal b.ne[0]", a, b)
    require(a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], op, "a.ne[1], a.ne[2] must equal ids.ne[0], ids.ne[1]",
            a, ids)
    _require_i32_ids(op, ids)
    result = ctx.dup_tensor(a)
    return set_op(result, GGMLOp.ADD_ID, a, b, ids)


__all__ = ["add_id", "mul_mat_id"]
