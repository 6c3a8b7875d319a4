"""The lattice IQ types on the CPU (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M): rows to float32 as
ggml's dequantize_row_*, and one weight row's dot with a Q8_K row as ggml-cpu's ggml_vec_dot_*_q8_K_generic (the
same integer sums and float32 operations in the same order). A block's work is vector IR (lattice_blocks); here are
the rows, the per-block float32 scales and the tables.

The grids are numpy arrays of module scope (pyggml.core.iq_grids), which numba compiles in as constant data.
Block layouts: pyggml.core.quants_iq.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.vec_dot import lattice_blocks as lb
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, IR_I16, load_f16, load_u16
from pyggml.core import iq_grids as g

F32 = np.float32
IQ1_DELTA = F32(0.125)  # IQ1S_DELTA, IQ1M_DELTA
# per 7-bit sign index i (IQ2_XXS, IQ2_XS, IQ3_XXS), the 8 bytes 0xff (negate) or 0 (keep) of ksigns_iq2xs[i]'s bits
# (IQ1's, IQ2_S's and IQ3_S's sign bytes are expanded in IR: their kernels take the table and ignore it)
SIGN_MASKS7 = np.where(g.KSIGNS_IQ2XS[:, None] & g.KMASK_IQ2XS, 0xFF, 0).astype(np.uint8)


@intrinsic
def f16_to_f32(typingctx, bits):
    """The IEEE half whose bits are the low 16 of `bits`, as float32 (exact)."""
    sig = types.float32(types.int64)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(builder.trunc(args[0], IR_I16), ir.HalfType()), IR_F32)

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def fp16_d(w, ob):
    """The fp16 d at the start of a block (every lattice type but IQ1_M)."""
    return load_f16(w, ob)


@njit(nogil=True, cache=True, inline="always")
def iq1_m_d(w, ob):
    """IQ1_M's d: the fp16 made of the top nibbles of its four u16 scales (ggml's iq1m_scale_t)."""
    s0, s1 = np.int64(load_u16(w, ob + 48)), np.int64(load_u16(w, ob + 50))
    s2, s3 = np.int64(load_u16(w, ob + 52)), np.int64(load_u16(w, ob + 54))
    return f16_to_f32((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000))


def _rows_to_float(name: str, block_bytes: int, block_to_float: Callable, grid: np.ndarray, d_of: Callable):
    """dequantize_row of a lattice type: out[i] = the row at byte o of w, block by block."""

    def to_float(w, o, nb, out, i):
        oo = i * out.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            block_to_float(grid, SIGN_MASKS7, w, ob, d_of(w, ob), out, oo + 256 * b)

    to_float.__name__ = to_float.__qualname__ = name
    return njit(nogil=True, cache=True)(to_float)


def _scaled_block_dot(name: str, block_bytes: int, block_dot: Callable, grid: np.ndarray, factor: np.float32):
    """The vec_dot of a type whose blocks are one fp16 d and an integer sum (`block_dot`): ggml's
    `sumf += d * y.d * bsum` per block, then `factor * sumf` (1/8 of IQ2's, 1/4 of IQ3_XXS's, 1 for IQ3_S)."""

    def dot(w, o, nb, yq, yd, yb, r):
        sumf = F32(0)
        yo = r * yq.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            sumf += (load_f16(w, ob) * yd[r, b]) * F32(block_dot(grid, SIGN_MASKS7, w, ob, yq, yo + 256 * b))
        return factor * sumf

    dot.__name__ = dot.__qualname__ = name
    return njit(nogil=True, cache=True)(dot)


def _shifted_block_dot(name: str, block_bytes: int, block_dot: Callable, d_of: Callable):
    """The vec_dot of IQ1_S and IQ1_M: ggml's `sumf += d * y.d * (sumi + 0.125 * sumi_shifts)` per block."""

    def dot(w, o, nb, yq, yd, yb, r):
        sumf = F32(0)
        yo = r * yq.shape[1]
        for b in range(nb):
            ob = o + block_bytes * b
            sumi, shifts = block_dot(g.IQ1S_GRID, SIGN_MASKS7, w, ob, yq, yo + 256 * b)
            sumf += (d_of(w, ob) * yd[r, b]) * (F32(sumi) + IQ1_DELTA * F32(shifts))
        return sumf

    dot.__name__ = dot.__qualname__ = name
    return njit(nogil=True, cache=True)(dot)


