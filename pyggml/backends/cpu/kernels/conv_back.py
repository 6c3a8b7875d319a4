"""CPU kernels of IM2COL_BACK, IM2COL_3D, COL2IM_1D, CONV_3D and POOL_2D_BACK with ggml-cpu's types (see `supports`).
The scatters add one tap at a time in float32, in the order ggml's loops add each element's terms: the same bits."""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    bf16_to_f32,
    check_temporary,
    f32_to_bf16,
    noop,
    require_types,
    scratch,
    split_axis,
)
from pyggml.backends.cpu.kernels.conv import _padded, _windows, check_conv_shape
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import Col2im1dParams, Conv3dParams, Im2col3dParams, Im2colParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, OpPool, Tensor
from pyggml.core.types import GGMLType

_F32_ONLY = (GGMLType.F32,)
_COL2IM_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
FLT_MAX = float(np.finfo(np.float32).max)


def _split_last(a: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    for i in range(len(sizes) - 1):
        axis = a.ndim - 1
        a = split_axis(a, axis, sizes[i], int(np.prod(sizes[i + 1:], dtype=np.int64)))
    return a


def im2col_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst[n, c, ih, iw] = sum of grad[n, oh, ow, (c, kh, kw)] over the taps whose (oh, ow) reads (ih, iw) in
    IM2COL; src[1] the kernel (its shape only)."""
    g_t, k_t = node.src[0], node.src[1]
    g = srcs[0]
    assert g_t is not None and k_t is not None and g is not None
    require_types(node, _F32_ONLY, node, g_t)
    require_types(node, FLOAT_TYPES, k_t)
    ip = Im2colParams.of(node)
    if ip.is_2D:
        kh, kw = k_t.ne[1], k_t.ne[0]
        d4, g4 = dst, g  # (N, IC, H, W), (N, OH, OW, IC*KH*KW)
    else:
        if g.shape[0] != 1 or dst.shape[0] != 1:
            raise ShapeError(f"CPU IM2COL_BACK '{node.name}': a 1-D gradient {g_t.ne} and dst {node.ne} have "
                             "ne[3] 1")
        kh, kw = 1, k_t.ne[0]
        d4, g4 = dst[0][:, :, None, :], g[0][:, None, :, :]
    n, ic, h, w = d4.shape
    oh, ow = g4.shape[1], g4.shape[2]
    if g4.shape != (n, oh, ow, ic * kh * kw):
        raise ShapeError(f"CPU IM2COL_BACK '{node.name}': gradient {g_t.ne}, kernel {k_t.ne} and dst {node.ne} "
                         "do not fit")
    # 1-D: 2-D with one row (H = KH = OH = 1, s1 and d1 unused), so p1 must be 0
    check_conv_shape(node, (h, w), (kh, kw), (ip.s1, ip.s0) if ip.is_2D else (1, ip.s0), (ip.p1, ip.p0),
                     (ip.d1, ip.d0) if ip.is_2D else (1, ip.d0), (oh, ow))
    if dst.size == 0:
        return noop
    s_hw, p_hw, d_hw = (ip.s1, ip.s0), (ip.p1, ip.p0), (ip.d1, ip.d0)
    acc_shape = (n, ic, h + 2 * p_hw[0], w + 2 * p_hw[1])
    check_temporary(node, "the padded sums", acc_shape)
    (acc,) = scratch(params, acc_shape)
    win = _windows(acc, (oh, ow), (kh, kw), s_hw, d_hw, node, writeable=True)  # (N, IC, OH, OW, KH, KW)
    g6 = _split_last(g4, (ic, kh, kw)).transpose(0, 3, 1, 2, 4, 5)  # (N, IC, OH, OW, KH, KW)
    inner = acc[:, :, p_hw[0]: p_hw[0] + h, p_hw[1]: p_hw[1] + w]
    # ggml adds an element's taps kh-major, kw-minor: the same order here
    taps = [(i, j) for i in range(kh) for j in range(kw)]

    def run() -> None:
        acc.fill(0.0)
        for i, j in taps:
            np.add(win[..., i, j], g6[..., i, j], out=win[..., i, j])
        np.copyto(d4, inner)

    return run


def im2col_3d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[(n, od), oh, ow, (c, kd, kh, kw)] = input[(n, c), od*s2 + kd*d2 - p2, oh*s1 + kh*d1 - p1,
    ow*s0 + kw*d0 - p0] (zero outside); src[0] the kernel (its shape only)."""
    k_t, x_t = node.src[0], node.src[1]
    x = srcs[1]
    assert k_t is not None and x_t is not None and x is not None
    require_types(node, _F32_ONLY, x_t)
    require_types(node, FLOAT_TYPES, node)
    ip = Im2col3dParams.of(node)
    s, p, d = (ip.s2, ip.s1, ip.s0), (ip.p2, ip.p1, ip.p0), (ip.d2, ip.d1, ip.d0)
    ic = ip.IC
    if ic < 1:
        raise ArgumentError(f"CPU IM2COL_3D '{node.name}': IC={ic} must be >= 1")
    n = x_t.ne[3] // ic
    kd, kh, kw = k_t.ne[2], k_t.ne[1], k_t.ne[0]
    if dst.size == 0:
        return noop
    if n == 0:
        raise ShapeError(f"CPU IM2COL_3D '{node.name}': an input {x_t.ne} of no image of IC={ic} channels for "
                         f"dst {node.ne}")
    od, oh, ow = node.ne[3] // n, node.ne[2], node.ne[1]
    if node.ne[0] != ic * kd * kh * kw or node.ne[3] != od * n:
        raise ShapeError(f"CPU IM2COL_3D '{node.name}': kernel {k_t.ne}, input {x_t.ne} (IC={ic}) and dst "
                         f"{node.ne} do not fit")
    check_conv_shape(node, x.shape[1:], (kd, kh, kw), s, p, d, (od, oh, ow))
    x5 = split_axis(x[:n * ic], 0, n, ic)
    padded, refresh = _padded(x5, p, 0.0, False, node)
    win = _windows(padded, (od, oh, ow), (kd, kh, kw), s, d, node)  # (N, IC, OD, OH, OW, KD, KH, KW)
    src = win.transpose(0, 2, 3, 4, 1, 5, 6, 7)
    d8 = _split_last(split_axis(dst, 0, n, od), (ic, kd, kh, kw))  # (N, OD, OH, OW, IC, KD, KH, KW)

    def run() -> None:
        if refresh is not None:
            refresh()
        np.copyto(d8, src)

    return run


def col2im_1d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[c, t] = sum over t_in, k with t_in*s0 + k = t + p0 of cols[t_in, c*K + k] (F32 sums); src[0] the
    columns [K*OC, T_in], dst [T_out, OC] of the same type; op_params Col2im1dParams."""
    a_t = node.src[0]
    a = srcs[0]
    assert a_t is not None and a is not None
    require_types(node, _COL2IM_TYPES, node, a_t)
    if a_t.type != node.type:
        raise ShapeError(f"CPU COL2IM_1D '{node.name}': src {a_t.type.name} and dst {node.type.name} differ")
    cp = Col2im1dParams.of(node)
    s0, oc, p0 = cp.s0, cp.oc, cp.p0
    if s0 < 1 or oc < 1 or p0 < 0:
        raise ArgumentError(f"CPU COL2IM_1D '{node.name}': s0={s0} and oc={oc} must be >= 1, p0={p0} >= 0")
    k_oc, t_in = a_t.ne[0], a_t.ne[1]
    k, t_out = k_oc // oc, node.ne[0]
    if k * oc != k_oc or a_t.ne[2:] != [1, 1] or node.ne[1:] != [oc, 1, 1]:
        raise ShapeError(f"CPU COL2IM_1D '{node.name}': columns {a_t.ne}, dst {node.ne} and oc={oc} do not fit")
    if dst.size == 0:
        return noop
    full = max((t_in - 1) * s0 + k, p0 + t_out)
    check_temporary(node, "the sums", (oc, full))
    cols32, acc = scratch(params, (t_in, k_oc), (oc, full))
    cols = cols32.reshape(t_in, oc, k).transpose(1, 2, 0)  # (OC, K, T_in)
    out = acc[:, p0: p0 + t_out]
    src, d2 = a[0, 0], dst[0, 0]
    span = (t_in - 1) * s0 + 1
    # descending k is ascending t_in for each output: the order ggml's gather loop sums in (no columns: no terms)
    taps = [(j, slice(j, j + span, s0)) for j in reversed(range(k))] if t_in > 0 else []

    def run() -> None:
        if a_t.type == GGMLType.BF16:
            bf16_to_f32(src, cols32)
        else:
            np.copyto(cols32, src)
        acc.fill(0.0)
        for j, sl in taps:
            np.add(acc[:, sl], cols[:, j], out=acc[:, sl])
        if node.type == GGMLType.BF16:
            f32_to_bf16(out, d2)
        else:
            np.copyto(d2, out)

    return run


def conv_3d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[(n, o), z, y, x] = sum over c, kz, ky, kx of kernel * the input window (zero outside); with an F16
    kernel the input rounded to f16 first, as ggml's patches are."""
    k_t, x_t = node.src[0], node.src[1]
    k, x = srcs[0], srcs[1]
    assert k_t is not None and x_t is not None and k is not None and x is not None
    require_types(node, FLOAT_TYPES, k_t)
    require_types(node, _F32_ONLY, x_t, node)
    cp = Conv3dParams.of(node)
    s, p, d = (cp.s2, cp.s1, cp.s0), (cp.p2, cp.p1, cp.p0), (cp.d2, cp.d1, cp.d0)
    c, n, oc = cp.c, cp.n, cp.oc
    if min(c, n, oc) < 1 or k_t.ne[3] != c * oc or x_t.ne[3] != c * n or node.ne[3] != oc * n:
        raise ShapeError(f"CPU CONV_3D '{node.name}': kernel {k_t.ne}, input {x_t.ne}, dst {node.ne} and "
                         f"c={c}, n={n}, oc={oc} do not fit")
    if dst.size == 0:
        return noop
    f16 = k_t.type == GGMLType.F16
    kd, kh, kw = k_t.ne[2], k_t.ne[1], k_t.ne[0]
    check_conv_shape(node, x.shape[1:], (kd, kh, kw), s, p, d, dst.shape[1:])
    padded, refresh = _padded(split_axis(x, 0, n, c), p, 0.0, f16, node)  # (N, C, D, H, W)
    win = _windows(padded, tuple(dst.shape[1:]), (kd, kh, kw), s, d, node)  # (N, C, OD, OH, OW, KD, KH, KW)
    k5 = split_axis(k, 0, oc, c)
    d5 = split_axis(dst, 0, n, oc).transpose(0, 2, 3, 4, 1)  # (N, OD, OH, OW, OC)

    def run() -> None:
        if refresh is not None:
            refresh()
        if f16:
            np.copyto(padded, padded.astype(np.float16))
        np.copyto(d5, np.tensordot(win, k5.astype(F32), axes=((1, 5, 6, 7), (1, 2, 3, 4))))

    return run


def pool_2d_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                        params: ComputeParams) -> Compute:
    """POOL_2D's input gradient: grad to the first largest element of its window (MAX; nothing above -FLT_MAX:
    nothing) or grad / (k0*k1) to each element inside the plane (AVG); src[1] POOL_2D's input."""
    g_t, f_t = node.src[0], node.src[1]
    g, f = srcs[0], srcs[1]
    assert g_t is not None and f_t is not None and g is not None and f is not None
    require_types(node, _F32_ONLY, node, g_t, f_t)
    pp = Pool2dParams.of(node)
    k, s, p = (pp.k1, pp.k0), (pp.s1, pp.s0), (pp.p1, pp.p0)
    if min(k) < 1 or min(s) < 1 or min(p) < 0:
        raise ArgumentError(f"CPU POOL_2D_BACK '{node.name}': kernel {pp.k0}x{pp.k1} and stride {pp.s0}x{pp.s1} "
                            f"must be >= 1, padding {pp.p0}x{pp.p1} >= 0")
    if f.shape != dst.shape or g.shape[:2] != dst.shape[:2]:
        raise ShapeError(f"CPU POOL_2D_BACK '{node.name}': gradient {g_t.ne}, af {f_t.ne} and dst {node.ne} "
                         "do not fit")
    if dst.size == 0:
        return noop
    (oh, ow), (h, w) = g.shape[2:], dst.shape[2:]
    if oh == 0 or ow == 0:
        def zero() -> None:
            dst.fill(0.0)

        return zero
    # buffer coordinates: plane position + padding; large enough for every window of the gradient
    bh, bw = max(h + p[0], (oh - 1) * s[0] + k[0]), max(w + p[1], (ow - 1) * s[1] + k[1])
    check_temporary(node, "the padded sums and values", dst.shape[:2] + (2 * bh, bw))
    acc, vals = scratch(params, dst.shape[:2] + (bh, bw), dst.shape[:2] + (bh, bw))
    region = (..., slice(p[0], p[0] + h), slice(p[1], p[1] + w))
    win = _windows(acc, (oh, ow), k, s, (1, 1), node, writeable=True)  # (.., OH, OW, K1, K0)
    # taps from the last: an element then gets its windows' terms by ascending (oy, ox), ggml's order
    taps = [(i, j) for i in reversed(range(k[0])) for j in reversed(range(k[1]))]
    if pp.op == OpPool.AVG:
        scale = np.float32(k[0] * k[1])

        def run_avg() -> None:
            acc.fill(0.0)
            share = g / scale
            for i, j in taps:
                np.add(win[..., i, j], share, out=win[..., i, j])
            np.copyto(dst, acc[region])

        return run_avg
    vwin = _windows(vals, (oh, ow), k, s, (1, 1), node)

    def run_max() -> None:
        vals.fill(-np.inf)  # outside the plane: never a window's max
        np.copyto(vals[region], f)
        flat = vwin.reshape(vwin.shape[:4] + (k[0] * k[1],))
        first = flat.argmax(axis=-1)  # the first largest, ky-major, as ggml's strict `>` keeps
        found = np.take_along_axis(flat, first[..., None], axis=-1)[..., 0] > -FLT_MAX
        acc.fill(0.0)
        for i, j in taps:
            np.add(win[..., i, j], np.where(found & (first == i * k[1] + j), g, np.float32(0.0)),
                   out=win[..., i, j])
        np.copyto(dst, acc[region])

    return run_max


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.IM2COL_BACK: im2col_back_kernel,
    GGMLOp.IM2COL_3D: im2col_3d_kernel,
    GGMLOp.COL2IM_1D: col2im_1d_kernel,
    GGMLOp.CONV_3D: conv_3d_kernel,
    GGMLOp.POOL_2D_BACK: pool_2d_back_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: the types ggml-cpu takes (see the module's docstring)."""
    a, b = node.src[0], node.src[1]

    def types(t: Tensor | None, allowed: tuple[GGMLType, ...]) -> bool:
        return t is not None and t.type in allowed

    if node.op == GGMLOp.IM2COL_BACK:
        return types(a, _F32_ONLY) and types(b, FLOAT_TYPES) and node.type == GGMLType.F32
    if node.op == GGMLOp.IM2COL_3D:
        return types(b, _F32_ONLY) and node.type in FLOAT_TYPES
    if node.op == GGMLOp.COL2IM_1D:
        return types(a, _COL2IM_TYPES) and a is not None and node.type == a.type
    if node.op == GGMLOp.CONV_3D:
        return types(a, FLOAT_TYPES) and types(b, _F32_ONLY) and node.type == GGMLType.F32
    if node.op == GGMLOp.POOL_2D_BACK:
        return types(a, _F32_ONLY) and types(b, _F32_ONLY) and node.type == GGMLType.F32
    return False
