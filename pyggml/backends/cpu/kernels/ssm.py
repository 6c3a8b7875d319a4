"""CPU kernels of SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 and GATED_DELTA_NET (F32, as ggml-cpu's
ops.cpp): tokens in order, every sequence and head of a token at once; outputs packed first, then the states."""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, element_math
from pyggml.backends.cpu.kernels._common import F32, noop, require_types
from pyggml.core.errors import OutOfBoundsError, ShapeError
from pyggml.core.ops.params import GatedDeltaNetParams, GatedLinearAttnParams, SsmScanParams
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

_F32 = (GGMLType.F32,)


def _srcs(node: Tensor, srcs: list[np.ndarray | None], n: int) -> list[np.ndarray]:
    out = []
    for i in range(n):
        a = srcs[i]
        if a is None or node.src[i] is None:
            raise ShapeError(f"CPU {node.op.name} '{node.name}': src[{i}] is missing")
        out.append(a)
    return out


def _flat(a: np.ndarray, shape: tuple[int, ...], node: Tensor, what: str) -> np.ndarray:
    """A contiguous view's elements as `shape`, never a copy (the kernel must read the memory at compute time)."""
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': {what} must be contiguous") from None


def _require_size(node: Tensor, dst: np.ndarray, n: int) -> None:
    if dst.size != n:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': dst has {dst.size} elements, the sources make {n}")


def _rows_contiguous(a: np.ndarray) -> bool:
    return a.shape[-1] <= 1 or a.strides[-1] == a.itemsize


