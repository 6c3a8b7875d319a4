"""Row loops of the 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4) against quantized src1 rows, in
ggml's reference or AVX2 float order.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.block_sums import (
    HAS_AVX2,
    block_sums_avx2,
    block_sums_quads,
    block_sums_unsigned_quads,
    block_sums_vnni,
    q4_0_nibbles,
    q8_0_values,
    target_block_sums,
    target_block_sums_unsigned,
    vpdpbusd,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    COLS,
    IR_F32,
    IR_I8,
    IR_I32,
    column_groups,
    fma,
    fmuladd,
    load_vector,
    per_count,
    reduce_add_i32,
    row_pointer,
    splat,
    store_columns,
    sum_f32_tree,
    weight_pointers,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import IQ4_NL, KVALUES, MXFP4
from pyggml.backends.cpu.kernels.vec_dot.table_lookup import table_values

_ROW_UNROLL = 4  # blocks per loop iteration, each with its own accumulator (breaks the FMA latency chain)


def _f16_pair(builder, pb):
    """The two f16 at the start of a block, as float32, by one 4-byte load (a lone f16 load's vpinsrw
    depends on its register's old value: DESIGN.md, "The CPU kernels")."""
    v = builder.load(builder.bitcast(pb, ir.VectorType(ir.HalfType(), 2).as_pointer()), align=1)
    f = builder.fpext(v, ir.VectorType(IR_F32, 2))
    return builder.extract_element(f, ir.Constant(IR_I32, 0)), builder.extract_element(f, ir.Constant(IR_I32, 1))


def _f16_scale(builder, pb):
    """The f16 scale at the start of a block, as float32 (by _f16_pair's load)."""
    return _f16_pair(builder, pb)[0]


def e8m0_half(builder, e):
    """ggml_e8m0_to_fp32_half of an i8 value read unsigned: 2^(e - 128), built from its bits (exact)."""
    e32 = builder.zext(e, IR_I32)
    small = builder.shl(ir.Constant(IR_I32, 0x00200000), e32)  # e < 2: subnormal
    normal = builder.shl(builder.sub(e32, ir.Constant(IR_I32, 1)), ir.Constant(IR_I32, 23))
    bits = builder.select(builder.icmp_unsigned("<", e32, ir.Constant(IR_I32, 2)), small, normal)
    return builder.bitcast(bits, IR_F32)


def _e8m0_scale(builder, pb):
    """MXFP4's scale: the E8M0 byte at the start of a block, halved (the table holds doubled values)."""
    return e8m0_half(builder, builder.load(pb))



def _y_offsets(builder, py, nb):
    """-128 times the lane sums of every block of the int8 row at py (nb * 8 int32 on the stack): vpdpbusd's
    start for signed w read as w + 128."""
    v8i32 = ir.VectorType(IR_I32, 8)
    buf = builder.alloca(IR_I32, size=builder.shl(nb, ir.Constant(nb.type, 3)))
    zero = ir.Constant(v8i32, [0] * 8)
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        yv = load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), IR_I8, 32)
        sums = vpdpbusd(builder, zero, ir.Constant(ir.VectorType(IR_I8, 32), [0x80] * 32), yv)  # 128 * lane sums
        builder.store(builder.sub(zero, sums), builder.bitcast(builder.gep(buf, [builder.shl(b, ir.Constant(
            b.type, 3))]), v8i32.as_pointer()), align=4)
    return buf


