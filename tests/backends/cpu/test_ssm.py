"""The recurrent-state ops (pyggml.core.ops.ssm): builders' shapes, op_params and errors; the CPU kernels against
references written here in float64 (one loop per sequence, head and token, from the ops' definitions); and every
op checker case against real ggml (skipped only without a C compiler)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import new_ctx, run, tensor

from pyggml.backends.cpu import cpu_init
from pyggml.capi import core as capi
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGMLError, OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import GatedDeltaNetParams, GatedLinearAttnParams, SsmScanParams, op_params_of
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend
from pyggml.testing import op_check
from pyggml.testing.cases_ssm import ssm_cases

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
rng = np.random.default_rng(5)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def flat(node: Tensor) -> np.ndarray:
    """A packed result's values, computed, as one float64 vector."""
    return run(node).astype(np.float64).ravel()


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


# --- builders ---


def test_builders_shapes_srcs_and_params() -> None:
    ctx = new_ctx()
    sx, c = ctx.new_tensor_3d(F32, 9, 5, 2), ctx.new_tensor_2d(F32, 4, 5)
    conv = capi.ggml_ssm_conv(ctx, sx, c)
    assert conv.op == GGMLOp.SSM_CONV and conv.ne == [5, 6, 2, 1] and conv.src[:2] == [sx, c]

    s = ctx.new_tensor_4d(F32, 16, 8, 6, 5)  # more state rows than sequences: ids pick them
    x = ctx.new_tensor_4d(F32, 8, 6, 7, 3)
    dt, A = ctx.new_tensor_3d(F32, 6, 7, 3), ctx.new_tensor_2d(F32, 1, 6)
    B = ctx.new_tensor_4d(F32, 16, 2, 7, 3)
    ids = ctx.new_tensor_1d(I32, 3)
    scan = capi.ggml_ssm_scan(ctx, s, x, dt, A, B, B, ids, 4)
    assert scan.op == GGMLOp.SSM_SCAN and scan.type == F32
    assert scan.ne == [8 * 6 * 7 * 3 + 4 * 16 * 8 * 6 * 3, 1, 1, 1]
    assert scan.src[:7] == [s, x, dt, A, B, B, ids] and scan.get_op_params_i32(0) == 4
    assert op_params_of(scan) == SsmScanParams(K=4)

    S, H, T, n = 4, 3, 6, 2
    tok = [ctx.new_tensor_3d(F32, S, H, T) for _ in range(6)]
    st = ctx.new_tensor_2d(F32, S * S * H, n)
    w6 = capi.ggml_rwkv_wkv6(ctx, tok[0], tok[1], tok[2], ctx.new_tensor_2d(F32, S, H), tok[3], st)
    assert w6.op == GGMLOp.RWKV_WKV6 and w6.ne == [S * H, T + S * n, 1, 1] and w6.src[5] is st
    gla = capi.ggml_gated_linear_attn(ctx, tok[0], tok[1], tok[2], tok[3], st, 0.5)
    assert gla.ne == [S * H, T + S * n, 1, 1] and GatedLinearAttnParams.of(gla).scale == 0.5
    w7 = capi.ggml_rwkv_wkv7(ctx, *tok, st)
    assert w7.op == GGMLOp.RWKV_WKV7 and w7.ne == [S * H, T + S * n, 1, 1] and w7.src[:7] == [*tok, st]

    q = ctx.new_tensor_4d(F32, 8, 2, 5, 1)
    v = ctx.new_tensor_4d(F32, 8, 4, 5, 2)
    g, beta = ctx.new_tensor_4d(F32, 8, 4, 5, 2), ctx.new_tensor_4d(F32, 1, 4, 5, 2)
    state = ctx.new_tensor_4d(F32, 8, 8, 4, 2)
    gdn = capi.ggml_gated_delta_net(ctx, q, q, v, g, beta, state, 3)
    assert gdn.op == GGMLOp.GATED_DELTA_NET and gdn.ne == [8 * 4, 5 * 2 + 3 * 8 * 2, 1, 1]
    assert gdn.src[:6] == [q, q, v, g, beta, state] and GatedDeltaNetParams.of(gdn).K == 3
    assert ctx.ssm_conv(sx, c).ne == conv.ne  # the Context methods


