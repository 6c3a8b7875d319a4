"""Torch kernels: ADD, MUL, SCALE, UNARY (GELU, SILU, RELU), CPY/CONT/DUP and GET_ROWS.

F16 operands are computed in f32 and rounded once into the destination, as
ggml and the CPU kernels do (torch's CPU and CUDA kernels upcast halves to
f32 internally; `out=` casts the result to dst's dtype). GELU is ggml's tanh
approximation through f16, as ggml's table and the CPU backend give it.
"""

from __future__ import annotations

import functools

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import (
    ARITH_TYPES,
    BF16,
    COPY_TYPES,
    F16,
    F32,
    FLOAT_TYPES,
    I32,
    all_of,
    copy_fn,
    ggml_tile,
    require,
    tiles,
    unary_operands,
)
from pyggml.backends.torch.kernels.quants import DEQUANT_TYPES, dequantize
from pyggml.core.errors import ArgumentError, GGMLError, OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import ScaleParams, UnaryParams
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp

GET_ROWS_TYPES = (F32, F16, BF16, *DEQUANT_TYPES)
UNARY_OPS = (UnaryOp.GELU, UnaryOp.SILU, UnaryOp.RELU)


# --- ADD, MUL ---


def _binary(node: Tensor, pc: PlanContext, fn: object) -> Compute:
    """dst = fn(src0, src1) with src1 tiled over src0 (each src0.ne[i] a multiple of src1.ne[i])."""
    require(node, ARITH_TYPES, node, node.src[0], node.src[1])
    assert node.src[0] is not None and node.src[1] is not None
    d, a, b = pc.view(node), pc.view(node.src[0]), pc.view(node.src[1])
    if a.shape != d.shape or not tiles(node, a, b):
        raise ShapeError(f"torch {node.op.name} '{node.name}': src1 ne {list(b.shape)[::-1]} does not tile src0 ne "
                         f"{list(a.shape)[::-1]} into dst ne {list(d.shape)[::-1]}")
    if d.numel() == 0:
        return noop
    (d, a), b = ggml_tile([d, a], b)
    return functools.partial(fn, a, b, out=d)  # type: ignore[arg-type]


def add_kernel(node: Tensor, pc: PlanContext) -> Compute:
    return _binary(node, pc, torch.add)


def mul_kernel(node: Tensor, pc: PlanContext) -> Compute:
    return _binary(node, pc, torch.mul)


# --- SCALE, UNARY ---


def scale_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """dst = src0 * s + b (ScaleParams)."""
    d, x = unary_operands(node, pc, ARITH_TYPES)
    p = ScaleParams.of(node)
    if d.numel() == 0:
        return noop
    if p.b == 0.0:
        return functools.partial(torch.mul, x, p.s, out=d)

    def run() -> None:
        torch.add(torch.mul(x.to(torch.float32), p.s), p.b, out=d)

    return run


def unary_op_of(node: Tensor) -> UnaryOp | None:
    """The node's ggml_unary_op, or None if op_params[0] is none."""
    try:
        return UnaryParams.of(node).op
    except GGMLError:
        return None


def unary_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """UNARY GELU (tanh approximation), SILU (x / (1 + exp(-x))) and RELU (max(x, 0))."""
    d, x = unary_operands(node, pc, ARITH_TYPES)
    op = unary_op_of(node)
    if op not in UNARY_OPS:
        raise ArgumentError(f"torch UNARY '{node.name}': unary op {node.get_op_params_i32(0)} is not one of "
                            f"{', '.join(u.name for u in UNARY_OPS)}")
    if d.numel() == 0:
        return noop
    if x.dtype != d.dtype:
        raise UnsupportedTypeError(f"torch UNARY '{node.name}': src0 {x.dtype} and dst {d.dtype} differ")
    if op == UnaryOp.GELU and x.dtype == torch.float32:
        def gelu_through_f16() -> None:  # ggml's f16 table: f16 in, f16 out; 0 below -10, x above 10
            y = torch.nn.functional.gelu(x.to(torch.float16).to(torch.float32), approximate="tanh")
            y = y.to(torch.float16).to(torch.float32)
            d.copy_(torch.where(x <= -10.0, torch.zeros_like(y), torch.where(x >= 10.0, x, y)))

        return gelu_through_f16
    if op == UnaryOp.GELU:
        return functools.partial(torch.ops.aten.gelu.out, x, approximate="tanh", out=d)
    if op == UnaryOp.SILU:
        return functools.partial(torch.ops.aten.silu.out, x, out=d)
    return functools.partial(torch.clamp_min, x, 0.0, out=d)


# --- CPY, CONT, DUP ---


