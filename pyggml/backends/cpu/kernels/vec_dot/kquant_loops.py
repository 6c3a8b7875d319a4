"""Row loops of the K-quants Q2_K, Q4_K, Q5_K and Q6_K against Q8_K src1 rows, in ggml's float orders."""

from __future__ import annotations

from typing import Any, NamedTuple

from llvmlite import ir
from numba.core import cgutils

from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_AVX2
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    COLS,
    IR_F32,
    IR_I8,
    IR_I16,
    IR_I32,
    fma,
    load_vector,
    pair_sums,
    reduce_add_i32,
    shuffle,
    splat,
    sum_f32_tree,
)
from pyggml.backends.cpu.kernels.vec_dot.quant_loops import block_row_intrinsic


def scaled_sums_avx2(builder, uv, yv, scales):
    """8 exact int32 partial sums of uv[t] * yv[t] * scales[t // 2] (uv 0..63, so no int16 saturation): ggml's
    vpmaddubsw, then vpmaddwd by the scales."""
    v16i16, v8i32, v32i8 = ir.VectorType(IR_I16, 16), ir.VectorType(IR_I32, 8), ir.VectorType(IR_I8, 32)
    module = builder.module
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    return builder.call(maddwd, [builder.call(maddubs, [uv, yv]), scales])


def scaled_sums_portable(builder, uv, yv, scales):
    """As scaled_sums_avx2 in portable vector IR (the same pairs, in int32)."""
    v32, v16 = ir.VectorType(IR_I32, 32), ir.VectorType(IR_I32, 16)
    prod = builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"])
    pairs = pair_sums(builder, prod)
    pairs = builder.mul(pairs, builder.sext(scales, v16), flags=["nsw"])
    return pair_sums(builder, pairs)


target_scaled_sums = scaled_sums_avx2 if HAS_AVX2 else scaled_sums_portable


def _f16_lanes(builder, p):
    """The 4 halves at p as <4 x float>: one vcvtph2ps, fenced so LLVM keeps the load a vector."""
    v4f = ir.VectorType(IR_F32, 4)
    wide = builder.fpext(load_vector(builder, p, ir.HalfType(), 4), v4f)
    fence = builder.module.declare_intrinsic("llvm.arithmetic.fence.v4f32", fnty=ir.FunctionType(v4f, [v4f]))
    return builder.call(fence, [wide])


def _const(builder, n: int, values: list[int], bits: int = 8):
    return ir.Constant(ir.VectorType(ir.IntType(bits), n), values)


def _q4_K_unpack(builder, pb):
    """A Q4_K super-block's d, dmin and its 8 6-bit scales and mins (<8 x i8>), as ggml's get_scale_min_k4."""
    halves = _f16_lanes(builder, pb)
    d, dmin = (builder.extract_element(halves, ir.Constant(IR_I32, i)) for i in (0, 1))
    q = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 4)]), IR_I8, 16)  # scales[12], then qs
    top = [0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]  # the high 2 bits exist for j >= 4 only

    def high(idx: list[int]):
        h = builder.lshr(shuffle(builder, q, idx), _const(builder, 8, [6] * 8))
        return builder.and_(builder.shl(h, _const(builder, 8, [4] * 8)), _const(builder, 8, top))

    low6 = _const(builder, 8, [63] * 4 + [15] * 4)
    low_sc = shuffle(builder, q, [0, 1, 2, 3, 8, 9, 10, 11])
    sc = builder.or_(builder.and_(low_sc, low6), high([0, 1, 2, 3, 0, 1, 2, 3]))
    low_m = builder.lshr(shuffle(builder, q, [4, 5, 6, 7, 8, 9, 10, 11]), _const(builder, 8, [0] * 4 + [4] * 4))
    mins = builder.or_(builder.and_(low_m, low6), high([4, 5, 6, 7, 4, 5, 6, 7]))
    return d, dmin, sc, mins


