"""IM2COL_BACK, IM2COL_3D (and conv_3d), COL2IM_1D, CONV_3D and POOL_2D_BACK: the builders' shapes, op_params
and errors; the CPU kernels against numpy references written here in float64 (and, where ggml's float32 sums
are claimed to the bit, in its loop order); what the CPU refuses; and every op checker case against real ggml
(skipped only without a C compiler)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import compile_node, manual_node, new_ctx, run, stored, tensor

from pyggml.backends.cpu import cpu_init, graph_compute_with_ctx
from pyggml.capi import core as capi
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import Col2im1dParams, Conv3dParams, Im2col3dParams, Im2colParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, OpPool, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend
from pyggml.testing import op_check
from pyggml.testing.cases_conv_back import conv_back_cases

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
rng = np.random.default_rng(5)


def rand(*shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)


def out_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def compute(ctx: Context, out: Tensor) -> np.ndarray:
    g = ctx.new_graph()
    g.build_forward_expand(out)
    graph_compute_with_ctx(ctx, g, 1)
    return np.array(out.numpy(), dtype=np.float64)


# --- builders ---


def test_builders_shapes_and_op_params() -> None:
    ctx = new_ctx()
    k2, g2 = ctx.new_tensor_4d(F16, 3, 2, 4, 5), ctx.new_tensor_4d(F32, 24, 5, 4, 2)
    back = ctx.im2col_back(g2, k2, [9, 7, 4, 2], 2, 2, 1, 1, 1, 2, True)  # OW = 5, OH = 4
    assert back.op == GGMLOp.IM2COL_BACK and back.type == F32 and back.ne == [9, 7, 4, 2]
    assert back.src[:2] == [g2, k2]
    assert Im2colParams.of(back) == Im2colParams(s0=2, s1=2, p0=1, p1=1, d0=1, d1=2, is_2D=True)
    g1 = ctx.new_tensor_3d(F32, 6, 9, 2)
    assert ctx.im2col_back(g1, ctx.new_tensor_3d(F32, 3, 2, 4), [11, 2, 2], 1, 0, 0, 0, 1, 0, False).ne == [11, 2, 2, 1]

    k3, x3 = ctx.new_tensor_4d(F32, 3, 3, 2, 6), ctx.new_tensor_4d(F32, 10, 9, 8, 6)  # IC 3: OC 2, N 2
    cols = ctx.im2col_3d(k3, x3, 3, 1, 2, 1, 1, 0, 0, 1, 1, 2, F32)
    assert cols.op == GGMLOp.IM2COL_3D and cols.ne == [54, 10, 4, 6 * 2] and cols.type == F32
    assert list(cols.op_params[:10]) == [1, 2, 1, 1, 0, 0, 1, 1, 2, 3]
    assert Im2col3dParams.of(cols).IC == 3 and ctx.im2col_3d(k3, x3, 3, *[1] * 3, *[0] * 3, *[1] * 3).type == F16

    conv = ctx.conv_3d_direct(k3, x3, 1, 2, 1, 1, 0, 0, 1, 1, 2, 3, 2, 2)
    assert conv.op == GGMLOp.CONV_3D and conv.type == F32 and conv.ne == [10, 4, 6, 4]
    assert Conv3dParams.of(conv) == Conv3dParams(s0=1, s1=2, s2=1, p0=1, p1=0, p2=0, d0=1, d1=1, d2=2, c=3, n=2, oc=2)
    assert ctx.conv_3d(k3, x3, 3, 1, 2, 1, 1, 0, 0, 1, 1, 2).ne == conv.ne  # the IM2COL_3D + MUL_MAT graph

    c = ctx.col2im_1d(ctx.new_tensor_2d(BF16, 12, 7), 2, 3, 1)  # K 4: T_out = 6*2 + 4 - 2
    assert c.op == GGMLOp.COL2IM_1D and c.type == BF16 and c.ne == [14, 3, 1, 1]
    assert Col2im1dParams.of(c) == Col2im1dParams(s0=2, oc=3, p0=1)

    af = ctx.new_tensor_4d(F32, 8, 6, 3, 2)
    pb = ctx.pool_2d_back(ctx.new_tensor_4d(F32, 4, 3, 3, 2), af, OpPool.MAX, 2, 2, 2, 2, 1.0, 0.0)
    assert pb.op == GGMLOp.POOL_2D_BACK and pb.ne == af.ne and pb.type == F32 and pb.src[1] is af
    assert Pool2dParams.of(pb) == Pool2dParams(op=OpPool.MAX, k0=2, k1=2, s0=2, s1=2, p0=1, p1=0)
    assert capi.ggml_col2im_1d(ctx, ctx.new_tensor_2d(F32, 4, 3), 1, 1, 0).ne == [6, 1, 1, 1]


def test_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    k2, g2 = ctx.new_tensor_4d(F32, 3, 3, 2, 1), ctx.new_tensor_4d(F32, 18, 8, 6, 1)
    k3, x3 = ctx.new_tensor_4d(F32, 3, 3, 3, 4), ctx.new_tensor_4d(F32, 6, 6, 6, 4)
    spd = (1, 1, 1, 0, 0, 0, 1, 1, 1)
    bad = [
        (ShapeError, "im2col_back", lambda: ctx.im2col_back(g2, k2, [9, 6, 2, 1], 1, 1, 1, 1, 1, 1, True)),  # OW 9
        (ShapeError, "im2col_back", lambda: ctx.im2col_back(g2, k2, [8, 6, 3, 1], 1, 1, 1, 1, 1, 1, True)),
        (ArgumentError, "im2col_back", lambda: ctx.im2col_back(g2, k2, [8, 6, 2, 1], 0, 1, 1, 1, 1, 1, True)),
        (ArgumentError, "im2col_back", lambda: ctx.im2col_back(g2, k2, [8, 6, 2, 1, 1], 1, 1, 1, 1, 1, 1, True)),
        (ArgumentError, "im2col_back", lambda: ctx.im2col_back(g2, k2, [8, -6, 2, 1], 1, 1, 1, 1, 1, 1, True)),
        (ShapeError, "im2col_3d", lambda: ctx.im2col_3d(ctx.new_tensor_4d(F32, 7, 3, 3, 4), x3, 2, *spd)),
        (ArgumentError, "im2col_3d", lambda: ctx.im2col_3d(k3, x3, 0, *spd)),
        (ShapeError, "conv_3d", lambda: ctx.conv_3d(ctx.new_tensor_4d(F32, 3, 3, 3, 3), x3, 2, *spd)),
        (ShapeError, "conv_3d_direct", lambda: ctx.conv_3d_direct(k3, x3, *spd, 2, 2, 3)),
        (ArgumentError, "conv_3d_direct", lambda: ctx.conv_3d_direct(k3, x3, 1, 1, 1, -1, 0, 0, 1, 1, 1, 2, 2, 2)),
        (ShapeError, "conv_3d_direct", lambda: ctx.conv_3d_direct(k3, ctx.new_tensor_4d(F32, 2, 6, 6, 4),
                                                                  *spd, 2, 2, 2)),
        (UnsupportedTypeError, "col2im_1d", lambda: ctx.col2im_1d(ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2), 1, 1, 0)),
        (ShapeError, "col2im_1d", lambda: ctx.col2im_1d(ctx.new_tensor_3d(F32, 6, 2, 2), 1, 3, 0)),
        (ShapeError, "col2im_1d", lambda: ctx.col2im_1d(ctx.new_tensor_2d(F32, 7, 2), 1, 3, 0)),
        (ShapeError, "col2im_1d", lambda: ctx.col2im_1d(ctx.new_tensor_2d(F32, 6, 2), 1, 3, 2)),  # T_out = -1
        (ShapeError, "col2im_1d", lambda: ctx.col2im_1d(ctx.transpose(ctx.new_tensor_2d(F32, 2, 6)), 1, 3, 0)),
        (ArgumentError, "col2im_1d", lambda: ctx.col2im_1d(ctx.new_tensor_2d(F32, 6, 2), 0, 3, 0)),
        (ShapeError, "pool_2d_back", lambda: ctx.pool_2d_back(ctx.new_tensor_4d(F32, 3, 3, 2, 1),
                                                              ctx.new_tensor_4d(F32, 6, 6, 3, 1), 0, 2, 2, 2, 2, 0, 0)),
        (ArgumentError, "pool_2d_back", lambda: ctx.pool_2d_back(g2, g2, 7, 2, 2, 2, 2, 0, 0)),
        (ArgumentError, "pool_2d_back", lambda: ctx.pool_2d_back(g2, g2, 0, 0, 2, 2, 2, 0, 0)),
        (ArgumentError, "pool_2d_back", lambda: ctx.pool_2d_back(g2, g2, 0, 2, 2, 2, 2, float("nan"), 0)),
    ]
    for error, name, build in bad:
        with pytest.raises(error, match=name):
            build()


# --- kernels against numpy ---


def im2col_back_ref(g: np.ndarray, ne: list[int], kh: int, kw: int, spd: tuple[int, ...]) -> np.ndarray:
    """grad (N, OH, OW, IC*KH*KW) summed onto (N, IC, H, W) in float64: the adjoint of IM2COL."""
    s0, s1, p0, p1, d0, d1 = spd
    w, h, ic, n = ne
    oh, ow = g.shape[1], g.shape[2]
    g6 = g.astype(np.float64).reshape(n, oh, ow, ic, kh, kw)
    out = np.zeros((n, ic, h, w))
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    y, x = oy * s1 + ky * d1 - p1, ox * s0 + kx * d0 - p0
                    if 0 <= y < h and 0 <= x < w:
                        out[:, :, y, x] += g6[:, oy, ox, :, ky, kx]
    return out


@pytest.mark.parametrize("spd", [(1, 1, 1, 1, 1, 1), (2, 3, 0, 2, 2, 1), (3, 1, 2, 0, 1, 2)])
def test_im2col_back_is_the_adjoint_of_im2col(spd: tuple[int, ...]) -> None:
    ctx = new_ctx()
    ne, kne = [11, 9, 3, 2], [3, 2, 3, 4]
    s0, s1, p0, p1, d0, d1 = spd
    oh, ow = out_size(ne[1], kne[1], s1, p1, d1), out_size(ne[0], kne[0], s0, p0, d0)
    g = rand(2, oh, ow, 18)
    kernel = ctx.new_tensor_4d(F16, *kne)
    got = run(ctx.im2col_back(tensor(ctx, F32, g), kernel, ne, *spd, True))
    want = im2col_back_ref(g, ne, 2, 3, spd)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    x = rand(2, 3, 9, 11)  # <im2col(x), g> == <x, im2col_back(g)>
    cols = run(ctx.im2col(kernel, tensor(ctx, F32, x), *spd, True, F32))
    assert np.dot(cols.ravel().astype(np.float64), g.ravel()) == pytest.approx(np.dot(x.ravel(), want.ravel()))


def test_im2col_back_1d_and_ggml_float32_order() -> None:
    """1-D; and the float32 sums are those of ggml's loops (taps kh-major, kw-minor), to the bit."""
    ctx = new_ctx()
    g = rand(2, 8, 8)  # [IC*K = 8, OL = 8, N = 2]: L 13, K 4, s0 2, p0 3, d0 1 -> OL = (13 + 6 - 3 - 1)/2 + 1
    got = run(ctx.im2col_back(tensor(ctx, F32, g), ctx.new_tensor_3d(F32, 4, 2, 5), [13, 2, 2], 2, 0, 3, 0, 1, 0,
                              False))
    want = im2col_back_ref(g[:, None], [13, 1, 2, 2], 1, 4, (2, 1, 3, 0, 1, 1))
    np.testing.assert_allclose(got[0], want[:, :, 0], rtol=1e-5, atol=1e-6)
    g4 = rand(1, 5, 5, 9)
    got = run(ctx.im2col_back(tensor(ctx, F32, g4), ctx.new_tensor_4d(F32, 3, 3, 1, 1), [5, 5, 1, 1], 1, 1, 1, 1, 1, 1,
                              True))
    ordered = np.zeros((5, 5), np.float32)
    for y in range(5):
        for x in range(5):
            acc = np.float32(0.0)
            for ky in range(3):
                for kx in range(3):
                    oy, ox = y + 1 - ky, x + 1 - kx
                    if 0 <= oy < 5 and 0 <= ox < 5:
                        acc = np.float32(acc + g4[0, oy, ox, ky * 3 + kx])
            ordered[y, x] = acc
    assert np.array_equal(got[0, 0], ordered)


