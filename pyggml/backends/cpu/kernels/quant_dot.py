"""Numba kernels behind MUL_MAT: ggml's vec_dot for quantized, F16 and BF16 weights.

ggml multiplies a weight row by a src1 row with `vec_dot` of the weight type,
after converting src1 to the type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, F16,
BF16). This module does the same:

- `quantize_rows` converts src1 rows exactly as ggml does, Q8_0/Q8_1 by the
  path its `rounding` argument names (the CPU backend's `numerics`, see
  `pyggml.backends.cpu.numerics`): ROUND_X86, ggml's AVX2
  `quantize_row_q8_0/q8_1` (each value times 127/amax, rounded half to even),
  or ROUND_REF, its reference `quantize_row_q8_0/q8_1_ref` (each value times
  1/d, `roundf` = half away from zero); both in float32 arithmetic with the
  scales rounded to f16. Q8_K as `quantize_row_q8_K_ref` (`nearest_int` =
  half to even, scale -127/max), which ggml's x86 code matches. The
  blocks are kept split: values `yq` (int8), scales `yd` (float32; Q8_0's and
  Q8_1's already rounded through f16), Q8_1's `s = f16(sum * d)` in `ys`, and
  integer sums of every 16 values in `yb` (Q8_K's `bsums`; for Q8_0/Q8_1 the
  same sums, which let offsets such as Q4_0's `-8` be applied once per block).
- `mul_mat_rows` (several threads, see `threads.py`; one weight type
  compiled at a time, see `_make_mul_mat_job`) computes
  `out[col, row] = vec_dot(weight row, src1 col)`, reading the weights in their compact form; for the `COLS_KINDS`
  (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K, IQ4_NL, MXFP4, F16, BF16) a weight block is loaded
  and unpacked once for up to `COLS` src1 columns, each with its own
  accumulators (the `*_cols` loops: the same bits per column as one column
  at a time). Each block's integer dot
  product is exact, as in ggml's scalar code, and is scaled by the block's
  f16/f32 scales as ggml's reference `ggml_vec_dot_<type>_q8_<x>` does; only
  the float summation order may differ (Q8_0, Q4_0, Q4_1, F16 and BF16 rows
  keep 8 or 32 lane sums to the row's end, as ggml's AVX2 code keeps a vector
  accumulator; Q5_0's, Q4_K's and Q6_K's sum one scalar, block after block,
  as ggml's reference C). Under ROUND_X86 the Q8_0, Q4_0, Q5_0, Q4_1, Q4_K and Q6_K
  rows follow ggml's AVX2 `ggml_vec_dot_q8_0_q8_0`/`_q4_0_q8_0`/`_q5_0_q8_0`/
  `_q4_1_q8_1`/`_q4_K_q8_K`/`_q6_K_q8_K` float for float (lanes of 4
  consecutive products, one FMA accumulator, `hsum_float_8`, Q4_1's `summs`
  by scalar FMAs and Q4_K's mins in 4 lanes, added last): with the same
  quants, the same bits.
- `rows_to_f32` dequantizes (or widens, for F16/BF16) weight rows into
  float32, row by row, for the BLAS path of `matmul.py`.

Why intrinsics: numba leaves LLVM's SLP vectorizer off and its loop
vectorizer does nothing useful on 16- or 32-element loops, so a block's dot
product written as a Python loop runs scalar. The few
primitives below (`dot_nibbles`, `dot_bits16/32`, `dot_fields16/32`,
`dot_mask32`, and the whole-row loops `dot_q8_0_cols`, `dot_q4_0_cols`,
`dot_f16_cols`, `dot_bf16_cols`, ...) are written in portable LLVM vector IR (no
target intrinsics): fixed-size loads, unpack, exact integer multiply-add,
and a reduction. On AVX2 (checked with numba's inspect_asm) the integer
products become vpmovsxbw + vpmaddwd and the f16 loads vcvtph2ps. The row
loops' block sums use the target's byte multiply-adds by name: AVX2's
vpmaddubsw + vpmaddwd, or AVX512-VNNI's vpdpbusd where the target has it
(`_choose_block_sums`; the generators take the choice as an argument, so the
tests run every variant the host can).
Everything else is plain numba.

IQ4_NL, IQ4_XS and MXFP4 quants index a table of 16 int8 values
(kvalues_iq4nl, kvalues_mxfp4): the lookup is one vpshufb on AVX2, a
compare-and-select chain elsewhere, and the looked-up values then go through
the same exact integer block sums.

Integer identities used (all exact): a field `(byte >> shift) & mask` times
y summed over a block; a weight value with an offset, e.g. Q4_0's
`nibble - 8`, as `sum(nibble * y) - 8 * sum(y)`; Q5's fifth bit as
`16 * sum(bit * y)`; Q6_K's value `(low4 | high2 << 4) - 32` as
`sum(low4 * y) + 16 * sum(high2 * y) - 32 * sum(y)`.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.jit import compiled_address
from pyggml.backends.cpu.kernels.atomics import (
    address,
    atomic_add,
    atomic_load,
    pointer_f32,
    pointer_i8,
    pointer_i32,
    pointer_i64,
    pointer_u8,
    sleep_us,
    spin_pause,
    yield_cpu,
)
from pyggml.backends.cpu.kernels.atomics import (
    element_pointer as _address,
)
from pyggml.backends.cpu.kernels.threads import (
    SLOT_LEN,
    WAIT_SLEEP_US,
    YIELD_POLLS,
    call_job,
    claim,
    finish,
    revoke,
)
from pyggml.backends.cpu.repack import BLOCK32_FIELDS, X8_ROWS
from pyggml.core.quants import KVALUES_IQ4NL, KVALUES_MXFP4
from pyggml.core.types import GGMLType

# kinds: the GGMLType numbers (module-level ints are compile-time constants in numba)
F32 = int(GGMLType.F32)
F16 = int(GGMLType.F16)
BF16 = int(GGMLType.BF16)
Q4_0 = int(GGMLType.Q4_0)
Q4_1 = int(GGMLType.Q4_1)
Q5_0 = int(GGMLType.Q5_0)
Q5_1 = int(GGMLType.Q5_1)
Q8_0 = int(GGMLType.Q8_0)
Q8_1 = int(GGMLType.Q8_1)
Q2_K = int(GGMLType.Q2_K)
Q3_K = int(GGMLType.Q3_K)
Q4_K = int(GGMLType.Q4_K)
Q5_K = int(GGMLType.Q5_K)
Q6_K = int(GGMLType.Q6_K)
Q8_K = int(GGMLType.Q8_K)
IQ4_NL = int(GGMLType.IQ4_NL)
IQ4_XS = int(GGMLType.IQ4_XS)
MXFP4 = int(GGMLType.MXFP4)

# the 16 values a 4-bit quant of these types indexes (ggml-common.h's kvalues_iq4nl, kvalues_mxfp4)
_TABLES: dict[int, list[int]] = {IQ4_NL: [int(v) for v in KVALUES_IQ4NL], MXFP4: [int(v) for v in KVALUES_MXFP4]}
_TABLES[IQ4_XS] = _TABLES[IQ4_NL]

# --- LLVM vector primitives ---
#
# Arrays are passed whole with an element offset, so no array views are made in
# the hot loops. Byte offsets address uint8 weight rows; src1 offsets count
# int8 (or float32) elements.

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _load_vector(builder, ptr, elem: ir.Type, n: int):
    return builder.load(builder.bitcast(ptr, ir.VectorType(elem, n).as_pointer()), align=1)


def _splat(builder, value, n: int):
    vty = ir.VectorType(value.type, n)
    undef = ir.Constant(vty, None)
    one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _reduce_add_i32(builder, v, n: int):
    """Exact sum of an <n x i32> vector."""
    fnty = ir.FunctionType(_I32, [ir.VectorType(_I32, n)])
    fn = builder.module.declare_intrinsic(f"llvm.vector.reduce.add.v{n}i32", fnty=fnty)
    return builder.call(fn, [v])


def _sum_f32_tree(builder, v, n: int):
    """Sum of an <n x float> vector by halving (a fixed order: lanes i and i + n/2 first)."""
    while n > 1:
        h = n // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h, n))))
        v = builder.fadd(lo, hi)
        n = h
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _dot_u8_i8(builder, u, y, n: int):
    """Exact integer dot of an <n x i8> vector read unsigned (0..255) and one read signed.

    Written as i32 products of zero- and sign-extended bytes, the form LLVM
    turns into vpdpbusd / pmaddwd (multiply and add groups), not 32-bit multiplies.
    """
    v32 = ir.VectorType(_I32, n)
    prod = builder.mul(builder.zext(u, v32), builder.sext(y, v32), flags=["nsw"])
    return _reduce_add_i32(builder, prod, n)


@intrinsic
def load_f16(typingctx, w, i):
    """The IEEE half at byte offset `i` of uint8 array `w`, as float32 (exact)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        p = _address(context, builder, signature.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, _I16.as_pointer()), align=1)
        return builder.fpext(builder.bitcast(h, ir.HalfType()), _F32)

    return sig, codegen


@intrinsic
def load_bf16(typingctx, w, i):
    """The bfloat16 at byte offset `i` of uint8 array `w`, as float32 (exact: the bits are the top half)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        p = _address(context, builder, signature.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, _I16.as_pointer()), align=1)
        u = builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16))
        return builder.bitcast(u, _F32)

    return sig, codegen


@intrinsic
def load_u32(typingctx, w, i):
    """The little-endian uint32 at byte offset `i` of uint8 array `w` (Q5's `qh`)."""
    sig = types.uint32(w, types.intp)

    def codegen(context, builder, signature, args):
        p = _address(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, _I32.as_pointer()), align=1)

    return sig, codegen


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest f16 (ties to even, as GGML_FP32_TO_FP16) -> float32."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """float32 -> the bits of the nearest f16 (ties to even; the CPU's conversion, as ggml's F16C
    GGML_FP32_TO_FP16), as uint16."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), _I16)

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c for float32 scalars, rounded once (llvm.fma: the FMA instruction, or libm's exact fmaf)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return _fma(builder, *args)

    return sig, codegen


@intrinsic
def dot_nibbles(typingctx, w, i, y, j):
    """sum_t (w[i+t] & 15) * y[j+t] + (w[i+t] >> 4) * y[j+16+t], t < 16: the Q4/Q5 block layout."""
    sig = types.int32(w, types.intp, y, types.intp)

    def codegen(context, builder, signature, args):
        pw = _address(context, builder, signature.args[0], args[0], args[1])
        py = _address(context, builder, signature.args[2], args[2], args[3])
        q = _load_vector(builder, pw, _I8, 16)
        lo = builder.and_(q, ir.Constant(ir.VectorType(_I8, 16), [15] * 16))
        hi = builder.lshr(q, ir.Constant(ir.VectorType(_I8, 16), [4] * 16))
        both = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        return _dot_u8_i8(builder, both, _load_vector(builder, py, _I8, 32), 32)

    return sig, codegen


def _make_dot_bits(n: int):
    @intrinsic
    def dot_bits(typingctx, w, i, shift, mask, y, j):
        sig = types.int32(w, types.intp, types.intp, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            pw = _address(context, builder, signature.args[0], args[0], args[1])
            py = _address(context, builder, signature.args[4], args[4], args[5])
            q = _load_vector(builder, pw, _I8, n)
            s = _splat(builder, builder.trunc(args[2], _I8), n)
            m = _splat(builder, builder.trunc(args[3], _I8), n)
            field = builder.and_(builder.lshr(q, s), m)
            return _dot_u8_i8(builder, field, _load_vector(builder, py, _I8, n), n)

        return sig, codegen

    return dot_bits


dot_bits16 = _make_dot_bits(16)
dot_bits16.__doc__ = "sum_t ((w[i+t] >> shift) & mask) * y[j+t], t < 16 (exact int32)."
dot_bits32 = _make_dot_bits(32)
dot_bits32.__doc__ = "sum_t ((w[i+t] >> shift) & mask) * y[j+t], t < 32 (exact int32)."


def _make_dot_fields(n: int):
    @intrinsic
    def dot_fields(typingctx, w, i1, s1, m1, i2, s2, m2, mul2, y, j):
        ip = types.intp
        sig = types.int32(w, ip, ip, ip, ip, ip, ip, ip, y, ip)

        def codegen(context, builder, signature, args):
            def field(pos: int) -> ir.Value:
                p = _address(context, builder, signature.args[0], args[0], args[pos])
                q = _load_vector(builder, p, _I8, n)
                s = _splat(builder, builder.trunc(args[pos + 1], _I8), n)
                return builder.and_(builder.lshr(q, s), _splat(builder, builder.trunc(args[pos + 2], _I8), n))

            # the combined value fits a byte (at most 63 in the K-quants), read unsigned
            v = builder.add(field(1), builder.mul(field(4), _splat(builder, builder.trunc(args[7], _I8), n)))
            py = _address(context, builder, signature.args[8], args[8], args[9])
            return _dot_u8_i8(builder, v, _load_vector(builder, py, _I8, n), n)

        return sig, codegen

    return dot_fields


_DOT_FIELDS_DOC = "sum_t (((w[i1+t] >> s1) & m1) + ((w[i2+t] >> s2) & m2) * mul2) * y[j+t], t < {} (value < 256)."
dot_fields16 = _make_dot_fields(16)
dot_fields16.__doc__ = _DOT_FIELDS_DOC.format(16)
dot_fields32 = _make_dot_fields(32)
dot_fields32.__doc__ = _DOT_FIELDS_DOC.format(32)


@intrinsic
def dot_mask32(typingctx, bits, y, j):
    """sum_t ((bits >> t) & 1) * y[j+t], t < 32: Q5_0/Q5_1's fifth bits."""
    sig = types.int32(types.uint32, y, types.intp)

    def codegen(context, builder, signature, args):
        py = _address(context, builder, signature.args[1], args[1], args[2])
        v32 = ir.VectorType(_I32, 32)
        b = builder.lshr(_splat(builder, args[0], 32), ir.Constant(v32, list(range(32))))
        b = builder.and_(b, ir.Constant(v32, [1] * 32))
        yv = builder.sext(_load_vector(builder, py, _I8, 32), v32)
        return _reduce_add_i32(builder, builder.mul(b, yv), 32)

    return sig, codegen


def _widen_halves(builder, h, kind: int):
    """<32 x i16> f16 or bf16 bits -> <32 x float> (exact)."""
    if kind == F16:
        return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 32)), ir.VectorType(_F32, 32))
    v32 = ir.VectorType(_I32, 32)
    u = builder.shl(builder.zext(h, v32), ir.Constant(v32, [16] * 32))
    return builder.bitcast(u, ir.VectorType(_F32, 32))


