"""The numpy oracle's formulas of the recurrent-state ops (SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN,
RWKV_WKV7, GATED_DELTA_NET): float64 from the ops' definitions, sharing no code with the CPU kernels. Each takes
the node, src0's and src1's values (numpy order), dst's numpy shape, and reads its other sources itself."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pyggml.core import memory
from pyggml.core.tensor import GGMLOp, Tensor


def _src(node: Tensor, i: int) -> np.ndarray:
    t = node.src[i]
    assert t is not None
    return memory.tensor_view(t).astype(np.float64)


def ssm_conv(node: Tensor, sx: np.ndarray, c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[s, t, i] = sum_k sx[s, i, t + k] c[i, k]
    windows = sliding_window_view(sx[0], c.shape[-1], axis=-1)  # (n_s, d_inner, n_t, d_conv)
    return np.einsum("sitk,ik->sti", windows, c[0, 0])[None]


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def ssm_scan(node: Tensor, s: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # state = state * exp(dt' A) + B x dt', y = state . C, dt' = softplus(dt); head h uses group h / (nh / ng)
    dt, A, B, C = (_src(node, i) for i in (2, 3, 4, 5))
    ids = memory.tensor_view(node.src[6]).ravel()  # type: ignore[arg-type]
    K = node.get_op_params_i32(0)
    ns, nt, nh, nr = x.shape
    nc = s.shape[3]
    heads_per_group = nh // B.shape[2]
    B, C = np.repeat(B, heads_per_group, axis=2), np.repeat(C, heads_per_group, axis=2)  # (ns, nt, nh, nc)
    state = s[ids]
    y = np.zeros(x.shape)
    slots = np.zeros((K, ns, nh, nr, nc))
    for t in range(nt):
        d = _softplus(dt[0, :, t])  # (ns, nh)
        decay = np.exp(np.einsum("sh,hc->shc", d, A[0, 0]))  # A (nh, 1 or nc)
        state = state * decay[:, :, None, :] + np.einsum("shc,shr->shrc", B[:, t], x[:, t] * d[:, :, None])
        y[:, t] = np.einsum("shrc,shc->shr", state, C[:, t])
        if nt - 1 - t < K:
            slots[nt - 1 - t] = state
    return np.concatenate([y.ravel(), slots.ravel()]).reshape(shape)


def _linear_attn(node: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    n_src = {GGMLOp.RWKV_WKV6: 6, GGMLOp.GATED_LINEAR_ATTN: 5, GGMLOp.RWKV_WKV7: 7}[node.op]
    srcs = [_src(node, i) for i in range(n_src)]
    state = srcs[-1]
    n_seqs = state.shape[2]
    _, T, H, S = srcs[1].shape
    per = T // n_seqs
    skip = 3 if node.op == GGMLOp.RWKV_WKV6 else -1  # WKV6's tf: [S, H], not per token
    tok = [a.reshape(n_seqs, per, H, S) for i, a in enumerate(srcs[:-1]) if i != skip]
    st = state.reshape(n_seqs, H, S, S)
    out = np.zeros((n_seqs, per, H, S))
    for t in range(per):
        if node.op == GGMLOp.RWKV_WKV6:  # st[i, j]: i over k, j over v; tf per head and i
            k, v, r, td = (a[:, t] for a in tok)
            tf = srcs[3].reshape(H, S)
            kv = np.einsum("nhi,nhj->nhij", k, v)
            out[:, t] = np.einsum("nhi,nhij->nhj", r, tf[None, :, :, None] * kv + st)
            st = st * td[..., None] + kv
        elif node.op == GGMLOp.GATED_LINEAR_ATTN:
            k, v, q, g = (a[:, t] for a in tok)
            st = st * g[..., None] + np.einsum("nhi,nhj->nhij", k, v)
            out[:, t] = np.einsum("nhi,nhij->nhj", q * node.get_op_params_f32(0), st)
        else:  # RWKV-7, st[i, j]: i over v, j over k
            r, w, k, v, a, b = (a_[:, t] for a_ in tok)
            sa = np.einsum("nhij,nhj->nhi", st, a)
            st = st * w[:, :, None, :] + np.einsum("nhi,nhj->nhij", v, k) + np.einsum("nhi,nhj->nhij", sa, b)
            out[:, t] = np.einsum("nhij,nhj->nhi", st, r)
    return np.concatenate([out.ravel(), st.ravel()]).reshape(shape)


def linear_attn(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return _linear_attn(node, shape)


def gated_delta_net(node: Tensor, q: np.ndarray, k: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # on S[i, j] (stored transposed): S *= exp(g) (row i by exp(g_i) for KDA); S += k (beta (v - k S)); o = q S / sqrt
    v, g, beta, state = (_src(node, i) for i in (2, 3, 4, 5))
    K = node.get_op_params_i32(0)
    n_seqs, T, H, S_v = v.shape
    # q/k head h is h % H_k (tiled), sequence n is n / (n_seqs / n_seqs_k)
    q = np.tile(np.repeat(q, n_seqs // q.shape[0], axis=0), (1, 1, H // q.shape[2], 1))
    k = np.tile(np.repeat(k, n_seqs // k.shape[0], axis=0), (1, 1, H // k.shape[2], 1))
    St = state.swapaxes(-1, -2)
    out = np.zeros(v.shape)
    slots = np.zeros((K,) + state.shape)
    for t in range(T):
        St = St * np.exp(g[:, t])[..., :, None]
        delta = (v[:, t] - np.einsum("nhi,nhij->nhj", k[:, t], St)) * beta[:, t]
        St = St + np.einsum("nhi,nhj->nhij", k[:, t], delta)
        out[:, t] = np.einsum("nhi,nhij->nhj", q[:, t], St) / np.sqrt(S_v)
        if T - 1 - t < K:
            slots[T - 1 - t] = St.swapaxes(-1, -2)
    return np.concatenate([out.ravel(), slots.ravel()]).reshape(shape)


SSM_FORMULAS = {
    GGMLOp.SSM_CONV: ssm_conv, GGMLOp.SSM_SCAN: ssm_scan, GGMLOp.RWKV_WKV6: linear_attn,
    GGMLOp.GATED_LINEAR_ATTN: linear_attn, GGMLOp.RWKV_WKV7: linear_attn, GGMLOp.GATED_DELTA_NET: gated_delta_net,
}
