"""The scalar vec_dot of the weight types without a row loop (Q5_1, Q2_K, Q3_K, Q5_K, IQ4_XS): one weight row times
one quantized src1 row, as ggml's reference C.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.block_sums import q4_0_nibbles, target_block_sums
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    IR_I8,
    dot_mask32,
    dot_nibbles,
    load_f16,
    load_u32,
    load_vector,
    reduce_add_i32,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import IQ4_XS, KVALUES
from pyggml.backends.cpu.kernels.vec_dot.table_lookup import lookup16

# --- vec_dot per weight type: one weight row (at byte o of w) times src1 row r ---


@njit(nogil=True, cache=True)

def i8(v: int) -> int:
    """A byte read as int8."""
    return v - 256 if v > 127 else v


@njit(nogil=True, cache=True)
def dot_q5_1(w, o, nb, yq, yd, ys, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 24 * b
        j = yo + 32 * b
        sumi = dot_nibbles(w, ob + 8, yq, j) + 16 * dot_mask32(load_u32(w, ob + 4), yq, j)
        sumf += (load_f16(w, ob) * yd[r, b]) * np.float32(sumi) + load_f16(w, ob + 2) * ys[r, b]
    return sumf


@njit(nogil=True, cache=True)
def q3_K_scale(w, os, sub):
    """The 6-bit scale `sub` (0..15) of a Q3_K block whose scales start at byte os, minus 32."""
    low = (np.int64(w[os + (sub & 7)]) >> (4 * (sub >> 3))) & 15  # sub < 8: low nibble of byte sub, else high
    high = (np.int64(w[os + 8 + (sub & 3)]) >> (2 * (sub >> 2))) & 3
    return (low | (high << 4)) - 32


@njit(nogil=True, cache=True)
def scale_min_k4(w, os, j):
    """ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7), scales starting at byte os."""
    if j < 4:
        return np.int64(w[os + j]) & 63, np.int64(w[os + j + 4]) & 63
    sc = (np.int64(w[os + j + 4]) & 15) | ((np.int64(w[os + j - 4]) >> 6) << 4)
    mn = (np.int64(w[os + j + 4]) >> 4) | ((np.int64(w[os + j]) >> 6) << 4)
    return sc, mn


@njit(nogil=True, cache=True)
def iq4_xs_scale(w, ob, ib):
    """The 6-bit scale of sub-block ib (0..7) of the IQ4_XS block at byte ob, minus 32."""
    low = (np.int64(w[ob + 4 + (ib >> 1)]) >> (4 * (ib & 1))) & 15
    high = ((np.int64(w[ob + 2]) | (np.int64(w[ob + 3]) << 8)) >> (2 * ib)) & 3
    return (low | (high << 4)) - 32


@njit(nogil=True, cache=True)
def dot_iq4_xs(w, o, nb, yq, yd, yb, r):
    # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32 (ggml_vec_dot_iq4_xs_q8_K)
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 136 * b
        d4d8 = load_f16(w, ob) * yd[r, b]
        for ib in range(8):
            sumi = dot_iq4_32(w, ob + 8 + 16 * ib, yq, yo + 256 * b + 32 * ib)
            sumf += (d4d8 * np.float32(iq4_xs_scale(w, ob, ib))) * np.float32(sumi)
    return sumf




@intrinsic
def dot_iq4_32(typingctx, w, i, yq, j):
    """sum_t kvalues_iq4nl[nibble t of the 16 bytes at w[i]] * yq[j+t], t < 32 (exact int32): an IQ4_XS
    sub-block."""
    sig = types.int32(w, types.intp, yq, types.intp)

    def codegen(context, builder, signature, args):
        pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
        py = element_pointer(context, builder, signature.args[2], args[2], args[3])
        wv = lookup16(builder, KVALUES[IQ4_XS], q4_0_nibbles(builder, pw))
        return reduce_add_i32(builder, target_block_sums(builder, wv, load_vector(builder, py, IR_I8, 32)), 8)

    return sig, codegen