# IQ2_XXS: d, qs u16[32]; per sub-block 4 grid bytes and a u32 of 4 x 7 sign bits and a 4-bit scale
dequantize_row_iq2_xxs = _rows_to_float("dequantize_row_iq2_xxs", 66, lb.to_float_iq2_xxs, g.IQ2XXS_GRID, fp16_d)
dot_iq2_xxs = _scaled_block_dot("dot_iq2_xxs", 66, lb.dot_block_iq2_xxs, g.IQ2XXS_GRID, F32(0.125))
# IQ2_XS: d, qs u16[32] (9-bit grid index, 7-bit sign index), scales u8[8]
dequantize_row_iq2_xs = _rows_to_float("dequantize_row_iq2_xs", 74, lb.to_float_iq2_xs, g.IQ2XS_GRID, fp16_d)
dot_iq2_xs = _scaled_block_dot("dot_iq2_xs", 74, lb.dot_block_iq2_xs, g.IQ2XS_GRID, F32(0.125))
# IQ3_XXS: d, qs u8[64] (grid indices, 4 weights each), then a u32 per sub-block as IQ2_XXS's
dequantize_row_iq3_xxs = _rows_to_float("dequantize_row_iq3_xxs", 98, lb.to_float_iq3_xxs, g.IQ3XXS_GRID, fp16_d)
dot_iq3_xxs = _scaled_block_dot("dot_iq3_xxs", 98, lb.dot_block_iq3_xxs, g.IQ3XXS_GRID, F32(0.25))
# IQ1_S: d, qs u8[32], qh u16[8] (3 index bits per group, a 3-bit scale, the shift's sign)
dequantize_row_iq1_s = _rows_to_float("dequantize_row_iq1_s", 50, lb.to_float_iq1_s, g.IQ1S_GRID, fp16_d)
dot_iq1_s = _shifted_block_dot("dot_iq1_s", 50, lb.dot_block_iq1_s, fp16_d)
# IQ3_S: d, qs u8[64], qh u8[8] (the 9th index bit), signs u8[32], scales u8[4] (a nibble per sub-block)
dequantize_row_iq3_s = _rows_to_float("dequantize_row_iq3_s", 110, lb.to_float_iq3_s, g.IQ3S_GRID, fp16_d)
dot_iq3_s = _scaled_block_dot("dot_iq3_s", 110, lb.dot_block_iq3_s, g.IQ3S_GRID, F32(1.0))
# IQ2_S: d, qs u8[64] (grid bytes, then sign bytes), qh u8[8] (2 index bits per group), scales u8[8]
dequantize_row_iq2_s = _rows_to_float("dequantize_row_iq2_s", 82, lb.to_float_iq2_s, g.IQ2S_GRID, fp16_d)
dot_iq2_s = _scaled_block_dot("dot_iq2_s", 82, lb.dot_block_iq2_s, g.IQ2S_GRID, F32(0.125))
# IQ1_M: qs u8[32], qh u8[16] (a nibble per group: 3 index bits, the shift's sign), scales u16[4] (and d's bits)
dequantize_row_iq1_m = _rows_to_float("dequantize_row_iq1_m", 56, lb.to_float_iq1_m, g.IQ1S_GRID, iq1_m_d)
dot_iq1_m = _shifted_block_dot("dot_iq1_m", 56, lb.dot_block_iq1_m, iq1_m_d)