def _make_widen_half(kind: int):
    @intrinsic
    def widen_half(typingctx, w, i, out, j):
        sig = types.void(w, types.intp, out, types.intp)

        def codegen(context, builder, signature, args):
            pw = _address(context, builder, signature.args[0], args[0], args[1])
            po = _address(context, builder, signature.args[2], args[2], args[3])
            wf = _widen_halves(builder, _load_vector(builder, pw, _I16, 32), kind)
            builder.store(wf, builder.bitcast(po, ir.VectorType(_F32, 32).as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return widen_half


widen_f16x32 = _make_widen_half(F16)
widen_f16x32.__doc__ = "out[j+t] = f16(w at byte i+2t), t < 32."
widen_bf16x32 = _make_widen_half(BF16)
widen_bf16x32.__doc__ = "out[j+t] = bf16(w at byte i+2t), t < 32."


# --- whole rows: one vector accumulator per row, reduced once at its end ---
#
# The per-block primitives above reduce every block to a scalar, a chain of
# shuffles per 32 values that costs more than the block's arithmetic. The row
# loops below keep the lanes' sums in a vector for the whole row (AVX2: a
# vpmaddwd per 16 int8 pairs, a vfmadd per 8 floats) and sum the lanes once.
# Integer block sums stay exact; only the float summation order changes.


def _fmuladd(builder, a, b, c):
    """a * b + c, fused where the CPU has FMA (llvm.fmuladd)."""
    fnty = ir.FunctionType(a.type, [a.type, a.type, a.type])
    n = a.type.count
    fn = builder.module.declare_intrinsic(f"llvm.fmuladd.v{n}f32", fnty=fnty)
    return builder.call(fn, [a, b, c])


def _shuffle(builder, v, idx: list[int]):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _pair_sums(builder, v):
    """v[2k] + v[2k + 1] for each k: a vector of half v's lanes (integer lanes)."""
    n = v.type.count
    return builder.add(_shuffle(builder, v, list(range(0, n, 2))), _shuffle(builder, v, list(range(1, n, 2))))


def _row_pointer(context, builder, arrty, arr, row, col=None):
    """Pointer to element (row, col) (col 0 if None) of a C-contiguous 2-D array, and its row length."""
    a = context.make_array(arrty)(context, builder, value=arr)
    width = cgutils.unpack_tuple(builder, a.shape)[1]
    flat = builder.mul(row, width)
    return builder.gep(a.data, [flat if col is None else builder.add(flat, col)]), width


def _prefetch(builder, p, lines: int) -> None:
    """Ask for the `lines` cache lines from byte pointer p on (llvm.prefetch: read, keep in all levels)."""
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
    fn = builder.module.declare_intrinsic("llvm.prefetch.p0", fnty=fnty)
    read, keep, data = ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)
    for k in range(lines):
        builder.call(fn, [builder.gep(p, [ir.Constant(ir.IntType(64), 64 * k)]), read, keep, data])


# The row loops built on _column_groups (the float kernels', and the serial quantized ones') ask for the first
# PREFETCH_LINES cache lines of the row PREFETCH_ROWS rows ahead. Why: attention's K rows are short (64 floats, 256
# bytes) and 768 bytes apart in the cache, fresh from memory every token (the weights streamed in between evict them),
# and the hardware prefetcher does not run ahead of such a stream (figures: benchmarks/README.md).
PREFETCH_ROWS = 16
PREFETCH_LINES = 4


def _per_count(builder, n, ncols: int, body) -> None:
    """A switch on the column count n (1..ncols): `body(count)` emitted once per count, in a block of its own,
    each then joining the block after the switch (where the builder is left). Why one loop per count: see
    _column_groups."""
    done = builder.append_basic_block("cols.done")
    switch = builder.switch(n, done)
    for count in range(1, ncols + 1):
        case = builder.append_basic_block(f"cols.{count}")
        switch.add_case(ir.Constant(n.type, count), case)
        builder.position_at_end(case)
        body(count)
        builder.branch(done)
    builder.position_at_end(done)


def _weight_pointers(context, builder, signature, args, w: int = 0, w_off: int = 1, base: int = 2):
    """The byte pointer of the weights (argument `w`) and the pointer to w_off[base:] (arguments `w_off`,
    `base`): what every multi-row intrinsic reads its weight rows through."""
    ty = signature.args
    w_data = _address(context, builder, ty[w], args[w], ir.Constant(args[base].type, 0))
    return w_data, _address(context, builder, ty[w_off], args[w_off], args[base])


def _column_groups(context, builder, signature, args, ncols: int, pos: dict[str, int], columns, row) -> None:
    """The body of a multi-column intrinsic: for weight rows m0 <= m < m1 (rows w_off[base + m]), `row(pw, m,
    cols)` with `cols = columns(count)` made once for the n (1..ncols) src1 rows from r. `pos` gives the
    argument positions of w, w_off, base, m0, m1, r and n.

    One loop over the rows per column count, chosen once: inside one loop over the rows, the loops of every
    count made LLVM keep all their addresses live across it, in spilled registers reloaded every row (one
    column 40% slower), and a call per row costs as much.
    """
    w_data, offsets = _weight_pointers(context, builder, signature, args, pos["w"], pos["w_off"], pos["base"])
    m0, m1 = args[pos["m0"]], args[pos["m1"]]

    def rows(count: int) -> None:
        cols = columns(count)
        with cgutils.for_range(builder, m1, start=m0) as loop:
            m = loop.index
            if PREFETCH_ROWS:
                ahead = builder.add(m, ir.Constant(m.type, PREFETCH_ROWS))
                with builder.if_then(builder.icmp_signed("<", ahead, m1)):
                    _prefetch(builder, builder.gep(w_data, [builder.load(builder.gep(offsets, [ahead]))]),
                              PREFETCH_LINES)
            row(builder.gep(w_data, [builder.load(builder.gep(offsets, [m]))]), m, cols)

    _per_count(builder, args[pos["n"]], ncols, rows)


def _store_columns(context, builder, arrty, out, r, m, dots) -> None:
    """out[r + c, m] = dots[c]."""
    for c, dot in enumerate(dots):
        builder.store(dot, _row_pointer(context, builder, arrty, out, builder.add(r, ir.Constant(r.type, c)), m)[0])


def _float_block(builder, pw, i, kind: int):
    """Weight values 32i..32i+31 of an F32, F16 or BF16 (`kind`) row at byte pointer pw, as <32 x float>."""
    if kind == F32:
        return _load_vector(builder, builder.gep(pw, [builder.shl(i, ir.Constant(i.type, 7))]), _F32, 32)
    return _widen_halves(builder, _load_vector(builder, builder.gep(pw, [builder.shl(i, ir.Constant(i.type, 6))]),
                                               _I16, 32), kind)


def _float_value(builder, pw, k, kind: int):
    """Weight value k of an F32, F16 or BF16 row at byte pointer pw, as float."""
    if kind == F32:
        return builder.load(builder.bitcast(builder.gep(pw, [builder.shl(k, ir.Constant(k.type, 2))]),
                                            _F32.as_pointer()), align=1)
    h = builder.load(builder.bitcast(builder.gep(pw, [builder.shl(k, ir.Constant(k.type, 1))]), _I16.as_pointer()),
                     align=1)
    if kind == F16:
        return builder.fpext(builder.bitcast(h, ir.HalfType()), _F32)
    return builder.bitcast(builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16)), _F32)


def _make_dot_half_row(kind: int, ncols: int = 1):
    """F32, F16 or BF16 (`kind`) weight rows times float32 rows, in 32 lanes summed at the end.

    `ncols` 1: `dot(w, o, x, j, n)` = sum_t value(w, t) * x[j+t], t < n, n a multiple of 32 (value t at byte
    o+2t for halves, o+4t for F32).
    `ncols` > 1: `dot(w, w_off, base, m0, m1, x, r, n, out)` writes out[r + c, m] for c < n (n from 1 to
    ncols), m0 <= m < m1: weight row w_off[base + m] times x's rows r..r+n-1, whole: the elements after
    the last multiple of 32 are added one by one after the lanes' sum. A block of halves is widened once
    for all columns; each column's sum is the same bits as with `ncols` 1 (and its tail added after).
    F32 weights come here for products of a few columns (see matmul.F32_BLAS_MIN_COLS): streaming rows on
    the kernel threads instead of BLAS's mat-vec.
    """
    vf = ir.VectorType(_F32, 32)

    def row_loop(builder, pw, n, cols, K=None):
        """The dots of the weight row at pw with the x rows at `cols` over n (a multiple of 32) elements,
        then, given K, elements n..K-1 one by one."""
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * 32)) for _ in cols]
        n_blocks = builder.ashr(n, ir.Constant(n.type, 5))
        with cgutils.for_range(builder, n_blocks) as loop:
            i = loop.index
            wf = _float_block(builder, pw, i, kind)
            for px, acc in zip(cols, accs, strict=True):
                xv = _load_vector(builder, builder.gep(px, [builder.shl(i, ir.Constant(i.type, 5))]), _F32, 32)
                builder.store(_fmuladd(builder, wf, xv, builder.load(acc)), acc)
        sums = [cgutils.alloca_once_value(builder, _sum_f32_tree(builder, builder.load(acc), 32)) for acc in accs]
        if K is not None:
            with cgutils.for_range(builder, K, start=n) as loop:
                k = loop.index
                wk = _float_value(builder, pw, k, kind)
                for px, total in zip(cols, sums, strict=True):
                    product = builder.fmul(wk, builder.load(builder.gep(px, [k])))
                    builder.store(builder.fadd(builder.load(total), product), total)
        return [builder.load(total) for total in sums]

    if ncols == 1:
        @intrinsic
        def dot_half_row(typingctx, w, o, x, j, n):
            sig = types.float32(w, types.intp, x, types.intp, types.intp)

            def codegen(context, builder, signature, args):
                pw = _address(context, builder, signature.args[0], args[0], args[1])
                px = _address(context, builder, signature.args[2], args[2], args[3])
                return row_loop(builder, pw, args[4], [px])[0]

            return sig, codegen

        return dot_half_row

    @intrinsic
    def dot_half_cols(typingctx, w, w_off, base, m0, m1, x, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, x, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[6]
            K = None

            def columns(count: int) -> list:
                nonlocal K
                ptrs = []
                for c in range(count):
                    p, K = _row_pointer(context, builder, ty[5], args[5], builder.add(r, ir.Constant(r.type, c)))
                    ptrs.append(p)
                return ptrs

            def row(pw, m, cols) -> None:
                n32 = builder.shl(builder.ashr(K, ir.Constant(K.type, 5)), ir.Constant(K.type, 5))
                _store_columns(context, builder, ty[8], args[8], r, m, row_loop(builder, pw, n32, cols, K))

            pos = {"w": 0, "w_off": 1, "base": 2, "m0": 3, "m1": 4, "n": 7}
            _column_groups(context, builder, signature, args, ncols, pos, columns, row)
            return context.get_dummy_value()

        return sig, codegen

    return dot_half_cols




def _q8_0_values(builder, p):
    """Q8_0's 32 int8 values at p."""
    return _load_vector(builder, p, _I8, 32)


def _q4_0_nibbles(builder, p):
    """Q4_0's 32 nibbles (0..15, the values + 8) from the 16 bytes at p: low nibbles first.

    The 16 bytes twice, the upper copy shifted right by 4 in 64-bit lanes, then masked: vbroadcasti128,
    vpsrlvq, vpand on AVX2 (one op fewer than masking and shifting apart and joining the halves)."""
    q = _load_vector(builder, p, _I8, 16)
    both = builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(_I32, 32), list(range(16)) * 2))
    v4i64 = ir.VectorType(ir.IntType(64), 4)
    shifted = builder.lshr(builder.bitcast(both, v4i64), ir.Constant(v4i64, [0, 0, 4, 4]))
    v32i8 = ir.VectorType(_I8, 32)
    return builder.and_(builder.bitcast(shifted, v32i8), ir.Constant(v32i8, [15] * 32))


def _block_sums_portable(builder, wv, yv):
    """8 exact int32 partial sums of the products of two <32 x i8> vectors: products of pairs (the shape
    of vpmaddwd), then halves."""
    v32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.sext(wv, v32), builder.sext(yv, v32), flags=["nsw"])
    return _pairs_then_halves(builder, prod)


def _pairs_then_halves(builder, prod):
    """8 sums of a <32 x i32>: adjacent pairs (vpmaddwd's shape), then lanes i and i + 8 of those."""
    pairs = _pair_sums(builder, prod)
    return builder.add(_shuffle(builder, pairs, list(range(8))), _shuffle(builder, pairs, list(range(8, 16))))


def _quads(builder, prod):
    """8 sums of 4 consecutive lanes of a <32 x i32> (lane i: elements 4i..4i+3, ggml's AVX2 layout)."""
    return _pair_sums(builder, _pair_sums(builder, prod))


def _block_sums_quads(builder, wv, yv):
    """As _block_sums_avx2 (lane i: products 4i..4i+3) in portable vector IR."""
    v32 = ir.VectorType(_I32, 32)
    return _quads(builder, builder.mul(builder.sext(wv, v32), builder.sext(yv, v32), flags=["nsw"]))


def _block_sums_unsigned_quads(builder, uv, yv):
    """As _block_sums_unsigned_avx2 (lane i: products 4i..4i+3) in portable vector IR."""
    v32 = ir.VectorType(_I32, 32)
    return _quads(builder, builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"]))


def _block_sums_avx2(builder, wv, yv):
    """As _block_sums_portable with ggml's AVX2 sequence: |w| (unsigned) times y with w's sign by
    vpmaddubsw, pairs of int16 by vpmaddwd. Exact: |w| <= 128 and |y| <= 127 (q8 values are
    -127..127), so a pair is at most 2 * 128 * 127 = 32512 and the int16 sums never saturate."""
    v32i8, v16i16, v8i32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
    module = builder.module
    absb = module.declare_intrinsic("llvm.abs.v32i8", fnty=ir.FunctionType(v32i8, [v32i8, ir.IntType(1)]))
    sign = module.declare_intrinsic("llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    pairs16 = builder.call(maddubs, [builder.call(absb, [wv, ir.Constant(ir.IntType(1), 0)]),
                                     builder.call(sign, [yv, wv])])
    return builder.call(maddwd, [pairs16, ir.Constant(v16i16, [1] * 16)])


def _block_sums_unsigned_portable(builder, uv, yv):
    """As _block_sums_portable for values read unsigned (0..255) in `uv`."""
    v32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"])
    return _pairs_then_halves(builder, prod)


def _block_sums_unsigned_avx2(builder, uv, yv):
    """As _block_sums_unsigned_portable by vpmaddubsw + vpmaddwd; exact for values <= 128 (Q4_0's 0..15)."""
    v32i8, v16i16, v8i32 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
    module = builder.module
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    return builder.call(maddwd, [builder.call(maddubs, [uv, yv]), ir.Constant(v16i16, [1] * 16)])


def _vpdpbusd(builder, acc, uv, yv):
    """acc + the 8 sums of 4 consecutive products uv[4i+k] (unsigned) * yv[4i+k] (signed), <8 x i32>: AVX512-VNNI's
    vpdpbusd, ggml's AVX2 lane layout (lane i: products 4i..4i+3) in one instruction, exact (no saturation)."""
    v8i32 = ir.VectorType(_I32, 8)
    fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.256",
                                          fnty=ir.FunctionType(v8i32, [v8i32, v8i32, v8i32]))
    return builder.call(fn, [acc, builder.bitcast(uv, v8i32), builder.bitcast(yv, v8i32)])


def _block_sums_vnni(builder, wv, yv):
    """As _block_sums_avx2 (|w| times y with w's sign, lane i: products 4i..4i+3) by one vpdpbusd."""
    v32i8 = ir.VectorType(_I8, 32)
    module = builder.module
    absb = module.declare_intrinsic("llvm.abs.v32i8", fnty=ir.FunctionType(v32i8, [v32i8, ir.IntType(1)]))
    sign = module.declare_intrinsic("llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    zero = ir.Constant(ir.VectorType(_I32, 8), [0] * 8)
    return _vpdpbusd(builder, zero, builder.call(absb, [wv, ir.Constant(ir.IntType(1), 0)]),
                     builder.call(sign, [yv, wv]))


def _block_sums_unsigned_vnni(builder, uv, yv):
    """As _block_sums_unsigned_avx2 by one vpdpbusd."""
    return _vpdpbusd(builder, ir.Constant(ir.VectorType(_I32, 8), [0] * 8), uv, yv)


def _target_has(*features: str) -> bool:
    """Whether numba compiles for a CPU with all these LLVM features (the host's, unless NUMBA_CPU_NAME
    names another)."""
    if numba.config.CPU_NAME:
        return False  # a chosen (e.g. generic) target: portable code only
    host = llvm_binding.get_host_cpu_features()
    return all(host.get(f, False) for f in features)


# the integer block sums: AVX2's byte multiply-add where the target has it, portable vector IR elsewhere; where
# the target also has AVX512-VNNI (with VL: its 256-bit form), one vpdpbusd instead of vpmaddubsw + vpmaddwd (the
# same lanes; see _make_dot_q_row for the signed values). The generators take the sums as an argument
# (`block_sums`), so tests run every variant the host can.
_HAS_AVX2 = _target_has("avx2")
_HAS_VNNI = _HAS_AVX2 and _target_has("avx512vnni", "avx512vl")


def _choose_block_sums(avx2: bool, vnni: bool) -> tuple:
    """The (signed, unsigned) block sums for a target with these features."""
    if avx2 and vnni:
        return _block_sums_vnni, _block_sums_unsigned_vnni
    if avx2:
        return _block_sums_avx2, _block_sums_unsigned_avx2
    return _block_sums_portable, _block_sums_unsigned_portable


_block_sums, _block_sums_unsigned = _choose_block_sums(_HAS_AVX2, _HAS_VNNI)
_ROW_UNROLL = 4  # blocks per loop iteration, each with its own accumulator (breaks the FMA latency chain)


def _f16_pair(builder, pb):
    """The two f16 at the start of a block (Q4_1's scale and min), as float32, from one 4-byte load.

    Why a pair: a lone f16 load becomes vpinsrw into whatever register LLVM picks, a false dependency on
    its old value (it picked the x86 loop's FMA accumulator: the scale then waited for the previous
    block's FMA, Q8_0 40% slower); a 4-byte vector load (vmovss) zeroes the rest of its register."""
    v = builder.load(builder.bitcast(pb, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1)
    f = builder.fpext(v, ir.VectorType(_F32, 2))
    return builder.extract_element(f, ir.Constant(_I32, 0)), builder.extract_element(f, ir.Constant(_I32, 1))


def _f16_scale(builder, pb):
    """The f16 scale at the start of a block, as float32 (Q8_0, Q4_0, IQ4_NL; the load takes the next two
    bytes too, see _f16_pair)."""
    return _f16_pair(builder, pb)[0]


def _e8m0_half(builder, e):
    """ggml_e8m0_to_fp32_half of an i8 value read unsigned: 2^(e - 128), built from its bits (exact)."""
    e32 = builder.zext(e, _I32)
    small = builder.shl(ir.Constant(_I32, 0x00200000), e32)  # e < 2: subnormal
    normal = builder.shl(builder.sub(e32, ir.Constant(_I32, 1)), ir.Constant(_I32, 23))
    bits = builder.select(builder.icmp_unsigned("<", e32, ir.Constant(_I32, 2)), small, normal)
    return builder.bitcast(bits, _F32)


def _e8m0_scale(builder, pb):
    """MXFP4's scale: the E8M0 byte at the start of a block, halved (the table holds doubled values)."""
    return _e8m0_half(builder, builder.load(pb))


def _fma(builder, a, b, c):
    """a * b + c with one rounding (llvm.fma: the FMA instruction, as ggml's _mm256_fmadd_ps / gcc's
    contracted scalar multiply-adds), for float32 scalars and vectors."""
    fnty = ir.FunctionType(a.type, [a.type, a.type, a.type])
    name = f"llvm.fma.v{a.type.count}f32" if isinstance(a.type, ir.VectorType) else "llvm.fma.f32"
    return builder.call(builder.module.declare_intrinsic(name, fnty=fnty), [a, b, c])


def _y_offsets(builder, py, nb):
    """-128 times the lane sums (4 consecutive values each) of every 32-value block of the int8 row at py: a
    stack buffer of nb * 8 int32, the start of vpdpbusd for w + 128 (signed w read unsigned) times y, whose
    lanes then hold the exact sums of w times y. Dynamic alloca (see _gather_scales)."""
    v8i32 = ir.VectorType(_I32, 8)
    buf = builder.alloca(_I32, size=builder.shl(nb, ir.Constant(nb.type, 3)))
    zero = ir.Constant(v8i32, [0] * 8)
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        yv = _load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), _I8, 32)
        sums = _vpdpbusd(builder, zero, ir.Constant(ir.VectorType(_I8, 32), [0x80] * 32), yv)  # 128 * lane sums
        builder.store(builder.sub(zero, sums), builder.bitcast(builder.gep(buf, [builder.shl(b, ir.Constant(
            b.type, 3))]), v8i32.as_pointer()), align=4)
    return buf


