"""ROPE_BACK (ggml_rope_ext_back, ggml_rope_multi_back), SAM's ops (WIN_PART, WIN_UNPART, GET_REL_POS,
ADD_REL_POS), DeepSeek-V4's LIGHTNING_INDEXER and hyper-connections (DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST).

Shapes, types and op_params as llama.cpp 0c1e570's ggml.c builds them:
- ROPE_BACK: ROPE's node (`rope_impl`, RopeParams) with the op changed; its kernel turns by -theta.
- WIN_PART: [npx, npy, w]; WIN_UNPART: [w]; ADD_REL_POS: [inplace]; GET_REL_POS: none.
- DSV4_HC_COMB: [eps f32, n_iter]; DSV4_HC_PRE: [scale f32, gated]; DSV4_HC_POST, LIGHTNING_INDEXER: none.
ggml's GGML_ASSERTs become ShapeError / ArgumentError / UnsupportedTypeError naming the op and operands;
so do the divisions by w that ggml leaves unchecked (w > 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.checks import check_real
from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import require, require_arg, same_or_view, set_op
from pyggml.core.ops.norm import rope_impl
from pyggml.core.ops.params import AddRelPosParams, Dsv4HcCombParams, Dsv4HcPreParams, WinPartParams, WinUnpartParams
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


# --- DeepSeek-V4: the lightning indexer and hyper-connections ---


def lightning_indexer(ctx: Context, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """DSA's indexer scores: res[kv, t, s] = sum_h relu(q[:, h, t, s] . k[:, 0, kv, s]) * weights[h, t, s] +
    mask[kv, t, s % mask.ne[3]]; q [D, H, T, S] F32, k [D, 1, KV, S], weights [H, T, 1, S] F32, mask F16."""
    op = "lightning_indexer"
    _require_f32(op, q, weights)
    if mask.type != GGMLType.F16:
        raise UnsupportedTypeError(f"{op}: mask '{mask.name}' has type {mask.type.name}; ggml takes F16")
    require(q.ne[0] == k.ne[0], op, f"q.ne[0]={q.ne[0]} must equal k.ne[0]={k.ne[0]}", q, k)
    require(mask.ne[0] == k.ne[2], op, f"mask.ne[0]={mask.ne[0]} must equal k.ne[2]={k.ne[2]}", mask, k)
    require(q.ne[1] == weights.ne[0], op, f"q.ne[1]={q.ne[1]} must equal weights.ne[0]={weights.ne[0]}", q, weights)
    require(k.ne[1] == 1, op, f"k.ne[1]={k.ne[1]} must be 1", k)
    require(mask.ne[1] == q.ne[2], op, f"mask.ne[1]={mask.ne[1]} must equal q.ne[2]={q.ne[2]}", mask, q)
    require(q.ne[2] == weights.ne[1], op, f"q.ne[2]={q.ne[2]} must equal weights.ne[1]={weights.ne[1]}", q, weights)
    require(weights.ne[2] == 1 and mask.ne[2] == 1, op, "weights.ne[2] and mask.ne[2] must be 1", weights, mask)
    require(q.ne[3] == k.ne[3] == weights.ne[3], op, "q, k and weights must have the same ne[3]", q, k, weights)
    require(weights.ne[3] % mask.ne[3] == 0, op,
            f"weights.ne[3]={weights.ne[3]} must be a multiple of mask.ne[3]={mask.ne[3]}", weights, mask)
    result = ctx.new_tensor(GGMLType.F32, [k.ne[2], q.ne[2], 1, q.ne[3]])
    return set_op(result, GGMLOp.LIGHTNING_INDEXER, q, k, weights, mask)


def dsv4_hc_comb(ctx: Context, mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
    """Hyper-connections' combination matrices [hc, hc, T] (hc = 4) from mixes [(2 + hc)*hc, T]: a softmax over
    dst of mixes*scale[2] + base, then n_iter rounds of Sinkhorn normalization (columns, then rows and columns)."""
    op = "dsv4_hc_comb"
    _require_f32(op, mixes, scale, base)
    eps = check_real(eps, f"{op}: eps", finite=True)
    require_arg(n_iter > 0, op, f"n_iter={n_iter} must be > 0", mixes)
    dim = mixes.ne[0]
    hc = next((i for i in range(1, dim + 1) if (2 + i) * i == dim), 0)  # (2 + i)*i grows with i: at most one
    require(hc == 4, op, f"mixes.ne[0]={dim} must be (2 + hc)*hc with hc = 4", mixes)
    require(mixes.ne[2] == 1 and mixes.ne[3] == 1, op, "mixes must be 2-D", mixes)
    require(scale.ne[0] >= 3 and scale.ne[1] == scale.ne[2] == scale.ne[3] == 1, op,
            "scale must be a vector of at least 3", scale)
    require(base.ne == [dim, 1, 1, 1], op, f"base must be a vector of mixes.ne[0]={dim}", base, mixes)
    result = ctx.new_tensor(GGMLType.F32, [hc, hc, mixes.ne[1], 1])
    return set_op(result, GGMLOp.DSV4_HC_COMB, mixes, scale, base, params=Dsv4HcCombParams(eps=eps, n_iter=n_iter))


def _dsv4_hc_pre(ctx: Context, x: Tensor, weights: Tensor, scale: float, gated: bool) -> Tensor:
    op = "dsv4_hc_pre_gated" if gated else "dsv4_hc_pre"
    _require_f32(op, x, weights)
    scale = check_real(scale, f"{op}: scale", finite=True)
    n_embd, hc, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    require(hc > 0 and x.ne[3] == 1, op, "x must be [n_embd, hc > 0, n_tokens]", x)
    want = [n_embd, hc, n_tokens, 1] if gated else [hc, n_tokens, 1, 1]
    require(weights.ne == want, op, f"{'the gate' if gated else 'weights'} must have ne {want}", weights, x)
    result = ctx.new_tensor(GGMLType.F32, [n_embd, n_tokens, 1, 1])
    return set_op(result, GGMLOp.DSV4_HC_PRE, x, weights, params=Dsv4HcPreParams(scale=scale, gated=gated))


def dsv4_hc_pre(ctx: Context, x: Tensor, weights: Tensor) -> Tensor:
    """The streams of x [n_embd, hc, T] mixed into one: result[i, t] = sum_h x[i, h, t] * weights[h, t]."""
    return _dsv4_hc_pre(ctx, x, weights, 1.0, False)


def dsv4_hc_pre_gated(ctx: Context, x: Tensor, gate: Tensor, scale: float) -> Tensor:
    """result[i, t] = scale * sum_h x[i, h, t] * sigmoid(gate[i, h, t])."""
    return _dsv4_hc_pre(ctx, x, gate, scale, True)


def dsv4_hc_post(ctx: Context, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None) -> Tensor:
    """x [n_embd, T] spread back to hc streams: result[i, d, t] = x[i, t] * post[d, t] + sum_s residual[i, s, t] *
    comb[d, s, t] (comb None: + residual[i, d, t])."""
    op = "dsv4_hc_post"
    _require_f32(op, x, residual, post)
    n_embd, n_tokens, hc = x.ne[0], x.ne[1], residual.ne[1]
    require(hc > 0 and x.ne[2] == 1 and x.ne[3] == 1, op, "x must be [n_embd, n_tokens], residual's hc > 0",
            x, residual)
    require(residual.ne[0] == n_embd and residual.ne[2] == n_tokens and residual.ne[3] == 1, op,
            f"residual must be [n_embd={n_embd}, hc, n_tokens={n_tokens}]", residual, x)
    require(post.ne == [hc, n_tokens, 1, 1], op, f"post must be [hc={hc}, n_tokens={n_tokens}]", post)
    if comb is not None:
        _require_f32(op, comb)
        require(comb.ne == [hc, hc, n_tokens, 1], op, f"comb must be [hc={hc}, hc, n_tokens={n_tokens}]", comb)
    result = ctx.new_tensor(GGMLType.F32, [n_embd, hc, n_tokens, 1])
    return set_op(result, GGMLOp.DSV4_HC_POST, x, residual, post, comb)


__all__ = ["add_rel_pos", "add_rel_pos_inplace", "dsv4_hc_comb", "dsv4_hc_post", "dsv4_hc_pre", "dsv4_hc_pre_gated",
           "get_rel_pos", "lightning_indexer", "rope_ext_back", "rope_multi_back", "win_part", "win_unpart"]
