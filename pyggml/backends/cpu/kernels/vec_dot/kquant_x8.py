"""The loops over 8 interleaved Q4_K rows (repack.repack_q4_K's layout) against Q8_K src1 rows, in the float orders
of ggml's x86 repack kernels: ggml_gemm_q4_K_8x8_q8_K (columns in fours) and ggml_gemv_q4_K_8x8_q8_K (the rest)
(DESIGN.md, "Repacked rows (x8)")."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_VNNI
from pyggml.backends.cpu.kernels.vec_dot.ir import COLS, IR_F32, IR_I8, IR_I32, fma, load_vector, shuffle, splat
from pyggml.backends.cpu.kernels.vec_dot.tiles_x8 import (
    X8_GROUPS_A_PASS,
    _sums_u4_lanes,
    _x8_intrinsic,
    group_halves,
    joined,
)
from pyggml.backends.cpu.repack import Q4_K_X8_BYTES, Q4_K_X8_MINS, Q4_K_X8_QS, Q4_K_X8_SCALES, X8_ROWS


def _const(n: int, value: int, bits: int = 8):
    return ir.Constant(ir.VectorType(ir.IntType(bits), n), [value] * n)


def _scales_and_mins(builder, pb):
    """A group's super-block: its 8 sub-blocks' scales and mins, each an <8 x i32> of the 8 rows."""
    v8 = ir.VectorType(IR_I32, 8)
    packed = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, Q4_K_X8_SCALES)]), IR_I8, 64)
    low = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, Q4_K_X8_MINS)]), IR_I8, 32)
    low = builder.shuffle_vector(builder.and_(low, _const(32, 15)), builder.lshr(low, _const(32, 4)),
                                 ir.Constant(ir.VectorType(IR_I32, 64), list(range(64))))
    mins = builder.or_(low, builder.shl(builder.lshr(packed, _const(64, 6)), _const(64, 4)))
    scales = builder.and_(packed, _const(64, 63))
    return ([builder.zext(shuffle(builder, scales, list(range(8 * j, 8 * j + 8))), v8) for j in range(8)],
            [builder.zext(shuffle(builder, mins, list(range(8 * j, 8 * j + 8))), v8) for j in range(8)])


def make_dot_q4_K_x8(vnni: bool, ncols: int, per_pair: bool, groups: int = X8_GROUPS_A_PASS):
    """`dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)` as make_dot_x8's, for repacked Q4_K against Q8_K
    (yb: its sums of 16). Per row and column, acc = fma(float(scaled sums), f32(d) * y.d, acc) and accm likewise
    with the mins' sums and dmin; the result acc - accm. `per_pair`: an FMA per two sub-blocks, as ggml's gemm,
    else one per super-block, as its gemv; the integer sums are exact either way. `groups`: as make_dot_x8's."""

    def group_loop(builder, pgs, nb, cols):
        lanes = X8_ROWS * len(pgs)
        vf, vb, vi = ir.VectorType(IR_F32, lanes), ir.VectorType(IR_I8, 4 * lanes), ir.VectorType(IR_I32, lanes)
        zero_f, zero_i = ir.Constant(vf, [0.0] * lanes), ir.Constant(vi, [0] * lanes)
        accs = [(cgutils.alloca_once_value(builder, zero_f), cgutils.alloca_once_value(builder, zero_f))
                for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pbs = [builder.gep(pg, [builder.mul(b, ir.Constant(b.type, Q4_K_X8_BYTES))]) for pg in pgs]
            dw, dmw = group_halves(builder, pbs, 0), group_halves(builder, pbs, 16)
            per_group = [_scales_and_mins(builder, pb) for pb in pbs]
            scales = [joined(builder, [sm[0][j] for sm in per_group]) for j in range(8)]
            mins = [joined(builder, [sm[1][j] for sm in per_group]) for j in range(8)]
            # per column: acc, accm, and (gemv) the super-block's integer sums; f32(d) * y.d, f32(dmin) * y.d
            state = [[builder.load(acc), builder.load(accm), zero_i, zero_i] for acc, accm in accs]
            factors = []
            for _, pd, _ in cols:
                yd = splat(builder, builder.load(builder.gep(pd, [b])), lanes)
                factors.append((builder.fmul(dw, yd), builder.fmul(dmw, yd)))
            y32s = [builder.bitcast(builder.gep(py, [builder.shl(b, ir.Constant(b.type, 8))]), IR_I32.as_pointer())
                    for py, _, _ in cols]
            for p in range(4):
                # one 32-byte run of quants at a time, into every column's sums (few registers live)
                sums = [[zero_i, zero_i] for _ in cols]
                for v in range(8):
                    raw = joined(builder, [load_vector(builder, builder.gep(pb, [ir.Constant(
                        IR_I32, Q4_K_X8_QS + 256 * p + 32 * v)]), IR_I8, 32) for pb in pbs])
                    pair = (builder.and_(raw, _const(4 * lanes, 15)),
                            builder.and_(builder.lshr(raw, _const(4 * lanes, 4)), _const(4 * lanes, 15)))
                    for y32, col_sums in zip(y32s, sums, strict=True):
                        for h, u in enumerate(pair):
                            y4 = builder.load(builder.gep(y32, [ir.Constant(b.type, 16 * p + 8 * h + v)]), align=1)
                            col_sums[h] = _sums_u4_lanes(builder, col_sums[h], u,
                                                         builder.bitcast(splat(builder, y4, lanes), vb), vnni)
                for c, ((_, _, ps), (low, high)) in enumerate(zip(cols, sums, strict=True)):
                    isum = builder.add(builder.mul(low, scales[2 * p]), builder.mul(high, scales[2 * p + 1]))
                    msum = zero_i
                    for j in (2 * p, 2 * p + 1):  # the mins times y's sums of 32 (two sums of 16)
                        at = builder.add(builder.shl(b, ir.Constant(b.type, 4)), ir.Constant(b.type, 2 * j))
                        y_sum = builder.add(builder.load(builder.gep(ps, [at])),
                                            builder.load(builder.gep(ps, [builder.add(at, ir.Constant(b.type, 1))])))
                        msum = builder.add(msum, builder.mul(mins[j], splat(builder, y_sum, lanes)))
                    s = state[c]
                    if per_pair:
                        s[0] = fma(builder, builder.sitofp(isum, vf), factors[c][0], s[0])
                        s[1] = fma(builder, builder.sitofp(msum, vf), factors[c][1], s[1])
                    else:
                        s[2], s[3] = builder.add(s[2], isum), builder.add(s[3], msum)
            for (acc, accm), s, (d, dm) in zip(accs, state, factors, strict=True):
                if not per_pair:
                    s[0] = fma(builder, builder.sitofp(s[2], vf), d, s[0])
                    s[1] = fma(builder, builder.sitofp(s[3], vf), dm, s[1])
                builder.store(s[0], acc)
                builder.store(s[1], accm)
        return [builder.fsub(builder.load(acc), builder.load(accm)) for acc, accm in accs]

    return _x8_intrinsic(group_loop, ncols, groups)


dot_q4_K_x8_cols = make_dot_q4_K_x8(HAS_VNNI, COLS, per_pair=True)
dot_q4_K_x8_cols.__doc__ = "Repacked Q4_K rows in ggml_gemm_q4_K_8x8_q8_K's order (see make_dot_q4_K_x8)."
dot_q4_K_x8_gemv_cols = make_dot_q4_K_x8(HAS_VNNI, COLS, per_pair=False)
dot_q4_K_x8_gemv_cols.__doc__ = "Repacked Q4_K rows in ggml_gemv_q4_K_8x8_q8_K's order (see make_dot_q4_K_x8)."
