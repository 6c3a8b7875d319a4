"""Normalization, attention helpers and positions: NORM, RMS_NORM, GROUP_NORM,
SOFT_MAX (optional mask, scale, ALiBi max_bias and attention sinks, as
ggml_soft_max_ext), DIAG_MASK_INF, DIAG_MASK_ZERO and ROPE.

op_params are stored word for word as ggml.c stores them, through
`pyggml.core.ops.params`:
- NORM, RMS_NORM: [eps f32]; GROUP_NORM: [n_groups, eps f32]
- SOFT_MAX: [scale f32, max_bias f32], the mask in src[1], the sinks in src[2]
- DIAG_MASK_INF, DIAG_MASK_ZERO: [n_past]
- ROPE: [n_past=0, n_dims, mode, n_ctx=0, n_ctx_orig, freq_base, freq_scale, ext_factor,
  attn_factor, beta_fast, beta_slow, sections[4], n_offs] (floats f32), positions (I32)
  in src[1], frequency factors (F32, optional) in src[2]

ALiBi is no op of its own any more: ggml folds it into SOFT_MAX (max_bias > 0).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pyggml.core.checks import check_real
from pyggml.core.ops._build import require, require_arg, same_or_view, set_op
from pyggml.core.ops.params import DiagMaskParams, GroupNormParams, NormParams, RopeParams, SoftMaxParams
from pyggml.core.tensor import GGML_MROPE_SECTIONS, GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_VISION, GGMLOp, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


# --- norms ---


def norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """Each row to zero mean and unit variance: (x - mean) / sqrt(var + eps); eps finite and >= 0 (ggml
    asserts eps >= 0 in the kernel: a negative one gives NaN for a constant row)."""
    eps = check_real(eps, "norm: eps", finite=True, minimum=0.0)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.NORM, a, params=NormParams(eps=eps))


def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return norm(ctx, a, eps, True)


def rms_norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """Each row divided by its root mean square: x / sqrt(mean(x^2) + eps); eps finite and >= 0."""
    eps = check_real(eps, "rms_norm: eps", finite=True, minimum=0.0)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.RMS_NORM, a, params=NormParams(eps=eps))


def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return rms_norm(ctx, a, eps, True)


def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool = False) -> Tensor:
    """Normalize groups of channels (dimension 2 split in `n_groups`); op_params [n_groups, eps]."""
    eps = check_real(eps, "group_norm: eps", finite=True, minimum=0.0)
    require_arg(n_groups >= 1, "group_norm", f"n_groups must be >= 1, got {n_groups}", a)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.GROUP_NORM, a,
                  params=GroupNormParams(n_groups=n_groups, eps=eps))


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return group_norm(ctx, a, n_groups, eps, True)


# --- soft_max ---


def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float, inplace: bool,
              fn: str) -> Tensor:
    scale = check_real(scale, f"{fn}: scale", finite=True)  # a NaN or infinite scale makes every row NaN
    max_bias = check_real(max_bias, f"{fn}: max_bias", finite=True)
    require(a.is_contiguous(), fn, "a must be contiguous", a)
    if mask is not None:
        require(mask.type in (GGMLType.F32, GGMLType.F16), fn, "the mask must be F32 or F16", mask)
        require(mask.is_contiguous(), fn, "the mask must be contiguous", mask)
        require(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1], fn,
                "the mask must have a's rows (same ne[0], ne[1] at least a's)", a, mask)
        require(mask.ne[2] > 0 and mask.ne[3] > 0 and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0,
                fn, "the mask must broadcast over a's dims 2 and 3", a, mask)
    require_arg(max_bias <= 0.0 or mask is not None, fn, f"max_bias={max_bias} > 0 (ALiBi) needs a mask", a)
    result = same_or_view(ctx, a, inplace)
    return set_op(result, GGMLOp.SOFT_MAX, a, mask, params=SoftMaxParams(scale=scale, max_bias=max_bias))


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """softmax of each row."""
    return _soft_max(ctx, a, None, 1.0, 0.0, False, "soft_max")


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, True, "soft_max_inplace")


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float = 0.0) -> Tensor:
    """softmax(a * scale + slope * mask) of each row: mask row i1 for a's row i1 (its dims 2, 3 broadcast);
    slope 1, or ALiBi's slope of head i2 when max_bias > 0."""
    return _soft_max(ctx, a, mask, scale, max_bias, False, "soft_max_ext")


