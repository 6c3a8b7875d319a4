"""Weight rows to float32 (ggml's dequantize_row_<type>, the same arithmetic), and F16/BF16 rows widened: the CPU
backend's one dequantizer.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    element_pointer,
)
from pyggml.backends.cpu.kernels.vec_dot.block_sums import q4_0_nibbles
from pyggml.backends.cpu.kernels.vec_dot.ir import (
    IR_F32,
    IR_I8,
    IR_I32,
    load_bf16,
    load_f16,
    load_f32,
    load_u32,
    load_vector,
    splat,
    widen_bf16x32,
    widen_f16x32,
)
from pyggml.backends.cpu.kernels.vec_dot.kinds import (
    F16,
    IQ4_NL,
    KVALUES,
    MXFP4,
)
from pyggml.backends.cpu.kernels.vec_dot.quant_loops import e8m0_half
from pyggml.backends.cpu.kernels.vec_dot.reference_dots import i8, iq4_xs_scale, q3_K_scale, scale_min_k4
from pyggml.backends.cpu.kernels.vec_dot.table_lookup import lookup16


@intrinsic
def load_e8m0_half(typingctx, w, i):
    """ggml_e8m0_to_fp32_half of the byte at offset `i` of uint8 array `w` (MXFP4's scale)."""
    sig = types.float32(w, types.intp)

    def codegen(context, builder, signature, args):
        return e8m0_half(builder, builder.load(element_pointer(context, builder, signature.args[0], args[0], args[1])))

    return sig, codegen


def _make_deq_table32(kind: int):
    @intrinsic
    def deq_table32(typingctx, w, i, d, out, j):
        sig = types.void(w, types.intp, types.float32, out, types.intp)

        def codegen(context, builder, signature, args):
            pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
            v = lookup16(builder, KVALUES[kind], q4_0_nibbles(builder, pw))
            vf = ir.VectorType(IR_F32, 32)
            f = builder.fmul(splat(builder, args[2], 32), builder.sitofp(v, vf))  # ggml: d * kvalues[q]
            po = element_pointer(context, builder, signature.args[3], args[3], args[4])
            builder.store(f, builder.bitcast(po, vf.as_pointer()), align=1)
            return context.get_dummy_value()

        return sig, codegen

    return deq_table32


deq_iq4_32 = _make_deq_table32(IQ4_NL)
deq_iq4_32.__doc__ = "out[j+t] = d * kvalues_iq4nl[nibble t of the 16 bytes at w[i]], t < 32."
deq_mxfp4_32 = _make_deq_table32(MXFP4)
deq_mxfp4_32.__doc__ = "out[j+t] = d * kvalues_mxfp4[nibble t of the 16 bytes at w[i]], t < 32."


# the bias of the types whose values are q * d alone: x + (-0.0) is x, a zero's sign included (+0.0 would turn
# ggml's -0.0 into +0.0)
NO_BIAS = np.float32(-0.0)


def _store_scaled(builder, context, signature, args, v, n: int, d, bias, out_arg: int):
    """out[j+t] = float(v[t]) * d + bias (an fmul then an fadd, as ggml's dequantize_row code)."""
    vf = ir.VectorType(IR_F32, n)
    f = builder.fadd(builder.fmul(builder.sitofp(v, vf), splat(builder, d, n)), splat(builder, bias, n))
    po = element_pointer(context, builder, signature.args[out_arg], args[out_arg], args[out_arg + 1])
    builder.store(f, builder.bitcast(po, vf.as_pointer()), align=1)
    return context.get_dummy_value()


def _make_deq_fields(n: int):
    @intrinsic
    def deq_fields(typingctx, w, i1, s1, m1, i2, s2, m2, mul2, off, d, bias, out, j):
        ip = types.intp
        sig = types.void(w, ip, ip, ip, ip, ip, ip, ip, ip, types.float32, types.float32, out, ip)

        def codegen(context, builder, signature, args):
            v32 = ir.VectorType(IR_I32, n)

            def field(pos: int) -> ir.Value:
                p = element_pointer(context, builder, signature.args[0], args[0], args[pos])
                q = builder.zext(load_vector(builder, p, IR_I8, n), v32)
                sh = splat(builder, builder.trunc(args[pos + 1], IR_I32), n)
                return builder.and_(builder.lshr(q, sh), splat(builder, builder.trunc(args[pos + 2], IR_I32), n))

            v = builder.add(field(1), builder.mul(field(4), splat(builder, builder.trunc(args[7], IR_I32), n)))
            v = builder.add(v, splat(builder, builder.trunc(args[8], IR_I32), n))
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
        v32 = ir.VectorType(IR_I32, 32)
        pw = element_pointer(context, builder, signature.args[0], args[0], args[1])
        q = load_vector(builder, pw, IR_I8, 16)
        lo = builder.and_(q, ir.Constant(ir.VectorType(IR_I8, 16), [15] * 16))
        hi = builder.lshr(q, ir.Constant(ir.VectorType(IR_I8, 16), [4] * 16))
        nib = builder.zext(builder.shuffle_vector(lo, hi, ir.Constant(v32, list(range(32)))), v32)
        hb = builder.lshr(splat(builder, args[2], 32), ir.Constant(v32, list(range(32))))
        hb = builder.shl(builder.and_(hb, ir.Constant(v32, [1] * 32)), ir.Constant(v32, [4] * 32))
        v = builder.add(builder.or_(nib, hb), splat(builder, builder.trunc(args[3], IR_I32), 32))
        return _store_scaled(builder, context, signature, args, v, 32, args[4], args[5], 6)

    return sig, codegen



# --- weight rows -> float32 (ggml's dequantize_row_<type>, same arithmetic) ---


@njit(nogil=True, cache=True)
def dequantize_row_q4_0(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 18 * b
        d = load_f16(w, ob)
        deq_fields16(w, ob + 2, 0, 15, ob, 0, 0, 0, -8, d, NO_BIAS, out, oo + 32 * b)
        deq_fields16(w, ob + 2, 4, 15, ob, 0, 0, 0, -8, d, NO_BIAS, out, oo + 32 * b + 16)


@njit(nogil=True, cache=True)
def dequantize_row_q4_1(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 20 * b
        d = load_f16(w, ob)
        m = load_f16(w, ob + 2)
        deq_fields16(w, ob + 4, 0, 15, ob, 0, 0, 0, 0, d, m, out, oo + 32 * b)
        deq_fields16(w, ob + 4, 4, 15, ob, 0, 0, 0, 0, d, m, out, oo + 32 * b + 16)


@njit(nogil=True, cache=True)
def dequantize_row_q5(w, o, nb, out, i, with_min):
    """Q5_0 (22-byte blocks, value (q - 16) * d) and Q5_1 (24, value q * d + m)."""
    oo = i * out.shape[1]
    for b in range(nb):
        if with_min:
            ob = o + 24 * b
            deq_q5(w, ob + 8, load_u32(w, ob + 4), 0, load_f16(w, ob), load_f16(w, ob + 2), out, oo + 32 * b)
        else:
            ob = o + 22 * b
            deq_q5(w, ob + 6, load_u32(w, ob + 2), -16, load_f16(w, ob), NO_BIAS, out, oo + 32 * b)


@njit(nogil=True, cache=True)
def dequantize_row_q8_0(w, o, nb, out, i):
    # int8 = byte - 256 * (byte >> 7)
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 34 * b
        deq_fields32(w, ob + 2, 0, 255, ob + 2, 7, 1, -256, 0, load_f16(w, ob), NO_BIAS, out, oo + 32 * b)


@njit(nogil=True, cache=True)
def dequantize_row_q2_K(w, o, nb, out, i):
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
def dequantize_row_q3_K(w, o, nb, out, i):
    # value = low2 - (high bit ? 0 : 4) = low2 + 4 * high bit - 4
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 110 * b
        d = load_f16(w, ob + 108)
        for h in range(2):
            for s in range(4):
                for t in range(2):
                    dl = d * np.float32(q3_K_scale(w, ob + 96, 8 * h + 2 * s + t))
                    deq_fields16(w, ob + 32 + 32 * h + 16 * t, 2 * s, 3, ob + 16 * t, 4 * h + s, 1, 4, -4, dl, NO_BIAS,
                                 out, oo + 256 * b + 128 * h + 32 * s + 16 * t)


@njit(nogil=True, cache=True)
def dequantize_row_q45_K(w, o, nb, out, i, five):
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
                sc, mn = scale_min_k4(w, ob + 4, 2 * k + h)
                d1 = d * np.float32(sc)
                m1 = dmin * np.float32(mn)
                deq_fields32(w, qs + 32 * k, 4 * h, 15, ob + 16, 2 * k + h, 1, 16 if five else 0, 0, d1, -m1,
                             out, oo + 256 * b + 64 * k + 32 * h)


@njit(nogil=True, cache=True)
def dequantize_row_q6_K(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 210 * b
        d = load_f16(w, ob + 208)
        for n in range(2):
            for q in range(4):
                for t in range(2):
                    sub = 8 * n + 2 * q + t
                    ds = d * np.float32(i8(np.int64(w[ob + 192 + sub])))
                    deq_fields16(w, ob + 64 * n + 32 * (q & 1) + 16 * t, 4 * (q >> 1), 15,
                                 ob + 128 + 32 * n + 16 * t, 2 * q, 3, 16, -32, ds, NO_BIAS,
                                 out, oo + 256 * b + 128 * n + 32 * q + 16 * t)


@njit(nogil=True, cache=True)
def dequantize_row_iq4_nl(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 18 * b
        deq_iq4_32(w, ob + 2, load_f16(w, ob), out, oo + 32 * b)


@njit(nogil=True, cache=True)
def dequantize_row_iq4_xs(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 136 * b
        d = load_f16(w, ob)
        for ib in range(8):
            deq_iq4_32(w, ob + 8 + 16 * ib, d * np.float32(iq4_xs_scale(w, ob, ib)), out, oo + 256 * b + 32 * ib)


@njit(nogil=True, cache=True)
def dequantize_row_mxfp4(w, o, nb, out, i):
    oo = i * out.shape[1]
    for b in range(nb):
        ob = o + 17 * b
        deq_mxfp4_32(w, ob + 1, load_e8m0_half(w, ob), out, oo + 32 * b)


@njit(nogil=True, cache=True)
def half_row_to_f32(w, o, nb, out, i, kind):
    """ggml_fp16_to_fp32_row or ggml_bf16_to_fp32_row (`kind`): the row at byte o into out[i] (nb unused: the
    row is out's width)."""
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
def dequantize_row_q8(w, o, nb, out, i, k_quants):
    """Q8_1 (36-byte blocks: f16 d, f16 s, int8 qs[32]) or, `k_quants`, Q8_K (292: f32 d, int8 qs[256], int16
    bsums[16]): value d * q."""
    size, n = (292, 256) if k_quants else (36, 32)
    for b in range(nb):
        ob = o + size * b
        d = load_f32(w, ob) if k_quants else load_f16(w, ob)
        for t in range(n):
            out[i, n * b + t] = d * np.float32(i8(np.int64(w[ob + 4 + t])))


@njit(nogil=True, cache=True)
def f32_row_to_f32(w, o, nb, out, i):
    """The F32 row at byte o copied into out[i] (nb unused: the row is out's width)."""
    for k in range(out.shape[1]):
        out[i, k] = load_f32(w, o + 4 * k)
