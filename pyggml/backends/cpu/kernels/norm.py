"""CPU kernels: normalization and attention ops.

NORM, RMS_NORM, GROUP_NORM, SOFT_MAX (mask in src[1], scale in op_params[0]),
DIAG_MASK_INF/ZERO, ROPE (normal and NeoX modes with YaRN) and ALIBI, on F32
and F16 (computed in f32 scratch, stored in dst's type).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    collapse,
    ggml_broadcast,
    noop,
    require_types,
    same_memory,
    scratch,
)
from pyggml.core.errors import ArgumentError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

GROUP_NORM_EPS = 1e-6  # ggml of late 2023 fixes group_norm's eps at 1e-6f

ROPE_MODE_NEOX = 2
ROPE_MODE_GLM = 4


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
    """Each row: (x - mean) / sqrt(variance + eps), eps the f32 in op_params[0]."""
    x = _src0(node, dst, srcs)
    eps = np.float32(node.get_op_params_f32(0))
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


def rms_norm_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Each row: x / sqrt(mean(x^2) + eps), eps the f32 in op_params[0]."""
    x = _src0(node, dst, srcs)
    eps = np.float32(node.get_op_params_f32(0))
    if dst.size == 0:
        return noop
    n = np.float32(x.shape[3])
    t = None
    if x.dtype != F32:
        (t,) = scratch(params, x.shape)

    def run() -> None:
        xf = x
        if t is not None:
            np.copyto(t, x)
            xf = t
        scale = np.vecdot(xf, xf)[..., None]
        scale /= n
        scale += eps
        np.sqrt(scale, out=scale)
        np.reciprocal(scale, out=scale)
        np.multiply(xf, scale, out=dst)

    return run


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
    """Normalize groups of ceil(ne2 / n_groups) channels (dim 2) over dims 0, 1 and the group, per ne3.

    n_groups is op_params[0]; eps is 1e-6 as in ggml of late 2023, or the f32 in
    op_params[1] where a builder stores one (later ggml does).
    """
    x = _src0(node, dst, srcs)
    n_groups = node.get_op_params_i32(0)
    if n_groups < 1:
        raise ArgumentError(f"CPU GROUP_NORM '{node.name}': n_groups must be >= 1, got {n_groups}")
    eps = np.float32(node.get_op_params_f32(1) if node.get_op_params_i32(1) != 0 else GROUP_NORM_EPS)
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


def _mask_fn(node: Tensor, t: np.ndarray, mask: np.ndarray) -> Compute:
    """A function adding the mask to t (f32 scratch, src's shape): flat row r gets mask row r % ne11, as ggml.

    When ne11 divides ne01 that is plain tiling (a broadcast view); otherwise the
    rows are gathered at run time.
    """
    if mask.shape[3] != t.shape[3]:
        raise ShapeError(f"CPU SOFT_MAX '{node.name}': mask rows have {mask.shape[3]} elements, "
                         f"src rows {t.shape[3]}")
    if all(n % m == 0 for n, m in zip(t.shape, mask.shape, strict=True)):
        (tb,), mb = ggml_broadcast([t], mask)
        return functools.partial(np.add, tb, mb, out=tb, dtype=F32)
    if mask.shape[:2] != (1, 1):
        raise ShapeError(f"CPU SOFT_MAX '{node.name}': mask ne {list(mask.shape[::-1])} does not repeat "
                         f"to src ne {list(t.shape[::-1])}")
    m2 = mask[0, 0]
    which = (np.arange(t.shape[0] * t.shape[1] * t.shape[2]) % m2.shape[0]).reshape(t.shape[:3])

    def add_gathered() -> None:
        np.add(t, m2[which], out=t, dtype=F32)

    return add_gathered


def soft_max_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Each row: softmax(x * scale + mask), scale the f32 in op_params[0], the mask (optional) in src[1].

    Computed in f32 with exact exp; ggml of late 2023 rounds exp's argument and
    result through an f16 table, so its values differ by up to f16 rounding.
    """
    x = _src0(node, dst, srcs)
    require_types(node, FLOAT_TYPES, node.src[1])
    scale = np.float32(node.get_op_params_f32(0))
    if dst.size == 0:
        return noop
    (t,) = scratch(params, x.shape)
    mask = srcs[1]
    add_mask = _mask_fn(node, t, mask) if mask is not None else None

    def run() -> None:
        np.multiply(x, scale, out=t, dtype=F32)
        if add_mask is not None:
            add_mask()
        mx = np.max(t, axis=-1, keepdims=True)
        np.subtract(t, mx, out=t)
        np.exp(t, out=t)
        s = np.add.reduce(t, axis=-1, keepdims=True)
        np.reciprocal(s, out=s)
        np.multiply(t, s, out=dst)

    return run


def _diag_mask(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], value: float) -> Compute:
    """dst = src0 with element (i0, i1) of every matrix set to `value` where i0 > n_past + i1."""
    x = _src0(node, dst, srcs)
    n_past = node.get_op_params_i32(0)
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


def rope_yarn_corr_dims(n_dims: int, n_orig_ctx: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the first and last dims where YaRN ramps between interpolation and extrapolation."""
    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(n_dims - 1.0, end)


