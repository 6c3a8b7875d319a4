"""Torch kernels: RMS_NORM, NORM, SOFT_MAX (mask, scale, ALiBi, sinks) and ROPE (every mode, YaRN).

Everything is computed in f32 and stored once into dst's type, with the CPU
kernels' formulas (pyggml.backends.cpu.kernels.norm), so the two backends
differ only in float rounding order.
"""

from __future__ import annotations

import math

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import (
    FLOAT_TYPES,
    all_of,
    require,
    softmax_rows,
    unary_operands,
)
from pyggml.core.errors import GGMLError, ShapeError
from pyggml.core.ops.params import NormParams, RopeParams, SoftMaxParams
from pyggml.core.rope import alibi_slopes, rope_check, rope_pairs, rope_theta_sources, rope_yarn_corr_dims
from pyggml.core.tensor import GGML_ROPE_TYPE_MROPE, GGMLOp, Tensor
from pyggml.core.types import GGMLType

F32 = torch.float32


# --- RMS_NORM, NORM ---


def rms_norm_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Each row: x / sqrt(mean(x^2) + eps) (NormParams)."""
    d, x = unary_operands(node, pc)
    eps = NormParams.of(node).eps
    if d.numel() == 0:
        return noop

    def run() -> None:
        xf = x.to(F32)
        scale = torch.mean(xf * xf, dim=-1, keepdim=True)
        scale.add_(eps).rsqrt_()
        torch.mul(xf, scale, out=d)

    return run


def norm_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Each row: (x - mean) / sqrt(variance + eps) (NormParams)."""
    d, x = unary_operands(node, pc)
    eps = NormParams.of(node).eps
    if d.numel() == 0:
        return noop

    def run() -> None:
        t = x.to(F32)
        t = t - torch.mean(t, dim=-1, keepdim=True)
        var = torch.mean(t * t, dim=-1, keepdim=True)
        var.add_(eps).rsqrt_()
        torch.mul(t, var, out=d)

    return run


# --- SOFT_MAX ---


