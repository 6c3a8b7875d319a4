"""Loops over 8 weight rows interleaved (ggml's x86 repack layout): repacked Q4_0 matrices, and tiles of plain
Q4_0, Q8_0 and Q5_0 rows repacked as a work item goes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_VNNI, quads, vpdpbusd
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    COLS,
    IR_F32,
    IR_I8,
    IR_I32,
    fma,
    load_vector,
    per_count,
    row_pointer,
    splat,
    weight_pointers,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import Q4_0, Q5_0, Q8_0
from pyggml.backends.cpu.repack import BLOCK32_FIELDS, X8_ROWS
from pyggml.core.types import GGMLType

# --- Q4_0 repacked: 8 weight rows interleaved 4 bytes at a time (the CPU's repack buffer type) ---
#
# A matrix of Q4_0 rows in the layout of pyggml.backends.cpu.repack: per group of 8 rows and per block, the 8
# rows' f16 scales (16 bytes), then 4 x 32 bytes of nibbles, byte 4r + i of the v-th 32 holding row r's byte
# 4v + i (values 4v + i and 16 + 4v + i). Masked, a 32-byte vector then has values 4v..4v+3 of every row in
# one 32-bit lane, so one vpdpbusd with 4 values of y broadcast sums 4 products for each of the 8 rows: a
# block's exact sums of all 8 rows come in one vector, and scaling them costs one vcvtdq2ps, vmulps and FMA
# for 8 rows instead of for each (about a quarter of the instructions of make_dot_q_row's Q4_0 loop).
# The float order is ggml's x86 repack kernels' (ggml_gemv/gemm_q4_0_8x8_q8_0, AVX2/AVX512): per row and
# column, acc = fma(float(block sum), d_w * d_y, acc) block after block, from 0; d_w * d_y is exact (two
# f16). The sums use the nibbles read unsigned, starting from -8 times the y block's sum: the same integers
# as (nibble - 8) * y.




def _sums_u4_lanes(builder, acc, u, y4, vnni: bool):
    """acc (<8 x i32>) + for each lane i the sum of u[4i+k] * y4[4i+k], k < 4 (u unsigned, y4 signed, <32 x i8>):
    vpdpbusd with VNNI, else portable vector IR (exact either way)."""
    if vnni:
        return vpdpbusd(builder, acc, u, y4)
    v32 = ir.VectorType(IR_I32, 32)
    return builder.add(acc, quads(builder, builder.mul(builder.zext(u, v32), builder.sext(y4, v32), flags=["nsw"])))


def _x8_intrinsic(group_loop, ncols: int):
    """The intrinsic `dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)` of a repacked type whose
    `group_loop(builder, pg, nb, cols)` gives the <8 x float> dots of the group at byte pointer pg with the
    src1 rows of `cols` (pointers to each one's yq, yd, yb): out[r + c, m..m+7] for c < n (1..ncols) and each
    group m0 <= m < m1."""
    v8f = ir.VectorType(IR_F32, 8)

    @intrinsic
    def dot_x8_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]
            w_data, offsets = weight_pointers(context, builder, signature, args)
            eight = ir.Constant(r.type, X8_ROWS)
            g0, g1 = builder.sdiv(args[3], eight), builder.sdiv(args[4], eight)

            def groups(count: int) -> None:
                rows = [builder.add(r, ir.Constant(r.type, c)) for c in range(count)]
                cols = [tuple(row_pointer(context, builder, ty[i], args[i], row)[0] for i in (6, 7, 8))
                        for row in rows]
                with cgutils.for_range(builder, g1, start=g0) as loop:
                    m = builder.mul(loop.index, eight)
                    pg = builder.gep(w_data, [builder.load(builder.gep(offsets, [m]))])
                    for row, dots in zip(rows, group_loop(builder, pg, args[5], cols), strict=True):
                        po = row_pointer(context, builder, ty[11], args[11], row, m)[0]
                        builder.store(dots, builder.bitcast(po, v8f.as_pointer()), align=4)

            per_count(builder, args[10], ncols, groups)
            return context.get_dummy_value()

        return sig, codegen

    return dot_x8_cols


def _x8_q4_0_quants(builder, pb):
    """A repacked Q4_0 block's quants (8 rows' d, then 4 x 32 bytes of nibbles at pb + 16): (unsigned vector,
    index of the 4 y values it multiplies) pairs, and the offset of the values (value = nibble - 8)."""
    v32b = ir.VectorType(IR_I8, 32)
    low = ir.Constant(v32b, [15] * 32)
    pairs = []
    for v in range(4):
        raw = load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * v)]), IR_I8, 32)
        high = builder.and_(builder.lshr(raw, ir.Constant(v32b, [4] * 32)), low)
        pairs += [(builder.and_(raw, low), v), (high, 4 + v)]
    return pairs, -8


def _x8_q8_0_quants(builder, pb):
    """A repacked Q8_0 block's quants (8 rows' d, then 8 x 32 signed bytes at pb + 16), read as value + 128."""
    flip = ir.Constant(ir.VectorType(IR_I8, 32), [0x80] * 32)
    return [(builder.xor(load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * v)]), IR_I8, 32), flip), v)
            for v in range(8)], -128


def _x8_q5_0_wide_quants(builder, pb):
    """A Q5_0 block widened to Q8_0's repacked layout (_widen_q5_0: the 8 rows' d, then 8 x 32 bytes of value +
    16, 0..31): read as they are, offset -16."""
    return [(load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * v)]), IR_I8, 32), v)
            for v in range(8)], -16


def make_dot_x8(vnni: bool, ncols: int, block_bytes: int, quants):
    """`dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)`: out[r + c, m] for c < n (1..ncols), m0 <= m <
    m1 (multiples of X8_ROWS), the dots of a repacked 32-value block type's rows (group of row m at byte
    w_off[base + m]; a group's block of `block_bytes` bytes starts with the 8 rows' f16 d, `quants(builder,
    pb)` reads its values) with src1 rows r..r+n-1 (Q8_0: values yq, scales yd, sums of 16 values yb), in
    ggml's x86 repack order: acc = fma(float(block sum), d_w * d_y, acc). The values are read unsigned
    (value - offset), the sums starting from offset times the y block's sum: the same integers."""
    v8f, v32b = ir.VectorType(IR_F32, 8), ir.VectorType(IR_I8, 32)

    def group_loop(builder, pg, nb, cols):
        """The <8 x float> dots of the 8 rows of the group at byte pointer pg with each src1 row of `cols`."""
        accs = [cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pg, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            dw = builder.fpext(load_vector(builder, pb, ir.HalfType(), 8), v8f)
            pairs, offset = quants(builder, pb)
            for acc, (py, pd, ps) in zip(accs, cols, strict=True):
                y32 = builder.bitcast(builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), IR_I32.as_pointer())
                b2 = builder.shl(b, ir.Constant(b.type, 1))
                ysum = builder.add(builder.load(builder.gep(ps, [b2])),
                                   builder.load(builder.gep(ps, [builder.add(b2, ir.Constant(b.type, 1))])))
                isum = splat(builder, builder.mul(ysum, ir.Constant(IR_I32, offset)), 8)
                for u, at in pairs:
                    y4 = builder.load(builder.gep(y32, [ir.Constant(b.type, at)]), align=1)
                    isum = _sums_u4_lanes(builder, isum, u, builder.bitcast(splat(builder, y4, 8), v32b), vnni)
                d = builder.fmul(dw, splat(builder, builder.load(builder.gep(pd, [b])), 8))
                builder.store(fma(builder, builder.sitofp(isum, v8f), d, builder.load(acc)), acc)
        return [builder.load(acc) for acc in accs]

    return _x8_intrinsic(group_loop, ncols)