def test_builder_errors_name_the_op() -> None:
    ctx = new_ctx()
    c = ctx.new_tensor_2d(F32, 4, 5)
    s = ctx.new_tensor_4d(F32, 16, 8, 6, 3)
    x = ctx.new_tensor_4d(F32, 8, 6, 7, 3)
    dt, A = ctx.new_tensor_3d(F32, 6, 7, 3), ctx.new_tensor_2d(F32, 1, 6)
    B = ctx.new_tensor_4d(F32, 16, 2, 7, 3)
    ids = ctx.new_tensor_1d(I32, 3)
    S, H, T = 4, 3, 6
    tok = ctx.new_tensor_3d(F32, S, H, T)
    st = ctx.new_tensor_2d(F32, S * S * H, 2)
    v = ctx.new_tensor_4d(F32, 8, 4, 5, 2)
    g, beta = ctx.new_tensor_4d(F32, 1, 4, 5, 2), ctx.new_tensor_4d(F32, 1, 4, 5, 2)
    state = ctx.new_tensor_4d(F32, 8, 8, 4, 2)
    bad = [
        (ShapeError, "ssm_conv", lambda: ctx.ssm_conv(ctx.new_tensor_3d(F32, 9, 4, 2), c)),
        (ShapeError, "ssm_conv", lambda: ctx.ssm_conv(ctx.new_tensor_3d(F32, 2, 5, 2), c)),
        (ShapeError, "ssm_conv", lambda: ctx.ssm_conv(ctx.new_tensor_4d(F32, 9, 5, 2, 2), c)),
        (ArgumentError, "ssm_scan", lambda: ctx.ssm_scan(s, x, dt, A, B, B, ids, 0)),
        (ArgumentError, "ssm_scan", lambda: ctx.ssm_scan(s, x, dt, ctx.new_tensor_2d(F32, 16, 6), B, B, ids, 2)),
        (ShapeError, "ssm_scan", lambda: ctx.ssm_scan(s, x, dt, A, ctx.new_tensor_4d(F32, 16, 4, 7, 3),
                                                      ctx.new_tensor_4d(F32, 16, 4, 7, 3), ids, 1)),
        (ShapeError, "ssm_scan", lambda: ctx.ssm_scan(s, x, ctx.new_tensor_3d(F32, 6, 7, 2), A, B, B, ids, 1)),
        (ShapeError, "ssm_scan", lambda: ctx.ssm_scan(s, x, dt, A, B, ctx.new_tensor_4d(F32, 16, 1, 7, 3), ids, 1)),
        (UnsupportedTypeError, "ssm_scan", lambda: ctx.ssm_scan(s, x, dt, A, B, B, ctx.new_tensor_1d(F32, 3), 1)),
        (ShapeError, "ssm_scan", lambda: ctx.ssm_scan(s, ctx.transpose(x), dt, A, B, B, ids, 1)),
        (ShapeError, "rwkv_wkv6", lambda: ctx.rwkv_wkv6(tok, tok, tok, ctx.new_tensor_2d(F32, S, 2), tok, st)),
        (ShapeError, "rwkv_wkv6", lambda: ctx.rwkv_wkv6(tok, tok, tok, ctx.new_tensor_2d(F32, S, H), tok,
                                                        ctx.new_tensor_2d(F32, S * S * H, 4))),
        (ShapeError, "gated_linear_attn", lambda: ctx.gated_linear_attn(tok, ctx.new_tensor_3d(F32, S, H, 5), tok,
                                                                        tok, st, 1.0)),
        (ShapeError, "gated_linear_attn", lambda: ctx.gated_linear_attn(tok, tok, tok, tok,
                                                                        ctx.new_tensor_2d(F32, S * S, 2), 1.0)),
        (ShapeError, "rwkv_wkv7", lambda: ctx.rwkv_wkv7(tok, tok, tok, tok, tok, ctx.transpose(tok), st)),
        (ShapeError, "gated_delta_net", lambda: ctx.gated_delta_net(v, v, v, g, beta,
                                                                    ctx.new_tensor_4d(F32, 8, 8, 4, 1), 1)),
        (ShapeError, "gated_delta_net", lambda: ctx.gated_delta_net(ctx.new_tensor_4d(F32, 8, 3, 5, 2), v, v, g,
                                                                    beta, state, 1)),
        (ShapeError, "gated_delta_net", lambda: ctx.gated_delta_net(v, v, v, ctx.new_tensor_4d(F32, 2, 4, 5, 2),
                                                                    beta, state, 1)),
        (UnsupportedTypeError, "gated_delta_net", lambda: ctx.gated_delta_net(ctx.new_tensor_4d(F16, 8, 4, 5, 2), v,
                                                                              v, g, beta, state, 1)),
        (ArgumentError, "gated_delta_net", lambda: ctx.gated_delta_net(v, v, v, g, beta, state, 0)),
    ]
    for error, name, build in bad:
        with pytest.raises(error, match=name):
            build()