def im2col_3d_ref(x: np.ndarray, ic: int, k: tuple[int, int, int], spd: tuple[int, ...]) -> np.ndarray:
    """x (N*IC, D, H, W) -> (N*OD, OH, OW, IC*KD*KH*KW) in float64, zero outside."""
    s0, s1, s2, p0, p1, p2, d0, d1, d2 = spd
    kd, kh, kw = k
    n = x.shape[0] // ic
    dd, hh, ww = x.shape[1:]
    od, oh, ow = out_size(dd, kd, s2, p2, d2), out_size(hh, kh, s1, p1, d1), out_size(ww, kw, s0, p0, d0)
    out = np.zeros((n, od, oh, ow, ic, kd, kh, kw))
    for i in range(n):
        for c in range(ic):
            for a in range(od):
                for b in range(oh):
                    for e in range(ow):
                        for z in range(kd):
                            for y in range(kh):
                                for xx in range(kw):
                                    zi, yi, xi = a * s2 + z * d2 - p2, b * s1 + y * d1 - p1, e * s0 + xx * d0 - p0
                                    if 0 <= zi < dd and 0 <= yi < hh and 0 <= xi < ww:
                                        out[i, a, b, e, c, z, y, xx] = x[i * ic + c, zi, yi, xi]
    return out.reshape(n * od, oh, ow, -1)


