"""ggml's vector exp and what it builds (softmax rows, SiLU, SwiGLU), float for float, per `numerics`: ggml_v_expf
in blocks of `lanes` (16: AVX512, 8: AVX2, 0: libm only), libm's expf on the rest (DESIGN.md, "ggml's vector exp")."""

from __future__ import annotations

import math

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import element_pointer
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, fma_f32, load_vector, sum_f32_tree

_F = np.float32
_R = _F(float.fromhex("0x1.8p23"))
_LOG2E = _F(float.fromhex("0x1.715476p+0"))
_LN2_HI = _F(float.fromhex("0x1.62e4p-1"))
_LN2_LO = _F(float.fromhex("0x1.7f7d1cp-20"))
_P5 = _F(float.fromhex("0x1.0e4020p-7"))
_P4 = _F(float.fromhex("0x1.573e2ep-5"))
_P3 = _F(float.fromhex("0x1.555e66p-3"))
_P2 = _F(float.fromhex("0x1.fffdb6p-2"))
_P1 = _F(float.fromhex("0x1.ffffecp-1"))


def host_lanes(numerics: str) -> int:
    """The lanes of ggml's vector exp for `numerics` here: "ref" 0; "x86" 16 with AVX512F and AVX512DQ, else 8."""
    if numerics != "x86":
        return 0
    features = llvm_binding.get_host_cpu_features()
    return 16 if features.get("avx512f", False) and features.get("avx512dq", False) else 8


def _bitcast(to: types.Type, frm: types.Type, ir_to: ir.Type, doc: str):
    """An intrinsic reinterpreting a `frm` scalar's bits as `to` (no memory, so that loops of it vectorize)."""

    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir_to)

        return to(frm), codegen

    cast.__doc__ = doc
    return cast


_bits = _bitcast(types.uint32, types.float32, ir.IntType(32), "The bits of a float32.")
_from_bits = _bitcast(types.float32, types.uint32, ir.FloatType(), "The float32 of these bits.")
_f64_from_bits = _bitcast(types.float64, types.uint64, ir.DoubleType(), "The float64 of these bits.")


@njit(nogil=True, cache=True, inline="always")
def _poly(x):
    """ggml_v_expf's common part: z, n (x / ln 2 rounded by the 1.5 * 2^23 trick), b (the reduced argument),
    u = b * b and the polynomial's high terms."""
    z = fma_f32(x, _LOG2E, _R)
    n = z - _R
    b = fma_f32(-n, _LN2_LO, fma_f32(-n, _LN2_HI, x))
    u = b * b
    hi = fma_f32(fma_f32(_P5, b, _P4), u, fma_f32(_P3, b, _P2))
    return z, n, b, u, hi


@njit(nogil=True, cache=True, inline="always")
def _expf16(x):
    """One lane of ggml's AVX512 ggml_v_expf: the polynomial's 1 inside, then _mm512_scalef_ps (j * 2^n,
    the exact product rounded once: 2^n built as a float64's bits)."""
    z, n, b, u, hi = _poly(x)
    j = fma_f32(hi, u, fma_f32(_P1, b, np.float32(1.0)))
    if abs(n) > 192:  # also NaN-free for x = -inf: n = -inf
        return np.float32(np.inf) if n > 0 else np.float32(0.0)
    return np.float32(np.float64(j) * _f64_from_bits(np.uint64(np.int64(n) + 1023) << np.uint64(52)))


@njit(nogil=True, cache=True, inline="always")
def _expf8(x):
    """One lane of ggml's AVX2 ggml_v_expf: the scale fma(j, 2^n, 2^n), split in two for large |n|."""
    z, n, b, u, hi = _poly(x)
    j = fma_f32(hi, u, _P1 * b)
    e = (_bits(z) << np.uint32(23)) & np.uint32(0xFFFFFFFF)
    k = _from_bits((e + np.uint32(0x3F800000)) & np.uint32(0xFFFFFFFF))
    an = abs(n)
    if not an > 126:
        return fma_f32(j, k, k)
    if an > 192:
        s1 = _from_bits(np.uint32(0x82000000 if n <= 0 else 0) + np.uint32(0x7F000000))
        return s1 * s1
    g = np.uint32(0x82000000) if n <= 0 else np.uint32(0)
    s1 = _from_bits((g + np.uint32(0x7F000000)) & np.uint32(0xFFFFFFFF))
    s2 = _from_bits((e - g) & np.uint32(0xFFFFFFFF))
    return fma_f32(s2, j, s2) * s1


@njit(nogil=True, cache=True)
def v_expf(x, lanes):
    """One lane of ggml_v_expf (lanes 16: AVX512, 8: AVX2), or libm's expf (lanes 0)."""
    if lanes == 16:
        return _expf16(x)
    if lanes == 8:
        return _expf8(x)
    return np.float32(math.exp(x))


@njit(nogil=True, cache=True, error_model="numpy")
def expf_inplace(a):
    """a = libm's expf(a) elementwise (any C-contiguous float32 array)."""
    f = a.reshape(-1)
    for i in range(f.shape[0]):
        f[i] = math.exp(f[i])


def _make_tree_sum(lanes: int):
    @intrinsic
    def tree_sum(typingctx, a, i):
        def codegen(context, builder, signature, args):
            p = element_pointer(context, builder, signature.args[0], args[0], args[1])
            return sum_f32_tree(builder, load_vector(builder, p, IR_F32, lanes), lanes)

        return types.float32(a, types.intp), codegen

    tree_sum.__doc__ = (f"a[i:i + {lanes}] (a float32 row, unit stride) summed by halves (lanes j and j + w/2 "
                        "first): _mm512_reduce_add_ps, and for 8 lanes ggml's extract-high + movehl + movehdup "
                        "sequence (the same pairs), in vector instructions")
    return tree_sum


