"""CPU kernels of NORM, RMS_NORM, GROUP_NORM, SOFT_MAX, DIAG_MASK_INF/ZERO and ROPE on F32 and F16 (in f32 scratch),
in ggml's arithmetic (DESIGN.md, "Norms, softmax and RoPE")."""

from __future__ import annotations

import functools
import math
import weakref

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    noop,
    require_types,
    same_memory,
    scratch,
)
from pyggml.backends.cpu.kernels.simd_math import (
    expf_inplace,
    host_lanes,
    row_max,
    softmax_exp_row,
    softmax_exp_rows,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import fma_f32
from pyggml.core.errors import ArgumentError, GGMLError, ShapeError
from pyggml.core.ops.params import DiagMaskParams, GroupNormParams, NormParams, RopeParams, SoftMaxParams
from pyggml.core.rope import (  # shared with other backends' kernels
    alibi_slopes,
    powf,
    rope_check,
    rope_pairs,
    rope_theta_sources,
    rope_yarn_corr_dims,
)
from pyggml.core.tensor import (
    GGML_ROPE_TYPE_MROPE,
    GGMLOp,
    Tensor,
)
from pyggml.core.types import GGMLType


def _src0(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None]) -> np.ndarray:
    require_types(node, FLOAT_TYPES, node, node.src[0])
    x = srcs[0]
    assert x is not None
    if x.shape != dst.shape:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 ne {list(x.shape[::-1])} "
                         f"and dst ne {list(dst.shape[::-1])} differ")
    return x


# --- NORM, RMS_NORM, GROUP_NORM ---


def norm_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Each row: (x - mean) / sqrt(variance + eps) (NormParams)."""
    x = _src0(node, dst, srcs)
    eps = np.float32(NormParams.of(node).eps)
    if dst.size == 0:
        return noop
    n = np.float32(x.shape[3])
    (t,) = scratch(params, x.shape)

    def run() -> None:
        mean = np.add.reduce(x, axis=-1, dtype=F32, keepdims=True)
        mean /= n
        np.subtract(x, mean, out=t, dtype=F32)
        var = np.vecdot(t, t)[..., None]
        var /= n
        var += eps
        np.sqrt(var, out=var)
        np.reciprocal(var, out=var)
        np.multiply(t, var, out=dst)

    return run


@njit(nogil=True, cache=True, inline="always", error_model="numpy")  # a zero sum with eps 0: C's 1/0, inf
def _rms_scale(total, n, eps):
    mean = np.float32(total / n)
    return np.float32(1.0) / np.float32(math.sqrt(mean + eps))


@njit(nogil=True, cache=True, error_model="numpy")
def _rms_scales(x, eps, out):
    """out[..., 0] = 1.0f / sqrtf((float)(sum / n) + eps) per row of x, the squares summed in double in order,
    4 rows at a time (each its own chain of adds)."""
    n = x.shape[3]
    n1 = x.shape[2]
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            i1 = 0
            while i1 + 4 <= n1:
                t0 = t1 = t2 = t3 = 0.0
                for i0 in range(n):
                    a = x[i3, i2, i1, i0]
                    b = x[i3, i2, i1 + 1, i0]
                    c = x[i3, i2, i1 + 2, i0]
                    d = x[i3, i2, i1 + 3, i0]
                    t0 += np.float64(a * a)
                    t1 += np.float64(b * b)
                    t2 += np.float64(c * c)
                    t3 += np.float64(d * d)
                out[i3, i2, i1, 0] = _rms_scale(t0, n, eps)
                out[i3, i2, i1 + 1, 0] = _rms_scale(t1, n, eps)
                out[i3, i2, i1 + 2, 0] = _rms_scale(t2, n, eps)
                out[i3, i2, i1 + 3, 0] = _rms_scale(t3, n, eps)
                i1 += 4
            for i in range(i1, n1):
                total = 0.0
                for i0 in range(n):
                    v = x[i3, i2, i, i0]
                    total += np.float64(v * v)
                out[i3, i2, i, 0] = _rms_scale(total, n, eps)


def rms_norm_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Each row: x / sqrt(mean(x^2) + eps) (NormParams), as ggml: x times the f32 scale of `_rms_scales`."""
    x = _src0(node, dst, srcs)
    eps = np.float32(NormParams.of(node).eps)
    if dst.size == 0:
        return noop
    t = None
    if x.dtype != F32:
        (t,) = scratch(params, x.shape)
    scale = np.empty(x.shape[:3] + (1,), F32)

    def run() -> None:
        xf = x
        if t is not None:
            np.copyto(t, x)
            xf = t
        _rms_scales(xf, eps, scale)
        np.multiply(xf, scale, out=dst)

    if t is not None or dst.dtype != F32 or (np.may_share_memory(x, dst) and not same_memory(x, dst)):
        return run
    return graph_runner.with_split_step(run, _rms_norm_job(), [], [x, dst, np.array([eps], F32)])


