"""src1 rows converted to the weights' vec_dot_type as ggml's quantize_row_q8_0/q8_1 (x86 or _ref) and q8_K do,
split into values yq, scales yd, Q8_1's sums ys and 16-value sums yb (DESIGN.md, "src1 to the vec_dot type")."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.ir import IR_F32, IR_I8, IR_I32, load_vector, reduce_add_i32, round_f16, splat
from pyggml.backends.cpu.kernels.vec_dot.kinds import F16, Q8_0, Q8_1

# numerics codes (numerics.NUMERICS_CODES): numba compiles on ints
ROUND_REF = 0
ROUND_X86 = 1
NO_ROUNDING = -1


@njit(nogil=True, cache=True)
def _roundf(v: float) -> int:
    """C's roundf: nearest integer, halves away from zero (exact: |v| + 0.5 is exact in float64)."""
    a = np.floor(abs(np.float64(v)) + 0.5)
    return int(a) if v >= 0 else -int(a)


@intrinsic
def abs_max32(typingctx, x, i):
    """max |x[i+t]|, t < 32, as the integer max of the bits without sign: exact for non-NaN, else a NaN."""
    sig = types.float32(x, types.intp)

    def codegen(context, builder, signature, args):
        v = load_vector(builder, element_pointer(context, builder, signature.args[0], args[0], args[1]), IR_I32, 32)
        v = builder.and_(v, ir.Constant(ir.VectorType(IR_I32, 32), [0x7FFFFFFF] * 32))
        fnty = ir.FunctionType(IR_I32, [v.type])
        m = builder.call(builder.module.declare_intrinsic("llvm.vector.reduce.smax.v32i32", fnty=fnty), [v])
        return builder.bitcast(m, IR_F32)

    return sig, codegen


def _make_quantize_block32(rounding: int):
    @intrinsic
    def quantize_block32(typingctx, x, i, mul, yq, j, yb, k):
        sig = types.int32(x, types.intp, types.float32, yq, types.intp, yb, types.intp)

        def codegen(context, builder, signature, args):
            vf = ir.VectorType(IR_F32, 32)
            v = load_vector(builder, element_pointer(context, builder, signature.args[0], args[0], args[1]), IR_F32, 32)
            p = builder.fmul(v, splat(builder, args[2], 32))  # the float32 products, as both C paths
            name = "llvm.rint.v32f32" if rounding == ROUND_X86 else "llvm.round.v32f32"
            q = builder.call(builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vf, [vf])), [p])
            q32 = builder.fptosi(q, ir.VectorType(IR_I32, 32))
            py = element_pointer(context, builder, signature.args[3], args[3], args[4])
            builder.store(builder.trunc(q32, ir.VectorType(IR_I8, 32)),
                          builder.bitcast(py, ir.VectorType(IR_I8, 32).as_pointer()), align=1)
            half = ir.VectorType(IR_I32, 16)
            s0 = reduce_add_i32(builder, builder.shuffle_vector(q32, q32, ir.Constant(half, list(range(16)))), 16)
            s1 = reduce_add_i32(builder, builder.shuffle_vector(q32, q32, ir.Constant(half, list(range(16, 32)))),
                                 16)
            pb = element_pointer(context, builder, signature.args[5], args[5], args[6])
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
def q8_block_scalar(x, yq, yb, r, b, rounding):
    """(amax / 127, sum of the quants): block b of row r into yq and yb one value at a time, ggml's MAX left to
    right (rows holding an inf or NaN)."""
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
    """Row r of x to Q8_0 blocks, or Q8_1 (`with_s`), in three vector passes; a non-finite row block by block
    (q8_block_scalar). Q8_0 uses ys as scratch."""
    nb = x.shape[1] // 32
    o = r * x.shape[1]
    finite = True
    for b in range(nb):
        amax = abs_max32(x, o + 32 * b)
        finite &= amax < np.float32(np.inf)
        yd[r, b] = amax
    if not finite:
        for b in range(nb):
            d, total = q8_block_scalar(x, yq, yb, r, b, rounding)
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
    """Block b's d rounded through f16, and for Q8_1 s = f16(sum * d) from the unrounded d: what the blocks store."""
    yd[r, b] = round_f16(d)
    if with_s:
        ys[r, b] = round_f16(np.float32(total) * d)