def dup_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """DUP, CONT and CPY (dst a view of src1): src0's elements in row-major order into dst's, converted."""
    src = node.src[0]
    assert src is not None
    if not copies(node, src):
        require(node, COPY_TYPES, node, src)
    if src.nelements() != node.nelements():
        raise ShapeError(f"torch {node.op.name} '{node.name}': {src.nelements()} elements in '{src.name}' but "
                         f"{node.nelements()} in dst")
    if node.nelements() == 0:
        return noop
    return copy_fn(pc.view(node), pc.view(src))


def copies(node: Tensor, src: Tensor) -> bool:
    """Whether the copy kernel takes these types: between F32/F16/BF16, or I32 to I32."""
    return all_of(COPY_TYPES, node, src) or node.type == src.type == I32


# --- GET_ROWS ---


def get_rows_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """dst[:, i10, i11, i12] = src0[:, src1[i10, i11, i12], i11, i12] (ggml's ne order), as F32 or F16.

    Quantized rows are dequantized after picking, so only the picked rows are converted.
    The indices are checked on every compute (OutOfBoundsError), as the CPU's.
    """
    a_t, i_t = node.src[0], node.src[1]
    assert a_t is not None and i_t is not None
    require(node, GET_ROWS_TYPES, a_t)
    require(node, (I32,), i_t)
    require(node, FLOAT_TYPES, node)
    ne10, ne11, ne12 = i_t.ne[0], i_t.ne[1], i_t.ne[2]
    if a_t.ne[2] != ne11 or a_t.ne[3] != ne12 or i_t.ne[3] != 1 or node.ne != [a_t.ne[0], ne10, ne11, ne12]:
        raise ShapeError(f"torch GET_ROWS '{node.name}': rows {a_t.ne}, indices {i_t.ne}, dst {node.ne} do not fit "
                         "(need rows.ne[2] == idx.ne[1], rows.ne[3] == idx.ne[2], dst [rows.ne0, idx.ne0..2])")
    if node.nelements() == 0:
        return noop
    d, a, idx = pc.view(node), pc.view(a_t), pc.view(i_t)
    ids = idx[0]  # (ne12, ne11, ne10)
    n_rows = a_t.ne[1]
    name = node.name
    quantized = a_t.type in DEQUANT_TYPES
    st = a_t.type

    def check() -> None:
        lo, hi = torch.aminmax(ids)
        lo_i, hi_i = int(lo), int(hi)
        if lo_i < 0 or hi_i >= n_rows:
            raise OutOfBoundsError(f"torch GET_ROWS '{name}': row index {lo_i if lo_i < 0 else hi_i} outside "
                                   f"[0, {n_rows})")

    if ne11 == 1 and ne12 == 1 and not quantized:
        a2, i1, d2 = a[0, 0], ids[0, 0], d[0, 0]
        if a2.dtype == d2.dtype:
            def select() -> None:
                check()
                torch.index_select(a2, 0, i1, out=d2)

            return select

        def select_convert() -> None:
            check()
            d2.copy_(torch.index_select(a2, 0, i1))

        return select_convert

    dev = a.device
    i3 = torch.arange(ne12, device=dev).view(ne12, 1, 1)
    i2 = torch.arange(ne11, device=dev).view(1, ne11, 1)

    def gather() -> None:
        check()
        rows = a[i3, i2, ids]
        d.copy_(dequantize(st, rows) if quantized else rows)

    return gather


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.ADD: add_kernel,
    GGMLOp.MUL: mul_kernel,
    GGMLOp.SCALE: scale_kernel,
    GGMLOp.UNARY: unary_kernel,
    GGMLOp.DUP: dup_kernel,
    GGMLOp.CONT: dup_kernel,
    GGMLOp.CPY: dup_kernel,
    GGMLOp.GET_ROWS: get_rows_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node` (types and unary function as the table in kernels/__init__)."""
    op = node.op
    s0, s1 = node.src[0], node.src[1]
    if s0 is None:
        return False
    if op in (GGMLOp.ADD, GGMLOp.MUL):
        return s1 is not None and all_of(ARITH_TYPES, node, s0, s1)
    if op == GGMLOp.SCALE:
        return all_of(ARITH_TYPES, node, s0)
    if op == GGMLOp.UNARY:
        return all_of(ARITH_TYPES, node, s0) and s0.type == node.type and unary_op_of(node) in UNARY_OPS
    if op in (GGMLOp.DUP, GGMLOp.CONT, GGMLOp.CPY):
        return copies(node, s0)
    if op == GGMLOp.GET_ROWS:
        return s1 is not None and s1.type == I32 and s0.type in GET_ROWS_TYPES and node.type in FLOAT_TYPES
    return False