def _q4_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q4_K super-block: its 32 values and its scale for every pair."""
    sc = builder.zext(unpacked[2], ir.VectorType(IR_I16, 8))
    qs = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * (g // 2))]), IR_I8, 32)
    if g % 2 == 0:
        return builder.and_(qs, _const(builder, 32, [15] * 32)), shuffle(builder, sc, [g] * 16)
    return builder.lshr(qs, _const(builder, 32, [4] * 32)), shuffle(builder, sc, [g] * 16)


def _q5_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q5_K super-block: Q4_K's nibbles (from byte 48) with bit g of qh[t] as their fifth."""
    values, scales = _q4_K_group(builder, builder.gep(pb, [ir.Constant(IR_I32, 32)]), unpacked, g)
    qh = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16)]), IR_I8, 32)
    high = builder.shl(builder.and_(builder.lshr(qh, _const(builder, 32, [g] * 32)), _const(builder, 32, [1] * 32)),
                       _const(builder, 32, [4] * 32))
    return builder.or_(values, high), scales


def _mins_sum(builder, mins, bsums):
    n = mins.type.count
    ys = pair_sums(builder, bsums) if n == 8 else bsums
    return reduce_add_i32(builder, builder.mul(builder.zext(mins, ir.VectorType(IR_I32, n)), ys, flags=["nsw"]), n)


def _min_finish(builder, unpacked, total, isum, bsums, yd):
    """sumf + (d * yd * isum - dmin * yd * summs), ggml's reference `sumf += d * sumi - dmin * summs`."""
    summs = _mins_sum(builder, unpacked[3], bsums)
    d, dmin = builder.fmul(unpacked[0], yd), builder.fmul(unpacked[1], yd)
    part = builder.fsub(builder.fmul(d, builder.sitofp(isum, IR_F32)),
                        builder.fmul(dmin, builder.sitofp(summs, IR_F32)))
    return builder.fadd(total, part)


def _q2_K_unpack(builder, pb):
    """A Q2_K super-block's d and dmin (lanes 2, 3 of the 8 bytes ending the block), 16 scales and mins."""
    lanes = _f16_lanes(builder, builder.gep(pb, [ir.Constant(IR_I32, 76)]))
    d, dmin = (builder.extract_element(lanes, ir.Constant(IR_I32, i)) for i in (2, 3))
    raw = load_vector(builder, pb, IR_I8, 16)
    return d, dmin, builder.and_(raw, _const(builder, 16, [15] * 16)), builder.lshr(raw, _const(builder, 16, [4] * 16))


def _q2_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q2_K super-block: bits 2l of qs[32j + t] (j, l = divmod(g, 4)), sub-blocks 2g, 2g + 1."""
    j, shift = g // 4, 2 * (g % 4)
    q = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * j)]), IR_I8, 32)
    v = builder.and_(builder.lshr(q, _const(builder, 32, [shift] * 32)), _const(builder, 32, [3] * 32))
    sc = builder.zext(unpacked[2], ir.VectorType(IR_I16, 16))
    return v, shuffle(builder, sc, [2 * g] * 8 + [2 * g + 1] * 8)


def _q3_K_unpack(builder, pb):
    """A Q3_K super-block's d (lane 3 of the 8 bytes ending the block) and its 16 6-bit scales - 32 (<16 x i16>)."""
    d = builder.extract_element(_f16_lanes(builder, builder.gep(pb, [ir.Constant(IR_I32, 102)])),
                                ir.Constant(IR_I32, 3))
    raw = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 96)]), IR_I8, 16)
    low = builder.lshr(shuffle(builder, raw, [*range(8), *range(8)]), _const(builder, 16, [0] * 8 + [4] * 8))
    high = builder.lshr(shuffle(builder, raw, [8, 9, 10, 11] * 4), _const(builder, 16, [0, 0, 0, 0, 2, 2, 2, 2,
                                                                                      4, 4, 4, 4, 6, 6, 6, 6]))
    high = builder.shl(builder.and_(high, _const(builder, 16, [3] * 16)), _const(builder, 16, [4] * 16))
    scales = builder.or_(builder.and_(low, _const(builder, 16, [15] * 16)), high)
    scales = builder.sub(scales, _const(builder, 16, [32] * 16))
    return d, builder.sext(scales, ir.VectorType(IR_I16, 16))