def _gather_scales(builder, cols, nb, mins: bool):
    """(yd8, ys, width): the columns' block scales, each 8 times, and for `mins` Q8_1's sums s (`width` a power
    of two, zero-padded), on the stack of rows_function (freed when it returns)."""
    count = len(cols)
    width = 1 << (count - 1).bit_length()
    v8f = ir.VectorType(IR_F32, 8)
    yd8 = builder.alloca(IR_F32, size=builder.mul(nb, ir.Constant(nb.type, 8 * count)))
    ys = builder.alloca(IR_F32, size=builder.mul(nb, ir.Constant(nb.type, width))) if mins else None
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        for c in range(count):
            at = builder.mul(builder.add(builder.mul(b, ir.Constant(b.type, count)), ir.Constant(b.type, c)),
                             ir.Constant(b.type, 8))
            d = builder.load(builder.gep(cols[c][1], [b]))
            builder.store(splat(builder, d, 8), builder.bitcast(builder.gep(yd8, [at]), v8f.as_pointer()), align=4)
        if mins:
            bw = builder.mul(b, ir.Constant(b.type, width))
            for c in range(width):
                v = builder.load(builder.gep(cols[c][2], [b])) if c < count else ir.Constant(IR_F32, 0.0)
                builder.store(v, builder.gep(ys, [builder.add(bw, ir.Constant(b.type, c))]))
    return yd8, ys, width


