"""The ternary, 1-bit, 2-bit and NVFP4 weight types (TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0): rows to float32 as ggml's
dequantize_row_<type>, and one weight row times one quantized src1 row, as ggml's generic vec_dot (ggml-cpu/quants.c,
numerics "ref") and as its AVX2 vec_dot (arch/x86/quants.c, numerics "x86"; Q2_0 has none, its generic one serves).

The integer sums are exact, so only the float steps follow C's order: the generic rows per block (TQ1_0, TQ2_0), per
Q8_0 block then per weight block (Q1_0, Q2_0), per 16-value sub-block (NVFP4); the AVX2 rows in 8 float lanes, one
per 4 consecutive values of each 32, with ggml's FMAs, added at the end as hsum_float_8. A TQ value v - 1 times src1
is v * y minus y's sum, which src1's 16-value block sums give (AVX2's lanes subtract them in pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot.block_sums import (
    HAS_AVX2,
    block_sums_quads,
    block_sums_unsigned_quads,
    q4_0_nibbles,
    target_block_sums,
    target_block_sums_unsigned,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    IR_F32,
    IR_I8,
    IR_I16,
    IR_I32,
    fma,
    fma_f32,
    load_f16,
    load_vector,
    pair_sums,
    reduce_add_i32,
    row_pointer,
    shuffle,
    splat,
    sum_f32_tree,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import KVALUES, MXFP4
from pyggml.backends.cpu.kernels.vec_dot.table_lookup import lookup16
from pyggml.core.quants import KVALUES_MXFP4, UE4M3

KVALUES_FP4 = KVALUES_MXFP4.astype(np.int64)
POW3 = np.array([1, 3, 9, 27, 81], np.int64)


def _times3(builder, q):
    """q * 3 in each byte lane, wrapping as uint8_t (two adds: x86 has no byte multiply)."""
    return builder.add(builder.add(q, q), q)


def _trits(builder, q):
    """TQ1_0's trit ((q * 3) >> 8, 0..2) of each byte lane of q: 3q reaches 256 from q = 86 and 512 from q = 171."""
    v8 = q.type
    n = v8.count
    one = builder.zext(builder.icmp_unsigned(">=", q, ir.Constant(v8, [86] * n)), v8)
    two = builder.zext(builder.icmp_unsigned(">=", q, ir.Constant(v8, [171] * n)), v8)
    return builder.add(one, two)


def _powers(builder, q, n: int) -> list:
    """q * 3^k for k < n, each wrapping as uint8_t: the bytes TQ1_0 reads its k-th trits from."""
    out = [q]
    for _ in range(n - 1):
        out.append(_times3(builder, out[-1]))
    return out


def _concat(builder, a, b):
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(IR_I32, 2 * n), list(range(2 * n))))


def _load_at(builder, p, off: int, elem: ir.Type, n: int):
    """<n x elem> at element `off` of pointer p."""
    return load_vector(builder, builder.gep(p, [ir.Constant(ir.IntType(64), off)]), elem, n)


def _f16_at(builder, p, off: int):
    """The IEEE half at byte `off` of byte pointer p, as float."""
    h = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(ir.IntType(64), off)]), IR_I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(h, ir.HalfType()), IR_F32)


def _tq1_0_lanes(builder, sums, pw, py):
    """8 lanes of trit * y sums over the TQ1_0 block at byte pointer pw and its 256 src1 values at py (`sums`'s
    layout: lane k of the quads layout holds the products whose index mod 32 is 4k .. 4k + 3)."""
    qs32, qs16, qh = (_powers(builder, _load_at(builder, pw, off, IR_I8, n), 5) for off, n in ((0, 32), (32, 16),
                                                                                                (48, 4)))
    # lane 4k + j: qh[j] * 3^k
    qh16 = _concat(builder, _concat(builder, qh[0], qh[1]), _concat(builder, qh[2], qh[3]))
    # the bytes of src1 values 32k .. 32k + 31
    parts = [*qs32, _concat(builder, qs16[0], qs16[1]), _concat(builder, qs16[2], qs16[3]),
             _concat(builder, qs16[4], qh16)]
    acc = None
    for k, q in enumerate(parts):
        part = sums(builder, _trits(builder, q), _load_at(builder, py, 32 * k, IR_I8, 32))
        acc = part if acc is None else builder.add(acc, part)
    return acc


