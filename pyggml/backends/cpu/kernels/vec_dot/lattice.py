"""The lattice IQ types on the CPU (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M): rows to float32 as
ggml's dequantize_row_*, and one weight row's dot with a Q8_K row as ggml-cpu's ggml_vec_dot_*_q8_K_generic (the
same integer sums and float32 operations in the same order).

The grids are numpy arrays of module scope (pyggml.core.iq_grids), which numba compiles in as constant data.
Block layouts: pyggml.core.quants_iq.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot import lattice_blocks as lb
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, IR_I16, load_f16
from pyggml.core.iq_grids import (
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KMASK_IQ2XS,
    KSIGNS_IQ2XS,
)

F32 = np.float32
IQ1_DELTA = F32(0.125)  # IQ1S_DELTA, IQ1M_DELTA
# per 7-bit sign index i (IQ2_XXS, IQ2_XS, IQ3_XXS), the 8 bytes 0xff (negate) or 0 (keep) of ksigns_iq2xs[i]'s bits
# (IQ2_S's and IQ3_S's raw sign bytes are expanded in IR: their vec_dot takes the table and ignores it)
SIGN_MASKS7 = np.where(KSIGNS_IQ2XS[:, None] & KMASK_IQ2XS, 0xFF, 0).astype(np.uint8)
def _make_load(bits: int):
    """An intrinsic `load(w, i)`: the little-endian unsigned `bits`-bit value at byte `i` of uint8 array `w`, as an
    int64 (no index checks: the kernels' offsets are in range)."""

    @intrinsic
    def load(typingctx, w, i):
        sig = types.int64(w, types.intp)

        def codegen(context, builder, signature, args):
            p = element_pointer(context, builder, signature.args[0], args[0], args[1])
            v = builder.load(builder.bitcast(p, ir.IntType(bits).as_pointer()), align=1)
            return builder.zext(v, ir.IntType(64))

        return sig, codegen

    return load


byte_at = _make_load(8)
byte_at.__doc__ = "The byte at offset `i` of uint8 array `w`, as an int64."
u16_at = _make_load(16)
u16_at.__doc__ = "The little-endian uint16 at byte offset `i` of uint8 array `w`, as an int64."
u32_at = _make_load(32)
u32_at.__doc__ = "The little-endian uint32 at byte offset `i` of uint8 array `w`, as an int64."


@intrinsic
def f16_to_f32(typingctx, bits):
    """The IEEE half whose bits are the low 16 of `bits`, as float32 (exact)."""
    sig = types.float32(types.int64)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(builder.trunc(args[0], IR_I16), ir.HalfType()), IR_F32)

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def sign_of(signs, j):
    """ggml's `signs & kmask_iq2xs[j] ? -1 : 1`."""
    return -1 if (signs >> j) & 1 else 1


# --- groups of 8 weights ---


@njit(nogil=True, cache=True, inline="always")
def deq_group(out, i, k, db, grid, g, signs):
    """out[i, k:k+8] = db * grid[g][j] * sign j (ggml's order: the product, then the sign)."""
    for j in range(8):
        out[i, k + j] = (db * F32(grid[g, j])) * F32(sign_of(signs, j))


@njit(nogil=True, cache=True, inline="always")
def deq_group3(out, i, k, db, grid, g1, g2, signs):
    """As deq_group for IQ3's two points of 4 coordinates."""
    for j in range(4):
        out[i, k + j] = (db * F32(grid[g1, j])) * F32(sign_of(signs, j))
        out[i, k + 4 + j] = (db * F32(grid[g2, j])) * F32(sign_of(signs, j + 4))


@njit(nogil=True, cache=True, inline="always")
def deq_group1(out, i, k, dl, g, delta):
    """out[i, k:k+8] = dl * (iq1s_grid[g][j] + delta)."""
    for j in range(8):
        out[i, k + j] = dl * (F32(IQ1S_GRID[g, j]) + delta)


def _scaled_block_dot(name: str, block_bytes: int, block_dot, grid: np.ndarray, masks: np.ndarray, factor):
    """The vec_dot of a type whose blocks are one fp16 d and an integer sum (`block_dot`): ggml's
    `sumf += d * y.d * bsum` per block, then `factor * sumf` (1/8 of IQ2's, 1/4 of IQ3_XXS's, 1 for IQ3_S)."""

    def dot(w, o, nb, yq, yd, yb, r):
        sumf = F32(0)
        yo = r * yq.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            sumf += (load_f16(w, ob) * yd[r, b]) * F32(block_dot(grid, masks, w, ob, yq, yo + 256 * b))
        return factor * sumf

    dot.__name__ = dot.__qualname__ = name
    return njit(nogil=True, cache=True)(dot)


