"""The op checker's cases (`op_check.OpCase`) that llama.cpp's test-backend-ops (0c1e570, make_test_cases_eval)
runs for UNARY's functions (test_unary, test_xielu), GLU's (test_glu, test_glu_split, test_swiglu_oai,
test_swiglu_clamp), ADD, SUB, MUL and DIV (test_bin_bcast), SCALE (test_scale),
CONCAT (test_concat), OUT_PROD (test_out_prod), UPSCALE (test_upscale, test_interpolate) and IM2COL_3D
(test_im2col_3d): all of them, with their types, shapes, views and value ranges. A desc is the case's
test-backend-ops vars() string, so a line of either table finds the other's.

Left out: OUT_PROD's cases that ggml's CPU does not run (its supports_op refuses an F16 src1, and an F16 or
quantized src0 broadcast over src1: test-backend-ops skips them on the CPU), and those of src0 types pyggml
does not implement yet (they join the list with their types).
"""

from __future__ import annotations

from collections.abc import Callable

from pyggml.core.context import Context
from pyggml.core.quants import is_implemented
from pyggml.core.tensor import GLUOp, ScaleFlag, ScaleMode, Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.testing.op_check import BF16, F16, F32, I32, MAX_NMSE_MUL_MAT, OpCase, _ne, _t, new, op, uniform

I8, I16, I64 = GGMLType.I8, GGMLType.I16, GGMLType.I64
Q = GGMLType
# test-backend-ops' base_types (OUT_PROD's src0 types)
BASE_TYPES = [F32, F16, Q.Q8_0, Q.Q1_0, Q.Q2_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.MXFP4, Q.NVFP4, Q.IQ2_XXS]


def _b(flag: bool) -> str:
    return str(int(flag))


def _view_of(ctx: Context, name: str, type: GGMLType, ne: list[int], grow: list[int]) -> Tensor:
    """ggml_view_4d of shape `ne` at offset 0 into a new tensor `name` of ne[i] * grow[i]: rows apart."""
    base = new(ctx, name, type, [n * g for n, g in zip(ne, grow, strict=True)])
    return op(ctx, "view_4d")(base, *ne, base.nb[1], base.nb[2], base.nb[3], 0)


# --- test_unary, test_xielu ---


def unary_cases() -> list[OpCase]:
    cases = []
    for type in (F16, F32, BF16):
        for v in (0, 1):
            for u in UnaryOp:
                if u == UnaryOp.XIELU:
                    continue  # test_xielu below
                for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                    def build(ctx: Context, u: UnaryOp = u, type: GGMLType = type, ne: list[int] = ne,
                              v: int = v) -> Tensor:
                        a = _view_of(ctx, "a", type, ne, [3, 2, 5, 4]) if v else new(ctx, "a", type, ne)
                        return op(ctx, "unary")(a, u)

                    # F16 EXP and EXPM1 in range: backends would disagree on saturating or overflowing to inf
                    r = 10.0 if type == F16 and u in (UnaryOp.EXP, UnaryOp.EXPM1) else 150.0
                    cases.append(OpCase(u.name, f"type={_t(type)},ne_a={_ne(ne)},v={v}", build,
                                        {"a": uniform(-r, r)}))
    for type, ne in ((F32, [10, 5, 4, 3]), (F16, [10, 5, 4, 3]), (F32, [512, 16, 1, 1]), (F16, [512, 16, 1, 1])):
        def build_xielu(ctx: Context, type: GGMLType = type, ne: list[int] = ne) -> Tensor:
            return op(ctx, "xielu")(new(ctx, "a", type, ne), 4.0, 20.0, 0.5, 0.0000001)

        cases.append(OpCase("XIELU", f"type={_t(type)},ne={_ne(ne)}", build_xielu))
    return cases


# --- test_glu, test_glu_split, test_swiglu_oai, test_swiglu_clamp ---