def _tq2_0_lanes(builder, sums, pw, py):
    """As _tq1_0_lanes for TQ2_0's 2-bit fields (0..3)."""
    v8 = ir.VectorType(IR_I8, 32)
    acc = None
    for h in range(2):
        q = _load_at(builder, pw, 32 * h, IR_I8, 32)
        for l in range(4):
            fields = builder.and_(builder.lshr(q, ir.Constant(v8, [2 * l] * 32)), ir.Constant(v8, [3] * 32))
            part = sums(builder, fields, _load_at(builder, py, 128 * h + 32 * l, IR_I8, 32))
            acc = part if acc is None else builder.add(acc, part)
    return acc


def _fp4_pair_lanes(builder, sums, lookup, pw, py):
    """Two NVFP4 sub-blocks (16 bytes at pw) times the 32 src1 values at py: 8 lanes, the first 4 the sums of
    the first sub-block (its values kvalues_fp4 of its 8 bytes' low nibbles, then their high nibbles)."""
    nib = shuffle(builder, q4_0_nibbles(builder, pw), [*range(8), *range(16, 24), *range(8, 16), *range(24, 32)])
    return sums(builder, lookup(builder, KVALUES[MXFP4], nib), load_vector(builder, py, IR_I8, 32))


def _q1_0_lanes(builder, sums, pw, py):
    """Q1_0's 32 signs (the bits of the 4 bytes at pw, low first; set: +1, clear: -1) times the 32 src1 values at
    py: 8 lanes (`sums`' layout), each byte's bits spread over 8 lanes and tested as ggml's AVX2 code does."""
    v8 = ir.VectorType(IR_I8, 32)
    spread = shuffle(builder, load_vector(builder, pw, IR_I8, 4), [t >> 3 for t in range(32)])
    on = builder.icmp_unsigned("!=", builder.and_(spread, ir.Constant(v8, [1 << (t & 7) for t in range(32)])),
                               ir.Constant(v8, [0] * 32))
    signs = builder.select(on, ir.Constant(v8, [1] * 32), ir.Constant(v8, [0xFF] * 32))
    return sums(builder, signs, load_vector(builder, py, IR_I8, 32))


def _q2_0_lanes(builder, sums, pw, py):
    """Q2_0's values (2-bit field - 1; field k of byte t/4 for lane t) of the 8 bytes at pw times the 32 src1 values
    at py: 8 lanes (`sums`' layout)."""
    v16 = ir.VectorType(IR_I16, 32)
    wide = builder.zext(shuffle(builder, load_vector(builder, pw, IR_I8, 8), [t >> 2 for t in range(32)]), v16)
    # field k of a byte is bits 6..7 of the byte times 2^(6 - 2k): a multiply, not a per-lane shift
    up = builder.mul(wide, ir.Constant(v16, [1 << (6 - 2 * (t & 3)) for t in range(32)]))
    fields = builder.and_(builder.lshr(up, ir.Constant(v16, [6] * 32)), ir.Constant(v16, [3] * 32))
    values = builder.trunc(builder.sub(fields, ir.Constant(v16, [1] * 32)), ir.VectorType(IR_I8, 32))
    return sums(builder, values, load_vector(builder, py, IR_I8, 32))