def ssm_conv_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[s, t, i] = sum_k sx[s, i, t + k] * c[i, k], summed over k in order in float32 (as ggml's loop)."""
    require_types(node, _F32, node, node.src[0], node.src[1])
    sx, c = _srcs(node, srcs, 2)
    n_s, d_inner, ncs = sx.shape[1:]
    nc = c.shape[3]
    n_t = ncs - nc + 1
    if dst.shape != (1, n_s, n_t, d_inner) or c.shape[:3] != (1, 1, d_inner) or sx.shape[0] != 1 or n_t < 0:
        raise ShapeError(f"CPU SSM_CONV '{node.name}': sx ne {list(sx.shape[::-1])}, c ne {list(c.shape[::-1])}, "
                         f"dst ne {list(dst.shape[::-1])}")
    if dst.size == 0:
        return noop
    x = sx[0]  # (n_s, d_inner, ncs)
    w = c[0, 0]
    out = dst[0].transpose(0, 2, 1)  # (n_s, d_inner, n_t), dst's memory
    acc = np.empty(out.shape, dtype=F32)
    tmp = np.empty(out.shape, dtype=F32)

    def run() -> None:
        np.multiply(x[:, :, 0:n_t], w[:, 0:1], out=acc)
        for k in range(1, nc):
            np.multiply(x[:, :, k:k + n_t], w[:, k:k + 1], out=tmp)
            np.add(acc, tmp, out=acc)
        out[...] = acc

    return run


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_compute_softplus_f32: x above 20, else logf(1 + expf(x)), in float32."""
    return element_math.ufunc("softplus")(x)


def ssm_scan_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Per token: state = state * exp(softplus(dt) * A) + B * x * softplus(dt); y = state · C (per head's group)."""
    require_types(node, _F32, node, *node.src[:6])
    require_types(node, (GGMLType.I32,), node.src[6])
    s, x, dt, A, B, C, ids = _srcs(node, srcs, 7)
    K = SsmScanParams.of(node).K
    n_s_all, nh, nr, nc = s.shape
    ns, nt = x.shape[0], x.shape[1]
    ng = B.shape[2]
    a0 = A.shape[3]
    if x.shape[2:] != (nh, nr) or B.shape != C.shape or B.shape[:2] != (ns, nt) or B.shape[3] != nc \
            or dt.shape[1:] != (ns, nt, nh) or A.shape[2] != nh or a0 not in (1, nc) or ids.shape[3] != ns \
            or ng < 1 or nh % ng or K < 1 or (a0 != 1 and K != 1) or 0 in A.shape[:2] + dt.shape[:1] + ids.shape[:3]:
        raise ShapeError(f"CPU SSM_SCAN '{node.name}': the sources' shapes do not fit (s ne {list(s.shape[::-1])}, "
                         f"x ne {list(x.shape[::-1])}, B ne {list(B.shape[::-1])}, A ne {list(A.shape[::-1])}, K={K})")
    n_y = ns * nt * nh * nr
    n_state = ns * nh * nr * nc
    _require_size(node, dst, n_y + K * n_state)
    flat = _flat(dst, (dst.size,), node, "dst")
    y = flat[:n_y].reshape(ns, nt, nh, nr)
    states = flat[n_y:].reshape(K, ns, nh, nr, nc)
    group = np.arange(nh) // (nh // ng)  # ggml's repeat_interleave of the groups over the heads
    a = A[0, 0]
    dts = dt[0]
    idx = ids[0, 0, 0]

    def run() -> None:
        seq = idx.astype(np.int64)
        if ((seq < 0) | (seq >= n_s_all)).any():
            bad = int(seq[(seq < 0) | (seq >= n_s_all)][0])
            raise OutOfBoundsError(f"CPU SSM_SCAN '{node.name}': ids holds {bad}, s has {n_s_all} sequences")
        if nt == 0:
            return  # ggml writes no state without a token
        state = s[seq]  # (ns, nh, nr, nc), a copy: the sources stay as they are
        for t in range(nt):
            sp = softplus(dts[:, t])
            x_dt = x[:, t] * sp[:, :, None]
            b = B[:, t][:, group]
            cc = C[:, t][:, group]
            if a0 == 1:
                decay = element_math.ufunc("exp")(sp * a[:, 0])[:, :, None, None]  # Mamba-2: one decay per head
            else:
                decay = element_math.ufunc("exp")(sp[:, :, None] * a)[:, :, None, :]  # Mamba-1: one per state element
            state *= decay
            state += b[:, :, None, :] * x_dt[:, :, :, None]
            np.matmul(state, cc[:, :, :, None], out=y[:, t, :, :, None])
            slot = nt - 1 - t
            if 0 < slot < K:
                states[slot] = state
        states[0] = state

    return run


# --- RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7: tokens [S, H, n_tokens], states [S*S*H, n_seqs] ---


def _linear_attn_views(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], n_src: int,
                       state_src: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """Token inputs and outputs as (n_seqs, n_seq_tokens, H, S), states as (n_seqs, H, S, S); and S, H, n_seq_tokens."""
    require_types(node, _F32, node, *node.src[:n_src])
    arrays = _srcs(node, srcs, n_src)
    v = arrays[1] if node.op != GGMLOp.RWKV_WKV7 else arrays[3]
    T, H = v.shape[1], v.shape[2]
    C = dst.shape[3]
    n_seqs = arrays[state_src].shape[2]
    if H < 1 or C % H or n_seqs < 1 or T % n_seqs:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': {T} tokens, {H} heads, {n_seqs} sequences do not fit "
                         f"dst ne {list(dst.shape[::-1])}")
    S = C // H
    n_seq_tokens = T // n_seqs
    _require_size(node, dst, C * (T + S * n_seqs))
    flat = _flat(dst, (dst.size,), node, "dst")
    out = flat[:C * T].reshape(n_seqs, n_seq_tokens, H, S)
    new_state = flat[C * T:].reshape(n_seqs, H, S, S)
    # every source but the state (and WKV6's tf, [S, H]) is one row of S per head and token
    skip = {state_src, 3} if node.op == GGMLOp.RWKV_WKV6 else {state_src}
    tokens = [a if i in skip else _flat(a, (n_seqs, n_seq_tokens, H, S), node, f"src[{i}]")
              for i, a in enumerate(arrays)]
    state = _flat(arrays[state_src], (n_seqs, H, S, S), node, "the state")
    return tokens, state, out, new_state, S, H, n_seq_tokens


