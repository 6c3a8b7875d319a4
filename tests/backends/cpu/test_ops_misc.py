"""Today's small ops (pyggml.core.ops.misc): builders' shapes, op_params and errors; CPU kernels against
numpy formulas written here; and every op checker case against real ggml (skipped only without a C compiler)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import new_ctx, permuted, run, stored, tensor

from pyggml.backends.cpu import cpu_init
from pyggml.capi import core as capi
from pyggml.core.errors import ArgumentError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, TriType
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend
from pyggml.testing import op_check
from pyggml.testing.cases_misc import misc_cases

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
rng = np.random.default_rng(7)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


# --- builders ---


def test_builders_shapes_and_params() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 6, 6, 2, 1)
    assert ctx.sin(a).op == GGMLOp.SIN and ctx.cos_inplace(a).view_src is a
    f = ctx.fill(a, 2.5)
    assert f.op == GGMLOp.FILL and f.get_op_params_f32(0) == 2.5
    r = ctx.arange(-2.5, 7.0, 0.7)
    assert r.ne == [14, 1, 1, 1] and [r.get_op_params_f32(i) for i in range(3)] == pytest.approx([-2.5, 7.0, 0.7])
    t = ctx.timestep_embedding(ctx.new_tensor_1d(F32, 3), 15, 100)
    assert t.ne == [15, 3, 1, 1] and t.get_op_params_i32(0) == 15 and t.get_op_params_i32(1) == 100
    assert ctx.tri(a, TriType.LOWER).get_op_params_i32(0) == int(TriType.LOWER)
    c = ctx.count_equal(ctx.new_tensor_1d(I32, 5), ctx.new_tensor_1d(I32, 5))
    assert c.type == I64 and c.ne == [1, 1, 1, 1]
    assert ctx.l2_norm(a, 1e-6).get_op_params_f32(0) == pytest.approx(1e-6)
    assert [ctx.roll(a, 1, -2, 1, 0).get_op_params_i32(i) for i in range(4)] == [1, -2, 1, 0]
    p = ctx.pad_reflect_1d(a, 2, 3)
    assert p.ne == [11, 6, 2, 1] and (p.get_op_params_i32(0), p.get_op_params_i32(1)) == (2, 3)
    rb = ctx.repeat_back(ctx.new_tensor_4d(F32, 6, 4, 2, 1), ctx.new_tensor_4d(F32, 3, 2, 1, 1))
    assert rb.ne == [3, 2, 1, 1] and rb.op == GGMLOp.REPEAT_BACK
    s = ctx.solve_tri(a, ctx.new_tensor_4d(F32, 4, 6, 2, 1), True, True, False)
    assert s.ne == [4, 6, 2, 1] and s.src[0] is a
    assert capi.ggml_cumsum(ctx, a).op == GGMLOp.CUMSUM


def test_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_4d(F32, 6, 5, 1, 1)
    with pytest.raises(ShapeError, match="tri"):
        ctx.tri(a, TriType.LOWER)
    with pytest.raises(UnsupportedTypeError, match="cumsum"):
        ctx.cumsum(ctx.new_tensor_1d(F16, 4))
    with pytest.raises(ArgumentError, match="roll"):
        ctx.roll(a, 6, 0, 0, 0)
    with pytest.raises(ArgumentError, match="pad_reflect_1d"):
        ctx.pad_reflect_1d(a, 6, 0)
    with pytest.raises(ArgumentError, match="arange"):
        ctx.arange(3.0, 1.0, 1.0)
    with pytest.raises(ShapeError, match="count_equal"):
        ctx.count_equal(ctx.new_tensor_1d(I32, 4), ctx.new_tensor_1d(I32, 5))
    with pytest.raises(ShapeError, match="repeat_back"):
        ctx.repeat_back(a, ctx.new_tensor_4d(F32, 4, 5, 1, 1))
    with pytest.raises(ArgumentError, match="solve_tri"):
        ctx.solve_tri(ctx.new_tensor_2d(F32, 5, 5), ctx.new_tensor_2d(F32, 2, 5), True, False, False)
    with pytest.raises(ArgumentError, match="tri"):
        ctx.tri(ctx.new_tensor_2d(F32, 3, 3), 9)


# --- kernels against numpy ---


@pytest.mark.parametrize("type", [F32, F16, GGMLType.BF16])
def test_sin_cos(type: GGMLType) -> None:
    ctx = new_ctx()
    x = rand(2, 3, 4, 7, lo=-6, hi=6)
    a = tensor(ctx, type, x)
    xs = stored(type, x)
    tol = {F32: 1e-6, F16: 2e-3}.get(type, 1e-2)
    np.testing.assert_allclose(run(ctx.sin(a)), np.sin(xs), atol=tol)
    np.testing.assert_allclose(run(ctx.cos(a)), np.cos(xs), atol=tol)


def test_fill_arange_timestep() -> None:
    ctx = new_ctx()
    assert (run(ctx.fill(tensor(ctx, F16, rand(3, 5)), -7.25)) == -7.25).all()
    np.testing.assert_allclose(run(ctx.arange(-2.5, 7.0, 0.7)).ravel(), -2.5 + 0.7 * np.arange(14), rtol=1e-6)
    ts = np.array([0.0, 3.0, 41.5], dtype=np.float32)
    got = run(ctx.timestep_embedding(tensor(ctx, F32, ts), 7, 100))[0, 0]
    half = 3
    freqs = np.exp(-np.log(100.0) * np.arange(half) / half)
    arg = ts[:, None] * freqs[None, :]
    want = np.concatenate([np.cos(arg), np.sin(arg), np.zeros((3, 1))], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("tt", list(TriType))
def test_tri(tt: TriType) -> None:
    ctx = new_ctx()
    x = rand(2, 3, 5, 5)
    k = {TriType.LOWER: -1, TriType.LOWER_DIAG: 0, TriType.UPPER: 1, TriType.UPPER_DIAG: 0}[tt]
    want = np.tril(x, k) if tt in (TriType.LOWER, TriType.LOWER_DIAG) else np.triu(x, k)
    np.testing.assert_array_equal(run(ctx.tri(tensor(ctx, F32, x), tt)), want)


def test_cumsum_l2_norm_count_equal() -> None:
    ctx = new_ctx()
    x = rand(3, 4, 5, 9)
    np.testing.assert_allclose(run(ctx.cumsum(permuted(ctx, F32, x))), np.cumsum(x, axis=-1), rtol=1e-5, atol=1e-6)
    want = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    np.testing.assert_allclose(run(ctx.l2_norm(permuted(ctx, F32, x), 1e-12)), want, rtol=1e-5)
    a = rng.integers(0, 3, (7, 4)).astype(np.int32)
    b = rng.integers(0, 3, (7, 4)).astype(np.int32)
    got = run(ctx.count_equal(tensor(ctx, I32, a), tensor(ctx, I32, b)))
    assert int(got.ravel()[0]) == int((a == b).sum())


def test_roll_pad_reflect_repeat_back() -> None:
    ctx = new_ctx()
    x = rand(3, 4, 5, 10)
    got = run(ctx.roll(tensor(ctx, F32, x), 3, -1, 2, 1))
    np.testing.assert_array_equal(got, np.roll(x, (1, 2, -1, 3), axis=(0, 1, 2, 3)))
    got = run(ctx.pad_reflect_1d(tensor(ctx, F32, x), 4, 2))
    want = np.concatenate([x[..., 4:0:-1], x, x[..., -2:-4:-1]], axis=-1)
    np.testing.assert_array_equal(got, want)
    big = rand(2, 3, 4, 6)
    got = run(ctx.repeat_back(tensor(ctx, F32, big), ctx.new_tensor_4d(F32, 3, 2, 3, 1)))
    want = big.reshape(2, 1, 1, 3, 2, 2, 2, 3).sum(axis=(0, 2, 4, 6))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_solve_tri() -> None:
    ctx = new_ctx()
    n, k = 6, 3
    a = np.tril(rand(2, 1, n, n)) + 3 * np.eye(n, dtype=np.float32)
    b = rand(2, 1, n, k)
    got = run(ctx.solve_tri(tensor(ctx, F32, a), tensor(ctx, F32, b), True, True, False))
    np.testing.assert_allclose(got, np.linalg.solve(a.astype(np.float64), b.astype(np.float64)), rtol=1e-4,
                               atol=1e-5)


def test_supports_types() -> None:
    backend = cpu_init()
    ctx = new_ctx()
    assert backend.supports_op(ctx.sin(ctx.new_tensor_1d(F16, 4)))
    assert not backend.supports_op(ctx.count_equal(ctx.new_tensor_1d(F32, 4), ctx.new_tensor_1d(F32, 4)))
    backend.free()


# --- against real ggml ---


@pytest.mark.parametrize("label", sorted({c.label for c in misc_cases()}))
def test_against_ggml(label: str, ggml_reference: Backend) -> None:
    results = op_check.run_cases([c for c in misc_cases() if c.label == label], ggml_reference)
    bad = [(r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad


# --- direct convolutions ---


def _conv2d_ref(k: np.ndarray, x: np.ndarray, s: tuple[int, int], p: tuple[int, int], d: tuple[int, int],
                depthwise: bool = False) -> np.ndarray:
    """Loops over output positions (numpy order: k [OC, IC, KH, KW], x [N, IC, H, W])."""
    n, c, h, w = x.shape
    oc, _, kh, kw = k.shape
    oh = int((h + 2 * p[1] - d[1] * (kh - 1) - 1) / s[1]) + 1  # C's division, toward zero (ggml.c)
    ow = int((w + 2 * p[0] - d[0] * (kw - 1) - 1) / s[0]) + 1
    out = np.zeros((n, c if depthwise else oc, oh, ow))
    for y in range(oh):
        for xx in range(ow):
            for i in range(kh):
                for j in range(kw):
                    sy, sx = y * s[1] + i * d[1] - p[1], xx * s[0] + j * d[0] - p[0]
                    if 0 <= sy < h and 0 <= sx < w:
                        if depthwise:
                            out[:, :, y, xx] += x[:, :, sy, sx] * k[:, 0, i, j]
                        else:
                            out[:, :, y, xx] += x[:, :, sy, sx] @ k[:, :, i, j].T
    return out


def test_conv_2d_direct_and_dw() -> None:
    ctx = new_ctx()
    k, x = rand(5, 3, 3, 2), rand(2, 3, 9, 11)
    got = run(ctx.conv_2d_direct(tensor(ctx, F32, k), tensor(ctx, F32, x), 2, 1, 1, 0, 1, 2))
    np.testing.assert_allclose(got, _conv2d_ref(k, x, (2, 1), (1, 0), (1, 2)), rtol=1e-4, atol=1e-5)
    kd = rand(3, 1, 3, 2)
    out = ctx.conv_2d_dw_direct(tensor(ctx, F32, kd), tensor(ctx, F32, x), 1, 2, 1, 1, 2, 1)
    assert out.ne == [11, 5, 3, 2] and out.is_contiguous()
    np.testing.assert_allclose(run(out), _conv2d_ref(kd, x, (1, 2), (1, 1), (2, 1), depthwise=True), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("kernel_type", [F32, F16])
def test_conv_2d_direct_with_a_kernel_past_the_padded_input(kernel_type: GGMLType) -> None:
    # test-backend-ops' CONV_2D(ne_input=[141,1,1,2],ne_kernel=[1,3,1,1],...,stride1=5,padding1=2,dilation1=4):
    # the dilated kernel spans 9 rows of a padded input of 5; ggml's output size rounds (5 - 9) / 5 toward zero,
    # so there is one output row, its taps past the input reading zeros
    ctx = new_ctx()
    k, x = rand(1, 1, 3, 1), rand(2, 1, 1, 141)
    node = ctx.conv_2d_direct(tensor(ctx, kernel_type, k), tensor(ctx, F32, x), 1, 5, 5, 2, 2, 4)
    assert node.ne == [151, 1, 1, 2]
    got = run(node)
    assert np.isfinite(got).all()
    want = _conv2d_ref(stored(kernel_type, k), stored(kernel_type, x) if kernel_type == F16 else x, (1, 5), (5, 2),
                       (2, 4))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


def test_conv_2d_dw_keeps_channels_innermost() -> None:
    ctx = new_ctx()
    base = ctx.new_tensor_4d(F32, 4, 7, 6, 1)  # [C, W, H, N]
    x = ctx.permute(base, 2, 0, 1, 3)  # [W, H, C, N], channels innermost
    out = ctx.conv_2d_dw_direct(ctx.new_tensor_4d(F32, 3, 3, 1, 4), x, 1, 1, 1, 1, 1, 1)
    assert out.ne == [7, 6, 4, 1] and out.nb[2] == 4 and out.nb[0] == 16 and out.nb[1] == 16 * 7


def test_conv_transpose_2d_p0() -> None:
    ctx = new_ctx()
    k, x = rand(3, 2, 2, 3), rand(2, 3, 4, 5)  # k [IC, OC, KH, KW], x [N, IC, H, W]
    got = run(ctx.conv_transpose_2d_p0(tensor(ctx, F32, k), tensor(ctx, F32, x), 2))
    want = np.zeros((2, 2, 3 * 2 + 2, 4 * 2 + 3))
    for i in range(4):
        for j in range(5):
            want[:, :, 2 * i: 2 * i + 2, 2 * j: 2 * j + 3] += np.einsum("nc,cokl->nokl", x[:, :, i, j], k)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match="conv_transpose_2d_p0"):
        ctx.conv_transpose_2d_p0(tensor(ctx, F32, k), ctx.new_tensor_4d(F32, 5, 4, 2, 1), 1)
    with pytest.raises(ShapeError, match="conv_2d_direct"):
        ctx.conv_2d_direct(ctx.new_tensor_4d(F32, 3, 3, 2, 4), ctx.new_tensor_4d(F32, 8, 8, 3, 1), 1, 1, 0, 0, 1, 1)


# --- training ops ---


def test_backward_ops() -> None:
    ctx = new_ctx()
    dy, x = rand(2, 3, 9), rand(2, 3, 9, lo=-3, hi=3)
    s = 1 / (1 + np.exp(-x))
    got = run(ctx.silu_back(tensor(ctx, F32, dy), tensor(ctx, F32, x)))
    np.testing.assert_allclose(got.reshape(dy.shape), dy * s * (1 + x * (1 - s)), rtol=1e-5, atol=1e-6)
    # rms_norm_back against the Jacobian-vector product of rms_norm, by central differences
    eps = 1e-3
    got = run(ctx.rms_norm_back(tensor(ctx, F32, dy), tensor(ctx, F32, x), eps)).reshape(dy.shape)
    xd = x.astype(np.float64)

    def rms(v: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)

    h = 1e-6
    want = np.zeros_like(xd)
    for k in range(xd.shape[-1]):
        e = np.zeros_like(xd)
        e[..., k] = h
        want[..., k] = ((rms(xd + e) - rms(xd - e)) / (2 * h) * dy).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    y = rand(2, 3, 9, lo=0, hi=1)
    got = run(ctx.soft_max_ext_back(tensor(ctx, F32, dy), tensor(ctx, F32, y), 0.5, 0.0)).reshape(dy.shape)
    np.testing.assert_allclose(got, 0.5 * y * (dy - (y * dy).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-6)
    g = rand(4, 6)
    idx = np.array([2, 0, 2, 1], dtype=np.int32)
    got = run(ctx.get_rows_back(tensor(ctx, F32, g), tensor(ctx, I32, idx), ctx.new_tensor_2d(F32, 6, 3)))
    np.testing.assert_allclose(got[0, 0], np.stack([g[1], g[3], g[0] + g[2]]), rtol=1e-6)


def test_cross_entropy_loss_and_back() -> None:
    ctx = new_ctx()
    logits, labels = rand(4, 7, lo=-3, hi=3), rand(4, 7, lo=0, hi=1)
    ls = logits - logits.max(-1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
    loss = run(ctx.cross_entropy_loss(tensor(ctx, F32, logits), tensor(ctx, F32, labels)))
    assert float(loss.ravel()[0]) == pytest.approx(-(ls * labels).sum() / 4, rel=1e-5)
    grad = np.array([2.0], dtype=np.float32)
    got = run(ctx.cross_entropy_loss_back(tensor(ctx, F32, grad), tensor(ctx, F32, logits), tensor(ctx, F32, labels)))
    np.testing.assert_allclose(got.reshape(4, 7), (np.exp(ls) - labels) * 2.0 / 4, rtol=1e-5, atol=1e-6)


def test_optimizer_steps_update_in_place() -> None:
    ctx = new_ctx()
    w0, g, m0, v0 = rand(3, 5), rand(3, 5), rand(3, 5), rand(3, 5, lo=0, hi=1)
    a = tensor(ctx, F32, w0, "a").set_param()
    m, v = tensor(ctx, F32, m0, "m"), tensor(ctx, F32, v0, "v")
    alpha, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.1
    hp = np.array([alpha, b1, b2, eps, wd, 1 / (1 - b1), 1 / (1 - b2)], dtype=np.float32)
    out = ctx.opt_step_adamw(a, tensor(ctx, F32, g), m, v, tensor(ctx, F32, hp))
    assert out.view_src is a
    got = run(out).reshape(3, 5)
    m1, v1 = m0 * b1 + g * (1 - b1), v0 * b2 + g * g * (1 - b2)
    want = w0 * (1 - alpha * wd) - alpha * m1 * hp[5] / (np.sqrt(v1 * hp[6]) + eps)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.numpy().reshape(3, 5), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m.numpy().reshape(3, 5), m1, rtol=1e-5, atol=1e-7)
    b = tensor(ctx, F32, w0, "b").set_param()
    got = run(ctx.opt_step_sgd(b, tensor(ctx, F32, g), tensor(ctx, F32, np.array([0.1, 0.5], np.float32))))
    np.testing.assert_allclose(got.reshape(3, 5), w0 * (1 - 0.05) - 0.1 * g, rtol=1e-5, atol=1e-7)
    with pytest.raises(ShapeError, match="opt_step_sgd"):
        ctx.opt_step_sgd(tensor(ctx, F32, w0), tensor(ctx, F32, g), tensor(ctx, F32, np.zeros(2, np.float32)))
    with pytest.raises(ShapeError, match="get_rows_back"):
        ctx.get_rows_back(tensor(ctx, F32, g), tensor(ctx, F32, g), tensor(ctx, F32, g))
