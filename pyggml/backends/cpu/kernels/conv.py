"""CPU kernels: convolution helpers and pooling.

IM2COL (ggml's conv_1d/conv_2d are IM2COL + MUL_MAT), CONV_TRANSPOSE_1D,
POOL_1D and POOL_2D, parameters from `pyggml.core.ops.params`. Sliding windows are strided views of a zero-padded f32
copy of the input (kept per node, so the padding stays zero between runs);
one numpy copy or reduction then fills dst.
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    check_temporary,
    noop,
    require_types,
    scratch,
    split_axis,
    strided_view,
)
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.conv import calc_conv_output_size
from pyggml.core.ops.params import ConvTranspose1dParams, Im2colParams, Pool1dParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, OpPool, Tensor

FLT_MAX = float(np.finfo(np.float32).max)


def _padded(x: np.ndarray, pads: tuple[int, ...], fill: float, force_copy: bool,
            node: Tensor, after: tuple[int, ...] | None = None) -> tuple[np.ndarray, Compute | None]:
    """x (..., *spatial) with pads[i] elements of `fill` before its i-th trailing (spatial) axis and after[i]
    (default pads[i]) after it.

    Returns the array to read windows from and the function that refreshes it
    from x each run (None when x itself can be read: no padding, f32).
    The copy's size is checked first (`check_temporary`): the paddings are the node's op_params.
    """
    after = pads if after is None else after
    if not any(pads) and not any(after) and x.dtype == F32 and not force_copy:
        return x, None
    n = len(pads)
    spatial = x.shape[x.ndim - n:]
    shape = x.shape[:x.ndim - n] + tuple(m + q + r for m, q, r in zip(spatial, pads, after, strict=True))
    check_temporary(node, f"the input padded by {list(pads)}", shape)
    p = np.full(shape, fill, F32)
    inner = p[(...,) + tuple(slice(q, q + m) for m, q in zip(spatial, pads, strict=True))]

    def refresh() -> None:
        np.copyto(inner, x)

    return p, refresh


def _dims(v: tuple[int, ...]) -> str:
    """Sizes of spatial axes (outermost first) in ggml's order, width first: 8 x 6."""
    return " x ".join(str(x) for x in reversed(v))


def _ggml_order(v: tuple[int, ...]) -> str:
    return f"({', '.join(str(x) for x in reversed(v))})"


def check_conv_shape(node: Tensor, ins: tuple[int, ...], ks: tuple[int, ...], s: tuple[int, ...],
                     p: tuple[int, ...], d: tuple[int, ...], outs: tuple[int, ...]) -> None:
    """ggml's shape rule of a convolution's windows (its op_params against its tensors' sizes, spatial axes
    outermost first): ArgumentError unless the strides and dilations are >= 1 and the paddings >= 0, ShapeError
    unless each output size is what ggml_calc_conv_output_size gives for its input and kernel sizes."""
    if min(s + d) < 1 or min(p) < 0:
        raise ArgumentError(f"CPU {node.op.name} '{node.name}': strides {_ggml_order(s)} and dilations "
                            f"{_ggml_order(d)} must be >= 1, paddings {_ggml_order(p)} >= 0")
    want = tuple(calc_conv_output_size(n, k, si, pi, di) for n, k, si, pi, di in zip(ins, ks, s, p, d, strict=True))
    if want != tuple(outs):
        raise ShapeError(f"CPU {node.op.name} '{node.name}': the output is {_dims(tuple(outs))}, but an input "
                         f"{_dims(ins)} with kernel {_dims(ks)}, strides {_ggml_order(s)}, paddings {_ggml_order(p)}, "
                         f"dilations {_ggml_order(d)} gives {_dims(want)}")


def _windows(p: np.ndarray, out: tuple[int, ...], k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...],
             node: Tensor, writeable: bool = False) -> np.ndarray:
    """Windows of p (..., *spatial) as (..., *out, *k), the spatial axes outermost first ((H, W) or (D, H, W)).

    Element [o..., k...] is p[o_i*s_i + k_i*d_i for each axis]; a strided view, no copy. `writeable` only
    for scatters that write one kernel tap at a time (the windows of one tap do not overlap).
    """
    n = len(out)
    spatial = p.shape[p.ndim - n:]
    last = [(o - 1) * si + (kk - 1) * di for o, kk, si, di in zip(out, k, s, d, strict=True)]
    if min(*out, *k) > 0 and any(x >= m or x < 0 for x, m in zip(last, spatial, strict=True)):
        raise ShapeError(f"CPU {node.op.name} '{node.name}': output {_dims(out)} with kernel {_dims(k)}, stride "
                         f"{_dims(s)}, dilation {_dims(d)} reads past the (padded) input {_dims(spatial)}")
    st = p.strides[p.ndim - n:]
    shape = p.shape[:p.ndim - n] + tuple(out) + tuple(k)
    strides = (p.strides[:p.ndim - n] + tuple(si * t for si, t in zip(s, st, strict=True))
               + tuple(di * t for di, t in zip(d, st, strict=True)))
    return strided_view(p, shape, strides, f"CPU {node.op.name} '{node.name}': windows", writeable=writeable)