@njit(nogil=True, cache=True, error_model="numpy")
def rms_norm_step(p, ith, nth):
    """Thread ith's rows of RMS_NORM: each row's scale as `_rms_scales`' (the squares in double, in order), then
    dst = x * scale in f32."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (3 * v,))
    x, dst, eps = graph_runner.view_f32(d, 0), graph_runner.view_f32(d, v), graph_runner.view_f32(d, 2 * v)[0, 0, 0, 0]
    n = x.shape[3]
    r0, r1 = graph_runner.share_of(x, ith, nth)
    for r in range(r0, r1):
        xr, dr = graph_runner.row_at(x, r), graph_runner.row_at(dst, r)
        total = 0.0
        for i0 in range(n):
            u = xr[i0]
            total += np.float64(u * u)
        scale = _rms_scale(total, n, eps)
        for i0 in range(n):
            dr[i0] = xr[i0] * scale
    return 0


@functools.cache
def _rms_norm_job() -> int:
    return graph_runner.split_job(rms_norm_step)


def _normalize_groups(v: np.ndarray, eps: np.float32) -> None:
    """In place over the last axis of v (N, groups, elements): (v - mean) / sqrt(variance + eps)."""
    n = np.float32(v.shape[-1])
    mean = np.add.reduce(v, axis=-1, keepdims=True)
    mean /= n
    v -= mean
    var = np.vecdot(v, v)[..., None]
    var /= n
    var += eps
    np.sqrt(var, out=var)
    np.reciprocal(var, out=var)
    v *= var


def group_norm_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """Normalize groups of ceil(ne2 / n_groups) channels (dim 2) over dims 0, 1 and the group, per ne3."""
    x = _src0(node, dst, srcs)
    p = GroupNormParams.of(node)
    n_groups = p.n_groups
    if n_groups < 1:
        raise ArgumentError(f"CPU GROUP_NORM '{node.name}': n_groups must be >= 1, got {n_groups}")
    eps = np.float32(p.eps)
    if dst.size == 0:
        return noop
    n, c, h, w = x.shape
    per_group = (c + n_groups - 1) // n_groups
    full = c // per_group
    rest = c - full * per_group
    (t,) = scratch(params, x.shape)
    pieces = [t[:, : full * per_group].reshape(n, full, per_group * h * w)]
    if rest:
        pieces.append(t[:, full * per_group:].reshape(n, 1, rest * h * w))

    def run() -> None:
        np.copyto(t, x)
        for v in pieces:
            _normalize_groups(v, eps)
        np.copyto(dst, t)

    return run


# --- SOFT_MAX, DIAG_MASK ---


def _mask_rows(node: Tensor, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mask's rows for x's rows, checked to fit: same ne0, its dims 2 and 3 dividing x's (ggml tiles them)."""
    m3, m2, m1, m0 = mask.shape
    n3, n2, n1, n0 = x.shape
    if m0 != n0 or m1 < n1 or m2 == 0 or m3 == 0 or n2 % m2 or n3 % m3:
        raise ShapeError(f"CPU SOFT_MAX '{node.name}': mask ne {list(mask.shape[::-1])} does not fit src "
                         f"ne {list(x.shape[::-1])} (same ne0, ne1 at least src's, ne2 and ne3 dividing src's)")
    return mask[:, :, :n1, :]


