"""F32, F16 and BF16 weight rows times src1 rows rounded to the weight type, in the float orders of ggml-cpu's
products for those types: ggml_vec_dot_f32 / _f16 / _bf16 (vec.cpp: decode, and every product ggml does not hand
to llamafile) and llamafile's tinyBLAS (sgemm.cpp: prompts), per x86 level (numerics.X86_LEVELS), and ggml's
generic C loop (numerics "ref"). Each order is one table row (HalfOrder); `half_kind` picks the row ggml takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.vec_dot import ir as vir
from pyggml.backends.cpu.kernels.vec_dot.block_sums import HAS_AVX512
from pyggml.backends.cpu.kernels.vec_dot.float_loops import add_float_products, float_value
from pyggml.backends.cpu.kernels.vec_dot.ir import COLS, IR_F32, IR_I8, IR_I16, IR_I32
from pyggml.backends.cpu.kernels.vec_dot.kinds import BF16, F16, F32, HALF_ORDER, X8_REPACKED
from pyggml.backends.cpu.numerics import FMA_CHAINS
from pyggml.core.errors import ArgumentError

IR_F64 = ir.DoubleType()


@dataclass(frozen=True)
class HalfOrder:
    """One float order of a dot of F16/BF16 values. `lanes` 0: ggml's generic C loop (a double sum of float
    products). Else `lanes` float accumulators, element e of a step into lane e % lanes (`pairs`: AVX512_BF16's
    dpbf16, lane j takes elements 2j + 1 then 2j, inputs and results with denormals as zero), `fused` FMA or a
    multiply then an add; at the end `groups` runs of lanes each summed by halving (`hadd`: its last 4 lanes as
    _mm_hadd_ps does, (0 + 1) + (2 + 3)); `wide` (vec_dot): the group sums and the elements after the last whole
    step added in double, else (tinyBLAS) the one group's sum, K a multiple of the step."""

    name: str
    lanes: int
    fused: bool = True
    pairs: bool = False
    groups: int = 1
    hadd: bool = False
    wide: bool = True
    float_tail: bool = False  # vec_dot_f32: the tree's float sum, then the elements after it added in float

    @property
    def step(self) -> int:
        """Elements one step of the accumulators takes (tinyBLAS's KN)."""
        return self.lanes * (2 if self.pairs else 1)


# the index of an order is its kind's number above HALF_ORDER, in units of X8_REPACKED (kind % X8_REPACKED: the type)
HALF_ORDERS: tuple[HalfOrder, ...] = (
    HalfOrder("generic", 0),
    # vec.cpp ggml_vec_dot_f16: GGML_F16_STEP elements in GGML_F16_ARR vectors, GGML_F16_VEC_REDUCE
    HalfOrder("vec_dot_f16_avx2", 32, hadd=True),
    HalfOrder("vec_dot_f16_avx512", 64),
    # vec.cpp ggml_vec_dot_bf16: c1..c4 (AVX2) or c1, c2 (AVX512F) of _mul_ps then _add_ps; AVX512_BF16: dpbf16
    HalfOrder("vec_dot_bf16_avx2", 32, fused=False),
    HalfOrder("vec_dot_bf16_avx512", 32, fused=False, groups=2),
    HalfOrder("vec_dot_bf16_avx512bf16", 32, pairs=True, groups=2),
    # sgemm.cpp tinyBLAS: one vector per output element, madd (FMA or dpbf16), hsum
    HalfOrder("tinyblas_avx2", 8, wide=False),
    HalfOrder("tinyblas_avx512", 16, wide=False),
    HalfOrder("tinyblas_avx512bf16", 16, pairs=True, wide=False),
    # vec.cpp ggml_vec_dot_f32: GGML_F32_STEP elements in GGML_F32_ARR vectors, GGML_F32_VEC_REDUCE into a float,
    # then `sumf += x[i]*y[i]` (gcc: by 8 a multiply and an add each, the last K % 8 fused under FMA_CHAINS)
    HalfOrder("vec_dot_f32_avx2", 32, hadd=True, wide=False, float_tail=True),
    HalfOrder("vec_dot_f32_avx512", 64, wide=False, float_tail=True),
)
_ORDER = {order.name: i for i, order in enumerate(HALF_ORDERS)}

