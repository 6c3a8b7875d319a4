"""The ternary, 1-bit, 2-bit and NVFP4 weight types (TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0): rows to float32 as ggml's
dequantize_row_<type>, and one weight row times one quantized src1 row as ggml's generic vec_dot (ggml-cpu/quants.c).

The integer sums are exact, so only the float steps follow C's order: per block for TQ1_0/TQ2_0, per Q8_0 block and
then per weight block for Q1_0/Q2_0, per 16-value sub-block for NVFP4. A weight value v - 1 (TQ1_0, TQ2_0, Q2_0) or
+-1 (Q1_0) times src1 is v * y minus y's sum, which src1's 16-value block sums give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot.block_sums import (
    HAS_AVX2,
    block_sums_quads,
    q4_0_nibbles,
    target_block_sums,
    target_block_sums_unsigned,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    IR_I8,
    IR_I16,
    IR_I32,
    dot_mask32,
    load_f16,
    load_u32,
    load_vector,
    reduce_add_i32,
    shuffle,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import KVALUES, MXFP4
from pyggml.backends.cpu.kernels.vec_dot.table_lookup import lookup16
from pyggml.core.quants import _UE4M3, KVALUES_MXFP4

UE4M3 = _UE4M3  # ggml_ue4m3_to_fp32 of every byte
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


class LowBitDots(NamedTuple):
    """The exact block sums of the low-bit vec_dots (intrinsics)."""

    tq1_0: Any
    tq2_0: Any
    q2_0_32: Any
    fp4_pair: Any


def make_low_bit_dots(sums_unsigned: Callable, sums_quads: Callable, lookup: Callable) -> LowBitDots:
    """The block sums with these block-sum generators (unsigned values; signed with lane k holding products
    4k .. 4k + 3) and 16-value table lookup: the target's, or any variant the host runs (tests force each)."""

    @intrinsic
    def dot_tq1_0_trits(typingctx, w, i, y, j):
        """sum_t trit_t * y[j+t] over the 256 weights of the TQ1_0 block at w[i] (trits 0..2, exact int32)."""
        sig = types.int32(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            def at(arr: int, pos: int, off: int, n: int):
                p = element_pointer(context, builder, signature.args[arr], args[arr],
                                    builder.add(args[pos], ir.Constant(args[pos].type, off)))
                return load_vector(builder, p, IR_I8, n)

            qs32, qs16, qh = (_powers(builder, at(0, 1, off, n), 5) for off, n in ((0, 32), (32, 16), (48, 4)))
            # lane 4k + j: qh[j] * 3^k
            qh16 = _concat(builder, _concat(builder, qh[0], qh[1]), _concat(builder, qh[2], qh[3]))
            # the bytes of src1 values 32k .. 32k + 31
            parts = [*qs32, _concat(builder, qs16[0], qs16[1]), _concat(builder, qs16[2], qs16[3]),
                     _concat(builder, qs16[4], qh16)]
            acc = None
            for k, q in enumerate(parts):
                part = sums_unsigned(builder, _trits(builder, q), at(2, 3, 32 * k, 32))
                acc = part if acc is None else builder.add(acc, part)
            return reduce_add_i32(builder, acc, 8)

        return sig, codegen

    @intrinsic
    def dot_tq2_0_fields(typingctx, w, i, y, j):
        """sum_t q_t * y[j+t] over the 256 weights of the TQ2_0 block at w[i] (2-bit fields 0..3, exact int32)."""
        sig = types.int32(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            v8 = ir.VectorType(IR_I8, 32)
            acc = None
            for h in range(2):
                pw = element_pointer(context, builder, signature.args[0], args[0],
                                     builder.add(args[1], ir.Constant(args[1].type, 32 * h)))
                q = load_vector(builder, pw, IR_I8, 32)
                for l in range(4):
                    fields = builder.and_(builder.lshr(q, ir.Constant(v8, [2 * l] * 32)), ir.Constant(v8, [3] * 32))
                    py = element_pointer(context, builder, signature.args[2], args[2],
                                         builder.add(args[3], ir.Constant(args[3].type, 128 * h + 32 * l)))
                    part = sums_unsigned(builder, fields, load_vector(builder, py, IR_I8, 32))
                    acc = part if acc is None else builder.add(acc, part)
            return reduce_add_i32(builder, acc, 8)

        return sig, codegen

    @intrinsic
    def dot_q2_0_32(typingctx, w, i, y, j):
        """sum_t ((w[i + t/4] >> 2(t%4)) & 3) * y[j+t], t < 32: half a Q2_0 block times a Q8_0 block (exact)."""
        sig = types.int32(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            v16 = ir.VectorType(IR_I16, 32)
            q = load_vector(builder, element_pointer(context, builder, signature.args[0], args[0], args[1]), IR_I8, 8)
            wide = builder.zext(shuffle(builder, q, [t >> 2 for t in range(32)]), v16)
            # field k of a byte is bits 6..7 of the byte times 2^(6 - 2k): a multiply, not a per-lane shift
            up = builder.mul(wide, ir.Constant(v16, [1 << (6 - 2 * (t & 3)) for t in range(32)]))
            fields = builder.and_(builder.lshr(up, ir.Constant(v16, [6] * 32)), ir.Constant(v16, [3] * 32))
            py = element_pointer(context, builder, signature.args[2], args[2], args[3])
            fields = builder.trunc(fields, ir.VectorType(IR_I8, 32))
            sums = sums_unsigned(builder, fields, load_vector(builder, py, IR_I8, 32))
            return reduce_add_i32(builder, sums, 8)

        return sig, codegen

    @intrinsic
    def dot_fp4_pair(typingctx, w, i, y, j):
        """Two NVFP4 sub-blocks (16 bytes at w[i]) times y[j : j+32]: (sum of the first 16 products, of the last 16),
        each sub-block's values kvalues_fp4 of its 8 bytes' low nibbles, then of their high nibbles."""
        sig = types.UniTuple(types.int32, 2)(w, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            nib = q4_0_nibbles(builder, element_pointer(context, builder, signature.args[0], args[0], args[1]))
            nib = shuffle(builder, nib, [*range(8), *range(16, 24), *range(8, 16), *range(24, 32)])
            vals = lookup(builder, KVALUES[MXFP4], nib)
            py = element_pointer(context, builder, signature.args[2], args[2], args[3])
            sums = sums_quads(builder, vals, load_vector(builder, py, IR_I8, 32))  # lane k: products 4k .. 4k + 3
            lo = reduce_add_i32(builder, shuffle(builder, sums, list(range(4))), 4)
            hi = reduce_add_i32(builder, shuffle(builder, sums, list(range(4, 8))), 4)
            return context.make_tuple(builder, signature.return_type, [lo, hi])

        return sig, codegen

    return LowBitDots(dot_tq1_0_trits, dot_tq2_0_fields, dot_q2_0_32, dot_fp4_pair)


# the target's: AVX2's (or VNNI's) sums have the quads layout, the portable signed sums need it asked for
TARGET_DOTS = make_low_bit_dots(target_block_sums_unsigned, target_block_sums if HAS_AVX2 else block_sums_quads,
                                lookup16)
dot_tq1_0_trits, dot_tq2_0_fields, dot_q2_0_32, dot_fp4_pair = TARGET_DOTS


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
def dequantize_row_q1_0(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 18 * b
        d = load_f16(w, ob)
        for j in range(128):
            out[i, 128 * b + j] = d if (np.int64(w[ob + 2 + (j >> 3)]) >> (j & 7)) & 1 else -d


@njit(nogil=True, cache=True)
def dequantize_row_q2_0(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 18 * b
        d = load_f16(w, ob)
        for j in range(64):
            q = (np.int64(w[ob + 2 + (j >> 2)]) >> (2 * (j & 3))) & 3
            out[i, 64 * b + j] = np.float32(q - 1) * d


# --- vec_dot per weight type: one weight row (at byte o of w) times src1 row r (ggml's generic order) ---


@njit(nogil=True, cache=True)
def dot_tq1_0(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 54 * b
        s = dot_tq1_0_trits(w, ob, yq, yo + 256 * b) - block_sum(yb, r, 16 * b, 16)
        sumf += np.float32(s) * (load_f16(w, ob + 52) * yd[r, b])
    return sumf


@njit(nogil=True, cache=True)
def dot_tq2_0(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 66 * b
        s = dot_tq2_0_fields(w, ob, yq, yo + 256 * b) - block_sum(yb, r, 16 * b, 16)
        sumf += np.float32(s) * (yd[r, b] * load_f16(w, ob + 64))
    return sumf


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


@njit(nogil=True, cache=True)
def dot_q1_0(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 18 * b
        sumi = np.float32(0.0)
        for k in range(4):
            yk = 4 * b + k
            s = 2 * dot_mask32(load_u32(w, ob + 2 + 4 * k), yq, yo + 32 * yk) - block_sum(yb, r, 2 * yk, 2)
            sumi += yd[r, yk] * np.float32(s)
        sumf += load_f16(w, ob) * sumi
    return sumf


@njit(nogil=True, cache=True)
def dot_q2_0(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 18 * b
        sumi = np.float32(0.0)
        for k in range(2):
            yk = 2 * b + k
            s = dot_q2_0_32(w, ob + 2 + 8 * k, yq, yo + 32 * yk) - block_sum(yb, r, 2 * yk, 2)
            sumi += yd[r, yk] * np.float32(s)
        sumf += load_f16(w, ob) * sumi
    return sumf

