"""Normalization, attention helpers and positions: NORM, RMS_NORM, GROUP_NORM,
SOFT_MAX (optional mask and scale, as ggml_soft_max_ext), DIAG_MASK_INF,
DIAG_MASK_ZERO, ROPE and ALIBI.

op_params are stored word for word as ggml.c of December 2023 stores them:
- NORM, RMS_NORM: [eps f32]
- GROUP_NORM: [n_groups] (ggml of late 2023 fixes eps at 1e-6 in the kernel)
- SOFT_MAX: [scale f32], the mask in src[1]
- DIAG_MASK_INF, DIAG_MASK_ZERO: [n_past]
- ROPE: [n_past=0, n_dims, mode, n_ctx, n_orig_ctx, freq_base, freq_scale, ext_factor,
  attn_factor, beta_fast, beta_slow, xpos_base, xpos_down] (floats as f32 from word 5 on,
  xpos_down a bool as 0/1), positions (I32, one per a.ne[2]) in src[1]
- ALIBI: [n_past, n_head, bias_max f32]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.checks import check_real
from pyggml.core.ops._build import require, require_arg, same_or_view, set_op
from pyggml.core.tensor import GGMLOp, Tensor, can_repeat_rows
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

# rope modes (bits of ROPE's `mode`)
ROPE_MODE_NORMAL = 0
ROPE_MODE_NEOX = 2  # bit 1: rotate pairs (i, i + n_dims/2) instead of (2i, 2i + 1)
ROPE_MODE_GLM = 4  # bit 2: ChatGLM's 2-D positions


# --- norms ---


def norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """Each row to zero mean and unit variance: (x - mean) / sqrt(var + eps); eps finite and >= 0 (later
    ggml asserts eps >= 0 in the kernel: a negative one gives NaN for a constant row)."""
    eps = check_real(eps, "norm: eps", finite=True, minimum=0.0)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.NORM, a, params=[eps])


def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return norm(ctx, a, eps, True)


def rms_norm(ctx: Context, a: Tensor, eps: float, inplace: bool = False) -> Tensor:
    """Each row divided by its root mean square: x / sqrt(mean(x^2) + eps); eps finite and >= 0."""
    eps = check_real(eps, "rms_norm: eps", finite=True, minimum=0.0)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.RMS_NORM, a, params=[eps])


def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return rms_norm(ctx, a, eps, True)


def group_norm(ctx: Context, a: Tensor, n_groups: int, inplace: bool = False) -> Tensor:
    """Normalize groups of channels (dimension 2 split in `n_groups`); eps 1e-6 as in ggml of late 2023."""
    require_arg(n_groups >= 1, "group_norm", f"n_groups must be >= 1, got {n_groups}", a)
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.GROUP_NORM, a, params=[n_groups])


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int) -> Tensor:
    return group_norm(ctx, a, n_groups, True)


# --- soft_max ---


def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, inplace: bool, fn: str) -> Tensor:
    scale = check_real(scale, f"{fn}: scale", finite=True)  # a NaN or infinite scale makes every row NaN
    require(a.is_contiguous(), fn, "a must be contiguous", a)
    if mask is not None:
        require(mask.is_contiguous(), fn, "the mask must be contiguous", mask)
        require(mask.ne[2] == 1 and mask.ne[3] == 1, fn, "the mask must be a matrix (ne[2] == ne[3] == 1)", mask)
        require(can_repeat_rows(mask, a), fn, "the mask's rows must repeat to a's (same ne[0], a.ne[1] a multiple)",
                a, mask)
    result = same_or_view(ctx, a, inplace)
    return set_op(result, GGMLOp.SOFT_MAX, a, mask, params=[scale])


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """softmax of each row."""
    return _soft_max(ctx, a, None, 1.0, False, "soft_max")


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, True, "soft_max_inplace")


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(a * scale + mask) of each row; the mask (optional) broadcasts over a's rows."""
    return _soft_max(ctx, a, mask, scale, False, "soft_max_ext")


# --- diag_mask ---


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set a[i0, i1] to -inf where i0 > n_past + i1 (the causal mask)."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.DIAG_MASK_INF, a, params=[n_past])