# (weight type, x86 level) -> ggml's vec_dot order, tinyBLAS order (ggml-cpu built for that level)
X86_ORDERS: dict[tuple[int, str], tuple[str, str]] = {
    (F32, "avx2"): ("vec_dot_f32_avx2", "tinyblas_avx2"),
    (F32, "avx512"): ("vec_dot_f32_avx512", "tinyblas_avx512"),
    (F32, "avx512bf16"): ("vec_dot_f32_avx512", "tinyblas_avx512"),
    (F16, "avx2"): ("vec_dot_f16_avx2", "tinyblas_avx2"),
    (F16, "avx512"): ("vec_dot_f16_avx512", "tinyblas_avx512"),
    (F16, "avx512bf16"): ("vec_dot_f16_avx512", "tinyblas_avx512"),
    (BF16, "avx2"): ("vec_dot_bf16_avx2", "tinyblas_avx2"),
    (BF16, "avx512"): ("vec_dot_bf16_avx512", "tinyblas_avx512"),
    (BF16, "avx512bf16"): ("vec_dot_bf16_avx512bf16", "tinyblas_avx512bf16"),
}
# AVX512-FP16 changes no product's order (its dot products still sum in f32): the AVX512_BF16 level's rows
X86_ORDERS.update({(wtype, "avx512fp16"): X86_ORDERS[(wtype, "avx512bf16")] for wtype in (F32, F16, BF16)})
# tinyBLAS::matmul takes a matrix whose rows are a multiple of this (its smallest tile height), else ggml's rows
TINYBLAS_ROW_MULTIPLE = 4
# llamafile_sgemm leaves products of fewer src1 columns to vec_dot ("only enable sgemm for prompt processing")
TINYBLAS_MIN_COLS = 2


def order_kind(wtype: int, name: str) -> int:
    """The kernel kind of `wtype`'s rows in order `name`."""
    return HALF_ORDER + X8_REPACKED * _ORDER[name] + wtype


def order_of_kind(kind: int) -> HalfOrder:
    return HALF_ORDERS[(kind - HALF_ORDER) // X8_REPACKED]


def half_kind(wtype: int, x86: bool, level: str, n_cols: int, M: int, K: int, gemm: bool) -> int:
    """The kind ggml-cpu's MUL_MAT of an F32/F16/BF16 matrix (M rows of K) by n_cols src1 columns per matrix
    computes in: numerics "ref" (`x86` False) the generic loop; x86 tinyBLAS where llamafile_sgemm takes the
    product (`gemm`: src1 contiguous or converted, not batch-invariant), else the level's vec_dot."""
    if wtype not in (F32, F16, BF16):
        raise ArgumentError(f"half_kind: weight type {wtype} is not F32 ({F32}), F16 ({F16}) or BF16 ({BF16})")
    if not x86:
        return order_kind(wtype, "generic")
    if (wtype, level) not in X86_ORDERS:
        raise ArgumentError(f"half_kind: x86 level {level!r} is not one of {sorted({lv for _, lv in X86_ORDERS})}")
    vec_dot, tinyblas = X86_ORDERS[(wtype, level)]
    step = HALF_ORDERS[_ORDER[tinyblas]].step
    if gemm and n_cols >= TINYBLAS_MIN_COLS and K % step == 0 and M % TINYBLAS_ROW_MULTIPLE == 0:
        return order_kind(wtype, tinyblas)
    return order_kind(wtype, vec_dot)


def _widen(builder, h, kind: int):
    """<n x i16> f16 or bf16 bits -> <n x float> (exact)."""
    n = h.type.count
    if kind == F16:
        return builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), n)), ir.VectorType(IR_F32, n))
    vi = ir.VectorType(IR_I32, n)
    return builder.bitcast(builder.shl(builder.zext(h, vi), ir.Constant(vi, [16] * n)), ir.VectorType(IR_F32, n))


def _weights(builder, pw, e, n: int, kind: int):
    """Elements e..e+n-1 of an F32/F16/BF16 row at byte pointer pw, as <n x float>, and their f16/bf16 bits."""
    if kind == F32:
        return vir.load_vector(builder, builder.gep(pw, [builder.shl(e, ir.Constant(e.type, 2))]), IR_F32, n), None
    bits = vir.load_vector(builder, builder.gep(pw, [builder.add(e, e)]), IR_I16, n)
    return _widen(builder, bits, kind), bits


