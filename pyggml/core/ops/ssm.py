"""Recurrent-state ops: SSM_CONV and SSM_SCAN (Mamba), RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 and
GATED_DELTA_NET.

Shapes, asserts and op_params as llama.cpp 0c1e570's ggml.c builds them. Each result packs the per-token outputs
followed by the new states (one F32 tensor), as ggml's do. ggml's GGML_ASSERTs become ShapeError /
ArgumentError / UnsupportedTypeError naming the op and the operands; so do the rules ggml's kernels read without
asserting them (a token count that splits into sequences, q/k heads that broadcast over v's), which would make
ggml read out of bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.ops._build import require, require_arg, set_op
from pyggml.core.ops.params import GatedDeltaNetParams, GatedLinearAttnParams, SsmScanParams
from pyggml.core.tensor import GGMLOp, Tensor, are_same_shape
from pyggml.core.types import TYPE_TRAITS, GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

_INT32_MAX = 2**31 - 1


def _require_f32(op: str, *tensors: Tensor) -> None:
    for t in tensors:
        if t.type != GGMLType.F32:
            raise UnsupportedTypeError(f"{op}: tensor '{t.name}' has type {t.type.name}; ggml takes F32")


def _rows_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous_rows: the elements of a row are adjacent."""
    return t.ne[0] == TYPE_TRAITS[t.type].blck_size or t.nb[0] == t.element_size()


def ssm_conv(ctx: Context, sx: Tensor, c: Tensor) -> Tensor:
    """Mamba's causal depthwise conv1d: sx [d_conv - 1 + n_t, d_inner, n_s] (the conv state and the tokens of
    each sequence), c [d_conv, d_inner] -> [d_inner, n_t, n_s] F32, out[i, t, s] = sum_k sx[t + k, i, s] c[k, i]."""
    fn = "ssm_conv"
    require(sx.ne[3] == 1, fn, "sx must be 3-D (ne[3] == 1)", sx, c)
    require(c.is_matrix(), fn, "c must be a matrix (ne[2] == ne[3] == 1)", sx, c)
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    require(sx.ne[1] == d_inner, fn, f"sx.ne[1]={sx.ne[1]} must be c's d_inner={d_inner}", sx, c)
    require(n_t >= 0, fn, f"sx.ne[0]={sx.ne[0]} must hold d_conv - 1 = {d_conv - 1} columns at least", sx, c)
    result = ctx.new_tensor_3d(GGMLType.F32, d_inner, n_t, sx.ne[2])
    return set_op(result, GGMLOp.SSM_CONV, sx, c)


def ssm_scan(ctx: Context, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ids: Tensor,
             K: int) -> Tensor:
    """Mamba's selective scan.

        s   [d_state, head_dim, n_head, >= n_seqs]   states, sequence i starts from s[..., ids[i]]
        x   [head_dim, n_head, n_seq_tokens, n_seqs]
        dt  [n_head, n_seq_tokens, n_seqs]
        A   [1 or d_state, n_head]                   (d_state: Mamba-1, only with K == 1)
        B,C [d_state, n_group, n_seq_tokens, n_seqs] (n_head a multiple of n_group)
        ids [n_seqs] I32

    -> 1-D F32: y [head_dim, n_head, n_seq_tokens, n_seqs], then K state slots [d_state, head_dim, n_head,
    n_seqs] (slot 0 the final state, slot j the state j tokens back). op_params: K.
    """
    fn = "ssm_scan"
    require_arg(1 <= K <= _INT32_MAX, fn, f"K={K} must be in [1, {_INT32_MAX}]")
    for t, what in ((s, "s"), (dt, "dt"), (A, "A")):
        require(t.is_contiguous(), fn, f"{what} must be contiguous", t)
    for t, what in ((x, "x"), (B, "B"), (C, "C")):
        require(t.nb[0] == t.element_size() and t.nb[1] == t.ne[0] * t.nb[0], fn,
                f"{what} must have contiguous rows and dims 0-1 packed (nb[1] == ne[0]*nb[0])", t)
    require(are_same_shape(B, C), fn, "B and C must have the same shape", B, C)
    if ids.type != GGMLType.I32:
        raise UnsupportedTypeError(f"{fn}: ids '{ids.name}' has type {ids.type.name}; ggml takes I32")
    d_state, head_dim, n_head, n_seq_tokens, n_seqs = s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]
    require(dt.ne[:4] == [n_head, n_seq_tokens, n_seqs, 1], fn,
            f"dt must be [n_head={n_head}, n_seq_tokens={n_seq_tokens}, n_seqs={n_seqs}]", x, dt)
    require(s.ne[1] == head_dim and s.ne[2] == n_head, fn,
            f"s must be [d_state, head_dim={head_dim}, n_head={n_head}, ...]", s, x)
    require(B.ne[0] == d_state and B.ne[2] == n_seq_tokens and B.ne[3] == n_seqs, fn,
            f"B must be [d_state={d_state}, n_group, n_seq_tokens={n_seq_tokens}, n_seqs={n_seqs}]", s, x, B)
    # ggml's kernel maps head h to group h / (n_head / n_group)
    require(B.ne[1] >= 1 and n_head % B.ne[1] == 0, fn,
            f"n_head={n_head} must be a multiple of B's n_group={B.ne[1]}", x, B)
    require(ids.is_vector() and ids.ne[0] == n_seqs, fn, f"ids must be a vector of n_seqs={n_seqs}", x, ids)
    require(A.is_matrix() and A.ne[1] == n_head, fn, f"A must be a matrix [1 or d_state, n_head={n_head}]", A, x)
    require(A.ne[0] in (1, d_state), fn, f"A.ne[0]={A.ne[0]} must be 1 (Mamba-2) or d_state={d_state} (Mamba-1)", A)
    require_arg(A.ne[0] == 1 or K == 1, fn, f"K={K} > 1 needs a scalar decay per head (A.ne[0] == 1)", A)
    n = x.nelements() + K * d_state * head_dim * n_head * ids.ne[0]
    result = ctx.new_tensor_1d(GGMLType.F32, n)
    return set_op(result, GGMLOp.SSM_SCAN, s, x, dt, A, B, C, ids, params=SsmScanParams(K=K))