# --- IQ2_XXS: d, qs u16[32]; per sub-block 4 grid bytes and a u32 of 4 x 7 sign bits and a 4-bit scale ---


@njit(nogil=True, cache=True)
def dequantize_row_iq2_xxs(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 66 * b
        d = load_f16(w, ob)
        for ib in range(8):
            aux = u32_at(w, ob + 2 + 8 * ib + 4)
            db = (d * (F32(0.5) + F32(aux >> 28))) * F32(0.25)
            for l in range(4):
                deq_group(out, i, 256 * b + 32 * ib + 8 * l, db, IQ2XXS_GRID, w[ob + 2 + 8 * ib + l],
                          KSIGNS_IQ2XS[(aux >> (7 * l)) & 127])


dot_iq2_xxs = _scaled_block_dot("dot_iq2_xxs", 66, lb.dot_block_iq2_xxs, IQ2XXS_GRID, SIGN_MASKS7, F32(0.125))


# --- IQ2_XS: d, qs u16[32] (9-bit grid index, 7-bit sign index), scales u8[8] ---


@njit(nogil=True, cache=True)
def dequantize_row_iq2_xs(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 74 * b
        d = load_f16(w, ob)
        for ib in range(8):
            sc = byte_at(w, ob + 66 + ib)
            for l in range(4):
                q = u16_at(w, ob + 2 + 8 * ib + 2 * l)
                db = (d * (F32(0.5) + F32((sc >> (4 * (l // 2))) & 15))) * F32(0.25)
                deq_group(out, i, 256 * b + 32 * ib + 8 * l, db, IQ2XS_GRID, q & 511, KSIGNS_IQ2XS[q >> 9])


dot_iq2_xs = _scaled_block_dot("dot_iq2_xs", 74, lb.dot_block_iq2_xs, IQ2XS_GRID, SIGN_MASKS7, F32(0.125))


# --- IQ3_XXS: d, qs u8[64] (grid indices, 4 weights each), then a u32 per sub-block as IQ2_XXS's ---


@njit(nogil=True, cache=True)
def dequantize_row_iq3_xxs(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 98 * b
        d = load_f16(w, ob)
        for ib in range(8):
            aux = u32_at(w, ob + 66 + 4 * ib)
            db = (d * (F32(0.5) + F32(aux >> 28))) * F32(0.5)
            q = ob + 2 + 8 * ib
            for l in range(4):
                deq_group3(out, i, 256 * b + 32 * ib + 8 * l, db, IQ3XXS_GRID, w[q + 2 * l], w[q + 2 * l + 1],
                           KSIGNS_IQ2XS[(aux >> (7 * l)) & 127])


dot_iq3_xxs = _scaled_block_dot("dot_iq3_xxs", 98, lb.dot_block_iq3_xxs, IQ3XXS_GRID, SIGN_MASKS7, F32(0.25))


# --- IQ1_S: d, qs u8[32], qh u16[8] (3 index bits per group, a 3-bit scale, the shift's sign) ---


@njit(nogil=True, cache=True)
def dequantize_row_iq1_s(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 50 * b
        d = load_f16(w, ob)
        for ib in range(8):
            qh = u16_at(w, ob + 34 + 2 * ib)
            dl = d * F32(2 * ((qh >> 12) & 7) + 1)
            delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
            for l in range(4):
                deq_group1(out, i, 256 * b + 32 * ib + 8 * l, dl,
                           byte_at(w, ob + 2 + 4 * ib + l) | (((qh >> (3 * l)) & 7) << 8), delta)


@njit(nogil=True, cache=True)
def dot_iq1_s(w, o, nb, yq, yd, yb, r):
    sumf = F32(0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 50 * b
        sumi, sumi1 = lb.dot_block_iq1_s(IQ1S_GRID, IQ1S_GRID, w, ob, yq, yo + 256 * b)
        sumf += (load_f16(w, ob) * yd[r, b]) * (F32(sumi) + IQ1_DELTA * F32(sumi1))
    return sumf


# --- IQ3_S: d, qs u8[64], qh u8[8] (the 9th index bit), signs u8[32], scales u8[4] (a nibble per sub-block) ---


@njit(nogil=True, cache=True)
def dequantize_row_iq3_s(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 110 * b
        d = load_f16(w, ob)
        for ib in range(8):
            db = d * F32(1 + 2 * ((byte_at(w, ob + 106 + ib // 2) >> (4 * (ib % 2))) & 15))
            qh = byte_at(w, ob + 66 + ib)
            q = ob + 2 + 8 * ib
            for l in range(4):
                deq_group3(out, i, 256 * b + 32 * ib + 8 * l, db, IQ3S_GRID,
                           byte_at(w, q + 2 * l) | ((qh << (8 - 2 * l)) & 256),
                           byte_at(w, q + 2 * l + 1) | ((qh << (7 - 2 * l)) & 256), w[ob + 74 + 4 * ib + l])


dot_iq3_s = _scaled_block_dot("dot_iq3_s", 110, lb.dot_block_iq3_s, IQ3S_GRID, SIGN_MASKS7, F32(1.0))


# --- IQ2_S: d, qs u8[64] (grid bytes, then sign bytes), qh u8[8] (2 index bits per group), scales u8[8] ---


@njit(nogil=True, cache=True)
def dequantize_row_iq2_s(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 82 * b
        d = load_f16(w, ob)
        for ib in range(8):
            sc = byte_at(w, ob + 74 + ib)
            qh = byte_at(w, ob + 66 + ib)
            for l in range(4):
                db = (d * (F32(0.5) + F32((sc >> (4 * (l // 2))) & 15))) * F32(0.25)
                deq_group(out, i, 256 * b + 32 * ib + 8 * l, db, IQ2S_GRID,
                          byte_at(w, ob + 2 + 4 * ib + l) | ((qh << (8 - 2 * l)) & 0x300), w[ob + 34 + 4 * ib + l])


dot_iq2_s = _scaled_block_dot("dot_iq2_s", 82, lb.dot_block_iq2_s, IQ2S_GRID, SIGN_MASKS7, F32(0.125))


# --- IQ1_M: qs u8[32], qh u8[16] (a nibble per group: 3 index bits, the shift's sign), scales u16[4] ---


@njit(nogil=True, cache=True, inline="always")
def iq1_m_scale(w, ob):
    """The fp16 d of an IQ1_M block at byte ob: the top nibbles of its four u16 scales."""
    s0, s1, s2, s3 = u16_at(w, ob + 48), u16_at(w, ob + 50), u16_at(w, ob + 52), u16_at(w, ob + 54)
    bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)
    return f16_to_f32(bits)


@njit(nogil=True, cache=True, inline="always")
def iq1_m_group(w, ob, ib, l):
    """Group l of sub-block ib of the IQ1_M block at ob: its iq1s_grid index and its qh nibble."""
    nib = (byte_at(w, ob + 32 + 2 * ib + l // 2) >> (4 * (l % 2))) & 15
    return byte_at(w, ob + 4 * ib + l) | ((nib & 7) << 8), nib


@njit(nogil=True, cache=True, inline="always")
def iq1_m_sub_scale(w, ob, ib, h):
    """The 3-bit scale of groups 2h, 2h + 1 of sub-block ib, as 2s + 1."""
    return 2 * ((u16_at(w, ob + 48 + 2 * (ib // 2)) >> (6 * (ib % 2) + 3 * h)) & 7) + 1


@njit(nogil=True, cache=True)
def dequantize_row_iq1_m(w, o, nb, out, i):
    for b in range(nb):
        ob = o + 56 * b
        d = iq1_m_scale(w, ob)
        for ib in range(8):
            for l in range(4):
                dl = d * F32(iq1_m_sub_scale(w, ob, ib, l // 2))
                g, nib = iq1_m_group(w, ob, ib, l)
                deq_group1(out, i, 256 * b + 32 * ib + 8 * l, dl, g, -IQ1_DELTA if nib & 8 else IQ1_DELTA)


@njit(nogil=True, cache=True)
def dot_iq1_m(w, o, nb, yq, yd, yb, r):
    sumf = F32(0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 56 * b
        sumi1, sumi2 = lb.dot_block_iq1_m(IQ1S_GRID, IQ1S_GRID, w, ob, yq, yo + 256 * b)
        sumf += (iq1_m_scale(w, ob) * yd[r, b]) * (F32(sumi1) + IQ1_DELTA * F32(sumi2))
    return sumf