_tree_sum16 = _make_tree_sum(16)
_tree_sum8 = _make_tree_sum(8)


@intrinsic
def _lanes_max(typingctx, a, n):
    """The maximum of a[:n] as MAX(x, y) = x > y ? x : y in 16 lanes, then the tail; NaN if any value is NaN."""
    def codegen(context, builder, signature, args):
        def max_into(ptr, x) -> None:  # *ptr = MAX(*ptr, x), ggml's x > y ? x : y (lanes or scalars)
            old = builder.load(ptr)
            builder.store(builder.select(builder.fcmp_ordered(">", old, x), old, x), ptr)

        def or_into(ptr, flag) -> None:
            builder.store(builder.or_(builder.load(ptr), flag), ptr)

        v16 = ir.VectorType(IR_F32, 16)
        i32 = ir.IntType(32)
        base = element_pointer(context, builder, signature.args[0], args[0], ir.Constant(args[1].type, 0))
        n = args[1]
        sixteen = ir.Constant(n.type, 16)
        n_blocks = builder.sdiv(n, sixteen)
        acc = cgutils.alloca_once_value(builder, ir.Constant(v16, [float("-inf")] * 16))
        nan = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(ir.IntType(1), 16), [0] * 16))
        with cgutils.for_range(builder, n_blocks) as loop:
            v = load_vector(builder, builder.gep(base, [builder.mul(loop.index, sixteen)]), IR_F32, 16)
            max_into(acc, v)
            or_into(nan, builder.fcmp_unordered("uno", v, v))
        lanes, nans = builder.load(acc), builder.load(nan)
        best = cgutils.alloca_once_value(builder, builder.extract_element(lanes, ir.Constant(i32, 0)))
        any_nan = cgutils.alloca_once_value(builder, ir.Constant(ir.IntType(1), 0))
        for j in range(16):
            max_into(best, builder.extract_element(lanes, ir.Constant(i32, j)))
            or_into(any_nan, builder.extract_element(nans, ir.Constant(i32, j)))
        with cgutils.for_range(builder, n, start=builder.mul(n_blocks, sixteen)) as loop:
            x = builder.load(builder.gep(base, [loop.index]))
            max_into(best, x)
            or_into(any_nan, builder.fcmp_unordered("uno", x, x))
        return builder.select(builder.load(any_nan), ir.Constant(IR_F32, float("nan")), builder.load(best))

    return types.float32(a, types.intp), codegen


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def row_max(t, n):
    """ggml_vec_max_f32 of t[:n]: MAX left to right (16 lanes where no value is NaN, see _lanes_max)."""
    mx = _lanes_max(t, n)
    if mx != mx:
        mx = np.float32(-np.inf)
        for i in range(n):
            mx = mx if mx > t[i] else t[i]
    return mx


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def softmax_exp_row(t, out, m, lanes):
    """ggml_vec_soft_max_f32 on one row: out = exp(t - m) (out may be t), returning ggml's sum in double."""
    n = t.shape[0]
    n_simd = n - n % lanes if lanes > 0 else 0
    if lanes == 16:
        for i in range(n_simd):
            out[i] = _expf16(t[i] - m)
    elif lanes == 8:
        for i in range(n_simd):
            out[i] = _expf8(t[i] - m)
    total = 0.0
    if lanes == 16:
        for i in range(0, n_simd, 16):
            total += np.float64(_tree_sum16(out, i))
    elif lanes == 8:
        for i in range(0, n_simd, 8):
            total += np.float64(_tree_sum8(out, i))
    for i in range(n_simd, n):
        val = np.float32(math.exp(t[i] - m))
        out[i] = val
        total += np.float64(val)
    return total


@njit(nogil=True, cache=True, error_model="numpy")
def softmax_exp_rows(t, mx, sums, lanes):
    """softmax_exp_row on each row r of t (2-D, in place) with the maximum mx[r], its sum into sums[r]."""
    for r in range(t.shape[0]):
        sums[r] = softmax_exp_row(t[r], t[r], mx[r], lanes)


@njit(nogil=True, cache=True, error_model="numpy")
def silu_rows(x, out, g, lanes):
    """ggml_vec_silu_f32 (g empty) or ggml_vec_swiglu_f32 on each row of x: ggml_v_silu, then libm on the rest."""
    gated = g.shape[0] > 0
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for r in range(x.shape[0]):
        n = x.shape[1]
        n_simd = n - n % lanes if lanes > 0 else 0
        # one loop per lane count and gating, each without a branch per value (they vectorize)
        if lanes == 16:
            if gated:
                for i in range(n_simd):
                    v = x[r, i]
                    out[r, i] = v / (one + _expf16(zero - v)) * g[r, i]
            else:
                for i in range(n_simd):
                    v = x[r, i]
                    out[r, i] = v / (one + _expf16(zero - v))
        elif lanes == 8:
            if gated:
                for i in range(n_simd):
                    v = x[r, i]
                    out[r, i] = v / (one + _expf8(zero - v)) * g[r, i]
            else:
                for i in range(n_simd):
                    v = x[r, i]
                    out[r, i] = v / (one + _expf8(zero - v))
        for i in range(n_simd, n):
            v = x[r, i]
            s = v / (one + np.float32(math.exp(-v)))
            out[r, i] = s * g[r, i] if gated else s
