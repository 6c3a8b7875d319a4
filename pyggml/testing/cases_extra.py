"""Op checker cases of ROPE_BACK (test-backend-ops' test_rope with forward=false: modes, freq_scale, ext_factor,
attn_factor, frequency factors, a viewed source, an offset window) and of SAM's WIN_PART, WIN_UNPART,
GET_REL_POS, ADD_REL_POS (which test-backend-ops leaves out: SAM's shapes, padding and sizes 1 here)."""

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
from pyggml.testing.test_ops import BF16, F16, F32, I32, MAX_NMSE_ROPE, OpCase, _ne, _t, indices, new, op, uniform

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


def extra_cases() -> list[OpCase]:
    return rope_back_cases() + sam_cases()
