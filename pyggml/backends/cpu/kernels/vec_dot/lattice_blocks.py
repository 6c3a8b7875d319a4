"""One lattice IQ block in vector IR: its exact integer dot with a Q8_K block, and its values as float32.

Each sub-block of 32 values is its grid points (4 of 8 bytes, or IQ3's 8 of 4) gathered from the grid into one vector
and its sign groups. The dot applies the signs to the Q8_K values, sums the byte products in lanes of 4 (values 0-15
in lanes 0-3, 16-31 in 4-7) and scales them; the sums of the block's 8 sub-blocks are added in a vector and reduced
once. The float values are ggml's dequantize_row_*: `db * grid[j] * sign` with db = d * (0.5 + s) * 0.25 (IQ2) is
`(d * ls) * 0.125 * (sign * grid[j])` with ls = 2s + 1, the same float32 roundings (a factor 2 moves between exact
steps; negation is exact); IQ3_XXS's factor is 0.25, IQ3_S's and IQ1's 1, and IQ1 adds its shift before the scale.

A type is its `decode(field, ib)`: the IR of sub-block ib's point indices, its signs (a list of 4 indices into a table
of 8 sign-mask bytes per index; one u32 of its 4 sign bytes, bit j of byte l negating value 8l + j; or None) and the
scales of its two halves, from the block's fields (`field(offset, bits)`: an
unsigned little-endian field as i64). The sums are ggml's integer sums (ggml_vec_dot_*_q8_K: `bsum`, `sumi`), exact:
|point| <= 62, |y| <= 127, so the byte pairs' sums fit int16 and the block's sum int32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot.block_sums import (
    HAS_AVX2,
    block_sums_quads,
    block_sums_unsigned_quads,
    target_block_sums,
    target_block_sums_unsigned,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, IR_I8, IR_I32, load_vector, reduce_add_i32, splat

I64 = ir.IntType(64)
# the 32-value sums with lane i holding products 4i..4i+3
QUAD_SUMS, QUAD_SUMS_UNSIGNED = ((target_block_sums, target_block_sums_unsigned) if HAS_AVX2
                                 else (block_sums_quads, block_sums_unsigned_quads))

Field = Callable[[int, int], Any]
Decoded = tuple[list[Any], list[Any] | Any | None, Any, Any]


class Ops:
    """i64 arithmetic on IR values with Python ints as constants (the decoders read like the C they follow)."""

    def __init__(self, builder: ir.IRBuilder) -> None:
        self.b = builder

    def _v(self, x: Any) -> Any:
        return ir.Constant(I64, x) if isinstance(x, int) else x

    def and_(self, x: Any, y: Any) -> Any:
        return self.b.and_(self._v(x), self._v(y))

    def or_(self, x: Any, y: Any) -> Any:
        return self.b.or_(self._v(x), self._v(y))

    def shr(self, x: Any, y: Any) -> Any:
        return self.b.lshr(self._v(x), self._v(y))

    def shl(self, x: Any, y: Any) -> Any:
        return self.b.shl(self._v(x), self._v(y))

    def odd(self, x: Any) -> Any:
        """2x + 1: ggml's scales."""
        return self.b.add(self.b.shl(self._v(x), self._v(1)), self._v(1))