# the repacked 32-value block types: their group's block bytes and quants
X8_BLOCK_QUANTS = {int(t): (X8_ROWS * BLOCK32_FIELDS[t][1], quants) for t, quants in (
    (GGMLType.Q4_0, _x8_q4_0_quants), (GGMLType.Q8_0, _x8_q8_0_quants))}
X8_BLOCK_QUANTS[Q5_0] = (X8_BLOCK_QUANTS[Q8_0][0], _x8_q5_0_wide_quants)  # widened to Q8_0's blocks


def make_dot_q4_0_x8(vnni: bool, ncols: int):
    """The repacked Q4_0 loop (see make_dot_x8)."""
    return make_dot_x8(vnni, ncols, *X8_BLOCK_QUANTS[Q4_0])


dot_q4_0_x8_cols = make_dot_q4_0_x8(HAS_VNNI, COLS)
dot_q8_0_x8_cols = make_dot_x8(HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q8_0])
dot_q5_0_x8_cols = make_dot_x8(HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q5_0])




# the block bytes of Q4_0 and Q8_0 (BLOCK32_FIELDS: each an f16 d, then the quants), as constants numba reads
_Q4_0_BYTES, _Q8_0_BYTES = BLOCK32_FIELDS[GGMLType.Q4_0][1], BLOCK32_FIELDS[GGMLType.Q8_0][1]
# weight rows per tile: a tile (64 rows: 39 KB of Q8_0 576-wide rows) stays in the caches while every column
# goes over it, and comes from the allocator's reused memory, not from fresh pages
TILE_ROWS = 64


