"""Op checker cases of ROPE_BACK (test-backend-ops' test_rope with forward=false: modes, freq_scale, ext_factor,
attn_factor, frequency factors, a viewed source, an offset window), of SAM's WIN_PART, WIN_UNPART,
GET_REL_POS, ADD_REL_POS (which test-backend-ops leaves out: SAM's shapes, padding and sizes 1 here), and
test-backend-ops' LIGHTNING_INDEXER and DSV4_HC_COMB / DSV4_HC_PRE / DSV4_HC_POST cases (the indexer's at
fewer sizes), with their value ranges."""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.tensor import (
    GGML_ROPE_TYPE_IMROPE,
    GGML_ROPE_TYPE_MROPE,
    GGML_ROPE_TYPE_NEOX,
    GGML_ROPE_TYPE_NORMAL,
    GGML_ROPE_TYPE_VISION,
    Tensor,
)
from pyggml.core.types import GGMLType
from pyggml.testing.cases_flash_attn import kq_mask
from pyggml.testing.op_check import BF16, F16, F32, I32, MAX_NMSE_ROPE, OpCase, _ne, _t, indices, new, op, uniform

NORMAL, NEOX, MROPE, IMROPE, VISION = (GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_MROPE,
                                       GGML_ROPE_TYPE_IMROPE, GGML_ROPE_TYPE_VISION)


