"""Op checker cases of the recurrent-state ops (pyggml.core.ops.ssm), after test-backend-ops' own (its shapes,
value ranges and max NMSE; the long prefill shapes shortened), plus small odd sizes and permuted sources."""

from __future__ import annotations

import numpy as np

from pyggml.core.context import Context
from pyggml.core.tensor import Tensor
from pyggml.testing.op_check import F32, I32, Init, OpCase, new, op, permuted, uniform


def permutation(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """ids: a permutation of [0, n) (each sequence starts from another one's state)."""
    return rng.permutation(t.ne[0]).astype(np.int32)


def _ssm_conv_cases() -> list[OpCase]:
    cases = []
    for d_conv in (3, 4, 9):
        for d_inner in (1536, 7):
            for ne_a in ([d_conv, d_inner, 1, 1], [2 * d_conv, d_inner, 1, 1], [d_conv, d_inner, 4, 1],
                         [d_conv - 1 + 64, d_inner, 4, 1]):
                def build(ctx: Context, ne_a: list[int] = ne_a, d_conv: int = d_conv, d_inner: int = d_inner) -> Tensor:
                    return op(ctx, "ssm_conv")(new(ctx, "a", F32, ne_a), new(ctx, "b", F32, [d_conv, d_inner, 1, 1]))

                cases.append(OpCase("SSM_CONV", f"type=f32,ne_a={ne_a},ne_b=[{d_conv},{d_inner},1,1]".replace(" ", ""),
                                    build))
    for fuse_bias in (False, True):  # test-backend-ops' SSM_CONV_BIAS_SILU graphs
        def build_silu(ctx: Context, fuse_bias: bool = fuse_bias) -> Tensor:
            out = op(ctx, "ssm_conv")(new(ctx, "a", F32, [67, 256, 2, 1]), new(ctx, "b", F32, [4, 256, 1, 1]))
            if fuse_bias:
                out = op(ctx, "add")(out, new(ctx, "bias", F32, [256, 1, 1, 1]))
            return op(ctx, "silu")(out)

        cases.append(OpCase("SSM_CONV", f"type=f32,ne_a=[67,256,2,1],ne_b=[4,256,1,1],bias={int(fuse_bias)},silu",
                            build_silu))
    return cases


def _ssm_scan_cases() -> list[OpCase]:
    cases = []
    # d_state, head_dim, n_head, n_group, n_seq_tokens, n_seqs, xbc_overlap, K, weak_decay
    specs = [(16, 1, 1024, 1, 32, 4, False, 1, False),  # Mamba-1
             (96, 64, 128, 8, 1, 1, False, 1, False),  # decode
             (96, 64, 16, 8, 300, 2, False, 1, True),  # long, weak decay
             (128, 64, 16, 2, 32, 4, False, 1, False),  # Mamba-2
             (256, 64, 8, 2, 32, 4, False, 1, False),  # Falcon-H1
             (128, 128, 4, 4, 16, 2, True, 1, False),  # x/B/C views of one tensor
             (128, 80, 128, 1, 32, 1, False, 1, False),  # Nemotron-9B's heads
             (128, 64, 16, 2, 4, 2, False, 4, False),  # rollback snapshots
             (128, 64, 16, 2, 8, 2, False, 3, False),
             (5, 3, 6, 3, 7, 3, False, 2, False),  # odd sizes
             (7, 1, 5, 5, 3, 2, False, 1, True)]
    for d_state, head_dim, n_head, n_group, nt, ns, overlap, K, weak in specs:
        def build(ctx: Context, d_state: int = d_state, head_dim: int = head_dim, n_head: int = n_head,
                  n_group: int = n_group, nt: int = nt, ns: int = ns, overlap: bool = overlap, K: int = K) -> Tensor:
            s = new(ctx, "s", F32, [d_state, head_dim, n_head, ns])
            dt = new(ctx, "dt", F32, [n_head, nt, ns, 1])
            A = new(ctx, "A", F32, [1 if head_dim > 1 else d_state, n_head, 1, 1])
            if overlap:
                xbc = new(ctx, "xbc", F32, [d_state, n_head, nt, 2 * ns])
                nb = xbc.nb
                view = op(ctx, "view_4d")
                x = view(xbc, head_dim, n_head, nt, ns, nb[1], nb[2], nb[3], nb[3])
                B = view(xbc, d_state, n_group, nt, ns, nb[1], nb[2], nb[3], 0)
                C = view(xbc, d_state, n_group, nt, ns, nb[1], nb[2], nb[3], 2 * nb[3])
            else:
                x = new(ctx, "x", F32, [head_dim, n_head, nt, ns])
                B = new(ctx, "B", F32, [d_state, n_group, nt, ns])
                C = new(ctx, "C", F32, [d_state, n_group, nt, ns])
            ids = new(ctx, "ids", I32, [ns, 1, 1, 1])
            return op(ctx, "ssm_scan")(s, x, dt, A, B, C, ids, K)

        inits: dict[str, Init] = {"ids": permutation, "A": uniform(-0.02, -0.005) if weak else uniform(-1.0, -0.5)}
        desc = (f"type=f32,d_state={d_state},head_dim={head_dim},n_head={n_head},n_group={n_group},"
                f"n_seq_tokens={nt},n_seqs={ns},xbc_overlap={int(overlap)},K={K},weak_decay={int(weak)}")
        cases.append(OpCase("SSM_SCAN", desc, build, inits, 2e-7 if head_dim > 1 else 1e-7))
    return cases


def _linear_attn_cases() -> list[OpCase]:
    cases = []
    for label in ("RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7"):
        specs = [(32, 64, 1, 1), (32, 64, 1, 4), (32, 64, 32, 1), (32, 64, 32, 4), (32, 64, 128, 4)]
        if label != "RWKV_WKV7":  # ggml's WKV7 loop reads past a head of fewer than GGML_F32_STEP floats
            specs += [(3, 5, 4, 2), (1, 1, 1, 1)]
        for head_count, head_size, nt, ns in specs:
            def build(ctx: Context, label: str = label, H: int = head_count, S: int = head_size, nt: int = nt,
                      ns: int = ns) -> Tensor:
                def tok(name: str) -> Tensor:
                    return new(ctx, name, F32, [S, H, nt * ns, 1])

                s = new(ctx, "s", F32, [S * S * H, ns, 1, 1])
                if label == "RWKV_WKV6":
                    tf = new(ctx, "tf", F32, [S, H, 1, 1])
                    return op(ctx, "rwkv_wkv6")(tok("k"), tok("v"), tok("r"), tf, tok("td"), s)
                if label == "GATED_LINEAR_ATTN":
                    return op(ctx, "gated_linear_attn")(tok("k"), tok("v"), tok("q"), tok("g"), s, S ** -0.5)
                # test-backend-ops' normalization: outputs may become NaN over long sequences without it
                a = op(ctx, "l2_norm")(tok("a"), 1e-7)
                b = op(ctx, "l2_norm")(tok("b"), 1e-7)
                return op(ctx, "rwkv_wkv7")(tok("r"), tok("w"), tok("k"), tok("v"), a, b, s)

            cases.append(OpCase(label, f"type=f32,head_count={head_count},head_size={head_size},n_seq_tokens={nt},"
                                       f"n_seqs={ns}", build))
    return cases


def _gated_delta_net_cases() -> list[OpCase]:
    cases = []
    # head_count, head_size, n_seq_tokens, n_seqs, v_repeat, permuted, kda, K
    specs = [(32, 128, 1, 1, 1, False, False, 1), (32, 16, 1, 1, 1, False, False, 1),
             (32, 16, 1, 1, 1, True, True, 1), (32, 16, 1, 1, 1, False, True, 1),
             (16, 64, 1, 2, 1, False, False, 1), (4, 64, 4, 1, 1, False, False, 1), (4, 64, 4, 2, 1, False, False, 1),
             (8, 32, 4, 2, 2, False, False, 1), (4, 64, 4, 2, 1, True, False, 1), (4, 64, 4, 1, 1, True, False, 1),
             (4, 64, 1, 2, 1, False, True, 1), (4, 16, 1, 2, 1, False, True, 1), (4, 32, 4, 1, 1, False, True, 1),
             (8, 32, 4, 2, 2, False, True, 1), (4, 64, 4, 2, 1, True, True, 1), (4, 16, 4, 2, 1, True, True, 1),
             (4, 64, 64, 1, 1, False, False, 1), (4, 64, 127, 1, 1, False, False, 1),
             (4, 64, 256, 1, 1, False, False, 1), (4, 64, 127, 2, 1, False, False, 1),
             (4, 64, 33, 1, 1, False, True, 1), (4, 64, 100, 1, 1, False, True, 1),
             (4, 16, 2, 1, 1, False, False, 2), (4, 32, 4, 1, 1, False, False, 4), (4, 64, 4, 2, 1, False, False, 4),
             (8, 128, 4, 1, 1, False, False, 4), (4, 64, 4, 2, 1, False, True, 4), (8, 32, 4, 2, 2, False, True, 4),
             (4, 32, 8, 1, 1, False, False, 3), (4, 64, 16, 2, 1, False, False, 4),
             (3, 5, 6, 2, 3, False, True, 2), (1, 1, 1, 1, 1, False, False, 1)]
    for hc, hs, nt, ns, rep, perm, kda, K in specs:
        def build(ctx: Context, hc: int = hc, hs: int = hs, nt: int = nt, ns: int = ns, rep: int = rep,
                  perm: bool = perm, kda: bool = kda, K: int = K) -> Tensor:
            def qkv(name: str, heads: int) -> Tensor:
                if perm:
                    return permuted(ctx, name, F32, [hs, heads, nt, ns], (0, 2, 1, 3))
                return new(ctx, name, F32, [hs, heads, nt, ns])

            q, k, v = qkv("q", hc), qkv("k", hc), qkv("v", hc * rep)
            g = new(ctx, "g", F32, [hs if kda else 1, hc * rep, nt, ns])
            beta = new(ctx, "beta", F32, [1, hc * rep, nt, ns])
            state = new(ctx, "state", F32, [hs, hs, hc * rep, ns])
            # q and k L2-normalized, as Qwen3.5 and Kimi linear attention feed them
            q = op(ctx, "l2_norm")(q, 1e-6)
            k = op(ctx, "l2_norm")(k, 1e-6)
            return op(ctx, "gated_delta_net")(q, k, v, g, beta, state, K)

        inits: dict[str, Init] = {"g": uniform(-20.0, -1e-4), "beta": uniform(0.0, 1.0), "v": uniform(-0.3, 5.0)}
        cases.append(OpCase("GATED_DELTA_NET", f"type=f32,head_count={hc},head_size={hs},n_seq_tokens={nt},"
                                               f"n_seqs={ns},v_repeat={rep},permuted={int(perm)},kda={int(kda)},K={K}",
                            build, inits))
    return cases


def ssm_cases() -> list[OpCase]:
    return _ssm_conv_cases() + _ssm_scan_cases() + _linear_attn_cases() + _gated_delta_net_cases()