def soft_max_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Each row: softmax(x * scale + slope * mask) (ALiBi where max_bias > 0), with an extra logit per head from
    the optional sinks (src[2]); the mask (src[1]) is optional."""
    x = _src0(node, dst, srcs)
    require_types(node, FLOAT_TYPES, node.src[1])
    p = SoftMaxParams.of(node)
    scale = np.float32(p.scale)
    if dst.size == 0:
        return noop
    ne2, ne0 = x.shape[1], x.shape[3]
    mask = srcs[1]
    rows = _mask_rows(node, x, mask) if mask is not None else _NO_MASK
    slopes = alibi_slopes(ne2, p.max_bias)  # all 1 without ALiBi
    sinks_t, sink_data = node.src[2], srcs[2] if len(srcs) > 2 else None
    sinks = _NO_SINKS
    if sinks_t is not None and sink_data is not None:
        if sinks_t.type != GGMLType.F32 or sinks_t.ne[0] < ne2:
            raise ShapeError(f"CPU SOFT_MAX '{node.name}': sinks must be F32, one per head (ne2={ne2}), got "
                             f"{sinks_t.type.name} {sinks_t.ne}")
        sinks = sink_data.reshape(-1)[:ne2]  # a view: read when run
    # x86: gcc contracts ggml's `wp[i] += slope*mask[i]` into an FMA (exact either way when slope is 1)
    fma = p.max_bias > 0.0 and params.numerics == "x86"
    lanes = host_lanes(params.numerics)
    # F16 and strided rows go through f32 scratch (exact widening; dst rounded once; the sums read adjacent floats)
    direct_out = dst.dtype == F32 and dst.strides[3] == 4
    t, xs, out, m32 = scratch(params, (ne0,), x.shape if x.dtype != F32 else (0,),
                              (0,) if direct_out else dst.shape, rows.shape if rows.dtype != F32 else (0,))
    x_f32 = x if x.dtype == F32 else xs
    out_f32 = dst if direct_out else out
    mask_f32 = rows if rows.dtype == F32 else m32

    def run() -> None:
        if x_f32 is not x:
            np.copyto(xs, x)
        if mask_f32 is not rows:
            np.copyto(m32, rows)
        _soft_max_rows(x_f32, scale, mask_f32, slopes, fma, sinks, out_f32, t, lanes)
        if out_f32 is not dst:
            np.copyto(dst, out, casting="same_kind")

    if x_f32 is not x or mask_f32 is not rows or out_f32 is not dst or \
            (np.may_share_memory(x, dst) and not same_memory(x, dst)):
        return run
    consts = np.array([scale], F32)
    views = [x, mask_f32, slopes.astype(F32), sinks, dst, t, consts]
    desc = graph_runner.descriptor([int(fma), lanes], views)
    if desc is None:
        return run
    step = graph_runner.Step(graph_runner.ALONE, _soft_max_job(), desc, keep=tuple(views))
    return graph_runner.with_steps(run, (step,))


@njit(nogil=True, cache=True, error_model="numpy")
def soft_max_step(p, shared):
    """_soft_max_rows on the step's operands (thread 0 alone)."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (2 + 7 * v,))
    x, mask, dst = graph_runner.view_f32(d, 2), graph_runner.view_f32(d, 2 + v), graph_runner.view_f32(d, 2 + 4 * v)
    slopes, sinks = graph_runner.view_f32(d, 2 + 2 * v)[0, 0, 0], graph_runner.view_f32(d, 2 + 3 * v)[0, 0, 0]
    t, scale = graph_runner.view_f32(d, 2 + 5 * v)[0, 0, 0], graph_runner.view_f32(d, 2 + 6 * v)[0, 0, 0, 0]
    _soft_max_rows(x, scale, mask, slopes, d[0] != 0, sinks, dst, t, d[1])
    return 0


@functools.cache
def _soft_max_job() -> int:
    return graph_runner.alone_job(soft_max_step)


_NO_MASK = np.zeros((0, 0, 0, 0), F32)
_NO_SINKS = np.zeros(0, F32)


