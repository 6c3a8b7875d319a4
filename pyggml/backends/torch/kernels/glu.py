"""Torch kernel: GLU, its seven functions (ggml_compute_forward_glu; the CPU kernels' formulas in
pyggml.backends.cpu.kernels.glu).

dst = act(x) * g per row, x and g the halves of src0's rows (fused form, `swapped` exchanges them; an odd
ne0 leaves the last element out) or src0 and src1 (split form). Computed in f32 and stored once in dst's
type. GEGLU and GEGLU_QUICK on F32/F16 data go through f16 as ggml's tables do (GEGLU on F32 with the
table's shortcuts: 0 at x <= -10, x at x >= 10).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import BF16, F16, F32, raise_problem
from pyggml.core.errors import GGMLError, ShapeError
from pyggml.core.ops.params import GLUParams
from pyggml.core.tensor import GGMLOp, GLUOp, Tensor
from pyggml.core.types import GGMLType

GELU_QUICK_COEF = -1.702

# the types each function takes, as ggml-cpu's: F32/F16/BF16 but for SWIGLU_OAI and SWIGLU_CLAMP
GLU_TYPES: dict[GLUOp, tuple[GGMLType, ...]] = {**dict.fromkeys(GLUOp, (F32, F16, BF16)),
                                               GLUOp.SWIGLU_OAI: (F32,), GLUOp.SWIGLU_CLAMP: (F32, F16)}


def _through_f16(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], shortcuts: bool) -> torch.Tensor:
    y = fn(x.to(torch.float16).to(torch.float32)).to(torch.float16).to(torch.float32)
    if shortcuts:
        y = torch.where(x <= -10.0, torch.zeros_like(y), torch.where(x >= 10.0, x, y))
    return y


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _gelu_quick(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(-GELU_QUICK_COEF * x)


def act(p: GLUParams, x: torch.Tensor, g: torch.Tensor, type: GGMLType) -> torch.Tensor:
    """act(x) * g in f32 for GLU function p.op."""
    op = p.op
    if op == GLUOp.REGLU:
        return torch.clamp_min(x, 0.0) * g
    if op == GLUOp.SWIGLU:
        return torch.nn.functional.silu(x) * g
    if op == GLUOp.GEGLU:
        return (_gelu(x) if type == BF16 else _through_f16(x, _gelu, shortcuts=type == F32)) * g
    if op == GLUOp.GEGLU_QUICK:
        return (_gelu_quick(x) if type == BF16 else _through_f16(x, _gelu_quick, shortcuts=False)) * g
    if op == GLUOp.GEGLU_ERF:
        return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0)))) * g
    xc = torch.clamp_max(x, p.limit)
    gc = torch.clamp(g, -p.limit, p.limit)
    if op == GLUOp.SWIGLU_OAI:
        return xc / (1.0 + torch.exp(-p.alpha * xc)) * (gc + 1.0)
    return torch.nn.functional.silu(xc) * gc  # SWIGLU_CLAMP


def glu_problem(node: Tensor) -> tuple[type[GGMLError], str] | None:
    a, b = node.src[0], node.src[1]
    try:
        p = GLUParams.of(node)
    except GGMLError as e:
        return type(e), str(e)
    types = GLU_TYPES[p.op]
    if a is None or any(t is not None and t.type != node.type for t in (a, b)) or node.type not in types:
        return ShapeError, f"{p.op.name} takes src0, src1 and dst of one type among {', '.join(t.name for t in types)}"
    nc = node.ne[0]
    want = a.ne[0] if b is not None else a.ne[0] // 2
    if want != nc or a.ne[1:] != node.ne[1:] or (b is not None and b.ne != a.ne):
        return ShapeError, f"src0 ne {a.ne}{f', src1 ne {b.ne}' if b is not None else ''} do not give dst ne {node.ne}"
    return None


def glu_kernel(node: Tensor, pc: PlanContext) -> Compute:
    raise_problem(node, glu_problem(node))
    p = GLUParams.of(node)
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None
    d, a = pc.view(node), pc.view(a_t)
    nc = d.shape[-1]
    if b_t is None:
        x, g = a[..., :nc], a[..., nc:2 * nc]
        if p.swapped:
            x, g = g, x
    else:
        x, g = a, pc.view(b_t)
    if d.numel() == 0:
        return noop
    f32 = torch.float32

    def run() -> None:
        d.copy_(act(p, x.to(f32), g.to(f32), node.type))

    return run


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.GLU: glu_kernel}


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.GLU and glu_problem(node) is None
