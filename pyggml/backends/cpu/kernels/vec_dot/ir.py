"""LLVM vector IR primitives the kernels are written in: loads, exact integer block dots, widening, FMA, prefetch,
and the weight-row and column-group scaffolding of the row loops."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import BF16, F16

# arrays come whole with an element offset (no views in the hot loops): bytes of uint8 weights, src1 elements

IR_I8 = ir.IntType(8)
IR_I16 = ir.IntType(16)
IR_I32 = ir.IntType(32)
IR_F32 = ir.FloatType()


def load_vector(builder, ptr, elem: ir.Type, n: int):
    return builder.load(builder.bitcast(ptr, ir.VectorType(elem, n).as_pointer()), align=1)


def splat(builder, value, n: int):
    vty = ir.VectorType(value.type, n)
    undef = ir.Constant(vty, None)
    one = builder.insert_element(undef, value, ir.Constant(IR_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(IR_I32, n), [0] * n))


def reduce_add_i32(builder, v, n: int):
    """Exact sum of an <n x i32> vector."""
    fnty = ir.FunctionType(IR_I32, [ir.VectorType(IR_I32, n)])
    fn = builder.module.declare_intrinsic(f"llvm.vector.reduce.add.v{n}i32", fnty=fnty)
    return builder.call(fn, [v])


def sum_f32_tree(builder, v, n: int):
    """Sum of an <n x float> vector by halving (a fixed order: lanes i and i + n/2 first)."""
    while n > 1:
        h = n // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, h), list(range(h))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, h), list(range(h, n))))
        v = builder.fadd(lo, hi)
        n = h
    return builder.extract_element(v, ir.Constant(IR_I32, 0))


def _dot_u8_i8(builder, u, y, n: int):
    """Exact dot of <n x i8> u (unsigned) and y (signed), as the extended products LLVM makes vpdpbusd/pmaddwd."""
    v32 = ir.VectorType(IR_I32, n)
    prod = builder.mul(builder.zext(u, v32), builder.sext(y, v32), flags=["nsw"])
    return reduce_add_i32(builder, prod, n)


@intrinsic
def load_f16(typingctx, w, i):
    """The IEEE half at byte offset `i` of uint8 array `w`, as float32 (exact)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, IR_I16.as_pointer()), align=1)
        return builder.fpext(builder.bitcast(h, ir.HalfType()), IR_F32)

    return sig, codegen