@intrinsic
def _copy4(typingctx, src, i, dst, j):
    """dst[j:j+4] = src[i:i+4] for uint8 arrays, as one unaligned 32-bit load and store."""
    sig = types.void(src, types.intp, dst, types.intp)

    def codegen(context, builder, signature, args):
        ps = builder.bitcast(element_pointer(context, builder, signature.args[0], args[0], args[1]),
                             IR_I32.as_pointer())
        pd = builder.bitcast(element_pointer(context, builder, signature.args[2], args[2], args[3]),
                             IR_I32.as_pointer())
        builder.store(builder.load(ps, align=1), pd, align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _widen_q5_0(typingctx, w, o, tile, at):
    """The Q5_0 block at byte o of w (d, qh, 16 bytes of nibbles) as its 32 values + 16 (0..31: nibble | bit t of
    qh << 4), written 4 at a time: values 4v..4v+3 at byte at + 32v of tile (v < 8), as one row of a group in
    Q8_0's repacked layout."""
    sig = types.void(w, types.intp, tile, types.intp)

    def codegen(context, builder, signature, args):
        v16, v32 = ir.VectorType(IR_I8, 16), ir.VectorType(IR_I8, 32)
        pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
        qh = builder.load(builder.bitcast(builder.gep(pw, [ir.Constant(IR_I32, 2)]), IR_I32.as_pointer()), align=1)
        qs = load_vector(builder, builder.gep(pw, [ir.Constant(IR_I32, 6)]), IR_I8, 16)
        low = builder.and_(qs, ir.Constant(v16, [15] * 16))
        high = builder.lshr(qs, ir.Constant(v16, [4] * 16))
        values = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(IR_I32, 32), list(range(32))))
        bits = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))  # element t: bit t
        values = builder.or_(values, builder.select(bits, ir.Constant(v32, [16] * 32), ir.Constant(v32, [0] * 32)))
        lanes = builder.bitcast(values, ir.VectorType(IR_I32, 8))
        pt = element_pointer(context, builder, signature.args[2], args[2], args[3])
        for v in range(8):
            dst = builder.bitcast(builder.gep(pt, [ir.Constant(IR_I32, 32 * v)]), IR_I32.as_pointer())
            builder.store(builder.extract_element(lanes, ir.Constant(IR_I32, v)), dst, align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True)
def tile_x8(w, w_off, base, m0, m1, nb, kind):
    """Weight rows m0..m1 (m1 - m0 a multiple of X8_ROWS; row m at byte w_off[base + m]) of Q4_0, Q8_0 or Q5_0
    (`kind`) in the repacked layout (see pyggml.backends.cpu.repack): per group and block, the 8 rows' d, then
    their quants 4 bytes a row at a time; Q5_0 widened to Q8_0's blocks (_widen_q5_0). Returns the tile and the
    byte offset of each row's group, as the repacked loops read them."""
    block_bytes = _Q4_0_BYTES if kind == Q4_0 else (_Q8_0_BYTES if kind == Q8_0 else 22)
    out_bytes = _Q4_0_BYTES if kind == Q4_0 else _Q8_0_BYTES
    n_groups = (m1 - m0) // X8_ROWS
    group_bytes = X8_ROWS * out_bytes
    tile = np.empty(n_groups * nb * group_bytes, np.uint8)
    offs = np.empty(m1 - m0, np.int64)
    nq = (out_bytes - 2) // 4
    for g in range(n_groups):
        for r in range(X8_ROWS):
            offs[g * X8_ROWS + r] = g * nb * group_bytes
            src = w_off[base + m0 + g * X8_ROWS + r]
            for b in range(nb):
                o = src + b * block_bytes
                dst = (g * nb + b) * group_bytes
                tile[dst + 2 * r] = w[o]  # the f16 d
                tile[dst + 2 * r + 1] = w[o + 1]
                at = dst + X8_ROWS * 2 + 4 * r
                if kind == Q5_0:
                    _widen_q5_0(w, o, tile, at)
                else:
                    for u in range(nq):
                        _copy4(w, o + 2 + 4 * u, tile, at + 32 * u)
    return tile, offs