def rope_mode_supported(mode: int) -> bool:
    return not mode & ROPE_MODE_GLM


def rope_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Rotate pairs of each row by position-dependent angles (ggml_rope_custom / YaRN).

    op_params: [n_past, n_dims, mode, n_ctx, n_orig_ctx, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, xpos_base, xpos_down];
    positions (I32, one per ne2) in src[1]. Pair k turns by p * freq_base^(-2k/n_dims)
    (built by repeated f32 multiplication, as ggml does), mixed by YaRN's ramp when
    ext_factor != 0. Normal mode pairs (2k, 2k+1) over the whole row (as ggml of
    late 2023); NeoX mode (mode & 2) pairs (k, k + n_dims/2) over the first n_dims
    and copies the rest. NeoX follows later ggml's fixed formula: ggml of late
    2023 applied freq_scale twice and no ramp in that mode when YaRN was on.
    """
    x = _src0(node, dst, srcs)
    pos_t = node.src[1]
    pos = srcs[1]
    if pos_t is None or pos is None or pos_t.type != GGMLType.I32:
        raise UnsupportedTypeError(f"CPU ROPE '{node.name}': positions (src[1]) must be an I32 tensor")
    p_i = node.get_op_params_i32
    p_f = node.get_op_params_f32
    n_dims, mode, n_orig_ctx = p_i(1), p_i(2), p_i(4)
    freq_base, freq_scale, ext_factor, attn_factor = p_f(5), p_f(6), p_f(7), p_f(8)
    beta_fast, beta_slow, xpos_base, xpos_down = p_f(9), p_f(10), p_f(11), p_i(12) != 0
    if not rope_mode_supported(mode):
        raise UnsupportedTypeError(f"CPU ROPE '{node.name}': GLM mode (mode & 4) is not supported")
    ne3, ne2, ne1, ne0 = x.shape
    if n_dims <= 0 or n_dims % 2 or n_dims > ne0:
        raise ArgumentError(f"CPU ROPE '{node.name}': n_dims={n_dims} must be even, > 0 and <= ne0={ne0}")
    if not pos_t.is_vector() or pos_t.ne[0] < ne2:
        raise ShapeError(f"CPU ROPE '{node.name}': positions must be a vector of at least ne2={ne2}, "
                         f"got ne {pos_t.ne}")
    if dst.size == 0:
        return noop
    neox = bool(mode & ROPE_MODE_NEOX)
    n_pairs = n_dims // 2 if neox else ne0 // 2
    if neox:
        x0, x1 = x[..., : n_dims // 2], x[..., n_dims // 2: n_dims]
        d0, d1 = dst[..., : n_dims // 2], dst[..., n_dims // 2: n_dims]
    else:
        x0, x1 = x[..., 0: 2 * n_pairs: 2], x[..., 1: 2 * n_pairs: 2]
        d0, d1 = dst[..., 0: 2 * n_pairs: 2], dst[..., 1: 2 * n_pairs: 2]
    rest = None
    if neox and n_dims < ne0 and not same_memory(dst, x):
        rest = (dst[..., n_dims:], x[..., n_dims:])

    theta_scale = np.power(np.float32(freq_base), np.float32(-2.0) / np.float32(n_dims), dtype=F32)
    k = np.arange(n_pairs, dtype=F32)
    fs = np.float32(freq_scale)
    mscale = np.float32(attn_factor)
    ramp_mix = None
    if ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(n_dims, n_orig_ctx, freq_base, beta_fast, beta_slow)
        y = (k - np.float32(low)) / np.float32(max(0.001, high - low))
        ramp_mix = ((1 - np.clip(y, 0, 1)) * np.float32(ext_factor)).astype(F32)
        mscale = np.float32(mscale * np.float32(1.0 + 0.1 * math.log(1.0 / freq_scale)))
    zeta_base = None
    if xpos_base != 0.0 and not neox:
        zeta_base = ((2 * k + np.float32(0.4 * ne0)) / np.float32(1.4 * ne0)).astype(F32)

    theta = np.empty((ne2, n_pairs), F32)
    a, b, t = scratch(params, x0.shape, x0.shape, x0.shape)
    positions = pos[0, 0, 0, :ne2]  # a view: the positions are read at run time

    def run() -> None:
        # theta[p, k] = ((p * ts) * ts) ... k times, in f32 like ggml's running product
        theta[:, 0] = positions
        theta[:, 1:] = theta_scale
        np.cumprod(theta, axis=1, out=theta)
        ang = theta * fs
        if ramp_mix is not None:
            ang = ang * (1 - ramp_mix) + theta * ramp_mix
        c = np.cos(ang)
        s = np.sin(ang)
        c *= mscale
        s *= mscale
        if zeta_base is not None:
            zeta = np.power(zeta_base[None, :], (positions.astype(F32) / np.float32(xpos_base))[:, None])
            if xpos_down:
                zeta = 1 / zeta
            c *= zeta
            s *= zeta
        c4 = c.reshape(1, ne2, 1, n_pairs)
        s4 = s.reshape(1, ne2, 1, n_pairs)
        np.multiply(x0, c4, out=a, dtype=F32)
        np.multiply(x1, s4, out=t, dtype=F32)
        np.subtract(a, t, out=a)
        np.multiply(x0, s4, out=b, dtype=F32)
        np.multiply(x1, c4, out=t, dtype=F32)
        np.add(b, t, out=b)
        np.copyto(d0, a)
        np.copyto(d1, b)
        if rest is not None:
            np.copyto(rest[0], rest[1])

    return run


# --- ALIBI ---


def alibi_slopes(n_head: int, max_bias: float, count: int) -> np.ndarray:
    """ggml's ALiBi slope for each of `count` heads (k over ne2*ne3), in f32."""
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = np.power(np.float32(2.0), np.float32(-max_bias / n_log2), dtype=F32)
    m1 = np.power(np.float32(2.0), np.float32(-(max_bias / 2.0) / n_log2), dtype=F32)
    out = np.empty(count, F32)
    for k in range(count):
        if k < n_log2:
            out[k] = np.power(m0, np.float32(k + 1), dtype=F32)
        else:
            out[k] = np.power(m1, np.float32(2 * (k - n_log2) + 1), dtype=F32)
    return out


