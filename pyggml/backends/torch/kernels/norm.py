"""Torch kernels: RMS_NORM, NORM, SOFT_MAX (mask and scale) and ROPE (normal and NeoX, YaRN, xPos).

Everything is computed in f32 and stored once into dst's type, with the CPU
kernels' formulas (pyggml.backends.cpu.kernels.norm), so the two backends
differ only in float rounding order.
"""

from __future__ import annotations

import math

import torch

from pyggml.backends.cpu.kernels.norm import ROPE_MODE_GLM, ROPE_MODE_NEOX, rope_yarn_corr_dims
from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import (
    FLOAT_TYPES,
    I32,
    all_of,
    ggml_tile,
    require,
    tiles,
    unary_operands,
)
from pyggml.core.errors import ArgumentError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor

F32 = torch.float32


# --- RMS_NORM, NORM ---


def rms_norm_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Each row: x / sqrt(mean(x^2) + eps), eps the f32 in op_params[0]."""
    d, x = unary_operands(node, pc)
    eps = node.get_op_params_f32(0)
    if d.numel() == 0:
        return noop

    def run() -> None:
        xf = x.to(F32)
        scale = torch.mean(xf * xf, dim=-1, keepdim=True)
        scale.add_(eps).rsqrt_()
        torch.mul(xf, scale, out=d)

    return run


def norm_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Each row: (x - mean) / sqrt(variance + eps), eps the f32 in op_params[0]."""
    d, x = unary_operands(node, pc)
    eps = node.get_op_params_f32(0)
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
    """Each row: softmax(x * scale + mask), scale the f32 in op_params[0], the mask (optional) in src[1].

    The mask's flat row r % ne11 goes with src's flat row r, as ggml reads it:
    a broadcast view where ne11 divides src's rows evenly, else gathered.
    """
    d, x = unary_operands(node, pc)
    mask_t = node.src[1]
    require(node, FLOAT_TYPES, mask_t)
    scale = node.get_op_params_f32(0)
    if d.numel() == 0:
        return noop
    add_mask = None
    if mask_t is not None:
        mask = pc.view(mask_t)
        if mask.shape[3] != x.shape[3]:
            raise ShapeError(f"torch SOFT_MAX '{node.name}': mask rows have {mask.shape[3]} elements, "
                             f"src rows {x.shape[3]}")
        if tiles(node, x, mask):
            def add_mask(t: torch.Tensor) -> torch.Tensor:
                (tb,), mb = ggml_tile([t], mask)
                tb.add_(mb)
                return t
        elif mask.shape[0] == 1 and mask.shape[1] == 1:
            m2 = mask[0, 0]
            which = (torch.arange(x.shape[0] * x.shape[1] * x.shape[2], device=x.device) % m2.shape[0])
            which = which.view(x.shape[:3])

            def add_mask(t: torch.Tensor) -> torch.Tensor:
                return t.add_(m2[which])
        else:
            raise ShapeError(f"torch SOFT_MAX '{node.name}': mask ne {list(mask.shape)[::-1]} does not repeat to "
                             f"src ne {list(x.shape)[::-1]}")

    def run() -> None:
        t = torch.mul(x.to(F32), scale)
        if add_mask is not None:
            add_mask(t)
        d.copy_(torch.softmax(t, dim=-1))

    return run


# --- ROPE ---


def rope_mode_supported(mode: int) -> bool:
    return not mode & ROPE_MODE_GLM


