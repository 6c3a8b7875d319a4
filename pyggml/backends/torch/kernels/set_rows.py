"""Torch kernel: SET_ROWS (ggml_compute_forward_set_rows): dst[:, c[i, i2 % c.ne1, i3 % c.ne2], i2, i3] =
src0[:, i, i2, i3], converted to dst's type; dst is a view of the tensor whose rows are written.

Sources F32/F16 rows and I32/I64 indices, destinations F32/F16/BF16 and Q8_0. Q8_0 rows are quantized as
ggml-cpu's SIMD quantize_row_q8_0 does (d = amax/127, quants x * (127/amax) rounded half to even), the form
llama.cpp's CPU takes on x86 and ARM. The indices are checked on every compute (OutOfBoundsError).
"""

from __future__ import annotations

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import BF16, F16, F32, Q8_0, Problem, raise_problem
from pyggml.core.errors import OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

SET_ROWS_DST_TYPES = (F32, F16, BF16, Q8_0)
SET_ROWS_SRC_TYPES = (F32, F16)
INDEX_TYPES = (GGMLType.I32, GGMLType.I64)
QK8_0 = 32


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """f32 rows (..., n) -> block_q8_0 bytes (..., n / 32 * 34), as ggml-cpu's SIMD quantize_row_q8_0."""
    blocks = x.unflatten(-1, (x.shape[-1] // QK8_0, QK8_0))
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv).to(torch.int8)
    d = (amax / 127.0).to(torch.float16)
    out = torch.cat((d.view(torch.uint8), q.view(torch.uint8)), dim=-1)
    return out.flatten(-2)


def set_rows_problem(node: Tensor) -> Problem:
    """Why this kernel cannot compute the SET_ROWS node (error class and reason), or None."""
    b, c = node.src[0], node.src[1]
    if b is None or c is None:
        return ShapeError, "needs rows and indices"
    if node.type not in SET_ROWS_DST_TYPES or b.type not in SET_ROWS_SRC_TYPES or c.type not in INDEX_TYPES:
        return UnsupportedTypeError, (f"types {b.type.name} rows, {c.type.name} indices -> {node.type.name} (takes "
                f"{'/'.join(t.name for t in SET_ROWS_SRC_TYPES)} rows, I32/I64 indices, "
                f"{'/'.join(t.name for t in SET_ROWS_DST_TYPES)} destinations)")
    if (node.ne[0] != b.ne[0] or node.ne[2:] != b.ne[2:] or b.ne[1] != c.ne[0] or c.ne[3] != 1
            or c.ne[1] == 0 or c.ne[2] == 0 or b.ne[2] % c.ne[1] or b.ne[3] % c.ne[2]):
        return ShapeError, f"dst ne {node.ne}, rows ne {b.ne}, indices ne {c.ne} do not fit"
    if node.nb[0] != TYPE_TRAITS[node.type].type_size or b.nb[0] != TYPE_TRAITS[b.type].type_size:
        return ShapeError, "rows must be contiguous"
    return None


def set_rows_kernel(node: Tensor, pc: PlanContext) -> Compute:
    raise_problem(node, set_rows_problem(node))
    b_t, c_t = node.src[0], node.src[1]
    assert b_t is not None and c_t is not None
    d, b, idx = pc.view(node), pc.view(b_t), pc.view(c_t)
    if b.numel() == 0:
        return noop
    ne3, ne2 = b_t.ne[3], b_t.ne[2]
    c1, c2 = c_t.ne[1], c_t.ne[2]
    dev = d.device
    i3 = torch.arange(ne3, device=dev)
    i2 = torch.arange(ne2, device=dev)
    n_dst = node.ne[1]
    name = node.name
    quantized = node.type == Q8_0
    f32 = torch.float32

    def run() -> None:
        rows = idx[0][(i3 % c2)[:, None], (i2 % c1)[None, :]].long()  # (ne3, ne2, n_rows)
        lo, hi = torch.aminmax(rows)
        if int(lo) < 0 or int(hi) >= n_dst:
            raise OutOfBoundsError(f"torch SET_ROWS '{name}': row index {int(lo) if int(lo) < 0 else int(hi)} "
                                   f"outside [0, {n_dst})")
        values = quantize_q8_0(b.to(f32)) if quantized else b.to(d.dtype)
        d[i3[:, None, None], i2[None, :, None], rows] = values

    return run


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.SET_ROWS: set_rows_kernel}


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.SET_ROWS and set_rows_problem(node) is None