def glu_cases() -> list[OpCase]:
    cases = []
    values = {"a": uniform(-150.0, 150.0), "b": uniform(-150.0, 150.0)}
    grow = [3, 1, 1, 1]  # a view: rows of ne0 inside rows of 3 ne0
    for type in (F16, F32, BF16):
        for v in (0, 1):
            for g in GLUOp:
                if g in (GLUOp.SWIGLU_OAI, GLUOp.SWIGLU_CLAMP):
                    continue  # their own cases below
                for swapped in (False, True):
                    for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                        def fused(ctx: Context, g: GLUOp = g, type: GGMLType = type, ne: list[int] = ne, v: int = v,
                                  swapped: bool = swapped) -> Tensor:
                            a = _view_of(ctx, "a", type, ne, grow) if v else new(ctx, "a", type, ne)
                            return op(ctx, "glu")(a, g, swapped)

                        cases.append(OpCase(g.name, f"type={_t(type)},ne_a={_ne(ne)},v={v},swapped={_b(swapped)}",
                                            fused, values))
                for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                    def split(ctx: Context, g: GLUOp = g, type: GGMLType = type, ne: list[int] = ne,
                              v: int = v) -> Tensor:
                        a, b = ((_view_of(ctx, n, type, ne, grow) if v else new(ctx, n, type, ne)) for n in "ab")
                        return op(ctx, "glu_split")(a, b, g)

                    cases.append(OpCase(g.name, f"type={_t(type)},ne_a={_ne(ne)},v={v},split", split, values))
    ne = [128, 2, 2, 2]
    for v in (0, 1):
        for alpha in (0.5, 1.702):
            for limit in (2.0, 7.0):
                def oai(ctx: Context, v: int = v, alpha: float = alpha, limit: float = limit) -> Tensor:
                    a, b = ((_view_of(ctx, n, F32, ne, grow) if v else new(ctx, n, F32, ne)) for n in "ab")
                    return op(ctx, "swiglu_oai")(a, b, alpha, limit)

                cases.append(OpCase("SWIGLU_OAI", f"type=f32,ne_a={_ne(ne)},v={v},alpha={alpha:g},limit={limit:g}",
                                    oai, values))
    for type in (F16, F32):
        for v in (0, 1):
            for limit in (2.0, 10.0):
                def clamp(ctx: Context, type: GGMLType = type, v: int = v, limit: float = limit) -> Tensor:
                    a, b = ((_view_of(ctx, n, type, ne, grow) if v else new(ctx, n, type, ne)) for n in "ab")
                    return op(ctx, "swiglu_clamp")(a, b, limit)

                cases.append(OpCase("SWIGLU_CLAMP", f"type={_t(type)},ne_a={_ne(ne)},v={v},limit={limit:g}", clamp,
                                    values))
    return cases


# --- test_bin_bcast ---