def rope_kernel(node: Tensor, pc: PlanContext) -> Compute:
    """Rotate pairs of each row by position-dependent angles, as the CPU kernel (ggml_rope_custom / YaRN).

    op_params: [n_past, n_dims, mode, n_ctx, n_orig_ctx, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, xpos_base, xpos_down];
    positions (I32, one per ne2) in src[1], read at compute time. Pair k turns
    by p * freq_base^(-2k/n_dims) * freq_scale (mixed by YaRN's ramp when
    ext_factor != 0). Normal mode pairs (2k, 2k+1) over the whole row; NeoX
    mode (mode & 2) pairs (k, k + n_dims/2) over the first n_dims and copies
    the rest. The angles' powers are made once, in f32 by repeated
    multiplication as ggml makes theta.
    """
    d, x = unary_operands(node, pc)
    pos_t = node.src[1]
    if pos_t is None or pos_t.type != I32:
        raise UnsupportedTypeError(f"torch ROPE '{node.name}': positions (src[1]) must be an I32 tensor")
    p_i, p_f = node.get_op_params_i32, node.get_op_params_f32
    n_dims, mode, n_orig_ctx = p_i(1), p_i(2), p_i(4)
    freq_base, freq_scale, ext_factor, attn_factor = p_f(5), p_f(6), p_f(7), p_f(8)
    beta_fast, beta_slow, xpos_base, xpos_down = p_f(9), p_f(10), p_f(11), p_i(12) != 0
    if not rope_mode_supported(mode):
        raise UnsupportedTypeError(f"torch ROPE '{node.name}': GLM mode (mode & 4) is not supported")
    ne3, ne2, ne1, ne0 = x.shape
    if n_dims <= 0 or n_dims % 2 or n_dims > ne0:
        raise ArgumentError(f"torch ROPE '{node.name}': n_dims={n_dims} must be even, > 0 and <= ne0={ne0}")
    if not pos_t.is_vector() or pos_t.ne[0] < ne2:
        raise ShapeError(f"torch ROPE '{node.name}': positions must be a vector of at least ne2={ne2}, "
                         f"got ne {pos_t.ne}")
    if d.numel() == 0:
        return noop
    neox = bool(mode & ROPE_MODE_NEOX)
    n_pairs = n_dims // 2 if neox else ne0 // 2
    if neox:
        x0, x1 = x[..., : n_dims // 2], x[..., n_dims // 2: n_dims]
        d0, d1 = d[..., : n_dims // 2], d[..., n_dims // 2: n_dims]
    else:
        x0, x1 = x[..., 0: 2 * n_pairs: 2], x[..., 1: 2 * n_pairs: 2]
        d0, d1 = d[..., 0: 2 * n_pairs: 2], d[..., 1: 2 * n_pairs: 2]
    rest = None
    if neox and n_dims < ne0 and not _same_view(d, x):
        rest = (d[..., n_dims:], x[..., n_dims:])

    dev = x.device
    theta_scale = math.pow(freq_base, -2.0 / n_dims)
    # ts^k as ggml's running product theta *= theta_scale, in f32
    powers = torch.full((n_pairs,), theta_scale, dtype=F32)
    powers[0] = 1.0
    powers = torch.cumprod(powers, 0, dtype=F32).to(dev)
    k = torch.arange(n_pairs, dtype=F32, device=dev)
    mscale = attn_factor
    ramp_mix = None
    if ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(n_dims, n_orig_ctx, freq_base, beta_fast, beta_slow)
        y = (k - low) / max(0.001, high - low)
        ramp_mix = (1 - torch.clamp(y, 0, 1)) * ext_factor
        mscale = mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    zeta_base = None
    if xpos_base != 0.0 and not neox:
        zeta_base = (2 * k + 0.4 * ne0) / (1.4 * ne0)
    positions = pc.view(pos_t)[0, 0, 0, :ne2]  # a view: the positions are read at compute time

    def run() -> None:
        theta = positions.to(F32)[:, None] * powers[None, :]
        ang = theta * freq_scale
        if ramp_mix is not None:
            ang = ang * (1 - ramp_mix) + theta * ramp_mix
        c = torch.cos(ang).mul_(mscale)
        s = torch.sin(ang).mul_(mscale)
        if zeta_base is not None:
            zeta = torch.pow(zeta_base[None, :], (positions.to(F32) / xpos_base)[:, None])
            if xpos_down:
                zeta = 1 / zeta
            c.mul_(zeta)
            s.mul_(zeta)
        c4 = c.view(1, ne2, 1, n_pairs)
        s4 = s.view(1, ne2, 1, n_pairs)
        a0, a1 = x0.to(F32), x1.to(F32)
        r0 = a0 * c4 - a1 * s4
        r1 = a0 * s4 + a1 * c4
        d0.copy_(r0)
        d1.copy_(r1)
        if rest is not None:
            rest[0].copy_(rest[1])

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
    """F32/F16 data; SOFT_MAX's mask F32/F16; ROPE's positions I32 and no GLM mode."""
    if node.op not in KERNELS or not all_of(FLOAT_TYPES, node, node.src[0]) or node.src[0] is None:
        return False
    if node.op == GGMLOp.ROPE:
        pos = node.src[1]
        return pos is not None and pos.type == I32 and rope_mode_supported(node.get_op_params_i32(2))
    if node.op == GGMLOp.SOFT_MAX:
        return all_of(FLOAT_TYPES, node.src[1])
    return True