def make_dot_q_row(block_bytes: int, values, block_sums=None, minus_8: bool = False, scale=_f16_scale,
                    values_offset: int = 2, mins: bool = False, x86: bool = False, ncols: int = 1,
                    gather_min: int = 2, signed_vnni_min: int = 2, split_rows: tuple[int, ...] | None = None):
    """The row loop of a 32-value block type of `block_bytes`: `scale` reads the block's scale, `values` its
    values at `values_offset`. `x86`: ggml's AVX2 float order; `minus_8` (Q4_0) and `mins` (Q4_1) apply the
    offsets by exact identities; the multi-column options are DESIGN.md's ("The CPU kernels").

    `ncols` 1: `dot(w, o, nb, yq, j, yd, k, yb, kb)` returns the row's dot with the src1 row at yq[j:], yd[k:],
    yb[kb:]. `ncols` > 1: `dot(w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out)` writes out[r + c, m] for
    c < n <= ncols, m0 <= m < m1, each column's bits those of `ncols` 1.
    """
    if block_sums is None and x86 and not HAS_AVX2:
        # ggml's lanes (4 consecutive products each) on any target: the float sums see the same lane values
        block_sums = block_sums_unsigned_quads if minus_8 or mins else block_sums_quads
    if block_sums is None:
        block_sums = target_block_sums_unsigned if minus_8 or mins else target_block_sums
    unroll = 1 if x86 else _ROW_UNROLL
    madd = fma if x86 else fmuladd
    if split_rows is None:
        split_rows = (1, 2, 3) if minus_8 or mins else (1, 2, 3, 4)

    # VNNI's signed values as w + 128 times y minus _y_offsets: no vpsignb per column
    biased = block_sums is block_sums_vnni

    def row_loop(builder, pws, nb, cols, gathered=None, offsets=None, sums=block_sums):
        """results[row][col]: the dots of the weight rows at `pws` with each src1 row of `cols` (its yq, yd, yb)."""
        v8f = ir.VectorType(IR_F32, 8)
        accs = [[[cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8)) for _ in range(unroll)]
                 for _ in cols] for _ in pws]
        if gathered is not None:
            vw = ir.VectorType(IR_F32, gathered[2])
            summs = [cgutils.alloca_once_value(builder, ir.Constant(vw, [0.0] * vw.count)) for _ in pws]
        else:
            summs = [[cgutils.alloca_once_value(builder, ir.Constant(IR_F32, 0.0)) for _ in cols] for _ in pws]

        def block(b, u):
            yvs = [load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), IR_I8, 32)
                   for py, _, _ in cols]
            for i, pw in enumerate(pws):
                row_block(b, u, pw, accs[i], summs[i], yvs)

        def row_block(b, u, pw, accs, summs, yvs):
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            wd, m = _f16_pair(builder, pb) if mins else (scale(builder, pb), None)
            wv = values(builder, builder.gep(pb, [ir.Constant(b.type, values_offset)]))
            if offsets is not None:
                wv = builder.xor(wv, ir.Constant(ir.VectorType(IR_I8, 32), [0x80] * 32))  # w + 128, read unsigned
            if gathered is not None:
                yd8, ys, width = gathered
                wd8 = splat(builder, wd, 8)
                b8 = builder.mul(b, ir.Constant(b.type, 8 * len(cols)))
                if mins:
                    ms = splat(builder, m, width)
                    ss = load_vector(builder, builder.gep(ys, [builder.mul(b, ir.Constant(b.type, width))]), IR_F32,
                                      width)
                    old = builder.load(summs)
                    builder.store(fma(builder, ms, ss, old) if x86 else builder.fadd(old, builder.fmul(ms, ss)), summs)
            for c, (_, pd, ps) in enumerate(cols):
                if gathered is not None:
                    d8 = builder.fmul(wd8, load_vector(builder, builder.gep(yd8, [builder.add(b8, ir.Constant(
                        b.type, 8 * c))]), IR_F32, 8))
                else:
                    d8 = splat(builder, builder.fmul(wd, builder.load(builder.gep(pd, [b]))), 8)
                    if mins:
                        sy = builder.load(builder.gep(ps, [b]))
                        old = builder.load(summs[c])
                        builder.store(fma(builder, m, sy, old) if x86 else builder.fadd(old, builder.fmul(m, sy)),
                                      summs[c])
                if offsets is not None:
                    at = builder.shl(b, ir.Constant(b.type, 3))
                    part = vpdpbusd(builder, load_vector(builder, builder.gep(offsets[c], [at]), IR_I32, 8), wv,
                                     yvs[c])
                else:
                    part = sums(builder, wv, yvs[c])
                if minus_8:
                    b2 = builder.shl(b, ir.Constant(b.type, 1))
                    ysum = builder.add(builder.load(builder.gep(ps, [b2])),
                                       builder.load(builder.gep(ps, [builder.add(b2, ir.Constant(b.type, 1))])))
                    part = builder.sub(part, splat(builder, ysum, 8))
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
                out = sum_f32_tree(builder, total, 8)
                if mins:
                    sm = (builder.extract_element(builder.load(summs[i]), ir.Constant(IR_I32, c))
                          if gathered is not None else builder.load(summs[i][c]))
                    out = builder.fadd(out, sm)
                row.append(out)
            results.append(row)
        return results

    if ncols == 1:  # one weight row: the first (only) row's dots
        return block_row_intrinsic(lambda builder, pw, nb, cols: row_loop(builder, [pw], nb, cols)[0], 1)

    def rows_function(module, count: int, values: list) -> ir.Function:
        """A noinline function for weight rows m0..m1-1 times `count` src1 rows (w, w_off[base:], m0, m1, nb, then
        per column its yq, yd, yb and out rows): its allocas stay out of the caller."""
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
        sums = block_sums_avx2 if biased and count < signed_vnni_min else block_sums

        def pointer(m):
            return fb.gep(w_data, [fb.load(fb.gep(offsets, [m]))])

        tail = m0
        if count in split_rows:
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
            w_data, offsets = weight_pointers(context, builder, signature, args)

            def call(count: int) -> None:
                rows = [builder.add(r, ir.Constant(r.type, c)) for c in range(count)]
                ptrs = [row_pointer(context, builder, ty[i], args[i], row)[0] for row in rows for i in (6, 7, 8, 11)]
                values = [w_data, offsets, args[3], args[4], args[5]] + ptrs
                builder.call(rows_function(builder.module, count, values), values)

            per_count(builder, args[10], ncols, call)
            return context.get_dummy_value()

        return sig, codegen

    return dot_q_cols


