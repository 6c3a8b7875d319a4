"""Prompts of plain K-quant matrices as ggml-cpu's tiled matmul computes them, in its AVX512-VNNI kernel's layout
(DESIGN.md, "K-quants")."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot import kquant_loops as kl
from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_VNNI, quads
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, IR_I8, IR_I32, fma, load_vector, row_pointer, splat

QK_K = 256
TILE_COLS = 16  # src1 columns per microkernel: the int32 lanes of one 512-bit register
TILE_ROWS = 8  # weight rows per microkernel: ggml's band (8 integer sums and 8 scaled sums stay in registers)
QUADS = QK_K // 4  # groups of 4 values of a super-block: one vpdpbusd each
BAND_BYTES = QUADS * TILE_COLS * 4  # a band's interleaved codes of one super-block: [quad][column][4]


class TiledSpec(NamedTuple):
    """One type's tile: kquant_loops' readers, `meta` -> (d, dmin, scales, mins) and `codes`, the sub-block length,
    ggml's BIAS (the codes' offset from the values) and HAS_MIN."""

    block_bytes: int
    unpack: Any
    group: Any
    meta: Any
    codes: Any
    subblock: int
    bias: int
    has_min: bool


def _i32(builder, v):
    return builder.zext(v, ir.VectorType(IR_I32, v.type.count))


def _min_meta(builder, u):
    """Q2_K's, Q4_K's and Q5_K's d, dmin, unsigned scales and mins, as kquant_loops reads them."""
    return u[0], u[1], _i32(builder, u[2]), _i32(builder, u[3])


def _signed_scales_meta(builder, u):
    """Q6_K's int8 scales and Q3_K's scales - 32, both as kquant_loops reads them (<16 x i16>)."""
    return u[0], None, builder.sext(u[1], ir.VectorType(IR_I32, 16)), None


def _plain_codes(builder, values):
    return values


def _q3_K_codes(builder, values):
    """low | 4 where the high bit is set (ggml's tiled code, the value + 4) from kquant_loops' (low, 4 if clear)."""
    low, clear4 = values
    return builder.or_(low, builder.xor(clear4, ir.Constant(clear4.type, [4] * 32)))


TILED_SPECS: dict[str, TiledSpec] = {
    "Q2_K": TiledSpec(84, kl._q2_K_unpack, kl._q2_K_group, _min_meta, _plain_codes, 16, 0, True),
    "Q3_K": TiledSpec(110, kl._q3_K_unpack, kl._q3_K_group, _signed_scales_meta, _q3_K_codes, 16, 4, False),
    "Q4_K": TiledSpec(144, kl._q4_K_unpack, kl._q4_K_group, _min_meta, _plain_codes, 32, 0, True),
    "Q5_K": TiledSpec(176, kl._q4_K_unpack, kl._q5_K_group, _min_meta, _plain_codes, 32, 0, True),
    "Q6_K": TiledSpec(210, kl._q6_K_unpack, kl._q6_K_group, _signed_scales_meta, _plain_codes, 16, 32, False),
}


def make_unpack(spec: TiledSpec):
    """`unpack(w, o, wq, wsc, wmin, wd, wdmin, t)`: the super-block at byte o of w as tile row t: its codes at
    wq[256t:], sub-block scales and mins at wsc[nsub*t:], wmin[nsub*t:], d and dmin at wd[t], wdmin[t]."""
    nsub = QK_K // spec.subblock

    @intrinsic
    def unpack(typingctx, w, o, wq, wsc, wmin, wd, wdmin, t):
        sig = types.void(w, types.intp, wq, wsc, wmin, wd, wdmin, types.intp)

        def codegen(context, builder, signature, args):
            ty, t = signature.args, args[7]
            pb = element_pointer(context, builder, ty[0], args[0], args[1])
            unpacked = spec.unpack(builder, pb)
            pq = element_pointer(context, builder, ty[2], args[2], builder.mul(t, ir.Constant(t.type, QK_K)))
            for g in range(8):
                codes = spec.codes(builder, spec.group(builder, pb, unpacked, g)[0])
                at = builder.bitcast(builder.gep(pq, [ir.Constant(IR_I32, 32 * g)]), codes.type.as_pointer())
                builder.store(codes, at, align=1)
            d, dmin, scales, mins = spec.meta(builder, unpacked)
            at = builder.mul(t, ir.Constant(t.type, nsub))
            for i, v in ((3, scales), (4, mins)):
                if v is not None:
                    p = element_pointer(context, builder, ty[i], args[i], at)
                    builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=4)
            for i, v in ((5, d), (6, dmin)):
                if v is not None:
                    builder.store(v, element_pointer(context, builder, ty[i], args[i], t))
            return context.get_dummy_value()

        return sig, codegen

    return unpack