@intrinsic
def load_bf16(typingctx, w, i):
    """The bfloat16 at byte offset `i` of uint8 array `w`, as float32 (exact: the bits are the top half)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        h = builder.load(builder.bitcast(p, IR_I16.as_pointer()), align=1)
        u = builder.shl(builder.zext(h, IR_I32), ir.Constant(IR_I32, 16))
        return builder.bitcast(u, IR_F32)

    return sig, codegen


def _make_load32(numba_type: types.Type, ir_type: ir.Type):
    """An intrinsic `load(w, i)`: the little-endian value of `ir_type` at byte offset `i` of uint8 array `w`."""

    @intrinsic
    def load32(typingctx, w, i):
        sig = numba_type(w, types.intp)

        def codegen(context, builder, signature, args):
            p = element_pointer(context, builder, signature.args[0], args[0], args[1])
            return builder.load(builder.bitcast(p, ir_type.as_pointer()), align=1)

        return sig, codegen

    return load32


load_u16 = _make_load32(types.uint16, IR_I16)
load_u16.__doc__ = "The little-endian uint16 at byte offset `i` of uint8 array `w` (IQ1_M's scales)."
load_u32 = _make_load32(types.uint32, IR_I32)
load_u32.__doc__ = "The little-endian uint32 at byte offset `i` of uint8 array `w` (Q5's `qh`)."
load_f32 = _make_load32(types.float32, IR_F32)
load_f32.__doc__ = "The little-endian float32 at byte offset `i` of uint8 array `w` (Q8_K's `d`, F32 rows)."


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest f16 (ties to even, as GGML_FP32_TO_FP16) -> float32."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), IR_F32)

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """float32 -> the bits of the nearest f16 (ties to even, as ggml's F16C GGML_FP32_TO_FP16), as uint16."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), IR_I16)

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c for float32 scalars, rounded once (llvm.fma: the FMA instruction, or libm's exact fmaf)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return fma(builder, *args)

    return sig, codegen


@intrinsic
def fma_f16(typingctx, a, b, c):
    """a * b + c of f16 values (as float32) rounded once to f16, as vfmadd*ph (DESIGN.md: exact sum, round to odd)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f64 = ir.DoubleType()
        a64, b64, c64 = (builder.fpext(x, f64) for x in args)
        exact = builder.fadd(builder.fmul(a64, b64), c64)
        near = builder.fptrunc(exact, IR_F32)
        fabs = builder.module.declare_intrinsic("llvm.fabs", [f64])
        away = builder.fcmp_ordered(">", builder.call(fabs, [builder.fpext(near, f64)]), builder.call(fabs, [exact]))
        inexact = builder.fcmp_unordered("!=", builder.fpext(near, f64), exact)
        bits = builder.bitcast(near, IR_I32)
        bits = builder.select(away, builder.sub(bits, ir.Constant(IR_I32, 1)), bits)
        bits = builder.select(inexact, builder.or_(bits, ir.Constant(IR_I32, 1)), bits)
        return builder.fpext(builder.fptrunc(builder.bitcast(bits, IR_F32), ir.HalfType()), IR_F32)

    return sig, codegen


@intrinsic
def dot_nibbles(typingctx, w, i, y, j):
    """sum_t (w[i+t] & 15) * y[j+t] + (w[i+t] >> 4) * y[j+16+t], t < 16: the Q4/Q5 block layout."""
    sig = types.int32(w, types.intp, y, types.intp)

    def codegen(context, builder, signature, args):
        pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
        py = element_pointer(context, builder, signature.args[2], args[2], args[3])
        q = load_vector(builder, pw, IR_I8, 16)
        lo = builder.and_(q, ir.Constant(ir.VectorType(IR_I8, 16), [15] * 16))
        hi = builder.lshr(q, ir.Constant(ir.VectorType(IR_I8, 16), [4] * 16))
        both = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(IR_I32, 32), list(range(32))))
        return _dot_u8_i8(builder, both, load_vector(builder, py, IR_I8, 32), 32)

    return sig, codegen


def _make_dot_bits(n: int):
    @intrinsic
    def dot_bits(typingctx, w, i, shift, mask, y, j):
        sig = types.int32(w, types.intp, types.intp, types.intp, y, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            py = element_pointer(context, builder, signature.args[4], args[4], args[5])
            q = load_vector(builder, pw, IR_I8, n)
            s = splat(builder, builder.trunc(args[2], IR_I8), n)
            m = splat(builder, builder.trunc(args[3], IR_I8), n)
            field = builder.and_(builder.lshr(q, s), m)
            return _dot_u8_i8(builder, field, load_vector(builder, py, IR_I8, n), n)

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
                p = element_pointer(context, builder, signature.args[0], args[0], args[pos])
                q = load_vector(builder, p, IR_I8, n)
                s = splat(builder, builder.trunc(args[pos + 1], IR_I8), n)
                return builder.and_(builder.lshr(q, s), splat(builder, builder.trunc(args[pos + 2], IR_I8), n))

            # the combined value fits a byte (at most 63 in the K-quants), read unsigned
            v = builder.add(field(1), builder.mul(field(4), splat(builder, builder.trunc(args[7], IR_I8), n)))
            py = element_pointer(context, builder, signature.args[8], args[8], args[9])
            return _dot_u8_i8(builder, v, load_vector(builder, py, IR_I8, n), n)

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
        py = element_pointer(context, builder, signature.args[1], args[1], args[2])
        v32 = ir.VectorType(IR_I32, 32)
        b = builder.lshr(splat(builder, args[0], 32), ir.Constant(v32, list(range(32))))
        b = builder.and_(b, ir.Constant(v32, [1] * 32))
        yv = builder.sext(load_vector(builder, py, IR_I8, 32), v32)
        return reduce_add_i32(builder, builder.mul(b, yv), 32)

    return sig, codegen


def widen_halves(builder, h, kind: int):
    """<32 x i16> f16 or bf16 bits -> <32 x float> (exact)."""
    if kind == F16:
        return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 32)), ir.VectorType(IR_F32, 32))
    v32 = ir.VectorType(IR_I32, 32)
    u = builder.shl(builder.zext(h, v32), ir.Constant(v32, [16] * 32))
    return builder.bitcast(u, ir.VectorType(IR_F32, 32))


def _make_widen_half(kind: int):
    @intrinsic
    def widen_half(typingctx, w, i, out, j):
        sig = types.void(w, types.intp, out, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            po = element_pointer(context, builder, signature.args[2], args[2], args[3])
            wf = widen_halves(builder, load_vector(builder, pw, IR_I16, 32), kind)
            builder.store(wf, builder.bitcast(po, ir.VectorType(IR_F32, 32).as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return widen_half


widen_f16x32 = _make_widen_half(F16)
widen_f16x32.__doc__ = "out[j+t] = f16(w at byte i+2t), t < 32."
widen_bf16x32 = _make_widen_half(BF16)
widen_bf16x32.__doc__ = "out[j+t] = bf16(w at byte i+2t), t < 32."


# --- whole rows: one vector accumulator per row, its lanes summed once at the end ---


def fmuladd(builder, a, b, c):
    """a * b + c, fused where the CPU has FMA (llvm.fmuladd)."""
    fnty = ir.FunctionType(a.type, [a.type, a.type, a.type])
    n = a.type.count
    fn = builder.module.declare_intrinsic(f"llvm.fmuladd.v{n}f32", fnty=fnty)
    return builder.call(fn, [a, b, c])


def shuffle(builder, v, idx: list[int]):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, len(idx)), idx))


def pair_sums(builder, v):
    """v[2k] + v[2k + 1] for each k: a vector of half v's lanes (integer lanes)."""
    n = v.type.count
    return builder.add(shuffle(builder, v, list(range(0, n, 2))), shuffle(builder, v, list(range(1, n, 2))))


def row_pointer(context, builder, arrty, arr, row, col=None):
    """Pointer to element (row, col) (col 0 if None) of a C-contiguous 2-D array, and its row length."""
    a = context.make_array(arrty)(context, builder, value=arr)
    width = cgutils.unpack_tuple(builder, a.shape)[1]
    flat = builder.mul(row, width)
    return builder.gep(a.data, [flat if col is None else builder.add(flat, col)]), width


def _prefetch(builder, p, lines: int) -> None:
    """Ask for the `lines` cache lines from byte pointer p on (llvm.prefetch: read, keep in all levels)."""
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), IR_I32, IR_I32, IR_I32])
    fn = builder.module.declare_intrinsic("llvm.prefetch.p0", fnty=fnty)
    read, keep, data = ir.Constant(IR_I32, 0), ir.Constant(IR_I32, 3), ir.Constant(IR_I32, 1)
    for k in range(lines):
        builder.call(fn, [builder.gep(p, [ir.Constant(ir.IntType(64), 64 * k)]), read, keep, data])