@pytest.mark.parametrize("dst_type", [F32, F16])
def test_im2col_3d(dst_type: GGMLType) -> None:
    ctx = new_ctx()
    x = rand(4, 5, 6, 7)  # IC 2, N 2
    spd = (2, 1, 1, 1, 0, 2, 1, 2, 1)
    got = run(ctx.im2col_3d(ctx.new_tensor_4d(F16, 3, 2, 2, 6), tensor(ctx, F32, x), 2, *spd, dst_type))
    want = im2col_3d_ref(x, 2, (2, 2, 3), spd)
    if dst_type == F16:
        want = stored(F16, want)
    np.testing.assert_array_equal(got, want)


def test_im2col_3d_takes_whole_images_of_ic_channels() -> None:
    """As ggml: N = ne[3] // IC images, the channels past N*IC unread; no whole image gives an empty result."""
    ctx = new_ctx()
    x = rand(4, 5, 6, 7)
    spd = (1, 1, 1, 0, 0, 0, 1, 1, 1)
    got = run(ctx.im2col_3d(ctx.new_tensor_4d(F32, 2, 2, 2, 3), tensor(ctx, F32, x), 3, *spd, F32))
    np.testing.assert_array_equal(got, im2col_3d_ref(x[:3], 3, (2, 2, 2), spd))
    empty = ctx.im2col_3d(ctx.new_tensor_4d(F32, 2, 2, 2, 3), ctx.new_tensor_4d(F32, 7, 6, 5, 1), 3, *spd, F32)
    assert empty.ne[3] == 0 and run(empty).size == 0


