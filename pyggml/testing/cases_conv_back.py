"""Op checker cases of IM2COL_BACK, IM2COL_3D (and conv_3d over it), COL2IM_1D, CONV_3D and POOL_2D_BACK.

IM2COL_3D, COL2IM_1D and CONV_3D follow test-backend-ops' test_im2col_3d, test_col2im_1d and test_conv_3d
(their shapes and tolerances: COL2IM_1D 1e-7 in F32, 5e-4 in F16/BF16; CONV_3D 5e-4; IM2COL_3D's long
loop over strides, paddings and dilations by a subset covering each value). test-backend-ops reaches
IM2COL_BACK and POOL_2D_BACK only through its gradient checks; here they are built directly, with
IM2COL's and POOL_2D's shapes: 1-D and 2-D, strides below, at and above the kernel (overlapping windows,
gaps), padding and dilation.
"""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.tensor import OpPool, Tensor
from pyggml.core.types import GGMLType
from pyggml.testing.op_check import BF16, F16, F32, MAX_NMSE_MUL_MAT, OpCase, _ne, _t, new, op

MAX_NMSE_CONV_3D = 5e-4  # test_conv_3d::max_nmse_err


def _conv_out(ins: int, ks: int, s: int, p: int, d: int) -> int:
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def _im2col_back_cases() -> list[OpCase]:
    cases = []
    # (input [W, H, IC, N], kernel [KW, KH, IC, OC], (s0, s1, p0, p1, d0, d1))
    for kt in (F32, F16):
        for ine, kne, spd in (([10, 10, 3, 1], [3, 3, 3, 1], (1, 1, 1, 1, 1, 1)),
                              ([20, 20, 2, 2], [3, 3, 2, 2], (3, 1, 3, 0, 1, 3)),
                              ([9, 7, 2, 2], [2, 3, 2, 1], (2, 2, 1, 0, 2, 1)),
                              ([5, 5, 1, 1], [5, 5, 1, 1], (1, 1, 0, 0, 1, 1)),
                              ([8, 6, 4, 1], [1, 1, 4, 3], (3, 2, 0, 1, 1, 1))):
            s0, s1, p0, p1, d0, d1 = spd
            grad = [kne[2] * kne[1] * kne[0], _conv_out(ine[0], kne[0], s0, p0, d0),
                    _conv_out(ine[1], kne[1], s1, p1, d1), ine[3]]

            def build_2d(ctx: Context, kt: GGMLType = kt, ine: list[int] = ine, kne: list[int] = kne,
                         spd: tuple[int, ...] = spd, grad: list[int] = grad) -> Tensor:
                return op(ctx, "im2col_back")(new(ctx, "grad", F32, grad), new(ctx, "kernel", kt, kne), ine, *spd,
                                              True)

            cases.append(OpCase("IM2COL_BACK", f"type_kernel={_t(kt)},ne_input={_ne(ine)},ne_kernel={_ne(kne)},"
                                               f"spd={list(spd)},is_2D=1", build_2d))
    # 1-D: input [L, IC, N], kernel [K, IC, OC], (s0, p0, d0)
    for ine, kne, spd in (([20, 2, 2], [3, 2, 2], (1, 0, 1)), ([20, 2, 2], [3, 2, 2], (3, 3, 3)),
                          ([13, 3, 1], [4, 3, 5], (2, 1, 1)), ([6, 1, 3], [6, 1, 1], (1, 0, 1))):
        s0, p0, d0 = spd
        grad = [kne[1] * kne[0], _conv_out(ine[0], kne[0], s0, p0, d0), ine[2]]

        def build_1d(ctx: Context, ine: list[int] = ine, kne: list[int] = kne, spd: tuple[int, ...] = spd,
                     grad: list[int] = grad) -> Tensor:
            s0, p0, d0 = spd
            return op(ctx, "im2col_back")(new(ctx, "grad", F32, grad), new(ctx, "kernel", F32, kne), ine,
                                          s0, 0, p0, 0, d0, 0, False)

        cases.append(OpCase("IM2COL_BACK", f"type_kernel=f32,ne_input={_ne(ine)},ne_kernel={_ne(kne)},"
                                           f"spd={list(spd)},is_2D=0", build_1d))
    return cases