Q8_0_SPEC = {"block_bytes": 34, "values": q8_0_values}
Q4_0_SPEC = {"block_bytes": 18, "values": q4_0_nibbles, "minus_8": True}
Q4_1_SPEC = {"block_bytes": 20, "values": q4_0_nibbles, "values_offset": 4, "mins": True}
dot_q8_0_cols = make_dot_q_row(**Q8_0_SPEC, ncols=COLS)
dot_q8_0_cols.__doc__ = ("Q8_0 weight rows times Q8_0 src1 rows (values yq, scales yd; yb unused): each block's exact "
                         "int32 sums scaled by d_w * d_y, accumulated in 8 lanes.")
dot_q4_0_cols = make_dot_q_row(**Q4_0_SPEC, ncols=COLS)
dot_q4_0_cols.__doc__ = "As dot_q8_0_cols for Q4_0 weight rows (values nibble - 8: 16-value sums yb give the offset)."
dot_q4_1_cols = make_dot_q_row(**Q4_1_SPEC, ncols=COLS)
dot_q4_1_cols.__doc__ = ("As dot_q8_0_cols for Q4_1 weight rows against Q8_1 (values nibble * d + m: the src1 block "
                         "sums ys, in yb's place, carry the mins).")
dot_q8_0_cols_x86 = make_dot_q_row(**Q8_0_SPEC, x86=True, ncols=COLS)
dot_q8_0_cols_x86.__doc__ = "dot_q8_0_cols in the order of ggml's AVX2 ggml_vec_dot_q8_0_q8_0 (one FMA accumulator)."
dot_q4_1_cols_x86 = make_dot_q_row(**Q4_1_SPEC, x86=True, ncols=COLS)
dot_q4_1_cols_x86.__doc__ = "dot_q4_1_cols in the order of ggml's AVX2 ggml_vec_dot_q4_1_q8_1 (FMAs, summs last)."


def q4_0_values(builder, p):
    """Q4_0's 32 values as int8 (-8..7) from the 16 bytes at p, as ggml's AVX2 code reads them."""
    return builder.sub(q4_0_nibbles(builder, p), ir.Constant(ir.VectorType(IR_I8, 32), [8] * 32))


Q4_0_X86_SPEC = {"block_bytes": 18, "values": q4_0_values}
dot_q4_0_cols_x86 = make_dot_q_row(**Q4_0_X86_SPEC, x86=True, ncols=COLS)
dot_q4_0_cols_x86.__doc__ = ("As dot_q8_0_cols_x86 for Q4_0 weight rows (values nibble - 8), the order of ggml's AVX2 "
                             "ggml_vec_dot_q4_0_q8_0.")

# --- Q5_0: 32 values of 5 bits, against Q8_0 ---


def q5_0_values(builder, p):
    """Q5_0's 32 values as int8 (-16..15) from qh at p and the nibbles after: nibble | 0xF0 where bit t is clear."""
    qh = builder.load(builder.bitcast(p, IR_I32.as_pointer()), align=1)
    bits = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))  # element t: bit t (AVX512: one kmov)
    v32i8 = ir.VectorType(IR_I8, 32)
    high = builder.select(bits, ir.Constant(v32i8, [0] * 32), ir.Constant(v32i8, [0xF0] * 32))
    return builder.or_(q4_0_nibbles(builder, builder.gep(p, [ir.Constant(IR_I32, 4)])), high)


