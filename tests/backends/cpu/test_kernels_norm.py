"""CPU kernels of the normalization/attention ops against numpy references written here from ggml's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import (
    F16,
    F32,
    assert_close,
    build,
    compile_node,
    manual_node,
    new_ctx,
    permuted,
    run,
    stored,
    tensor,
)

from pyggml.backends.cpu.kernels import norm
from pyggml.core import ops
from pyggml.core.errors import GGMLError, ShapeError
from pyggml.core.ops.params import RopeParams
from pyggml.core.rope import powf, rope_theta_sources, rope_yarn_corr_dims
from pyggml.core.tensor import GGMLOp
from pyggml.core.types import GGMLType

TYPES = [F32, F16]
I32 = GGMLType.I32


def rows(x: np.ndarray):
    """Every row (last axis) of a 4-D array with its index."""
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            for i1 in range(x.shape[2]):
                yield (i3, i2, i1), x[i3, i2, i1]


# --- NORM, RMS_NORM, GROUP_NORM ---


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("layout_", ["contiguous", "permuted"])
def test_norm(type: GGMLType, layout_: str, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((2, 3, 4, 32)) * 2 + 1).astype(np.float32)
    eps = 1e-5
    ctx = new_ctx()
    t = tensor(ctx, type, x) if layout_ == "contiguous" else permuted(ctx, type, x)
    node = build(ctx, "norm", t, eps, op=GGMLOp.NORM, params=[eps])
    xs = stored(type, x).astype(np.float64)
    want = np.zeros_like(xs)
    for idx, r in rows(xs):
        mean = sum(r) / len(r)
        var = sum((v - mean) ** 2 for v in r) / len(r)
        want[idx] = (r - mean) / math.sqrt(var + eps)
    assert_close(run(node), stored(type, want), type, atol=1e-5 if type == F32 else 4e-3)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("layout_", ["contiguous", "permuted"])
def test_rms_norm(type: GGMLType, layout_: str, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((2, 3, 4, 32)) * 2).astype(np.float32)
    eps = 1e-6
    ctx = new_ctx()
    t = tensor(ctx, type, x) if layout_ == "contiguous" else permuted(ctx, type, x)
    node = build(ctx, "rms_norm", t, eps, op=GGMLOp.RMS_NORM, params=[eps])
    xs = stored(type, x).astype(np.float64)
    want = np.zeros_like(xs)
    for idx, r in rows(xs):
        want[idx] = r / math.sqrt(sum(v * v for v in r) / len(r) + eps)
    assert_close(run(node), stored(type, want), type, atol=1e-5 if type == F32 else 4e-3)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("channels,groups", [(8, 4), (10, 4), (6, 6), (10, 6)])
def test_group_norm(type: GGMLType, channels: int, groups: int, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((2, channels, 3, 5)) + 0.5).astype(np.float32)
    ctx = new_ctx()
    eps = 1e-5
    node = build(ctx, "group_norm", permuted(ctx, type, x), groups, eps, op=GGMLOp.GROUP_NORM, params=[groups, eps])
    xs = stored(type, x).astype(np.float64)
    want = np.zeros_like(xs)
    per = (channels + groups - 1) // groups
    for g in range(groups):
        lo, hi = g * per, min(g * per + per, channels)
        if lo >= hi:
            continue
        for n in range(2):
            block = xs[n, lo:hi]
            mean = block.mean()
            var = ((block - mean) ** 2).mean()
            want[n, lo:hi] = (block - mean) / math.sqrt(var + eps)
    assert_close(run(node), stored(type, want), type, atol=1e-5 if type == F32 else 4e-3)


# --- SOFT_MAX ---


def soft_max_ref(x: np.ndarray, mask: np.ndarray | None, scale: float, max_bias: float = 0.0,
                 sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml's soft_max: row (i3, i2, i1) adds slope(i2) * mask row i1 of mask plane (i3 % m3, i2 % m2); the
    slope is ALiBi's for max_bias > 0, else 1; a sink (one per head i2) is one more logit of the row."""
    x = x.astype(np.float64)
    n_head = x.shape[1]
    if mask is not None:
        mask = np.asarray(mask, np.float64)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    n_log2 = 2 ** math.floor(math.log2(n_head))
    out = np.zeros_like(x)
    for (i3, i2, i1), r in rows(x):
        w = r * scale
        if mask is not None:
            slope = 1.0
            if max_bias > 0:
                m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-(max_bias / 2) / n_log2)
                slope = m0 ** (i2 + 1) if i2 < n_log2 else m1 ** (2 * (i2 - n_log2) + 1)
            w = w + slope * mask[i3 % mask.shape[0], i2 % mask.shape[1], i1]
        top = w.max() if sinks is None else max(w.max(), sinks[i2])
        e = np.exp(w - top)
        out[i3, i2, i1] = e / (e.sum() + (0.0 if sinks is None else math.exp(sinks[i2] - top)))
    return out


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("mask_rows", [None, 4, 6])
def test_soft_max(type: GGMLType, mask_rows: int | None, rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 3, 4, 10)).astype(np.float32)
    scale = 0.35
    ctx = new_ctx()
    t = tensor(ctx, type, x)
    mask = None
    tm = None
    if mask_rows is not None:  # as many rows as x or more (the rest unused)
        mask = np.triu(np.full((mask_rows, 10), -np.inf, np.float32), 1 + 6)
        mask += rng.standard_normal((mask_rows, 10)).astype(np.float32) * 0.1
        tm = tensor(ctx, F32, mask)
    node = ctx.soft_max_ext(t, tm, scale)
    want = soft_max_ref(stored(type, x), mask, scale)
    assert_close(run(node), stored(type, want), type, atol=1e-6 if type == F32 else 1e-3)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("mask_shape", [None, (4, 10), (2, 6, 10), (2, 3, 5, 10)])