def _rope_back(ctx: Context, type: GGMLType, ne: list[int], n_dims: int, mode: int, fs: float, ef: float,
               af: float, ff: bool, v: int, n_offs: int) -> Tensor:
    """test_rope's graph with forward = false."""
    if v:
        base = new(ctx, "a", type, [ne[0] * 2, ne[1] * 4, ne[2] * 3, ne[3]])
        a = op(ctx, "view_4d")(base, ne[0], ne[1], ne[2], ne[3], base.nb[1], base.nb[2], base.nb[3], 0)
    else:
        a = new(ctx, "a", type, ne)
    multi = bool(mode & MROPE)
    pos = new(ctx, "pos", I32, [ne[2] * (4 if multi else 1), 1, 1, 1])
    freq = new(ctx, "freq", F32, [n_dims // 2, 1, 1, 1]) if ff else None
    if mode == VISION:
        sections = [n_dims // 4, n_dims // 4, 0, 0]
        out = op(ctx, "rope_multi_back")(a, pos, freq, n_dims // 2, sections, mode, 0, 10000.0, fs, ef, af, 1.0,
                                         1.0)
    elif multi:
        sections = [n_dims // 3, n_dims // 3, n_dims // 3, 0]
        out = op(ctx, "rope_multi_back")(a, pos, freq, n_dims, sections, mode, 0, 10000.0, fs, ef, af, 1.0, 1.0)
    else:
        out = op(ctx, "rope_ext_back")(a, pos, freq, n_dims, mode, 0, 10000.0, fs, ef, af, 1.0, 1.0)
    if n_offs:
        from pyggml.core.ops import rope_set_offset

        out = rope_set_offset(out, n_offs)
    return out


def rope_back_cases() -> list[OpCase]:
    cases = []
    shapes = ((NORMAL, [128, 32, 2, 1], 128), (NORMAL, [80, 32, 2, 1], 20), (NEOX, [64, 8, 2, 1], 64),
              (NEOX, [80, 32, 4, 1], 32), (MROPE, [128, 12, 2, 1], 20), (IMROPE, [128, 12, 2, 1], 128),
              (VISION, [80, 16, 2, 1], 80))
    for type in (F32, F16):
        for mode, ne, n_dims in shapes:
            for fs, ef, af, ff, v in ((1.0, 0.0, 1.0, False, 0), (1.4245, 0.7465, 1.4245, True, 1)):
                def build(ctx: Context, type: GGMLType = type, ne: list[int] = ne, n_dims: int = n_dims,
                          mode: int = mode, fs: float = fs, ef: float = ef, af: float = af, ff: bool = ff,
                          v: int = v) -> Tensor:
                    return _rope_back(ctx, type, ne, n_dims, mode, fs, ef, af, ff, v, 0)

                cases.append(OpCase("ROPE_BACK", f"type={_t(type)},ne_a={_ne(ne)},n_dims={n_dims},mode={mode},"
                                                 f"fs={fs:g},ef={ef:g},af={af:g},ff={int(ff)},v={v}", build,
                                    {"pos": indices(512), "freq": uniform(0.9, 1.1)}, MAX_NMSE_ROPE))
        for mode, ne, n_dims in ((NORMAL, [128, 32, 2, 1], 32), (NEOX, [128, 32, 2, 1], 32),
                                 (MROPE, [128, 12, 2, 1], 24), (IMROPE, [128, 12, 2, 1], 24)):
            def build_offs(ctx: Context, type: GGMLType = type, ne: list[int] = ne, n_dims: int = n_dims,
                           mode: int = mode) -> Tensor:
                return _rope_back(ctx, type, ne, n_dims, mode, 1.4245, 0.7465, 1.4245, True, 0, 32)

            cases.append(OpCase("ROPE_BACK", f"type={_t(type)},ne_a={_ne(ne)},n_dims={n_dims},mode={mode},"
                                             "n_offs=32,ff=1", build_offs,
                                {"pos": indices(512), "freq": uniform(0.9, 1.1)}, MAX_NMSE_ROPE))
    return cases


def sam_cases() -> list[OpCase]:
    cases = []
    for ne, w in (([8, 14, 14, 1], 7), ([5, 10, 7, 1], 4), ([3, 1, 1, 1], 2), ([16, 9, 12, 1], 14),
                  ([4, 6, 6, 1], 1)):
        def build_part(ctx: Context, ne: list[int] = ne, w: int = w) -> Tensor:
            return op(ctx, "win_part")(new(ctx, "a", F32, ne), w)

        cases.append(OpCase("WIN_PART", f"ne={_ne(ne)},w={w}", build_part))

        npx, npy = -(-ne[1] // w), -(-ne[2] // w)

        def build_unpart(ctx: Context, ne: list[int] = ne, w: int = w, n: int = npx * npy) -> Tensor:
            return op(ctx, "win_unpart")(new(ctx, "a", F32, [ne[0], w, w, n]), ne[1], ne[2], w)

        cases.append(OpCase("WIN_UNPART", f"ne_a=[{ne[0]},{w},{w},{npx * npy}],w0={ne[1]},h0={ne[2]},w={w}",
                            build_unpart))

        def build_round_trip(ctx: Context, ne: list[int] = ne, w: int = w) -> Tensor:
            parts = op(ctx, "win_part")(new(ctx, "a", F32, ne), w)
            return op(ctx, "win_unpart")(parts, ne[1], ne[2], w)

        cases.append(OpCase("WIN_UNPART", f"win_part then win_unpart,ne={_ne(ne)},w={w}", build_round_trip))
    for type in (F16, BF16):
        for c, h in ((8, 5), (1, 1), (64, 14)):
            def build_rel(ctx: Context, type: GGMLType = type, c: int = c, h: int = h) -> Tensor:
                return op(ctx, "get_rel_pos")(new(ctx, "a", type, [c, 2 * h - 1, 1, 1]), h, h)

            cases.append(OpCase("GET_REL_POS", f"type={_t(type)},ne_a=[{c},{2 * h - 1},1,1],qh=kh={h}", build_rel))
    for k, qw, qh, heads, ne3 in ((4, 3, 5, 2, 1), (1, 1, 1, 1, 1), (7, 7, 7, 3, 1), (3, 2, 2, 2, 2)):
        for inplace in (False, True):
            def build_add(ctx: Context, k: int = k, qw: int = qw, qh: int = qh, heads: int = heads, ne3: int = ne3,
                          inplace: bool = inplace) -> Tensor:
                a = new(ctx, "a", F32, [k * k, qw * qh, heads, ne3])
                pw = new(ctx, "pw", F32, [k, qw, qh, heads])
                ph = new(ctx, "ph", F32, [k, qw, qh, heads])
                return op(ctx, "add_rel_pos_inplace" if inplace else "add_rel_pos")(a, pw, ph)

            cases.append(OpCase("ADD_REL_POS", f"ne_a=[{k * k},{qw * qh},{heads},{ne3}],ne_p=[{k},{qw},{qh},{heads}]"
                                               f"{',inplace' if inplace else ''}", build_add))
    return cases


def lightning_indexer_cases() -> list[OpCase]:
    cases = []
    types = (F32, F16, BF16, GGMLType.Q8_0, GGMLType.Q5_1, GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.Q4_0,
             GGMLType.IQ4_NL)
    shapes = [(128, 32, 256, nb, ns, nm, type_k) for nb in (1, 32) for ns, nm in ((1, 1), (4, 4), (4, 1))
              for type_k in (F32, F16, BF16, GGMLType.Q8_0, GGMLType.IQ4_NL)]
    shapes += [(128, 64, kv, 32, 4, 1, type_k) for kv in (1, 7, 65) for type_k in types]
    for hsk, nh, kv, nb, ns, nm, type_k in shapes:
        def build(ctx: Context, hsk: int = hsk, nh: int = nh, kv: int = kv, nb: int = nb, ns: int = ns, nm: int = nm,
                  type_k: GGMLType = type_k) -> Tensor:
            q = new(ctx, "q", F32, [hsk, nh, nb, ns])
            k = new(ctx, "k", type_k, [hsk, 1, kv, ns])
            w = new(ctx, "w", F32, [nh, nb, 1, ns])
            m = new(ctx, "m", F16, [kv, nb, 1, nm])
            return op(ctx, "lightning_indexer")(q, k, w, m)

        cases.append(OpCase("LIGHTNING_INDEXER", f"hsk={hsk},nh={nh},kv={kv},nb={nb},ns={ns},nm={nm},"
                                                 f"type_K={_t(type_k)}", build, {"m": kq_mask}, 1e-6))
    return cases


_HC = 4
_HC_INITS = {"mixes": uniform(-2.0, 2.0), "scale": uniform(-0.5, 0.5), "base": uniform(-0.25, 0.25),
             "weights": uniform(0.0, 1.0), "comb": uniform(0.0, 1.0), "post": uniform(0.0, 2.0),
             "gate": uniform(-4.0, 4.0), "x": uniform(-1.0, 1.0), "residual": uniform(-1.0, 1.0)}


def dsv4_cases() -> list[OpCase]:
    cases = []
    for n_tokens, n_iter in ((1, 1), (17, 4), (257, 8), (17, 20), (1, 20), (256, 20), (513, 20)):
        def build_comb(ctx: Context, n_tokens: int = n_tokens, n_iter: int = n_iter) -> Tensor:
            mixes = new(ctx, "mixes", F32, [(2 + _HC) * _HC, n_tokens, 1, 1])
            scale = new(ctx, "scale", F32, [3, 1, 1, 1])
            base = new(ctx, "base", F32, [(2 + _HC) * _HC, 1, 1, 1])
            return op(ctx, "dsv4_hc_comb")(mixes, scale, base, 1e-6, n_iter)

        cases.append(OpCase("DSV4_HC_COMB", f"n_tokens={n_tokens},n_iter={n_iter},eps=1e-06", build_comb, _HC_INITS))
    pre = [(1, 4, 1, False), (31, 4, 17, False), (128, 4, 257, False), (4096, 4, 21, False), (31, 4, 17, True),
           (4096, 4, 21, True)]
    pre += [(128, n_hc, 17, gated) for n_hc in (1, 2, 3, 5, 8, 65) for gated in (False, True)]
    for n_embd, n_hc, n_tokens, gated in pre:
        def build_pre(ctx: Context, n_embd: int = n_embd, n_hc: int = n_hc, n_tokens: int = n_tokens,
                      gated: bool = gated) -> Tensor:
            x = new(ctx, "x", F32, [n_embd, n_hc, n_tokens, 1])
            if gated:
                gate = new(ctx, "gate", F32, [n_embd, n_hc, n_tokens, 1])
                return op(ctx, "dsv4_hc_pre_gated")(x, gate, 1.0 / n_hc)
            return op(ctx, "dsv4_hc_pre")(x, new(ctx, "weights", F32, [n_hc, n_tokens, 1, 1]))

        cases.append(OpCase("DSV4_HC_PRE", f"n_embd={n_embd},n_hc={n_hc},n_tokens={n_tokens},gated={int(gated)}",
                            build_pre, _HC_INITS))
    for n_embd, n_tokens, identity, gated in ((1, 1, False, False), (31, 17, False, False), (128, 257, False, False),
                                              (4096, 21, False, False), (31, 17, True, False), (4096, 21, True, False),
                                              (31, 17, True, True), (2560, 21, True, True), (31, 17, False, True)):
        def build_post(ctx: Context, n_embd: int = n_embd, n_tokens: int = n_tokens, identity: bool = identity,
                       gated: bool = gated) -> Tensor:
            x = new(ctx, "x", F32, [n_embd, n_tokens, 1, 1])
            residual = new(ctx, "residual", F32, [n_embd, _HC, n_tokens, 1])
            post = new(ctx, "post", F32, [_HC, n_tokens, 1, 1])
            if gated:  # post = 2*sigmoid(post/hc), as qwen4exp builds it
                post = op(ctx, "scale")(op(ctx, "sigmoid")(op(ctx, "scale")(post, 1.0 / _HC)), 2.0)
            comb = None if identity else new(ctx, "comb", F32, [_HC, _HC, n_tokens, 1])
            return op(ctx, "dsv4_hc_post")(x, residual, post, comb)

        cases.append(OpCase("DSV4_HC_POST", f"n_embd={n_embd},n_tokens={n_tokens},identity={int(identity)},"
                                            f"gated={int(gated)}", build_post, _HC_INITS))
    return cases


def extra_cases() -> list[OpCase]:
    return rope_back_cases() + sam_cases() + lightning_indexer_cases() + dsv4_cases()