def _flush(builder, v):
    """Denormals of float vector v as zeros of their sign (dpbf16's DAZ inputs and FTZ results)."""
    n = v.type.count
    vi = ir.VectorType(IR_I32, n)
    bits = builder.bitcast(v, vi)
    denormal = builder.icmp_unsigned("==", builder.and_(bits, ir.Constant(vi, [0x7F800000] * n)),
                                     ir.Constant(vi, [0] * n))
    return builder.bitcast(builder.select(denormal, builder.and_(bits, ir.Constant(vi, [-0x80000000] * n)), bits),
                           v.type)


def _lanes(builder, v, start: int, count: int):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, count), list(range(start, start + count))))


def _strided(builder, v, first: int):
    """Every other lane of v from `first`."""
    n = v.type.count
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, n // 2), list(range(first, n, 2))))


def _tree(builder, v, hadd: bool):
    """The sum of v's lanes by halving (lanes i and i + n/2 first); `hadd`: the last 4 as (0 + 1) + (2 + 3)."""
    n = v.type.count
    while n > (4 if hadd else 1):
        n //= 2
        v = builder.fadd(_lanes(builder, v, 0, n), _lanes(builder, v, n, n))
    if n == 1:
        return builder.extract_element(v, ir.Constant(IR_I32, 0))

    def lane(i: int):
        return builder.extract_element(v, ir.Constant(IR_I32, i))

    return builder.fadd(builder.fadd(lane(0), lane(1)), builder.fadd(lane(2), lane(3)))


def _scalar_sums(builder, pw, cols, start, K, kind: int, totals, x_bits: int = 0) -> None:
    """totals[c] (double) += double(float w[k] * x_c[k]) for start <= k < K: ggml's leftovers and generic loop
    (`x_bits`: the x rows hold the bits of that type, see src1_bits)."""
    with cgutils.for_range(builder, K, start=start) as loop:
        k = loop.index
        wk = float_value(builder, pw, k, kind)
        for px, total in zip(cols, totals, strict=True):
            xk = float_value(builder, px, k, x_bits) if x_bits else builder.load(builder.gep(px, [k]))
            product = builder.fpext(builder.fmul(wk, xk), IR_F64)
            builder.store(builder.fadd(builder.load(total), product), total)


def _bf16_bits(builder, x):
    """The bf16 bits of bf16-valued floats x (their high halves), <n x i16>."""
    n = x.type.count
    vi32 = ir.VectorType(IR_I32, n)
    return builder.trunc(builder.lshr(builder.bitcast(x, vi32), ir.Constant(vi32, [16] * n)), ir.VectorType(IR_I16, n))