def _gather_scales(builder, cols, nb, mins: bool):
    """The columns' block scales yd, each 8 times, copied to a stack buffer block by block (8 * count floats
    a block), and for `mins` Q8_1's sums s (`width` floats a block, the column count rounded up to a power of
    two, zeros after it): (yd8, ys, width). Dynamic allocas, freed when the function of the row loop
    (see _make_dot_q_row's rows_function) returns (with _y_offsets', 4 columns of 16384 values: 128 KB)."""
    count = len(cols)
    width = 1 << (count - 1).bit_length()
    v8f = ir.VectorType(_F32, 8)
    yd8 = builder.alloca(_F32, size=builder.mul(nb, ir.Constant(nb.type, 8 * count)))
    ys = builder.alloca(_F32, size=builder.mul(nb, ir.Constant(nb.type, width))) if mins else None
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        for c in range(count):
            at = builder.mul(builder.add(builder.mul(b, ir.Constant(b.type, count)), ir.Constant(b.type, c)),
                             ir.Constant(b.type, 8))
            d = builder.load(builder.gep(cols[c][1], [b]))
            builder.store(_splat(builder, d, 8), builder.bitcast(builder.gep(yd8, [at]), v8f.as_pointer()), align=4)
        if mins:
            bw = builder.mul(b, ir.Constant(b.type, width))
            for c in range(width):
                v = builder.load(builder.gep(cols[c][2], [b])) if c < count else ir.Constant(_F32, 0.0)
                builder.store(v, builder.gep(ys, [builder.add(bw, ir.Constant(b.type, c))]))
    return yd8, ys, width


def _make_dot_q_row(block_bytes: int, values, block_sums=None, minus_8: bool = False, scale=_f16_scale,
                    values_offset: int = 2, mins: bool = False, x86: bool = False, ncols: int = 1,
                    gather_min: int = 2, signed_vnni_min: int = 2, split_rows: tuple[int, ...] | None = None):
    """The row loop of a 32-value block type of `block_bytes`: the block's scale (`scale` reads it), then at
    `values_offset` the values `values` reads.

    `x86`: the float arithmetic of ggml's AVX2 vec_dot (numerics "x86", see
    `pyggml.backends.cpu.numerics`): one 8-lane accumulator, `fma(d_w * d_y, lanes, acc)` block after block,
    and for `mins` the scalar `summs = fma(m, s, summs)`. Otherwise `_ROW_UNROLL` accumulators (the FMA
    latency chain), multiply-adds fused where LLVM finds it profitable, summs = summs + m * s.

    `minus_8`: the values read are unsigned and stand for value + 8 (Q4_0): each of the 8 lane sums
    subtracts the block's sum of y (from yb), 8 * sum(y) in all, ggml's Q4_0 offset applied exactly.
    `mins`: the values are unsigned and each block has an f16 min after its scale (Q4_1, against Q8_1): the
    per-block m * s (s the src1 block's f32 sum, passed in yb's place) is summed apart and added at the end,
    as ggml's ggml_vec_dot_q4_1_q8_1 (`hsum(acc) + summs`).

    `ncols` 1: `dot(w, o, nb, yq, j, yd, k, yb, kb)` returns the row's dot with the src1 row at yq[j:],
    yd[k:], yb[kb:]. `ncols` > 1: `dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)` writes
    out[r + c, m] for c < n (n from 1 to ncols), m0 <= m < m1: the dots of weight row w_off[base + m] with
    src1 rows r..r+n-1 (2-D arrays). Why: decoding several
    sequences multiplies each weight row by a few columns; loading and unpacking a block once for all of
    them, and one call per row instead of per column, saves much of the time. Each column keeps its own accumulators and
    sums its blocks in the same order as `ncols` 1 does, so its result is the same to the bit.

    How the multi-column loops go (each choice keeps every (row, column) pair's arithmetic, so its bits):
    - each column count's loop over the rows is a function of its own (see rows_function).
    - `gather_min`: from this many columns on, each column's block scales yd are copied 8 times (and
      Q4_1's s once) to a stack buffer once per call, so that a column's d_w * d_y is one vmulps of wd's
      broadcast and the copies, and the summs of all columns one FMA.
    - `signed_vnni_min`: with VNNI's sums (`_block_sums_vnni`), signed values (Q8_0, IQ4_NL, MXFP4) from
      this many columns on as w + 128 (read unsigned) times y, vpdpbusd starting from -128 times y's lane
      sums (made once per call, `_y_offsets`): no vpsignb per column. Fewer columns take AVX2's sums
      (`_block_sums_avx2`): VNNI's, either form, made the one-column loop slower while the weights stream
      from memory, though faster on cached weights.
    - `split_rows`: the column counts whose loop takes two weight rows a pass, m and m + h (h half the
      call's rows): two independent FMA chains (x86's one accumulator per row is a latency chain, 4 cycles
      a block), the src1 block loaded once for both. Default 1 to 4 columns for signed values, 1 to 3 for
      Q4_0/Q4_1 (slower split at 4 columns). Rows m and m + 1 instead were slower streaming the weights from
      memory (their interleaved reads in the same pages defeat the prefetcher); rows half a call apart each
      stream from pages of their own.
    The loops are throughput-bound: about 13 instructions a block for one column, 7 a block and column
    for four (Q4_1, x86). Not kept: two columns in one 512-bit vector (Zen 4 splits it in two halves anyway).
    Figures for each choice: benchmarks/README.md.
    """
    if block_sums is None and x86 and not _HAS_AVX2:
        # ggml's lanes (4 consecutive products each) on any target: the float sums see the same lane values
        block_sums = _block_sums_unsigned_quads if minus_8 or mins else _block_sums_quads
    if block_sums is None:
        block_sums = _block_sums_unsigned if minus_8 or mins else _block_sums
    unroll = 1 if x86 else _ROW_UNROLL
    madd = _fma if x86 else _fmuladd
    if split_rows is None:
        split_rows = (1, 2, 3) if minus_8 or mins else (1, 2, 3, 4)

    # signed values with vpdpbusd: w + 128 (unsigned) times y, minus 128 * y's lane sums made once per call (see
    # _y_offsets), instead of |w| times y with w's sign: no vpsignb per column; from `signed_vnni_min` columns
    # on, AVX2's sums below (see the docstring)
    biased = block_sums is _block_sums_vnni

    def row_loop(builder, pws, nb, cols, gathered=None, offsets=None, sums=block_sums):
        """The dots of the weight rows at `pws` with each src1 row of `cols` (pointers to its yq, yd, yb), as
        results[row][col]. `gathered`: (yd8, ys, width), the columns' scales (and Q4_1's sums s) gathered
        per block (see _gather_scales)."""
        v8f = ir.VectorType(_F32, 8)
        accs = [[[cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in range(unroll)]
                 for _ in cols] for _ in pws]
        if gathered is not None:
            vw = ir.VectorType(_F32, gathered[2])
            summs = [cgutils.alloca_once_value(builder, ir.Constant(vw, [0.0] * vw.count)) for _ in pws]
        else:
            summs = [[cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in cols] for _ in pws]

        def block(b, u):
            yvs = [_load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), _I8, 32)
                   for py, _, _ in cols]
            for i, pw in enumerate(pws):
                row_block(b, u, pw, accs[i], summs[i], yvs)

        def row_block(b, u, pw, accs, summs, yvs):
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            wd, m = _f16_pair(builder, pb) if mins else (scale(builder, pb), None)
            wv = values(builder, builder.gep(pb, [ir.Constant(b.type, values_offset)]))
            if offsets is not None:
                wv = builder.xor(wv, ir.Constant(ir.VectorType(_I8, 32), [0x80] * 32))  # w + 128, read unsigned
            if gathered is not None:
                # a column's d_w * d_y is one vmulps of yd8's copies, and the summs of all columns one FMA
                yd8, ys, width = gathered
                wd8 = _splat(builder, wd, 8)
                b8 = builder.mul(b, ir.Constant(b.type, 8 * len(cols)))
                if mins:
                    ms = _splat(builder, m, width)
                    ss = _load_vector(builder, builder.gep(ys, [builder.mul(b, ir.Constant(b.type, width))]), _F32,
                                      width)
                    old = builder.load(summs)
                    builder.store(_fma(builder, ms, ss, old) if x86 else builder.fadd(old, builder.fmul(ms, ss)), summs)
            for c, (_, pd, ps) in enumerate(cols):
                if gathered is not None:
                    d8 = builder.fmul(wd8, _load_vector(builder, builder.gep(yd8, [builder.add(b8, ir.Constant(
                        b.type, 8 * c))]), _F32, 8))
                else:
                    d8 = _splat(builder, builder.fmul(wd, builder.load(builder.gep(pd, [b]))), 8)
                    if mins:
                        sy = builder.load(builder.gep(ps, [b]))
                        old = builder.load(summs[c])
                        builder.store(_fma(builder, m, sy, old) if x86 else builder.fadd(old, builder.fmul(m, sy)),
                                      summs[c])
                if offsets is not None:
                    at = builder.shl(b, ir.Constant(b.type, 3))
                    part = _vpdpbusd(builder, _load_vector(builder, builder.gep(offsets[c], [at]), _I32, 8), wv,
                                     yvs[c])
                else:
                    part = sums(builder, wv, yvs[c])
                if minus_8:
                    b2 = builder.shl(b, ir.Constant(b.type, 1))
                    ysum = builder.add(builder.load(builder.gep(ps, [b2])),
                                       builder.load(builder.gep(ps, [builder.add(b2, ir.Constant(b.type, 1))])))
                    part = builder.sub(part, _splat(builder, ysum, 8))
                acc = accs[c][u]
                builder.store(madd(builder, builder.sitofp(part, v8f), d8, builder.load(acc)), acc)

        n_unroll = ir.Constant(nb.type, unroll)
        n_main = builder.sdiv(nb, n_unroll)
        with cgutils.for_range(builder, n_main) as loop:
            first = builder.mul(loop.index, n_unroll)
            for u in range(unroll):
                block(builder.add(first, ir.Constant(nb.type, u)), u)
        with cgutils.for_range(builder, nb, start=builder.mul(n_main, n_unroll)) as loop:
            block(loop.index, 0)
        results = []
        for i in range(len(pws)):
            row = []
            for c in range(len(cols)):
                total = builder.load(accs[i][c][0])
                for acc in accs[i][c][1:]:
                    total = builder.fadd(total, builder.load(acc))
                out = _sum_f32_tree(builder, total, 8)
                if mins:
                    sm = (builder.extract_element(builder.load(summs[i]), ir.Constant(_I32, c))
                          if gathered is not None else builder.load(summs[i][c]))
                    out = builder.fadd(out, sm)
                row.append(out)
            results.append(row)
        return results

    if ncols == 1:  # one weight row: the first (only) row's dots
        return _block_row_intrinsic(lambda builder, pw, nb, cols: row_loop(builder, [pw], nb, cols)[0], 1)

    def rows_function(module, count: int, values: list) -> ir.Function:
        """A function of its own (not inlined) for weight rows m0..m1-1 times `count` src1 rows: (w, w_off[base:],
        m0, m1, nb, then per column its yq, yd, yb and out rows), writing out[m] of each column.

        Why its own function: the scale buffers (dynamic allocas) stay out of the caller (there, they cost the
        one-column loop 13%: Q8_0 49152x576, one thread), and each count's loop has the registers to itself."""
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [v.type for v in values]),
                         name=module.get_unique_name(f"dot_q_cols_{count}"))
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        fb = ir.IRBuilder(fn.append_basic_block("entry"))
        w_data, offsets, m0, m1, nb = fn.args[:5]
        cols = [tuple(fn.args[5 + 4 * c:8 + 4 * c]) for c in range(count)]
        outs = [fn.args[8 + 4 * c] for c in range(count)]
        gathered = _gather_scales(fb, cols, nb, mins) if count >= gather_min else None
        y_offsets = ([_y_offsets(fb, py, nb) for py, _, _ in cols] if biased and count >= signed_vnni_min
                     else None)
        sums = _block_sums_avx2 if biased and count < signed_vnni_min else block_sums

        def pointer(m):
            return fb.gep(w_data, [fb.load(fb.gep(offsets, [m]))])

        tail = m0
        if count in split_rows:
            # rows m and m + h together (h half the rows): two FMA chains, each row read from its own pages
            h = fb.sdiv(fb.sub(m1, m0), ir.Constant(m1.type, 2))
            with cgutils.for_range(fb, fb.add(m0, h), start=m0) as loop:
                m = loop.index
                mh = fb.add(m, h)
                dots = row_loop(fb, [pointer(m), pointer(mh)], nb, cols, gathered, y_offsets, sums)
                for row, mm in zip(dots, (m, mh), strict=True):
                    for po, dot in zip(outs, row, strict=True):
                        fb.store(dot, fb.gep(po, [mm]))
            tail = fb.add(m0, fb.add(h, h))
        with cgutils.for_range(fb, m1, start=tail) as loop:
            m = loop.index
            for po, dot in zip(outs, row_loop(fb, [pointer(m)], nb, cols, gathered, y_offsets, sums)[0], strict=True):
                fb.store(dot, fb.gep(po, [m]))
        fb.ret_void()
        return fn

    @intrinsic
    def dot_q_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]
            w_data, offsets = _weight_pointers(context, builder, signature, args)

            def call(count: int) -> None:
                rows = [builder.add(r, ir.Constant(r.type, c)) for c in range(count)]
                ptrs = [_row_pointer(context, builder, ty[i], args[i], row)[0] for row in rows for i in (6, 7, 8, 11)]
                values = [w_data, offsets, args[3], args[4], args[5]] + ptrs
                builder.call(rows_function(builder.module, count, values), values)

            _per_count(builder, args[10], ncols, call)
            return context.get_dummy_value()

        return sig, codegen

    return dot_q_cols


# src1 columns one pass over a weight row serves (the `ncols` of the *_cols loops); more share the
# unpacking wider but run out of vector registers (fours measured fastest: benchmarks/README.md)
COLS = 4
# the weight types whose direct kernels use the *_cols loops
COLS_KINDS = (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K, IQ4_NL, MXFP4, F16, BF16)