def _gather(context, builder, arrty, arr, idx: list[Any]):
    """The <32 x i8> of the table rows arr[idx[k]] (4 rows of 8 bytes or 8 of 4), read little-endian (element by
    element: faster than the AVX2 gathers where measured)."""
    n = len(idx)
    width = ir.IntType(256 // n)
    vec = ir.Constant(ir.VectorType(width, n), None)
    for k, g in enumerate(idx):
        p = element_pointer(context, builder, arrty, arr, builder.mul(g, ir.Constant(I64, 32 // n)))
        vec = builder.insert_element(vec, builder.load(builder.bitcast(p, width.as_pointer()), align=1),
                                     ir.Constant(IR_I32, k))
    return builder.bitcast(vec, ir.VectorType(IR_I8, 32))


def _sign_bytes_mask(builder, bits: Any):
    """<32 x i8>: -1 where bit j of byte l of the i64 `bits` is set (value 8l + j), else 0."""
    v8 = ir.VectorType(IR_I32, 8)
    v32i8 = ir.VectorType(IR_I8, 32)
    word = builder.insert_element(ir.Constant(v8, None), builder.trunc(bits, IR_I32), ir.Constant(IR_I32, 0))
    spread = builder.shuffle_vector(builder.bitcast(word, v32i8), ir.Constant(v32i8, None),
                                    ir.Constant(ir.VectorType(IR_I32, 32), [l for l in range(4) for _ in range(8)]))
    bit = ir.Constant(v32i8, [1 << j for _ in range(4) for j in range(8)])
    return builder.sext(builder.icmp_unsigned("!=", builder.and_(spread, bit), ir.Constant(v32i8, [0] * 32)), v32i8)


def _scales(builder, lo: Any, hi: Any):
    """<8 x i32>: lanes 0-3 `lo`, lanes 4-7 `hi`."""
    v = ir.Constant(ir.VectorType(IR_I32, 8), None)
    lo32, hi32 = builder.trunc(lo, IR_I32), builder.trunc(hi, IR_I32)
    for k in range(8):
        v = builder.insert_element(v, lo32 if k < 4 else hi32, ir.Constant(IR_I32, k))
    return v


def _signs(context, builder, signature, args, signs: list[Any] | Any):
    """<32 x i8> sign masks (-1: negate) of `decode`'s signs: gathered from the masks table (args[1]) or expanded."""
    if isinstance(signs, list):
        return _gather(context, builder, signature.args[1], args[1], signs)
    return _sign_bytes_mask(builder, signs)


def _field_reader(context, builder, signature, args):
    """`field(offset, bits)` of the block at byte args[3] of args[2], and the Ops of `builder`."""
    base = element_pointer(context, builder, signature.args[2], args[2], args[3])

    def field(offset: int, bits: int) -> Any:
        p = builder.gep(base, [ir.Constant(I64, offset)])
        return builder.zext(builder.load(builder.bitcast(p, ir.IntType(bits).as_pointer()), align=1), I64)

    return field, Ops(builder)


def make_block_dot(decode: Callable[[Ops, Field, int], Decoded], shifts: bool = False):
    """An intrinsic `block_dot(grid, masks, w, ob, yq, j)`: the block at byte ob of w against yq[j..j+256) (flat),
    int32. `grid`: the points, one row each; `masks`: 8 sign-mask bytes (0 or 0xff) per sign index (any table when
    `decode` gives none). `shifts` (IQ1): the grid's bytes are int8 (-1, 0, 1), `decode`'s signs are the signs of
    the groups' shifts instead, and the result is (the points' sum, the shifts' sum: the signed sums of each group's
    values), both scaled."""

    @intrinsic
    def block_dot(typingctx, grid, masks, w, ob, yq, j):
        ret = types.UniTuple(types.int32, 2) if shifts else types.int32
        sig = ret(grid, masks, w, types.intp, yq, types.intp)

        def codegen(context, builder, signature, args):
            field, ops = _field_reader(context, builder, signature, args)
            acc = acc2 = ir.Constant(ir.VectorType(IR_I32, 8), [0] * 8)
            for ib in range(8):
                points, signs, lo, hi = decode(ops, field, ib)
                vp = _gather(context, builder, signature.args[0], args[0], points)
                j = builder.add(args[5], ir.Constant(I64, 32 * ib))
                y = load_vector(builder, element_pointer(context, builder, signature.args[4], args[4], j), IR_I8, 32)
                m = None if signs is None else _signs(context, builder, signature, args, signs)
                scales = _scales(builder, lo, hi)
                if shifts:
                    acc = builder.add(acc, builder.mul(QUAD_SUMS(builder, vp, y), scales))
                    ys = builder.sub(builder.xor(y, m), m)
                    ones = ir.Constant(ir.VectorType(IR_I8, 32), [1] * 32)
                    acc2 = builder.add(acc2, builder.mul(QUAD_SUMS_UNSIGNED(builder, ones, ys), scales))
                    continue
                if m is not None:
                    y = builder.sub(builder.xor(y, m), m)  # y where m is 0, -y where m is -1
                acc = builder.add(acc, builder.mul(QUAD_SUMS_UNSIGNED(builder, vp, y), scales))
            if shifts:
                return context.make_tuple(builder, signature.return_type,
                                          [reduce_add_i32(builder, acc, 8), reduce_add_i32(builder, acc2, 8)])
            return reduce_add_i32(builder, acc, 8)

        return sig, codegen

    return block_dot


def make_block_to_float(decode: Callable[[Ops, Field, int], Decoded], factor: float, shifts: bool = False):
    """An intrinsic `block_to_float(grid, masks, w, ob, d, out, j)`: out[j..j+256) (flat) = the values of the block at
    byte ob of w with scale d (float32), as ggml's dequantize_row. `factor`: ggml's scale of (d * ls), 0.125 (IQ2),
    0.25 (IQ3_XXS) or 1; `shifts`: as make_block_dot's (IQ1: the values are (point + shift) * d * ls)."""

    @intrinsic
    def block_to_float(typingctx, grid, masks, w, ob, d, out, j):
        sig = types.void(grid, masks, w, types.intp, types.float32, out, types.intp)

        def codegen(context, builder, signature, args):
            field, ops = _field_reader(context, builder, signature, args)
            vf = ir.VectorType(IR_F32, 32)
            for ib in range(8):
                points, signs, lo, hi = decode(ops, field, ib)
                vp = _gather(context, builder, signature.args[0], args[0], points)
                scale = ir.Constant(vf, None)
                for half, ls in enumerate((lo, hi)):
                    dl = builder.fmul(builder.fmul(args[4], builder.sitofp(ls, IR_F32)), ir.Constant(IR_F32, factor))
                    for k in range(16):
                        scale = builder.insert_element(scale, dl, ir.Constant(IR_I32, 16 * half + k))
                if shifts:  # ggml: dl * (grid[j] + delta), delta -0.125 where the group's sign is set
                    m = _signs(context, builder, signature, args, signs)
                    delta = builder.select(builder.icmp_signed("<", m, ir.Constant(m.type, [0] * 32)),
                                           splat(builder, ir.Constant(IR_F32, -0.125), 32),
                                           splat(builder, ir.Constant(IR_F32, 0.125), 32))
                    v = builder.fmul(scale, builder.fadd(builder.sitofp(vp, vf), delta))
                else:
                    if signs is not None:
                        m = _signs(context, builder, signature, args, signs)
                        vp = builder.sub(builder.xor(vp, m), m)  # the points are <= 62: their negation fits int8
                    v = builder.fmul(scale, builder.sitofp(vp, vf))
                k = builder.add(args[6], ir.Constant(I64, 32 * ib))
                po = element_pointer(context, builder, signature.args[5], args[5], k)
                builder.store(v, builder.bitcast(po, vf.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block_to_float


def _signs7(o: Ops, aux: Any) -> list[Any]:
    """The four 7-bit ksigns_iq2xs indices in bits 0-27 of aux."""
    return [o.and_(o.shr(aux, 7 * l), 127) for l in range(4)]


def decode_iq2_xxs(o: Ops, field: Field, ib: int) -> Decoded:
    q = 2 + 8 * ib
    aux = field(q + 4, 32)
    ls = o.odd(o.shr(aux, 28))
    return [field(q + l, 8) for l in range(4)], _signs7(o, aux), ls, ls


def decode_iq2_xs(o: Ops, field: Field, ib: int) -> Decoded:
    qs = [field(2 + 8 * ib + 2 * l, 16) for l in range(4)]
    sc = field(66 + ib, 8)
    return [o.and_(q, 511) for q in qs], [o.shr(q, 9) for q in qs], o.odd(o.and_(sc, 15)), o.odd(o.shr(sc, 4))


def decode_iq3_xxs(o: Ops, field: Field, ib: int) -> Decoded:
    aux = field(66 + 4 * ib, 32)
    ls = o.odd(o.shr(aux, 28))
    return [field(2 + 8 * ib + k, 8) for k in range(8)], _signs7(o, aux), ls, ls


def decode_iq1_s(o: Ops, field: Field, ib: int) -> Decoded:
    qh = field(34 + 2 * ib, 16)
    points = [o.or_(field(2 + 4 * ib + l, 8), o.shl(o.and_(o.shr(qh, 3 * l), 7), 8)) for l in range(4)]
    ls = o.odd(o.and_(o.shr(qh, 12), 7))
    return points, o.b.mul(o.shr(qh, 15), ir.Constant(I64, 0xFFFFFFFF)), ls, ls  # one shift sign for all groups


def decode_iq3_s(o: Ops, field: Field, ib: int) -> Decoded:
    qh = field(66 + ib, 8)
    points = [o.or_(field(2 + 8 * ib + k, 8), o.and_(o.shl(qh, 8 - k), 256)) for k in range(8)]
    ls = o.odd(o.and_(o.shr(field(106 + ib // 2, 8), 4 * (ib % 2)), 15))
    return points, field(74 + 4 * ib, 32), ls, ls


def decode_iq2_s(o: Ops, field: Field, ib: int) -> Decoded:
    qh = field(66 + ib, 8)
    points = [o.or_(field(2 + 4 * ib + l, 8), o.and_(o.shl(qh, 8 - 2 * l), 0x300)) for l in range(4)]
    sc = field(74 + ib, 8)
    return points, field(34 + 4 * ib, 32), o.odd(o.and_(sc, 15)), o.odd(o.shr(sc, 4))


def _iq1_m_nibbles(o: Ops, field: Field, ib: int) -> list[Any]:
    """Sub-block ib's four qh nibbles: 3 index bits and the shift's sign (bit 3)."""
    return [o.and_(o.shr(field(32 + 2 * ib + l // 2, 8), 4 * (l % 2)), 15) for l in range(4)]


def _iq1_m_scales(o: Ops, field: Field, ib: int) -> tuple[Any, Any]:
    s = field(48 + 2 * (ib // 2), 16)
    shift = 6 * (ib % 2)
    return o.odd(o.and_(o.shr(s, shift), 7)), o.odd(o.and_(o.shr(s, shift + 3), 7))


def decode_iq1_m(o: Ops, field: Field, ib: int) -> Decoded:
    nibbles = _iq1_m_nibbles(o, field, ib)
    points = [o.or_(field(4 * ib + l, 8), o.shl(o.and_(n, 7), 8)) for l, n in enumerate(nibbles)]
    signs = ir.Constant(I64, 0)
    for l, n in enumerate(nibbles):  # byte l: 0xff where group l's shift is negative
        signs = o.or_(signs, o.shl(o.b.mul(o.shr(n, 3), ir.Constant(I64, 0xFF)), 8 * l))
    return (points, signs, *_iq1_m_scales(o, field, ib))


dot_block_iq2_xxs = make_block_dot(decode_iq2_xxs)
dot_block_iq2_xs = make_block_dot(decode_iq2_xs)
dot_block_iq3_xxs = make_block_dot(decode_iq3_xxs)
dot_block_iq1_s = make_block_dot(decode_iq1_s, shifts=True)
dot_block_iq3_s = make_block_dot(decode_iq3_s)
dot_block_iq2_s = make_block_dot(decode_iq2_s)
dot_block_iq1_m = make_block_dot(decode_iq1_m, shifts=True)

to_float_iq2_xxs = make_block_to_float(decode_iq2_xxs, 0.125)
to_float_iq2_xs = make_block_to_float(decode_iq2_xs, 0.125)
to_float_iq3_xxs = make_block_to_float(decode_iq3_xxs, 0.25)
to_float_iq1_s = make_block_to_float(decode_iq1_s, 1.0, shifts=True)
to_float_iq3_s = make_block_to_float(decode_iq3_s, 1.0)
to_float_iq2_s = make_block_to_float(decode_iq2_s, 0.125)
to_float_iq1_m = make_block_to_float(decode_iq1_m, 1.0, shifts=True)