def _dpbf16(builder, acc, w_bits, x_bits):
    """AVX512_BF16's vdpbf16ps on 16-lane runs: acc (<lanes x float>) with the bf16 pairs w_bits and x_bits."""
    vf, vp = ir.VectorType(IR_F32, 16), ir.VectorType(IR_I32, 16)
    fn = builder.module.declare_intrinsic("llvm.x86.avx512bf16.dpbf16ps.512", fnty=ir.FunctionType(vf, [vf, vp, vp]))
    runs = []
    for r in range(acc.type.count // 16):
        def pairs(v, r: int = r):
            return builder.bitcast(_lanes(builder, v, 32 * r, 32), vp)

        runs.append(builder.call(fn, [_lanes(builder, acc, 16 * r, 16), pairs(w_bits), pairs(x_bits)]))
    while len(runs) > 1:  # concatenate the runs back into one vector
        runs = [builder.shuffle_vector(runs[i], runs[i + 1],
                                       ir.Constant(ir.VectorType(IR_I32, 2 * runs[i].type.count),
                                                   list(range(2 * runs[i].type.count))))
                for i in range(0, len(runs), 2)]
    return runs[0]


def _block_dots(builder, pws, cols, K, kind: int, order: HalfOrder, native: bool = False,
                x_bits: int = 0, fma_chains: bool = FMA_CHAINS) -> list[list]:
    """The dots [row][column] of the F16/BF16 (`kind`) rows at byte pointers pws with the src1 rows at `cols`, K
    elements each; `native`: `pairs` by the CPU's own vdpbf16ps (the same bits); `x_bits` F16 or BF16: src1 rows
    packed as that type's bits (and flushed for `pairs`) by the caller (see src1_bits), 0: float32 values, read
    (and flushed for `pairs`) here; `fma_chains`: the float tail's last K % 8 fused (numerics.FMA_CHAINS)."""
    packed = x_bits != 0
    if packed:  # src1 rows packed as 16-bit values: byte pointers
        cols = [builder.bitcast(px, IR_I8.as_pointer()) for px in cols]
    if order.lanes == 0:
        return [_wide_totals(builder, pw, cols, [[] for _ in cols], ir.Constant(K.type, 0), K, kind, x_bits)
                for pw in pws]
    step, vf = order.step, ir.VectorType(IR_F32, order.lanes)
    shift = ir.Constant(K.type, step.bit_length() - 1)
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * order.lanes)) for _ in cols] for _ in pws]
    n_steps = builder.ashr(K, shift)
    with cgutils.for_range(builder, n_steps) as loop:
        e = builder.shl(loop.index, shift)
        loaded = [_weights(builder, pw, e, step, kind) for pw in pws]
        wv, w_bits = [v for v, _ in loaded], [bits for _, bits in loaded]
        if order.pairs and not native:
            w_odd = [_flush(builder, _strided(builder, v, 1)) for v in wv]
            w_even = [_flush(builder, _strided(builder, v, 0)) for v in wv]
        for c, px in enumerate(cols):
            if packed:
                x_raw = vir.load_vector(builder, builder.gep(px, [builder.add(e, e)]), IR_I16, step)
                xv = _widen(builder, x_raw, x_bits)
                if order.pairs:
                    x_odd, x_even = _strided(builder, xv, 1), _strided(builder, xv, 0)
            else:
                xv = vir.load_vector(builder, builder.gep(px, [e]), IR_F32, step)
                if order.pairs and native:
                    x_raw = _bf16_bits(builder, xv)
                elif order.pairs:
                    x_odd, x_even = _flush(builder, _strided(builder, xv, 1)), _flush(builder, _strided(builder, xv, 0))
            for i in range(len(pws)):
                acc = accs[i][c]
                a = builder.load(acc)
                if order.pairs and native:
                    a = _dpbf16(builder, a, w_bits[i], x_raw)
                elif order.pairs:
                    a = _flush(builder, vir.fma(builder, w_odd[i], x_odd, a))
                    a = _flush(builder, vir.fma(builder, w_even[i], x_even, a))
                elif order.fused:
                    a = vir.fma(builder, wv[i], xv, a)
                else:
                    a = builder.fadd(builder.fmul(wv[i], xv), a)
                builder.store(a, acc)
    width = order.lanes // order.groups
    sums = [[[_tree(builder, _lanes(builder, builder.load(acc), g * width, width), order.hadd)
              for g in range(order.groups)] for acc in row] for row in accs]
    if order.float_tail:
        return [_float_tails(builder, pw, cols, [groups[0] for groups in row], builder.shl(n_steps, shift), K, kind,
                             fma_chains)
                for pw, row in zip(pws, sums, strict=True)]
    if not order.wide:
        return [[groups[0] for groups in row] for row in sums]
    return [_wide_totals(builder, pw, cols, row, builder.shl(n_steps, shift), K, kind, x_bits)
            for pw, row in zip(pws, sums, strict=True)]


def _float_tails(builder, pw, cols, sums, start, K, kind: int, fma_chains: bool) -> list:
    """vec_dot_f32's end: per column its float sum, then sum += w[k] * x[k] in float for start <= k < K; gcc
    vectorizes that loop by 8 (products, then adds in order) and, with `fma_chains`, fuses the last K % 8."""
    totals = [cgutils.alloca_once_value(builder, s) for s in sums]
    fused_from = builder.sub(K, builder.and_(builder.sub(K, start), ir.Constant(K.type, 7))) if fma_chains else None
    add_float_products(builder, pw, cols, totals, start, K, kind, fused_from)
    return [builder.load(total) for total in totals]


def _wide_totals(builder, pw, cols, group_sums, start, K, kind: int, x_bits: int = 0) -> list:
    """vec_dot's end: per column the group sums added in double, then the elements start..K-1, rounded to float."""
    totals = []
    for groups in group_sums:
        total = ir.Constant(IR_F64, 0.0)
        for s in groups:
            total = builder.fadd(total, builder.fpext(s, IR_F64))
        totals.append(cgutils.alloca_once_value(builder, total))
    _scalar_sums(builder, pw, cols, start, K, kind, totals, x_bits)
    return [builder.fptrunc(builder.load(total), IR_F32) for total in totals]