@njit(nogil=True, cache=True, error_model="numpy")
def _soft_max_rows(x, scale, mask, slopes, fma, sinks, out, t, lanes):
    """ggml_compute_forward_soft_max_f32 row by row (`fma`: slope * mask fused as gcc does). mask: 4-D f32 or
    shape (0, 0, 0, 0); sinks: one per head or empty."""
    n3, n2, n1, n0 = x.shape
    m3, m2 = max(mask.shape[0], 1), max(mask.shape[1], 1)
    has_mask = mask.shape[3] > 0
    has_sinks = sinks.shape[0] > 0
    for i3 in range(n3):
        for i2 in range(n2):
            slope = slopes[i2]
            for i1 in range(n1):
                xr = x[i3, i2, i1]
                orow = out[i3, i2, i1]
                for i in range(n0):
                    t[i] = xr[i] * scale
                if has_mask:
                    mr = mask[i3 % m3, i2 % m2, i1]
                    if fma:
                        for i in range(n0):
                            t[i] = fma_f32(slope, mr[i], t[i])
                    else:
                        for i in range(n0):
                            t[i] = t[i] + slope * mr[i]
                mx = row_max(t, n0)
                if has_sinks:
                    mx = mx if mx > sinks[i2] else sinks[i2]
                total = softmax_exp_row(t, orow, mx, lanes)
                if has_sinks:
                    total += np.float64(np.float32(math.exp(sinks[i2] - mx)))
                inv = np.float32(1.0 / total)
                for i in range(n0):
                    orow[i] = orow[i] * inv


def softmax_rows(t: np.ndarray, mask: np.ndarray | None, sink4: np.ndarray | None, out: np.ndarray, lanes: int,
                 empty_rows_zero: bool = False) -> None:
    """out = ggml's softmax of each row of t + mask (t overwritten), with one more logit per head from sink4 that
    takes weight but has no value; FLASH_ATTN_EXT's weights too (`empty_rows_zero`: a row of -inf weighs nothing)."""
    if mask is not None:
        np.add(t, mask, out=t, dtype=F32)
    mx = np.max(t, axis=-1, keepdims=True)
    if sink4 is not None:
        np.maximum(mx, sink4, out=mx)
    if empty_rows_zero:
        mx[np.isneginf(mx)] = 0.0  # every exp(-inf - 0) = 0, so the sum is 0
    s = np.empty(mx.shape, np.float64)
    softmax_exp_rows(t.reshape(-1, t.shape[-1]), mx.reshape(-1), s.reshape(-1), lanes)
    if sink4 is not None:
        e = np.ascontiguousarray(np.broadcast_to(sink4, mx.shape) - mx, dtype=F32)
        expf_inplace(e)
        s += e.astype(np.float64)
    if empty_rows_zero:
        s[s == 0.0] = np.inf  # reciprocal 0: the row's weights (all 0) stay 0
    np.reciprocal(s, out=s)
    np.multiply(t, s.astype(F32), out=out)


def _diag_mask(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], value: float) -> Compute:
    """dst = src0 with element (i0, i1) of every matrix set to `value` where i0 > n_past + i1."""
    x = _src0(node, dst, srcs)
    n_past = DiagMaskParams.of(node).n_past
    if dst.size == 0:
        return noop
    ne1, ne0 = x.shape[2], x.shape[3]
    mask = np.arange(ne0)[None, :] > n_past + np.arange(ne1)[:, None]
    copy = not same_memory(dst, x)
    v = np.float32(value)

    def run() -> None:
        if copy:
            np.copyto(dst, x)
        np.copyto(dst, v, where=mask)

    return run


def diag_mask_inf_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                         params: ComputeParams) -> Compute:
    return _diag_mask(node, dst, srcs, -math.inf)


def diag_mask_zero_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                          params: ComputeParams) -> Compute:
    return _diag_mask(node, dst, srcs, 0.0)


# --- ROPE ---


@njit(nogil=True, cache=True)
def _libm_cos_sin(ang, c, s):
    """c, s = cosf(ang), sinf(ang) elementwise by libm, as ggml (not numpy's float32 SIMD cos/sin)."""
    a, cf, sf = ang.reshape(-1), c.reshape(-1), s.reshape(-1)
    for i in range(a.shape[0]):
        cf[i] = math.cos(a[i])
        sf[i] = math.sin(a[i])


@njit(nogil=True, cache=True)
def _rotate_fma(x0, x1, c, s, d0, d1):
    """ggml's rotate_pairs as gcc contracts it into FMAs on x86. x0, x1, d0, d1 (ne3, ne2, ne1, pairs); c, s
    (ne2, pairs)."""
    for i3 in range(x0.shape[0]):
        for i2 in range(x0.shape[1]):
            for i1 in range(x0.shape[2]):
                for k in range(x0.shape[3]):
                    a = x0[i3, i2, i1, k]
                    b = x1[i3, i2, i1, k]
                    cc = c[i2, k]
                    ss = s[i2, k]
                    d0[i3, i2, i1, k] = fma_f32(a, cc, -(b * ss))
                    d1[i3, i2, i1, k] = fma_f32(a, ss, b * cc)


