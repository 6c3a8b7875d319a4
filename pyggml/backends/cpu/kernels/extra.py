"""CPU kernels of SAM's ops: WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS (ROPE_BACK is beside ROPE in norm.py).

As ggml-cpu's ops.cpp computes them: WIN_PART, WIN_UNPART and ADD_REL_POS F32, GET_REL_POS F16 or BF16
(its 16-bit words copied into the F16 result, as ggml does). ggml reads the sources as contiguous: here a
non-contiguous source, or one too small for the op_params, raises before anything is computed.
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import noop, require_types, same_memory
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import AddRelPosParams, WinPartParams, WinUnpartParams
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

_F32_ONLY = (GGMLType.F32,)
_HALF = (GGMLType.F16, GGMLType.BF16)


def _ne(a: np.ndarray) -> list[int]:
    return list(a.shape[::-1])


def _contiguous_src0(node: Tensor, srcs: list[np.ndarray | None], types: tuple[GGMLType, ...]) -> np.ndarray:
    src0 = node.src[0]
    assert src0 is not None
    require_types(node, types, src0)
    x = srcs[0]
    assert x is not None
    if not src0.is_contiguous():
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 '{src0.name}' must be contiguous "
                         f"(ggml reads it so), nb {src0.nb}")
    return x


def _window(node: Tensor, w: int) -> None:
    if w <= 0:
        raise ArgumentError(f"CPU {node.op.name} '{node.name}': window size w={w} must be > 0")


def win_part_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[py*npx + px, i2, i1] = src0[py*w + i2, px*w + i1] (rows of ne0), 0 past src0's edge."""
    require_types(node, _F32_ONLY, node)
    x = _contiguous_src0(node, srcs, _F32_ONLY)
    p = WinPartParams.of(node)
    _window(node, p.w)
    _, ne02, ne01, ne00 = x.shape
    npx, npy, w = p.npx, p.npy, p.w
    if dst.shape != (npx * npy, w, w, ne00) or npx * w < ne01 or npy * w < ne02 or x.shape[0] != 1:
        raise ShapeError(f"CPU WIN_PART '{node.name}': dst ne {_ne(dst)} are no {npx}x{npy} windows of {w} "
                         f"over src0 ne {_ne(x)}")
    if dst.size == 0:
        return noop
    image = np.zeros((npy * w, npx * w, ne00), np.float32)  # src0 zero-padded; the padding stays 0
    inner = x[0]

    def run() -> None:
        image[:ne02, :ne01] = inner
        # (py, i2, px, i1, i0) -> (py, px, i2, i1, i0): window py*npx + px
        np.copyto(dst, image.reshape(npy, w, npx, w, ne00).transpose(0, 2, 1, 3, 4).reshape(dst.shape))

    return run


