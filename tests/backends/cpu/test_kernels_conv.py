"""CPU kernels of IM2COL, CONV_TRANSPOSE_1D and pooling against loop references written here from ggml's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import F16, F32, assert_close, compile_node, manual_node, new_ctx, permuted, run, stored, tensor

from pyggml.backends.cpu.kernels import conv
from pyggml.core.errors import GGMLError
from pyggml.core.tensor import GGMLOp
from pyggml.core.types import GGMLType

TYPES = [F32, F16]


def out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _im2col_node(ctx, kernel, x, dst_type, s0, s1, p0, p1, d0, d1, is_2d, ne):
    if hasattr(ctx, "im2col"):
        try:
            node = ctx.im2col(kernel, x, s0, s1, p0, p1, d0, d1, is_2d, dst_type)
        except TypeError:
            node = ctx.im2col(kernel, x, s0, s1, p0, p1, d0, d1, is_2d)
        if node.type == dst_type:
            return node
    return manual_node(ctx, GGMLOp.IM2COL, [kernel, x], [s0, s1, p0, p1, d0, d1, int(is_2d)], type=dst_type, ne=ne)


@pytest.mark.parametrize("src_type", TYPES)
@pytest.mark.parametrize("dst_type", TYPES)
@pytest.mark.parametrize("conf", [(1, 1, 0, 0, 1, 1), (2, 1, 1, 2, 1, 2), (1, 2, 2, 1, 2, 1)])
def test_im2col_2d(src_type: GGMLType, dst_type: GGMLType, conf: tuple, rng: np.random.Generator) -> None:
    s0, s1, p0, p1, d0, d1 = conf
    n, ic, ih, iw, kh, kw, oc = 2, 3, 7, 8, 3, 2, 4
    x = rng.standard_normal((n, ic, ih, iw)).astype(np.float32)
    oh, ow = out_size(ih, kh, s1, p1, d1), out_size(iw, kw, s0, p0, d0)
    ctx = new_ctx()
    kernel = ctx.new_tensor_4d(F16, kw, kh, ic, oc)
    node = _im2col_node(ctx, kernel, permuted(ctx, src_type, x), dst_type, s0, s1, p0, p1, d0, d1, True,
                        [ic * kh * kw, ow, oh, n])
    xs = stored(src_type, x)
    want = np.zeros((n, oh, ow, ic * kh * kw), np.float32)
    for b in range(n):
        for y in range(oh):
            for z in range(ow):
                for c in range(ic):
                    for ky in range(kh):
                        for kx in range(kw):
                            iy, ix = y * s1 + ky * d1 - p1, z * s0 + kx * d0 - p0
                            if 0 <= iy < ih and 0 <= ix < iw:
                                want[b, y, z, c * kh * kw + ky * kw + kx] = xs[b, c, iy, ix]
    np.testing.assert_array_equal(run(node), stored(dst_type, want))


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("conf", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_im2col_1d(type: GGMLType, conf: tuple, rng: np.random.Generator) -> None:
    s0, p0, d0 = conf
    n, ic, il, k, oc = 2, 3, 9, 3, 5
    x = rng.standard_normal((n, ic, il)).astype(np.float32)
    ol = out_size(il, k, s0, p0, d0)
    ctx = new_ctx()
    kernel = ctx.new_tensor_3d(F16, k, ic, oc)
    node = _im2col_node(ctx, kernel, tensor(ctx, type, x), F16, s0, 0, p0, 0, d0, 0, False, [ic * k, ol, n])
    xs = stored(type, x)
    want = np.zeros((1, n, ol, ic * k), np.float32)
    for b in range(n):
        for o in range(ol):
            for c in range(ic):
                for kx in range(k):
                    i = o * s0 + kx * d0 - p0
                    if 0 <= i < il:
                        want[0, b, o, c * k + kx] = xs[b, c, i]
    np.testing.assert_array_equal(run(node), stored(F16, want))


@pytest.mark.parametrize("ktype", TYPES)
@pytest.mark.parametrize("conf", [(1, 0, 1), (3, 0, 1), (2, 1, 2)])
def test_conv_transpose_1d(ktype: GGMLType, conf: tuple, rng: np.random.Generator) -> None:
    s0, p0, d0 = conf
    k, oc, ic, length = 3, 4, 5, 6
    w = rng.standard_normal((ic, oc, k)).astype(np.float32)  # ne [K, OC, IC]
    x = rng.standard_normal((ic, length)).astype(np.float32)  # ne [L, IC]
    ol = (length - 1) * s0 - 2 * p0 + d0 * (k - 1) + 1
    ctx = new_ctx()
    tw, tx = tensor(ctx, ktype, w), tensor(ctx, F32, x)
    if hasattr(ctx, "conv_transpose_1d") and p0 == 0 and d0 == 1:
        node = ctx.conv_transpose_1d(tw, tx, s0, p0, d0)
    else:
        node = manual_node(ctx, GGMLOp.CONV_TRANSPOSE_1D, [tw, tx], [s0, p0, d0], type=F32, ne=[ol, oc, 1, 1])
    ws = stored(ktype, w).astype(np.float64)
    want = np.zeros((oc, ol))
    for li in range(length):
        for kk in range(k):
            o = li * s0 + kk * d0 - p0
            if 0 <= o < ol:
                for c in range(oc):
                    want[c, o] += sum(x[ci, li] * ws[ci, c, kk] for ci in range(ic))
    assert_close(run(node), want, F32, atol=1e-5)


def pool_ref(x: np.ndarray, op: int, k: tuple, s: tuple, p: tuple, out: tuple, count_valid: bool = False
             ) -> np.ndarray:
    """ggml's pools on the last two axes: max ignoring padding; avg over the whole window (pool_2d) or over
    the input elements in it (`count_valid`: pool_1d)."""
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = k, s, p, out
    h, w = x.shape[-2:]
    res = np.zeros(x.shape[:-2] + (oh, ow))
    for idx in np.ndindex(*x.shape[:-2]):
        for y in range(oh):
            for z in range(ow):
                acc = 0.0 if op == 1 else -3.4028234663852886e38
                n = 0
                for ky in range(kh):
                    for kx in range(kw):
                        iy, ix = y * sh - ph + ky, z * sw - pw + kx
                        if 0 <= iy < h and 0 <= ix < w:
                            v = float(x[idx + (iy, ix)])
                            acc = acc + v if op == 1 else max(acc, v)
                            n += 1
                res[idx + (y, z)] = (acc / (n if count_valid else kh * kw) if n else 0.0) if op == 1 else acc
    return res


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("op", [0, 1])
@pytest.mark.parametrize("conf", [(2, 2, 0), (3, 3, 0), (3, 2, 1)])
def test_pool_1d(type: GGMLType, op: int, conf: tuple, rng: np.random.Generator) -> None:
    k0, s0, p0 = conf
    x = rng.standard_normal((4, 12)).astype(np.float32)
    ol = (12 + 2 * p0 - k0) // s0 + 1
    ctx = new_ctx()
    t = tensor(ctx, type, x)
    if hasattr(ctx, "pool_1d"):
        node = ctx.pool_1d(t, op, k0, s0, p0)
    else:
        node = manual_node(ctx, GGMLOp.POOL_1D, [t], [op, k0, s0, p0], type=F32, ne=[ol, 4])
    want = pool_ref(stored(type, x)[:, None, :], op, (1, k0), (1, s0), (0, p0), (1, ol), count_valid=True)[:, 0, :]
    assert_close(run(node), want, F32, atol=1e-6)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("op", [0, 1])
@pytest.mark.parametrize("conf", [(2, 2, 2, 2, 0, 0), (3, 2, 1, 2, 1, 0), (3, 3, 2, 2, 1, 1)])
def test_pool_2d(type: GGMLType, op: int, conf: tuple, rng: np.random.Generator) -> None:
    k0, k1, s0, s1, p0, p1 = conf
    x = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    ow, oh = (8 + 2 * p0 - k0) // s0 + 1, (7 + 2 * p1 - k1) // s1 + 1
    ctx = new_ctx()
    t = permuted(ctx, type, x)
    if hasattr(ctx, "pool_2d"):
        node = ctx.pool_2d(t, op, k0, k1, s0, s1, p0, p1)
    else:
        node = manual_node(ctx, GGMLOp.POOL_2D, [t], [op, k0, k1, s0, s1, p0, p1], type=F32, ne=[ow, oh, 3, 2])
    want = pool_ref(stored(type, x), op, (k1, k0), (s1, s0), (p1, p0), (oh, ow))
    assert_close(run(node), want, F32, atol=1e-6)


def test_windows_past_the_input_raise() -> None:
    ctx = new_ctx()
    t = tensor(ctx, F32, np.zeros((2, 6), np.float32))
    node = manual_node(ctx, GGMLOp.POOL_1D, [t], [0, 2, 2, 0], type=F32, ne=[4, 2])  # 4 windows of 2 need 8
    with pytest.raises(GGMLError, match="POOL_1D"):
        compile_node(node)
    assert conv.supports(node)
    q = ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2)
    assert not conv.supports(manual_node(ctx, GGMLOp.POOL_1D, [q], [0, 2, 2, 0], type=F32, ne=[16, 2]))