dot_f16_cols = _make_dot_half_row(F16, COLS)
dot_f16_cols.__doc__ = "F16 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see _make_dot_half_row)."
dot_bf16_cols = _make_dot_half_row(BF16, COLS)
dot_bf16_cols.__doc__ = "BF16 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see _make_dot_half_row)."
dot_f32_cols = _make_dot_half_row(F32, COLS)
dot_f32_cols.__doc__ = "F32 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see _make_dot_half_row)."
dot_f32_row = _make_dot_half_row(F32, 1)
dot_f32_row.__doc__ = ("dot(w, o, x, j, n): the F32 row at byte o of w times x[j:j+n], n a multiple of 32, in 32 lanes "
                       "(see _make_dot_half_row).")


def _each_f32(builder, n, update) -> None:
    """`update(t, width)` for t = 0, 32, 64, ... below n's last multiple of 32 (width 32: <32 x float>), then for
    each element after it (width 1: a float)."""
    five = ir.Constant(n.type, 5)
    with cgutils.for_range(builder, builder.ashr(n, five)) as loop:
        update(builder.shl(loop.index, five), 32)
    with cgutils.for_range(builder, n, start=builder.shl(builder.ashr(n, five), five)) as loop:
        update(loop.index, 1)


def _load_f32(builder, p, t, width: int):
    q = builder.gep(p, [t])
    return _load_vector(builder, q, _F32, width) if width > 1 else builder.load(q, align=1)


def _store_f32(builder, v, p, t, width: int) -> None:
    q = builder.gep(p, [t])
    builder.store(v, builder.bitcast(q, ir.VectorType(_F32, width).as_pointer()) if width > 1 else q, align=1)


@intrinsic
def mad_f32_row(typingctx, x, i, a, y, j, n):
    """y[j+t] = fma(x[i+t], a, y[j+t]) for t < n (ggml_vec_mad_f32 on an FMA machine), 32 lanes at a time: numba
    gathers such a loop element by element (it cannot tell the indices are consecutive)."""
    sig = types.void(x, types.intp, types.float32, y, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        px = _address(context, builder, signature.args[0], args[0], args[1])
        py = _address(context, builder, signature.args[3], args[3], args[4])

        def update(t, width: int) -> None:
            av = _splat(builder, args[2], width) if width > 1 else args[2]
            yv = _fma(builder, _load_f32(builder, px, t, width), av, _load_f32(builder, py, t, width))
            _store_f32(builder, yv, py, t, width)

        _each_f32(builder, args[5], update)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def scale_f32_row(typingctx, y, j, a, n):
    """y[j+t] *= a for t < n (ggml_vec_scale_f32), 32 lanes at a time (see mad_f32_row)."""
    sig = types.void(y, types.intp, types.float32, types.intp)

    def codegen(context, builder, signature, args):
        py = _address(context, builder, signature.args[0], args[0], args[1])

        def update(t, width: int) -> None:
            av = _splat(builder, args[2], width) if width > 1 else args[2]
            _store_f32(builder, builder.fmul(_load_f32(builder, py, t, width), av), py, t, width)

        _each_f32(builder, args[3], update)
        return context.get_dummy_value()

    return sig, codegen

_Q8_0_SPEC = {"block_bytes": 34, "values": _q8_0_values}
_Q4_0_SPEC = {"block_bytes": 18, "values": _q4_0_nibbles, "minus_8": True}
_Q4_1_SPEC = {"block_bytes": 20, "values": _q4_0_nibbles, "values_offset": 4, "mins": True}
# the row loops the direct kernels call: weight rows m0..m1-1 against src1 rows r..r+n-1 (n <= COLS), see
# _make_dot_q_row (its one-column form, ncols=1, is the tests' reference for each column's bits)
dot_q8_0_cols = _make_dot_q_row(**_Q8_0_SPEC, ncols=COLS)
dot_q8_0_cols.__doc__ = ("Q8_0 weight rows times Q8_0 src1 rows (values yq, scales yd; yb unused): each block's exact "
                         "int32 sums scaled by d_w * d_y, accumulated in 8 lanes.")
dot_q4_0_cols = _make_dot_q_row(**_Q4_0_SPEC, ncols=COLS)
dot_q4_0_cols.__doc__ = "As dot_q8_0_cols for Q4_0 weight rows (values nibble - 8: 16-value sums yb give the offset)."
dot_q4_1_cols = _make_dot_q_row(**_Q4_1_SPEC, ncols=COLS)
dot_q4_1_cols.__doc__ = ("As dot_q8_0_cols for Q4_1 weight rows against Q8_1 (values nibble * d + m: the src1 block "
                         "sums ys, in yb's place, carry the mins).")
dot_q8_0_cols_x86 = _make_dot_q_row(**_Q8_0_SPEC, x86=True, ncols=COLS)
dot_q8_0_cols_x86.__doc__ = "dot_q8_0_cols in the order of ggml's AVX2 ggml_vec_dot_q8_0_q8_0 (one FMA accumulator)."
dot_q4_1_cols_x86 = _make_dot_q_row(**_Q4_1_SPEC, x86=True, ncols=COLS)
dot_q4_1_cols_x86.__doc__ = "dot_q4_1_cols in the order of ggml's AVX2 ggml_vec_dot_q4_1_q8_1 (FMAs, summs last)."


def _q4_0_values(builder, p):
    """Q4_0's 32 values as int8 (-8..7) from the 16 bytes at p: the nibbles minus 8, as ggml's AVX2 code
    (its lane sums, 4 consecutive products each, are then the same numbers)."""
    return builder.sub(_q4_0_nibbles(builder, p), ir.Constant(ir.VectorType(_I8, 32), [8] * 32))


_Q4_0_X86_SPEC = {"block_bytes": 18, "values": _q4_0_values}
dot_q4_0_cols_x86 = _make_dot_q_row(**_Q4_0_X86_SPEC, x86=True, ncols=COLS)
dot_q4_0_cols_x86.__doc__ = ("As dot_q8_0_cols_x86 for Q4_0 weight rows (values nibble - 8), the order of ggml's AVX2 "
                             "ggml_vec_dot_q4_0_q8_0.")

# --- Q4_0 repacked: 8 weight rows interleaved 4 bytes at a time (the CPU's repack buffer type) ---
#
# A matrix of Q4_0 rows in the layout of pyggml.backends.cpu.repack: per group of 8 rows and per block, the 8
# rows' f16 scales (16 bytes), then 4 x 32 bytes of nibbles, byte 4r + i of the v-th 32 holding row r's byte
# 4v + i (values 4v + i and 16 + 4v + i). Masked, a 32-byte vector then has values 4v..4v+3 of every row in
# one 32-bit lane, so one vpdpbusd with 4 values of y broadcast sums 4 products for each of the 8 rows: a
# block's exact sums of all 8 rows come in one vector, and scaling them costs one vcvtdq2ps, vmulps and FMA
# for 8 rows instead of for each (about a quarter of the instructions of _make_dot_q_row's Q4_0 loop).
# The float order is ggml's x86 repack kernels' (ggml_gemv/gemm_q4_0_8x8_q8_0, AVX2/AVX512): per row and
# column, acc = fma(float(block sum), d_w * d_y, acc) block after block, from 0; d_w * d_y is exact (two
# f16). The sums use the nibbles read unsigned, starting from -8 times the y block's sum: the same integers
# as (nibble - 8) * y.

Q4_0_X8 = 1024 + Q4_0  # the kind of a Q4_0 matrix in the repacked layout


def _sums_u4_lanes(builder, acc, u, y4, vnni: bool):
    """acc (<8 x i32>) + for each lane i the sum of u[4i+k] * y4[4i+k], k < 4 (u unsigned, y4 signed, <32 x i8>):
    vpdpbusd with VNNI, else portable vector IR (exact either way)."""
    if vnni:
        return _vpdpbusd(builder, acc, u, y4)
    v32 = ir.VectorType(_I32, 32)
    return builder.add(acc, _quads(builder, builder.mul(builder.zext(u, v32), builder.sext(y4, v32), flags=["nsw"])))


def _x8_intrinsic(group_loop, ncols: int):
    """The intrinsic `dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)` of a repacked type whose
    `group_loop(builder, pg, nb, cols)` gives the <8 x float> dots of the group at byte pointer pg with the
    src1 rows of `cols` (pointers to each one's yq, yd, yb): out[r + c, m..m+7] for c < n (1..ncols) and each
    group m0 <= m < m1."""
    v8f = ir.VectorType(_F32, 8)

    @intrinsic
    def dot_x8_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]
            w_data, offsets = _weight_pointers(context, builder, signature, args)
            eight = ir.Constant(r.type, X8_ROWS)
            g0, g1 = builder.sdiv(args[3], eight), builder.sdiv(args[4], eight)

            def groups(count: int) -> None:
                rows = [builder.add(r, ir.Constant(r.type, c)) for c in range(count)]
                cols = [tuple(_row_pointer(context, builder, ty[i], args[i], row)[0] for i in (6, 7, 8))
                        for row in rows]
                with cgutils.for_range(builder, g1, start=g0) as loop:
                    m = builder.mul(loop.index, eight)
                    pg = builder.gep(w_data, [builder.load(builder.gep(offsets, [m]))])
                    for row, dots in zip(rows, group_loop(builder, pg, args[5], cols), strict=True):
                        po = _row_pointer(context, builder, ty[11], args[11], row, m)[0]
                        builder.store(dots, builder.bitcast(po, v8f.as_pointer()), align=4)

            _per_count(builder, args[10], ncols, groups)
            return context.get_dummy_value()

        return sig, codegen

    return dot_x8_cols


def _x8_q4_0_quants(builder, pb):
    """A repacked Q4_0 block's quants (8 rows' d, then 4 x 32 bytes of nibbles at pb + 16): (unsigned vector,
    index of the 4 y values it multiplies) pairs, and the offset of the values (value = nibble - 8)."""
    v32b = ir.VectorType(_I8, 32)
    low = ir.Constant(v32b, [15] * 32)
    pairs = []
    for v in range(4):
        raw = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 16 + 32 * v)]), _I8, 32)
        high = builder.and_(builder.lshr(raw, ir.Constant(v32b, [4] * 32)), low)
        pairs += [(builder.and_(raw, low), v), (high, 4 + v)]
    return pairs, -8


def _x8_q8_0_quants(builder, pb):
    """A repacked Q8_0 block's quants (8 rows' d, then 8 x 32 signed bytes at pb + 16), read as value + 128."""
    flip = ir.Constant(ir.VectorType(_I8, 32), [0x80] * 32)
    return [(builder.xor(_load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 16 + 32 * v)]), _I8, 32), flip), v)
            for v in range(8)], -128


def _x8_q5_0_wide_quants(builder, pb):
    """A Q5_0 block widened to Q8_0's repacked layout (_widen_q5_0: the 8 rows' d, then 8 x 32 bytes of value +
    16, 0..31): read as they are, offset -16."""
    return [(_load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 16 + 32 * v)]), _I8, 32), v)
            for v in range(8)], -16


def _make_dot_x8(vnni: bool, ncols: int, block_bytes: int, quants):
    """`dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)`: out[r + c, m] for c < n (1..ncols), m0 <= m <
    m1 (multiples of X8_ROWS), the dots of a repacked 32-value block type's rows (group of row m at byte
    w_off[base + m]; a group's block of `block_bytes` bytes starts with the 8 rows' f16 d, `quants(builder,
    pb)` reads its values) with src1 rows r..r+n-1 (Q8_0: values yq, scales yd, sums of 16 values yb), in
    ggml's x86 repack order: acc = fma(float(block sum), d_w * d_y, acc). The values are read unsigned
    (value - offset), the sums starting from offset times the y block's sum: the same integers."""
    v8f, v32b = ir.VectorType(_F32, 8), ir.VectorType(_I8, 32)

    def group_loop(builder, pg, nb, cols):
        """The <8 x float> dots of the 8 rows of the group at byte pointer pg with each src1 row of `cols`."""
        accs = [cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pg, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            dw = builder.fpext(_load_vector(builder, pb, ir.HalfType(), 8), v8f)
            pairs, offset = quants(builder, pb)
            for acc, (py, pd, ps) in zip(accs, cols, strict=True):
                y32 = builder.bitcast(builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), _I32.as_pointer())
                b2 = builder.shl(b, ir.Constant(b.type, 1))
                ysum = builder.add(builder.load(builder.gep(ps, [b2])),
                                   builder.load(builder.gep(ps, [builder.add(b2, ir.Constant(b.type, 1))])))
                isum = _splat(builder, builder.mul(ysum, ir.Constant(_I32, offset)), 8)
                for u, at in pairs:
                    y4 = builder.load(builder.gep(y32, [ir.Constant(b.type, at)]), align=1)
                    isum = _sums_u4_lanes(builder, isum, u, builder.bitcast(_splat(builder, y4, 8), v32b), vnni)
                d = builder.fmul(dw, _splat(builder, builder.load(builder.gep(pd, [b])), 8))
                builder.store(_fma(builder, builder.sitofp(isum, v8f), d, builder.load(acc)), acc)
        return [builder.load(acc) for acc in accs]

    return _x8_intrinsic(group_loop, ncols)


# the repacked 32-value block types: their group's block bytes and quants
X8_BLOCK_QUANTS = {int(t): (X8_ROWS * BLOCK32_FIELDS[t][1], quants) for t, quants in (
    (GGMLType.Q4_0, _x8_q4_0_quants), (GGMLType.Q8_0, _x8_q8_0_quants))}
X8_BLOCK_QUANTS[Q5_0] = (X8_BLOCK_QUANTS[Q8_0][0], _x8_q5_0_wide_quants)  # widened to Q8_0's blocks


def _make_dot_q4_0_x8(vnni: bool, ncols: int):
    """The repacked Q4_0 loop (see _make_dot_x8)."""
    return _make_dot_x8(vnni, ncols, *X8_BLOCK_QUANTS[Q4_0])


dot_q4_0_x8_cols = _make_dot_q4_0_x8(_HAS_VNNI, COLS)
dot_q8_0_x8_cols = _make_dot_x8(_HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q8_0])
dot_q5_0_x8_cols = _make_dot_x8(_HAS_VNNI, COLS, *X8_BLOCK_QUANTS[Q5_0])



# the kind of each repacked type's matrices (see matmul: a repacked src0 takes its loop for every column count)
X8_KINDS = {Q4_0: Q4_0_X8}

# Prompts of plain (not repacked) 32-value block matrices: each work item repacks its rows (a multiple of 8) into
# a tile in the layout above (_tile_x8), then runs the repacked loop over all columns: the copy costs one pass
# over the item's weights, the loop a fraction of the row loops' instructions per product. The kinds:
X8_TILE = 2048
X8_TILE_KINDS = {t: X8_TILE + t for t in (Q4_0, Q8_0, Q5_0)}
# the kinds whose loops take whole groups of X8_ROWS rows (a work item's rows are a multiple of them)
X8_GROUP_KINDS = frozenset((*X8_KINDS.values(), *X8_TILE_KINDS.values()))
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
        ps = builder.bitcast(_address(context, builder, signature.args[0], args[0], args[1]), _I32.as_pointer())
        pd = builder.bitcast(_address(context, builder, signature.args[2], args[2], args[3]), _I32.as_pointer())
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
        v16, v32 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 32)
        pw = _address(context, builder, signature.args[0], args[0], args[1])
        qh = builder.load(builder.bitcast(builder.gep(pw, [ir.Constant(_I32, 2)]), _I32.as_pointer()), align=1)
        qs = _load_vector(builder, builder.gep(pw, [ir.Constant(_I32, 6)]), _I8, 16)
        low = builder.and_(qs, ir.Constant(v16, [15] * 16))
        high = builder.lshr(qs, ir.Constant(v16, [4] * 16))
        values = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        bits = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))  # element t: bit t
        values = builder.or_(values, builder.select(bits, ir.Constant(v32, [16] * 32), ir.Constant(v32, [0] * 32)))
        quads = builder.bitcast(values, ir.VectorType(_I32, 8))
        pt = _address(context, builder, signature.args[2], args[2], args[3])
        for v in range(8):
            dst = builder.bitcast(builder.gep(pt, [ir.Constant(_I32, 32 * v)]), _I32.as_pointer())
            builder.store(builder.extract_element(quads, ir.Constant(_I32, v)), dst, align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True)
def _tile_x8(w, w_off, base, m0, m1, nb, kind):
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


# --- Q5_0: 32 values of 5 bits, against Q8_0 ---


