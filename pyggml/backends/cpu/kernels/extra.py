"""CPU kernels of SAM's ops (WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS), DeepSeek-V4's LIGHTNING_INDEXER
and hyper-connections (DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST); ROPE_BACK is beside ROPE in norm.py.

As ggml-cpu's ops.cpp computes them: WIN_PART, WIN_UNPART and ADD_REL_POS F32, GET_REL_POS F16 or BF16
(its 16-bit words copied into the F16 result, as ggml does). SAM's kernels read their sources as contiguous
in ggml: here a non-contiguous source, or one too small for the op_params, raises before anything is
computed. The DeepSeek-V4 ops take F32 (the indexer's K any type pyggml converts to F32, its mask F16) in
any layout, and sum in ggml's order (one term after the other, in f32).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import F32, is_multiple, noop, require_types, same_memory
from pyggml.backends.cpu.kernels.vec_dot.to_float import to_f32
from pyggml.backends.cpu.kernels.vec_dot.type_table import CPU_TYPE_TRAITS
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import AddRelPosParams, Dsv4HcCombParams, Dsv4HcPreParams, WinPartParams, WinUnpartParams
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


# --- DeepSeek-V4 ---


def _shape_check(node: Tensor, ok: bool, what: str) -> None:
    if not ok:
        shapes = ", ".join(f"{s.name or '?'} ne {s.ne}" for s in node.src if s is not None)
        raise ShapeError(f"CPU {node.op.name} '{node.name}': {what} (dst ne {node.ne}; {shapes})")


def _f32_srcs(node: Tensor, srcs: list[np.ndarray | None], n: int) -> list[np.ndarray]:
    require_types(node, _F32_ONLY, node, *node.src[:n])
    out = [s for s in srcs[:n] if s is not None]
    _shape_check(node, len(out) == n, f"needs {n} sources")
    return out


def lightning_indexer_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                             params: ComputeParams) -> Compute:
    """dst[s, t, kv] = sum_h max(q[s, t, h] . k[s, kv], 0) * w[s, t, h] (h in order) + mask[s % nm, t, kv]."""
    q_t, k_t, w_t, m_t = node.src[:4]
    assert q_t is not None and k_t is not None and w_t is not None and m_t is not None
    require_types(node, _F32_ONLY, node, q_t, w_t)
    require_types(node, (GGMLType.F16,), m_t)
    if k_t.type not in CPU_TYPE_TRAITS:
        raise ShapeError(f"CPU LIGHTNING_INDEXER '{node.name}': K type {k_t.type.name} has no to_float")
    q, k, w, m = srcs[:4]
    assert q is not None and k is not None and w is not None and m is not None
    n_s, n_t, n_h, d = q.shape
    n_kv = k_t.ne[2]
    _shape_check(node, k_t.ne == [d, 1, n_kv, n_s] and w_t.ne == [n_h, n_t, 1, n_s] and m_t.ne[:3] == [n_kv, n_t, 1]
                 and is_multiple(n_s, m_t.ne[3]) and dst.shape == (n_s, 1, n_t, n_kv),
                 "q, k, weights and mask do not fit")
    if dst.size == 0:
        return noop
    n_m = m_t.ne[3]
    k_type = k_t.type

    def run() -> None:
        kf = (k if k_type == GGMLType.F32 else to_f32(k_type, k))[:, :, 0, :d]
        for s in range(n_s):
            qk = np.matmul(q[s], kf[s].T)  # (T, H, KV) f32
            np.maximum(qk, F32.type(0.0), out=qk)
            score = np.zeros((n_t, n_kv), F32)
            for h in range(n_h):
                score += qk[:, h, :] * w[s, 0, :, h, None]
            np.add(score, m[s % n_m, 0], out=dst[s, 0], dtype=F32)

    return run


def _sum4(c: np.ndarray, axis: int, start: float) -> np.ndarray:
    """start + c[0] + c[1] + c[2] + c[3] along `axis`, one term after the other in f32 (as ggml's loops)."""
    total = np.full(np.delete(c.shape, axis), F32.type(start), F32)
    for i in range(c.shape[axis]):
        total += np.take(c, i, axis=axis)
    return total


@njit(nogil=True, cache=True, error_model="numpy")
def _sinkhorn_rounds(comb, eps, n_rounds):
    """n_rounds times, in place on comb (t, src, dst) f32: each src row times the f32 reciprocal of its sum over
    the dsts, then each dst column times that of its sum over the srcs, the sums from eps one term after the
    other (the arithmetic of `_sum4` and numpy's products, at a compiled loop's cost per round)."""
    n_t, n_src, n_dst = comb.shape
    one = np.float32(1.0)
    for _ in range(n_rounds):
        for t in range(n_t):
            for s in range(n_src):
                total = eps
                for d in range(n_dst):
                    total += comb[t, s, d]
                inv = one / total
                for d in range(n_dst):
                    comb[t, s, d] *= inv
            for d in range(n_dst):
                total = eps
                for s in range(n_src):
                    total += comb[t, s, d]
                inv = one / total
                for s in range(n_src):
                    comb[t, s, d] *= inv


def dsv4_hc_comb_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                        params: ComputeParams) -> Compute:
    """Per token: logits[src, dst] = mixes[8 + dst + 4*src]*scale[2] + base[...], a softmax over dst plus eps,
    the columns normalized (sum over src, from eps), then n_iter - 1 rounds of rows and columns."""
    mixes, scale, base = _f32_srcs(node, srcs, 3)
    p = Dsv4HcCombParams.of(node)
    hc = 4
    n_t = mixes.shape[2]
    _shape_check(node, mixes.shape[3] == (2 + hc) * hc and mixes.shape[:2] == (1, 1) and scale.shape[3] >= 3
                 and base.shape[3] == (2 + hc) * hc and 0 not in scale.shape[:3] + base.shape[:3]
                 and dst.shape == (1, n_t, hc, hc), "needs hc = 4 mixes")
    if p.n_iter <= 0:
        raise ArgumentError(f"CPU DSV4_HC_COMB '{node.name}': n_iter={p.n_iter} must be > 0")
    if dst.size == 0:
        return noop
    eps = F32.type(p.eps)

    def run() -> None:
        logits = mixes[0, 0, :, 2 * hc:].reshape(n_t, hc, hc) * scale[0, 0, 0, 2] + base[0, 0, 0, 2 * hc:].reshape(
            hc, hc)  # (t, src, dst)
        v = np.exp(logits - logits.max(axis=2, keepdims=True), dtype=F32)
        comb = v * (F32.type(1.0) / _sum4(v, 2, 0.0))[:, :, None] + eps
        comb *= (F32.type(1.0) / _sum4(comb, 1, p.eps))[:, None, :]  # columns: each dst over its srcs
        _sinkhorn_rounds(comb, eps, p.n_iter - 1)
        np.copyto(dst[0], comb)

    return run