def _dot_quads(builder, acc, u4, codes, vnni: bool):
    """acc + per column lane the sum of 4 products u4's bytes (unsigned, every lane) times the lane's 4 codes."""
    v16, v64b = ir.VectorType(IR_I32, 16), ir.VectorType(IR_I8, 64)
    u = builder.bitcast(splat(builder, u4, 16), v64b)
    if vnni:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(v16, [v16] * 3))
        return builder.call(fn, [acc, builder.bitcast(u, v16), builder.bitcast(codes, v16)])
    v64 = ir.VectorType(IR_I32, 64)
    return builder.add(acc, quads(builder, builder.mul(builder.zext(u, v64), builder.sext(codes, v64))))


def make_microkernel(spec: TiledSpec, vnni: bool):
    """`micro(wq, wsc, wmin, wd, wdmin, wt, yt, yo, ysub, so, ydt, do, acc, ao, stride)`: TILE_ROWS tile rows from
    wt times one super-block of a band (make_prepare_band's arrays), acc[ao + stride*t + c] = fma(res, y.d, acc) in
    the order of ggml's tiled_run_micro_vnni_8x16."""
    nsub, per_sub = QK_K // spec.subblock, spec.subblock // 4
    v16, v16f = ir.VectorType(IR_I32, 16), ir.VectorType(IR_F32, 16)
    zero = ir.Constant(v16, [0] * 16)

    @intrinsic
    def micro(typingctx, wq, wsc, wmin, wd, wdmin, wt, yt, yo, ysub, so, ydt, do, acc, ao, stride):
        ip = types.intp
        sig = types.void(wq, wsc, wmin, wd, wdmin, ip, yt, ip, ysub, ip, ydt, ip, acc, ip, ip)

        def codegen(context, builder, signature, args):
            ty, wt = signature.args, args[5]
            args = [*args[:5], *args[6:]]
            ty = (*ty[:5], *ty[6:])

            def ptr(i, at=None, elem=None):
                p = element_pointer(context, builder, ty[i], args[i], ir.Constant(IR_I32, 0) if at is None else at)
                return p if elem is None else builder.bitcast(p, elem.as_pointer())

            pwq = ptr(0, builder.mul(wt, ir.Constant(wt.type, QK_K)), IR_I32)
            pyt, psub = ptr(5, args[6]), ptr(7, args[8], v16)
            at = builder.mul(wt, ir.Constant(wt.type, nsub))
            pwsc, pwmin, pwd, pwdmin = ptr(1, at), ptr(2, at), ptr(3, wt), ptr(4, wt)

            def scalar(p, i: int):
                return builder.load(builder.gep(p, [ir.Constant(IR_I32, i)]))

            def scaled(index):
                return splat(builder, builder.load(builder.gep(pwsc, [index])), 16)

            def per_sub_block(body):
                """body(s, totals) -> totals over the sub-blocks, a loop (unrolled, LLVM interleaves and spills)."""
                slots = [cgutils.alloca_once_value(builder, zero) for _ in range(TILE_ROWS)]
                with cgutils.for_range(builder, ir.Constant(IR_I32, nsub)) as loop:
                    totals = body(loop.index, [builder.load(a) for a in slots])
                    for a, v in zip(slots, totals, strict=True):
                        builder.store(v, a)
                return [builder.load(a) for a in slots]

            def scaled_sums(s, s1):
                start = builder.load(builder.gep(psub, [s]), align=4) if spec.bias else zero
                sums = [start] * TILE_ROWS
                q0 = builder.mul(s, ir.Constant(IR_I32, per_sub))
                for g in range(per_sub):
                    q = builder.add(q0, ir.Constant(IR_I32, g))
                    codes = load_vector(builder, builder.gep(pyt, [builder.mul(q, ir.Constant(IR_I32, 64))]), IR_I8,
                                        64)
                    for t in range(TILE_ROWS):
                        at = builder.add(q, ir.Constant(IR_I32, QUADS * t))
                        sums[t] = _dot_quads(builder, sums[t], builder.load(builder.gep(pwq, [at]), align=1), codes,
                                             vnni)
                return [builder.add(s1[t], builder.mul(sums[t], scaled(builder.add(s, ir.Constant(IR_I32, nsub * t)))))
                        for t in range(TILE_ROWS)]

            def min_sums(s, s2):
                ysums = builder.load(builder.gep(psub, [s]), align=4)
                return [builder.add(s2[t], builder.mul(splat(builder, builder.load(builder.gep(
                    pwmin, [builder.add(s, ir.Constant(IR_I32, nsub * t))])), 16), ysums)) for t in range(TILE_ROWS)]

            s1 = per_sub_block(scaled_sums)
            # the mins after the sums, as ggml: they hold no registers during the vpdpbusd
            s2 = per_sub_block(min_sums) if spec.has_min else None
            yd = load_vector(builder, ptr(9, args[10]), IR_F32, 16)
            stride = args[13]
            for t in range(TILE_ROWS):
                res = builder.fmul(builder.sitofp(s1[t], v16f), splat(builder, scalar(pwd, t), 16))
                if spec.has_min:
                    dmin = builder.fneg(splat(builder, scalar(pwdmin, t), 16))
                    res = fma(builder, dmin, builder.sitofp(s2[t], v16f), res)
                at = builder.add(args[12], builder.mul(stride, ir.Constant(stride.type, t)))
                pa = ptr(11, at, v16f)
                builder.store(fma(builder, res, yd, builder.load(pa, align=4)), pa, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return micro


def _transpose16(builder, rows):
    """The 16 <16 x i32> rows transposed: blocks of 8, 4, 2, 1 lanes exchanged between row pairs (vpermt2d)."""
    rows = list(rows)
    for half in (8, 4, 2, 1):
        low = [j if j & half == 0 else 16 + j - half for j in range(16)]
        high = [j + half if j & half == 0 else 16 + j for j in range(16)]
        for i in (i for i in range(16) if i & half == 0):
            a, b = rows[i], rows[i + half]
            rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(IR_I32, 16), low))
            rows[i + half] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(IR_I32, 16), high))
    return rows