def test_im2col_3d_reads_a_strided_view() -> None:
    ctx = new_ctx()
    x = rand(3, 6, 7, 8)
    base = tensor(ctx, F32, x)
    v = ctx.view_4d(base, 6, 5, 4, 2, base.nb[1], base.nb[2], base.nb[3], base.nb[0])  # a sub-block at x = 1
    got = run(ctx.im2col_3d(ctx.new_tensor_4d(F32, 3, 3, 3, 1), v, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, F32))
    np.testing.assert_array_equal(got, im2col_3d_ref(x[:2, :4, :5, 1:7], 1, (3, 3, 3), (1,) * 3 + (1,) * 3 + (1,) * 3))


def conv_3d_ref(k: np.ndarray, x: np.ndarray, c: int, n: int, oc: int, spd: tuple[int, ...]) -> np.ndarray:
    """k (OC*C, KD, KH, KW), x (C*N, D, H, W) -> (OC*N, OD, OH, OW), float64, through im2col_3d_ref."""
    cols = im2col_3d_ref(x, c, k.shape[1:], spd)  # (N*OD, OH, OW, C*KD*KH*KW)
    out = cols.reshape(n, -1, cols.shape[-1]) @ k.reshape(oc, -1).T.astype(np.float64)  # (N, OD*OH*OW, OC)
    return out.transpose(0, 2, 1).reshape((n * oc, cols.shape[0] // n) + cols.shape[1:3])


@pytest.mark.parametrize("kernel_type", [F32, F16])
def test_conv_3d_direct_and_conv_3d(kernel_type: GGMLType) -> None:
    ctx = new_ctx()
    c, n, oc = 3, 2, 4
    k, x = rand(oc * c, 2, 3, 2), rand(c * n, 5, 7, 6)
    spd = (1, 2, 1, 1, 1, 0, 2, 1, 1)
    kt, xt = tensor(ctx, kernel_type, k), tensor(ctx, F32, x)
    xs = stored(kernel_type, x)  # ggml rounds the input to an F16 kernel's type
    want = conv_3d_ref(stored(kernel_type, k), xs, c, n, oc, spd)
    got = run(ctx.conv_3d_direct(kt, xt, *spd, c, n, oc))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # the IM2COL_3D + MUL_MAT graph gives the same (its columns are F16: within their rounding)
    np.testing.assert_allclose(compute(ctx, ctx.conv_3d(kt, xt, c, *spd)), got, rtol=2e-2, atol=2e-2)


def test_conv_3d_of_an_empty_kernel_is_zero() -> None:
    ctx = new_ctx()
    out = ctx.conv_3d_direct(ctx.new_tensor_4d(F32, 0, 1, 1, 1), tensor(ctx, F32, rand(1, 2, 2, 2)), 1, 1, 1,
                             0, 0, 0, 1, 1, 1, 1, 1, 1)
    assert out.ne == [3, 2, 2, 1]
    out.numpy()[...] = 5.0
    assert not run(out).any()


def col2im_ref(cols: np.ndarray, oc: int, s0: int, p0: int) -> np.ndarray:
    t_in, k = cols.shape[0], cols.shape[1] // oc
    full = np.zeros((oc, (t_in - 1) * s0 + k))
    for t in range(t_in):
        full[:, t * s0: t * s0 + k] += cols[t].reshape(oc, k)
    return full[:, p0: full.shape[1] - p0]


@pytest.mark.parametrize("type", [F32, F16, BF16])
@pytest.mark.parametrize("k, oc, t_in, s0, p0", [(4, 3, 7, 2, 0), (6, 4, 11, 3, 1), (2, 3, 9, 3, 0), (8, 2, 3, 2, 5)])
def test_col2im_1d(type: GGMLType, k: int, oc: int, t_in: int, s0: int, p0: int) -> None:
    ctx = new_ctx()
    cols = rand(t_in, k * oc)
    got = run(ctx.col2im_1d(tensor(ctx, type, cols), s0, oc, p0))
    want = stored(type, col2im_ref(stored(type, cols).astype(np.float64), oc, s0, p0))
    np.testing.assert_allclose(got[0, 0], want, rtol={F32: 1e-6, F16: 1e-3, BF16: 8e-3}[type], atol=1e-6)


def test_col2im_1d_is_conv_transpose_1d_after_a_product() -> None:
    """ConvTranspose1d as MUL_MAT + COL2IM_1D (llama.cpp's vocoders): the same as CONV_TRANSPOSE_1D."""
    ctx = new_ctx()
    k, oc, ic, length, s0 = 5, 3, 4, 9, 2
    w, x = rand(ic, oc, k), rand(ic, length)  # kernel [K, OC, IC], input [L, IC]
    wt, xt = tensor(ctx, F32, w), tensor(ctx, F32, x)
    cols = ctx.mul_mat(ctx.cont(ctx.transpose(ctx.reshape_2d(wt, k * oc, ic))), ctx.cont(ctx.transpose(xt)))
    got = compute(ctx, ctx.col2im_1d(cols, s0, oc, 0))  # cols [K*OC, L]
    want = run(ctx.conv_transpose_1d(wt, xt, s0, 0, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def pool_back_ref(g: np.ndarray, af: np.ndarray, op: OpPool, k: tuple[int, int], s: tuple[int, int],
                  p: tuple[int, int]) -> np.ndarray:
    """k, s, p as (y, x); grad to the first max of each window (MAX) or spread over it (AVG), float64."""
    out = np.zeros(af.shape)
    h, w = af.shape[2:]
    for oy in range(g.shape[2]):
        for ox in range(g.shape[3]):
            y0, x0 = oy * s[0] - p[0], ox * s[1] - p[1]
            ys, xs = slice(max(y0, 0), min(y0 + k[0], h)), slice(max(x0, 0), min(x0 + k[1], w))
            if op == OpPool.AVG:
                out[:, :, ys, xs] += g[:, :, oy, ox, None, None] / (k[0] * k[1])
                continue
            for i3 in range(af.shape[0]):
                for i2 in range(af.shape[1]):
                    win = af[i3, i2, ys, xs]
                    if win.size and win.max() > -np.finfo(np.float32).max:
                        y, x = np.unravel_index(int(win.argmax()), win.shape)
                        out[i3, i2, ys.start + y, xs.start + x] += g[i3, i2, oy, ox]
    return out


@pytest.mark.parametrize("op", list(OpPool))
@pytest.mark.parametrize("k, s, p", [((2, 3), (2, 3), (0, 0)), ((3, 3), (1, 2), (1, 1)), ((2, 2), (3, 3), (1, 0))])
def test_pool_2d_back(op: OpPool, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int]) -> None:
    ctx = new_ctx()
    af = rand(2, 3, 8, 9)
    oh, ow = (8 + 2 * p[0] - k[0]) // s[0] + 1, (9 + 2 * p[1] - k[1]) // s[1] + 1
    g = rand(2, 3, oh, ow)
    got = run(ctx.pool_2d_back(tensor(ctx, F32, g), tensor(ctx, F32, af), op, k[1], k[0], s[1], s[0], p[1], p[0]))
    np.testing.assert_allclose(got, pool_back_ref(g, af, op, k, s, p), rtol=1e-5, atol=1e-6)


def test_pool_2d_back_max_ties_and_empty_windows() -> None:
    """As ggml: a tie goes to the first element (row by row); a window of nothing above -FLT_MAX gets nothing."""
    ctx = new_ctx()
    af = np.zeros((1, 1, 4, 4), np.float32)
    af[0, 0, 2:, 2:] = -np.finfo(np.float32).max
    g = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    got = run(ctx.pool_2d_back(tensor(ctx, F32, g), tensor(ctx, F32, af), OpPool.MAX, 2, 2, 2, 2, 0, 0))
    want = np.zeros((4, 4))
    want[0, 0], want[0, 2], want[2, 0] = 1.0, 2.0, 3.0
    assert np.array_equal(got[0, 0], want)


def test_pool_2d_back_sums_in_ggml_order() -> None:
    """Overlapping windows: each element's float32 sum is ggml's, output by output, to the bit."""
    ctx = new_ctx()
    g = (rand(1, 1, 6, 6) * 1e3).astype(np.float32)
    got = run(ctx.pool_2d_back(tensor(ctx, F32, g), tensor(ctx, F32, rand(1, 1, 6, 6)), OpPool.AVG, 3, 3, 1, 1, 1,
                               1))
    ordered = np.zeros((6, 6), np.float32)
    for oy in range(6):
        for ox in range(6):
            share = np.float32(g[0, 0, oy, ox] / np.float32(9))
            for y in range(max(oy - 1, 0), min(oy + 2, 6)):
                for x in range(max(ox - 1, 0), min(ox + 2, 6)):
                    ordered[y, x] = np.float32(ordered[y, x] + share)
    assert np.array_equal(got[0, 0], ordered)


# --- what the CPU refuses ---


def test_cpu_supports_ggml_cpus_types() -> None:
    ctx = new_ctx()
    backend = cpu_init()
    k3 = ctx.new_tensor_4d(F16, 2, 2, 2, 2)
    x3, x16 = ctx.new_tensor_4d(F32, 4, 4, 4, 2), ctx.new_tensor_4d(F16, 4, 4, 4, 2)
    k2 = ctx.new_tensor_4d(F16, 3, 3, 2, 1)
    spd = (1, 1, 1, 0, 0, 0, 1, 1, 1)
    af, af16 = ctx.new_tensor_4d(F32, 4, 4, 2, 1), ctx.new_tensor_4d(F16, 4, 4, 2, 1)
    g = ctx.new_tensor_4d(F32, 2, 2, 2, 1)
    yes = [ctx.im2col_back(ctx.new_tensor_4d(F32, 18, 4, 4, 1), k2, [4, 4, 2, 1], 1, 1, 1, 1, 1, 1, True),
           ctx.im2col_3d(k3, x3, 1, *spd), ctx.conv_3d_direct(k3, x3, *spd, 1, 2, 2),
           ctx.col2im_1d(ctx.new_tensor_2d(BF16, 4, 3), 1, 2, 0), ctx.pool_2d_back(g, af, 0, 2, 2, 2, 2, 0, 0)]
    assert all(backend.supports_op(node) for node in yes)
    no = [ctx.im2col_back(ctx.new_tensor_4d(F16, 18, 4, 4, 1), k2, [4, 4, 2, 1], 1, 1, 1, 1, 1, 1, True),
          ctx.im2col_3d(k3, x16, 1, *spd), ctx.conv_3d_direct(k3, x16, *spd, 1, 2, 2),
          ctx.pool_2d_back(g, af16, 0, 2, 2, 2, 2, 0, 0)]
    assert not any(backend.supports_op(node) for node in no)
    backend.free()


def test_kernels_refuse_bad_nodes_before_computing() -> None:
    ctx = new_ctx()
    g = tensor(ctx, F32, rand(1, 4, 4, 9))
    k = ctx.new_tensor_4d(F32, 3, 3, 1, 1)
    bad = [
        manual_node(ctx, GGMLOp.IM2COL_BACK, [g, k], [0, 1, 1, 1, 1, 1, 1], type=F32, ne=[4, 4, 1, 1]),  # s0 = 0
        manual_node(ctx, GGMLOp.IM2COL_BACK, [g, k], [1, 1, 1, 1, 1, 1, 1], type=F32, ne=[4, 4, 2, 1]),
        manual_node(ctx, GGMLOp.IM2COL_3D, [ctx.new_tensor_4d(F32, 2, 2, 2, 1), ctx.new_tensor_4d(F32, 4, 4, 4, 3)],
                    [1, 1, 1, 0, 0, 0, 1, 1, 1, 2], type=F32, ne=[16, 3, 3, 6]),  # 2 images of IC 2 in 3 channels
        manual_node(ctx, GGMLOp.CONV_3D, [ctx.new_tensor_4d(F32, 2, 2, 2, 2), ctx.new_tensor_4d(F32, 4, 4, 4, 2)],
                    [1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 2, 2], type=F32, ne=[5, 3, 3, 4]),  # windows past the input
        manual_node(ctx, GGMLOp.COL2IM_1D, [ctx.new_tensor_2d(F32, 6, 2)], [1, 4, 0], type=F32, ne=[3, 4, 1, 1]),
        manual_node(ctx, GGMLOp.POOL_2D_BACK, [g, ctx.new_tensor_4d(F32, 4, 4, 9, 1)], [0, 2, 2, 0, 2, 0, 0],
                    type=F32, ne=[4, 4, 9, 1]),
    ]
    for node in bad:
        before = node.numpy().copy()
        with pytest.raises(GGMLError, match=node.op.name):
            compile_node(node)
        assert np.array_equal(node.numpy(), before)


# --- against real ggml ---


@pytest.mark.parametrize("label", ["IM2COL_BACK", "IM2COL_3D", "COL2IM_1D", "CONV_3D", "POOL_2D_BACK"])
def test_every_case_against_ggml(label: str, ggml_reference: Backend) -> None:
    cases = [c for c in conv_back_cases() if c.label == label]
    results = op_check.run_cases(cases, ggml_reference)
    bad = [(r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad
    assert len(results) >= 12