def _q5_0_values(builder, p):
    """Q5_0's 32 values as int8 (-16..15) from its qh (4 bytes) at p and the 16 nibble bytes after: ggml's
    AVX2 form, nibble | 0xF0 where the value's fifth bit (bit t of qh for value t) is clear."""
    qh = builder.load(builder.bitcast(p, _I32.as_pointer()), align=1)
    bits = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))  # element t: bit t (AVX512: one kmov)
    v32i8 = ir.VectorType(_I8, 32)
    high = builder.select(bits, ir.Constant(v32i8, [0] * 32), ir.Constant(v32i8, [0xF0] * 32))
    return builder.or_(_q4_0_nibbles(builder, builder.gep(p, [ir.Constant(_I32, 4)])), high)


def _block_row_intrinsic(row_loop, ncols: int):
    """The intrinsic of a block-quantized type's row loop `row_loop(builder, pw, nb, cols)` (cols: pointers
    to each src1 row's yq, yd, yb), in the forms of _make_dot_q_row: `ncols` 1, `dot(w, o, nb, yq, j, yd, k,
    yb, kb)` returning one row's dot; `ncols` > 1, `dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)`
    writing out[r + c, m] for c < n."""
    if ncols == 1:
        @intrinsic
        def dot_q_row(typingctx, w, o, nb, yq, j, yd, k, yb, kb):
            ip = types.intp
            sig = types.float32(w, ip, ip, yq, ip, yd, ip, yb, ip)

            def codegen(context, builder, signature, args):
                ty = signature.args
                col = tuple(_address(context, builder, ty[i], args[i], args[i + 1]) for i in (3, 5, 7))
                return row_loop(builder, _address(context, builder, ty[0], args[0], args[1]), args[2], [col])[0]

            return sig, codegen

        return dot_q_row

    @intrinsic
    def dot_q_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]

            def columns(count: int) -> list:
                return [tuple(_row_pointer(context, builder, ty[i], args[i], builder.add(r, ir.Constant(r.type, c)))[0]
                              for i in (6, 7, 8)) for c in range(count)]

            def row(pw, m, cols) -> None:
                _store_columns(context, builder, ty[11], args[11], r, m, row_loop(builder, pw, args[5], cols))

            pos = {"w": 0, "w_off": 1, "base": 2, "m0": 3, "m1": 4, "n": 10}
            _column_groups(context, builder, signature, args, ncols, pos, columns, row)
            return context.get_dummy_value()

        return sig, codegen

    return dot_q_cols


def _make_dot_q_serial(block_bytes: int, values, values_offset: int = 2, block_sums=None, ncols: int = 1):
    """As _make_dot_q_row (same signatures; yb unused) in the float order of ggml's reference vec_dot: each
    block's exact int32 sum as a float times d_w * d_y, added to one scalar block after block
    (`sumf += (d_w * d_y) * sumi`, no FMA), for the types whose "ref" rows pyggml always summed so (Q5_0).

    Why not 8 lanes as the other "ref" rows: the numba loop this replaces gave these bits, which "ref"
    keeps.
    """
    block_sums = _block_sums if block_sums is None else block_sums

    def row_loop(builder, pw, nb, cols):
        sums = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            wd = _f16_scale(builder, pb)
            wv = values(builder, builder.gep(pb, [ir.Constant(b.type, values_offset)]))
            for (py, pd, _), total in zip(cols, sums, strict=True):
                d = builder.fmul(wd, builder.load(builder.gep(pd, [b])))
                yv = _load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), _I8, 32)
                sumi = _reduce_add_i32(builder, block_sums(builder, wv, yv), 8)
                builder.store(builder.fadd(builder.load(total), builder.fmul(d, builder.sitofp(sumi, _F32))), total)
        return [builder.load(total) for total in sums]

    return _block_row_intrinsic(row_loop, ncols)


_Q5_0_SPEC = {"block_bytes": 22, "values": _q5_0_values}
dot_q5_0_cols = _make_dot_q_serial(**_Q5_0_SPEC, ncols=COLS)
dot_q5_0_cols.__doc__ = ("Q5_0 weight rows times Q8_0 src1 rows in ggml's reference order (one scalar sum, see "
                         "_make_dot_q_serial).")
dot_q5_0_cols_x86 = _make_dot_q_row(**_Q5_0_SPEC, x86=True, ncols=COLS)
dot_q5_0_cols_x86.__doc__ = ("As dot_q8_0_cols_x86 for Q5_0 weight rows (values -16..15), the order of ggml's AVX2 "
                             "ggml_vec_dot_q5_0_q8_0.")


# --- K-quants: Q4_K and Q6_K super-blocks of 256 values, against Q8_K ---
#
# A super-block's integer sum is exact as in the numba loops these replace (vpmaddubsw pairs of a group's
# 32 values, vpmaddwd by the 16-value sub-blocks' scales, i32 lanes). Under "ref" the float arithmetic per
# super-block is theirs, ggml's reference vec_dot's (so the bits they gave); under "x86" ggml's AVX2 vec_dot's
# (the *_cols_x86 loops: the same bits as libggml's mat-vec; from two columns libggml takes its tiled gemm,
# whose order differs). Figures against the numba loops they replace: benchmarks/README.md.


def _scaled_sums_avx2(builder, uv, yv, scales):
    """8 exact int32 partial sums of sum_t uv[t] * yv[t] * scales[t // 2] over a group of 32 values: uv read
    unsigned (0..63), yv signed (Q8_K's -127..127, so a pair is at most 2 * 63 * 127 = 16002: no int16
    saturation), `scales` a <16 x i16> of -128..127 (each pair's sub-block scale): ggml's vpmaddubsw, then
    vpmaddwd by the scales."""
    v16i16, v8i32, v32i8 = ir.VectorType(_I16, 16), ir.VectorType(_I32, 8), ir.VectorType(_I8, 32)
    module = builder.module
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    return builder.call(maddwd, [builder.call(maddubs, [uv, yv]), scales])


def _scaled_sums_portable(builder, uv, yv, scales):
    """As _scaled_sums_avx2 in portable vector IR (the same pairs, in int32)."""
    v32, v16 = ir.VectorType(_I32, 32), ir.VectorType(_I32, 16)
    prod = builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"])
    pairs = _pair_sums(builder, prod)
    pairs = builder.mul(pairs, builder.sext(scales, v16), flags=["nsw"])
    return _pair_sums(builder, pairs)


_scaled_sums = _scaled_sums_avx2 if _HAS_AVX2 else _scaled_sums_portable


def _f16_lanes(builder, p):
    """The 4 halves at p as <4 x float>: one vcvtph2ps from memory, behind an arithmetic fence (without it
    LLVM narrows the load back to scalar half loads, vpinsrw merges with the false dependency _f16_pair
    describes)."""
    v4f = ir.VectorType(_F32, 4)
    wide = builder.fpext(_load_vector(builder, p, ir.HalfType(), 4), v4f)
    fence = builder.module.declare_intrinsic("llvm.arithmetic.fence.v4f32", fnty=ir.FunctionType(v4f, [v4f]))
    return builder.call(fence, [wide])


def _const(builder, n: int, values: list[int], bits: int = 8):
    return ir.Constant(ir.VectorType(ir.IntType(bits), n), values)


def _q4_K_unpack(builder, pb):
    """A Q4_K super-block's d, dmin (f32) and its 8 6-bit scales and mins (<8 x i8>) from the 12 bytes at
    pb + 4, as ggml's get_scale_min_k4: sub-block j < 4: q[j] & 63, q[j + 4] & 63; j >= 4:
    (q[j + 4] & 15) | (q[j - 4] >> 6) << 4 and (q[j + 4] >> 4) | (q[j] >> 6) << 4."""
    halves = _f16_lanes(builder, pb)
    d, dmin = (builder.extract_element(halves, ir.Constant(_I32, i)) for i in (0, 1))
    q = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 4)]), _I8, 16)  # scales[12], then qs
    top = [0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]  # the high 2 bits exist for j >= 4 only

    def high(idx: list[int]):
        h = builder.lshr(_shuffle(builder, q, idx), _const(builder, 8, [6] * 8))
        return builder.and_(builder.shl(h, _const(builder, 8, [4] * 8)), _const(builder, 8, top))

    low6 = _const(builder, 8, [63] * 4 + [15] * 4)
    low_sc = _shuffle(builder, q, [0, 1, 2, 3, 8, 9, 10, 11])
    sc = builder.or_(builder.and_(low_sc, low6), high([0, 1, 2, 3, 0, 1, 2, 3]))
    low_m = builder.lshr(_shuffle(builder, q, [4, 5, 6, 7, 8, 9, 10, 11]), _const(builder, 8, [0] * 4 + [4] * 4))
    mins = builder.or_(builder.and_(low_m, low6), high([4, 5, 6, 7, 4, 5, 6, 7]))
    return d, dmin, sc, mins


def _q4_K_group(builder, pb, unpacked, g: int):
    """Group g (0..7) of a Q4_K super-block: its 32 values (nibbles of qs[32 (g // 2):][:32], low for even g)
    and its scale for every pair."""
    sc = builder.zext(unpacked[2], ir.VectorType(_I16, 8))
    qs = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 16 + 32 * (g // 2))]), _I8, 32)
    if g % 2 == 0:
        return builder.and_(qs, _const(builder, 32, [15] * 32)), _shuffle(builder, sc, [g] * 16)
    return builder.lshr(qs, _const(builder, 32, [4] * 32)), _shuffle(builder, sc, [g] * 16)


def _q4_K_finish(builder, unpacked, total, isum, bsums, yd):
    """sumf + (d * yd * isum - dmin * yd * summs), summs = sum_j mins[j] * (y's sum over sub-block j), in the
    order of ggml's reference `sumf += d * sumi - dmin * summs` (as the numba loop this replaces)."""
    v8 = ir.VectorType(_I32, 8)
    pair = _pair_sums(builder, bsums)
    summs = _reduce_add_i32(builder, builder.mul(builder.zext(unpacked[3], v8), pair, flags=["nsw"]), 8)
    d, dmin = builder.fmul(unpacked[0], yd), builder.fmul(unpacked[1], yd)
    part = builder.fsub(builder.fmul(d, builder.sitofp(isum, _F32)), builder.fmul(dmin, builder.sitofp(summs, _F32)))
    return builder.fadd(total, part)


def _q6_K_unpack(builder, pb):
    """A Q6_K super-block's d (f32, the half at byte 208, its last: read with the 6 bytes of scales before
    it, the 8 bytes ending with the block) and its 16 int8 scales (at 192) as i16."""
    d = builder.extract_element(_f16_lanes(builder, builder.gep(pb, [ir.Constant(_I32, 202)])), ir.Constant(_I32, 3))
    scales = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 192)]), _I8, 16)
    return d, builder.sext(scales, ir.VectorType(_I16, 16))


def _q6_K_group(builder, pb, unpacked, g: int):
    """Group g = 4n + q (0..7) of a Q6_K super-block: values low4 | high2 << 4 (0..63, the value + 32), low4
    from ql[64n + 32 (q & 1):][:32] >> 4 (q >> 1), high2 from qh[32n:][:32] >> 2q; sub-blocks 2g and 2g + 1."""
    n, q = divmod(g, 4)
    ql = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 64 * n + 32 * (q & 1))]), _I8, 32)
    qh = _load_vector(builder, builder.gep(pb, [ir.Constant(_I32, 128 + 32 * n)]), _I8, 32)
    low = builder.and_(builder.lshr(ql, _const(builder, 32, [4 * (q >> 1)] * 32)), _const(builder, 32, [15] * 32))
    high = builder.and_(builder.lshr(qh, _const(builder, 32, [2 * q] * 32)), _const(builder, 32, [3] * 32))
    v = builder.or_(low, builder.shl(high, _const(builder, 32, [4] * 32)))
    return v, _shuffle(builder, unpacked[1], [2 * g] * 8 + [2 * g + 1] * 8)


def _q6_K_finish(builder, unpacked, total, isum, bsums, yd):
    """sumf + (d * yd) * (isum - 32 * sum_j scales[j] * (y's sum over sub-block j)), the numba loop's order."""
    v16 = ir.VectorType(_I32, 16)
    offset = _reduce_add_i32(builder, builder.mul(builder.sext(unpacked[1], v16), bsums, flags=["nsw"]), 16)
    isum = builder.sub(isum, builder.shl(offset, ir.Constant(_I32, 5)))
    return builder.fadd(total, builder.fmul(builder.fmul(unpacked[0], yd), builder.sitofp(isum, _F32)))


# ggml's AVX2 ggml_vec_dot_q4_K_q8_K / q6_K_q8_K float order (numerics "x86"): the 8 int32 lanes of a
# super-block's scaled sums (the lanes _scaled_sums makes, 4 consecutive products of every group each) times
# d = y.d * x.d into one 8-lane FMA accumulator, hsum_float_8 at the end; Q4_K's mins apart, 4 lanes.
_Q4_K_X86_STATE = (8, 4)  # acc, acc_m
_Q6_K_X86_STATE = (8,)


def _q4_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(d, lanes, acc); acc_m = fma(-y.d * x.dmin, prod, acc_m), prod lane k = mins[2k] * q8s[2k] +
    mins[2k + 1] * q8s[2k + 1], q8s[j] = bsums[2j] + bsums[2j + 1] (_mm_hadd_epi16, _mm_madd_epi16)."""
    v8f, v4f, v8 = ir.VectorType(_F32, 8), ir.VectorType(_F32, 4), ir.VectorType(_I32, 8)
    d = builder.fmul(yd, unpacked[0])
    acc = _fma(builder, _splat(builder, d, 8), builder.sitofp(iacc, v8f), state[0])
    products = builder.mul(builder.zext(unpacked[3], v8), _pair_sums(builder, bsums), flags=["nsw"])
    prod = builder.add(_shuffle(builder, products, [0, 2, 4, 6]), _shuffle(builder, products, [1, 3, 5, 7]))
    dmin = builder.fmul(builder.fneg(yd), unpacked[1])
    acc_m = _fma(builder, _splat(builder, dmin, 4), builder.sitofp(prod, v4f), state[1])
    return [acc, acc_m]


def _q4_K_x86_result(builder, state):
    """hsum_float_8(acc) + acc_m's 4 lanes summed as ggml (movehl, then movehdup)."""
    return builder.fadd(_sum_f32_tree(builder, state[0], 8), _sum_f32_tree(builder, state[1], 4))


def _q6_K_x86_block(builder, unpacked, state, iacc, bsums, yd):
    """acc = fma(d, lanes - 32 * q8sclsub, acc), q8sclsub lane k = bsums[2k] * scales[2k] + bsums[2k + 1] *
    scales[2k + 1] (_mm256_madd_epi16), as ggml subtracts the offset lane by lane."""
    v8f, v16 = ir.VectorType(_F32, 8), ir.VectorType(_I32, 16)
    sub = _pair_sums(builder, builder.mul(builder.sext(unpacked[1], v16), bsums, flags=["nsw"]))
    lanes = builder.sub(iacc, builder.shl(sub, ir.Constant(ir.VectorType(_I32, 8), [5] * 8)))
    d = builder.fmul(yd, unpacked[0])
    return [_fma(builder, _splat(builder, d, 8), builder.sitofp(lanes, v8f), state[0])]


def _q6_K_x86_result(builder, state):
    return _sum_f32_tree(builder, state[0], 8)


