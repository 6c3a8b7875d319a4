"""The 16-value table lookup of IQ4_NL, IQ4_XS and MXFP4: one vpshufb on AVX2, compare-and-select elsewhere."""

from __future__ import annotations

from llvmlite import ir

from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_AVX2, q4_0_nibbles
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_I8


def lookup16_avx2(builder, table: list[int], idx):
    """table[idx] for a <32 x i8> of indices 0..15: one vpshufb (the table in both 128-bit lanes)."""
    v32i8 = ir.VectorType(IR_I8, 32)
    pshufb = builder.module.declare_intrinsic("llvm.x86.avx2.pshuf.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    return builder.call(pshufb, [ir.Constant(v32i8, [v & 0xFF for v in table] * 2), idx])


def lookup16_portable(builder, table: list[int], idx):
    """table[idx] for a <32 x i8> of indices 0..15: a compare and select per table entry."""
    v32i8 = ir.VectorType(IR_I8, 32)
    out = ir.Constant(v32i8, [table[0] & 0xFF] * 32)
    for k in range(1, 16):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(v32i8, [k] * 32))
        out = builder.select(hit, ir.Constant(v32i8, [table[k] & 0xFF] * 32), out)
    return out


lookup16 = lookup16_avx2 if HAS_AVX2 else lookup16_portable


def table_values(table: list[int]):
    """A `values` reader for make_dot_q_row: the table values of the 32 nibbles at p."""
    def values(builder, p):
        return lookup16(builder, table, q4_0_nibbles(builder, p))

    return values

