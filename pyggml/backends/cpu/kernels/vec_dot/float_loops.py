"""Row loops of F32, F16 and BF16 weights against float32 src1 rows, and the float row helpers attention and the
norms use (mad_f32_row, scale_f32_row).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    COLS,
    IR_F32,
    IR_I16,
    IR_I32,
    column_groups,
    fma,
    fmuladd,
    load_vector,
    row_pointer,
    splat,
    store_columns,
    sum_f32_tree,
    widen_halves,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import BF16, F16, F32


def _float_block(builder, pw, i, kind: int):
    """Weight values 32i..32i+31 of an F32, F16 or BF16 (`kind`) row at byte pointer pw, as <32 x float>."""
    if kind == F32:
        return load_vector(builder, builder.gep(pw, [builder.shl(i, ir.Constant(i.type, 7))]), IR_F32, 32)
    return widen_halves(builder, load_vector(builder, builder.gep(pw, [builder.shl(i, ir.Constant(i.type, 6))]),
                                               IR_I16, 32), kind)


def float_value(builder, pw, k, kind: int):
    """Weight value k of an F32, F16 or BF16 row at byte pointer pw, as float."""
    if kind == F32:
        return builder.load(builder.bitcast(builder.gep(pw, [builder.shl(k, ir.Constant(k.type, 2))]),
                                            IR_F32.as_pointer()), align=1)
    h = builder.load(builder.bitcast(builder.gep(pw, [builder.shl(k, ir.Constant(k.type, 1))]), IR_I16.as_pointer()),
                     align=1)
    if kind == F16:
        return builder.fpext(builder.bitcast(h, ir.HalfType()), IR_F32)
    return builder.bitcast(builder.shl(builder.zext(h, IR_I32), ir.Constant(IR_I32, 16)), IR_F32)


def add_float_products(builder, pw, cols, totals, start, K, kind: int, fused_from=None) -> None:
    """totals[c] += w[k] * x_c[k] in float (a multiply, then an add) for start <= k < K, w the row at pw; from
    `fused_from` on as one FMA each."""
    for lo, hi, fused in ((start, K, False),) if fused_from is None else ((start, fused_from, False),
                                                                         (fused_from, K, True)):
        with cgutils.for_range(builder, hi, start=lo) as loop:
            k = loop.index
            wk = float_value(builder, pw, k, kind)
            for px, total in zip(cols, totals, strict=True):
                xk, acc = builder.load(builder.gep(px, [k])), builder.load(total)
                builder.store(fma(builder, wk, xk, acc) if fused else builder.fadd(acc, builder.fmul(wk, xk)), total)


def make_dot_half_row(kind: int, ncols: int = 1):
    """F32, F16 or BF16 (`kind`) weight rows times float32 rows, in 32 lanes summed at the end. `ncols` 1:
    `dot(w, o, x, j, n)`, n a multiple of 32. `ncols` > 1: `dot(w, w_off, base, m0, m1, x, r, n, out)` writes
    out[r + c, m] for c < n, whole rows (the tail after the lanes' sum), each column's bits those of `ncols` 1.
    """
    vf = ir.VectorType(IR_F32, 32)

    def row_loop(builder, pw, n, cols, K=None):
        """The dots of the weight row at pw with the x rows at `cols` over n elements, then n..K-1 one by one."""
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * 32)) for _ in cols]
        n_blocks = builder.ashr(n, ir.Constant(n.type, 5))
        with cgutils.for_range(builder, n_blocks) as loop:
            i = loop.index
            wf = _float_block(builder, pw, i, kind)
            for px, acc in zip(cols, accs, strict=True):
                xv = load_vector(builder, builder.gep(px, [builder.shl(i, ir.Constant(i.type, 5))]), IR_F32, 32)
                builder.store(fmuladd(builder, wf, xv, builder.load(acc)), acc)
        sums = [cgutils.alloca_once_value(builder, sum_f32_tree(builder, builder.load(acc), 32)) for acc in accs]
        if K is not None:
            add_float_products(builder, pw, cols, sums, n, K, kind)
        return [builder.load(total) for total in sums]

    if ncols == 1:
        @intrinsic
        def dot_half_row(typingctx, w, o, x, j, n):
            sig = types.float32(w, types.intp, x, types.intp, types.intp)

            def codegen(context, builder, signature, args):
                pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
                px = element_pointer(context, builder, signature.args[2], args[2], args[3])
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
                    p, K = row_pointer(context, builder, ty[5], args[5], builder.add(r, ir.Constant(r.type, c)))
                    ptrs.append(p)
                return ptrs

            def row(pw, m, cols) -> None:
                n32 = builder.shl(builder.ashr(K, ir.Constant(K.type, 5)), ir.Constant(K.type, 5))
                store_columns(context, builder, ty[8], args[8], r, m, row_loop(builder, pw, n32, cols, K))

            pos = {"w": 0, "w_off": 1, "base": 2, "m0": 3, "m1": 4, "n": 7}
            column_groups(context, builder, signature, args, ncols, pos, columns, row)
            return context.get_dummy_value()

        return sig, codegen

    return dot_half_cols



dot_f16_cols = make_dot_half_row(F16, COLS)
dot_f16_cols.__doc__ = "F16 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see make_dot_half_row)."
dot_bf16_cols = make_dot_half_row(BF16, COLS)
dot_bf16_cols.__doc__ = "BF16 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see make_dot_half_row)."
dot_f32_cols = make_dot_half_row(F32, COLS)
dot_f32_cols.__doc__ = "F32 weight rows m0..m1-1 times x's rows r..r+n-1 (n <= COLS), whole (see make_dot_half_row)."
dot_f32_row = make_dot_half_row(F32, 1)
dot_f32_row.__doc__ = ("dot(w, o, x, j, n): the F32 row at byte o of w times x[j:j+n], n a multiple of 32, in 32 lanes "
                       "(see make_dot_half_row).")


def _each_f32(builder, n, update) -> None:
    """`update(t, width)` for t = 0, 32, ... (width 32), then for each element of the tail (width 1)."""
    five = ir.Constant(n.type, 5)
    with cgutils.for_range(builder, builder.ashr(n, five)) as loop:
        update(builder.shl(loop.index, five), 32)
    with cgutils.for_range(builder, n, start=builder.shl(builder.ashr(n, five), five)) as loop:
        update(loop.index, 1)


def _load_f32(builder, p, t, width: int):
    q = builder.gep(p, [t])
    return load_vector(builder, q, IR_F32, width) if width > 1 else builder.load(q, align=1)


def _store_f32(builder, v, p, t, width: int) -> None:
    q = builder.gep(p, [t])
    builder.store(v, builder.bitcast(q, ir.VectorType(IR_F32, width).as_pointer()) if width > 1 else q, align=1)


@intrinsic
def mad_f32_row(typingctx, x, i, a, y, j, n):
    """y[j+t] = fma(x[i+t], a, y[j+t]) for t < n (ggml_vec_mad_f32 with FMA), 32 lanes at a time (numba gathers)."""
    sig = types.void(x, types.intp, types.float32, y, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        px = element_pointer(context, builder, signature.args[0], args[0], args[1])
        py = element_pointer(context, builder, signature.args[3], args[3], args[4])

        def update(t, width: int) -> None:
            av = splat(builder, args[2], width) if width > 1 else args[2]
            yv = fma(builder, _load_f32(builder, px, t, width), av, _load_f32(builder, py, t, width))
            _store_f32(builder, yv, py, t, width)

        _each_f32(builder, args[5], update)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def scale_f32_row(typingctx, y, j, a, n):
    """y[j+t] *= a for t < n (ggml_vec_scale_f32), 32 lanes at a time (see mad_f32_row)."""
    sig = types.void(y, types.intp, types.float32, types.intp)

    def codegen(context, builder, signature, args):
        py = element_pointer(context, builder, signature.args[0], args[0], args[1])

        def update(t, width: int) -> None:
            av = splat(builder, args[2], width) if width > 1 else args[2]
            _store_f32(builder, builder.fmul(_load_f32(builder, py, t, width), av), py, t, width)

        _each_f32(builder, args[3], update)
        return context.get_dummy_value()

    return sig, codegen