def block_row_intrinsic(row_loop, ncols: int):
    """The intrinsic of `row_loop(builder, pw, nb, cols)` in the forms (and signatures) of make_dot_q_row."""
    if ncols == 1:
        @intrinsic
        def dot_q_row(typingctx, w, o, nb, yq, j, yd, k, yb, kb):
            ip = types.intp
            sig = types.float32(w, ip, ip, yq, ip, yd, ip, yb, ip)

            def codegen(context, builder, signature, args):
                ty = signature.args
                col = tuple(element_pointer(context, builder, ty[i], args[i], args[i + 1]) for i in (3, 5, 7))
                return row_loop(builder, element_pointer(context, builder, ty[0], args[0], args[1]), args[2], [col])[0]

            return sig, codegen

        return dot_q_row

    @intrinsic
    def dot_q_cols(typingctx, w, w_off, base, m0, m1, nb, yq, yd, yb, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, ip, yq, yd, yb, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r = signature.args, args[9]

            def columns(count: int) -> list:
                return [tuple(row_pointer(context, builder, ty[i], args[i], builder.add(r, ir.Constant(r.type, c)))[0]
                              for i in (6, 7, 8)) for c in range(count)]

            def row(pw, m, cols) -> None:
                store_columns(context, builder, ty[11], args[11], r, m, row_loop(builder, pw, args[5], cols))

            pos = {"w": 0, "w_off": 1, "base": 2, "m0": 3, "m1": 4, "n": 10}
            column_groups(context, builder, signature, args, ncols, pos, columns, row)
            return context.get_dummy_value()

        return sig, codegen

    return dot_q_cols


def make_dot_q_serial(block_bytes: int, values, values_offset: int = 2, block_sums=None, ncols: int = 1):
    """As make_dot_q_row (yb unused) in ggml's reference order: `sumf += (d_w * d_y) * sumi`, no FMA."""
    block_sums = target_block_sums if block_sums is None else block_sums

    def row_loop(builder, pw, nb, cols):
        sums = [cgutils.alloca_once_value(builder, ir.Constant(IR_F32, 0.0)) for _ in cols]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pb = builder.gep(pw, [builder.mul(b, ir.Constant(b.type, block_bytes))])
            wd = _f16_scale(builder, pb)
            wv = values(builder, builder.gep(pb, [ir.Constant(b.type, values_offset)]))
            for (py, pd, _), total in zip(cols, sums, strict=True):
                d = builder.fmul(wd, builder.load(builder.gep(pd, [b])))
                yv = load_vector(builder, builder.gep(py, [builder.shl(b, ir.Constant(b.type, 5))]), IR_I8, 32)
                sumi = reduce_add_i32(builder, block_sums(builder, wv, yv), 8)
                builder.store(builder.fadd(builder.load(total), builder.fmul(d, builder.sitofp(sumi, IR_F32))), total)
        return [builder.load(total) for total in sums]

    return block_row_intrinsic(row_loop, ncols)


Q5_0_SPEC = {"block_bytes": 22, "values": q5_0_values}
dot_q5_0_cols = make_dot_q_serial(**Q5_0_SPEC, ncols=COLS)
dot_q5_0_cols.__doc__ = ("Q5_0 weight rows times Q8_0 src1 rows in ggml's reference order (one scalar sum, see "
                         "make_dot_q_serial).")
dot_q5_0_cols_x86 = make_dot_q_row(**Q5_0_SPEC, x86=True, ncols=COLS)
dot_q5_0_cols_x86.__doc__ = ("As dot_q8_0_cols_x86 for Q5_0 weight rows (values -16..15), the order of ggml's AVX2 "
                             "ggml_vec_dot_q5_0_q8_0.")


IQ4_NL_SPEC = {"block_bytes": 18, "values": table_values(KVALUES[IQ4_NL])}
MXFP4_SPEC = {"block_bytes": 17, "values": table_values(KVALUES[MXFP4]), "scale": _e8m0_scale, "values_offset": 1}
dot_iq4_nl_cols = make_dot_q_row(**IQ4_NL_SPEC, ncols=COLS)
dot_iq4_nl_cols.__doc__ = "As dot_q8_0_cols for IQ4_NL weight rows (values kvalues_iq4nl[nibble])."
dot_mxfp4_cols = make_dot_q_row(**MXFP4_SPEC, ncols=COLS)
dot_mxfp4_cols.__doc__ = ("As dot_q8_0_cols for MXFP4 weight rows (values kvalues_mxfp4[nibble], scale 2^(e - 128) "
                          "from the block's first byte).")