def _im2col_3d_cases() -> list[OpCase]:
    cases = []
    spd_one = (1, 1, 1, 1, 1, 1, 1, 1, 1)
    # test-backend-ops' defaults: input [10, 10, 10, 9], kernel [3, 3, 3, 1], IC 3, over the three type pairs
    for kt, dt in ((F32, F32), (F16, F32), (F16, F16)):
        def build(ctx: Context, kt: GGMLType = kt, dt: GGMLType = dt) -> Tensor:
            return op(ctx, "im2col_3d")(new(ctx, "kernel", kt, [3, 3, 3, 1]), new(ctx, "input", F32, [10, 10, 10, 9]),
                                        3, *spd_one, dt)

        cases.append(OpCase("IM2COL_3D", f"type_kernel={_t(kt)},dst_type={_t(dt)},ne_input=[10,10,10,9],"
                                         "ne_kernel=[3,3,3,1],IC=3", build))
    # test-backend-ops' loop over input [20, 20, 10, 3], kernel [3, 3, 3, 3]: each stride, padding, dilation
    # value in each dimension, IC 1 and 3, and the input as a view (a sub-block, IC 1)
    # (s0, s1, s2, p0, p1, p2, d0, d1, d2)
    loop = [(1, 1, 1, 0, 0, 0, 1, 1, 1), (3, 1, 1, 3, 0, 0, 1, 1, 1), (1, 3, 1, 0, 3, 0, 1, 3, 1),
            (1, 1, 3, 0, 0, 3, 1, 1, 3), (3, 3, 3, 3, 3, 3, 3, 3, 3), (1, 3, 3, 3, 0, 3, 3, 1, 1),
            (3, 1, 3, 0, 3, 0, 3, 3, 1)]
    for spd in loop:
        for ic, v in ((1, False), (3, False), (1, True)):
            def build_loop(ctx: Context, spd: tuple[int, ...] = spd, ic: int = ic, v: bool = v) -> Tensor:
                x = new(ctx, "input", F32, [20, 20, 10, 3])
                if v:
                    x = op(ctx, "view_4d")(x, 18, 18, 8, 1, x.nb[1], x.nb[2], x.nb[3], 0)
                return op(ctx, "im2col_3d")(new(ctx, "kernel", F32, [3, 3, 3, 3]), x, ic, *spd, F32)

            cases.append(OpCase("IM2COL_3D", f"ne_input=[20,20,10,3],ne_kernel=[3,3,3,3],IC={ic},spd={list(spd)},"
                                             f"v={int(v)}", build_loop))
    # ggml_conv_3d: IM2COL_3D + MUL_MAT (kernel [KW, KH, KD, IC*OC], input [W, H, D, IC*N])
    for kne, ine, ic, spd in (([3, 3, 3, 8], [9, 8, 7, 4], 2, spd_one),
                              ([2, 3, 1, 6], [7, 6, 5, 3], 3, (2, 1, 1, 0, 1, 0, 1, 2, 1))):
        def build_conv(ctx: Context, kne: list[int] = kne, ine: list[int] = ine, ic: int = ic,
                       spd: tuple[int, ...] = spd) -> Tensor:
            return op(ctx, "conv_3d")(new(ctx, "kernel", F16, kne), new(ctx, "input", F32, ine), ic, *spd)

        cases.append(OpCase("IM2COL_3D", f"conv_3d,kernel={_ne(kne)},input={_ne(ine)},IC={ic},spd={list(spd)}",
                            build_conv, {}, MAX_NMSE_MUL_MAT))
    return cases


def _col2im_1d_cases() -> list[OpCase]:
    cases = []
    # test-backend-ops' (K, OC, T_in, s0, p0): overlap, no overlap, cropping, gaps, a single column, OC 1, K 1
    shapes = [(16, 32, 197, 8, 0), (4, 3, 7, 2, 0), (1, 5, 13, 1, 0), (6, 4, 11, 3, 1), (2, 3, 9, 3, 0),
              (5, 4, 11, 2, 0), (8, 4, 13, 4, 2), (4, 3, 1, 2, 0), (16, 1, 197, 8, 0), (1, 5, 13, 3, 0),
              (8, 2, 3, 2, 5)]
    for type in (F32, F16, BF16):
        for k, oc, t_in, s0, p0 in shapes:
            def build(ctx: Context, type: GGMLType = type, k: int = k, oc: int = oc, t_in: int = t_in, s0: int = s0,
                      p0: int = p0) -> Tensor:
                return op(ctx, "col2im_1d")(new(ctx, "cols", type, [k * oc, t_in]), s0, oc, p0)

            cases.append(OpCase("COL2IM_1D", f"type={_t(type)},K={k},OC={oc},T_in={t_in},s0={s0},p0={p0}", build,
                                {}, 1e-7 if type == F32 else 5e-4))
    return cases


