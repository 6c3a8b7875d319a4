"""The numpy oracle's formulas (test_test_ops_cli.FORMULAS) of IM2COL_BACK, IM2COL_3D, COL2IM_1D, CONV_3D and
POOL_2D_BACK: ggml's definitions as loops in float64, sharing no code with the CPU kernels.

Each takes the node, src0's and src1's values (float64, numpy order: (ne3, ne2, ne1, ne0)) and dst's shape.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pyggml.core.tensor import GGMLOp, OpPool, Tensor
from pyggml.core.types import GGMLType

FLT_MAX = float(np.finfo(np.float32).max)


def _words(node: Tensor, n: int) -> list[int]:
    return [node.get_op_params_i32(i) for i in range(n)]


def _im2col_back(node: Tensor, g: np.ndarray, k: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[n, c, y, x] = sum of grad[n, oy, ox, (c, ky, kx)] over the (oy, ox, ky, kx) that IM2COL reads (y, x) at
    s0, s1, p0, p1, d0, d1, is_2d = _words(node, 7)
    kt = node.src[1]
    assert kt is not None
    kw, kh = kt.ne[0], kt.ne[1] if is_2d else 1
    if is_2d:
        n, ic, h, w = shape
        g4 = g
    else:
        n, ic, w, h = shape[1], shape[2], shape[3], 1
        g4 = g[0][:, None]
    oh, ow = g4.shape[1], g4.shape[2]
    g6 = g4.reshape(n, oh, ow, ic, kh, kw)
    out = np.zeros((n, ic, h, w))
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    y, x = oy * s1 + ky * d1 - p1, ox * s0 + kx * d0 - p0
                    if 0 <= y < h and 0 <= x < w:
                        out[:, :, y, x] += g6[:, oy, ox, :, ky, kx]
    return out.reshape(shape)


def _im2col_3d(node: Tensor, k: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[(n, od), oh, ow, (c, kd, kh, kw)] = x[(n, c), od s2 + kd d2 - p2, oh s1 + kh d1 - p1, ow s0 + kw d0 - p0]
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic = _words(node, 10)
    kt = node.src[0]
    assert kt is not None
    kw, kh, kd = kt.ne[0], kt.ne[1], kt.ne[2]
    n = x.shape[0] // ic  # ggml's N: whole images of ic channels
    x5 = x[: n * ic].reshape(n, ic, *x.shape[1:])
    od, oh, ow = shape[0] // max(n, 1), shape[1], shape[2]
    out = np.zeros((n, od, oh, ow, ic, kd, kh, kw))
    for i in range(kd):  # each kernel tap: the input positions of every output position at once
        for j in range(kh):
            for m in range(kw):
                z = np.arange(od) * s2 + i * d2 - p2
                y = np.arange(oh) * s1 + j * d1 - p1
                xx = np.arange(ow) * s0 + m * d0 - p0
                zi, yi, xi = (np.flatnonzero((t >= 0) & (t < size)) for t, size in zip((z, y, xx), x5.shape[2:],
                                                                                      strict=True))
                taps = x5[:, :, z[zi]][:, :, :, y[yi]][:, :, :, :, xx[xi]]  # (n, ic, od', oh', ow')
                tap = out[..., i, j, m]  # (n, od, oh, ow, ic), a view
                tap[:, zi[:, None, None], yi[None, :, None], xi[None, None, :]] = taps.transpose(0, 2, 3, 4, 1)
    return out.reshape(shape)


def _col2im_1d(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    # column t adds its K taps of channel c at positions t*s0 .. t*s0 + K - 1; then p0 cropped from the start
    s0, oc, p0 = _words(node, 3)
    cols = a[0, 0]  # (T_in, OC*K)
    t_in, k = cols.shape[0], cols.shape[1] // oc
    full = np.zeros((oc, max((t_in - 1) * s0 + k, p0 + shape[-1])))
    for t in range(t_in):
        full[:, t * s0: t * s0 + k] += cols[t].reshape(oc, k)
    return full[:, p0: p0 + shape[-1]].reshape(shape)


def _conv_3d(node: Tensor, k: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[(n, o), z, y, x] = sum k[(o, c), i, j, m] x[(n, c), z s2 + i d2 - p2, y s1 + j d1 - p1, x s0 + m d0 - p0]
    s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc = _words(node, 12)
    if node.src[0] is not None and node.src[0].type == GGMLType.F16:
        x = x.astype(np.float16).astype(np.float64)  # ggml rounds the input to the kernel's f16
    x5 = np.pad(x.reshape(n, c, *x.shape[1:]), ((0, 0), (0, 0), (p2, p2), (p1, p1), (p0, p0)))
    k5 = k.reshape(oc, c, *k.shape[1:])
    od, oh, ow = shape[1:]
    out = np.zeros((n, oc, od, oh, ow))
    for i in range(k5.shape[2]):
        for j in range(k5.shape[3]):
            for m in range(k5.shape[4]):
                win = x5[:, :, i * d2: i * d2 + (od - 1) * s2 + 1: s2, j * d1: j * d1 + (oh - 1) * s1 + 1: s1,
                         m * d0: m * d0 + (ow - 1) * s0 + 1: s0]
                out += np.einsum("ncdhw,oc->nodhw", win, k5[:, :, i, j, m])
    return out.reshape(shape)


def _pool_2d_back(node: Tensor, g: np.ndarray, af: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # grad[oy, ox] to the first largest element of its window in af (MAX), or grad / (k0 k1) to each element of
    # the window inside the plane (AVG)
    kind, k0, k1, s0, s1, p0, p1 = _words(node, 7)
    h, w = shape[2], shape[3]
    out = np.zeros(shape)
    for i3 in range(shape[0]):
        for i2 in range(shape[1]):
            for oy in range(g.shape[2]):
                for ox in range(g.shape[3]):
                    y0, x0 = oy * s1 - p1, ox * s0 - p0
                    ya, yb, xa, xb = max(y0, 0), min(y0 + k1, h), max(x0, 0), min(x0 + k0, w)
                    if ya >= yb or xa >= xb:
                        continue
                    grad = g[i3, i2, oy, ox]
                    if kind == OpPool.AVG:
                        out[i3, i2, ya:yb, xa:xb] += grad / (k0 * k1)
                        continue
                    win = af[i3, i2, ya:yb, xa:xb]
                    if win.max() > -FLT_MAX:
                        y, x = np.unravel_index(int(win.argmax()), win.shape)
                        out[i3, i2, ya + y, xa + x] += grad
    return out


Formula = Callable[[Tensor, np.ndarray, np.ndarray | None, tuple[int, ...]], np.ndarray]
CONV_BACK_FORMULAS: dict[GGMLOp, Formula] = {
    GGMLOp.IM2COL_BACK: _im2col_back, GGMLOp.IM2COL_3D: _im2col_3d, GGMLOp.COL2IM_1D: _col2im_1d,
    GGMLOp.CONV_3D: _conv_3d, GGMLOp.POOL_2D_BACK: _pool_2d_back,
}