def _check_linear_attn(fn: str, state: Tensor, first: Tensor, *others: tuple[str, Tensor]) -> tuple[int, int]:
    """The rules RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7 share: every input contiguous and of k's (`first`)
    shape [S, H, n_tokens], the state S*S*H*n_seqs floats with n_seqs = state.ne[1]; (S, H) returned."""
    for what, t in (("k", first), *others, ("state", state)):
        require(t.is_contiguous(), fn, f"{what} must be contiguous", t)
    S, H, n_tokens = first.ne[0], first.ne[1], first.ne[2]
    for what, t in others:
        require(are_same_shape(t, first), fn, f"{what} must be [S={S}, H={H}, n_tokens={n_tokens}]", first, t)
    require(first.ne[3] == 1, fn, "the inputs must be 3-D [S, H, n_tokens]", first)
    n_seqs = state.ne[1]
    require(n_seqs >= 1 and state.nelements() == S * S * H * n_seqs, fn,
            f"state must hold S*S*H*n_seqs = {S}*{S}*{H}*{n_seqs} elements (n_seqs = state.ne[1])", first, state)
    # ggml's kernels give each sequence n_tokens / n_seqs consecutive tokens
    require(n_tokens % n_seqs == 0, fn, f"n_tokens={n_tokens} must be a multiple of n_seqs={n_seqs}", first, state)
    return S, H


def _packed_result(ctx: Context, S: int, H: int, n_tokens: int, n_seqs: int) -> Tensor:
    """[S*H, n_tokens + S*n_seqs]: the outputs, then the new states."""
    return ctx.new_tensor_2d(GGMLType.F32, S * H, n_tokens + S * n_seqs)


