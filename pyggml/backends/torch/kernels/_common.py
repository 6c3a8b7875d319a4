"""Helpers the torch kernels share: type sets, ggml broadcasting on torch views, copies in ggml's order."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from pyggml.backends.torch.kernels import Compute, PlanContext
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
Q8_0, Q4_0 = GGMLType.Q8_0, GGMLType.Q4_0
FLOAT_TYPES = (F32, F16)  # what the math kernels take, as the CPU's
ARITH_TYPES = (F32, F16, BF16)  # what ADD, MUL, SCALE and the unary kernels take, as the CPU's
COPY_TYPES = (F32, F16, BF16)  # what CPY/CONT/DUP convert between


Problem = tuple[type[GGMLError], str] | None  # why a kernel cannot compute a node (error class, reason)


def raise_problem(node: Tensor, problem: Problem) -> None:
    """The problem's error, naming the op and node, unless there is none."""
    if problem is not None:
        cls, reason = problem
        raise cls(f"torch {node.op.name} '{node.name}': {reason}")


def all_of(types: Sequence[GGMLType], *tensors: Tensor | None) -> bool:
    """True if every given tensor (None skipped) has one of `types`."""
    return all(t is None or t.type in types for t in tensors)


def require(node: Tensor, types: Sequence[GGMLType], *tensors: Tensor | None) -> None:
    """UnsupportedTypeError naming the op and tensor unless every tensor's type is in `types`."""
    for t in tensors:
        if t is not None and t.type not in types:
            names = ", ".join(a.name for a in types)
            raise UnsupportedTypeError(f"torch {node.op.name} '{node.name}': tensor '{t.name}' has type "
                                       f"{t.type.name}; this kernel takes {names}")


def same_shape(node: Tensor, x: torch.Tensor, d: torch.Tensor) -> None:
    if x.shape != d.shape:
        raise ShapeError(f"torch {node.op.name} '{node.name}': src0 ne {list(x.shape)[::-1]} and dst ne "
                         f"{list(d.shape)[::-1]} differ")


def unary_operands(node: Tensor, pc: PlanContext, types: Sequence[GGMLType] = FLOAT_TYPES
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dst, src0) views of a node whose one float source (of `types`) has dst's shape (SCALE, UNARY, the norms)."""
    require(node, types, node, node.src[0])
    assert node.src[0] is not None
    d, x = pc.view(node), pc.view(node.src[0])
    same_shape(node, x, d)
    return d, x


def ggml_tile(big: Sequence[torch.Tensor], small: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Views that make `small` repeat over the tensors in `big` the way ggml tiles (element i -> i % m).

    torch broadcasts only size-1 axes, so an axis of size n in `big` against
    size m (1 < m < n, m divides n) in `small` becomes (n/m, m) in `big` and
    (1, m) in `small`; splitting one axis is always a view. All tensors in
    `big` share `big[0]`'s shape.
    """
    big = list(big)
    for axis in reversed(range(small.dim())):
        n, m = big[0].shape[axis], small.shape[axis]
        if m != n and m != 1:
            big = [b.unflatten(axis, (n // m, m)) for b in big]
            small = small.unflatten(axis, (1, m))
    return big, small


def tiles(node: Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether b's shape tiles a's (each of a's sizes a multiple of b's)."""
    return all(m > 0 and n % m == 0 for n, m in zip(a.shape, b.shape, strict=True))


def copy_fn(d: torch.Tensor, s: torch.Tensor) -> Compute:
    """d's elements in row-major order get s's in row-major order (ggml's dup), converting dtype.

    No copy at prepare time; where neither side can be viewed in the other's
    shape, torch's reshape copies src at run time.
    """
    if d.shape == s.shape:
        return functools.partial(d.copy_, s)
    for dv, sv in ((_reshape_view(d, s.shape), s), (d, _reshape_view(s, d.shape))):
        if dv is not None and sv is not None:
            return functools.partial(dv.copy_, sv)

    def run() -> None:
        d.copy_(s.reshape(d.shape))

    return run


def softmax_rows(t: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax of t's rows (f32) with the sinks' extra logit per row (broadcast; no value of its own); a row of
    -inf only gives zeros, as ggml's (its sum is 0)."""
    mx = torch.amax(t, dim=-1, keepdim=True)
    if sinks is not None:
        mx = torch.maximum(mx, sinks)
    mx = torch.where(torch.isinf(mx) & (mx < 0), torch.zeros_like(mx), mx)
    e = torch.exp(t - mx)
    total = e.sum(dim=-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks - mx)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def _reshape_view(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """`t` in `shape` (row-major) without a copy, or None if that needs one."""
    try:
        return t.view(shape)
    except RuntimeError:
        return None