def _make_dot_k_row(block_bytes: int, unpack, group, finish, scaled_sums=None, x86=None, ncols: int = 1):
    """The row loop of a K-quant (super-blocks of 256 values, `block_bytes` each) against Q8_K: per
    super-block `unpack(builder, pb)` once, then for each of its 8 groups of 32 values `group(builder, pb,
    unpacked, g)` -> (values 0..63 as <32 x i8>, <16 x i16> pair scales), exact int32 lanes of scaled sums
    per column, and `finish(builder, unpacked, sumf, isum, bsums, yd)` -> the column's new float sum (bsums:
    Q8_K's 16 sums of 16 as <16 x i32>).

    Signatures as _make_dot_q_row's (yb: Q8_K's bsums, 16 per super-block). Each column's sum is the same
    bits as with `ncols` 1. `scaled_sums`: the group's integer sums (the target's _scaled_sums if None).
    `x86`: (state lane counts, block, result), ggml's AVX2 float order instead of `finish`: float vector
    accumulators per column, `block(builder, unpacked, state, lanes, bsums, yd)` -> the new state per
    super-block (lanes: the 8 int32 lanes of its scaled sums), `result(builder, state)` -> the dot.
    """
    v8i32 = ir.VectorType(_I32, 8)
    scaled_sums = _scaled_sums if scaled_sums is None else scaled_sums

    def row_loop(builder, pw, nb, cols):
        if x86 is not None:
            widths, x86_block, x86_result = x86
            states = [[cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(_F32, n), [0.0] * n))
                       for n in widths] for _ in cols]
        sums = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            unpacked = unpack(builder, pb)
            iacc = [ir.Constant(v8i32, [0] * 8) for _ in cols]
            for g in range(8):
                v, scales = group(builder, pb, unpacked, g)
                for c, (py, _, _) in enumerate(cols):
                    at = builder.add(builder.shl(b, ir.Constant(b.type, 8)), ir.Constant(b.type, 32 * g))
                    yv = _load_vector(builder, builder.gep(py, [at]), _I8, 32)
                    iacc[c] = builder.add(iacc[c], scaled_sums(builder, v, yv, scales))
            for c, (_, pd, ps) in enumerate(cols):
                bsums = _load_vector(builder, builder.gep(ps, [builder.shl(b, ir.Constant(b.type, 4))]), _I32, 16)
                yd = builder.load(builder.gep(pd, [b]))
                if x86 is not None:
                    state = x86_block(builder, unpacked, [builder.load(a) for a in states[c]], iacc[c], bsums, yd)
                    for a, v in zip(states[c], state, strict=True):
                        builder.store(v, a)
                    continue
                isum = _reduce_add_i32(builder, iacc[c], 8)
                builder.store(finish(builder, unpacked, builder.load(sums[c]), isum, bsums, yd), sums[c])
        if x86 is not None:
            return [x86_result(builder, [builder.load(a) for a in state]) for state in states]
        return [builder.load(total) for total in sums]

    return _block_row_intrinsic(row_loop, ncols)


_Q4_K_SPEC = {"block_bytes": 144, "unpack": _q4_K_unpack, "group": _q4_K_group, "finish": _q4_K_finish}
_Q6_K_SPEC = {"block_bytes": 210, "unpack": _q6_K_unpack, "group": _q6_K_group, "finish": _q6_K_finish}
dot_q4_K_cols = _make_dot_k_row(**_Q4_K_SPEC, ncols=COLS)
dot_q4_K_cols.__doc__ = "Q4_K weight rows times Q8_K src1 rows (see _make_dot_k_row): 8 scales and mins a super-block."
dot_q6_K_cols = _make_dot_k_row(**_Q6_K_SPEC, ncols=COLS)
dot_q6_K_cols.__doc__ = "Q6_K weight rows times Q8_K src1 rows (see _make_dot_k_row): 16 int8 scales, values - 32."
_Q4_K_X86 = (_Q4_K_X86_STATE, _q4_K_x86_block, _q4_K_x86_result)
_Q6_K_X86 = (_Q6_K_X86_STATE, _q6_K_x86_block, _q6_K_x86_result)
dot_q4_K_cols_x86 = _make_dot_k_row(**_Q4_K_SPEC, x86=_Q4_K_X86, ncols=COLS)
dot_q4_K_cols_x86.__doc__ = "dot_q4_K_cols in the order of ggml's AVX2 ggml_vec_dot_q4_K_q8_K (FMA lanes, mins apart)."
dot_q6_K_cols_x86 = _make_dot_k_row(**_Q6_K_SPEC, x86=_Q6_K_X86, ncols=COLS)
dot_q6_K_cols_x86.__doc__ = "dot_q6_K_cols in the order of ggml's AVX2 ggml_vec_dot_q6_K_q8_K (FMA lanes)."


# --- table types: IQ4_NL, IQ4_XS, MXFP4 (a 4-bit quant indexes 16 int8 values) ---


def _lookup_avx2(builder, table: list[int], idx):
    """table[idx] for a <32 x i8> of indices 0..15: one vpshufb (the table in both 128-bit lanes)."""
    v32i8 = ir.VectorType(_I8, 32)
    pshufb = builder.module.declare_intrinsic("llvm.x86.avx2.pshuf.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    return builder.call(pshufb, [ir.Constant(v32i8, [v & 0xFF for v in table] * 2), idx])


def _lookup_portable(builder, table: list[int], idx):
    """table[idx] for a <32 x i8> of indices 0..15: a compare and select per table entry."""
    v32i8 = ir.VectorType(_I8, 32)
    out = ir.Constant(v32i8, [table[0] & 0xFF] * 32)
    for k in range(1, 16):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(v32i8, [k] * 32))
        out = builder.select(hit, ir.Constant(v32i8, [table[k] & 0xFF] * 32), out)
    return out


_lookup = _lookup_avx2 if _HAS_AVX2 else _lookup_portable


def _table_values(table: list[int]):
    """A `values` reader for _make_dot_q_row: the 32 table values of the 16 nibble bytes at p (low nibbles
    first, as Q4_0's)."""
    def values(builder, p):
        return _lookup(builder, table, _q4_0_nibbles(builder, p))

    return values


_IQ4_NL_SPEC = {"block_bytes": 18, "values": _table_values(_TABLES[IQ4_NL])}
_MXFP4_SPEC = {"block_bytes": 17, "values": _table_values(_TABLES[MXFP4]), "scale": _e8m0_scale, "values_offset": 1}
dot_iq4_nl_cols = _make_dot_q_row(**_IQ4_NL_SPEC, ncols=COLS)
dot_iq4_nl_cols.__doc__ = "As dot_q8_0_cols for IQ4_NL weight rows (values kvalues_iq4nl[nibble])."
dot_mxfp4_cols = _make_dot_q_row(**_MXFP4_SPEC, ncols=COLS)
dot_mxfp4_cols.__doc__ = ("As dot_q8_0_cols for MXFP4 weight rows (values kvalues_mxfp4[nibble], scale 2^(e - 128) "
                          "from the block's first byte).")


@intrinsic
def dot_iq4_32(typingctx, w, i, yq, j):
    """sum_t kvalues_iq4nl[nibble t of the 16 bytes at w[i]] * yq[j+t], t < 32 (exact int32): an IQ4_XS
    sub-block."""
    sig = types.int32(w, types.intp, yq, types.intp)

    def codegen(context, builder, signature, args):
        pw = _address(context, builder, signature.args[0], args[0], args[1])
        py = _address(context, builder, signature.args[2], args[2], args[3])
        wv = _lookup(builder, _TABLES[IQ4_XS], _q4_0_nibbles(builder, pw))
        return _reduce_add_i32(builder, _block_sums(builder, wv, _load_vector(builder, py, _I8, 32)), 8)

    return sig, codegen


@intrinsic
def load_e8m0_half(typingctx, w, i):
    """ggml_e8m0_to_fp32_half of the byte at offset `i` of uint8 array `w` (MXFP4's scale)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        return _e8m0_half(builder, builder.load(_address(context, builder, signature.args[0], args[0], args[1])))

    return sig, codegen


def _make_deq_table32(kind: int):
    @intrinsic
    def deq_table32(typingctx, w, i, d, out, j):
        sig = types.void(w, types.intp, types.float32, out, types.intp)

        def codegen(context, builder, signature, args):
            pw = _address(context, builder, signature.args[0], args[0], args[1])
            v = _lookup(builder, _TABLES[kind], _q4_0_nibbles(builder, pw))
            vf = ir.VectorType(_F32, 32)
            f = builder.fmul(_splat(builder, args[2], 32), builder.sitofp(v, vf))  # ggml: d * kvalues[q]
            po = _address(context, builder, signature.args[3], args[3], args[4])
            builder.store(f, builder.bitcast(po, vf.as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return deq_table32


deq_iq4_32 = _make_deq_table32(IQ4_NL)
deq_iq4_32.__doc__ = "out[j+t] = d * kvalues_iq4nl[nibble t of the 16 bytes at w[i]], t < 32."
deq_mxfp4_32 = _make_deq_table32(MXFP4)
deq_mxfp4_32.__doc__ = "out[j+t] = d * kvalues_mxfp4[nibble t of the 16 bytes at w[i]], t < 32."


def _store_scaled(builder, context, signature, args, v, n: int, d, bias, out_arg: int):
    """out[j+t] = float(v[t]) * d + bias (an fmul then an fadd, as ggml's dequantize_row code)."""
    vf = ir.VectorType(_F32, n)
    f = builder.fadd(builder.fmul(builder.sitofp(v, vf), _splat(builder, d, n)), _splat(builder, bias, n))
    po = _address(context, builder, signature.args[out_arg], args[out_arg], args[out_arg + 1])
    builder.store(f, builder.bitcast(po, vf.as_pointer()), align=1)
    return context.get_dummy_value()


def _make_deq_fields(n: int):
    @intrinsic
    def deq_fields(typingctx, w, i1, s1, m1, i2, s2, m2, mul2, off, d, bias, out, j):
        ip = types.intp
        sig = types.void(w, ip, ip, ip, ip, ip, ip, ip, ip, types.float32, types.float32, out, ip)

        def codegen(context, builder, signature, args):
            v32 = ir.VectorType(_I32, n)

            def field(pos: int) -> ir.Value:
                p = _address(context, builder, signature.args[0], args[0], args[pos])
                q = builder.zext(_load_vector(builder, p, _I8, n), v32)
                sh = _splat(builder, builder.trunc(args[pos + 1], _I32), n)
                return builder.and_(builder.lshr(q, sh), _splat(builder, builder.trunc(args[pos + 2], _I32), n))

            v = builder.add(field(1), builder.mul(field(4), _splat(builder, builder.trunc(args[7], _I32), n)))
            v = builder.add(v, _splat(builder, builder.trunc(args[8], _I32), n))
            return _store_scaled(builder, context, signature, args, v, n, args[9], args[10], 11)

        return sig, codegen

    return deq_fields


deq_fields16 = _make_deq_fields(16)
_DEQ_DOC = "out[j+t] = float(((w[i1+t] >> s1) & m1) + ((w[i2+t] >> s2) & m2) * mul2 + off) * d + bias, t < {}."
deq_fields16.__doc__ = _DEQ_DOC.format(16)
deq_fields32 = _make_deq_fields(32)
deq_fields32.__doc__ = _DEQ_DOC.format(32)


@intrinsic
def deq_q5(typingctx, w, i, bits, off, d, bias, out, j):
    """A Q5_0/Q5_1 block: out[j+e] = float(nibble_e | ((bits >> e) & 1) << 4) + off) * d + bias, e < 32."""
    ip = types.intp
    sig = types.void(w, ip, types.uint32, ip, types.float32, types.float32, out, ip)

    def codegen(context, builder, signature, args):
        v32 = ir.VectorType(_I32, 32)
        pw = _address(context, builder, signature.args[0], args[0], args[1])
        q = _load_vector(builder, pw, _I8, 16)
        lo = builder.and_(q, ir.Constant(ir.VectorType(_I8, 16), [15] * 16))
        hi = builder.lshr(q, ir.Constant(ir.VectorType(_I8, 16), [4] * 16))
        nib = builder.zext(builder.shuffle_vector(lo, hi, ir.Constant(v32, list(range(32)))), v32)
        hb = builder.lshr(_splat(builder, args[2], 32), ir.Constant(v32, list(range(32))))
        hb = builder.shl(builder.and_(hb, ir.Constant(v32, [1] * 32)), ir.Constant(v32, [4] * 32))
        v = builder.add(builder.or_(nib, hb), _splat(builder, builder.trunc(args[3], _I32), 32))
        return _store_scaled(builder, context, signature, args, v, 32, args[4], args[5], 6)

    return sig, codegen


# --- src1 -> vec_dot_type (ggml's quantize_row_q8_0 / q8_1: reference or x86; q8_K) ---

# numerics codes (pyggml.backends.cpu.numerics.NUMERICS_CODES): numba compiles on ints
ROUND_REF = 0
ROUND_X86 = 1


@njit(nogil=True, cache=True)
def _roundf(v: float) -> int:
    """C's roundf: nearest integer, halves away from zero (exact: |v| + 0.5 is exact in float64)."""
    a = np.floor(abs(np.float64(v)) + 0.5)
    return int(a) if v >= 0 else -int(a)


@intrinsic
def abs_max32(typingctx, x, i):
    """max |x[i+t]|, t < 32 (float32 array, flat index), as the integer maximum of the bit patterns with the sign
    cleared: for floats that are not NaN the order of their bits, so the exact max in any order; a NaN among
    them gives a NaN (the callers then take ggml's left-to-right MAX, where the order matters)."""
    sig = types.float32(x, types.intp)

    def codegen(context, builder, signature, args):
        v = _load_vector(builder, _address(context, builder, signature.args[0], args[0], args[1]), _I32, 32)
        v = builder.and_(v, ir.Constant(ir.VectorType(_I32, 32), [0x7FFFFFFF] * 32))
        fnty = ir.FunctionType(_I32, [v.type])
        m = builder.call(builder.module.declare_intrinsic("llvm.vector.reduce.smax.v32i32", fnty=fnty), [v])
        return builder.bitcast(m, _F32)

    return sig, codegen


def _make_quantize_block32(rounding: int):
    @intrinsic
    def quantize_block32(typingctx, x, i, mul, yq, j, yb, k):
        sig = types.int32(x, types.intp, types.float32, yq, types.intp, yb, types.intp)

        def codegen(context, builder, signature, args):
            vf = ir.VectorType(_F32, 32)
            v = _load_vector(builder, _address(context, builder, signature.args[0], args[0], args[1]), _F32, 32)
            p = builder.fmul(v, _splat(builder, args[2], 32))  # the float32 products, as both C paths
            name = "llvm.rint.v32f32" if rounding == ROUND_X86 else "llvm.round.v32f32"
            q = builder.call(builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vf, [vf])), [p])
            q32 = builder.fptosi(q, ir.VectorType(_I32, 32))
            py = _address(context, builder, signature.args[3], args[3], args[4])
            builder.store(builder.trunc(q32, ir.VectorType(_I8, 32)),
                          builder.bitcast(py, ir.VectorType(_I8, 32).as_pointer()), align=1)
            half = ir.VectorType(_I32, 16)
            s0 = _reduce_add_i32(builder, builder.shuffle_vector(q32, q32, ir.Constant(half, list(range(16)))), 16)
            s1 = _reduce_add_i32(builder, builder.shuffle_vector(q32, q32, ir.Constant(half, list(range(16, 32)))),
                                 16)
            pb = _address(context, builder, signature.args[5], args[5], args[6])
            builder.store(s0, pb)
            builder.store(s1, builder.gep(pb, [ir.Constant(args[6].type, 1)]))
            return builder.add(s0, s1)

        return sig, codegen

    return quantize_block32


quantize_block32_x86 = _make_quantize_block32(ROUND_X86)
quantize_block32_x86.__doc__ = ("yq[j+t] = the float32 x[i+t] * mul rounded half to even (_mm256_round_ps), t < 32; "
                                "yb[k], yb[k+1] the sums of the first and last 16; returns their total.")
quantize_block32_ref = _make_quantize_block32(ROUND_REF)
quantize_block32_ref.__doc__ = "As quantize_block32_x86, rounded halves away from zero (roundf)."


@njit(nogil=True, cache=True)
def _q8_block_scalar(x, yq, yb, r, b, rounding):
    """Quantize block b (32 values) of row r into yq and yb, one value at a time; returns (amax / 127, sum of
    the quants). ggml's MAX left to right: rows holding an inf or NaN come here (see _quantize_q8_row).

    ROUND_REF, quantize_row_q8_0_ref: v * (1 / d), roundf. ROUND_X86, the AVX2 quantize_row_q8_0/q8_1:
    v * (127 / amax) in float32, rounded half to even (_mm256_round_ps, _MM_ROUND_NEAREST).
    """
    k0 = b * 32
    amax = np.float32(0.0)
    for t in range(32):
        v = abs(x[r, k0 + t])
        amax = amax if amax > v else v  # ggml's MAX(amax, fabsf(v)) (the x86 max_ps tree gives the same)
    d = amax / np.float32(127.0)
    if rounding == ROUND_X86:
        mul = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    else:
        mul = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    s0 = 0
    s1 = 0
    for t in range(32):
        p = x[r, k0 + t] * mul  # float32 product, as both C paths
        q = int(np.rint(p)) if rounding == ROUND_X86 else _roundf(p)
        yq[r, k0 + t] = q
        if t < 16:
            s0 += q
        else:
            s1 += q
    yb[r, 2 * b] = s0
    yb[r, 2 * b + 1] = s1
    return d, s0 + s1