def soft_max_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Each row: softmax(x * scale + slope * mask) with the sinks' extra logit per head, as the CPU kernel
    (SoftMaxParams; mask row i1 for row i1, its dims 2 and 3 tiled; slope ALiBi's when max_bias > 0)."""
    d, x = unary_operands(node, pc)
    mask_t, sinks_t = node.src[1], node.src[2]
    require(node, FLOAT_TYPES, mask_t)
    p = SoftMaxParams.of(node)
    if d.numel() == 0:
        return noop
    ne3, ne2, ne1, ne0 = x.shape
    mask_source = None
    tile = (1, 1, 1, 1)
    if mask_t is not None:
        m = pc.view(mask_t)
        m3, m2, m1, m0 = m.shape
        if m0 != ne0 or m1 < ne1 or m2 == 0 or m3 == 0 or ne2 % m2 or ne3 % m3:
            raise ShapeError(f"torch SOFT_MAX '{node.name}': mask ne {list(m.shape)[::-1]} does not fit src ne "
                             f"{list(x.shape)[::-1]}")
        mask_source = m[:, :, :ne1, :]  # a view: read at compute time
        if (m3, m2) != (1, 1):  # tiles dims 2 and 3 (i2 % m2, i3 % m3); size-1 ones broadcast by themselves
            tile = (ne3 // m3, ne2 // m2, 1, 1)
    slopes = None
    if p.max_bias > 0.0:
        slopes = torch.from_numpy(alibi_slopes(ne2, p.max_bias)).to(x.device).view(1, ne2, 1, 1)
    sinks = None
    if sinks_t is not None:
        if sinks_t.type != GGMLType.F32 or sinks_t.ne[0] < ne2:
            raise ShapeError(f"torch SOFT_MAX '{node.name}': sinks must be F32, one per head (ne2={ne2})")
        sinks = pc.view(sinks_t).reshape(-1)[:ne2].view(1, ne2, 1, 1)

    def run() -> None:
        t = torch.mul(x.to(F32), p.scale)
        if mask_source is not None:
            m = mask_source.to(F32)
            if tile != (1, 1, 1, 1):
                m = m.repeat(*tile)
            if slopes is not None:
                m = m * slopes
            t = t + m
        d.copy_(softmax_rows(t, sinks))

    return run


# --- ROPE ---


def rope_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Rotate pairs of each row by position-dependent angles, as the CPU kernel: the modes NORMAL, NEOX, MROPE,
    IMROPE and VISION (pyggml.core.rope: which pairs turn, which position stream turns each), frequency factors
    (src[2]), YaRN, an offset (RopeParams; positions I32 in src[1], read at compute time). Pair k turns by
    p * freq_base^(-2k/n_dims) / ff[k] * freq_scale (mixed by YaRN's ramp when ext_factor != 0); the powers
    are made once, in f32 by repeated multiplication as ggml makes theta."""
    d, x = unary_operands(node, pc)
    p = RopeParams.of(node)
    ne3, ne2, ne1, ne0 = x.shape
    rope_check(node, p, ne0, ne2, "torch")
    pos_t, ff_t = node.src[1], node.src[2]
    assert pos_t is not None
    if d.numel() == 0:
        return noop
    pairs = rope_pairs(p, ne0)
    n_pairs = pairs.n_pairs
    x0, x1 = x[..., pairs.first], x[..., pairs.second]
    d0, d1 = d[..., pairs.first], d[..., pairs.second]
    copies = [] if _same_view(d, x) else [(d[..., sl], x[..., sl]) for sl in pairs.kept]

    dev = x.device
    theta_scale = math.pow(p.freq_base, -2.0 / p.n_dims)
    # ts^k as ggml's running product theta *= theta_scale, in f32
    powers = torch.full((n_pairs,), theta_scale, dtype=F32)
    powers[0] = 1.0
    powers = torch.cumprod(powers, 0, dtype=F32)
    stream, power = rope_theta_sources(p, n_pairs)
    scales = powers[torch.from_numpy(power)].to(dev)
    streams = torch.from_numpy(stream).to(dev)
    k = torch.arange(n_pairs, dtype=F32, device=dev)
    mscale = p.attn_factor
    ramp_mix = None
    if p.ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
        y = (k - low) / max(0.001, high - low)
        ramp_mix = (1 - torch.clamp(y, 0, 1)) * p.ext_factor
        mscale = mscale * (1.0 + 0.1 * math.log(1.0 / p.freq_scale))
    n_streams = 4 if p.mode & GGML_ROPE_TYPE_MROPE else 1
    positions = pc.view(pos_t).reshape(-1)[:n_streams * ne2].view(n_streams, ne2)  # read at compute time
    freq_factors = None if ff_t is None else pc.view(ff_t).reshape(-1)[:n_pairs]

    def run() -> None:
        theta = positions.to(F32)[streams].t() * scales[None, :]  # (ne2, n_pairs)
        if freq_factors is not None:
            theta = theta / freq_factors[None, :]
        ang = theta * p.freq_scale
        if ramp_mix is not None:
            ang = ang * (1 - ramp_mix) + theta * ramp_mix
        c = torch.cos(ang).mul_(mscale)
        s = torch.sin(ang).mul_(mscale)
        c4 = c.view(1, ne2, 1, n_pairs)
        s4 = s.view(1, ne2, 1, n_pairs)
        a0, a1 = x0.to(F32), x1.to(F32)
        r0 = a0 * c4 - a1 * s4
        r1 = a0 * s4 + a1 * c4
        d0.copy_(r0)
        d1.copy_(r1)
        for dst, src in copies:
            dst.copy_(src)

    return run


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if `a` and `b` view the very same elements (in-place nodes)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.RMS_NORM: rms_norm_kernel,
    GGMLOp.NORM: norm_kernel,
    GGMLOp.SOFT_MAX: soft_max_kernel,
    GGMLOp.ROPE: rope_kernel,
}


def supports(node: Tensor) -> bool:
    """F32/F16 data; SOFT_MAX's mask F32/F16, sinks F32; ROPE's positions I32, any of ggml's modes, F32 frequency
    factors."""
    src0 = node.src[0]
    if node.op not in KERNELS or not all_of(FLOAT_TYPES, node, src0) or src0 is None:
        return False
    if node.op == GGMLOp.ROPE:
        try:
            p = RopeParams.of(node)
            rope_check(node, p, src0.ne[0], src0.ne[2], "torch")
        except GGMLError:
            return False
        return not (p.mode & GGML_ROPE_TYPE_MROPE and min(p.sections) < 0)
    if node.op == GGMLOp.SOFT_MAX:
        sinks = node.src[2]
        return all_of(FLOAT_TYPES, node.src[1]) and (sinks is None or sinks.type == GGMLType.F32)
    return True