def _block_intrinsic(lanes_of):
    """An intrinsic f(w, i, y, j) -> int32: the sum of the lanes `lanes_of(builder, pw, py)` of w[i:], y[j:]."""

    @intrinsic
    def block_sum_of(typingctx, w, i, y, j):
        sig = types.int32(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            py = element_pointer(context, builder, signature.args[2], args[2], args[3])
            return reduce_add_i32(builder, lanes_of(builder, pw, py), 8)

        return sig, codegen

    return block_sum_of


def _x86_row(block_bytes: int, block):
    """An intrinsic dot(w, o, nb, yq, yd, yb, r) -> float32 in the order of ggml's AVX2 vec_dots: 8 float lanes
    `block(builder, pw, py, pd, pb, b, acc)` updates for each block b (pointers: the block's bytes, src1 row r's
    values, scales and 16-value sums), added at the end as hsum_float_8 does."""

    @intrinsic
    def dot(typingctx, w, o, nb, yq, yd, yb, r):
        sig = types.float32(w, types.intp, types.intp, yq, yd, yb, types.intp)

        def codegen(context, builder, signature, args):
            tw, _, _, tyq, tyd, tyb, _ = signature.args
            w_arr, o, nb, yq_arr, yd_arr, yb_arr, r = args
            v8f = ir.VectorType(IR_F32, 8)
            acc = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
            pw0 = element_pointer(context, builder, tw, w_arr, o)
            py, pd, pb = (row_pointer(context, builder, t, a, r)[0]
                          for t, a in ((tyq, yq_arr), (tyd, yd_arr), (tyb, yb_arr)))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                pw = builder.gep(pw0, [builder.mul(b, ir.Constant(b.type, block_bytes))])
                builder.store(block(builder, pw, py, pd, pb, b, builder.load(acc)), acc)
            return sum_f32_tree(builder, builder.load(acc), 8)

        return sig, codegen

    return dot


def _at(builder, p, b, per_block: int, off: int = 0):
    """Pointer p advanced to element per_block * b + off."""
    return builder.gep(p, [builder.add(builder.mul(b, ir.Constant(b.type, per_block)), ir.Constant(b.type, off))])


def _ternary_x86_block(lanes_of, d_off: int):
    """ggml's AVX2 TQ1_0/TQ2_0 block: lanes minus src1's 16-value sums in pairs, times y.d * x.d into the lanes."""

    def block(builder, pw, py, pd, pb, b, acc):
        lanes = lanes_of(builder, pw, _at(builder, py, b, 256))
        lanes = builder.sub(lanes, pair_sums(builder, load_vector(builder, _at(builder, pb, b, 16), IR_I32, 16)))
        d = builder.fmul(builder.load(_at(builder, pd, b, 1)), _f16_at(builder, pw, d_off))
        return fma(builder, builder.sitofp(lanes, acc.type), splat(builder, d, 8), acc)

    return block


def _q1_0_x86_block(sums):
    """ggml's AVX2 Q1_0 block: its 4 Q8_0 blocks' lanes by their scales (a product, then 3 FMAs), by d."""

    def block(builder, pw, py, pd, pb, b, acc):
        part = None
        for k in range(4):
            pk = builder.gep(pw, [ir.Constant(ir.IntType(64), 2 + 4 * k)])
            lanes = builder.sitofp(_q1_0_lanes(builder, sums, pk, _at(builder, py, b, 128, 32 * k)), acc.type)
            dy = splat(builder, builder.load(_at(builder, pd, b, 4, k)), 8)
            part = builder.fmul(dy, lanes) if part is None else fma(builder, dy, lanes, part)
        return fma(builder, splat(builder, _f16_at(builder, pw, 0), 8), part, acc)

    return block


def _ue4m3(builder, byte):
    """ggml_ue4m3_to_fp32 of an i8 value, from a constant table."""
    table = cgutils.global_constant(builder, "ue4m3", ir.Constant(ir.ArrayType(IR_F32, 256), [float(v) for v in UE4M3]))
    return builder.load(builder.gep(table, [ir.Constant(IR_I32, 0), builder.zext(byte, IR_I32)]))


def _nvfp4_x86_block(sums, lookup):
    """ggml's AVX2 NVFP4 block: each pair of sub-blocks' lanes by their scales ue4m3(d[s]) * y.d (4 lanes each)."""

    def block(builder, pw, py, pd, pb, b, acc):
        for p in range(2):
            lanes = _fp4_pair_lanes(builder, sums, lookup, builder.gep(pw, [ir.Constant(ir.IntType(64), 4 + 16 * p)]),
                                    _at(builder, py, b, 64, 32 * p))
            dy = builder.load(_at(builder, pd, b, 2, p))
            s = [builder.fmul(_ue4m3(builder, builder.load(builder.gep(pw, [ir.Constant(ir.IntType(64), 2 * p + h)]))),
                              dy) for h in range(2)]
            scales = builder.shuffle_vector(splat(builder, s[0], 4), splat(builder, s[1], 4),
                                            ir.Constant(ir.VectorType(IR_I32, 8), list(range(8))))
            acc = fma(builder, scales, builder.sitofp(lanes, acc.type), acc)
        return acc

    return block


class LowBitDots(NamedTuple):
    """The low-bit types' exact block sums (intrinsics f(w, i, y, j)) and their rows in ggml's AVX2 order
    (intrinsics dot(w, o, nb, yq, yd, yb, r), the type table's x86 dots)."""

    tq1_0: Any
    tq2_0: Any
    q1_0_32: Any
    q2_0_32: Any
    fp4_pair: Any
    tq1_0_x86: Any
    tq2_0_x86: Any
    q1_0_x86: Any
    nvfp4_x86: Any


def make_low_bit_dots(sums_unsigned: Callable, sums_signed: Callable, lookup: Callable) -> LowBitDots:
    """The low-bit dots with these block-sum generators (unsigned and signed values, both with lane k holding
    products 4k .. 4k + 3) and 16-value table lookup: the target's, or any variant the host runs (tests force
    each)."""

    @intrinsic
    def dot_fp4_pair(typingctx, w, i, y, j):
        """Two NVFP4 sub-blocks (16 bytes at w[i]) times y[j : j+32]: (sum of the first 16 products, of the last
        16)."""
        sig = types.UniTuple(types.int32, 2)(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            py = element_pointer(context, builder, signature.args[2], args[2], args[3])
            lanes = _fp4_pair_lanes(builder, sums_signed, lookup, pw, py)
            lo = reduce_add_i32(builder, shuffle(builder, lanes, list(range(4))), 4)
            hi = reduce_add_i32(builder, shuffle(builder, lanes, list(range(4, 8))), 4)
            return context.make_tuple(builder, signature.return_type, [lo, hi])

        return sig, codegen

    def tq1(builder, pw, py):
        return _tq1_0_lanes(builder, sums_unsigned, pw, py)

    def tq2(builder, pw, py):
        return _tq2_0_lanes(builder, sums_unsigned, pw, py)

    def q1(builder, pw, py):
        return _q1_0_lanes(builder, sums_signed, pw, py)

    def q2(builder, pw, py):
        return _q2_0_lanes(builder, sums_signed, pw, py)

    tq1_sum, tq2_sum, q1_sum, q2_sum = (_block_intrinsic(f) for f in (tq1, tq2, q1, q2))
    q1_sum.__doc__ = "sum_t (bit t of w[i:i+4] ? y[j+t] : -y[j+t]), t < 32: a quarter Q1_0 block (exact)."
    q2_sum.__doc__ = "sum_t (((w[i + t/4] >> 2(t%4)) & 3) - 1) * y[j+t], t < 32: half a Q2_0 block (exact)."
    tq1_sum.__doc__ = "sum_t trit_t * y[j+t] over the 256 weights of the TQ1_0 block at w[i] (trits 0..2, exact)."
    tq2_sum.__doc__ = "sum_t q_t * y[j+t] over the 256 weights of the TQ2_0 block at w[i] (fields 0..3, exact)."
    return LowBitDots(tq1_sum, tq2_sum, q1_sum, q2_sum, dot_fp4_pair,
                      _x86_row(54, _ternary_x86_block(tq1, 52)), _x86_row(66, _ternary_x86_block(tq2, 64)),
                      _x86_row(18, _q1_0_x86_block(sums_signed)), _x86_row(36, _nvfp4_x86_block(sums_signed, lookup)))


# the target's sums with lane k holding products 4k .. 4k + 3: AVX2's and VNNI's have that layout
TARGET_DOTS = (make_low_bit_dots(target_block_sums_unsigned, target_block_sums, lookup16) if HAS_AVX2 else
               make_low_bit_dots(block_sums_unsigned_quads, block_sums_quads, lookup16))
dot_tq1_0_trits, dot_tq2_0_fields, dot_q1_0_signs, dot_q2_0_values, dot_fp4_pair = TARGET_DOTS[:5]
dot_tq1_0_x86, dot_tq2_0_x86, dot_q1_0_x86, dot_nvfp4_x86 = TARGET_DOTS[5:]


@njit(nogil=True, cache=True, inline="always")
def trit(q, p):
    """TQ1_0's trit (0, 1, 2) of byte q read with weight p = 3^k: ((q * p mod 256) * 3) >> 8."""
    return (((np.int64(q) * p) & 255) * 3) >> 8


@njit(nogil=True, cache=True, inline="always")
def block_sum(yb, r, g0, n):
    """The sum of src1 values g0 * 16 .. (g0 + n) * 16 of row r, from its 16-value block sums."""
    s = 0
    for g in range(g0, g0 + n):
        s += yb[r, g]
    return s


# --- weight rows -> float32 (ggml's dequantize_row_<type>, same arithmetic) ---


@njit(nogil=True, cache=True)
def dequantize_row_tq1_0(w, o, nb, out, i):
    # weight 32n + m is trit n of qs[m], 160 + 16n + m of qs[32 + m], 240 + 4n + j of qh[j]
    for b in range(nb):
        ob = o + 54 * b
        d = load_f16(w, ob + 52)
        y = 256 * b
        for n in range(5):
            for m in range(32):
                out[i, y + 32 * n + m] = np.float32(trit(w[ob + m], POW3[n]) - 1) * d
            for m in range(16):
                out[i, y + 160 + 16 * n + m] = np.float32(trit(w[ob + 32 + m], POW3[n]) - 1) * d
        for n in range(4):
            for j in range(4):
                out[i, y + 240 + 4 * n + j] = np.float32(trit(w[ob + 48 + j], POW3[n]) - 1) * d


@njit(nogil=True, cache=True)
def dequantize_row_tq2_0(w, o, nb, out, i):
    # weight 128h + 32l + m is bits 2l of qs[32h + m]
    for b in range(nb):
        ob = o + 66 * b
        d = load_f16(w, ob + 64)
        for h in range(2):
            for l in range(4):
                y = 256 * b + 128 * h + 32 * l
                for m in range(32):
                    out[i, y + m] = np.float32(((np.int64(w[ob + 32 * h + m]) >> (2 * l)) & 3) - 1) * d


@njit(nogil=True, cache=True)
def dequantize_row_nvfp4(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 36 * b
        for s in range(4):
            d = UE4M3[w[ob + s]]
            y = 64 * b + 16 * s
            for j in range(8):
                q = np.int64(w[ob + 4 + 8 * s + j])
                out[i, y + j] = np.float32(KVALUES_FP4[q & 15]) * d
                out[i, y + 8 + j] = np.float32(KVALUES_FP4[q >> 4]) * d


@njit(nogil=True, cache=True)
def dequantize_row_q12_0(w, o, nb, out, i, bits):
    """Q1_0 (`bits` 1: 128 weights a block, d where bit j % 8 of qs[j / 8] is set, else -d) and Q2_0 (`bits` 2: 64
    weights, (field j % 4 of qs[j / 4] - 1) * d), both f16 d and 16 bytes of qs."""
    n, per, mask = 128 // bits, 8 // bits, (1 << bits) - 1
    for b in range(nb):
        ob = o + 18 * b
        d = load_f16(w, ob)
        for j in range(n):
            q = (np.int64(w[ob + 2 + j // per]) >> (bits * (j % per))) & mask
            out[i, n * b + j] = np.float32(q - 1) * d if bits == 2 else (d if q else -d)


# --- vec_dot per weight type: one weight row (at byte o of w) times src1 row r (ggml's generic order) ---


def _named(fn, name: str):
    """fn compiled as `name` (numba caches each generated dot under its own name)."""
    fn.__name__ = fn.__qualname__ = name
    return njit(nogil=True, cache=True)(fn)


def _make_dot_ternary(block_bytes: int, d_off: int, block_sum_of, name: str):
    """ggml's generic TQ1_0/TQ2_0 vec_dot: per block, (the values' sum with src1, minus src1's sum) * (d_x * d_y)."""

    def dot(w, o, nb, yq, yd, yb, r):
        sumf = np.float32(0.0)
        yo = r * yq.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            s = block_sum_of(w, ob, yq, yo + 256 * b) - block_sum(yb, r, 16 * b, 16)
            sumf += np.float32(s) * (load_f16(w, ob + d_off) * yd[r, b])
        return sumf

    return _named(dot, name)


def _make_dot_per_q8_0(block_bytes: int, parts: int, part_bytes: int, part_sum, name: str, fused: bool = False):
    """ggml's generic Q1_0/Q2_0 vec_dot: a block spans `parts` Q8_0 blocks of src1; each part's exact sum times its
    d_y goes into the block's float sum, which d_x multiplies. `fused`: both multiply-adds rounded once, as gcc
    contracts them (numerics.FMA_CHAINS)."""

    def dot(w, o, nb, yq, yd, yb, r):
        sumf = np.float32(0.0)
        yo = r * yq.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            sumi = np.float32(0.0)
            for k in range(parts):
                yk = parts * b + k
                part = np.float32(part_sum(w, ob + 2 + part_bytes * k, yq, yo + 32 * yk))
                sumi = fma_f32(yd[r, yk], part, sumi) if fused else sumi + yd[r, yk] * part
            sumf = fma_f32(load_f16(w, ob), sumi, sumf) if fused else sumf + load_f16(w, ob) * sumi
        return sumf

    return _named(dot, name)


dot_tq1_0 = _make_dot_ternary(54, 52, dot_tq1_0_trits, "dot_tq1_0")
dot_tq2_0 = _make_dot_ternary(66, 64, dot_tq2_0_fields, "dot_tq2_0")
dot_q1_0 = _make_dot_per_q8_0(18, 4, 4, dot_q1_0_signs, "dot_q1_0")
dot_q2_0 = _make_dot_per_q8_0(18, 2, 8, dot_q2_0_values, "dot_q2_0")
dot_q2_0_fused = _make_dot_per_q8_0(18, 2, 8, dot_q2_0_values, "dot_q2_0_fused", fused=True)


@njit(nogil=True, cache=True)
def dot_nvfp4(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 36 * b
        for p in range(2):  # sub-blocks 2p and 2p + 1 share src1's Q8_0 block 2b + p
            dy = yd[r, 2 * b + p]
            s0, s1 = dot_fp4_pair(w, ob + 4 + 16 * p, yq, yo + 64 * b + 32 * p)
            sumf += dy * UE4M3[w[ob + 2 * p]] * np.float32(s0)
            sumf += dy * UE4M3[w[ob + 2 * p + 1]] * np.float32(s1)
    return sumf