def _bin_bcast(name: str, type: GGMLType, ne: list[int], nr: list[int], nf: int = 1, perm1: bool = False,
               src_overlap: bool = False, type_b: GGMLType | None = None) -> OpCase:
    """test_bin_bcast: a [ne * nr] op nf b's of ne (permuted, or overlapping views of a), MUL and DIV near 1."""
    tb = type if type_b is None else type_b
    label = name.removesuffix("_inplace").upper()

    def build(ctx: Context) -> Tensor:
        a = new(ctx, "a", type, [n * r for n, r in zip(ne, nr, strict=True)])
        overlap = [ne[0], ne[1], ne[2], 2 * (ne[3] // 3), a.nb[1], a.nb[2], a.nb[3]]
        bs = []
        for i in range(nf):
            if perm1:
                p = (1, 2, 0, 3)
                bs.append(op(ctx, "permute")(new(ctx, f"b{i}", tb, [ne[p[0]], ne[p[1]], ne[p[2]], ne[p[3]]]), *p))
            elif src_overlap:
                bs.append(op(ctx, "view_4d")(a, *overlap, (ne[3] // 3) * a.nb[3]))
            else:
                bs.append(new(ctx, f"b{i}", tb, ne))
        out = op(ctx, "view_4d")(a, *overlap, 0) if src_overlap else a
        for b in bs:
            out = op(ctx, name)(out, b)
        return out

    near_one = label in ("MUL", "DIV")  # test-backend-ops: MUL and DIV have numerical issues around zero
    lo, hi = (0.9, 1.1) if near_one else (-1.0, 1.0)
    inits = {n: uniform(lo, hi) for n in ["a", *(f"b{i}" for i in range(nf))]}
    desc = (f"type={_t(type)},ne={_ne(ne)},nr={_ne(nr)},nf={nf},perm1={_b(perm1)},src_overlap={_b(src_overlap)}"
            + (f",type_b={_t(type_b)}" if type_b is not None else ""))
    # fused ADDs may keep f32 between them where the CPU rounds each ADD (test-backend-ops' bound for them)
    max_nmse = {F16: 1e-6, BF16: 1e-4}.get(type, 1e-7) if label == "ADD" and nf > 1 else 1e-7
    return OpCase(label, desc, build, inits, max_nmse)


def bin_bcast_cases() -> list[OpCase]:
    ops = ("add", "sub", "mul", "div")
    cases = []
    shapes = [([1, 1, 8, 1], [1, 1, 1, 1]), ([1, 1, 1, 1], [32, 1, 1, 1]), ([1, 1, 320, 320], [1, 1, 1, 1]),
              ([10, 5, 1, 1], [1, 1, 1, 1]), ([10, 5, 4, 1], [1, 1, 1, 1]), ([10, 5, 4, 3], [1, 1, 1, 1]),
              ([10, 5, 4, 3], [2, 1, 1, 1]), ([10, 5, 4, 3], [1, 2, 1, 1]), ([10, 5, 4, 3], [1, 1, 2, 1]),
              ([10, 5, 4, 3], [1, 1, 1, 2]), ([10, 5, 4, 3], [1, 1, 2, 2]), ([10, 5, 4, 3], [1, 2, 2, 2]),
              ([10, 5, 4, 3], [2, 2, 2, 2])]
    overlaps = [[10, 5, 4, 6], [10, 5, 4, 5], [1, 1, 120, 120], [1, 1, 4, 320]]
    # stable diffusion's shapes
    sd = [([1280, 1, 1, 1], [1, 1, 1, 1]), ([1280, 1, 1, 1], [1, 16, 16, 1]), ([1280, 16, 16, 1], [1, 1, 1, 1]),
          ([1280, 1, 1, 1], [1, 256, 1, 1]), ([1, 1, 1280, 1], [16, 16, 1, 1]), ([16, 16, 1280, 1], [1, 1, 1, 1]),
          ([1, 1, 1920, 1], [16, 16, 1, 1]), ([1, 1, 2560, 1], [16, 16, 1, 1]), ([1, 1, 1280, 1], [32, 32, 1, 1]),
          ([1, 1, 1920, 1], [32, 32, 1, 1]), ([1, 1, 640, 1], [32, 32, 1, 1]), ([5120, 1, 1, 1], [1, 256, 1, 1]),
          ([640, 1, 1, 1], [1, 1, 1, 1]), ([64, 262144, 1, 1], [1, 1, 1, 1]), ([128, 1, 8, 1], [1, 4, 1, 1])]
    for type in (F16, F32, BF16):
        for perm1 in (False, True):
            for ne, nr in shapes:
                cases += [_bin_bcast(name, type, ne, nr, perm1=perm1) for name in ops]
        for ne in overlaps:
            cases += [_bin_bcast(name, type, ne, [1, 1, 1, 1], src_overlap=True) for name in ops]
        for ne, nr in [([1, 1, 65536, 1], [256, 1, 1, 1]), *sd]:
            cases += [_bin_bcast(name, type, ne, nr) for name in ops]
    cases += [_bin_bcast(name + "_inplace", F32, [16, 5, 4, 3], [1, 1, 1, 1], 16) for name in ("add", "mul", "sub",
                                                                                                "div")]
    for name in ops:  # BF16 activations with F32 weights
        for ne, nr in (([10, 5, 4, 3], [1, 1, 1, 1]), ([10, 5, 4, 3], [2, 2, 2, 2]), ([5120, 1, 1, 1], [1, 32, 1, 1])):
            cases.append(_bin_bcast(name, BF16, ne, nr, type_b=F32))
    fusion = [(F32, [10, 5, 4, 3], [2, 1, 1, 1], 2, False), (F16, [10, 5, 4, 3], [2, 1, 1, 1], 2, False),
              (BF16, [10, 5, 4, 3], [2, 1, 1, 1], 2, False), (BF16, [16, 5, 4, 3], [1, 2, 1, 1], 3, False),
              (F32, [16, 5, 4, 3], [1, 1, 1, 1], 2, True), (F32, [16, 5, 4, 3], [1, 2, 1, 1], 3, False),
              (F32, [10, 5, 4, 3], [1, 1, 2, 1], 4, False), (F32, [16, 5, 4, 3], [1, 1, 1, 2], 5, False),
              (F32, [10, 5, 4, 3], [1, 1, 2, 2], 6, False), (F32, [10, 5, 4, 3], [1, 2, 2, 2], 7, False),
              (F32, [16, 5, 4, 3], [2, 2, 2, 2], 8, False), (F32, [16, 5, 4, 3], [1, 1, 1, 1], 16, False)]
    cases += [_bin_bcast("add", t, ne, nr, nf, perm1) for t, ne, nr, nf, perm1 in fusion]
    return cases


# --- test_scale ---


def scale_cases() -> list[OpCase]:
    cases = []
    for type, ne, s, b, inplace in ((F32, [10, 10, 10, 10], 2.0, 0.0, False), (F32, [10, 10, 10, 10], 2.0, 1.0, False),
                                    (F32, [10, 10, 10, 10], 2.0, 1.0, True), (F32, [100, 10, 10, 10], 2.0, 1.0, False),
                                    (BF16, [10, 10, 10, 10], 2.0, 1.0, False), (BF16, [10, 10, 10, 10], 2.0, 1.0, True),
                                    (BF16, [100, 10, 10, 10], 0.5, 0.0, False)):
        def build(ctx: Context, type: GGMLType = type, ne: list[int] = ne, s: float = s, b: float = b,
                  inplace: bool = inplace) -> Tensor:
            return op(ctx, "scale_bias_inplace" if inplace else "scale_bias")(new(ctx, "a", type, ne), s, b)

        cases.append(OpCase("SCALE", f"type={_t(type)},ne={_ne(ne)},scale={s:g},bias={b:g},inplace={_b(inplace)}",
                            build))
    return cases


# --- test_concat ---


def _operand(ctx: Context, name: str, type: GGMLType, ne: list[int], v: int, views: dict[int, list[int]]) -> Tensor:
    """A new tensor, or a view into one grown as the first of `views`' bits set in v says (test_concat's v)."""
    for bit, grow in views.items():
        if v & bit:
            return _view_of(ctx, name, type, ne, grow)
    return new(ctx, name, type, ne)


def _concat(type: GGMLType, ne_a: list[int], ne_b_d: int, dim: int, v: int) -> OpCase:
    """test_concat: a and b (ne_a with ne_b_d at dim) as views into bigger tensors as v's bits say."""
    ne_b = list(ne_a)
    ne_b[dim] = ne_b_d

    def build(ctx: Context) -> Tensor:
        a = _operand(ctx, "a", type, ne_a, v, {1: [2, 4, 3, 1], 4: [1, 1, 2, 4]})
        b = _operand(ctx, "b", type, ne_b, v, {2: [3, 2, 4, 1], 8: [1, 1, 3, 2]})
        return op(ctx, "concat")(a, b, dim)

    return OpCase("CONCAT", f"type={_t(type)},ne_a={_ne(ne_a)},ne_b_d={ne_b_d},dim={dim},v={v}", build)


def concat_cases() -> list[OpCase]:
    cases = [_concat(t, [11, 12, 13, 14], 7, dim, v) for v in (0, 1, 2, 3) for dim in range(4)
             for t in (F32, F16, BF16, I8, I16, I32, I64)]
    cases += [_concat(t, [128, 12, 13, 14], 256 if dim == 0 else 7, dim, v)
              for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0) for v in (0, 4, 8, 12) for dim in range(4)]
    return cases


# --- test_out_prod ---


def _out_prod(type_a: GGMLType, type_b: GGMLType, m: int, n: int, k: int, bs: list[int], nr: list[int],
              trans_b: bool = False) -> OpCase:
    def build(ctx: Context) -> Tensor:
        a = new(ctx, "a", type_a, [m, k, bs[0], bs[1]])
        if trans_b:
            b = op(ctx, "transpose")(new(ctx, "b", type_b, [k, n, bs[0] * nr[0], bs[1] * nr[1]]))
        else:
            b = new(ctx, "b", type_b, [n, k, bs[0] * nr[0], bs[1] * nr[1]])
        return op(ctx, "out_prod")(a, b)

    desc = f"type_a={_t(type_a)},type_b={_t(type_b)},m={m},n={n},k={k},bs={_ne(bs)},nr={_ne(nr)},trans_b={_b(trans_b)}"
    return OpCase("OUT_PROD", desc, build, {}, MAX_NMSE_MUL_MAT)


def _cpu_runs_out_prod(type_a: GGMLType, type_b: GGMLType, nr: list[int]) -> bool:
    """ggml-cpu's supports_op for OUT_PROD: src1 F32; an F16 or quantized src0 not broadcast (and implemented
    here)."""
    if type_b != F32:
        return False
    return type_a == F32 or (nr == [1, 1] and (type_a == F16 or is_implemented(type_a)))


def out_prod_cases() -> list[OpCase]:
    cases = [_out_prod(ta, tb, 256, n, k, [bs2, bs3], [nr2, nr3])
             for ta in BASE_TYPES for tb in (F32, F16) for n in (1, 16) for k in (1, 16)
             for bs2 in (1, 3) for bs3 in (1, 3) for nr2 in (1, 2) for nr3 in (1, 2)
             if _cpu_runs_out_prod(ta, tb, [nr2, nr3])]
    cases += [_out_prod(F32, F32, 256, 16, 16, [ne2, 1], [1, 1]) for ne2 in (1, 8, 16, 32)]
    cases += [_out_prod(F32, F32, 256, 16, 16, [1, 1], [nr2, 1]) for nr2 in (8, 16, 32)]
    return cases


# --- test_upscale, test_interpolate ---


def upscale_cases() -> list[OpCase]:
    cases = []
    bilinear_aa = int(ScaleMode.BILINEAR) | int(ScaleFlag.ANTIALIAS)
    for mode in (int(ScaleMode.NEAREST), int(ScaleMode.BILINEAR), int(ScaleMode.BICUBIC), bilinear_aa):
        for transpose in (False, True):
            def build_upscale(ctx: Context, mode: int = mode, transpose: bool = transpose) -> Tensor:
                a = new(ctx, "a", F32, [512, 512, 3, 2])
                if transpose:
                    a = op(ctx, "transpose")(a)
                return op(ctx, "upscale")(a, 2, mode)

            cases.append(OpCase("UPSCALE", f"type=f32,ne=[512,512,3,2],scale_factor=2,mode={mode},"
                                           f"transpose={_b(transpose)}", build_upscale))
        cases += [_interpolate(ne, tgt, mode) for ne, tgt in (([2, 5, 7, 11], [5, 7, 11, 13]),
                                                              ([5, 7, 11, 13], [2, 5, 7, 11]))]
    for mode in (ScaleMode.BILINEAR, ScaleMode.BICUBIC):
        aligned = int(mode) | int(ScaleFlag.ALIGN_CORNERS)
        cases += [_interpolate(ne, tgt, aligned) for ne, tgt in (([2, 5, 7, 11], [5, 7, 11, 13]),
                                                                 ([1, 4, 3, 2], [2, 8, 3, 2]),
                                                                 ([4, 1, 3, 2], [1, 1, 3, 2]))]
    return cases


def _interpolate(ne: list[int], ne_tgt: list[int], mode: int) -> OpCase:
    def build(ctx: Context) -> Tensor:
        return op(ctx, "interpolate")(new(ctx, "a", F32, ne), *ne_tgt, mode)

    return OpCase("UPSCALE", f"type=f32,ne={_ne(ne)},ne_tgt={_ne(ne_tgt)},mode={mode}", build)


# --- test_im2col_3d ---


def _im2col_3d(type_kernel: GGMLType, dst_type: GGMLType, ne_input: list[int], ne_kernel: list[int], ic: int,
               spd: tuple[int, ...], v: bool) -> OpCase:
    def build(ctx: Context) -> Tensor:
        x = new(ctx, "input", F32, ne_input)
        if v:
            x = op(ctx, "view_4d")(x, *(n - 2 for n in ne_input), x.nb[1], x.nb[2], x.nb[3], 0)
        return op(ctx, "im2col_3d")(new(ctx, "kernel", type_kernel, ne_kernel), x, ic, *spd, dst_type)

    desc = (f"type_input=f32,type_kernel={_t(type_kernel)},dst_type={_t(dst_type)},ne_input={_ne(ne_input)},"
            f"ne_kernel={_ne(ne_kernel)},IC={ic},spd={list(spd)},v={_b(v)}")
    return OpCase("IM2COL_3D", desc, build)


def im2col_3d_cases() -> list[OpCase]:
    one = (1, 1, 1, 1, 1, 1, 1, 1, 1)
    cases = [_im2col_3d(tk, dt, [10, 10, 10, 9], [3, 3, 3, 1], 3, one, False)
             for tk, dt in ((F32, F32), (F16, F32), (F16, F16))]
    # s0, s1, s2 in {1, 3}, p0, p1, p2 in {0, 3}, d0, d1, d2 in {1, 3}, IC in {1, 3}, the input a view or not
    for s0 in (1, 3):
        for s1 in (1, 3):
            for s2 in (1, 3):
                for p0 in (0, 3):
                    for p1 in (0, 3):
                        for p2 in (0, 3):
                            for d0 in (1, 3):
                                for d1 in (1, 3):
                                    for d2 in (1, 3):
                                        spd = (s0, s1, s2, p0, p1, p2, d0, d1, d2)
                                        cases += [_im2col_3d(F32, F32, [20, 20, 10, 3], [3, 3, 3, 3], ic, spd, v)
                                                  for ic in (1, 3) for v in (False, True)]
    return cases


def ggml_suite_cases() -> list[OpCase]:
    builders: list[Callable[[], list[OpCase]]] = [unary_cases, glu_cases, bin_bcast_cases, scale_cases, concat_cases,
                                                  out_prod_cases, upscale_cases, im2col_3d_cases]
    return [c for b in builders for c in b()]
