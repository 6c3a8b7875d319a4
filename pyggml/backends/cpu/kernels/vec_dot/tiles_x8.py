"""Loops over 8 weight rows interleaved (ggml's x86 repack layout, DESIGN.md "Repacked rows (x8)"): repacked
matrices, and tiles of plain Q4_0, Q8_0 and Q5_0 rows repacked as a work item goes."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_AVX512, HAS_VNNI, quads, vpdpbusd
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    COLS,
    IR_F32,
    IR_I8,
    IR_I32,
    fma,
    in_blocks,
    load_vector,
    per_count,
    row_pointer,
    splat,
    weight_pointers,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import Q4_0, Q5_0, Q8_0
from pyggml.backends.cpu.repack import BLOCK32_FIELDS, X8_ROWS
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType


def _sums_u4_lanes(builder, acc, u, y4, vnni: bool):
    """acc + per lane i the sum of u[4i+k] * y4[4i+k], k < 4 (u unsigned): vpdpbusd with VNNI, else portable."""
    if vnni:
        return vpdpbusd(builder, acc, u, y4)
    wide = ir.VectorType(IR_I32, u.type.count)
    return builder.add(acc, quads(builder, builder.mul(builder.zext(u, wide), builder.sext(y4, wide), flags=["nsw"])))


def joined(builder, parts: list):
    """The vectors `parts` (one type) end to end: one group's lanes, or two groups' in one wider vector."""
    v = parts[0]
    for part in parts[1:]:
        n = v.type.count + part.type.count
        v = builder.shuffle_vector(v, part, ir.Constant(ir.VectorType(IR_I32, n), list(range(n))))
    return v


def group_halves(builder, pbs: list, at: int = 0):
    """The groups' 8 f16 values each at byte `at` of their blocks (pbs), joined, as floats."""
    parts = [load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, at)]), ir.HalfType(), X8_ROWS) for pb in pbs]
    return builder.fpext(joined(builder, parts), ir.VectorType(IR_F32, X8_ROWS * len(pbs)))


# groups of 8 rows a pass: two fill a 512-bit vector, as ggml's AVX512 repack kernels (each lane's arithmetic alike)
X8_GROUPS_A_PASS = 2 if HAS_AVX512 else 1


def _x8_intrinsic(group_loop, ncols: int, groups: int = X8_GROUPS_A_PASS):
    """The intrinsic of make_dot_x8's signature over `group_loop(builder, pgs, nb, cols)` (the dots of the
    consecutive groups at pgs with each src1 row of `cols`), `groups` groups a pass, then the one left over."""
    if groups not in (1, 2):
        raise ArgumentError(f"repacked loops: {groups} groups of {X8_ROWS} rows a pass, not 1 or 2")

    @intrinsic
    def dot_x8_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]
            w_data, offsets = weight_pointers(context, builder, signature, args)
            eight = ir.Constant(r.type, X8_ROWS)
            g0, g1 = builder.sdiv(args[3], eight), builder.sdiv(args[4], eight)

            def groups_of(count: int) -> None:
                rows = [builder.add(r, ir.Constant(r.type, c)) for c in range(count)]
                cols = [tuple(row_pointer(context, builder, ty[i], args[i], row)[0] for i in (6, 7, 8))
                        for row in rows]

                def run(g, n_groups: int) -> None:
                    m = builder.mul(g, eight)
                    pgs = [builder.gep(w_data, [builder.load(builder.gep(offsets, [builder.add(
                        m, ir.Constant(m.type, X8_ROWS * i))]))]) for i in range(n_groups)]
                    vf = ir.VectorType(IR_F32, X8_ROWS * n_groups)
                    for row, dots in zip(rows, group_loop(builder, pgs, args[5], cols), strict=True):
                        po = row_pointer(context, builder, ty[11], args[11], row, m)[0]
                        builder.store(dots, builder.bitcast(po, vf.as_pointer()), align=4)

                in_blocks(builder, g0, g1, groups, run)

            per_count(builder, args[10], ncols, groups_of)
            return context.get_dummy_value()

        return sig, codegen

    return dot_x8_cols