@njit(nogil=True, cache=True)
def _quantize_q8_row(x, yq, yd, ys, yb, r, rounding, with_s):
    """Row r of x (C-contiguous, as yq and yb) to Q8_0 blocks, or Q8_1 (`with_s`: ys = f16(sum * d) from the
    unrounded d, on both paths); the scales d = amax / 127 rounded through f16 (as block_q8_0/q8_1 store them,
    and the dots read them back). Q8_0 uses ys as scratch.

    Why in three passes (a row's maxima, then its scales, then the values): each pass is 32 or 8 lanes at once
    (abs_max32, the divisions of the scales, quantize_block32_*), faster than block by block, and IEEE's
    max and divisions give the same bits in any grouping. A row holding an inf or NaN takes the scalar loop
    (_q8_block_scalar), where ggml's MAX order and the conversions of non-finite products are kept."""
    nb = x.shape[1] // 32
    o = r * x.shape[1]
    finite = True
    for b in range(nb):
        amax = abs_max32(x, o + 32 * b)
        finite &= amax < np.float32(np.inf)
        yd[r, b] = amax
    if not finite:
        for b in range(nb):
            d, total = _q8_block_scalar(x, yq, yb, r, b, rounding)
            _store_scales(yd, ys, r, b, d, total, with_s)
        return
    zero = np.float32(0.0)
    for b in range(nb):  # ys: the multiplier of each block's values
        amax = yd[r, b]
        d = amax / np.float32(127.0)
        if rounding == ROUND_X86:
            ys[r, b] = np.float32(127.0) / amax if amax != zero else zero
        else:
            ys[r, b] = np.float32(1.0) / d if d != zero else zero
        yd[r, b] = d
    ob = r * yb.shape[1]
    for b in range(nb):
        if rounding == ROUND_X86:
            total = quantize_block32_x86(x, o + 32 * b, ys[r, b], yq, o + 32 * b, yb, ob + 2 * b)
        else:
            total = quantize_block32_ref(x, o + 32 * b, ys[r, b], yq, o + 32 * b, yb, ob + 2 * b)
        _store_scales(yd, ys, r, b, yd[r, b], total, with_s)


@njit(nogil=True, cache=True, inline="always")
def _store_scales(yd, ys, r, b, d, total, with_s):
    """Block b's d rounded through f16 into yd, and for Q8_1 (`with_s`) s = f16(sum * d) from the unrounded d
    into ys: what block_q8_0/q8_1 store and the dots read back."""
    yd[r, b] = round_f16(d)
    if with_s:
        ys[r, b] = round_f16(np.float32(total) * d)


@njit(nogil=True, cache=True, error_model="numpy")  # C's division: an infinite value's scale is 1/-0.0, not an error
def _quantize_q8_K_row(x, yq, yd, yb, r):
    nb = x.shape[1] // 256
    for b in range(nb):
        k0 = b * 256
        amax = np.float32(0.0)
        vmax = np.float32(0.0)
        for t in range(256):
            v = abs(x[r, k0 + t])
            if v > amax:
                amax = v
                vmax = x[r, k0 + t]
        if amax == 0:
            yd[r, b] = 0.0
            for t in range(256):
                yq[r, k0 + t] = 0
            for t in range(16):
                yb[r, 16 * b + t] = 0
            continue
        iscale = np.float32(-127.0) / vmax  # -128 until 2024
        for t in range(256):
            # nearest_int: the float32 product rounded half to even
            q = int(np.rint(np.float64(iscale * x[r, k0 + t])))
            yq[r, k0 + t] = min(127, q)
        for g in range(16):
            s = 0
            for t in range(16):
                s += yq[r, k0 + 16 * g + t]
            yb[r, 16 * b + g] = s
        yd[r, b] = np.float32(1.0) / iscale


@njit(nogil=True, cache=True)
def quantize_rows(kind, x, yq, yd, ys, yb, rounding):
    """Quantize float32 rows x (n, K) to `kind` (Q8_0, Q8_1 or Q8_K), split as described in the module doc;
    Q8_0 and Q8_1 with `rounding` (ROUND_REF or ROUND_X86), Q8_K as ggml does on every path.

    One thread: the rows of one MUL_MAT's src1 are few when its direct kernels run (fewer than
    BLAS_MIN_COLS columns per matrix), and on the BLAS path numba stays on one thread (see matmul.py).
    x, yq and yb must be C-contiguous (the blocks are read and written 32 values at once).
    """
    if not (x.flags.c_contiguous and yq.flags.c_contiguous and yb.flags.c_contiguous):
        raise ValueError("quantize_rows: x, yq and yb must be C-contiguous")
    for r in range(x.shape[0]):
        if kind == Q8_0 or kind == Q8_1:
            _quantize_q8_row(x, yq, yd, ys, yb, r, rounding, kind == Q8_1)
        else:
            _quantize_q8_K_row(x, yq, yd, yb, r)


@njit(nogil=True, cache=True)
def round_rows(kind, x):
    """Round float32 values in place to `kind` (F16 or BF16) and back: src1 converted to vec_dot_type."""
    flat = x.reshape(-1)
    if kind == F16:
        for k in range(flat.shape[0]):
            flat[k] = round_f16(flat[k])
        return
    bits = flat.view(np.uint32)
    for k in range(bits.shape[0]):
        u = bits[k]
        if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            bits[k] = (u | np.uint32(0x400000)) & np.uint32(0xFFFF0000)  # NaN stays a quiet NaN
        else:
            bits[k] = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


# --- vec_dot per weight type: one weight row (at byte o of w) times src1 row r ---


@njit(nogil=True, cache=True)
def _i8(v: int) -> int:
    """A byte read as int8."""
    return v - 256 if v > 127 else v


@njit(nogil=True, cache=True)
def _dot_q5_1(w, o, nb, yq, yd, ys, r):
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 24 * b
        j = yo + 32 * b
        sumi = dot_nibbles(w, ob + 8, yq, j) + 16 * dot_mask32(load_u32(w, ob + 4), yq, j)
        sumf += (load_f16(w, ob) * yd[r, b]) * np.float32(sumi) + load_f16(w, ob + 2) * ys[r, b]
    return sumf


@njit(nogil=True, cache=True)
def _dot_q2_K(w, o, nb, yq, yd, yb, r):
    # block_q2_K: scales[16] (low 4 bits scale, high 4 bits min), qs[64], d, dmin
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 84 * b
        j0 = yo + 256 * b
        summs = 0
        for t in range(16):
            summs += yb[r, 16 * b + t] * (np.int64(w[ob + t]) >> 4)
        isum = 0
        for k in range(2):
            for f in range(4):
                for h in range(2):
                    sc = np.int64(w[ob + 8 * k + 2 * f + h]) & 15
                    isum += sc * dot_bits16(w, ob + 16 + 32 * k + 16 * h, 2 * f, 3, yq, j0 + 128 * k + 32 * f + 16 * h)
        dall = yd[r, b] * load_f16(w, ob + 80)
        dmin = yd[r, b] * load_f16(w, ob + 82)
        sumf += dall * np.float32(isum) - dmin * np.float32(summs)
    return sumf


@njit(nogil=True, cache=True)
def _q3_K_scale(w, os, sub):
    """The 6-bit scale `sub` (0..15) of a Q3_K block whose scales start at byte os, minus 32."""
    low = (np.int64(w[os + (sub & 7)]) >> (4 * (sub >> 3))) & 15  # sub < 8: low nibble of byte sub, else high
    high = (np.int64(w[os + 8 + (sub & 3)]) >> (2 * (sub >> 2))) & 3
    return (low | (high << 4)) - 32


@njit(nogil=True, cache=True)
def _dot_q3_K(w, o, nb, yq, yd, yb, r):
    # block_q3_K: hmask[32], qs[64], scales[12], d; value = low2 - (high bit ? 0 : 4)
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 110 * b
        j0 = yo + 256 * b
        isum = 0
        for h in range(2):
            for s in range(4):
                for t in range(2):
                    sub = 8 * h + 2 * s + t
                    j = j0 + 128 * h + 32 * s + 16 * t
                    v = (dot_fields16(w, ob + 32 + 32 * h + 16 * t, 2 * s, 3, ob + 16 * t, 4 * h + s, 1, 4, yq, j)
                         - 4 * yb[r, 16 * b + sub])
                    isum += _q3_K_scale(w, ob + 96, sub) * v
        sumf += (load_f16(w, ob + 108) * yd[r, b]) * np.float32(isum)
    return sumf


@njit(nogil=True, cache=True)
def _scale_min_k4(w, os, j):
    """ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7), scales starting at byte os."""
    if j < 4:
        return np.int64(w[os + j]) & 63, np.int64(w[os + j + 4]) & 63
    sc = (np.int64(w[os + j + 4]) & 15) | ((np.int64(w[os + j - 4]) >> 6) << 4)
    mn = (np.int64(w[os + j + 4]) >> 4) | ((np.int64(w[os + j]) >> 6) << 4)
    return sc, mn


@njit(nogil=True, cache=True)
def _dot_q5_K(w, o, nb, yq, yd, yb, r):
    # block_q5_K: d, dmin, scales[12], qh[32], qs[128]; fifth bit of element 64k+32h+l is bit 2k+h of qh[l]
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 176 * b
        j0 = yo + 256 * b
        isum = 0
        summs = 0
        for k in range(4):
            sc0, m0 = _scale_min_k4(w, ob + 4, 2 * k)
            sc1, m1 = _scale_min_k4(w, ob + 4, 2 * k + 1)
            j = j0 + 64 * k
            isum += sc0 * dot_fields32(w, ob + 48 + 32 * k, 0, 15, ob + 16, 2 * k, 1, 16, yq, j)
            isum += sc1 * dot_fields32(w, ob + 48 + 32 * k, 4, 15, ob + 16, 2 * k + 1, 1, 16, yq, j + 32)
            g = 16 * b + 4 * k
            summs += m0 * (yb[r, g] + yb[r, g + 1]) + m1 * (yb[r, g + 2] + yb[r, g + 3])
        d = load_f16(w, ob) * yd[r, b]
        dmin = load_f16(w, ob + 2) * yd[r, b]
        sumf += d * np.float32(isum) - dmin * np.float32(summs)
    return sumf


@njit(nogil=True, cache=True)
def _iq4_xs_scale(w, ob, ib):
    """The 6-bit scale of sub-block ib (0..7) of the IQ4_XS block at byte ob, minus 32."""
    low = (np.int64(w[ob + 4 + (ib >> 1)]) >> (4 * (ib & 1))) & 15
    high = ((np.int64(w[ob + 2]) | (np.int64(w[ob + 3]) << 8)) >> (2 * ib)) & 3
    return (low | (high << 4)) - 32


@njit(nogil=True, cache=True)
def _dot_iq4_xs(w, o, nb, yq, yd, yb, r):
    # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32 (ggml_vec_dot_iq4_xs_q8_K)
    sumf = np.float32(0.0)
    yo = r * yq.shape[1]
    for b in range(nb):
        ob = o + 136 * b
        d4d8 = load_f16(w, ob) * yd[r, b]
        for ib in range(8):
            sumi = dot_iq4_32(w, ob + 8 + 16 * ib, yq, yo + 256 * b + 32 * ib)
            sumf += (d4d8 * np.float32(_iq4_xs_scale(w, ob, ib))) * np.float32(sumi)
    return sumf