def _q3_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q3_K super-block: (bits 2l of qs[32j + t], 4 where bit 4j + l of hmask[t] is clear),
    j, l = divmod(g, 4): the value is their difference, as ggml's AVX2 multiplies them apart."""
    j, l = divmod(g, 4)
    q = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 32 + 32 * j)]), IR_I8, 32)
    low = builder.and_(builder.lshr(q, _const(builder, 32, [2 * l] * 32)), _const(builder, 32, [3] * 32))
    clear = builder.lshr(builder.not_(load_vector(builder, pb, IR_I8, 32)), _const(builder, 32, [g] * 32))
    clear = builder.and_(clear, _const(builder, 32, [1] * 32))
    scales = shuffle(builder, unpacked[1], [2 * g] * 8 + [2 * g + 1] * 8)
    return (low, builder.shl(clear, _const(builder, 32, [2] * 32))), scales


def _q3_K_scaled_sums(builder, v, yv, scales):
    """Scaled sums of low - high4 by pairs, as ggml's AVX2 (two vpmaddubsw subtracted, then vpmaddwd)."""
    module = builder.module
    v16i16, v8i32, v32i8 = ir.VectorType(IR_I16, 16), ir.VectorType(IR_I32, 8), ir.VectorType(IR_I8, 32)
    if not HAS_AVX2:
        v32, v16 = ir.VectorType(IR_I32, 32), ir.VectorType(IR_I32, 16)
        diff = builder.sub(builder.zext(v[0], v32), builder.zext(v[1], v32))
        pairs = pair_sums(builder, builder.mul(diff, builder.sext(yv, v32), flags=["nsw"]))
        return pair_sums(builder, builder.mul(pairs, builder.sext(scales, v16), flags=["nsw"]))
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    p16 = builder.sub(builder.call(maddubs, [v[0], yv]), builder.call(maddubs, [v[1], yv]))
    return builder.call(maddwd, [p16, scales])


def _d_finish(builder, unpacked, total, isum, bsums, yd):
    """sumf + (d * yd) * isum (Q3_K's values already signed), ggml's reference order."""
    return builder.fadd(total, builder.fmul(builder.fmul(unpacked[0], yd), builder.sitofp(isum, IR_F32)))


def _d_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(y.d * x.d, lanes, acc), as ggml's AVX2 Q3_K."""
    d = builder.fmul(yd, unpacked[0])
    return [fma(builder, splat(builder, d, 8), builder.sitofp(iacc, ir.VectorType(IR_F32, 8)), state[0])]


def _q6_K_unpack(builder, pb):
    """A Q6_K super-block's d (its last half, read as lane 3 of the 8 bytes ending the block) and 16 scales."""
    lanes = _f16_lanes(builder, builder.gep(pb, [ir.Constant(IR_I32, 202)]))
    d = builder.extract_element(lanes, ir.Constant(IR_I32, 3))
    scales = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 192)]), IR_I8, 16)
    return d, builder.sext(scales, ir.VectorType(IR_I16, 16))


