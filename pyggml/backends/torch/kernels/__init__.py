"""The torch backend's kernel table: one kernel per op, and `supports` with the types each takes.

A kernel *prepares* one node: it gets the node and the plan's `PlanContext`
(torch views of any tensor, the backend, what the plan writes), does its shape
work and checks once, and returns a function of no arguments that computes
the node into the destination's memory (`out=` or `copy_` into the view;
never a rebinding). The same contract as the CPU kernels, with torch views
(4-D, shape (ne3, ne2, ne1, ne0), strides reversed `nb` in elements;
quantized types as raw uint8 rows) in place of numpy views.

`supports(node)` is true exactly for the ops and types these kernels
compute, so the scheduler sends everything else to the CPU:

| op | types |
|---|---|
| NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE | any (nothing to compute) |
| ADD, MUL | F32/F16/BF16 src0, src1, dst (src1 tiles over src0 as in ggml) |
| SCALE | F32/F16/BF16 src0 and dst |
| RMS_NORM, NORM | F32/F16 src0 and dst |
| UNARY GELU, SILU, RELU | F32/F16/BF16 src0 and dst |
| SOFT_MAX | F32/F16 src0 and dst, optional F32/F16 mask; scale in op_params |
| ROPE | F32/F16 src0 and dst, I32 positions, F32 frequency factors; every mode of ggml's CPU |
| GET_ROWS | F32/F16/BF16 and every quantized type pyggml converts as rows, I32 indices, F32/F16 dst |
| CPY, CONT, DUP | F32/F16/BF16 to F32/F16/BF16, I32 to I32 (never a quantized destination: see the weight cache) |
| GLU | all seven functions: F32/F16/BF16 (SWIGLU_OAI F32, SWIGLU_CLAMP F32/F16), src0, src1, dst of one type |
| SET_ROWS | F32/F16 rows, I32/I64 indices, F32/F16/BF16/Q8_0 dst |
| MUL_MAT_ID | MUL_MAT's weight types as `as`, F32 b, I32 ids, F32 dst |
| ADD_ID | F32 a, b, dst, I32 ids |
| FLASH_ATTN_EXT | F32 q, dst; F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL k, v; F16 mask, F32 sinks, softcap |
| MUL_MAT | F32/F16/BF16 or any quantized type pyggml converts; F32 src1 (or src0's F16/BF16); F32 dst |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from pyggml.core.tensor import GGMLOp, Tensor, is_view_op

if TYPE_CHECKING:
    from pyggml.backends.torch.backend import TorchBackend

Compute = Callable[[], None]


def noop() -> None:
    """The compute function of a node with nothing to do (views, empty tensors)."""


class PlanContext(Protocol):
    """What a kernel gets from the plan being made (see `pyggml.backends.torch.plan`)."""

    backend: TorchBackend

    def view(self, t: Tensor) -> torch.Tensor:
        """The torch view of `t` (its buffer must be one of this backend's)."""
        ...

    def written_by_plan(self, t: Tensor) -> bool:
        """Whether any node of the plan writes bytes of `t` (so nothing derived from it may be cached)."""
        ...

    def derived(self, t: Tensor, dtype: torch.dtype, make: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """A function giving `make()` (t's bytes converted to `dtype`) through the backend's weight cache."""
        ...

    def derived_matrices(self, t: Tensor, dtype: torch.dtype, make: Callable[[int], torch.Tensor]
                         ) -> Callable[[int], torch.Tensor]:
        """A function giving matrix i2 of t (along dim 2) converted to `dtype` (`make(i2)`), each matrix through the
        weight cache on its own."""
        ...


Kernel = Callable[[Tensor, PlanContext], Compute]


def view_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """VIEW, RESHAPE, PERMUTE, TRANSPOSE and NONE: nothing to compute."""
    return noop


def _table() -> tuple[dict[GGMLOp, Kernel], dict[GGMLOp, Callable[[Tensor], bool]]]:
    from pyggml.backends.torch.kernels import attention, elementwise, glu, matmul, moe, norm, set_rows

    kernels: dict[GGMLOp, Kernel] = {}
    supports: dict[GGMLOp, Callable[[Tensor], bool]] = {}
    for module in (elementwise, norm, matmul, glu, set_rows, attention, moe):
        kernels.update(module.KERNELS)
        supports.update(dict.fromkeys(module.KERNELS, module.supports))
    return kernels, supports


KERNELS, _SUPPORTS = _table()


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node` (its op, types and parameters)."""
    if node.op == GGMLOp.NONE or is_view_op(node.op):
        return True
    check = _SUPPORTS.get(node.op)
    return check is not None and bool(check(node))


def is_noop(fn: Compute) -> bool:
    return fn is noop


__all__ = ["KERNELS", "Compute", "Kernel", "PlanContext", "is_noop", "noop", "supports", "view_kernel"]