def dsv4_hc_pre_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst[t, i] = scale * sum_h x[t, h, i] * w, w = weights[t, h] or sigmoid(gate[t, h, i]) (gated)."""
    x, w = _f32_srcs(node, srcs, 2)
    p = Dsv4HcPreParams.of(node)
    _, n_t, hc, n_e = x.shape
    _shape_check(node, x.shape[0] == 1 and dst.shape == (1, 1, n_t, n_e)
                 and w.shape == ((1, n_t, hc, n_e) if p.gated else (1, 1, n_t, hc)), "x, weights and dst do not fit")
    if dst.size == 0:
        return noop
    one = F32.type(1.0)

    def run() -> None:
        total = np.zeros((n_t, n_e), F32)
        for h in range(hc):
            wv = one / (one + np.exp(-w[0, :, h, :], dtype=F32)) if p.gated else w[0, 0, :, h, None]
            total += x[0, :, h, :] * wv
        np.multiply(total, F32.type(p.scale), out=dst[0, 0])

    return run


def dsv4_hc_post_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                        params: ComputeParams) -> Compute:
    """dst[t, d, i] = x[t, i] * post[t, d] + sum_s residual[t, s, i] * comb[t, s, d]; without comb
    + residual[t, d, i]."""
    x, res, post = _f32_srcs(node, srcs, 3)
    comb = srcs[3] if node.src[3] is not None else None
    if comb is not None:
        require_types(node, _F32_ONLY, node.src[3])
    _, n_t, hc, n_e = res.shape
    _shape_check(node, x.shape == (1, 1, n_t, n_e) and post.shape == (1, 1, n_t, hc) and dst.shape == res.shape
                 and (comb is None or comb.shape == (1, n_t, hc, hc)), "x, residual, post and comb do not fit")
    if dst.size == 0:
        return noop

    def run() -> None:
        total = x[0, 0, :, None, :] * post[0, 0, :, :, None]  # (t, dst, i)
        if comb is None:
            total += res[0]
        else:
            for s in range(hc):
                total += res[0, :, s, None, :] * comb[0, :, s, :, None]
        np.copyto(dst[0], total)

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.WIN_PART: win_part_kernel,
    GGMLOp.WIN_UNPART: win_unpart_kernel,
    GGMLOp.GET_REL_POS: get_rel_pos_kernel,
    GGMLOp.ADD_REL_POS: add_rel_pos_kernel,
    GGMLOp.LIGHTNING_INDEXER: lightning_indexer_kernel,
    GGMLOp.DSV4_HC_COMB: dsv4_hc_comb_kernel,
    GGMLOp.DSV4_HC_PRE: dsv4_hc_pre_kernel,
    GGMLOp.DSV4_HC_POST: dsv4_hc_post_kernel,
}

_DSV4 = (GGMLOp.DSV4_HC_COMB, GGMLOp.DSV4_HC_PRE, GGMLOp.DSV4_HC_POST)


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: ggml-cpu's types, contiguous sources."""
    if node.op not in KERNELS:
        return False
    if node.op in _DSV4:  # HC_PRE needs x and weights, the others three sources (HC_POST's comb optional)
        needed = 2 if node.op == GGMLOp.DSV4_HC_PRE else 3
        return node.type == GGMLType.F32 and all(s is not None for s in node.src[:needed]) \
            and all(s.type == GGMLType.F32 for s in node.src if s is not None)
    if node.op == GGMLOp.LIGHTNING_INDEXER:
        q, k, w, m = node.src[:4]
        return (node.type == GGMLType.F32 and q is not None and q.type == GGMLType.F32 and w is not None
                and w.type == GGMLType.F32 and m is not None and m.type == GGMLType.F16 and k is not None
                and k.type in CPU_TYPE_TRAITS)
    src0 = node.src[0]
    if src0 is None or not src0.is_contiguous():
        return False
    if node.op == GGMLOp.GET_REL_POS:
        return src0.type in _HALF and node.type == GGMLType.F16
    srcs = [s for s in node.src[:3] if s is not None]
    return node.type == GGMLType.F32 and all(s.type == GGMLType.F32 and s.is_contiguous() for s in srcs)