@njit(nogil=True, cache=True, inline="always")
def _mul_mat_range(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
    """Weight rows m0..m1 of output slice s against that slice's n_cols src1 rows (Q8_0, Q4_0, Q5_0, Q4_1,
    Q4_K and Q6_K rows in ggml's x86 order with `rounding` ROUND_X86, see `_make_dot_q_row`).

    One loop per weight type, each calling one dot function: choosing the
    function per row instead cost more than a short row's arithmetic (numba
    keeps every callee's argument references alive around the choice). The
    row-loop types' dot functions are inlined (numba `inline="always"`): a
    call with array arguments costs reference counting on every row. Inlined itself, into a
    job of one weight type (`_make_mul_mat_job`), whose constant `kind` and
    `rounding` prune the other branches before they are compiled.
    """
    base = w_base[s]
    r0 = s * n_cols
    r1 = r0 + n_cols
    if kind == Q4_0_X8:
        for r in range(r0, r1, COLS):
            dot_q4_0_x8_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind >= X8_TILE:  # X8_TILE_KINDS: this item's rows repacked into a tile, whose row m0 is at offs[0]
        t = kind - X8_TILE
        for t0 in range(m0, m1, TILE_ROWS):
            t1 = min(m1, t0 + TILE_ROWS)
            tile, offs = _tile_x8(w, w_off, base, t0, t1, nb, t)
            for r in range(r0, r1, COLS):
                if t == Q8_0:
                    dot_q8_0_x8_cols(tile, offs, -t0, t0, t1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
                elif t == Q5_0:
                    dot_q5_0_x8_cols(tile, offs, -t0, t0, t1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
                else:
                    dot_q4_0_x8_cols(tile, offs, -t0, t0, t1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q4_0 and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q4_0_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q4_0:
        for r in range(r0, r1, COLS):
            dot_q4_0_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q4_1 and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q4_1_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, ys, r, min(COLS, r1 - r), out)
    elif kind == Q4_1:
        for r in range(r0, r1, COLS):
            dot_q4_1_cols(w, w_off, base, m0, m1, nb, yq, yd, ys, r, min(COLS, r1 - r), out)
    elif kind == Q5_0 and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q5_0_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q5_0:
        for r in range(r0, r1, COLS):
            dot_q5_0_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q5_1:
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = _dot_q5_1(w, o, nb, yq, yd, ys, r)
    elif kind == Q8_0 and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q8_0_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q8_0:
        for r in range(r0, r1, COLS):
            dot_q8_0_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q2_K:
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = _dot_q2_K(w, o, nb, yq, yd, yb, r)
    elif kind == Q3_K:
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = _dot_q3_K(w, o, nb, yq, yd, yb, r)
    elif kind == Q4_K and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q4_K_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q4_K:
        for r in range(r0, r1, COLS):
            dot_q4_K_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q5_K:
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = _dot_q5_K(w, o, nb, yq, yd, yb, r)
    elif kind == Q6_K and rounding == ROUND_X86:
        for r in range(r0, r1, COLS):
            dot_q6_K_cols_x86(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == Q6_K:
        for r in range(r0, r1, COLS):
            dot_q6_K_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == IQ4_NL:
        for r in range(r0, r1, COLS):
            dot_iq4_nl_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == IQ4_XS:
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = _dot_iq4_xs(w, o, nb, yq, yd, yb, r)
    elif kind == MXFP4:
        for r in range(r0, r1, COLS):
            dot_mxfp4_cols(w, w_off, base, m0, m1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)
    elif kind == F16:
        for r in range(r0, r1, COLS):
            dot_f16_cols(w, w_off, base, m0, m1, xf, r, min(COLS, r1 - r), out)
    elif kind == BF16:
        for r in range(r0, r1, COLS):
            dot_bf16_cols(w, w_off, base, m0, m1, xf, r, min(COLS, r1 - r), out)
    elif kind == F32:
        for r in range(r0, r1, COLS):
            dot_f32_cols(w, w_off, base, m0, m1, xf, r, min(COLS, r1 - r), out)


@njit(nogil=True, cache=True, inline="always")
def mul_mat_rows(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, chunk, ctr, wait, wait_polls,
                 rounding):
    """out[s*n_cols + c, m] = vec_dot(weight row w_off[w_base[s] + m], src1 row s*n_cols + c).

    `w` is the weights' memory as bytes, `w_off` the byte offset of every weight
    row, `w_base[s]` the first weight row (index into w_off) of output slice s,
    `nb` the blocks per row. src1 rows come as `xf` (F16/BF16 weights) or as the
    split quantized arrays. `rounding` (ROUND_REF or ROUND_X86) picks the float
    order of the Q8_0, Q4_0, Q5_0, Q4_1, Q4_K and Q6_K dots (see `_make_dot_q_row`,
    `_make_dot_k_row`).

    Several threads call this at once with the same arguments (see
    `pyggml.backends.cpu.kernels.threads`): work items, (slice, chunk of `chunk`
    weight rows), are taken one at a time from the counter `ctr[0]` (atomic
    fetch-and-add) and counted done in `ctr[1]`, so a thread that starts late
    or is descheduled takes fewer items instead of holding the others up. The
    caller's thread (`wait`) returns only when every item is done: it polls
    `wait_polls` times (the workers' spin time), then sleeps WAIT_SLEEP_US
    between looks, so that a worker descheduled with an item (its core busy
    with another process) can be scheduled on the caller's core.
    """
    n_slices = w_base.shape[0]
    M = out.shape[1]
    n_chunks = (M + chunk - 1) // chunk
    total = n_slices * n_chunks
    while True:
        item = atomic_add(ctr, 0, 1)
        if item >= total:
            break
        s = item // n_chunks
        m0 = (item % n_chunks) * chunk
        _mul_mat_range(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, min(M, m0 + chunk),
                       rounding)
        atomic_add(ctr, 1, 1)
    if wait:
        polls = 0
        while atomic_load(ctr, 1) < total:
            if polls < wait_polls:
                spin_pause()
                polls += 1
            else:
                sleep_us(WAIT_SLEEP_US)


# --- MUL_MAT's rows as a job of threads.WorkerPool: the operands by address ---

# the fields of a job (mul_mat_desc), from element 1 of a slot (element 0 is its state); the last one is the
# address of the compiled job of the weight type (threads.call_job calls it)
_JOB_FIELDS = 32
assert 1 + _JOB_FIELDS <= SLOT_LEN
_JOB_ADDRESS = 31
# the caller's polls before it sleeps while it waits for the workers' last items (see mul_mat_rows)
WAIT_POLLS = 32
# a job of one weight type: int64 job(int64 *desc, int64 shared), as threads.call_job calls it
_JOB_SIG = types.int64(types.CPointer(types.int64), types.int64)
ROUNDING_NAMES = {ROUND_REF: "ref", ROUND_X86: "x86"}


def kind_name(kind: int) -> str:
    """A kernel kind by name: the weight type's, with `_x8` for the repacked layout and `_x8_tile` for the
    tiles repacked on the fly."""
    if kind >= X8_TILE:
        return f"{GGMLType(kind - X8_TILE).name}_x8_tile"
    if kind in X8_KINDS.values():
        return f"{GGMLType(kind - Q4_0_X8 + Q4_0).name}_x8"
    return GGMLType(kind).name


def mul_mat_desc(kind: int, w: np.ndarray, w_off: np.ndarray, nb: int, xf: np.ndarray, yq: np.ndarray,
                 yd: np.ndarray, ys: np.ndarray, yb: np.ndarray, n_cols: int, w_base: np.ndarray, out: np.ndarray,
                 chunk: int, ctr: np.ndarray, rounding: int) -> np.ndarray:
    """`mul_mat_rows`' arguments as a job (a slot's layout: element 0 unused): each array by its address and
    shape (each must be C-contiguous: the job sees it as such), the rest as numbers, and last the address of
    the job compiled for `kind` and `rounding` (compiled here the first time: see `job_address`). `chunk` 0:
    the whole product on one thread (`ctr` unused). The arrays must outlive every call of the job."""
    desc = np.zeros(SLOT_LEN, np.int64)
    fields: list[int] = [kind]
    for a, dims, dtype in ((w, 1, np.uint8), (w_off, 1, np.int64), (nb, 0, None), (xf, 2, np.float32),
                           (yq, 2, np.int8), (yd, 2, np.float32), (ys, 2, np.float32), (yb, 2, np.int32),
                           (n_cols, 0, None), (w_base, 1, np.int64), (out, 2, np.float32), (chunk, 0, None),
                           (ctr, 1, np.int64)):
        if dims == 0:
            fields.append(int(a))
            continue
        if a.dtype != dtype or a.ndim != dims or not a.flags.c_contiguous:
            raise ValueError(f"mul_mat_desc: an operand of dtype {a.dtype}, shape {a.shape} is not a C-contiguous "
                             f"{dims}-D {np.dtype(dtype)} array")
        fields += [address(a), *a.shape]
    fields += [job_address(kind, rounding), 0]  # WAIT_POLLS: the caller sets it (matmul._run_shared)
    assert len(fields) == _JOB_FIELDS
    desc[1:1 + len(fields)] = fields
    return desc


@njit(nogil=True, cache=True, inline="always")
def _run_desc(kind, d, shared, rounding):
    """The MUL_MAT rows job `d` (see mul_mat_desc): `mul_mat_rows` on its operands, items from its counter
    (`shared`: the caller's share, which returns when every item is done), or with chunk 0 the whole
    product here."""
    nb, n_cols, chunk = d[6], d[22], d[28]
    w = numba.carray(pointer_u8(d[2]), (d[3],))
    w_off = numba.carray(pointer_i64(d[4]), (d[5],))
    xf = numba.carray(pointer_f32(d[7]), (d[8], d[9]))
    yq = numba.carray(pointer_i8(d[10]), (d[11], d[12]))
    yd = numba.carray(pointer_f32(d[13]), (d[14], d[15]))
    ys = numba.carray(pointer_f32(d[16]), (d[17], d[18]))
    yb = numba.carray(pointer_i32(d[19]), (d[20], d[21]))
    w_base = numba.carray(pointer_i64(d[23]), (d[24],))
    out = numba.carray(pointer_f32(d[25]), (d[26], d[27]))
    if chunk == 0:  # one thread: each slice whole, from a counter of its own (one copy of the inlined loops)
        ctr = np.zeros(2, np.int64)
        chunk = max(out.shape[1], 1)
    else:
        ctr = numba.carray(pointer_i64(d[29]), (d[30],))
    mul_mat_rows(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, chunk, ctr, shared != 0,
                 d[WAIT_POLLS], rounding)


def _make_mul_mat_job(kind: int, rounding: int):
    """The job of one weight type and rounding: `kind` and `rounding` are constants of its code, so numba
    compiles that type's loop alone (the other branches of `_mul_mat_range` are pruned), and caches it under
    the type's name."""

    def job(p, shared):
        _run_desc(kind, numba.carray(p, (SLOT_LEN,)), shared, rounding)
        return 0

    job.__name__ = job.__qualname__ = f"mul_mat_{kind_name(kind)}_{ROUNDING_NAMES[rounding]}"
    return njit(nogil=True, cache=True)(job)


@functools.cache
def job_address(kind: int, rounding: int) -> int:
    """The address of the compiled MUL_MAT job of `kind` and `rounding` (compiled, or loaded from numba's cache,
    on the first call)."""
    if rounding not in ROUNDING_NAMES:
        raise ValueError(f"job_address: rounding {rounding} is not ROUND_REF or ROUND_X86")
    return compiled_address(_make_mul_mat_job(kind, rounding), _JOB_SIG)


@njit(nogil=True, cache=True)
def mul_mat_job(d, shared):
    """Run the MUL_MAT job `d` (see mul_mat_desc) by its compiled function; `shared` (0 or 1) as in `_run_desc`."""
    call_job(d[_JOB_ADDRESS], d, shared)


@njit(nogil=True, cache=True)
def mul_mat_spin(slot, spins):
    """A worker's loop (threads.WorkerPool's `spin`): runs the MUL_MAT jobs posted to `slot` until `spins`
    polls pass without one."""
    idle = 0
    while idle < spins:
        if claim(slot):
            call_job(slot[_JOB_ADDRESS], slot, 0)
            finish(slot)
            idle = 0
        else:
            spin_pause()
            idle += 1
            if idle % YIELD_POLLS == 0:
                yield_cpu()


@njit(nogil=True, cache=True)
def mul_mat_shared(d, slots, n):
    """The caller's share of the job `d` posted to n workers' slots, then the slots revoked."""
    call_job(d[_JOB_ADDRESS], d, 1)
    revoke(slots, n)


# --- weight rows -> float32 (ggml's dequantize_row_<type>, same arithmetic) ---


@njit(nogil=True, cache=True)
def _deq_q4_0(w, o, nb, out, i):
    oo = i * out.shape[1]
    zero = np.float32(0.0)
    for b in range(nb):
        ob = o + 18 * b
        d = load_f16(w, ob)
        deq_fields16(w, ob + 2, 0, 15, ob, 0, 0, 0, -8, d, zero, out, oo + 32 * b)
        deq_fields16(w, ob + 2, 4, 15, ob, 0, 0, 0, -8, d, zero, out, oo + 32 * b + 16)


@njit(nogil=True, cache=True)
def _deq_q4_1(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 20 * b
        d = load_f16(w, ob)
        m = load_f16(w, ob + 2)
        deq_fields16(w, ob + 4, 0, 15, ob, 0, 0, 0, 0, d, m, out, oo + 32 * b)
        deq_fields16(w, ob + 4, 4, 15, ob, 0, 0, 0, 0, d, m, out, oo + 32 * b + 16)


@njit(nogil=True, cache=True)
def _deq_q5(w, o, nb, out, i, with_min):
    """Q5_0 (22-byte blocks, value (q - 16) * d) and Q5_1 (24, value q * d + m)."""
    oo = i * out.shape[1]
    for b in range(nb):
        if with_min:
            ob = o + 24 * b
            deq_q5(w, ob + 8, load_u32(w, ob + 4), 0, load_f16(w, ob), load_f16(w, ob + 2), out, oo + 32 * b)
        else:
            ob = o + 22 * b
            deq_q5(w, ob + 6, load_u32(w, ob + 2), -16, load_f16(w, ob), np.float32(0.0), out, oo + 32 * b)


@njit(nogil=True, cache=True)
def _deq_q8_0(w, o, nb, out, i):
    # int8 = byte - 256 * (byte >> 7)
    oo = i * out.shape[1]
    zero = np.float32(0.0)
    for b in range(nb):
        ob = o + 34 * b
        deq_fields32(w, ob + 2, 0, 255, ob + 2, 7, 1, -256, 0, load_f16(w, ob), zero, out, oo + 32 * b)


@njit(nogil=True, cache=True)
def _deq_q2_K(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 84 * b
        d = load_f16(w, ob + 80)
        dmin = load_f16(w, ob + 82)
        for k in range(2):
            for f in range(4):
                for h in range(2):
                    sc = np.int64(w[ob + 8 * k + 2 * f + h])
                    dl = d * np.float32(sc & 15)
                    ml = dmin * np.float32(sc >> 4)
                    deq_fields16(w, ob + 16 + 32 * k + 16 * h, 2 * f, 3, ob, 0, 0, 0, 0, dl, -ml,
                                 out, oo + 256 * b + 128 * k + 32 * f + 16 * h)


@njit(nogil=True, cache=True)
def _deq_q3_K(w, o, nb, out, i):
    # value = low2 - (high bit ? 0 : 4) = low2 + 4 * high bit - 4
    oo = i * out.shape[1]
    zero = np.float32(0.0)
    for b in range(nb):
        ob = o + 110 * b
        d = load_f16(w, ob + 108)
        for h in range(2):
            for s in range(4):
                for t in range(2):
                    dl = d * np.float32(_q3_K_scale(w, ob + 96, 8 * h + 2 * s + t))
                    deq_fields16(w, ob + 32 + 32 * h + 16 * t, 2 * s, 3, ob + 16 * t, 4 * h + s, 1, 4, -4, dl, zero,
                                 out, oo + 256 * b + 128 * h + 32 * s + 16 * t)


@njit(nogil=True, cache=True)
def _deq_q45_K(w, o, nb, out, i, five):
    """Q4_K (144-byte blocks) and Q5_K (176, with qh[32] before qs: fifth bit of 64k+32h+l is bit 2k+h of qh[l])."""
    size = 176 if five else 144
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + size * b
        d = load_f16(w, ob)
        dmin = load_f16(w, ob + 2)
        qs = ob + (48 if five else 16)
        for k in range(4):
            for h in range(2):
                sc, mn = _scale_min_k4(w, ob + 4, 2 * k + h)
                d1 = d * np.float32(sc)
                m1 = dmin * np.float32(mn)
                deq_fields32(w, qs + 32 * k, 4 * h, 15, ob + 16, 2 * k + h, 1, 16 if five else 0, 0, d1, -m1,
                             out, oo + 256 * b + 64 * k + 32 * h)


@njit(nogil=True, cache=True)
def _deq_q6_K(w, o, nb, out, i):
    oo = i * out.shape[1]
    zero = np.float32(0.0)
    for b in range(nb):
        ob = o + 210 * b
        d = load_f16(w, ob + 208)
        for n in range(2):
            for q in range(4):
                for t in range(2):
                    sub = 8 * n + 2 * q + t
                    ds = d * np.float32(_i8(np.int64(w[ob + 192 + sub])))
                    deq_fields16(w, ob + 64 * n + 32 * (q & 1) + 16 * t, 4 * (q >> 1), 15,
                                 ob + 128 + 32 * n + 16 * t, 2 * q, 3, 16, -32, ds, zero,
                                 out, oo + 256 * b + 128 * n + 32 * q + 16 * t)


@njit(nogil=True, cache=True)
def _deq_iq4_nl(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 18 * b
        deq_iq4_32(w, ob + 2, load_f16(w, ob), out, oo + 32 * b)


@njit(nogil=True, cache=True)
def _deq_iq4_xs(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 136 * b
        d = load_f16(w, ob)
        for ib in range(8):
            deq_iq4_32(w, ob + 8 + 16 * ib, d * np.float32(_iq4_xs_scale(w, ob, ib)), out, oo + 256 * b + 32 * ib)


@njit(nogil=True, cache=True)
def _deq_mxfp4(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 17 * b
        deq_mxfp4_32(w, ob + 1, load_e8m0_half(w, ob), out, oo + 32 * b)


@njit(nogil=True, cache=True)
def _widen_half_row(kind, w, o, out, i):
    K = out.shape[1]
    oo = i * K
    k = 0
    if kind == F16:
        while k + 32 <= K:
            widen_f16x32(w, o + 2 * k, out, oo + k)
            k += 32
        while k < K:
            out[i, k] = load_f16(w, o + 2 * k)
            k += 1
    else:
        while k + 32 <= K:
            widen_bf16x32(w, o + 2 * k, out, oo + k)
            k += 32
        while k < K:
            out[i, k] = load_bf16(w, o + 2 * k)
            k += 1


@njit(nogil=True, cache=True)
def block_mins_to_f32(kind, w, w_off, r0, nb, out):
    """out[i, K + b] = the min m (f16 at byte 2) of block b of Q4_1/Q5_1 weight row w_off[r0 + i], b < nb, where
    K = out.shape[1] - nb (matmul's BLAS path puts them after the row's dequantized values)."""
    size = 20 if kind == Q4_1 else 24
    K = out.shape[1] - nb
    for i in range(out.shape[0]):
        o = w_off[r0 + i]
        for b in range(nb):
            out[i, K + b] = load_f16(w, o + size * b + 2)


def rows_to_f32(kind: int, w: np.ndarray, w_off: np.ndarray, r0: int, nb: int, out: np.ndarray) -> None:
    """out[i] = weight row w_off[r0 + i] as float32, for i < out.shape[0]; `nb` = blocks per row (a quantized
    row fills the first nb * blck_size elements of a longer out row).

    One thread: it runs between BLAS calls, whose spinning workers hold the other cores (matmul.py). Compiled
    per weight type (see `_rows_to_f32_of`), the first time that type comes.
    """
    _rows_to_f32_of(kind)(w, w_off, r0, nb, out)


@functools.cache
def _rows_to_f32_of(kind: int):
    """`rows_to_f32` of one weight type: `kind` is a constant of its code, so numba compiles that type's
    dequantization alone."""

    def rows_to_f32_of(w, w_off, r0, nb, out):
        _rows_to_f32(kind, w, w_off, r0, nb, out)

    rows_to_f32_of.__name__ = rows_to_f32_of.__qualname__ = f"rows_to_f32_{kind_name(kind)}"
    return njit(nogil=True, cache=True)(rows_to_f32_of)


@njit(nogil=True, cache=True, inline="always")
def _rows_to_f32(kind, w, w_off, r0, nb, out):
    for i in range(out.shape[0]):
        o = w_off[r0 + i]
        if kind == Q4_0:
            _deq_q4_0(w, o, nb, out, i)
        elif kind == Q4_1:
            _deq_q4_1(w, o, nb, out, i)
        elif kind == Q5_0:
            _deq_q5(w, o, nb, out, i, False)
        elif kind == Q5_1:
            _deq_q5(w, o, nb, out, i, True)
        elif kind == Q8_0:
            _deq_q8_0(w, o, nb, out, i)
        elif kind == Q2_K:
            _deq_q2_K(w, o, nb, out, i)
        elif kind == Q3_K:
            _deq_q3_K(w, o, nb, out, i)
        elif kind == Q4_K:
            _deq_q45_K(w, o, nb, out, i, False)
        elif kind == Q5_K:
            _deq_q45_K(w, o, nb, out, i, True)
        elif kind == Q6_K:
            _deq_q6_K(w, o, nb, out, i)
        elif kind == IQ4_NL:
            _deq_iq4_nl(w, o, nb, out, i)
        elif kind == IQ4_XS:
            _deq_iq4_xs(w, o, nb, out, i)
        elif kind == MXFP4:
            _deq_mxfp4(w, o, nb, out, i)
        else:
            _widen_half_row(kind, w, o, out, i)