# --- CPU kernels against float64 references ---


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20.0))))


@pytest.mark.parametrize("d_conv, d_inner, n_t, n_s", [(4, 6, 5, 3), (3, 1, 1, 1), (9, 33, 64, 2), (1, 4, 3, 2)])
def test_ssm_conv_matches_numpy(d_conv: int, d_inner: int, n_t: int, n_s: int) -> None:
    ctx = new_ctx()
    sx, c = rand(n_s, d_inner, d_conv - 1 + n_t), rand(d_inner, d_conv)
    got = run(ctx.ssm_conv(tensor(ctx, F32, sx), tensor(ctx, F32, c)))[0]
    want = np.zeros((n_s, n_t, d_inner))
    for s in range(n_s):
        for t in range(n_t):
            for i in range(d_inner):
                want[s, t, i] = sum(float(sx[s, i, t + k]) * float(c[i, k]) for k in range(d_conv))
    close(got, want)


def scan_reference(s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray,
                   ids: np.ndarray, K: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """y (ns, nt, nh, nr) and the written state slots {slot: (ns, nh, nr, nc)}, in float64."""
    ns, nt, nh, nr = x.shape
    ng = B.shape[2]
    y = np.zeros(x.shape)
    slots: dict[int, np.ndarray] = {}
    for i in range(ns):
        state = s[ids[i]].astype(np.float64)
        for t in range(nt):
            for h in range(nh):
                grp = h // (nh // ng)
                d = softplus(np.float64(dt[i, t, h]))
                decay = np.exp(d * A[h].astype(np.float64))  # one value (Mamba-2) or one per state (Mamba-1)
                for r in range(nr):
                    state[h, r] = state[h, r] * decay + B[i, t, grp] * x[i, t, h, r] * d
                    y[i, t, h, r] = state[h, r] @ C[i, t, grp]
            slot = nt - 1 - t
            if slot < K:
                slots.setdefault(slot, np.zeros((ns,) + s.shape[1:]))[i] = state
    return y, slots


@pytest.mark.parametrize("nc, nr, nh, ng, nt, ns, n_state_rows, K, mamba1", [
    (5, 3, 4, 2, 6, 3, 4, 3, False), (8, 1, 6, 3, 4, 2, 2, 1, True), (4, 2, 2, 1, 1, 1, 3, 1, False),
    (6, 4, 3, 3, 2, 2, 2, 5, False),  # K above the token count: slots 2..4 not written
])
def test_ssm_scan_matches_numpy(nc: int, nr: int, nh: int, ng: int, nt: int, ns: int, n_state_rows: int, K: int,
                                mamba1: bool) -> None:
    ctx = new_ctx()
    sv, xv = rand(n_state_rows, nh, nr, nc), rand(ns, nt, nh, nr)
    dtv, Av = rand(ns, nt, nh, lo=-3, hi=3), rand(nh, nc if mamba1 else 1, lo=-1.0, hi=-0.5)
    Bv, Cv = rand(ns, nt, ng, nc), rand(ns, nt, ng, nc)
    idv = rng.permutation(n_state_rows)[:ns].astype(np.int32)
    node = ctx.ssm_scan(tensor(ctx, F32, sv), tensor(ctx, F32, xv), tensor(ctx, F32, dtv), tensor(ctx, F32, Av),
                        tensor(ctx, F32, Bv), tensor(ctx, F32, Cv), tensor(ctx, I32, idv), K)
    node.numpy()[...] = -7.0  # what is not written stays
    got = flat(node)
    y, slots = scan_reference(sv, xv, dtv, Av, Bv, Cv, idv, K)
    close(got[:y.size], y.ravel())
    n_state = ns * nh * nr * nc
    for slot in range(K):
        part = got[y.size + slot * n_state: y.size + (slot + 1) * n_state]
        if slot in slots:
            close(part, slots[slot].ravel())
        else:
            assert (part == -7.0).all()


def test_ssm_scan_ids_out_of_range_raise() -> None:
    ctx = new_ctx()
    s, x = tensor(ctx, F32, rand(2, 2, 1, 3)), tensor(ctx, F32, rand(1, 1, 2, 1))
    node = ctx.ssm_scan(s, x, tensor(ctx, F32, rand(1, 1, 2)), tensor(ctx, F32, rand(2, 1)),
                        tensor(ctx, F32, rand(1, 1, 1, 3)), tensor(ctx, F32, rand(1, 1, 1, 3)),
                        tensor(ctx, I32, np.array([2], np.int32)), 1)
    with pytest.raises(OutOfBoundsError, match="SSM_SCAN.*ids holds 2"):
        run(node)


def linear_attn_reference(op: str, ins: dict[str, np.ndarray], state: np.ndarray, n_seqs: int,
                          scale: float = 1.0) -> np.ndarray:
    """The packed result of RWKV_WKV6 / GATED_LINEAR_ATTN / RWKV_WKV7 in float64: tokens (T, H, S), state
    (n_seqs, H, S, S) as the op stores it."""
    T, H, S = ins["k"].shape
    per = T // n_seqs
    out = np.zeros((T, H, S))
    new_state = np.zeros((n_seqs, H, S, S))
    f = {name: a.astype(np.float64) for name, a in ins.items()}
    for n in range(n_seqs):
        for h in range(H):
            st = state[n, h].astype(np.float64)
            for t in range(n * per, (n + 1) * per):
                k, v = f["k"][t, h], f["v"][t, h]
                if op == "wkv6":  # st[i, j]: i over k, j over v
                    kv = np.outer(k, v)
                    out[t, h] = f["r"][t, h] @ (f["tf"][h][:, None] * kv + st)
                    st = st * f["td"][t, h][:, None] + kv
                elif op == "gla":
                    st = st * f["g"][t, h][:, None] + np.outer(k, v)
                    out[t, h] = (f["q"][t, h] * scale) @ st
                else:  # wkv7, st[i, j]: i over v, j over k
                    sa = st @ f["a"][t, h]
                    st = st * f["w"][t, h][None, :] + np.outer(v, k) + np.outer(sa, f["b"][t, h])
                    out[t, h] = st @ f["r"][t, h]
            new_state[n, h] = st
    return np.concatenate([out.ravel(), new_state.ravel()])


@pytest.mark.parametrize("op", ["wkv6", "gla", "wkv7"])
@pytest.mark.parametrize("H, S, per, n_seqs", [(2, 4, 3, 2), (3, 5, 1, 1), (1, 8, 6, 3)])
def test_linear_attention_matches_numpy(op: str, H: int, S: int, per: int, n_seqs: int) -> None:
    ctx = new_ctx()
    T = per * n_seqs
    names = {"wkv6": ("k", "v", "r", "td"), "gla": ("k", "v", "q", "g"), "wkv7": ("r", "w", "k", "v", "a", "b")}[op]
    ins = {name: rand(T, H, S, lo=0.0 if name in ("td", "g") else -1.0) for name in names}
    if op == "wkv7":  # as RWKV-7 feeds them: a and b of unit length keep the state bounded
        for name in ("a", "b"):
            ins[name] /= np.linalg.norm(ins[name], axis=-1, keepdims=True)
    state = rand(n_seqs, H, S, S)
    ts = {name: tensor(ctx, F32, a) for name, a in ins.items()}
    st = tensor(ctx, F32, state.reshape(n_seqs, S * S * H))
    if op == "wkv6":
        ins["tf"] = rand(H, S)
        node = ctx.rwkv_wkv6(ts["k"], ts["v"], ts["r"], tensor(ctx, F32, ins["tf"]), ts["td"], st)
    elif op == "gla":
        node = ctx.gated_linear_attn(ts["k"], ts["v"], ts["q"], ts["g"], st, 0.35)
    else:
        node = ctx.rwkv_wkv7(*(ts[name] for name in names), st)
    close(flat(node), linear_attn_reference(op, ins, state, n_seqs, 0.35))


def gdn_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray,
                  K: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The gated delta rule in float64 on S[i, j] (state[n, h, j, i] as the op stores it), numpy order arrays."""
    n_seqs, T, H, S_v = v.shape
    out = np.zeros(v.shape)
    slots: dict[int, np.ndarray] = {}
    for n in range(n_seqs):
        for h in range(H):
            qn, kn = n // (n_seqs // q.shape[0]), n // (n_seqs // k.shape[0])
            St = state[n, h].T.astype(np.float64)
            for t in range(T):
                qv, kv = q[qn, t, h % q.shape[2]], k[kn, t, h % k.shape[2]]
                St = St * np.exp(g[n, t, h].astype(np.float64))[:, None]  # row i by exp(g_i), or all by exp(g)
                delta = (v[n, t, h] - kv @ St) * beta[n, t, h, 0]
                St = St + np.outer(kv, delta)
                out[n, t, h] = (qv @ St) / math.sqrt(S_v)
                slot = T - 1 - t
                if slot < K:
                    slots.setdefault(slot, np.zeros(state.shape))[n, h] = St.T
    return out, slots


@pytest.mark.parametrize("H_k, rep, S_v, T, n_seqs, q_seqs, kda, K", [
    (2, 1, 4, 3, 1, 1, False, 1), (2, 3, 5, 4, 2, 1, True, 2), (1, 2, 8, 2, 2, 2, False, 4),
    (3, 1, 3, 1, 3, 3, True, 1),
])
def test_gated_delta_net_matches_numpy(H_k: int, rep: int, S_v: int, T: int, n_seqs: int, q_seqs: int, kda: bool,
                                       K: int) -> None:
    ctx = new_ctx()
    H = H_k * rep
    qv, kv = rand(q_seqs, T, H_k, S_v), rand(q_seqs, T, H_k, S_v)
    kv /= np.linalg.norm(kv, axis=-1, keepdims=True)
    vv = rand(n_seqs, T, H, S_v, lo=-0.3, hi=5.0)
    gv = rand(n_seqs, T, H, S_v if kda else 1, lo=-3.0, hi=-1e-4)
    bv, sv = rand(n_seqs, T, H, 1, lo=0.0, hi=1.0), rand(n_seqs, H, S_v, S_v)
    # q permuted (rows contiguous, heads and tokens swapped), as llama.cpp's views can be
    q = ctx.permute(tensor(ctx, F32, qv.transpose(0, 2, 1, 3).copy()), 0, 2, 1, 3)
    node = ctx.gated_delta_net(q, tensor(ctx, F32, kv), tensor(ctx, F32, vv), tensor(ctx, F32, gv),
                               tensor(ctx, F32, bv), tensor(ctx, F32, sv), K)
    node.numpy()[...] = -7.0
    got = flat(node)
    out, slots = gdn_reference(qv, kv, vv, gv, bv, sv, K)
    close(got[:out.size], out.ravel())
    n_state = sv.size
    for slot in range(K):
        part = got[out.size + slot * n_state: out.size + (slot + 1) * n_state]
        if slot in slots:
            close(part, slots[slot].ravel())
        else:
            assert (part == -7.0).all()


def test_cpu_supports_what_ggml_cpu_supports() -> None:
    ctx = new_ctx()
    backend = cpu_init()
    sx, c = ctx.new_tensor_3d(F32, 9, 5, 2), ctx.new_tensor_2d(F32, 4, 5)
    assert backend.supports_op(ctx.ssm_conv(sx, c))
    assert not backend.supports_op(ctx.ssm_conv(ctx.new_tensor_3d(F16, 9, 5, 2), c))  # F32 only
    assert not backend.supports_op(ctx.ssm_conv(ctx.permute(ctx.new_tensor_3d(F32, 5, 9, 2), 1, 0, 2, 3), c))
    S, H, T = 4, 3, 6
    tok = ctx.new_tensor_3d(F32, S, H, T)
    assert backend.supports_op(ctx.gated_linear_attn(tok, tok, tok, tok, ctx.new_tensor_2d(F32, S * S * H, 2), 1.0))
    half = ctx.new_tensor_3d(F16, S, H, T)
    assert not backend.supports_op(ctx.rwkv_wkv7(half, half, half, half, half, half,
                                                 ctx.new_tensor_2d(F16, S * S * H, 1)))
    # a node made by hand without its sources is refused, not computed
    bare = ctx.new_tensor_1d(F32, 4)
    bare.op = GGMLOp.SSM_SCAN
    bare.src[0] = bare.src[1] = ctx.new_tensor_1d(F32, 4)
    assert not backend.supports_op(bare)
    backend.free()


def test_bad_node_raises_before_computing() -> None:
    """A node whose words or shapes do not fit (made by hand) fails when prepared, naming the op."""
    ctx: Context = new_ctx()
    S, H, T = 4, 2, 4
    tok = tensor(ctx, F32, rand(T, H, S))
    node = ctx.gated_linear_attn(tok, tok, tok, tok, tensor(ctx, F32, rand(2, S * S * H)), 1.0)
    node.src[4] = tensor(ctx, F32, rand(3, S * S * H))  # 3 sequences: 4 tokens do not split
    with pytest.raises(GGMLError, match="GATED_LINEAR_ATTN"):
        run(node)


# --- against real ggml ---


def test_every_case_against_ggml(ggml_reference: Backend) -> None:
    results = op_check.run_cases(ssm_cases(), ggml_reference)
    bad = [(r.case.label, r.case.desc, r.status, r.detail) for r in results if r.status != "OK"]
    assert not bad, bad
    labels = {r.case.label for r in results}
    assert labels == {"SSM_CONV", "SSM_SCAN", "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "GATED_DELTA_NET"}
