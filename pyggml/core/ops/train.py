"""Training ops: the backward ops SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK, GET_ROWS_BACK, the loss
CROSS_ENTROPY_LOSS and its CROSS_ENTROPY_LOSS_BACK, and the optimizer steps OPT_STEP_ADAMW and OPT_STEP_SGD.

Shapes, sources and op_params as llama.cpp 0c1e570's ggml.c builds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.ops._build import require, same_or_view, set_op
from pyggml.core.ops.params import NormParams, SoftMaxParams
from pyggml.core.tensor import GGMLOp, Tensor, TensorFlag, are_same_shape
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """The gradient of silu at b (the forward's input) given the output's gradient a."""
    require(are_same_shape(a, b), "silu_back", "a and b must have the same shape", a, b)
    return set_op(ctx.dup_tensor(a), GGMLOp.SILU_BACK, a, b)


def rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """The gradient of rms_norm(b, eps) given the output's gradient a (src0 the gradient, src1 x, as ggml's
    kernel reads them)."""
    require(are_same_shape(a, b), "rms_norm_back", "a and b must have the same shape", a, b)
    return set_op(ctx.dup_tensor(a), GGMLOp.RMS_NORM_BACK, a, b, params=NormParams(eps=eps))


def _soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float, inplace: bool,
                       fn: str) -> Tensor:
    require(are_same_shape(a, b), fn, "a (the output's gradient) and b (soft_max's output) must have the same "
                                      "shape", a, b)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.SOFT_MAX_BACK, a, b,
                  params=SoftMaxParams(scale=scale, max_bias=max_bias))


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    """The gradient of soft_max_ext's input given its output b and the output's gradient a."""
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, False, "soft_max_ext_back")


def soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, True, "soft_max_ext_back_inplace")


def get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The gradient of get_rows: the rows of a added into the rows b names of an F32 tensor of c's shape."""
    require(a.is_matrix() and b.is_vector() and b.type == GGMLType.I32, "get_rows_back",
            "a must be a matrix and b an I32 vector", a, b, c)
    require(c.is_matrix() and a.ne[0] == c.ne[0], "get_rows_back", "c must be a matrix with a's rows' length",
            a, b, c)
    result = ctx.new_tensor_2d(GGMLType.F32, c.ne[0], c.ne[1])
    return set_op(result, GGMLOp.GET_ROWS_BACK, a, b)


def cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """-mean over rows of sum(b * log_softmax(a)): one element of a's type (a logits, b the labels)."""
    require(are_same_shape(a, b), "cross_entropy_loss", "a and b must have the same shape", a, b)
    result = ctx.new_tensor_1d(a.type, 1)
    return set_op(result, GGMLOp.CROSS_ENTROPY_LOSS, a, b)


def cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The gradient of cross_entropy_loss(b, c) by b, given the loss's gradient a (a scalar):
    (softmax(b) - c) * a / rows."""
    require(a.is_scalar(), "cross_entropy_loss_back", "a (the loss's gradient) must be a scalar", a, b, c)
    require(are_same_shape(b, c), "cross_entropy_loss_back", "b and c must have the same shape", a, b, c)
    return set_op(ctx.dup_tensor(b), GGMLOp.CROSS_ENTROPY_LOSS_BACK, a, b, c)


def _require_param(fn: str, a: Tensor) -> None:
    require(bool(a.flags & TensorFlag.PARAM), fn, f"'{a.name}' must be a parameter (ggml_set_param)", a)


def opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor, adamw_params: Tensor) -> Tensor:
    """One AdamW step on the parameter a in place (a view of a), its moments m and v updated too;
    adamw_params holds 7 F32: alpha, beta1, beta2, eps, wd, beta1h, beta2h."""
    _require_param("opt_step_adamw", a)
    for t in (grad, m, v):
        require(are_same_shape(a, t), "opt_step_adamw", f"'{t.name}' must have a's shape", a, t)
    require(adamw_params.type == GGMLType.F32 and adamw_params.nelements() == 7, "opt_step_adamw",
            "adamw_params must be 7 F32 values", adamw_params)
    return set_op(ctx.view_tensor(a), GGMLOp.OPT_STEP_ADAMW, a, grad, m, v, adamw_params)


def opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, params: Tensor) -> Tensor:
    """One SGD step with weight decay on the parameter a in place (a view of a): a = a (1 - alpha wd) - alpha grad;
    params holds 2 F32: alpha, wd."""
    _require_param("opt_step_sgd", a)
    require(are_same_shape(a, grad), "opt_step_sgd", "grad must have a's shape", a, grad)
    require(params.type == GGMLType.F32 and params.nelements() == 2, "opt_step_sgd",
            "params must be 2 F32 values", params)
    return set_op(ctx.view_tensor(a), GGMLOp.OPT_STEP_SGD, a, grad, params)


__all__ = ["cross_entropy_loss", "cross_entropy_loss_back", "get_rows_back", "opt_step_adamw", "opt_step_sgd",
           "rms_norm_back", "silu_back", "soft_max_ext_back", "soft_max_ext_back_inplace"]