def rwkv_wkv6_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                     params: ComputeParams) -> Compute:
    """Per token and head (state s[i, j], i over k, j over v): kv = k_i v_j; out_j = sum_i r_i (tf_i kv + s);
    s = s * td_i + kv."""
    tokens, state, out, new_state, S, H, n_seq_tokens = _linear_attn_views(node, dst, srcs, 6, 5)
    k, v, r, _, td, _ = tokens
    tf = _flat(tokens[3], (H, S), node, "tf")[None, :, :, None]

    def run() -> None:
        s = state.copy()
        for t in range(n_seq_tokens):
            kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # (n_seqs, H, S, S)
            np.matmul(r[:, t, :, None, :], tf * kv + s, out=out[:, t, :, None, :])
            s *= td[:, t, :, :, None]
            s += kv
        new_state[...] = s

    return run


def gated_linear_attn_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                             params: ComputeParams) -> Compute:
    """Per token and head: s = s * g_i + k_i v_j; out_j = sum_i (q_i * scale) s[i, j]."""
    tokens, state, out, new_state, S, H, n_seq_tokens = _linear_attn_views(node, dst, srcs, 5, 4)
    k, v, q, g, _ = tokens
    scale = np.float32(GatedLinearAttnParams.of(node).scale)

    def run() -> None:
        s = state.copy()
        for t in range(n_seq_tokens):
            s *= g[:, t, :, :, None]
            s += k[:, t, :, :, None] * v[:, t, :, None, :]
            np.matmul((q[:, t] * scale)[:, :, None, :], s, out=out[:, t, :, None, :])
        new_state[...] = s

    return run


def rwkv_wkv7_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                     params: ComputeParams) -> Compute:
    """Per token and head (state s[i, j], i over v, j over k): sa_i = sum_j a_j s[i, j];
    s[i, j] = s[i, j] w_j + v_i k_j + sa_i b_j; out_i = sum_j s[i, j] r_j."""
    tokens, state, out, new_state, S, H, n_seq_tokens = _linear_attn_views(node, dst, srcs, 7, 6)
    r, w, k, v, a, b, _ = tokens

    def run() -> None:
        s = state.copy()
        for t in range(n_seq_tokens):
            sa = np.matmul(s, a[:, t, :, :, None])  # (n_seqs, H, S, 1)
            s *= w[:, t, :, None, :]
            s += v[:, t, :, :, None] * k[:, t, :, None, :]
            s += sa * b[:, t, :, None, :]
            np.matmul(s, r[:, t, :, :, None], out=out[:, t, :, :, None])
        new_state[...] = s

    return run