def make_prepare_band(spec: TiledSpec):
    """`prepare(yq, yd, yb, r0, n, b, yt, yo, ysub, so, ydt, do)`: super-block b of src1 rows r0..r0+n (n <= 16; the
    lanes past n repeat the last row) as codes by quad and column, sub-block sums (times -bias) and d."""
    nsub, sub16, v16 = QK_K // spec.subblock, spec.subblock // 16, ir.VectorType(IR_I32, 16)

    @intrinsic
    def prepare(typingctx, yq, yd, yb, r0, n, b, yt, yo, ysub, so, ydt, do):
        sig = types.void(yq, yd, yb, *[types.intp] * 3, yt, types.intp, ysub, types.intp, ydt, types.intp)

        def codegen(context, builder, signature, args):
            ty, r0, n, b = signature.args, args[3], args[4], args[5]
            last = builder.sub(n, ir.Constant(n.type, 1))
            rows = [builder.add(r0, builder.select(builder.icmp_signed("<", ir.Constant(n.type, c), n),
                                                   ir.Constant(n.type, c), last)) for c in range(TILE_COLS)]

            def row_words(i: int, at):
                return [builder.bitcast(row_pointer(context, builder, ty[i], args[i], r, at)[0], IR_I32.as_pointer())
                        for r in rows]

            def out(i: int, at, elem):
                return builder.bitcast(element_pointer(context, builder, ty[i], args[i], at), elem.as_pointer())

            codes = row_words(0, builder.mul(b, ir.Constant(b.type, QK_K)))
            pyt = out(6, args[7], v16)
            for h in range(QUADS // TILE_COLS):
                loaded = [load_vector(builder, builder.gep(p, [ir.Constant(IR_I32, 16 * h)]), IR_I32, 16)
                          for p in codes]
                for q, v in enumerate(_transpose16(builder, loaded)):
                    builder.store(v, builder.gep(pyt, [ir.Constant(IR_I32, 16 * h + q)]), align=1)
            sums = _transpose16(builder, [load_vector(builder, p, IR_I32, 16)
                                          for p in row_words(2, builder.mul(b, ir.Constant(b.type, 16)))])
            psub = out(8, args[9], v16)
            for s in range(nsub):
                v = sums[sub16 * s]
                for u in range(1, sub16):
                    v = builder.add(v, sums[sub16 * s + u])
                if spec.bias:
                    v = builder.mul(v, ir.Constant(v16, [-spec.bias] * 16))
                builder.store(v, builder.gep(psub, [ir.Constant(IR_I32, s)]), align=4)
            d = ir.Constant(ir.VectorType(IR_F32, 16), None)
            for c, r in enumerate(rows):
                yd_c = builder.load(row_pointer(context, builder, ty[1], args[1], r, b)[0])
                d = builder.insert_element(d, yd_c, ir.Constant(IR_I32, c))
            builder.store(d, out(10, args[11], ir.VectorType(IR_F32, 16)), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return prepare


def make_tiled_rows(spec: TiledSpec, vnni: bool):
    """`tiled(w, w_off, base, m0, m1, nb, yq, yd, yb, r0, n, out)`: out[r0 + c, m] for c < n, m0 <= m < m1 in the
    order of ggml-cpu's tiled matmul (yb: Q8_K's sums of 16)."""
    unpack, micro, prepare = make_unpack(spec), make_microkernel(spec, vnni), make_prepare_band(spec)
    nsub, block_bytes = QK_K // spec.subblock, spec.block_bytes

    @njit(nogil=True, cache=True)
    def tiled(w, w_off, base, m0, m1, nb, yq, yd, yb, r0, n, out):
        nbands = (n + TILE_COLS - 1) // TILE_COLS
        width = nbands * TILE_COLS
        yt = np.empty(nbands * nb * BAND_BYTES, np.int8)
        ysub = np.empty(nbands * nb * nsub * TILE_COLS, np.int32)
        ydt = np.empty(nbands * nb * TILE_COLS, np.float32)
        for band in range(nbands):
            c0 = band * TILE_COLS
            for b in range(nb):
                blk = band * nb + b
                prepare(yq, yd, yb, r0 + c0, min(TILE_COLS, n - c0), b, yt, blk * BAND_BYTES, ysub,
                        blk * nsub * TILE_COLS, ydt, blk * TILE_COLS)
        tile_rows = TILE_ROWS * nb  # a tile: TILE_ROWS rows' super-blocks, by super-block, then row
        wq = np.zeros(tile_rows * QK_K, np.uint8)
        wsc = np.zeros(tile_rows * nsub, np.int32)
        wmin = np.zeros(tile_rows * nsub, np.int32)
        wd = np.zeros(tile_rows, np.float32)
        wdmin = np.zeros(tile_rows, np.float32)
        acc = np.empty(TILE_ROWS * width, np.float32)
        for g0 in range(m0, m1, TILE_ROWS):
            rows = min(TILE_ROWS, m1 - g0)
            if rows < TILE_ROWS:  # the rows past m1 multiply by zero
                wsc[:] = 0
                wmin[:] = 0
            for t in range(rows):  # whole rows, one after another: streams the prefetchers follow
                o = w_off[base + g0 + t]
                for b in range(nb):
                    unpack(w, o + b * block_bytes, wq, wsc, wmin, wd, wdmin, b * TILE_ROWS + t)
            acc[:] = 0.0
            for b in range(nb):
                for band in range(nbands):
                    blk = band * nb + b
                    micro(wq, wsc, wmin, wd, wdmin, b * TILE_ROWS, yt, blk * BAND_BYTES, ysub, blk * nsub * TILE_COLS,
                          ydt, blk * TILE_COLS, acc, band * TILE_COLS, width)
            for c in range(n):  # each column's rows side by side in out
                for t in range(rows):
                    out[r0 + c, g0 + t] = acc[t * width + c]

    return tiled


TILED_ROWS: dict[str, Any] = {name: make_tiled_rows(spec, HAS_VNNI) for name, spec in TILED_SPECS.items()}