def rwkv_wkv6(ctx: Context, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    """RWKV-6's WKV: k, v, r, td [S, H, n_tokens], tf [S, H] (time_faaaa), state [S*S*H, n_seqs] ->
    [S*H, n_tokens + S*n_seqs] F32 (outputs, then the new states)."""
    fn = "rwkv_wkv6"
    S, H = _check_linear_attn(fn, state, k, ("v", v), ("r", r), ("td", td))
    require(tf.is_contiguous(), fn, "tf must be contiguous", tf)
    require(tf.nelements() == S * H, fn, f"tf must hold S*H = {S}*{H} elements", k, tf)
    result = _packed_result(ctx, S, H, k.ne[2], state.ne[1])
    return set_op(result, GGMLOp.RWKV_WKV6, k, v, r, tf, td, state)


def gated_linear_attn(ctx: Context, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor,
                      scale: float) -> Tensor:
    """Gated linear attention: k, v, q, g [S, H, n_tokens], state [S*S*H, n_seqs] ->
    [S*H, n_tokens + S*n_seqs] F32 (outputs, then the new states). op_params: scale."""
    fn = "gated_linear_attn"
    S, H = _check_linear_attn(fn, state, k, ("v", v), ("q", q), ("g", g))
    result = _packed_result(ctx, S, H, k.ne[2], state.ne[1])
    return set_op(result, GGMLOp.GATED_LINEAR_ATTN, k, v, q, g, state, params=GatedLinearAttnParams(scale=scale))


def rwkv_wkv7(ctx: Context, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
              state: Tensor) -> Tensor:
    """RWKV-7's WKV: r, w, k, v, a, b [S, H, n_tokens], state [S*S*H, n_seqs] ->
    [S*H, n_tokens + S*n_seqs] F32 (outputs, then the new states)."""
    fn = "rwkv_wkv7"
    S, H = _check_linear_attn(fn, state, k, ("r", r), ("w", w), ("v", v), ("a", a), ("b", b))
    result = _packed_result(ctx, S, H, k.ne[2], state.ne[1])
    return set_op(result, GGMLOp.RWKV_WKV7, r, w, k, v, a, b, state)


def gated_delta_net(ctx: Context, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    K: int) -> Tensor:
    """The gated delta rule (Qwen3-Next, Kimi linear attention).

        q, k  [S_v, H_k, n_tokens, n_seqs_k]  (H_v a multiple of H_k, heads tiled; n_seqs a multiple of n_seqs_k)
        v     [S_v, H_v, n_tokens, n_seqs]
        g     [1 or S_v, H_v, n_tokens, n_seqs]  (a scalar gate per head, or one per state row: KDA)
        beta  [1, H_v, n_tokens, n_seqs]
        state [S_v, S_v, H_v, n_seqs]

    -> [S_v*H_v, n_tokens*n_seqs + K*S_v*n_seqs] F32: the outputs, then K state slots (slot 0 the final state,
    slot j the state j tokens back; only the last min(n_tokens, K) are written). op_params: K.
    """
    fn = "gated_delta_net"
    for what, t in (("q", q), ("k", k), ("v", v)):
        require(_rows_contiguous(t), fn, f"{what} must have contiguous rows", t)
    for what, t in (("g", g), ("beta", beta), ("state", state)):
        require(t.is_contiguous(), fn, f"{what} must be contiguous", t)
    _require_f32(fn, q, k, v, g, beta, state)
    S_v, H, n_tokens, n_seqs = v.ne
    require(g.ne[0] in (1, S_v), fn, f"g.ne[0]={g.ne[0]} must be 1 or S_v={S_v}", v, g)
    require(g.ne[1:] == [H, n_tokens, n_seqs], fn, f"g must be [1 or S_v, H={H}, n_tokens={n_tokens}, "
            f"n_seqs={n_seqs}]", v, g)
    require(beta.ne == [1, H, n_tokens, n_seqs], fn, f"beta must be [1, H={H}, n_tokens={n_tokens}, "
            f"n_seqs={n_seqs}]", v, beta)
    require(state.ne == [S_v, S_v, H, n_seqs], fn, f"state must be [S_v={S_v}, S_v, H={H}, n_seqs={n_seqs}]",
            v, state)
    # what ggml's kernel reads without asserting it: S_v floats of q and k per head, heads and sequences broadcast
    for what, t in (("q", q), ("k", k)):
        require(t.ne[0] == S_v and t.ne[2] == n_tokens, fn,
                f"{what} must be [S_v={S_v}, H_k, n_tokens={n_tokens}, ...]", t, v)
        require(t.ne[1] >= 1 and H % t.ne[1] == 0 and t.ne[3] >= 1 and n_seqs % t.ne[3] == 0, fn,
                f"{what}'s heads and sequences must divide v's ({H}, {n_seqs})", t, v)
    require_arg(1 <= K <= _INT32_MAX, fn, f"K={K} must be in [1, {_INT32_MAX}]", v)
    result = ctx.new_tensor_2d(GGMLType.F32, S_v * H, n_tokens * n_seqs + K * S_v * n_seqs)
    return set_op(result, GGMLOp.GATED_DELTA_NET, q, k, v, g, beta, state, params=GatedDeltaNetParams(K=K))


__all__ = ["gated_delta_net", "gated_linear_attn", "rwkv_wkv6", "rwkv_wkv7", "ssm_conv", "ssm_scan"]
