"""The ternary, 1-bit, 2-bit and NVFP4 weight types (TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0): rows to float32 as ggml's
dequantize_row_<type>, and one weight row times one quantized src1 row as ggml's generic vec_dot (ggml-cpu/quants.c).

The integer sums are exact, so only the float steps follow C's order: per block for TQ1_0/TQ2_0, per Q8_0 block and
then per weight block for Q1_0/Q2_0, per 16-value sub-block for NVFP4. A weight value v - 1 (TQ1_0, TQ2_0, Q2_0) or
+-1 (Q1_0) times src1 is v * y minus y's sum, which src1's 16-value block sums give.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    IR_I8,
    IR_I16,
    _dot_u8_i8,
    dot_bits32,
    dot_mask32,
    load_f16,
    load_u32,
    load_vector,
    splat,
)
from pyggml.core.quants import _UE4M3, KVALUES_MXFP4

UE4M3 = _UE4M3  # ggml_ue4m3_to_fp32 of every byte
KVALUES_FP4 = KVALUES_MXFP4.astype(np.int64)
POW3 = np.array([1, 3, 9, 27, 81], np.int64)


def _make_dot_trits(n: int):
    @intrinsic
    def dot_trits(typingctx, w, i, p, y, j):
        sig = types.int32(w, types.intp, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            py = element_pointer(context, builder, signature.args[3], args[3], args[4])
            q = builder.mul(load_vector(builder, pw, IR_I8, n), splat(builder, builder.trunc(args[2], IR_I8), n))
            v16 = ir.VectorType(IR_I16, n)
            t = builder.lshr(builder.mul(builder.zext(q, v16), ir.Constant(v16, [3] * n)), ir.Constant(v16, [8] * n))
            return _dot_u8_i8(builder, builder.trunc(t, ir.VectorType(IR_I8, n)), load_vector(builder, py, IR_I8, n), n)

        return sig, codegen

    return dot_trits


dot_trits32 = _make_dot_trits(32)
_TRITS_DOC = "sum_t trit(w[i+t], p) * y[j+t], t < {}: TQ1_0's trit ((q * p mod 256) * 3) >> 8 of weight p = 3^k."
dot_trits32.__doc__ = _TRITS_DOC.format(32)
dot_trits16 = _make_dot_trits(16)
dot_trits16.__doc__ = _TRITS_DOC.format(16)


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
        j0 = yo + 256 * b
        s = 0
        for n in range(5):
            s += dot_trits32(w, ob, POW3[n], yq, j0 + 32 * n)
            s += dot_trits16(w, ob + 32, POW3[n], yq, j0 + 160 + 16 * n)
        for n in range(4):
            for j in range(4):
                s += trit(w[ob + 48 + j], POW3[n]) * np.int64(yq[r, 256 * b + 240 + 4 * n + j])
        s -= block_sum(yb, r, 16 * b, 16)
        sumf += np.float32(s) * (load_f16(w, ob + 52) * yd[r, b])
    return sumf


@njit(nogil=True, cache=True)
def dot_tq2_0(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 66 * b
        j0 = yo + 256 * b
        s = 0
        for h in range(2):
            for l in range(4):
                s += dot_bits32(w, ob + 32 * h, 2 * l, 3, yq, j0 + 128 * h + 32 * l)
        s -= block_sum(yb, r, 16 * b, 16)
        sumf += np.float32(s) * (yd[r, b] * load_f16(w, ob + 64))
    return sumf


@njit(nogil=True, cache=True)
def dot_nvfp4(w, o, nb, yq, yd, yb, r):
    sumf = np.float32(0.0)
    for b in range(nb):
        ob = o + 36 * b
        for s in range(4):
            d = UE4M3[w[ob + s]]
            dy = yd[r, 2 * b + (s >> 1)]
            j = 64 * b + 16 * s
            sumi = 0
            for t in range(8):
                q = np.int64(w[ob + 4 + 8 * s + t])
                sumi += np.int64(yq[r, j + t]) * KVALUES_FP4[q & 15] + np.int64(yq[r, j + 8 + t]) * KVALUES_FP4[q >> 4]
            sumf += dy * d * np.float32(sumi)
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
    for b in range(nb):
        ob = o + 18 * b
        sumi = np.float32(0.0)
        for k in range(2):
            yk = 2 * b + k
            j = 32 * yk
            s = 0
            for t in range(32):
                s += ((np.int64(w[ob + 2 + 8 * k + (t >> 2)]) >> (2 * (t & 3))) & 3) * np.int64(yq[r, j + t])
            s -= block_sum(yb, r, 2 * yk, 2)
            sumi += yd[r, yk] * np.float32(s)
        sumf += load_f16(w, ob) * sumi
    return sumf