@pytest.mark.slow
def test_soft_max_strided_src_and_broadcast_masks(type: GGMLType, mask_shape: tuple[int, ...] | None,
                                                  rng: np.random.Generator) -> None:
    """A permuted src (beyond what the builder allows) and F16 masks broadcast over dims 2 and 3."""
    x = rng.standard_normal((2, 6, 4, 10)).astype(np.float32)
    ctx = new_ctx()
    t = permuted(ctx, type, x)
    mask = None if mask_shape is None else rng.standard_normal(mask_shape).astype(np.float32)
    tm = None if mask is None else tensor(ctx, F16, mask)
    node = manual_node(ctx, GGMLOp.SOFT_MAX, [t, tm], [0.5, 0.0])
    want = soft_max_ref(stored(type, x), None if mask is None else stored(F16, mask), 0.5)
    assert_close(run(node), stored(type, want), type, atol=1e-6 if type == F32 else 1e-3)


@pytest.mark.parametrize("n_head", [4, 6])
def test_soft_max_alibi_and_sinks(n_head: int, rng: np.random.Generator) -> None:
    """ALiBi (max_bias > 0: each head's slope times the mask, ggml's replacement of the ALIBI op) and sinks."""
    x = rng.standard_normal((1, n_head, 3, 7)).astype(np.float32)
    mask = (np.arange(7, dtype=np.float32)[None, :] - 6).repeat(3, 0)  # ALiBi's distances
    sinks = rng.standard_normal(n_head).astype(np.float32)
    ctx = new_ctx()
    node = ctx.soft_max_ext(tensor(ctx, F32, x), tensor(ctx, F32, mask), 0.5, 8.0)
    assert_close(run(node), soft_max_ref(x, mask, 0.5, 8.0), F32, atol=1e-6)
    with_sinks = ctx.soft_max_ext(tensor(ctx, F32, x), tensor(ctx, F32, mask), 0.5, 8.0)
    ops.soft_max_add_sinks(with_sinks, tensor(ctx, F32, sinks))
    assert_close(run(with_sinks), soft_max_ref(x, mask, 0.5, 8.0, sinks), F32, atol=1e-6)


def test_soft_max_plain_is_scale_one(rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 7)).astype(np.float32)
    ctx = new_ctx()
    t = tensor(ctx, F32, x)
    node = ctx.soft_max(t)
    assert_close(run(node), soft_max_ref(x.reshape(1, 1, 5, 7), None, 1.0).reshape(5, 7), F32, atol=1e-6)