def _c_div(a: float, b: float) -> float:
    """a / b as C divides doubles: a zero divisor gives an infinity (or NaN), not an error."""
    with np.errstate(all="ignore"):
        return float(np.float64(a) / np.float64(b))


def _c_log(x: float) -> float:
    """log(x) as C's: -inf at 0, NaN below 0 or at NaN, not an error."""
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def rope_cos_sin(p: RopeParams, n_pairs: int, positions: np.ndarray,
                 freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (times mscale) of each token's angle for each pair, f32 (tokens, n_pairs), as ggml's rope
    cache; `positions` (streams, tokens): one stream, or multi-rope's four."""
    c = np.empty((positions.shape[1], n_pairs), F32)
    s = np.empty((positions.shape[1], n_pairs), F32)
    rope_cos_sin_into(p, n_pairs, positions, freq_factors, c, s)
    return c, s


def rope_cos_sin_into(p: RopeParams, n_pairs: int, positions: np.ndarray, freq_factors: np.ndarray | None,
                      c: np.ndarray, s: np.ndarray) -> None:
    """rope_cos_sin into c and s (tokens, n_pairs)."""
    theta_scale, stream, power, low, span, mscale = _angle_constants(p, n_pairs)
    ff = _NO_FACTORS if freq_factors is None else np.ascontiguousarray(freq_factors[:n_pairs], dtype=F32)
    _rope_angles(positions, stream, power, theta_scale, ff, np.float32(p.freq_scale), np.float32(p.ext_factor), low,
                 span, mscale, c, s)


_NO_FACTORS = np.zeros(0, F32)


@functools.lru_cache(maxsize=64)
def _angle_constants(p: RopeParams, n_pairs: int) -> tuple[np.float32, np.ndarray, np.ndarray, np.float32,
                                                            np.float32, np.float32]:
    """What a rope's angles take besides the positions: theta_scale (libm's powf, as ggml), each pair's stream
    and power of it, YaRN's ramp start and width, and mscale."""
    f32 = np.float32
    theta_scale = powf(f32(p.freq_base), f32(-2.0) / f32(p.n_dims))
    stream, power = rope_theta_sources(p, n_pairs)
    mscale = f32(p.attn_factor)
    low, span = f32(0.0), f32(1.0)
    if p.ext_factor != 0.0:
        lo, hi = rope_yarn_corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
        low, span = f32(lo), f32(max(0.001, hi - lo))
        mscale = f32(mscale * f32(1.0 + 0.1 * _c_log(_c_div(1.0, p.freq_scale))))
    return theta_scale, stream.astype(np.int64), power.astype(np.int64), low, span, mscale


@njit(nogil=True, cache=True)
def _rope_angles(positions, stream, power, theta_scale, ff, freq_scale, ext_factor, low, span, mscale, c, s):
    """c, s = cosf, sinf of each token's angle for each pair, times mscale: theta = position * theta_scale^power
    as ggml's running product, over the frequency factor, times freq_scale, YaRN's ramp mixed in; float32
    throughout, as ggml's rope cache."""
    one, zero = np.float32(1.0), np.float32(0.0)
    n_tok, n_pairs = c.shape
    n_streams = positions.shape[0]
    top = 0
    for k in range(n_pairs):
        top = max(top, power[k])
    run = np.empty((n_streams, top + 1), np.float32)
    for t in range(n_tok):
        for j in range(n_streams):
            v = np.float32(positions[j, t])
            run[j, 0] = v
            for q in range(1, top + 1):
                v = v * theta_scale
                run[j, q] = v
        for k in range(n_pairs):
            theta = run[stream[k], power[k]]
            if ff.shape[0]:
                theta = theta / ff[k]
            ang = theta * freq_scale
            if ext_factor != zero:
                y = (np.float32(k) - low) / span
                if y < zero:
                    y = zero
                elif y > one:
                    y = one
                ramp = (one - y) * ext_factor
                ang = ang * (one - ramp) + theta * ramp
            s[t, k] = ang
    _libm_cos_sin(s, c, s)  # element by element: each angle is read before its sine replaces it
    for t in range(n_tok):
        for k in range(n_pairs):
            c[t, k] = c[t, k] * mscale
            s[t, k] = s[t, k] * mscale


# the last angles computed: every layer's Q and K ropes use the same positions, so a step computes them once
_COS_SIN: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
_COS_SIN_KEEP = 8


def _cached_cos_sin(p: RopeParams, n_pairs: int, positions: np.ndarray,
                    freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """rope_cos_sin, remembered by its inputs' values (read-only results)."""
    key = (p, n_pairs, positions.shape, positions.tobytes(),
           None if freq_factors is None else freq_factors[:n_pairs].tobytes())
    hit = _COS_SIN.get(key)
    if hit is None:
        if len(_COS_SIN) >= _COS_SIN_KEEP:
            _COS_SIN.pop(next(iter(_COS_SIN)))
        c, s = rope_cos_sin(p, n_pairs, positions, freq_factors)
        c.flags.writeable = False
        s.flags.writeable = False
        hit = _COS_SIN[key] = (c, s)
    return hit


class RunAngles:
    """The cos and sin a graph runner's ROPE steps read, filled before the run (positions are inputs): one per
    positions tensor and parameters, shared by every layer's Q and K ropes, so a run fills it once."""

    def __init__(self, p: RopeParams, n_pairs: int, positions: np.ndarray, freq_factors: np.ndarray | None) -> None:
        self.p, self.n_pairs, self.positions, self.freq_factors = p, n_pairs, positions, freq_factors
        self.c = np.empty((positions.shape[1], n_pairs), F32)
        self.s = np.empty((positions.shape[1], n_pairs), F32)

    def fill(self) -> None:
        rope_cos_sin_into(self.p, self.n_pairs, self.positions, self.freq_factors, self.c, self.s)


# the live RunAngles by what they are computed from (positions and frequency factors by their memory)
_RUN_ANGLES: weakref.WeakValueDictionary[tuple[object, ...], RunAngles] = weakref.WeakValueDictionary()


def _memory_key(a: np.ndarray | None) -> tuple[object, ...] | None:
    return None if a is None else (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _run_angles(p: RopeParams, n_pairs: int, positions: np.ndarray, freq_factors: np.ndarray | None) -> RunAngles:
    key = (p, n_pairs, _memory_key(positions), _memory_key(freq_factors))
    angles = _RUN_ANGLES.get(key)
    if angles is None:
        angles = _RUN_ANGLES[key] = RunAngles(p, n_pairs, positions, freq_factors)
    return angles


def rope_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """ROPE in modes NORMAL, NEOX, MROPE, IMROPE and VISION (positions src[1], frequency factors src[2]); the
    elements outside the turned ones are copied."""
    return _rope(node, dst, srcs, params, forward=True)


def rope_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                     params: ComputeParams) -> Compute:
    """ROPE_BACK: ROPE's rotation inverted (its transpose: the sines negated, as ggml's sin_sign = -1)."""
    return _rope(node, dst, srcs, params, forward=False)


def _rope(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams,
          forward: bool) -> Compute:
    x = _src0(node, dst, srcs)
    p = RopeParams.of(node)
    ne3, ne2, ne1, ne0 = x.shape
    rope_check(node, p, ne0, ne2, "CPU")
    ff_t = node.src[2]
    if ff_t is not None and 0 in ff_t.ne[1:]:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': frequency factors {ff_t.ne} hold none")
    if p.mode & GGML_ROPE_TYPE_MROPE and min(p.sections) < 0:
        raise ArgumentError(f"CPU {node.op.name} '{node.name}': multi-rope sections {list(p.sections)} must not be "
                            "negative")
    if dst.size == 0:
        return noop
    pairs = rope_pairs(p, ne0)
    x0, x1, d0, d1 = x[..., pairs.first], x[..., pairs.second], dst[..., pairs.first], dst[..., pairs.second]
    copies = [] if same_memory(dst, x) else [(dst[..., sl], x[..., sl]) for sl in pairs.kept]
    a, b, t = scratch(params, x0.shape, x0.shape, x0.shape)
    pos = srcs[1]
    assert pos is not None
    n_streams = 4 if p.mode & GGML_ROPE_TYPE_MROPE else 1
    positions = pos.reshape(-1)[: n_streams * ne2].reshape(n_streams, ne2)  # a view: read at run time
    ff = srcs[2] if node.src[2] is not None else None
    freq_factors = ff.reshape(-1) if ff is not None else None

    # x86 numerics, F32: the rotation's products as gcc contracts them into FMAs (see _rotate_fma)
    fused = params.numerics == "x86" and x.dtype == F32 and dst.dtype == F32

    def run() -> None:
        c, s = _cached_cos_sin(p, pairs.n_pairs, positions, freq_factors)
        if not forward:
            s = -s  # (the cached arrays are shared: never written)
        if fused:
            _rotate_fma(x0, x1, c, s, d0, d1)
            for d, src in copies:
                np.copyto(d, src)
            return
        c4 = c.reshape(1, ne2, 1, pairs.n_pairs)
        s4 = s.reshape(1, ne2, 1, pairs.n_pairs)
        np.multiply(x0, c4, out=a, dtype=F32)
        np.multiply(x1, s4, out=t, dtype=F32)
        np.subtract(a, t, out=a)
        np.multiply(x0, s4, out=b, dtype=F32)
        np.multiply(x1, c4, out=t, dtype=F32)
        np.add(b, t, out=b)
        np.copyto(d0, a)
        np.copyto(d1, b)
        for d, src in copies:
            np.copyto(d, src)

    if not (fused and forward) or copies or (np.may_share_memory(x, dst) and not same_memory(x, dst)):
        return run
    angles = _run_angles(p, pairs.n_pairs, positions, freq_factors)
    desc = graph_runner.descriptor([], [x0, x1, angles.c, angles.s, d0, d1])
    if desc is None:
        return run
    reads = (positions,) if freq_factors is None else (positions, freq_factors)
    step = graph_runner.Step(graph_runner.SPLIT, _rope_job(), desc, keep=(x0, x1, angles, d0, d1),
                             before=angles.fill, reads=reads)
    return graph_runner.with_steps(run, (step,))


@njit(nogil=True, cache=True)
def rope_step(p, ith, nth):
    """Thread ith's share of the rows (dim 1) of the fused rotation (_rotate_fma), angles given."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (6 * v,))
    x0, x1, d0, d1 = graph_runner.view_f32(d, 0), graph_runner.view_f32(d, v), graph_runner.view_f32(d, 4 * v), \
        graph_runner.view_f32(d, 5 * v)
    c, s = graph_runner.view_f32(d, 2 * v)[0, 0], graph_runner.view_f32(d, 3 * v)[0, 0]
    r0, r1 = graph_runner.thread_rows(x0.shape[2], ith, nth)
    if r0 < r1:
        _rotate_fma(x0[:, :, r0:r1], x1[:, :, r0:r1], c, s, d0[:, :, r0:r1], d1[:, :, r0:r1])
    return 0


@functools.cache
def _rope_job() -> int:
    return graph_runner.split_job(rope_step)


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.NORM: norm_kernel,
    GGMLOp.RMS_NORM: rms_norm_kernel,
    GGMLOp.GROUP_NORM: group_norm_kernel,
    GGMLOp.SOFT_MAX: soft_max_kernel,
    GGMLOp.DIAG_MASK_INF: diag_mask_inf_kernel,
    GGMLOp.DIAG_MASK_ZERO: diag_mask_zero_kernel,
    GGMLOp.ROPE: rope_kernel,
    GGMLOp.ROPE_BACK: rope_back_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: F32/F16 data (I32 positions and a known mode for ROPE)."""
    if node.op not in KERNELS or not all_float(node, node.src[0]):
        return False
    if node.op in (GGMLOp.ROPE, GGMLOp.ROPE_BACK):
        src0 = node.src[0]
        assert src0 is not None
        try:
            rope_check(node, RopeParams.of(node), src0.ne[0], src0.ne[2], "CPU")
        except GGMLError:
            return False
        return True
    if node.op == GGMLOp.SOFT_MAX:
        sinks = node.src[2]
        return all_float(node.src[1]) and (sinks is None or sinks.type == GGMLType.F32)
    return True