def _q6_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q6_K super-block: values low4 | high2 << 4 (the value + 32), sub-blocks 2g and 2g + 1."""
    n, q = divmod(g, 4)
    ql = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 64 * n + 32 * (q & 1))]), IR_I8, 32)
    qh = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 128 + 32 * n)]), IR_I8, 32)
    low = builder.and_(builder.lshr(ql, _const(builder, 32, [4 * (q >> 1)] * 32)), _const(builder, 32, [15] * 32))
    high = builder.and_(builder.lshr(qh, _const(builder, 32, [2 * q] * 32)), _const(builder, 32, [3] * 32))
    v = builder.or_(low, builder.shl(high, _const(builder, 32, [4] * 32)))
    return v, shuffle(builder, unpacked[1], [2 * g] * 8 + [2 * g + 1] * 8)


def _q6_K_finish(builder, unpacked, total, isum, bsums, yd):
    """sumf + (d * yd) * (isum - 32 * sum_j scales[j] * (y's sum over sub-block j)), the numba loop's order."""
    v16 = ir.VectorType(IR_I32, 16)
    offset = reduce_add_i32(builder, builder.mul(builder.sext(unpacked[1], v16), bsums, flags=["nsw"]), 16)
    isum = builder.sub(isum, builder.shl(offset, ir.Constant(IR_I32, 5)))
    return builder.fadd(total, builder.fmul(builder.fmul(unpacked[0], yd), builder.sitofp(isum, IR_F32)))


_Q4_K_X86_STATE = (8, 4)  # ggml's AVX2 acc (8 lanes) and acc_m (Q4_K's mins, 4 lanes)
_Q6_K_X86_STATE = (8,)


def _q4_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(d, lanes, acc); acc_m = fma(-y.d * x.dmin, mins by pairs of bsums, acc_m), as ggml's AVX2."""
    v8f, v4f, v8 = ir.VectorType(IR_F32, 8), ir.VectorType(IR_F32, 4), ir.VectorType(IR_I32, 8)
    d = builder.fmul(yd, unpacked[0])
    acc = fma(builder, splat(builder, d, 8), builder.sitofp(iacc, v8f), state[0])
    products = builder.mul(builder.zext(unpacked[3], v8), pair_sums(builder, bsums), flags=["nsw"])
    prod = builder.add(shuffle(builder, products, [0, 2, 4, 6]), shuffle(builder, products, [1, 3, 5, 7]))
    dmin = builder.fmul(builder.fneg(yd), unpacked[1])
    acc_m = fma(builder, splat(builder, dmin, 4), builder.sitofp(prod, v4f), state[1])
    return [acc, acc_m]


def _q5_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(d, lanes, acc); summs = fma(-y.d * x.dmin, float(mins' sum), summs), gcc's contraction."""
    v8f, v1f = ir.VectorType(IR_F32, 8), ir.VectorType(IR_F32, 1)
    d = builder.fmul(yd, unpacked[0])
    acc = fma(builder, splat(builder, d, 8), builder.sitofp(iacc, v8f), state[0])
    dmin = builder.fmul(builder.fneg(yd), unpacked[1])
    summs = builder.sitofp(_mins_sum(builder, unpacked[3], bsums), IR_F32)
    mins = builder.insert_element(ir.Constant(v1f, None), summs, ir.Constant(IR_I32, 0))
    return [acc, fma(builder, splat(builder, dmin, 1), mins, state[1])]


def _q2_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(-y.d * x.dmin, mins by pairs of sub-blocks, acc), then acc = fma(d, lanes, acc), as ggml's AVX2."""
    v8f, v16 = ir.VectorType(IR_F32, 8), ir.VectorType(IR_I32, 16)
    prod = pair_sums(builder, builder.mul(builder.zext(unpacked[3], v16), bsums, flags=["nsw"]))
    dmin = builder.fmul(builder.fneg(yd), unpacked[1])
    acc = fma(builder, splat(builder, dmin, 8), builder.sitofp(prod, v8f), state[0])
    d = builder.fmul(yd, unpacked[0])
    return [fma(builder, splat(builder, d, 8), builder.sitofp(iacc, v8f), acc)]


def _q5_K_x86_result(builder, state):
    return builder.fadd(sum_f32_tree(builder, state[0], 8), builder.extract_element(state[1], ir.Constant(IR_I32, 0)))


def _q4_K_x86_result(builder, state):
    """hsum_float_8(acc) + acc_m's 4 lanes summed as ggml (movehl, then movehdup)."""
    return builder.fadd(sum_f32_tree(builder, state[0], 8), sum_f32_tree(builder, state[1], 4))


def _q6_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(d, lanes - 32 * q8sclsub, acc): ggml's offset subtracted lane by lane (its pairs by vpmaddwd: the
    sums of 16 fit int16)."""
    v8f, v16, v16i16, v8 = (ir.VectorType(IR_F32, 8), ir.VectorType(IR_I32, 16), ir.VectorType(IR_I16, 16),
                            ir.VectorType(IR_I32, 8))
    if HAS_AVX2:
        maddwd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8, [v16i16] * 2))
        sub = builder.call(maddwd, [builder.trunc(bsums, v16i16), unpacked[1]])
    else:
        sub = pair_sums(builder, builder.mul(builder.sext(unpacked[1], v16), bsums, flags=["nsw"]))
    lanes = builder.sub(iacc, builder.shl(sub, ir.Constant(ir.VectorType(IR_I32, 8), [5] * 8)))
    d = builder.fmul(yd, unpacked[0])
    return [fma(builder, splat(builder, d, 8), builder.sitofp(lanes, v8f), state[0])]


def _q6_K_x86_result(builder, state):
    return sum_f32_tree(builder, state[0], 8)


def make_dot_k_row(block_bytes: int, unpack, group, finish, scaled_sums=None, x86=None, ncols: int = 1):
    """A K-quant's row loop against Q8_K (make_dot_q_row's signatures; yb: bsums): per super-block `unpack`, its 8
    groups' (values, pair scales) by `group`, then `finish` (ref) or `x86` = (state lanes, block, result)."""
    v8i32 = ir.VectorType(IR_I32, 8)
    scaled_sums = target_scaled_sums if scaled_sums is None else scaled_sums

    def row_loop(builder, pw, nb, cols):
        if x86 is not None:
            widths, x86_block, x86_result = x86
            states = [[cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(IR_F32, n), [0.0] * n))
                       for n in widths] for _ in cols]
        sums = [cgutils.alloca_once_value(builder, ir.Constant(IR_F32, 0.0)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            unpacked = unpack(builder, pb)
            iacc = [ir.Constant(v8i32, [0] * 8) for _ in cols]
            for g in range(8):
                v, scales = group(builder, pb, unpacked, g)
                for c, (py, _, _) in enumerate(cols):
                    at = builder.add(builder.shl(b, ir.Constant(b.type, 8)), ir.Constant(b.type, 32 * g))
                    yv = load_vector(builder, builder.gep(py, [at]), IR_I8, 32)
                    iacc[c] = builder.add(iacc[c], scaled_sums(builder, v, yv, scales))
            for c, (_, pd, ps) in enumerate(cols):
                bsums = load_vector(builder, builder.gep(ps, [builder.shl(b, ir.Constant(b.type, 4))]), IR_I32, 16)
                yd = builder.load(builder.gep(pd, [b]))
                if x86 is not None:
                    state = x86_block(builder, unpacked, [builder.load(a) for a in states[c]], iacc[c], bsums, yd)
                    for a, v in zip(states[c], state, strict=True):
                        builder.store(v, a)
                    continue
                isum = reduce_add_i32(builder, iacc[c], 8)
                builder.store(finish(builder, unpacked, builder.load(sums[c]), isum, bsums, yd), sums[c])
        if x86 is not None:
            return [x86_result(builder, [builder.load(a) for a in state]) for state in states]
        return [builder.load(total) for total in sums]

    return block_row_intrinsic(row_loop, ncols)


Q2_K_SPEC = {"block_bytes": 84, "unpack": _q2_K_unpack, "group": _q2_K_group, "finish": _min_finish}
Q3_K_SPEC = {"block_bytes": 110, "unpack": _q3_K_unpack, "group": _q3_K_group, "finish": _d_finish,
             "scaled_sums": _q3_K_scaled_sums}
Q4_K_SPEC = {"block_bytes": 144, "unpack": _q4_K_unpack, "group": _q4_K_group, "finish": _min_finish}
Q5_K_SPEC = {"block_bytes": 176, "unpack": _q4_K_unpack, "group": _q5_K_group, "finish": _min_finish}
Q6_K_SPEC = {"block_bytes": 210, "unpack": _q6_K_unpack, "group": _q6_K_group, "finish": _q6_K_finish}
Q2_K_X86 = (_Q6_K_X86_STATE, _q2_K_x86_block, _q6_K_x86_result)
Q3_K_X86 = (_Q6_K_X86_STATE, _d_x86_block, _q6_K_x86_result)
Q4_K_X86 = (_Q4_K_X86_STATE, _q4_K_x86_block, _q4_K_x86_result)
Q5_K_X86 = ((8, 1), _q5_K_x86_block, _q5_K_x86_result)
Q6_K_X86 = (_Q6_K_X86_STATE, _q6_K_x86_block, _q6_K_x86_result)


class KRowLoops(NamedTuple):
    """A K-quant's row loops (the type table's columns of the same names; DESIGN.md, "K-quants")."""

    cols: Any
    cols_x86: Any


def k_row_loops(spec: dict, x86: tuple) -> KRowLoops:
    return KRowLoops(make_dot_k_row(**spec, ncols=COLS), make_dot_k_row(**spec, x86=x86, ncols=COLS))


Q2_K_LOOPS = k_row_loops(Q2_K_SPEC, Q2_K_X86)
Q3_K_LOOPS = k_row_loops(Q3_K_SPEC, Q3_K_X86)
Q4_K_LOOPS = k_row_loops(Q4_K_SPEC, Q4_K_X86)
Q5_K_LOOPS = k_row_loops(Q5_K_SPEC, Q5_K_X86)
Q6_K_LOOPS = k_row_loops(Q6_K_SPEC, Q6_K_X86)