# --- DIAG_MASK ---


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("op", [GGMLOp.DIAG_MASK_INF, GGMLOp.DIAG_MASK_ZERO])
@pytest.mark.parametrize("n_past", [0, 2])
def test_diag_mask(type: GGMLType, op: GGMLOp, n_past: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    ctx = new_ctx()
    name = "diag_mask_inf" if op == GGMLOp.DIAG_MASK_INF else "diag_mask_zero"
    node = build(ctx, name, permuted(ctx, type, x), n_past, op=op, params=[n_past])
    value = -np.inf if op == GGMLOp.DIAG_MASK_INF else 0.0
    want = stored(type, x).copy()
    for i1 in range(4):
        for i0 in range(6):
            if i0 > n_past + i1:
                want[:, :, i1, i0] = value
    np.testing.assert_array_equal(run(node), want)


# --- ROPE ---


def corr_dims_ref(n_dims: int, n_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    def dim(n_rot: float) -> float:
        return n_dims * math.log(n_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_dims - 1.0, math.ceil(dim(beta_slow)))


def rope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, mode: int, n_orig: int, base: float, fscale: float,
             ext: float, attn: float, beta_fast: float, beta_slow: float, n_offs: int = 0) -> np.ndarray:
    """Written from ggml's rope_yarn: angle p * base^(-2k/n_dims), YaRN ramp over pair index k; the pairs
    (2k, 2k+1) (normal) or (k, k + n_dims/2) (NeoX) of the n_dims elements from n_offs on, the rest copied."""
    x = x.astype(np.float64)
    out = x.copy()
    low, high = corr_dims_ref(n_dims, n_orig, base, beta_fast, beta_slow)
    neox = mode & 2
    for (i3, i2, i1), r in rows(x):
        p = float(pos[i2])
        for k in range(n_dims // 2):
            extrap = p * base ** (-2.0 * k / n_dims)
            theta = fscale * extrap
            mscale = attn
            if ext != 0.0:
                ramp = 1 - min(1.0, max(0.0, (k - low) / max(0.001, high - low)))
                mix = ramp * ext
                theta = theta * (1 - mix) + extrap * mix
                mscale *= 1 + 0.1 * math.log(1 / fscale)
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            j0, j1 = (k, k + n_dims // 2) if neox else (2 * k, 2 * k + 1)
            j0, j1 = j0 + n_offs, j1 + n_offs
            out[i3, i2, i1, j0] = r[j0] * c - r[j1] * s
            out[i3, i2, i1, j1] = r[j0] * s + r[j1] * c
    return out


ROPE_CASES = [
    # n_dims, mode, freq_base, freq_scale, ext_factor, attn_factor, ne0
    (16, 0, 10000.0, 1.0, 0.0, 1.0, 16),
    (8, 0, 10000.0, 1.0, 0.0, 1.0, 16),  # normal mode: the first n_dims turn, the rest is copied (today's ggml)
    (16, 2, 10000.0, 1.0, 0.0, 1.0, 16),
    (8, 2, 10000.0, 1.0, 0.0, 1.0, 12),  # NeoX: the first n_dims turn, the rest is copied
    (16, 0, 500000.0, 0.25, 0.0, 1.0, 16),
    (16, 0, 10000.0, 0.25, 1.0, 1.0, 16),  # YaRN
    (16, 2, 10000.0, 0.5, 0.5, 0.9, 16),  # YaRN, NeoX
]


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope(type: GGMLType, case: tuple, rng: np.random.Generator) -> None:
    n_dims, mode, base, fscale, ext, attn, ne0 = case
    n_orig, beta_fast, beta_slow = 64, 32.0, 1.0
    x = rng.standard_normal((1, 5, 3, ne0)).astype(np.float32)  # [ne0, n_head=3, n_tokens=5]
    positions = np.array([0, 1, 7, 30, 100], np.int32)
    ctx = new_ctx()
    t = permuted(ctx, type, x)
    tp = tensor(ctx, I32, positions)
    node = ctx.rope_custom(t, tp, n_dims, mode, n_orig, base, fscale, ext, attn, beta_fast, beta_slow)
    want = rope_ref(stored(type, x), positions, n_dims, mode, n_orig, base, fscale, ext, attn, beta_fast, beta_slow)
    assert_close(run(node), stored(type, want), type, atol=2e-5 if type == F32 else 2e-3)


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_offset_and_frequency_factors(mode: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 4, 2, 24)).astype(np.float32)
    positions = np.array([3, 4, 5, 60], np.int32)
    ff = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    ctx = new_ctx()
    t, tp = tensor(ctx, F32, x), tensor(ctx, I32, positions)
    node = ops.rope_set_offset(ctx.rope_ext(t, tp, tensor(ctx, F32, ff), 8, mode, 64, 10000.0, 1.0, 0.0, 1.0,
                                            32.0, 1.0), 6)
    # the factors divide pair k's angle: the reference with base^(-2k/n) / ff[k] is base' per pair; do it by hand
    want = x.astype(np.float64).copy()
    for (i3, i2, i1), r in rows(x.astype(np.float64)):
        for k in range(4):
            theta = positions[i2] * 10000.0 ** (-2.0 * k / 8) / ff[k]
            c, s = math.cos(theta), math.sin(theta)
            j0, j1 = (6 + k, 6 + k + 4) if mode else (6 + 2 * k, 6 + 2 * k + 1)
            want[i3, i2, i1, j0] = r[j0] * c - r[j1] * s
            want[i3, i2, i1, j1] = r[j0] * s + r[j1] * c
    assert_close(run(node), want, F32, atol=2e-5)


def test_rope_inplace(rng: np.random.Generator) -> None:
    x = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    positions = np.array([3, 4, 5, 6], np.int32)
    ctx = new_ctx()
    t = tensor(ctx, F32, x)
    node = ctx.view_tensor(t)
    node.op, node.src[0], node.src[1] = GGMLOp.ROPE, t, tensor(ctx, I32, positions)
    node.set_op_params([0, 8, 2, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 0, 0, 0, 0, 0])  # today's 16 words
    run(node)
    want = rope_ref(x, positions, 8, 2, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert_close(t.numpy(), want, F32, atol=2e-5)


def _angles_ref(p: RopeParams, n_pairs: int, positions: np.ndarray, ff: np.ndarray | None) -> np.ndarray:
    """The angles of ggml's rope cache in float32 numpy, before cosf/sinf: theta_scale's running product per
    pair's stream and power, over the frequency factor, times freq_scale, YaRN's ramp mixed in."""
    f32 = np.float32
    theta_scale = powf(f32(p.freq_base), f32(-2.0) / f32(p.n_dims))
    stream, power = rope_theta_sources(p, n_pairs)
    n_tok = positions.shape[1]
    theta = np.empty((n_tok, n_pairs), f32)
    for j in np.unique(stream):
        run_ = np.empty((n_tok, int(power.max(initial=0)) + 1), f32)
        run_[:, 0] = positions[j]
        run_[:, 1:] = theta_scale
        np.cumprod(run_, axis=1, out=run_)
        theta[:, stream == j] = run_[:, power[stream == j]]
    if ff is not None:
        theta /= ff[:n_pairs].astype(f32)
    ang = theta * f32(p.freq_scale)
    if p.ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
        y = (np.arange(n_pairs, dtype=f32) - f32(low)) / f32(max(0.001, high - low))
        ramp = ((1 - np.clip(y, 0, 1)) * f32(p.ext_factor)).astype(f32)
        ang = ang * (1 - ramp) + theta * ramp
    return ang.astype(f32)


@pytest.mark.parametrize("mode", [0, 2, 8, 24, 40])
@pytest.mark.parametrize("ext_factor", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("factors", [False, True])
def test_rope_angles_are_the_float32_formula_s(mode: int, ext_factor: float, factors: bool,
                                               rng: np.random.Generator) -> None:
    """The compiled angles (norm.rope_cos_sin) of every mode, YaRN on or off, with or without frequency factors, are
    the float32 formula's bit for bit: cos and sin of the reference angles by the same libm cosf/sinf, times
    mscale."""
    sections = (4, 6, 6, 0) if mode & 8 else (0, 0, 0, 0)
    p = RopeParams(n_dims=64, mode=mode, n_ctx_orig=4096, freq_base=500000.0, freq_scale=0.25, ext_factor=ext_factor,
                   attn_factor=0.7, beta_fast=32.0, beta_slow=1.0, sections=sections)
    positions = rng.integers(0, 100000, (4 if mode & 8 else 1, 9)).astype(np.int32)
    ff = (rng.random(32) * 4 + 0.5).astype(np.float32) if factors else None
    c, s = norm.rope_cos_sin(p, 32, positions, ff)
    ang = _angles_ref(p, 32, positions, ff)
    want_c, want_s = np.empty_like(ang), np.empty_like(ang)
    norm._libm_cos_sin(ang, want_c, want_s)
    mscale = np.float32(0.7)
    if ext_factor:
        mscale = np.float32(mscale * np.float32(1.0 + 0.1 * math.log(1.0 / 0.25)))
    assert np.array_equal(c.view(np.uint32), (want_c * mscale).view(np.uint32))
    assert np.array_equal(s.view(np.uint32), (want_s * mscale).view(np.uint32))


def test_rope_rejects_unknown_modes_and_bad_dims() -> None:
    ctx = new_ctx()
    t = ctx.new_tensor_3d(F32, 8, 2, 3)
    tp = tensor(ctx, I32, np.arange(3, dtype=np.int32))
    glm = manual_node(ctx, GGMLOp.ROPE, [t, tp], [0, 8, 4, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0])  # 2023's GLM
    assert not norm.supports(glm)
    with pytest.raises(GGMLError, match="mode 4 is not one of"):
        compile_node(glm)
    odd = manual_node(ctx, GGMLOp.ROPE, [t, tp], [0, 7, 0, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0])
    with pytest.raises(GGMLError, match="n_dims"):
        compile_node(odd)
    no_sections = manual_node(ctx, GGMLOp.ROPE, [t, tensor(ctx, I32, np.arange(12, dtype=np.int32))],
                              [0, 8, 8, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0])  # MROPE without sections
    assert not norm.supports(no_sections)


def test_rope_frequency_factors_cover_every_turned_pair(rng: np.random.Generator) -> None:
    """VISION turns n_dims pairs and reads a factor for each: fewer factors (ggml's graph check asks n_dims/2) are a
    ShapeError naming the count before anything is read, not a read past the tensor; enough of them compute."""
    x = rng.standard_normal((1, 3, 2, 8)).astype(np.float32)  # VISION: ne0 = 2 n_dims
    words = [0, 4, 24, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 1, 1, 0, 0, 0]
    for n_factors, ok in ((2, False), (4, True)):
        ctx = new_ctx()
        t, tp = tensor(ctx, F32, x), tensor(ctx, I32, np.arange(12, dtype=np.int32))
        ff = tensor(ctx, F32, np.ones(n_factors, np.float32))
        node = manual_node(ctx, GGMLOp.ROPE, [t, tp, ff], words)
        if ok:
            assert np.all(np.isfinite(run(node)))
        else:
            with pytest.raises(ShapeError, match="one per turned pair, at least 4"):
                compile_node(node)


def test_prepared_nodes_read_new_inputs_on_each_run(rng: np.random.Generator) -> None:
    """A compute function prepared once must see positions, masks and data written after prepare."""
    x = rng.standard_normal((1, 3, 2, 8)).astype(np.float32)
    ctx = new_ctx()
    t, tp = tensor(ctx, F32, x), tensor(ctx, I32, np.zeros(3, np.int32))
    rope = ctx.rope_custom(t, tp, 8, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    s = tensor(ctx, F32, np.zeros((2, 8), np.float32))
    m = tensor(ctx, F32, np.zeros((2, 8), np.float32))
    sm = ctx.soft_max_ext(s, m, 1.0)
    f_rope, f_sm = compile_node(rope), compile_node(sm)
    for _ in range(2):
        positions = rng.integers(0, 50, 3).astype(np.int32)
        tp.numpy()[...] = positions
        sv, mv = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)
        s.numpy()[...] = sv
        m.numpy()[...] = mv
        f_rope()
        f_sm()
        want = rope_ref(x, positions, 8, 0, 64, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        assert_close(rope.numpy(), want, F32, atol=2e-5)
        want_sm = soft_max_ref(sv.reshape(1, 1, 2, 8), mv, 1.0)
        assert_close(sm.numpy(), want_sm, F32, atol=1e-6)
