"""MUL_MAT and OUT_PROD."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pyggml.core.ops._build import as_enum, require, set_op
from pyggml.core.ops.params import MulMatParams
from pyggml.core.tensor import GGMLOp, OpHint, Tensor, divides
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def can_mul_mat(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and divides(a.ne[2], b.ne[2]) and divides(a.ne[3], b.ne[3])


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a[K, M] x b[K, N] -> [M, N] (= b @ a.T in numpy terms); a broadcasts over dims 2 and 3."""
    require(can_mul_mat(a, b), "mul_mat", "a.ne[0] must equal b.ne[0], and b.ne[2], b.ne[3] be multiples of a's",
            a, b)
    require(not a.is_transposed(), "mul_mat", "a must not be transposed", a)
    result = ctx.new_tensor_4d(GGMLType.F32, a.ne[1], b.ne[1], b.ne[2], b.ne[3])
    return set_op(result, GGMLOp.MUL_MAT, a, b)


def mul_mat_set_hint(a: Tensor, hint: OpHint | int) -> None:
    """ggml_mul_mat_set_hint: what src0 of MUL_MAT `a` is (SRC0_IS_HADAMARD: an orthonormal Walsh-Hadamard
    matrix, which a backend may apply as a fast transform), op_params word 1."""
    require(isinstance(a, Tensor) and a.op == GGMLOp.MUL_MAT, "mul_mat_set_hint", "a must be a MUL_MAT node",
            *([a] if isinstance(a, Tensor) else []))
    h = as_enum(OpHint, hint, "mul_mat_set_hint", "hint")
    dataclasses.replace(MulMatParams.of(a), hint=h).store(a)


def can_out_prod(a: Tensor, b: Tensor) -> bool:
    return a.ne[1] == b.ne[1] and divides(a.ne[2], b.ne[2]) and divides(a.ne[3], b.ne[3])


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a[M, K] and b[N, K] -> [M, N]: sum over k of a[:, k] outer b[:, k]."""
    require(can_out_prod(a, b), "out_prod", "a.ne[1] must equal b.ne[1], and b.ne[2], b.ne[3] be multiples of a's",
            a, b)
    require(not a.is_transposed(), "out_prod", "a must not be transposed", a)
    result = ctx.new_tensor_4d(GGMLType.F32, a.ne[0], b.ne[0], b.ne[2], b.ne[3])  # a broadcast over b's dims 2, 3
    return set_op(result, GGMLOp.OUT_PROD, a, b)