def gated_delta_net_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                           params: ComputeParams) -> Compute:
    """Per token and head, on M = S^T (ggml keeps the state transposed: M[j, i] = S[i, j]):
    M *= exp(g) (per column i for KDA); delta = (v - M k) * beta; M += delta k^T; out = (M q) / sqrt(S_v)."""
    require_types(node, _F32, node, *node.src[:6])
    q, k, v, g, beta, state = _srcs(node, srcs, 6)
    K = GatedDeltaNetParams.of(node).K
    n_seqs, n_tokens, H, S_v = v.shape
    if state.shape != (n_seqs, H, S_v, S_v) or g.shape[:3] != (n_seqs, n_tokens, H) or g.shape[3] not in (1, S_v) \
            or beta.shape != (n_seqs, n_tokens, H, 1) or K < 1:
        raise ShapeError(f"CPU GATED_DELTA_NET '{node.name}': v ne {list(v.shape[::-1])}, g ne {list(g.shape[::-1])}, "
                         f"beta ne {list(beta.shape[::-1])}, state ne {list(state.shape[::-1])}, K={K}")
    for what, a in (("q", q), ("k", k)):
        nq3, _, nq1, nq0 = a.shape
        if nq0 != S_v or a.shape[1] != n_tokens or min(nq1, nq3) < 1 or H % nq1 or n_seqs % nq3:
            raise ShapeError(f"CPU GATED_DELTA_NET '{node.name}': {what} ne {list(a.shape[::-1])} does not "
                             f"broadcast over v ne {list(v.shape[::-1])}")
    n_attn = S_v * H * n_tokens * n_seqs
    _require_size(node, dst, n_attn + K * S_v * S_v * H * n_seqs)
    flat = _flat(dst, (dst.size,), node, "dst")
    out = flat[:n_attn].reshape(n_seqs, n_tokens, H, S_v)
    states = flat[n_attn:].reshape(K, n_seqs, H, S_v, S_v)
    # ggml's broadcast: head h reads q/k head h % H_k (tiled), sequence s reads s / (n_seqs / n_seqs_k)
    qi = (np.arange(n_seqs)[:, None] // (n_seqs // q.shape[0]), np.arange(H)[None, :] % q.shape[2])
    ki = (np.arange(n_seqs)[:, None] // (n_seqs // k.shape[0]), np.arange(H)[None, :] % k.shape[2])
    kda = g.shape[3] == S_v
    scale = np.float32(1.0 / np.sqrt(np.float32(S_v)))

    def run() -> None:
        m = state.copy()  # (n_seqs, H, S_v (j), S_v (i))
        for t in range(n_tokens):
            qt = q[:, t][qi]
            kt = k[:, t][ki]
            decay = element_math.ufunc("exp")(g[:, t])  # (n_seqs, H, 1 or S_v)
            m *= decay[:, :, None, :] if kda else decay[:, :, :, None]
            delta = (v[:, t] - np.matmul(m, kt[..., None])[..., 0]) * beta[:, t]
            m += delta[..., :, None] * kt[..., None, :]
            np.matmul(m, qt[..., None], out=out[:, t, :, :, None])
            out[:, t] *= scale
            slot = n_tokens - 1 - t
            if K > 1 and 0 <= slot < K:
                states[slot] = m
        if K == 1:
            states[0] = m  # ggml computes in the slot itself: the state even without a token

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.SSM_CONV: ssm_conv_kernel,
    GGMLOp.SSM_SCAN: ssm_scan_kernel,
    GGMLOp.RWKV_WKV6: rwkv_wkv6_kernel,
    GGMLOp.GATED_LINEAR_ATTN: gated_linear_attn_kernel,
    GGMLOp.RWKV_WKV7: rwkv_wkv7_kernel,
    GGMLOp.GATED_DELTA_NET: gated_delta_net_kernel,
}

_N_SRC: dict[GGMLOp, int] = {GGMLOp.SSM_CONV: 2, GGMLOp.SSM_SCAN: 7, GGMLOp.RWKV_WKV6: 6, GGMLOp.GATED_LINEAR_ATTN: 5,
          GGMLOp.RWKV_WKV7: 7, GGMLOp.GATED_DELTA_NET: 6}


def supports(node: Tensor) -> bool:
    """F32 (SSM_SCAN's ids I32), every source present, in the layouts ggml-cpu's kernels and supports_op assert."""
    n = _N_SRC.get(node.op)
    if n is None or node.type != GGMLType.F32:
        return False
    srcs = node.src[:n]
    if any(s is None for s in srcs):
        return False
    floats = srcs[:6] if node.op == GGMLOp.SSM_SCAN else srcs
    if any(s.type != GGMLType.F32 for s in floats if s is not None):
        return False
    if node.op == GGMLOp.SSM_CONV:
        sx, c = srcs
        assert sx is not None and c is not None
        return sx.nb[0] == 4 and c.nb[0] == 4 and sx.nb[1] == sx.ne[0] * 4
    if node.op == GGMLOp.SSM_SCAN:
        ids, A = srcs[6], srcs[3]
        assert ids is not None and A is not None
        if ids.type != GGMLType.I32 or any(s is not None and s.nb[0] != s.element_size() for s in srcs):
            return False
        return SsmScanParams.of(node).K == 1 or A.ne[0] == 1
    if node.op == GGMLOp.GATED_DELTA_NET:
        return all(s is not None and (s.ne[0] == 1 or s.nb[0] == 4) for s in srcs[:3]) \
            and all(s is not None and s.is_contiguous() for s in srcs[3:])
    return all(s is not None and s.is_contiguous() for s in srcs)


__all__ = ["KERNELS", "gated_delta_net_kernel", "gated_linear_attn_kernel", "rwkv_wkv6_kernel", "rwkv_wkv7_kernel",
           "softplus", "ssm_conv_kernel", "ssm_scan_kernel", "supports"]