def im2col_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Unfold the input's patches into rows: dst[(c, kh, kw), ow, oh, n] = padded input[n, c, ih, iw].

    src[0] is the kernel (only its shape is used: [KW, KH, IC, OC], or [K, IC, OC]
    in 1-D), src[1] the input [IW, IH, IC, N] (1-D: [IL, IC, N]); op_params
    [s0, s1, p0, p1, d0, d1, is_2D]; dst [IC*KH*KW, OW, OH, N] (1-D: [IC*K, OL, N]).
    Positions outside the input read zero.
    """
    k_t, x_t = node.src[0], node.src[1]
    x = srcs[1]
    assert k_t is not None and x_t is not None and x is not None
    require_types(node, FLOAT_TYPES, node, x_t)
    ip = Im2colParams.of(node)
    s0, s1, p0, p1, d0, d1, is_2d = ip.s0, ip.s1, ip.p0, ip.p1, ip.d0, ip.d1, ip.is_2D
    if is_2d:
        n, ic = x.shape[0], x.shape[1]
        kh, kw = k_t.ne[1], k_t.ne[0]
        oh, ow = node.ne[2], node.ne[1]
        x4 = x
        d6 = dst  # (N, OH, OW, IC*KH*KW)
    else:
        if x.shape[0] != 1 or dst.shape[0] != 1:
            raise ShapeError(f"CPU IM2COL '{node.name}': a 1-D input {x_t.ne} and dst {node.ne} have ne[3] 1")
        n, ic = x.shape[1], x.shape[2]
        kh, kw, oh, ow = 1, k_t.ne[0], 1, node.ne[1]
        x4 = x[0][:, :, None, :]
        d6 = dst[0][:, None, :, :]
    if k_t.ne[2 if is_2d else 1] != ic or dst.shape[-1] != ic * kh * kw or d6.shape[:3] != (n, oh, ow):
        raise ShapeError(f"CPU IM2COL '{node.name}': kernel {k_t.ne}, input {x_t.ne} and dst {node.ne} do not fit")
    # 1-D: 2-D with one row (IH = KH = OH = 1, s1 and d1 unused), so p1 must be 0
    check_conv_shape(node, x4.shape[2:], (kh, kw), (s1, s0) if is_2d else (1, s0), (p1, p0),
                     (d1, d0) if is_2d else (1, d0), (oh, ow))
    if dst.size == 0:
        return noop
    d6 = split_axis(split_axis(d6, 3, ic, kh * kw), 4, kh, kw).transpose(0, 3, 4, 1, 2, 5)  # (N, IC, KH, OH, OW, KW)
    p, refresh = _padded(x4, (p1, p0), 0.0, False, node)
    win = _windows(p, (oh, ow), (kh, kw), (s1, s0), (d1, d0), node)  # (N, IC, OH, OW, KH, KW)
    src = win.transpose(0, 1, 4, 2, 3, 5)  # (N, IC, KH, OH, OW, KW)

    def run() -> None:
        if refresh is not None:
            refresh()
        np.copyto(d6, src)

    return run


def conv_transpose_1d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                             params: ComputeParams) -> Compute:
    """dst[o, oc] = sum over l, k, ic with o = l*s0 + k*d0 - p0 of input[l, ic] * kernel[k, oc, ic].

    src[0] kernel [K, OC, IC], src[1] input [L, IC], op_params [s0, p0, d0],
    dst [OL, OC] with OL = (L - 1)*s0 - 2*p0 + d0*(K - 1) + 1 in ggml.
    """
    k_t, x_t = node.src[0], node.src[1]
    w, x = srcs[0], srcs[1]
    assert k_t is not None and x_t is not None and w is not None and x is not None
    require_types(node, FLOAT_TYPES, node, k_t, x_t)
    cp = ConvTranspose1dParams.of(node)
    s0, p0, d0 = cp.s0, cp.p0, cp.d0
    if s0 < 1 or d0 < 1 or p0 < 0:
        raise ArgumentError(f"CPU CONV_TRANSPOSE_1D '{node.name}': s0={s0}, d0={d0} must be >= 1, p0={p0} >= 0")
    k_len, oc, ic = k_t.ne[0], k_t.ne[1], k_t.ne[2]
    length = x_t.ne[0]
    ol = node.ne[0]
    if x_t.ne[1] != ic or k_t.ne[3] != 1 or x_t.ne[2] != 1 or x_t.ne[3] != 1 or node.ne[1:] != [oc, 1, 1]:
        raise ShapeError(f"CPU CONV_TRANSPOSE_1D '{node.name}': kernel {k_t.ne}, input {x_t.ne}, dst {node.ne} "
                         "do not fit ([K, OC, IC], [L, IC], [OL, OC])")
    if dst.size == 0:
        return noop
    w3 = w[0]  # (IC, OC, K)
    x2 = x[0, 0]  # (IC, L)
    (acc,) = scratch(params, (oc, ol))
    # for each kernel tap k, the input positions l whose output o = l*s0 + k*d0 - p0 falls inside [0, OL)
    taps = []
    for k in range(k_len):
        start = k * d0 - p0
        lo = 0
        while lo < length and start + lo * s0 < 0:
            lo += 1
        hi = length
        while hi > lo and start + (hi - 1) * s0 >= ol:
            hi -= 1
        if hi > lo:
            o = start + lo * s0
            taps.append((k, slice(o, o + (hi - lo - 1) * s0 + 1, s0), slice(lo, hi)))
    out = dst[0, 0]

    def run() -> None:
        t = np.tensordot(w3.astype(F32, copy=False), x2.astype(F32, copy=False), axes=(0, 0))  # (OC, K, L)
        acc.fill(0)
        for k, o_sl, l_sl in taps:
            acc[:, o_sl] += t[:, k, l_sl]
        np.copyto(out, acc)

    return run


def _pool(node: Tensor, dst: np.ndarray, x: np.ndarray, op: OpPool, k_hw: tuple[int, int], s_hw: tuple[int, int],
          p_hw: tuple[int, int], params: ComputeParams, count_valid: bool) -> Compute:
    """Max or average over windows of x (..., H, W) into dst (..., OH, OW).

    As ggml: the max ignores padding; the average divides by the whole window (POOL_2D: padding counts as
    zeros) or, with `count_valid` (POOL_1D), by the number of input elements in the window.
    """
    if min(k_hw) < 1 or min(s_hw) < 1 or min(p_hw) < 0:
        raise ArgumentError(f"CPU {node.op.name} '{node.name}': kernel {k_hw} and stride {s_hw} must be >= 1, "
                            f"padding {p_hw} >= 0")
    if dst.size == 0:
        return noop
    fill = 0.0 if op == OpPool.AVG else -FLT_MAX
    p, refresh = _padded(x, p_hw, fill, False, node)
    win = _windows(p, dst.shape[-2:], k_hw, s_hw, (1, 1), node)
    divisor: np.float32 | np.ndarray = np.float32(k_hw[0] * k_hw[1])
    if count_valid:
        def valid(n_out: int, n_in: int, k: int, s: int, pad: int) -> np.ndarray:
            start = np.arange(n_out) * s - pad
            return np.clip(start + k, 0, n_in) - np.clip(start, 0, n_in)

        counts = np.outer(valid(dst.shape[-2], x.shape[-2], k_hw[0], s_hw[0], p_hw[0]),
                          valid(dst.shape[-1], x.shape[-1], k_hw[1], s_hw[1], p_hw[1])).astype(F32)
        divisor = np.where(counts > 0, counts, np.float32(np.inf)).astype(F32)  # no element: 0, as ggml
    if dst.dtype == F32:
        acc = dst
    else:
        (acc,) = scratch(params, dst.shape)

    def run() -> None:
        if refresh is not None:
            refresh()
        if op == OpPool.AVG:
            np.add.reduce(win, axis=(-2, -1), dtype=F32, out=acc)
            np.divide(acc, divisor, out=dst)
        else:
            np.maximum.reduce(win, axis=(-2, -1), out=acc)
            if acc is not dst:
                np.copyto(dst, acc)

    return run


def pool_1d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Pool each row (Pool1dParams); dst [OL, ne1, ...], OL = (ne0 + 2*p0 - k0)/s0 + 1; the average is over the
    window's input elements."""
    x_t = node.src[0]
    x = srcs[0]
    assert x_t is not None and x is not None
    require_types(node, FLOAT_TYPES, node, x_t)
    pp = Pool1dParams.of(node)
    if dst.shape[:3] != x.shape[:3]:
        raise ShapeError(f"CPU POOL_1D '{node.name}': src ne {x_t.ne} and dst ne {node.ne} differ beyond dim 0")
    return _pool(node, dst[..., None, :], x[..., None, :], pp.op, (1, pp.k0), (1, pp.s0), (0, pp.p0), params,
                 count_valid=True)


def pool_2d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Pool each plane (Pool2dParams); dst [OW, OH, ne2, ne3]; the average is over the whole window."""
    x_t = node.src[0]
    x = srcs[0]
    assert x_t is not None and x is not None
    require_types(node, FLOAT_TYPES, node, x_t)
    pp = Pool2dParams.of(node)
    if dst.shape[:2] != x.shape[:2]:
        raise ShapeError(f"CPU POOL_2D '{node.name}': src ne {x_t.ne} and dst ne {node.ne} differ in dims 2, 3")
    return _pool(node, dst, x, pp.op, (pp.k1, pp.k0), (pp.s1, pp.s0), (pp.p1, pp.p0), params, count_valid=False)


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.IM2COL: im2col_kernel,
    GGMLOp.CONV_TRANSPOSE_1D: conv_transpose_1d_kernel,
    GGMLOp.POOL_1D: pool_1d_kernel,
    GGMLOp.POOL_2D: pool_2d_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: F32/F16 data (IM2COL's kernel tensor may be any type)."""
    if node.op not in KERNELS:
        return False
    if node.op == GGMLOp.IM2COL:
        return all_float(node, node.src[1])
    return all_float(node, node.src[0], node.src[1])
