"""ROPE_BACK (ggml_rope_ext_back, ggml_rope_multi_back) and SAM's ops: WIN_PART, WIN_UNPART, GET_REL_POS,
ADD_REL_POS.

Shapes, types and op_params as llama.cpp 0c1e570's ggml.c builds them:
- ROPE_BACK: ROPE's node (`rope_impl`, RopeParams) with the op changed; its kernel turns by -theta.
- WIN_PART: [npx, npy, w]; WIN_UNPART: [w]; ADD_REL_POS: [inplace]; GET_REL_POS: none.
ggml's GGML_ASSERTs become ShapeError / ArgumentError / UnsupportedTypeError naming the op and operands;
so do the divisions by w that ggml leaves unchecked (w > 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import require, require_arg, same_or_view, set_op
from pyggml.core.ops.norm import rope_impl
from pyggml.core.ops.params import AddRelPosParams, WinPartParams, WinUnpartParams
from pyggml.core.tensor import GGMLOp, Tensor, are_same_shape
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def _require_f32(op: str, *tensors: Tensor) -> None:
    for t in tensors:
        if t.type != GGMLType.F32:
            raise UnsupportedTypeError(f"{op}: tensor '{t.name}' has type {t.type.name}; ggml takes F32")


# --- ROPE_BACK ---


def rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
                  freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
                  beta_slow: float) -> Tensor:
    """The gradient of rope_ext: a (dy) turned back by the same angles (positions b, frequency factors c)."""
    result = rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                       attn_factor, beta_fast, beta_slow, False)
    result.op = GGMLOp.ROPE_BACK
    return result


def rope_multi_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int],
                    mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """The gradient of rope_multi (four positions per token, the dimensions cut in `sections`)."""
    result = rope_impl(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                       attn_factor, beta_fast, beta_slow, False)
    result.op = GGMLOp.ROPE_BACK
    return result


# --- windows (SAM) ---


def win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    """a [C, W, H, 1] cut into w x w windows (zero-padded at the right and bottom): [C, w, w, npx * npy]."""
    require(a.ne[3] == 1, "win_part", f"a.ne[3]={a.ne[3]} must be 1", a)
    _require_f32("win_part", a)
    require_arg(w > 0, "win_part", f"window size w={w} must be > 0", a)
    npx = (a.ne[1] + w - 1) // w
    npy = (a.ne[2] + w - 1) // w
    result = ctx.new_tensor(GGMLType.F32, [a.ne[0], w, w, npx * npy])
    return set_op(result, GGMLOp.WIN_PART, a, params=WinPartParams(npx=npx, npy=npy, w=w))


def win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """The reverse of win_part: windows a [C, w, w, n] put back into [C, w0, h0, 1] (padding dropped)."""
    _require_f32("win_unpart", a)
    require_arg(w > 0, "win_unpart", f"window size w={w} must be > 0", a)
    require_arg(w0 >= 0 and h0 >= 0, "win_unpart", f"w0={w0} and h0={h0} must not be negative", a)
    result = ctx.new_tensor(GGMLType.F32, [a.ne[0], w0, h0, 1])
    return set_op(result, GGMLOp.WIN_UNPART, a, params=WinUnpartParams(w=w))


# --- relative positions (SAM) ---


def get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    """The relative-position rows a [C, 2*kh - 1] picked for each (query, key): [C, kh, qh] (F16)."""
    require_arg(qh == kh, "get_rel_pos", f"qh={qh} must equal kh={kh}", a)
    require(2 * max(qh, kh) - 1 == a.ne[1], "get_rel_pos", f"a.ne[1]={a.ne[1]} must be 2*max(qh, kh) - 1", a)
    result = ctx.new_tensor(GGMLType.F16, [a.ne[0], kh, qh, 1])
    return set_op(result, GGMLOp.GET_REL_POS, a)


def _add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor, inplace: bool) -> Tensor:
    fn = "add_rel_pos_inplace" if inplace else "add_rel_pos"
    require(are_same_shape(pw, ph), fn, "pw and ph must have the same shape", pw, ph)
    require(a.is_contiguous() and pw.is_contiguous() and ph.is_contiguous(), fn,
            "a, pw and ph must be contiguous", a, pw, ph)
    _require_f32(fn, ph, pw)
    require(pw.ne[3] == a.ne[2], fn, f"pw.ne[3]={pw.ne[3]} must equal a.ne[2]={a.ne[2]}", a, pw)
    require(pw.ne[0] * pw.ne[0] == a.ne[0], fn, f"pw.ne[0]^2={pw.ne[0] ** 2} must equal a.ne[0]={a.ne[0]}", a, pw)
    require(pw.ne[1] * pw.ne[2] == a.ne[1], fn,
            f"pw.ne[1]*pw.ne[2]={pw.ne[1] * pw.ne[2]} must equal a.ne[1]={a.ne[1]}", a, pw)
    result = same_or_view(ctx, a, inplace)
    return set_op(result, GGMLOp.ADD_REL_POS, a, pw, ph, params=AddRelPosParams(inplace=inplace))


def add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """SAM's decomposed relative positions: a [kw*kh, qw*qh, heads] plus ph[key row] + pw[key column] per query."""
    return _add_rel_pos(ctx, a, pw, ph, False)


def add_rel_pos_inplace(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    return _add_rel_pos(ctx, a, pw, ph, True)


__all__ = ["add_rel_pos", "add_rel_pos_inplace", "get_rel_pos", "rope_ext_back", "rope_multi_back", "win_part",
           "win_unpart"]