def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float = 0.0) -> Tensor:
    return _soft_max(ctx, a, mask, scale, max_bias, True, "soft_max_ext_inplace")


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_soft_max_add_sinks: per-head attention sinks (F32, one per a.src[0].ne[2]) in src[2], as if each
    row had one more logit; None removes them."""
    if sinks is None:
        a.src[2] = None
        return
    src = a.src[0]
    require(a.op == GGMLOp.SOFT_MAX and src is not None, "soft_max_add_sinks", "a must be a SOFT_MAX node", a)
    assert src is not None
    require(a.src[2] is None, "soft_max_add_sinks", "a already has sinks", a)
    require(sinks.type == GGMLType.F32 and sinks.ne[0] == src.ne[2], "soft_max_add_sinks",
            "the sinks must be F32, one per head (ne[0] == a.src[0].ne[2])", src, sinks)
    a.src[2] = sinks


# --- diag_mask ---


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set a[i0, i1] to -inf where i0 > n_past + i1 (the causal mask)."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.DIAG_MASK_INF, a, params=DiagMaskParams(n_past=n_past))


def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return diag_mask_inf(ctx, a, n_past, True)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set a[i0, i1] to 0 where i0 > n_past + i1."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.DIAG_MASK_ZERO, a, params=DiagMaskParams(n_past=n_past))


def diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return diag_mask_zero(ctx, a, n_past, True)


# --- rope ---


def rope_impl(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int] | None,
              mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
              attn_factor: float, beta_fast: float, beta_slow: float, inplace: bool) -> Tensor:
    """ggml_rope_impl: rotary position embedding of a [head_dim, n_head, n_tokens, ...] by the positions in b
    (one per token, four per token for multi-rope), optional frequency factors c (F32, n_dims/2 of them)."""
    fn = "rope_inplace" if inplace else "rope"
    require_arg(mode & 1 == 0, fn, f"mode={mode}: mode & 1 is no longer supported", a)
    require(b.is_vector(), fn, "positions b must be a vector", b)
    require(b.type == GGMLType.I32, fn, "positions b must be I32", b)
    mrope = bool(mode & GGML_ROPE_TYPE_MROPE)
    per_token = 4 if mrope else 1
    require(a.ne[2] * per_token == b.ne[0], fn, f"b.ne[0]={b.ne[0]} must be {per_token} position(s) for each of "
            f"a.ne[2]={a.ne[2]} tokens", a, b)
    if c is not None:
        require(c.type == GGMLType.F32 and c.ne[0] >= n_dims // 2, fn,
                f"the frequency factors c must be F32 with at least n_dims/2={n_dims // 2} of them", c)
    # the kernels turn pairs of the first n_dims elements of a row: more than the row would reach past it
    limit = a.ne[0] // 2 if mode == GGML_ROPE_TYPE_VISION else a.ne[0]
    require_arg(0 < n_dims <= limit and n_dims % 2 == 0, fn,
                f"n_dims={n_dims} must be even, > 0 and <= {limit} (a.ne[0]={a.ne[0]})", a)
    require_arg(n_ctx_orig >= 0, fn, f"n_ctx_orig={n_ctx_orig} must be >= 0", a)
    for name, value in (("freq_base", freq_base), ("freq_scale", freq_scale), ("ext_factor", ext_factor),
                        ("attn_factor", attn_factor), ("beta_fast", beta_fast), ("beta_slow", beta_slow)):
        check_real(value, f"{fn}: {name}", finite=True)
    require_arg(freq_base > 0, fn, f"freq_base={freq_base} must be > 0 (its powers are the angles' frequencies)", a)
    sect = (0, 0, 0, 0)
    if mrope and sections is not None:
        require_arg(len(sections) == GGML_MROPE_SECTIONS, fn, f"sections must be {GGML_MROPE_SECTIONS} ints", a)
        sect = (int(sections[0]), int(sections[1]), int(sections[2]), int(sections[3]))
    result = same_or_view(ctx, a, inplace)
    params = RopeParams(n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=freq_base,
                        freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast,
                        beta_slow=beta_slow, sections=sect)
    return set_op(result, GGMLOp.ROPE, a, b, c, params=params)


def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int = 0) -> Tensor:
    """RoPE with ggml's defaults: freq_base 10000, freq_scale 1, no YaRN extrapolation.

    `n_ctx` is an argument ggml no longer takes (its word is 0): accepted for old callers, unused.
    """
    return rope_impl(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)


def rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int = 0) -> Tensor:
    return rope_impl(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True)


def rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
             beta_slow: float) -> Tensor:
    """RoPE with frequency base and scale, YaRN parameters and optional frequency factors c."""
    return rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, False)


def rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                     n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float) -> Tensor:
    return rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, True)


def rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int], mode: int,
               n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
               beta_fast: float, beta_slow: float) -> Tensor:
    """Multi-rope (modes MROPE, IMROPE, VISION): four positions per token, the dimensions cut in `sections`."""
    return rope_impl(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, False)


def rope_multi_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int],
                       mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                       attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return rope_impl(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, True)


def rope_custom(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                beta_fast: float, beta_slow: float) -> Tensor:
    """RoPE with frequency base and scale and YaRN parameters (ggml_rope_custom: rope_ext without c)."""
    return rope_impl(ctx, a, b, None, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, False)


def rope_custom_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                        freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                        beta_fast: float, beta_slow: float) -> Tensor:
    return rope_impl(ctx, a, b, None, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow, True)


def rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    """ggml_rope_set_offset: rotate from dimension n_offs on (op_params[15]); not for VISION."""
    require(a.op in (GGMLOp.ROPE, GGMLOp.ROPE_BACK), "rope_set_offset", "a must be a ROPE node", a)
    p = RopeParams.of(a)
    require_arg(n_offs >= 0 and n_offs % 2 == 0 and n_offs + p.n_dims <= a.ne[0], "rope_set_offset",
                f"n_offs={n_offs} must be even, >= 0, and n_offs + n_dims={p.n_dims} <= a.ne[0]={a.ne[0]}", a)
    require_arg(p.mode != GGML_ROPE_TYPE_VISION, "rope_set_offset", "VISION mode takes no offset", a)
    dataclasses.replace(p, n_offs=n_offs).store(a)
    return a


__all__ = [
    "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace",
    "group_norm", "group_norm_inplace", "norm", "norm_inplace", "rms_norm", "rms_norm_inplace",
    "rope", "rope_custom", "rope_custom_inplace", "rope_ext", "rope_ext_inplace", "rope_impl", "rope_inplace",
    "rope_multi", "rope_multi_inplace", "rope_set_offset",
    "soft_max", "soft_max_add_sinks", "soft_max_ext", "soft_max_ext_inplace", "soft_max_inplace",
]