# column_groups' loops prefetch rows ahead: the hardware prefetcher misses short, far-apart rows (attention's K)
PREFETCH_ROWS = 16
PREFETCH_LINES = 4


def in_blocks(builder, start, end, size: int, body) -> None:
    """`body(i, size)` for i = start, start + size, ... while a whole block fits before `end`, then `body(i, 1)`
    for the rest."""
    n_blocks = builder.sdiv(builder.sub(end, start), ir.Constant(start.type, size))
    with cgutils.for_range(builder, n_blocks) as loop:
        body(builder.add(start, builder.mul(loop.index, ir.Constant(start.type, size))), size)
    rest = builder.add(start, builder.mul(n_blocks, ir.Constant(start.type, size)))
    with cgutils.for_range(builder, end, start=rest) as loop:
        body(loop.index, 1)


def per_count(builder, n, ncols: int, body) -> None:
    """A switch on the column count n (1..ncols): `body(count)` once per count, each joining the block after it."""
    done = builder.append_basic_block("cols.done")
    switch = builder.switch(n, done)
    for count in range(1, ncols + 1):
        case = builder.append_basic_block(f"cols.{count}")
        switch.add_case(ir.Constant(n.type, count), case)
        builder.position_at_end(case)
        body(count)
        builder.branch(done)
    builder.position_at_end(done)


def weight_pointers(context, builder, signature, args, w: int = 0, w_off: int = 1, base: int = 2):
    """The byte pointer of the weights (argument `w`) and the pointer to w_off[base:]."""
    ty = signature.args
    w_data = element_pointer(context, builder, ty[w], args[w], ir.Constant(args[base].type, 0))
    return w_data, element_pointer(context, builder, ty[w_off], args[w_off], args[base])


def column_groups(context, builder, signature, args, ncols: int, pos: dict[str, int], columns, row) -> None:
    """A multi-column intrinsic's body: `row(pw, m, columns(count))` for weight rows m0 <= m < m1, one loop per
    column count n (DESIGN.md, "The CPU kernels"); `pos` gives the argument positions of w, w_off, base, m0, m1, n.
    """
    w_data, offsets = weight_pointers(context, builder, signature, args, pos["w"], pos["w_off"], pos["base"])
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

    per_count(builder, args[pos["n"]], ncols, rows)


def store_columns(context, builder, arrty, out, r, m, dots) -> None:
    """out[r + c, m] = dots[c]."""
    for c, dot in enumerate(dots):
        builder.store(dot, row_pointer(context, builder, arrty, out, builder.add(r, ir.Constant(r.type, c)), m)[0])


def fma(builder, a, b, c):
    """a * b + c rounded once (llvm.fma), as ggml's _mm256_fmadd_ps and gcc's contracted multiply-adds."""
    fnty = ir.FunctionType(a.type, [a.type, a.type, a.type])
    name = f"llvm.fma.v{a.type.count}f32" if isinstance(a.type, ir.VectorType) else "llvm.fma.f32"
    return builder.call(builder.module.declare_intrinsic(name, fnty=fnty), [a, b, c])


# src1 columns one pass over a weight row serves (more run out of vector registers)
COLS = 4