_NEAREST_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23: ggml's nearest_int adds it and reads the low mantissa bits


@njit(nogil=True, cache=True, error_model="numpy")  # C's division: an infinite value's scale is 1/-0.0, not an error
def _quantize_q8_K_row(x, yq, yd, yb, r):
    """Row r of x to Q8_K blocks as quantize_row_q8_K_ref, in passes LLVM vectorizes: the largest magnitude by its
    bits (a NaN's are larger than every number's: such a block goes through _quantize_q8_K_block_scalar)."""
    nb = x.shape[1] // 256
    xr, qr = x[r], yq[r]
    bits = xr.view(np.int32)
    scaled = np.empty(256, np.float32)
    near = scaled.view(np.int32)
    for b in range(nb):
        k0 = b * 256
        top = 0
        for t in range(256):
            top = max(top, bits[k0 + t] & 0x7FFFFFFF)
        if top > 0x7F800000:
            _quantize_q8_K_block_scalar(x, yq, yd, yb, r, b)
            continue
        if top == 0:
            yd[r, b] = 0.0
            yq[r, k0:k0 + 256] = 0
            yb[r, 16 * b:16 * b + 16] = 0
            continue
        first = 256
        for t in range(256):  # the first value of that magnitude, as ggml's `ax > amax`
            first = min(first, t if bits[k0 + t] & 0x7FFFFFFF == top else 256)
        iscale = np.float32(-127.0) / xr[k0 + first]
        for t in range(256):
            scaled[t] = iscale * xr[k0 + t] + _NEAREST_MAGIC
        for t in range(256):
            near[t] = min(127, (near[t] & 0x007FFFFF) - 0x00400000)
            qr[k0 + t] = near[t]
        for g in range(16):
            s = 0
            for t in range(16):
                s += near[16 * g + t]
            yb[r, 16 * b + g] = s
        yd[r, b] = np.float32(1.0) / iscale


@njit(nogil=True, cache=True, error_model="numpy")
def _quantize_q8_K_block_scalar(x, yq, yd, yb, r, b):
    """Block b of row r to Q8_K value by value, as quantize_row_q8_K_ref (its NaNs never the largest magnitude)."""
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
        yq[r, k0:k0 + 256] = 0
        yb[r, 16 * b:16 * b + 16] = 0
        return
    iscale = np.float32(-127.0) / vmax
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
    """Quantize float32 rows x (n, K) to `kind` (Q8_0, Q8_1 with `rounding`, or Q8_K), on one thread; x, yq and yb
    C-contiguous (read and written 32 values at once)."""
    if not (x.flags.c_contiguous and yq.flags.c_contiguous and yb.flags.c_contiguous):
        raise ValueError("quantize_rows: x, yq and yb must be C-contiguous")
    for r in range(x.shape[0]):
        if kind == Q8_0 or kind == Q8_1:
            _quantize_q8_row(x, yq, yd, ys, yb, r, rounding, kind == Q8_1)
        else:
            _quantize_q8_K_row(x, yq, yd, yb, r)


@njit(nogil=True, cache=True, inline="always")
def _bf16_rounded(u):
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # GGML_FP32_TO_BF16: a NaN stays a quiet NaN
        return (u | np.uint32(0x400000)) & np.uint32(0xFFFF0000)
    return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)  # ties to even


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
        bits[k] = _bf16_rounded(bits[k])


@njit(nogil=True, cache=True)
def pack_bf16_pairs(src, x):
    """src's rows as dpbf16 reads them (bf16, denormals zeroed) packed in x's first halves; src may be x."""
    for i in range(src.shape[0]):
        out = x[i].view(np.uint16)
        bits = src[i].view(np.uint32)
        for k in range(bits.shape[0]):
            u = _bf16_rounded(bits[k])
            if u & np.uint32(0x7F800000) == 0:
                u &= np.uint32(0x80000000)
            out[k] = np.uint16(u >> np.uint32(16))


@njit(nogil=True, cache=True)
def half_rows_in_place(kind, pack, x):
    """x's rows as a half order reads them: packed (pack_bf16_pairs), or rounded to `kind` (NO_ROUNDING: kept)."""
    if pack:
        pack_bf16_pairs(x, x)
    elif kind != NO_ROUNDING:
        round_rows(kind, x)