def _x8_q4_0_quants(builder, pb):
    """(unsigned vector, index of the 4 y values it multiplies) pairs of a repacked Q4_0 block, and offset -8."""
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
    """A Q5_0 block widened to Q8_0's repacked layout (value + 16, by _widen_q5_0): offset -16."""
    return [(load_vector(builder, builder.gep(pb, [ir.Constant(IR_I32, 16 + 32 * v)]), IR_I8, 32), v)
            for v in range(8)], -16


def make_dot_x8(vnni: bool, ncols: int, block_bytes: int, quants, groups: int = X8_GROUPS_A_PASS):
    """`dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)`: out[r + c, m] for c < n, m0 <= m < m1 (multiples of
    X8_ROWS), in ggml's x86 repack order; `quants(builder, pb)` reads a group's block of `block_bytes`."""

    def group_loop(builder, pgs, nb, cols):
        """The dots of the 8-row groups at byte pointers pgs with each src1 row of `cols`, lanes group by group."""
        lanes = X8_ROWS * len(pgs)
        vf, vb = ir.VectorType(IR_F32, lanes), ir.VectorType(IR_I8, 4 * lanes)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * lanes)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pbs = [builder.gep(pg, [builder.mul(b, ir.Constant(b.type, block_bytes))]) for pg in pgs]
            dw = group_halves(builder, pbs)
            per_group = [quants(builder, pb) for pb in pbs]
            offset = per_group[0][1]
            pairs = [(joined(builder, [q[0][i][0] for q in per_group]), at)
                     for i, (_, at) in enumerate(per_group[0][0])]
            for acc, (py, pd, ps) in zip(accs, cols, strict=True):
                y32 = builder.bitcast(builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), IR_I32.as_pointer())
                b2 = builder.shl(b, ir.Constant(b.type, 1))
                ysum = builder.add(builder.load(builder.gep(ps, [b2])),
                                   builder.load(builder.gep(ps, [builder.add(b2, ir.Constant(b.type, 1))])))
                isum = splat(builder, builder.mul(ysum, ir.Constant(IR_I32, offset)), lanes)
                for u, at in pairs:
                    y4 = builder.load(builder.gep(y32, [ir.Constant(b.type, at)]), align=1)
                    isum = _sums_u4_lanes(builder, isum, u, builder.bitcast(splat(builder, y4, lanes), vb), vnni)
                d = builder.fmul(dw, splat(builder, builder.load(builder.gep(pd, [b])), lanes))
                builder.store(fma(builder, builder.sitofp(isum, vf), d, builder.load(acc)), acc)
        return [builder.load(acc) for acc in accs]

    return _x8_intrinsic(group_loop, ncols, groups)


# the repacked 32-value block types: their group's block bytes and quants
X8_BLOCK_QUANTS = {int(t): (X8_ROWS * BLOCK32_FIELDS[t][1], quants) for t, quants in (
    (GGMLType.Q4_0, _x8_q4_0_quants), (GGMLType.Q8_0, _x8_q8_0_quants))}
X8_BLOCK_QUANTS[Q5_0] = (X8_BLOCK_QUANTS[Q8_0][0], _x8_q5_0_wide_quants)  # widened to Q8_0's blocks


def make_dot_q4_0_x8(vnni: bool, ncols: int, groups: int = X8_GROUPS_A_PASS):
    """The repacked Q4_0 loop (see make_dot_x8)."""
    return make_dot_x8(vnni, ncols, *X8_BLOCK_QUANTS[Q4_0], groups=groups)


dot_q4_0_x8_cols = make_dot_q4_0_x8(HAS_VNNI, COLS)
dot_q8_0_x8_cols = make_dot_x8(HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q8_0])
dot_q5_0_x8_cols = make_dot_x8(HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q5_0])




_Q4_0_BYTES, _Q8_0_BYTES = BLOCK32_FIELDS[GGMLType.Q4_0][1], BLOCK32_FIELDS[GGMLType.Q8_0][1]
# weight rows per tile: it stays in the caches while every column goes over it
TILE_ROWS = 64
TILE_TYPES = (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q5_0)


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
    """The Q5_0 block at byte o of w as its 32 values + 16, one row of a group in Q8_0's repacked layout at `at`."""
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
    """(tile, byte offset of each row's group): weight rows m0..m1 (a multiple of X8_ROWS) of Q4_0, Q8_0 or Q5_0
    in the repacked layout, Q5_0 widened to Q8_0's blocks."""
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