def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return diag_mask_inf(ctx, a, n_past, True)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set a[i0, i1] to 0 where i0 > n_past + i1."""
    return set_op(same_or_view(ctx, a, inplace), GGMLOp.DIAG_MASK_ZERO, a, params=[n_past])


def diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return diag_mask_zero(ctx, a, n_past, True)


# --- rope ---


def rope_impl(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int, n_orig_ctx: int,
              freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
              beta_fast: float, beta_slow: float, xpos_base: float, xpos_down: bool, inplace: bool) -> Tensor:
    """ggml_rope_impl: rotary position embedding of a [head_dim, n_head, n_tokens, ...] by the positions in b."""
    fn = "rope_inplace" if inplace else "rope"
    require(b.is_vector(), fn, "positions b must be a vector", b)
    require(b.type == GGMLType.I32, fn, "positions b must be I32", b)
    require(a.ne[2] == b.ne[0], fn, f"a.ne[2]={a.ne[2]} must equal the number of positions b.ne[0]={b.ne[0]}",
            a, b)
    # the kernels turn pairs of the first n_dims elements of a row: more than the row would reach past it
    require_arg(0 < n_dims <= a.ne[0] and n_dims % 2 == 0, fn,
                f"n_dims={n_dims} must be even, > 0 and <= a.ne[0]={a.ne[0]}", a)
    require_arg(n_ctx >= 0 and n_orig_ctx >= 0, fn, f"n_ctx={n_ctx} and n_orig_ctx={n_orig_ctx} must be >= 0", a)
    for name, value in (("freq_base", freq_base), ("freq_scale", freq_scale), ("ext_factor", ext_factor),
                        ("attn_factor", attn_factor), ("beta_fast", beta_fast), ("beta_slow", beta_slow),
                        ("xpos_base", xpos_base)):
        check_real(value, f"{fn}: {name}", finite=True)
    require_arg(freq_base > 0, fn, f"freq_base={freq_base} must be > 0 (its powers are the angles' frequencies)", a)
    result = same_or_view(ctx, a, inplace)
    params: list[int | float] = [
        0, n_dims, mode, n_ctx, n_orig_ctx,
        float(freq_base), float(freq_scale), float(ext_factor), float(attn_factor),
        float(beta_fast), float(beta_slow), float(xpos_base), 1 if xpos_down else 0,
    ]
    return set_op(result, GGMLOp.ROPE, a, b, params=params)


def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int) -> Tensor:
    """RoPE with ggml's defaults: freq_base 10000, freq_scale 1, no YaRN extrapolation."""
    return rope_impl(ctx, a, b, n_dims, mode, n_ctx, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, False, False)


def rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int) -> Tensor:
    return rope_impl(ctx, a, b, n_dims, mode, n_ctx, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, False, True)


def rope_custom(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int, n_orig_ctx: int,
                freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                beta_fast: float, beta_slow: float) -> Tensor:
    """RoPE with frequency base and scale and YaRN parameters."""
    return rope_impl(ctx, a, b, n_dims, mode, n_ctx, n_orig_ctx, freq_base, freq_scale, ext_factor, attn_factor,
                     beta_fast, beta_slow, 0.0, False, False)


def rope_custom_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx: int, n_orig_ctx: int,
                        freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                        beta_fast: float, beta_slow: float) -> Tensor:
    return rope_impl(ctx, a, b, n_dims, mode, n_ctx, n_orig_ctx, freq_base, freq_scale, ext_factor, attn_factor,
                     beta_fast, beta_slow, 0.0, False, True)


def rope_xpos_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, base: float, down: bool) -> Tensor:
    """xPos RoPE (ggml_rope_xpos_inplace)."""
    return rope_impl(ctx, a, b, n_dims, 0, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, base, down, True)


# --- alibi ---


def alibi(ctx: Context, a: Tensor, n_past: int, n_head: int, bias_max: float) -> Tensor:
    """ALiBi attention biases added to a [n_kv, n_tokens, n_head, ...].

    The result is a view of `a` (computed in place), as in ggml of late 2023.
    """
    require_arg(n_past >= 0, "alibi", f"n_past must be >= 0, got {n_past}", a)
    require_arg(n_head >= 1, "alibi", f"n_head must be >= 1, got {n_head}", a)
    return set_op(ctx.view_tensor(a), GGMLOp.ALIBI, a, params=[n_past, n_head, float(bias_max)])


__all__ = [
    "ROPE_MODE_GLM", "ROPE_MODE_NEOX", "ROPE_MODE_NORMAL",
    "alibi", "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace",
    "group_norm", "group_norm_inplace", "norm", "norm_inplace", "rms_norm", "rms_norm_inplace",
    "rope", "rope_custom", "rope_custom_inplace", "rope_impl", "rope_inplace", "rope_xpos_inplace",
    "soft_max", "soft_max_ext", "soft_max_inplace",
]