# weight rows one pass of the tinyBLAS orders takes (their accumulators fit the vector registers)
ROW_BLOCK = 4
# src1 columns a pass of the tinyBLAS orders takes: ROW_BLOCK x 6 accumulators with AVX512's 32 vector registers
# (sgemm.cpp's RM 4 x RN 6 tile there), ir.COLS with 16
TINYBLAS_COLS = 6 if HAS_AVX512 else COLS


def cols_per_pass(kind: int) -> int:
    """The most src1 columns one call of half-order kind `kind`'s loop (half_cols) takes."""
    order = order_of_kind(kind)
    return COLS if order.wide or order.float_tail else TINYBLAS_COLS


def make_half_cols(kind: int, order: HalfOrder, native: bool = False, x_bits: int = 0,
                   fma_chains: bool = FMA_CHAINS):
    """F16 or BF16 (`kind`) weight rows times src1 rows holding values of that type, in `order`:
    `dot(w, w_off, base, m0, m1, x, r, n, out)` writes out[r + c, m] for c < n <= COLS (TINYBLAS_COLS for the
    tinyBLAS orders) and m0 <= m < m1, the weight row at byte w[w_off[base + m]], whole rows of x (K = its row
    length); the tinyBLAS orders ROW_BLOCK rows at a time. `native`, `x_bits`, `fma_chains`: see _block_dots."""
    tinyblas = not (order.wide or order.float_tail)

    # vec_dot's accumulators fill several vector registers a row: more rows a pass would spill them, but one
    # column leaves room for two (src1's row is read once for both: a long row no longer fits L1 beside it)
    def block_rows(count: int) -> int:
        if not tinyblas:
            return 2 if count == 1 else 1
        return ROW_BLOCK

    @intrinsic
    def dot_half_order(typingctx, w, w_off, base, m0, m1, x, r, n, out):
        ip = types.intp
        sig = types.void(w, w_off, ip, ip, ip, x, ip, ip, out)

        def codegen(context, builder, signature, args):
            ty, r, m0, m1 = signature.args, args[6], args[3], args[4]
            w_data, offsets = vir.weight_pointers(context, builder, signature, args)

            def rows(count: int) -> None:
                cols, K = [], None
                for c in range(count):
                    p, K = vir.row_pointer(context, builder, ty[5], args[5], builder.add(r, ir.Constant(r.type, c)))
                    cols.append(p)

                def block(m, n_rows: int) -> None:
                    pws = [builder.gep(w_data, [builder.load(builder.gep(offsets, [builder.add(
                        m, ir.Constant(m.type, i))]))]) for i in range(n_rows)]
                    for i, dots in enumerate(_block_dots(builder, pws, cols, K, kind, order, native, x_bits,
                                                         fma_chains)):
                        vir.store_columns(context, builder, ty[8], args[8], r, builder.add(m, ir.Constant(m.type, i)),
                                      dots)

                vir.in_blocks(builder, m0, m1, block_rows(count), block)

            vir.per_count(builder, args[7], TINYBLAS_COLS if tinyblas else COLS, rows)
            return context.get_dummy_value()

        return sig, codegen

    return dot_half_order


# the host runs vdpbf16ps itself (numba compiles for the host): the dpbf16 orders take it, bits unchanged
HOST_DPBF16 = bool(llvm_binding.get_host_cpu_features().get("avx512bf16", False))
# the loops by kind and packing (compiled on first use)
_LOOPS: dict[tuple[int, bool], object] = {}


def src1_bits(kind: int) -> int:
    """The type whose bits MUL_MAT packs src1's rows in for half-order kind `kind`, 0 for float32 rows: the dpbf16
    orders read bf16 pairs (ggml's vec_dot_type data); the others read float32 values of the weights' type (an F16
    row's conversion of src1 costs more than its float32 row's reads: benchmarks/README.md)."""
    return BF16 if order_of_kind(kind).pairs else 0


def half_cols(kind: int, packed: bool):
    """The row loop of half-order kind `kind`: src1 `packed` as src1_bits says, or float32 rows."""
    if (kind, packed) not in _LOOPS:
        order = order_of_kind(kind)
        _LOOPS[(kind, packed)] = make_half_cols(kind % X8_REPACKED, order, order.pairs and HOST_DPBF16,
                                                src1_bits(kind) if packed else 0)
    return _LOOPS[(kind, packed)]