def alibi_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[i0, i1, i2, i3] = src0 + i0 * slope(head k = i3*ne2 + i2); op_params [n_past, n_head, max_bias f32]."""
    x = _src0(node, dst, srcs)
    n_head = node.get_op_params_i32(1)
    max_bias = node.get_op_params_f32(2)
    ne3, ne2, ne1, ne0 = x.shape
    if n_head != ne2:
        raise ArgumentError(f"CPU ALIBI '{node.name}': n_head={n_head} must equal ne2={ne2}")
    if dst.size == 0:
        return noop
    slopes = alibi_slopes(n_head, max_bias, ne2 * ne3).reshape(ne3, ne2, 1, 1)
    bias = np.arange(ne0, dtype=F32).reshape(1, 1, 1, ne0) * slopes  # i * m_k in f32, as ggml
    d, x, bias = collapse(dst, x, np.broadcast_to(bias, dst.shape))
    return functools.partial(np.add, x, bias, out=d, dtype=F32)


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.NORM: norm_kernel,
    GGMLOp.RMS_NORM: rms_norm_kernel,
    GGMLOp.GROUP_NORM: group_norm_kernel,
    GGMLOp.SOFT_MAX: soft_max_kernel,
    GGMLOp.DIAG_MASK_INF: diag_mask_inf_kernel,
    GGMLOp.DIAG_MASK_ZERO: diag_mask_zero_kernel,
    GGMLOp.ROPE: rope_kernel,
    GGMLOp.ALIBI: alibi_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: F32/F16 data (I32 positions for ROPE, no GLM mode)."""
    if node.op not in KERNELS or not all_float(node, node.src[0]):
        return False
    if node.op == GGMLOp.ROPE:
        pos = node.src[1]
        return pos is not None and pos.type == GGMLType.I32 and rope_mode_supported(node.get_op_params_i32(2))
    if node.op == GGMLOp.SOFT_MAX:
        return all_float(node.src[1])
    return True
