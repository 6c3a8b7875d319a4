"""GLU (ggml_glu_op): gated linear units, fused (one tensor split in halves along ne0) or split (two tensors).

ggml_glu_impl: src[0] = a, src[1] = b (None in the fused form); op_params word 0 the GLUOp, word 1 swapped
(fused form: the gate is the second half), and for SWIGLU_OAI/SWIGLU_CLAMP the floats alpha (word 2) and
limit (word 3). The result has a's type; ne0 is a.ne[0] / 2 in the fused form, a's shape in the split form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import as_enum, require, set_op
from pyggml.core.ops.params import GLUParams
from pyggml.core.tensor import GGMLOp, GLUOp, Tensor, are_same_shape
from pyggml.core.types import TYPE_TRAITS

if TYPE_CHECKING:
    from pyggml.core.context import Context


def is_contiguous_1(t: Tensor) -> bool:
    """ggml_is_contiguous_1: elements of a row contiguous, dims 2 and 3 packed after dim 1 (rows may be padded)."""
    tr = TYPE_TRAITS[t.type]
    if t.ne[0] != tr.blck_size and t.nb[0] != tr.type_size:
        return False
    next_nb = t.nb[1] * t.ne[1]
    for i in (2, 3):
        if t.ne[i] != 1:
            if t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
    return True


def _glu_impl(ctx: Context, a: Tensor, b: Tensor | None, op: object, swapped: bool, name: str,
              alpha: float = 0.0, limit: float = 0.0) -> Tensor:
    glu_op = as_enum(GLUOp, op, name, "op")
    require(is_contiguous_1(a), name, "a must be contiguous in dims 1..3 (ggml_is_contiguous_1)", a)
    if b is not None:
        require(is_contiguous_1(b), name, "b must be contiguous in dims 1..3 (ggml_is_contiguous_1)", b)
        require(are_same_shape(a, b), name, "a and b must have the same shape", a, b)
        if a.type != b.type:
            raise UnsupportedTypeError(f"{name}: a has type {a.type.name}, b {b.type.name}: they must be the same")
        ne = list(a.ne)
    else:
        ne = [a.ne[0] // 2, *a.ne[1:]]
    result = ctx.new_tensor(a.type, ne)
    return set_op(result, GGMLOp.GLU, a, b,
                  params=GLUParams(op=glu_op, swapped=bool(swapped), alpha=alpha, limit=limit))


def glu(ctx: Context, a: Tensor, op: GLUOp | int, swapped: bool = False) -> Tensor:
    """ggml_glu: act(one half of a's rows) * the other half; `swapped` gates with the second half."""
    return _glu_impl(ctx, a, None, op, swapped, "glu")


def glu_split(ctx: Context, a: Tensor, b: Tensor, op: GLUOp | int) -> Tensor:
    """ggml_glu_split: act(a) * b."""
    return _glu_impl(ctx, a, b, op, False, "glu_split")


def reglu(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.REGLU, False, "reglu")


def reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.REGLU, True, "reglu_swapped")


def reglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _glu_impl(ctx, a, b, GLUOp.REGLU, False, "reglu_split")


def geglu(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU, False, "geglu")


def geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU, True, "geglu_swapped")


def geglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _glu_impl(ctx, a, b, GLUOp.GEGLU, False, "geglu_split")


def swiglu(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.SWIGLU, False, "swiglu")


def swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.SWIGLU, True, "swiglu_swapped")


def swiglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _glu_impl(ctx, a, b, GLUOp.SWIGLU, False, "swiglu_split")


def geglu_erf(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU_ERF, False, "geglu_erf")


def geglu_erf_swapped(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU_ERF, True, "geglu_erf_swapped")


def geglu_erf_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _glu_impl(ctx, a, b, GLUOp.GEGLU_ERF, False, "geglu_erf_split")


def geglu_quick(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU_QUICK, False, "geglu_quick")


def geglu_quick_swapped(ctx: Context, a: Tensor) -> Tensor:
    return _glu_impl(ctx, a, None, GLUOp.GEGLU_QUICK, True, "geglu_quick_swapped")


def geglu_quick_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _glu_impl(ctx, a, b, GLUOp.GEGLU_QUICK, False, "geglu_quick_split")


def swiglu_oai(ctx: Context, a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
    """ggml_swiglu_oai: min(a, limit) * sigmoid(alpha * min(a, limit)) * (clamp(b, -limit, limit) + 1)."""
    return _glu_impl(ctx, a, b, GLUOp.SWIGLU_OAI, False, "swiglu_oai", alpha=alpha, limit=limit)


def swiglu_clamp(ctx: Context, a: Tensor, b: Tensor, limit: float) -> Tensor:
    """ggml_swiglu_clamp: silu(min(a, limit)) * clamp(b, -limit, limit)."""
    return _glu_impl(ctx, a, b, GLUOp.SWIGLU_CLAMP, False, "swiglu_clamp", limit=limit)


__all__ = [
    "geglu", "geglu_erf", "geglu_erf_split", "geglu_erf_swapped", "geglu_quick", "geglu_quick_split",
    "geglu_quick_swapped", "geglu_split", "geglu_swapped", "glu", "glu_split", "reglu", "reglu_split",
    "reglu_swapped", "swiglu", "swiglu_clamp", "swiglu_oai", "swiglu_split", "swiglu_swapped",
]