def _conv_3d_cases() -> list[OpCase]:
    cases = []
    # test_conv_3d's (N, IC, ID, IH, IW, OC, KD, KH, KW, s0, s1, s2, p0, p1, p2, d0, d1, d2, kernel_offset)
    shapes = [
        (1, 4, 8, 8, 8, 8, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),
        (2, 8, 5, 11, 9, 65, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0),
        (2, 5, 7, 9, 13, 17, 2, 3, 4, 2, 1, 3, 3, 2, 2, 2, 1, 2, 0),
        (3, 16, 3, 7, 9, 33, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),
        (2, 8, 7, 5, 9, 33, 3, 1, 1, 1, 1, 2, 0, 0, 2, 1, 1, 2, 0),
        (2, 3, 1, 2, 1, 7, 1, 1, 1, 1, 1, 1, 3, 4, 2, 1, 1, 1, 0),
        (2, 8, 5, 7, 9, 17, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
        (1, 1, 2, 2, 2, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),  # an empty kernel (KW = 0): zeros
        (1, 1, 2, 2, 2, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),
        (1, 1, 2, 2, 2, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),
        # from its loop over input [20, 22, 18], 3x3x3 and asymmetric 5x1x3 kernels
        (2, 3, 18, 22, 20, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 2, 2, 2, 0),
        (1, 1, 18, 22, 20, 1, 3, 1, 5, 2, 1, 1, 2, 0, 1, 1, 1, 2, 0),
        (1, 3, 18, 22, 20, 4, 3, 3, 3, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0),
    ]
    for kt in (F32, F16):
        for sh in shapes:
            n, ic, id_, ih, iw, oc, kd, kh, kw = sh[:9]
            spd, offset = sh[9:18], sh[18]

            def build(ctx: Context, kt: GGMLType = kt, sh: tuple[int, ...] = sh) -> Tensor:
                n, ic, id_, ih, iw, oc, kd, kh, kw = sh[:9]
                spd, offset = sh[9:18], sh[18]
                x = new(ctx, "input", F32, [iw, ih, id_, ic * n])
                if offset == 0:
                    kernel = new(ctx, "kernel", kt, [kw, kh, kd, ic * oc])
                else:  # a view at an element offset into a longer buffer
                    storage = new(ctx, "kernel", kt, [kw * kh * kd * ic * oc + offset])
                    es = storage.element_size()
                    kernel = op(ctx, "view_4d")(storage, kw, kh, kd, ic * oc, kw * es, kw * kh * es,
                                                kw * kh * kd * es, offset * es)
                return op(ctx, "conv_3d_direct")(kernel, x, *spd, ic, n, oc)

            cases.append(OpCase("CONV_3D", f"N={n},IC={ic},ID={id_},IH={ih},IW={iw},OC={oc},KD={kd},KH={kh},KW={kw},"
                                           f"spd={list(spd)},type_kernel={_t(kt)},kernel_offset={offset}", build,
                                {}, MAX_NMSE_CONV_3D))
    return cases


def _pool_2d_back_cases() -> list[OpCase]:
    cases = []
    # af [W, H, C, N] (POOL_2D's input), (k0, k1, s0, s1, p0, p1): windows apart, overlapping (s < k), with gaps
    # (s > k), padded, a 1x1 window
    for pool in OpPool:
        for ne, kspd in (([12, 10, 3, 1], (3, 2, 2, 2, 0, 0)), ([12, 10, 3, 1], (3, 2, 2, 2, 1, 0)),
                         ([9, 8, 2, 2], (3, 3, 1, 1, 1, 1)), ([11, 7, 2, 1], (2, 2, 3, 3, 0, 1)),
                         ([5, 4, 1, 1], (1, 1, 1, 1, 0, 0)), ([6, 6, 4, 1], (6, 6, 6, 6, 0, 0))):
            k0, k1, s0, s1, p0, p1 = kspd
            ow, oh = (ne[0] + 2 * p0 - k0) // s0 + 1, (ne[1] + 2 * p1 - k1) // s1 + 1

            def build(ctx: Context, pool: OpPool = pool, ne: list[int] = ne, kspd: tuple[int, ...] = kspd,
                      ow: int = ow, oh: int = oh) -> Tensor:
                k0, k1, s0, s1, p0, p1 = kspd
                grad = new(ctx, "grad", F32, [ow, oh, ne[2], ne[3]])
                return op(ctx, "pool_2d_back")(grad, new(ctx, "af", F32, ne), pool, k0, k1, s0, s1, float(p0),
                                               float(p1))

            cases.append(OpCase("POOL_2D_BACK", f"op={pool.name},ne_af={_ne(ne)},k=[{k0},{k1}],s=[{s0},{s1}],"
                                                f"p=[{p0},{p1}]", build))
    return cases


def conv_back_cases() -> list[OpCase]:
    return _im2col_back_cases() + _im2col_3d_cases() + _col2im_1d_cases() + _conv_3d_cases() + _pool_2d_back_cases()