def win_unpart_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """dst[i2, i1] = src0[(i2/w)*npx + i1/w, i2%w, i1%w] (rows of ne0), npx = ceil(ne1/w): the padding dropped."""
    require_types(node, _F32_ONLY, node)
    x = _contiguous_src0(node, srcs, _F32_ONLY)
    w = WinUnpartParams.of(node).w
    _window(node, w)
    ne03, ne02, ne01, ne00 = x.shape
    _, ne2, ne1, ne0 = dst.shape
    npx = (ne1 + w - 1) // w
    npy = (ne2 + w - 1) // w
    if dst.shape[0] != 1 or ne0 != ne00 or (ne1 and ne01 < min(w, ne1)) or (ne2 and ne02 < min(w, ne2)) \
            or (dst.size and ne03 < npx * npy):
        raise ShapeError(f"CPU WIN_UNPART '{node.name}': src0 ne {_ne(x)} holds no {npx}x{npy} windows of {w} "
                         f"for dst ne {_ne(dst)}")
    if dst.size == 0:
        return noop
    i2 = np.arange(ne2)[:, None]
    i1 = np.arange(ne1)[None, :]
    rows = ((i2 // w) * npx + i1 // w) * (ne02 * ne01) + (i2 % w) * ne01 + i1 % w  # (ne2, ne1) src0 rows
    flat = x.reshape(ne03 * ne02 * ne01, ne00)

    def run() -> None:
        np.take(flat, rows, axis=0, out=dst[0])

    return run


def get_rel_pos_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst[i2, i1] = src0 row (ne1 - 1 - i1) + i2: each query's relative positions to the keys (16-bit words)."""
    require_types(node, (GGMLType.F16,), node)
    x = _contiguous_src0(node, srcs, _HALF)
    ne03, ne02, ne01, ne00 = x.shape
    _, ne2, ne1, ne0 = dst.shape
    if dst.shape[0] != 1 or ne0 != ne00 or (ne1 and ne2 and ne1 + ne2 - 1 > ne01 * ne02 * ne03):
        raise ShapeError(f"CPU GET_REL_POS '{node.name}': src0 ne {_ne(x)} has too few rows for dst ne {_ne(dst)}")
    if dst.size == 0:
        return noop
    rows = (ne1 - 1 - np.arange(ne1))[None, :] + np.arange(ne2)[:, None]  # (ne2, ne1)
    flat = x.reshape(-1, ne00).view(np.uint16)
    out = dst[0].view(np.uint16)

    def run() -> None:
        np.take(flat, rows, axis=0, out=out)

    return run


def add_rel_pos_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst = src0 with, in the first R = ne11*ne12*ne13 rows of k*k (k = ne10), dst[r, a, b] += ph[r, a] +
    pw[r, b] (pw = src1, ph = src2), added in ggml's order: ph first where a <= b, pw first where a > b."""
    require_types(node, _F32_ONLY, node, node.src[1], node.src[2])
    x = _contiguous_src0(node, srcs, _F32_ONLY)
    pw, ph = srcs[1], srcs[2]
    assert pw is not None and ph is not None
    src1, src2 = node.src[1], node.src[2]
    assert src1 is not None and src2 is not None
    k = pw.shape[3]
    n_rows = pw.shape[0] * pw.shape[1] * pw.shape[2]
    if (not src1.is_contiguous() or not src2.is_contiguous() or ph.shape != pw.shape or dst.shape != x.shape
            or n_rows * k * k > x.size):
        raise ShapeError(f"CPU ADD_REL_POS '{node.name}': pw ne {_ne(pw)} and ph ne {_ne(ph)} (contiguous, the "
                         f"same shape) do not fit src0 ne {_ne(x)}")
    AddRelPosParams.of(node)  # ggml's inplace word: a copy is skipped where dst is src0's memory anyway
    copy = not same_memory(dst, x)
    if dst.size == 0:
        return noop
    cells = dst.reshape(-1)[: n_rows * k * k].reshape(n_rows, k, k)
    h = ph.reshape(n_rows, k, 1)
    wr = pw.reshape(n_rows, 1, k)
    ph_first = np.arange(k)[:, None] <= np.arange(k)[None, :]  # (a, b): ggml adds ph[r, a] first when a <= b

    def run() -> None:
        if copy:
            np.copyto(dst, x)
        first = np.where(ph_first, cells + h, cells + wr)
        np.add(first, np.where(ph_first, wr, h), out=cells)

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.WIN_PART: win_part_kernel,
    GGMLOp.WIN_UNPART: win_unpart_kernel,
    GGMLOp.GET_REL_POS: get_rel_pos_kernel,
    GGMLOp.ADD_REL_POS: add_rel_pos_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: ggml-cpu's types, contiguous sources."""
    if node.op not in KERNELS:
        return False
    src0 = node.src[0]
    if src0 is None or not src0.is_contiguous():
        return False
    if node.op == GGMLOp.GET_REL_POS:
        return src0.type in _HALF and node.type == GGMLType.F16
    srcs = [s for s in node.src[:3] if s is not None]
    return node.type == GGMLType.F32 and all(s.type == GGMLType.F32 and s.is_contiguous() for s in srcs)
