"""Row conversion between ggml types and float32: ggml's `to_float` / `from_float`.

The types of `IMPLEMENTED_TYPES` convert to float32 (ggml's dequantize_row_*);
those of `FROM_FLOAT_TYPES` convert from float32 too (ggml's type_traits
from_float_ref, quantize_row_*_ref of ggml-quants.c at llama.cpp 0c1e570, with
the helpers make_qx_quants, make_q3_quants, make_qkx2_quants and
quantize_row_iq4_nl_impl): all but the lattice types (IQ2/IQ3/IQ1,
pyggml.core.quants_iq), which convert to float32 only, as ggml's CPU has no
from_float for them. `quantize_chunk` is what
ggml_quantize_chunk writes without an importance matrix (llama-quantize's
bytes): the same as from_float except for IQ4_NL, whose file quantizer
searches more scales.

The quantizers are written with numpy over all blocks at once and reproduce
the C code's float32 arithmetic operation by operation, so the bytes are
ggml's bytes (the tests compare them with the C library's): sums the C code
accumulates weight by weight are added in the same order (never with np.sum,
which adds pairwise), ggml's `nearest_int` is reproduced bit for bit, and C's
choices among equal values (first maximum, sign of a zero) are kept. Where C
leaves bytes unset (the quants of an IQ4_NL block of scale 0, the bsums of an
all-zero Q8_K block), pyggml writes what ggml_quantize_chunk writes, or zeros.

That is ggml built without fused multiply-adds, as libggml-base is even in a
`-march=native` build (only ggml-cpu gets the native flags); code compiled
with FMA contraction rounds some intermediates differently and writes
different bytes for a few percent of the K-quant blocks. Non-finite inputs
give well-formed blocks of no particular meaning, as in ggml.

Block layouts are in `BLOCK_DTYPES` (numpy structured dtypes whose fields are
the C struct's fields, little-endian, at the C offsets) and in the docstring
of each type's dequantizer. MUL_MAT converts src1 to its weight's
`vec_dot_type` with `quantize_q8_0` / `quantize_q8_1` / `quantize_q8_K`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pyggml.core.errors import ArgumentError, GGMLError, UnsupportedTypeError
from pyggml.core.quants_iq import IQ_TYPES, no_from_float_error
from pyggml.core.types import QK_K, TYPE_TRAITS, GGMLType, as_type

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)  # ggml-quants.c: a (sub-)block of smaller magnitude quantizes to 0

# --- block layouts -----------------------------------------------------------

BLOCK_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    GGMLType.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
    GGMLType.Q5_0: np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    GGMLType.Q5_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    GGMLType.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
    GGMLType.Q8_1: np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)]),
    GGMLType.Q2_K: np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")]),
    GGMLType.Q3_K: np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")]),
    GGMLType.Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    GGMLType.Q5_K: np.dtype(
        [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    ),
    GGMLType.Q6_K: np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
    GGMLType.Q8_K: np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)]),
    GGMLType.IQ4_NL: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    GGMLType.IQ4_XS: np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)]),
    GGMLType.TQ1_0: np.dtype([("qs", "u1", 48), ("qh", "u1", 4), ("d", "<f2")]),
    GGMLType.TQ2_0: np.dtype([("qs", "u1", 64), ("d", "<f2")]),
    GGMLType.MXFP4: np.dtype([("e", "u1"), ("qs", "u1", 16)]),
    GGMLType.NVFP4: np.dtype([("d", "u1", 4), ("qs", "u1", 32)]),
    GGMLType.Q1_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    GGMLType.Q2_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
}
BLOCK_DTYPES |= {t: row.dtype for t, row in IQ_TYPES.items()}


def block_dtype(t: GGMLType) -> np.dtype:
    """The structured dtype of one block of quantized type `t` (view raw uint8 rows with it)."""
    t = _implemented(t, "block_dtype")
    if t not in BLOCK_DTYPES:
        raise UnsupportedTypeError(f"{t.name.lower()} is not a block-quantized type")
    return BLOCK_DTYPES[t]


# --- small helpers -----------------------------------------------------------


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    """float32 (nb,) -> its fp16 bytes (nb, 2), rounded to nearest even like GGML_FP32_TO_FP16."""
    return d.astype("<f2").view(np.uint8).reshape(-1, 2)


def _f16_at(blocks: np.ndarray, off: int) -> np.ndarray:
    """The fp16 field at byte `off` of each block, as float32 (nb, 1)."""
    return blocks[:, off : off + 2].copy().view("<f2").astype(F32)


def _f32_at(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off : off + 4].copy().view("<f4")


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit, as exact float32 integers.

    Round half to even for |v| < 2^22; beyond that (and for inf/NaN, which
    arise from tiny blocks) the same garbage the C trick gives, so such
    blocks still match ggml's bytes.
    """
    bits = (v + F32(12582912)).view(np.int32)
    bits &= 0x7FFFFF  # in place: this runs inside the K-quant searches
    bits -= 0x400000
    return bits.astype(F32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf on float32: half away from zero. Exact: v - trunc(v) has no rounding error."""
    r = np.trunc(v)
    r += np.copysign((np.abs(v - r) >= 0.5).astype(F32), v)
    return r


def _first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, |value|) of the first element of largest magnitude in each row.

    C's `if (ax > amax) {amax = ax; max = x;}` from 0 keeps the first maximum
    and never picks a NaN; so does argmax once NaNs count as 0. A row of
    zeros gives +0 (C's initial value), whatever the signs of its zeros.
    """
    ax = np.abs(x)
    ax = np.where(np.isnan(ax), F32(0), ax)
    i = ax.argmax(axis=-1)[..., None]
    amax = np.take_along_axis(ax, i, axis=-1)[..., 0]
    return np.where(amax == 0, F32(0), np.take_along_axis(x, i, axis=-1)[..., 0]), amax


def _first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row minima and maxima as C's `if (v < min) min = v;` scan finds them: the first of equal
    values, which only matters for the sign of a zero (it reaches d = (max - min)/n)."""
    mn, mx = x.min(axis=1), x.max(axis=1)
    for v in (mn, mx):
        rows = np.nonzero(v == 0)[0]
        if rows.size:
            first = (x[rows] == 0).argmax(axis=1)
            v[rows] = x[rows, first]
    return mn, mx


def _max0(v: np.ndarray) -> np.ndarray:
    """max(0, v...) over the last axis, skipping NaN: C's `if (v > m) m = v;` from m = 0.

    A result that is not above zero is +0.0 as in C: which zero np.fmax keeps
    among +0.0 and -0.0 depends on the CPU's SIMD path (AVX-512 and AVX2 differ),
    and a -0.0 would reach the stored f16 scale as its sign bit.
    """
    m = np.fmax.reduce(v, axis=-1, initial=F32(0)).astype(F32)
    return np.where(m > 0, m, F32(0))


def _safe_inv(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f`."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d).astype(F32)


def _u8(v: np.ndarray) -> np.ndarray:
    """An int array stored into uint8_t (wraps like C)."""
    return (v.astype(np.int64) & 0xFF).astype(np.uint8)


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K qs: byte 32*h + l holds L[128h + l + 32k] at bits 2k (k = 0..3)."""
    nb = L.shape[0]
    r = L.astype(np.uint8).reshape(nb, 2, 4, 32)
    q = r[:, :, 0] | (r[:, :, 1] << 2) | (r[:, :, 2] << 4) | (r[:, :, 3] << 6)
    return q.reshape(nb, 64)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """Inverse of _pack_2bit: (nb, 64) bytes -> (nb, 256) values 0..3."""
    nb = qs.shape[0]
    q = qs.reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(nb, 256)


def _bits_of(v: np.ndarray, shifts: tuple[int, ...]) -> np.ndarray:
    """Bytes (..., n) -> (..., len(shifts), n) of (byte >> shift) & 1."""
    s = np.array(shifts, np.uint8).reshape(len(shifts), 1)
    return (v[..., None, :] >> s) & 1


# --- ggml's K-quant helpers ---------------------------------------------------------
#
# These work on sub-blocks laid out as columns: x has shape (n, m) for m
# sub-blocks of n weights, so the C loops over a sub-block's weights become
# loops over rows, each one numpy operation over all m sub-blocks, and sums
# run in C's order at full speed (np.cumsum along a short last axis is much
# slower than adding rows).


def _colsum(v: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in order, like C's `s += v[i]` loop from 0 (np.sum adds pairwise)."""
    s = v[0].copy()
    for row in v[1:]:
        s += row
    return s


def _columns(x: np.ndarray, n: int) -> np.ndarray:
    """Super-blocks (nb, 256) -> sub-blocks of n weights as columns (n, nb * 256 // n)."""
    return np.ascontiguousarray(x.reshape(-1, n).T)


def _make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants for each column of x (n, m) with weights w: (scale, the_min, L (n, m)).

    Searches nstep+1 scales around nmax/(max-min) and keeps the one with the
    least weighted error; a column's min moves with each improvement, so later
    steps see the new min, as in C.
    """
    mn = np.minimum(x.min(axis=0), F32(0))
    mx = x.max(axis=0)
    sum_w = _colsum(w)
    sum_x = _colsum(w * x)
    flat = mx == mn

    def err(scale: np.ndarray, mins: np.ndarray, L: np.ndarray) -> np.ndarray:
        diff = scale * L
        diff += mins
        diff -= x
        diff = np.abs(diff, out=diff) if use_mad else np.multiply(diff, diff, out=diff)
        diff *= w
        return _colsum(diff)

    iscale = F32(nmax) / (mx - mn)
    scale = F32(1) / iscale
    L = np.clip(_nearest_int(iscale * (x - mn)), 0, nmax)
    best = err(scale, mn, L)
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - mn)
        La = np.clip(_nearest_int(iscale * (x - mn)), 0, nmax)
        wl = w * La
        sum_l = _colsum(wl)
        sum_xl = _colsum(wl * x)
        wl *= La
        sum_l2 = _colsum(wl)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        mad = err(this_scale, this_min, La)
        better = (D > 0) & (mad < best)
        L = np.where(better, La, L)
        best = np.where(better, mad, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    # a constant column (after min <= 0): all zero quants, min = that constant
    L = np.where(flat, F32(0), L)
    scale = np.where(flat, F32(0), scale)
    return scale.astype(F32), (-mn).astype(F32), L


def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1) for each column of x (n, m): (scale, L in 0..2*nmax-1).

    Weighted by x^2; tries 18 scales around nmax/max and keeps the best.
    """
    mx, amax = _first_absmax(x.T)
    w = x * x
    wx = w * x
    lo, hi = -nmax, nmax - 1
    iscale = F32(-nmax) / mx
    l = np.clip(_nearest_int(iscale * x), lo, hi)
    L = l + F32(nmax)
    sumlx = _colsum(wx * l)
    suml2 = _colsum(w * l * l)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))  # C: suml2 ? sumlx/suml2 : 0
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        l = np.clip(_nearest_int(iscale * x), lo, hi)
        slx = _colsum(wx * l)
        sl2 = _colsum(w * l * l)
        upd = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(upd, l + F32(nmax), L)
        scale = np.where(upd, slx / sl2, scale)
        best = np.where(upd, scale * slx, best)
    tiny = amax < GROUP_MAX_EPS
    L = np.where(tiny, F32(0), L)
    scale = np.where(tiny, F32(0), scale)
    return scale.astype(F32), L


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(n, nmax, x, L, do_rmse=true) for each column of x (n, m): (scale, L in 0..2*nmax-1).

    Starts from rounding at nmax/max, then moves single quants while that
    lowers the x^2-weighted error, weight by weight (up to 5 passes).
    """
    n, m = x.shape
    mx, amax = _first_absmax(x.T)
    iscale = F32(-nmax) / mx
    L = np.clip(_nearest_int(iscale * x), -nmax, nmax - 1)
    w = x * x
    wx = w * x
    sumlx = _colsum(wx * L)
    suml2 = _colsum(w * L * L)
    # A column whose pass changed nothing would change nothing in the next
    # pass either, so each pass revisits only the columns the previous pass
    # changed: the same result as C's per-block early break.
    active = np.arange(m)
    for _ in range(5):
        if active.size == 0:
            break
        La, wa, wxa, xa = L[:, active], w[:, active], wx[:, active], x[:, active]
        slx_a, sl2_a = sumlx[active], suml2[active]
        changed = np.zeros(active.size, bool)
        for i in range(n):
            wi, wxi, xi, Li = wa[i], wxa[i], xa[i], La[i]
            slx = slx_a - wxi * Li
            sl2 = sl2_a - wi * Li * Li
            new_l = np.clip(_nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
            slx2 = slx + wxi * new_l
            sl22 = sl2 + wi * new_l * new_l
            upd = (slx > 0) & (new_l != Li) & (sl22 > 0) & (slx2 * slx2 * sl2_a > slx_a * slx_a * sl22)
            La[i] = np.where(upd, new_l, Li)
            slx_a = np.where(upd, slx2, slx_a)
            sl2_a = np.where(upd, sl22, sl2_a)
            changed |= upd
        L[:, active], sumlx[active], suml2[active] = La, slx_a, sl2_a
        active = active[changed]
    L = L + F32(nmax)
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    tiny = amax < GROUP_MAX_EPS
    L = np.where(tiny, F32(0), L)
    scale = np.where(tiny, F32(0), scale)
    return scale.astype(F32), L


# --- legacy quants: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 ---------------------------------

_NIBBLE_LO = (np.arange(256) & 15).astype(F32)
_NIBBLE_HI = (np.arange(256) >> 4).astype(F32)


def _quantize_q4_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    mx, _ = _first_absmax(x)
    d = mx / F32(-8)
    q = np.minimum((x * _safe_inv(d)[:, None] + F32(8.5)).astype(np.uint8), 15)  # C's (int8_t) truncation
    out = np.empty((nb, 18), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out


def _dequantize_q4_0(b: np.ndarray) -> np.ndarray:
    """Q4_0, 32 weights in 18 bytes: d fp16 @0, qs u8[16] @2.

    Weight j (j < 16) is (qs[j] & 15) - 8, weight j + 16 is (qs[j] >> 4) - 8;
    x = q * d.
    """
    d = _f16_at(b, 0)
    qs = b[:, 2:]
    out = np.empty((b.shape[0], 32), F32)
    np.take(_NIBBLE_LO - 8, qs, out=out[:, :16])
    np.take(_NIBBLE_HI - 8, qs, out=out[:, 16:])
    out *= d
    return out


def _quantize_q4_1(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    mn, mx = _first_min_max(x)
    d = (mx - mn) / F32(15)
    q = np.minimum(((x - mn[:, None]) * _safe_inv(d)[:, None] + F32(0.5)).astype(np.uint8), 15)
    out = np.empty((nb, 20), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(mn)
    out[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return out


def _dequantize_q4_1(b: np.ndarray) -> np.ndarray:
    """Q4_1, 32 weights in 20 bytes: d fp16 @0, m fp16 @2, qs u8[16] @4.

    Nibbles as in Q4_0 but unsigned (0..15); x = q * d + m.
    """
    d, m = _f16_at(b, 0), _f16_at(b, 2)
    qs = b[:, 4:]
    out = np.empty((b.shape[0], 32), F32)
    np.take(_NIBBLE_LO, qs, out=out[:, :16])
    np.take(_NIBBLE_HI, qs, out=out[:, 16:])
    out *= d
    out += m
    return out


def _q5_pack(q: np.ndarray, head: list[np.ndarray]) -> np.ndarray:
    nb = q.shape[0]
    qh = np.packbits(q >> 4, axis=1, bitorder="little")  # bit j of the little-endian u32 = bit 4 of quant j
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    return np.concatenate([*head, qh.reshape(nb, 4), qs], axis=1)


def _q5_values(b: np.ndarray, qh_off: int) -> np.ndarray:
    """5-bit quants 0..31 of Q5_0/Q5_1 blocks as float32 (nb, 32)."""
    qs = b[:, qh_off + 4 :]
    hi = np.unpackbits(b[:, qh_off : qh_off + 4], axis=1, bitorder="little")  # (nb, 32): bit j of qh
    out = np.empty((b.shape[0], 32), F32)
    np.take(_NIBBLE_LO, qs, out=out[:, :16])
    np.take(_NIBBLE_HI, qs, out=out[:, 16:])
    out += hi.astype(F32) * F32(16)
    return out


def _quantize_q5_0(x: np.ndarray) -> np.ndarray:
    mx, _ = _first_absmax(x)
    d = mx / F32(-16)
    q = np.minimum((x * _safe_inv(d)[:, None] + F32(16.5)).astype(np.uint8), 31)
    return _q5_pack(q, [_f16_bytes(d)])


def _dequantize_q5_0(b: np.ndarray) -> np.ndarray:
    """Q5_0, 32 weights in 22 bytes: d fp16 @0, qh u32 (little-endian) @2, qs u8[16] @6.

    Low nibbles as in Q4_0; bit j of qh is bit 4 of weight j; x = (q - 16) * d.
    """
    q = _q5_values(b, 2)
    q -= F32(16)
    q *= _f16_at(b, 0)
    return q


def _quantize_q5_1(x: np.ndarray) -> np.ndarray:
    mn, mx = _first_min_max(x)
    d = (mx - mn) / F32(31)
    q = ((x - mn[:, None]) * _safe_inv(d)[:, None] + F32(0.5)).astype(np.uint8)
    return _q5_pack(q, [_f16_bytes(d), _f16_bytes(mn)])


def _dequantize_q5_1(b: np.ndarray) -> np.ndarray:
    """Q5_1, 32 weights in 24 bytes: d fp16 @0, m fp16 @2, qh u32 @4, qs u8[16] @8.

    Quants 0..31 built as in Q5_0; x = q * d + m.
    """
    q = _q5_values(b, 4)
    q *= _f16_at(b, 0)
    q += _f16_at(b, 2)
    return q


def _q8_absmax_quants(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0/Q8_1's d = amax/127 and quants roundf(x/d)."""
    d = np.abs(x).max(axis=1) / F32(127)
    q = _roundf(x * _safe_inv(d)[:, None]).astype(np.int8)
    return d, q


def _quantize_q8_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, q = _q8_absmax_quants(x)
    out = np.empty((nb, 34), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = q.view(np.uint8)
    return out


def _dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    """Q8_0, 32 weights in 34 bytes: d fp16 @0, qs i8[32] @2; x = q * d."""
    out = b[:, 2:].view(np.int8).astype(F32)
    out *= _f16_at(b, 0)
    return out


def _quantize_q8_1(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, q = _q8_absmax_quants(x)
    s = q.sum(axis=1, dtype=np.int32).astype(F32) * d  # C: int sum, then sum*d in float with the unrounded d
    out = np.empty((nb, 36), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(s)
    out[:, 4:] = q.view(np.uint8)
    return out


def _dequantize_q8_1(b: np.ndarray) -> np.ndarray:
    """Q8_1, 32 weights in 36 bytes: d fp16 @0, s fp16 @2 (= d * sum(qs), d unrounded), qs i8[32] @4; x = q * d.

    Only a vec_dot type (src1 of Q4_1/Q5_1 MUL_MATs): ggml has no to_float for it.
    """
    out = b[:, 4:].view(np.int8).astype(F32)
    out *= _f16_at(b, 0)
    return out


# --- K-quants: Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K (super-blocks of 256) ---------------------


def _quantize_q2_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    xt = _columns(x, 16)
    sc, mins, L = _make_qkx2_quants(xt, np.abs(xt), 3, -0.5, 0.1, 15, True)
    sc, mins, L = sc.reshape(nb, 16), mins.reshape(nb, 16), L.T.reshape(nb, 16, 16)
    max_scale, max_min = _max0(sc), _max0(mins)
    has_s, has_m = max_scale > 0, max_min > 0
    with np.errstate(divide="ignore"):
        ls = np.where(has_s[:, None], _nearest_int((F32(15) / max_scale)[:, None] * sc), F32(0))
        lm = np.where(has_m[:, None], _nearest_int((F32(15) / max_min)[:, None] * mins), F32(0))
    scales = _u8(ls.astype(np.int64) | (lm.astype(np.int64) << 4))
    d16 = _f16_bytes(np.where(has_s, max_scale / F32(15), F32(0)).astype(F32))
    dmin16 = _f16_bytes(np.where(has_m, max_min / F32(15), F32(0)).astype(F32))
    # requantize with the rounded scales; a sub-block whose scale rounds to 0 keeps its L
    dq = d16.copy().view("<f2").astype(F32)
    dmq = dmin16.copy().view("<f2").astype(F32)
    dl = dq * (scales & 15).astype(F32)
    ml = dmq * (scales >> 4).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        Ln = np.clip(_nearest_int((x.reshape(nb, 16, 16) + ml[..., None]) / dl[..., None]), 0, 3)
    L = np.where((dl != 0)[..., None], Ln, L).reshape(nb, 256)
    return np.concatenate([scales, _pack_2bit(L), d16, dmin16], axis=1)


def _dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    """Q2_K, 256 weights in 84 bytes: scales u8[16] @0, qs u8[64] @16, d fp16 @80, dmin fp16 @82.

    16 sub-blocks of 16; sub-block k has scale d * (scales[k] & 15) and min
    dmin * (scales[k] >> 4). 2-bit quant of weight e = 128h + 32s + l (h < 2,
    s < 4, l < 32) is (qs[32h + l] >> 2s) & 3; x = q * scale - min.
    """
    nb = b.shape[0]
    sc = b[:, :16]
    dl = (_f16_at(b, 80) * (sc & 15).astype(F32))[..., None]
    ml = (_f16_at(b, 82) * (sc >> 4).astype(F32))[..., None]
    q = _unpack_2bit(b[:, 16:80]).astype(F32).reshape(nb, 16, 16)
    q *= dl
    q -= ml
    return q.reshape(nb, 256)


def _quantize_q3_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    sc, L = _make_q3_quants(_columns(x, 16), 4)
    sc, L = sc.reshape(nb, 16), L.T.reshape(nb, 16, 16)
    max_scale, _ = _first_absmax(sc)
    nz = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-32) / max_scale
        l = _nearest_int(iscale[:, None] * sc)
    l = np.where(nz[:, None], l, F32(0)).astype(np.int64)
    l = ((l + 128) & 255) - 128  # C stores nearest_int into an int8_t
    l = np.clip(l, -32, 31) + 32
    l = np.where(nz[:, None], l, 0)  # no scales at all: the 12 bytes stay zero
    scales = np.empty((nb, 12), np.uint8)
    scales[:, :8] = (l[:, :8] & 15) | ((l[:, 8:] & 15) << 4)
    hi = (l >> 4).reshape(nb, 4, 4)  # [group of 4 sub-blocks, position in group]
    scales[:, 8:] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    with np.errstate(divide="ignore"):
        d16 = _f16_bytes(np.where(nz, F32(1) / iscale, F32(0)).astype(F32))
    dl = d16.copy().view("<f2").astype(F32) * (l - 32).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        Ln = np.clip(_nearest_int(x.reshape(nb, 16, 16) / dl[..., None]), -4, 3) + F32(4)
    L = np.where((dl != 0)[..., None], Ln, L).reshape(nb, 256).astype(np.uint8)
    high = L > 3
    hmask = np.packbits(high.reshape(nb, 8, 32).transpose(0, 2, 1), axis=2, bitorder="little").reshape(nb, 32)
    L = np.where(high, L - 4, L)
    return np.concatenate([hmask, _pack_2bit(L), scales, d16], axis=1)


def _q3_k_scales(b: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit scales (-32..31) of Q3_K blocks, int8 (nb, 16)."""
    s = b[:, 96:108]
    lo = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1)  # sub-blocks 0..7, 8..15
    hi = (s[:, 8:12][:, None, :] >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & 3
    return (lo | (hi.reshape(-1, 16) << 4)).astype(np.int8) - np.int8(32)


def _dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    """Q3_K, 256 weights in 110 bytes: hmask u8[32] @0, qs u8[64] @32, scales u8[12] @96, d fp16 @108.

    16 sub-blocks of 16 with signed 6-bit scales: for sub-block k, the low 4
    bits are nibble (k // 8) of scales[k % 8] and the high 2 bits are bits
    2*(k // 4) of scales[8 + k % 4]; scale = d * (s6 - 32). Weight e has
    low bits (qs as in Q2_K) and high bit (hmask[e % 32] >> (e // 32)) & 1;
    q = low - (0 if high else 4); x = q * scale.
    """
    nb = b.shape[0]
    dl = (_f16_at(b, 108) * _q3_k_scales(b).astype(F32))[..., None]
    low = _unpack_2bit(b[:, 32:96]).astype(np.int8)
    high = _bits_of(b[:, :32], tuple(range(8))).reshape(nb, 256).astype(np.int8)
    q = (low - ((1 - high) << 2)).astype(F32).reshape(nb, 16, 16)
    q *= dl
    return q.reshape(nb, 256)


def _k4_scales_pack(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: 8 six-bit scales and mins -> 12 bytes."""
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    return out


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of _k4_scales_pack (ggml's get_scale_min_k4): (scales, mins) uint8 (nb, 8)."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def _qkx_super(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """The Q4_K/Q5_K quantizer up to the quants: (12 scale bytes + d + dmin (nb, 16), L (nb, 256))."""
    nb = x.shape[0]
    xt = _columns(x, 32)
    av_x = np.sqrt(_colsum(xt * xt) / F32(32))
    sc, mins, L = _make_qkx2_quants(xt, av_x + np.abs(xt), nmax, rmin, 0.1, nstep, False)
    sc, mins, L = sc.reshape(nb, 8), mins.reshape(nb, 8), L.T.reshape(nb, 8, 32)
    max_scale, max_min = _max0(sc), _max0(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
    # C: uint8_t ls = nearest_int(...); ls = MIN(63, ls)
    ls = np.minimum(_u8(_nearest_int(inv_scale[:, None] * sc).astype(np.int64)), 63)
    lm = np.minimum(_u8(_nearest_int(inv_min[:, None] * mins).astype(np.int64)), 63)
    d16 = _f16_bytes((max_scale / F32(63)).astype(F32))
    dmin16 = _f16_bytes((max_min / F32(63)).astype(F32))
    dl = d16.copy().view("<f2").astype(F32) * ls.astype(F32)
    ml = dmin16.copy().view("<f2").astype(F32) * lm.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        Ln = np.clip(_nearest_int((x.reshape(nb, 8, 32) + ml[..., None]) / dl[..., None]), 0, nmax)
    L = np.where((dl != 0)[..., None], Ln, L).reshape(nb, 256).astype(np.uint8)
    return np.concatenate([d16, dmin16, _k4_scales_pack(ls, lm)], axis=1), L


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    head, L = _qkx_super(x, 15, -1.0, 20)
    r = L.reshape(-1, 4, 2, 32)
    return np.concatenate([head, (r[:, :, 0] | (r[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def _dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    """Q4_K, 256 weights in 144 bytes: d fp16 @0, dmin fp16 @2, scales u8[12] @4, qs u8[128] @16.

    8 sub-blocks of 32 with 6-bit scale sc and min m (ggml's get_scale_min_k4):
    for k < 4, sc = scales[k] & 63, m = scales[k+4] & 63; for k >= 4,
    sc = (scales[k+4] & 15) | (scales[k-4] >> 6) << 4, m = (scales[k+4] >> 4) |
    (scales[k] >> 6) << 4. Weight 64c + l (l < 32) is qs[32c + l] & 15,
    weight 64c + 32 + l is qs[32c + l] >> 4; x = q * d*sc - dmin*m.
    """
    nb = b.shape[0]
    sc, mn = _k4_scales(b[:, 4:16])
    dl = (_f16_at(b, 0) * sc.astype(F32))[..., None]
    ml = (_f16_at(b, 2) * mn.astype(F32))[..., None]
    qs = b[:, 16:].reshape(nb, 4, 32)
    q = np.empty((nb, 4, 2, 32), F32)
    np.take(_NIBBLE_LO, qs, out=q[:, :, 0])
    np.take(_NIBBLE_HI, qs, out=q[:, :, 1])
    q = q.reshape(nb, 8, 32)
    q *= dl
    q -= ml
    return q.reshape(nb, 256)


def _quantize_q5_k(x: np.ndarray) -> np.ndarray:
    head, L = _qkx_super(x, 31, -0.5, 15)
    r = L.reshape(-1, 4, 2, 32)  # [chunk of 64, half, l]
    qh = np.packbits((r >> 4).reshape(-1, 8, 32).transpose(0, 2, 1), axis=2, bitorder="little")
    qs = (r[:, :, 0] & 15) | ((r[:, :, 1] & 15) << 4)
    return np.concatenate([head, qh.reshape(-1, 32), qs.reshape(-1, 128)], axis=1)


def _dequantize_q5_k(b: np.ndarray) -> np.ndarray:
    """Q5_K, 256 weights in 176 bytes: d fp16 @0, dmin fp16 @2, scales u8[12] @4, qh u8[32] @16, qs u8[128] @48.

    Scales, mins and low nibbles as in Q4_K; bit 4 of weight e = 32k + l
    (k = sub-block) is (qh[l] >> k) & 1; x = q * d*sc - dmin*m.
    """
    nb = b.shape[0]
    sc, mn = _k4_scales(b[:, 4:16])
    dl = (_f16_at(b, 0) * sc.astype(F32))[..., None]
    ml = (_f16_at(b, 2) * mn.astype(F32))[..., None]
    qs = b[:, 48:].reshape(nb, 4, 32)
    q = np.empty((nb, 4, 2, 32), F32)
    np.take(_NIBBLE_LO, qs, out=q[:, :, 0])
    np.take(_NIBBLE_HI, qs, out=q[:, :, 1])
    q = q.reshape(nb, 8, 32)
    q += _bits_of(b[:, 16:48], tuple(range(8))).astype(F32) * F32(16)
    q *= dl
    q -= ml
    return q.reshape(nb, 256)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    sc, L = _make_qx_quants(_columns(x, 16), 32)
    sc, L = sc.reshape(nb, 16), L.T.reshape(nb, 16, 16)
    max_scale, max_abs = _first_absmax(sc)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-128) / max_scale
        d = F32(1) / iscale
        l = np.where(zero[:, None], F32(0), _nearest_int(iscale[:, None] * sc))
    l = np.minimum(l.astype(np.int64), 127)
    scales = _u8(l)  # int8_t bytes
    d16 = _f16_bytes(np.where(zero, F32(0), d).astype(F32))
    dl = d16.copy().view("<f2").astype(F32) * scales.view(np.int8).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        Ln = np.clip(_nearest_int(x.reshape(nb, 16, 16) / dl[..., None]), -32, 31) + F32(32)
    L = np.where((dl != 0)[..., None], Ln, L).reshape(nb, 256).astype(np.uint8)
    r = L.reshape(nb, 2, 4, 32)  # [half of 128, quarter, l]
    ql = np.concatenate([(r[:, :, 0] & 15) | ((r[:, :, 2] & 15) << 4), (r[:, :, 1] & 15) | ((r[:, :, 3] & 15) << 4)],
                        axis=2)
    h = r >> 4
    qh = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), scales, d16], axis=1)
    out[zero] = 0  # C: memset of the whole block
    return out


def _dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K, 256 weights in 210 bytes: ql u8[128] @0, qh u8[64] @128, scales i8[16] @192, d fp16 @208.

    For weight e = 128h + 32k + l (h < 2, k < 4, l < 32): low 4 bits are
    nibble (k // 2) of ql[64h + 32(k % 2) + l], high 2 bits are
    (qh[32h + l] >> 2k) & 3; q = q6 - 32; sub-block e // 16 has scale
    d * scales[e // 16]; x = scale * q.
    """
    nb = b.shape[0]
    ql = b[:, :128].reshape(nb, 2, 2, 32)  # [h, k % 2, l]
    low = np.stack([ql & 15, ql >> 4], axis=2).reshape(nb, 2, 4, 32)  # [h, k, l]: k = 2*nibble + k%2
    qh = b[:, 128:192].reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ((low | ((qh & 3) << 4)).astype(np.int8) - np.int8(32)).astype(F32).reshape(nb, 16, 16)
    dl = _f16_at(b, 208) * b[:, 192:208].view(np.int8).astype(F32)
    q *= dl[..., None]
    return q.reshape(nb, 256)


def _quantize_q8_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    mx, amax = _first_absmax(x)
    zero = amax == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-127) / mx  # -128 until 2024 (IQ2_XXS's AVX code wanted the quants symmetric)
        q = np.minimum(_nearest_int(iscale[:, None] * x), F32(127))
        d = F32(1) / iscale
    q = _u8(np.where(zero[:, None], F32(0), q).astype(np.int64)).view(np.int8)
    d = np.where(zero, F32(0), d).astype("<f4")
    # ggml leaves bsums unset for an all-zero block; they are 0 here
    bsums = q.reshape(nb, 16, 16).sum(axis=2, dtype=np.int16).astype("<i2")
    return np.concatenate(
        [d.view(np.uint8).reshape(nb, 4), q.view(np.uint8), bsums.view(np.uint8).reshape(nb, 32)], axis=1
    )


def _dequantize_q8_k(b: np.ndarray) -> np.ndarray:
    """Q8_K, 256 weights in 292 bytes: d f32 @0, qs i8[256] @4, bsums i16[16] @260 (sums of 16 quants).

    x = q * d. Only a vec_dot type: src1 of K-quant MUL_MATs.
    """
    out = b[:, 4:260].view(np.int8).astype(F32)
    out *= _f32_at(b, 0)
    return out


# --- non-linear quants: IQ4_NL IQ4_XS MXFP4 --------------------------------------------------
#
# Each 4-bit quant indexes a table of 16 int8 values. IQ4_NL and IQ4_XS search a block's scale the
# way ggml's quantize_row_iq4_nl_impl does (sub-blocks of 32 as columns, sums in C's order);
# MXFP4's scale is a power of two from the block's largest magnitude.

# ggml-common.h's kvalues_iq4nl and kvalues_mxfp4 (the e2m1 values, doubled)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_IQ4NL_F = KVALUES_IQ4NL.astype(F32)
_MXFP4_F = KVALUES_MXFP4.astype(F32)
_IQ4_NTRY = 7  # the scale search ggml_quantize_chunk (quantize_iq4_nl / quantize_iq4_xs) runs


def _iq4nl_index_table() -> np.ndarray:
    """best_index_int8's answer for x in [y/2, (y+1)/2), at y + 256 for y = -256..255.

    C picks index mu - 1 of the two values around x when `x - val[mu-1] < val[mu] - x` in float32; near
    a midpoint both differences are exact, so that is x < (val[mu-1] + val[mu]) / 2 exactly, and the
    index is the number of midpoints <= x. The midpoints are multiples of 1/2, so floor(2x) decides.
    """
    twice_mid = KVALUES_IQ4NL[:-1].astype(np.int32) + KVALUES_IQ4NL[1:]
    return np.searchsorted(twice_mid, np.arange(-256, 256), side="right").astype(np.uint8)


_IQ4NL_INDEX = _iq4nl_index_table()


def _best_index_iq4nl(x: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8(16, kvalues_iq4nl, x) for every element: the index of the nearest value,
    the upper one on a tie (a NaN gives 15, as in C). uint8."""
    y = np.multiply(x, F32(2))  # exact
    np.floor(y, out=y)
    np.fmin(y, F32(255), out=y)  # fmin first: a NaN becomes 255
    np.fmax(y, F32(-256), out=y)
    i = y.astype(np.int32)
    i += 256
    return _IQ4NL_INDEX.take(i)


def _iq4_weighted_sums(x: np.ndarray, w: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(w*q*x) and sum(w*q*q) over each column, q = kvalues_iq4nl[L], in C's order and rounding."""
    wq = w * _IQ4NL_F[L]
    sumqx = _colsum(wq * x)
    wq *= _IQ4NL_F[L]
    return sumqx, _colsum(wq)


def _iq4_scales(x: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray]:
    """The scale search of quantize_row_iq4_nl_impl without an importance matrix, for each column of
    x (32, m): (scale (m,), the quants L (32, m) of the first guess).

    Weights x^2; a first guess at max/values[0] (its sign flipped when ntry > 0), refined by least
    squares, then 2*ntry + 1 more scales (itry + values[0])/max, each kept if it fits better.
    A column whose magnitude stays below 1e-15 gets scale 0.
    """
    w = x * x
    mx, amax = _first_absmax(x.T)
    tiny = amax < GROUP_MAX_EPS
    d = (-mx if ntry > 0 else mx) / _IQ4NL_F[0]
    L = _best_index_iq4nl((F32(1) / d) * x)
    sumqx, sumq2 = _iq4_weighted_sums(x, w, L)
    d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        Lt = _best_index_iq4nl((F32(itry + int(KVALUES_IQ4NL[0])) / mx) * x)
        sumqx, sumq2 = _iq4_weighted_sums(x, w, Lt)
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(better, sumqx / sumq2, d)
        best = np.where(better, d * sumqx, best)
    return np.where(tiny, F32(0), d).astype(F32), L


def _pack_nibbles32(L: np.ndarray) -> np.ndarray:
    """Quants (n, 32) -> 16 bytes each: byte j holds quant j (low nibble) and quant j + 16 (high)."""
    return L[:, :16] | (L[:, 16:] << 4)


def _quantize_iq4_nl_impl(x: np.ndarray, ntry: int) -> np.ndarray:
    """IQ4_NL blocks of x (nb, 32): ntry = -1 is quantize_row_iq4_nl_ref (type_traits' from_float_ref, the
    CPU's CPY), 7 is quantize_iq4_nl (ggml_quantize_chunk: more scales tried, then every quant redone)."""
    xt = np.ascontiguousarray(x.T)
    d, L = _iq4_scales(xt, ntry)
    if ntry > 0:
        L = _best_index_iq4nl(_safe_inv(d) * xt)
    else:
        # ggml leaves a block below GROUP_MAX_EPS with the quants of the block before it (or of uninitialized
        # memory): pyggml writes ggml_quantize_chunk's, 8 (the value nearest 0) everywhere
        L[:, _first_absmax(x)[1] < GROUP_MAX_EPS] = 8
    out = np.empty((x.shape[0], 18), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = _pack_nibbles32(np.ascontiguousarray(L.T))
    return out


def _quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    return _quantize_iq4_nl_impl(x, -1)


def _nibble_values(qs: np.ndarray, table: np.ndarray) -> np.ndarray:
    """16-byte groups (..., 16) -> table values (..., 32) of their low nibbles, then their high nibbles."""
    out = np.empty((*qs.shape[:-1], 32), F32)
    np.take(table, qs & 15, out=out[..., :16])
    np.take(table, qs >> 4, out=out[..., 16:])
    return out


def _dequantize_iq4_nl(b: np.ndarray) -> np.ndarray:
    """IQ4_NL, 32 weights in 18 bytes: d fp16 @0, qs u8[16] @2 (nibbles as Q4_0's).

    x = d * kvalues_iq4nl[q].
    """
    out = _nibble_values(b[:, 2:], _IQ4NL_F)
    out *= _f16_at(b, 0)
    return out


def _quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """quantize_iq4_xs without an importance matrix (quantize_row_iq4_xs_ref is the same function)."""
    nb = x.shape[0]
    xt = _columns(x, 32)
    sc, _ = _iq4_scales(xt, _IQ4_NTRY)
    sc = sc.reshape(nb, 8)
    max_scale, _ = _first_absmax(sc)
    d = -max_scale / F32(32)  # -0.0 when every scale is 0: ggml stores d = 0x8000
    # 6-bit sub-block scales from the unrounded d, then every quant redone with them
    ls = np.clip(_nearest_int(_safe_inv(d)[:, None] * sc), -32, 31)
    idl = _safe_inv(d[:, None] * ls)
    L = _best_index_iq4nl(idl.reshape(1, -1) * xt)
    l6 = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(nb, "<u2")
    for ib in range(8):
        scales_h |= (l6[:, ib] >> 4) << (2 * ib)
    l6 = l6.astype(np.uint8)
    out = np.empty((nb, 136), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = scales_h.view(np.uint8).reshape(nb, 2)
    out[:, 4:8] = (l6[:, 0::2] & 15) | ((l6[:, 1::2] & 15) << 4)
    out[:, 8:] = _pack_nibbles32(np.ascontiguousarray(L.T)).reshape(nb, 128)
    return out


def _dequantize_iq4_xs(b: np.ndarray) -> np.ndarray:
    """IQ4_XS, 256 weights in 136 bytes: d fp16 @0, scales_h u16 @2, scales_l u8[4] @4, qs u8[128] @8.

    8 sub-blocks of 32 with 6-bit scales: sub-block ib's low 4 bits are nibble ib % 2 of
    scales_l[ib // 2], its high 2 bits are bits 2*ib of scales_h; dl = d * (ls - 32). Quants of
    sub-block ib are the nibbles of qs[16*ib : 16*ib + 16] as in IQ4_NL; x = dl * kvalues_iq4nl[q].
    """
    nb = b.shape[0]
    h = b[:, 2].astype(np.int32) | (b[:, 3].astype(np.int32) << 8)
    low = np.stack([b[:, 4:8] & 15, b[:, 4:8] >> 4], axis=2).reshape(nb, 8).astype(np.int32)
    ls = low | (((h[:, None] >> (2 * np.arange(8))) & 3) << 4)
    dl = _f16_at(b, 0) * (ls - 32).astype(F32)
    out = _nibble_values(b[:, 8:].reshape(nb, 8, 16), _IQ4NL_F)
    out *= dl[..., None]
    return out.reshape(nb, 256)


# --- ternary quants: TQ1_0 TQ2_0 ------------------------------------------------------


def _ternary_scale(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, 1/d or 0) of TQ1_0/TQ2_0 blocks: d = amax by C's `amax = MAX(amax, fabsf(v))` scan, where a NaN
    wins only as the last value and otherwise restarts the maximum at the value after it."""
    ax = np.abs(x)
    nan = np.isnan(ax)
    n = x.shape[1]
    last_nan = np.where(nan.any(axis=1), n - 1 - nan[:, ::-1].argmax(axis=1), -1)
    after = np.arange(n) > last_nan[:, None]
    d = np.max(np.where(after, ax, F32(0)), axis=1, initial=F32(0))
    d = np.where(last_nan == n - 1, F32(np.nan), d).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)  # C's `d ? 1.0f/d : 0.0f` (NaN is true)
    return d, inv


def _trits(x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """lroundf(x * id) + 1 as int32 (0, 1, 2): a non-finite product is glibc's LONG_MIN, whose int is 0."""
    v = x * inv[:, None]
    return np.where(np.isfinite(v), _roundf(v), F32(0)).astype(np.int32) + 1


def _pack_trits(t: np.ndarray) -> np.ndarray:
    """(..., 5, m) trits, most significant first -> (..., m) bytes: their base-3 number q scaled to
    ceil(q * 256 / 243), the byte whose top trits ((byte * 3^n) mod 256 * 3) >> 8 reads back."""
    q = np.zeros(t.shape[:-2] + t.shape[-1:], np.int32)
    for n in range(t.shape[-2]):
        q = (q * 3 + t[..., n, :]) & 0xFF  # uint8_t q in C
    return ((q * 256 + 242) // 243).astype(np.uint8)


def _quantize_tq1_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, inv = _ternary_scale(x)
    t = _trits(x, inv)
    out = np.empty((nb, 54), np.uint8)
    out[:, :32] = _pack_trits(t[:, :160].reshape(nb, 5, 32))
    out[:, 32:48] = _pack_trits(t[:, 160:240].reshape(nb, 5, 16))
    qh = np.concatenate([t[:, 240:].reshape(nb, 4, 4), np.zeros((nb, 1, 4), np.int32)], axis=1)  # q *= 3 last
    out[:, 48:52] = _pack_trits(qh)
    out[:, 52:54] = _f16_bytes(d)
    return out


_POW3 = np.array([1, 3, 9, 27, 81], np.int32)


def _unpack_trits(q: np.ndarray, n: int) -> np.ndarray:
    """(nb, m) bytes -> (nb, n, m) trit values - 1 as float32: ((q * 3^k) mod 256 * 3) >> 8, k < n."""
    p = (q[:, None, :].astype(np.int32) * _POW3[:n, None]) & 0xFF
    return ((p * 3) >> 8).astype(F32) - F32(1)


def _dequantize_tq1_0(b: np.ndarray) -> np.ndarray:
    """TQ1_0, 256 weights in 54 bytes: qs u8[48] @0, qh u8[4] @48, d fp16 @52.

    Each qs byte holds 5 trits, qh bytes 4 (read as their byte times 3^n, top trit by (q * 3) >> 8):
    weight 32n + m is trit n of qs[m] (m < 32), 160 + 16n + m trit n of qs[32 + m], 240 + 4n + j trit n
    of qh[j]; x = (trit - 1) * d.
    """
    nb = b.shape[0]
    out = np.empty((nb, 256), F32)
    out[:, :160] = _unpack_trits(b[:, :32], 5).reshape(nb, 160)
    out[:, 160:240] = _unpack_trits(b[:, 32:48], 5).reshape(nb, 80)
    out[:, 240:] = _unpack_trits(b[:, 48:52], 4).reshape(nb, 16)
    out *= _f16_at(b, 52)
    return out


def _quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d, inv = _ternary_scale(x)
    out = np.empty((nb, 66), np.uint8)
    out[:, :64] = _pack_2bit(_trits(x, inv) & 3)
    out[:, 64:66] = _f16_bytes(d)
    return out


def _dequantize_tq2_0(b: np.ndarray) -> np.ndarray:
    """TQ2_0, 256 weights in 66 bytes: qs u8[64] @0, d fp16 @64.

    Weight 128h + 32l + m is bits 2l..2l+1 of qs[32h + m] (Q2_K's layout), x = (q - 1) * d.
    """
    out = _unpack_2bit(b[:, :64]).astype(F32)
    out -= F32(1)
    out *= _f16_at(b, 64)
    return out


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e - 128) as float32, exact (subnormal for e < 2)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _log2f(v: np.ndarray) -> np.ndarray:
    """C's log2f, as the float32 nearest the exact log2 (computed in float64): MXFP4 uses its floor, which
    only a float just below a power of two can change (log2f rounds it up to the integer, as here)."""
    return np.log2(v.astype(np.float64)).astype(F32)


def _mxfp4_index_table() -> np.ndarray:
    """best_index_mxfp4's answer for |x|/d in (c-1, c]/2, at c = 0..21 (x >= 0).

    C takes the first of the 16 values with the least |v*d - x| in float32; near a midpoint of two
    values the difference is exact, so that is the nearest value, the smaller one on a tie (it comes
    first in the table), and its index is the number of midpoints below |x|/d. The midpoints are
    multiples of 1/2, so ceil(2|x|/d) decides.
    """
    positive = KVALUES_MXFP4[:8].astype(np.int32)
    twice_mid = positive[:-1] + positive[1:]
    return np.searchsorted(twice_mid, np.arange(22), side="left").astype(np.uint8)


_MXFP4_INDEX = _mxfp4_index_table()


def _best_index_mxfp4(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's best_index_mxfp4(x, d) for every element (d a power of two per row): uint8 indices; a negative
    x takes the negated value's index (8 + i); -0, 0, NaN and +-inf take 0, as in C."""
    y = np.abs(x)
    y /= d  # exact: d is a power of two (and |x| < 16d in a block of finite values)
    y *= F32(2)
    np.ceil(y, out=y)
    np.fmax(y, F32(0), out=y)  # fmax first: a NaN becomes 0
    np.fmin(y, F32(21), out=y)
    i = _MXFP4_INDEX.take(y.astype(np.int32))
    i[(x < 0) & (i > 0)] += 8
    i[np.isinf(x)] = 0  # every difference is inf: C keeps the first value
    return i


def _quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    amax = np.fmax.reduce(np.abs(x), axis=1, initial=F32(0))  # C's `if (amax < fabsf(v))` skips NaN
    with np.errstate(divide="ignore"):
        e_f = np.floor(_log2f(amax)) - F32(2) + F32(127)
    # (uint8_t) of a float: the x86 conversion to int32, then its low byte (a tiny amax gives e < 0)
    e_i = np.where(np.isfinite(e_f), e_f, F32(-(2**31))).astype(np.int32) & 0xFF
    e = np.where(amax > 0, e_i, 0).astype(np.uint8)
    out = np.empty((nb, 17), np.uint8)
    out[:, 0] = e
    out[:, 1:] = _pack_nibbles32(_best_index_mxfp4(x, _e8m0_half(e)[:, None]))
    return out


def _dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    """MXFP4, 32 weights in 17 bytes: e u8 (E8M0) @0, qs u8[16] @1 (nibbles as Q4_0's).

    x = kvalues_mxfp4[q] * 2^(e - 128) (the table holds the e2m1 values doubled).
    """
    out = _nibble_values(b[:, 1:], _MXFP4_F)
    out *= _e8m0_half(b[:, 0])[:, None]
    return out


# --- NVFP4 -------------------------------------------------------------------------


def _ue4m3_table() -> np.ndarray:
    """ggml_ue4m3_to_fp32 of every byte (bit 7 ignored; 0 and 0x7F are 0): the E4M3 value, halved."""
    x = np.arange(256)
    e, m = (x >> 3) & 15, (x & 7).astype(np.float64)
    v = np.where(e == 0, np.ldexp(m, -9), np.ldexp(1 + m / 8, e - 7)) * 0.5
    return np.where((x == 0) | (x == 0x7F), 0.0, v).astype(F32)


UE4M3 = _ue4m3_table()  # ggml_ue4m3_to_fp32 of every byte (NVFP4's scales)


def _fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3: positive x (clamped to 448) to E4M3 rounding the mantissa half up, 0x7E past
    the top; NaN, zero and negative x give 0."""
    pos = x > 0
    x = np.minimum(np.where(pos, x, F32(1)), F32(448)).astype(F32)
    bits = x.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) - 127 + 7
    m = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    e = e + (m > 7)
    normal = np.where(e >= 15, 0x7E, (e << 3) | np.where(m > 7, 0, m))
    sub_m = np.minimum((x * F32(512) + F32(0.5)).astype(np.int64), 7)  # C's (int) truncation
    sub = np.where(sub_m < 1, 0, sub_m)
    return np.where(pos, np.where(((bits >> 23) & 0xFF) - 120 <= 0, sub, normal), 0).astype(np.uint8)


def _best_index_fp4(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's best_index_mxfp4(x, d) for any scale d (rows of x, one d per row): the first of the 16 values
    with the least |kvalues_mxfp4[i] * d - x| in float32."""
    best_err = np.abs(_MXFP4_F[0] * d - x)
    best = np.zeros(x.shape, np.uint8)
    for i in range(1, 16):
        err = np.abs(_MXFP4_F[i] * d - x)
        better = err < best_err
        best[better] = i
        np.copyto(best_err, err, where=better)
    return best


def _quantize_nvfp4(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    xs = x.reshape(nb * 4, 16)
    amax = np.fmax.reduce(np.abs(xs), axis=1, initial=F32(0))  # C's `if (amax < fabsf(v))` skips NaN
    ue = _fp32_to_ue4m3(amax / F32(6))
    L = _best_index_fp4(xs, UE4M3[ue][:, None]).reshape(nb, 4, 2, 8)
    out = np.empty((nb, 36), np.uint8)
    out[:, :4] = ue.reshape(nb, 4)
    out[:, 4:] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 32)
    return out


def _dequantize_nvfp4(b: np.ndarray) -> np.ndarray:
    """NVFP4, 64 weights in 36 bytes: d u8[4] (UE4M3 scales) @0, qs u8[32] @4.

    Four sub-blocks of 16: sub-block s reads qs[8s : 8s + 8], low nibbles for its first 8 weights and
    high nibbles for the last 8; x = kvalues_mxfp4[q] * ue4m3(d[s]) (the scale halved, the table doubled).
    """
    nb = b.shape[0]
    qs = b[:, 4:].reshape(nb, 4, 8)
    out = np.empty((nb, 4, 16), F32)
    np.take(_MXFP4_F, qs & 15, out=out[:, :, :8])
    np.take(_MXFP4_F, qs >> 4, out=out[:, :, 8:])
    out *= UE4M3[b[:, :4]][:, :, None]
    return out.reshape(nb, 64)


# --- 1- and 2-bit quants: Q1_0 Q2_0 -------------------------------------------------------


def _quantize_q1_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d = _colsum(np.abs(np.ascontiguousarray(x.T))) / F32(128)  # sum_abs in C's order
    bits = (x >= 0).reshape(nb, 16, 8).astype(np.uint8) << np.arange(8, dtype=np.uint8)
    out = np.empty((nb, 18), np.uint8)
    out[:, :2] = _f16_bytes(d.astype(F32))
    out[:, 2:] = np.bitwise_or.reduce(bits, axis=2)
    return out


def _dequantize_q1_0(b: np.ndarray) -> np.ndarray:
    """Q1_0, 128 weights in 18 bytes: d fp16 @0, qs u8[16] @2; weight j is bit j % 8 of qs[j // 8]:
    x = d if set, else -d."""
    d = _f16_at(b, 0)
    bits = np.unpackbits(b[:, 2:], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d)


def _quantize_q2_0(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    d = _max0(np.abs(x))
    v = x * _safe_inv(d)[:, None]
    # (int)roundf(v) + 1 clamped to 0..3; a non-finite v converts to INT_MIN, so 0
    q = np.where(np.isfinite(v), np.clip(_roundf(v) + F32(1), 0, 3), F32(0)).astype(np.uint8).reshape(nb, 16, 4)
    out = np.empty((nb, 18), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return out


def _dequantize_q2_0(b: np.ndarray) -> np.ndarray:
    """Q2_0, 64 weights in 18 bytes: d fp16 @0, qs u8[16] @2; weight j is bits 2(j % 4).. of qs[j // 4]:
    x = (q - 1) * d."""
    nb = b.shape[0]
    q = (b[:, 2:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    out = q.reshape(nb, 64).astype(F32)
    out -= F32(1)
    out *= _f16_at(b, 0)
    return out


_QUANTIZE: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q4_0: _quantize_q4_0,
    GGMLType.Q4_1: _quantize_q4_1,
    GGMLType.Q5_0: _quantize_q5_0,
    GGMLType.Q5_1: _quantize_q5_1,
    GGMLType.Q8_0: _quantize_q8_0,
    GGMLType.Q8_1: _quantize_q8_1,
    GGMLType.Q2_K: _quantize_q2_k,
    GGMLType.Q3_K: _quantize_q3_k,
    GGMLType.Q4_K: _quantize_q4_k,
    GGMLType.Q5_K: _quantize_q5_k,
    GGMLType.Q6_K: _quantize_q6_k,
    GGMLType.Q8_K: _quantize_q8_k,
    GGMLType.IQ4_NL: _quantize_iq4_nl,
    GGMLType.IQ4_XS: _quantize_iq4_xs,
    GGMLType.TQ1_0: _quantize_tq1_0,
    GGMLType.TQ2_0: _quantize_tq2_0,
    GGMLType.MXFP4: _quantize_mxfp4,
    GGMLType.NVFP4: _quantize_nvfp4,
    GGMLType.Q1_0: _quantize_q1_0,
    GGMLType.Q2_0: _quantize_q2_0,
}

_DEQUANTIZE: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q4_0: _dequantize_q4_0,
    GGMLType.Q4_1: _dequantize_q4_1,
    GGMLType.Q5_0: _dequantize_q5_0,
    GGMLType.Q5_1: _dequantize_q5_1,
    GGMLType.Q8_0: _dequantize_q8_0,
    GGMLType.Q8_1: _dequantize_q8_1,
    GGMLType.Q2_K: _dequantize_q2_k,
    GGMLType.Q3_K: _dequantize_q3_k,
    GGMLType.Q4_K: _dequantize_q4_k,
    GGMLType.Q5_K: _dequantize_q5_k,
    GGMLType.Q6_K: _dequantize_q6_k,
    GGMLType.Q8_K: _dequantize_q8_k,
    GGMLType.IQ4_NL: _dequantize_iq4_nl,
    GGMLType.IQ4_XS: _dequantize_iq4_xs,
    GGMLType.TQ1_0: _dequantize_tq1_0,
    GGMLType.TQ2_0: _dequantize_tq2_0,
    GGMLType.MXFP4: _dequantize_mxfp4,
    GGMLType.NVFP4: _dequantize_nvfp4,
    GGMLType.Q1_0: _dequantize_q1_0,
    GGMLType.Q2_0: _dequantize_q2_0,
}
_DEQUANTIZE |= {t: row.dequantize for t, row in IQ_TYPES.items()}

assert set(_QUANTIZE) | set(IQ_TYPES) == set(_DEQUANTIZE) == set(BLOCK_DTYPES)

# the types pyggml converts to float32, in ggml's order: every plain type and BLOCK_DTYPES' types
IMPLEMENTED_TYPES: tuple[GGMLType, ...] = tuple(
    t for t in GGMLType if not TYPE_TRAITS[t].is_quantized or t in BLOCK_DTYPES)
# those it converts from float32 too: all but the lattice types, for which ggml's CPU has no from_float
FROM_FLOAT_TYPES: tuple[GGMLType, ...] = tuple(t for t in IMPLEMENTED_TYPES if t not in IQ_TYPES)


def is_implemented(t: GGMLType | int | str) -> bool:
    """Whether pyggml converts type `t` to float32 (False for unknown and removed ids)."""
    try:
        return as_type(t) in IMPLEMENTED_TYPES
    except GGMLError:
        return False


def not_implemented_error(t: GGMLType, what: str = "") -> UnsupportedTypeError:
    """The error for a type ggml has and pyggml cannot convert: it names the type and the ones pyggml has."""
    where = f"{what}: " if what else ""
    return UnsupportedTypeError(f"{where}{t.name} is not implemented in pyggml "
                                f"(implemented: {', '.join(x.name for x in IMPLEMENTED_TYPES)})")


def _implemented(t: GGMLType | int | str, what: str) -> GGMLType:
    """`t` as a GGMLType, or UnsupportedTypeError if it is unknown or pyggml cannot convert it."""
    t = as_type(t)
    if t not in IMPLEMENTED_TYPES:
        raise not_implemented_error(t, what)
    return t


def _writable(t: GGMLType | int | str, what: str) -> GGMLType:
    """`t` as a GGMLType, or UnsupportedTypeError if pyggml cannot convert float32 to it."""
    t = _implemented(t, what)
    if t in IQ_TYPES:
        raise UnsupportedTypeError(no_from_float_error(t, what))
    return t

assert all(BLOCK_DTYPES[t].itemsize == TYPE_TRAITS[t].type_size for t in BLOCK_DTYPES)
assert QK_K == 256

# Elements per step of a conversion: the temporaries of a step stay in cache
# (measured best around 2^18 for both directions), and memory stays bounded.
_CHUNK_ELEMS = 1 << 18


# --- block-level API ---------------------------------------------------------------


def dequantize_blocks(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    """Blocks of quantized type `t`, uint8 (nb, type_size) -> float32 (nb, blck_size)."""
    t = _implemented(t, "dequantize_blocks")
    if t not in _DEQUANTIZE:
        raise UnsupportedTypeError(f"dequantize_blocks: {t.name.lower()} is not a block-quantized type")
    tr = TYPE_TRAITS[t]
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, tr.type_size)
    fn = _DEQUANTIZE[t]
    step = _CHUNK_ELEMS // tr.blck_size
    with np.errstate(all="ignore"):  # C float semantics: inf and NaN (from huge scales) without warnings
        if b.shape[0] <= step:
            return fn(b)
        out = np.empty((b.shape[0], tr.blck_size), F32)
        for i in range(0, b.shape[0], step):
            out[i : i + step] = fn(b[i : i + step])
        return out


def quantize_blocks(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """float32 (nb, blck_size) -> blocks of quantized type `t`, uint8 (nb, type_size)."""
    t = _writable(t, "quantize_blocks")
    if t not in _QUANTIZE:
        raise UnsupportedTypeError(f"quantize_blocks: {t.name.lower()} is not a block-quantized type")
    return _quantize_blocks_with(_QUANTIZE[t], t, values)


def _quantize_blocks_with(fn: Callable[[np.ndarray], np.ndarray], t: GGMLType, values: np.ndarray) -> np.ndarray:
    """quantize_blocks with the block quantizer `fn`, a chunk of blocks at a time."""
    tr = TYPE_TRAITS[t]
    x = np.ascontiguousarray(values, dtype=F32).reshape(-1, tr.blck_size)
    step = _CHUNK_ELEMS // tr.blck_size
    with np.errstate(all="ignore"):  # C float semantics: NaN/inf flow through without warnings
        if x.shape[0] <= step:
            return fn(x)
        out = np.empty((x.shape[0], tr.type_size), np.uint8)
        for i in range(0, x.shape[0], step):
            out[i : i + step] = fn(x[i : i + step])
        return out


# --- row-level API ------------------------------------------------------------------


def _check_n(t: GGMLType, got: int, n: int | None) -> None:
    if n is not None and n != got:
        raise ArgumentError(f"to_float: expected {n} {t.name.lower()} elements per row, the data holds {got}")


def to_float(t: GGMLType, raw: np.ndarray, n: int | None = None) -> np.ndarray:
    """Rows of type `t` -> float32 (ggml's to_float).

    Plain types: `raw` is an array of the type's numpy dtype (BF16 as uint16),
    any shape; raw bytes (uint8) are viewed as that dtype along the last axis.
    Quantized types: `raw` is uint8 with rows of whole blocks in the last axis
    (a flat array of whole blocks is one row); the result's last axis counts
    elements. `n`, if given, is the number of elements per row the caller
    expects.
    """
    t = _implemented(t, "to_float")
    tr = TYPE_TRAITS[t]
    raw = np.asarray(raw)
    name = tr.name
    if not tr.is_quantized:
        dt = tr.np_dtype
        assert dt is not None
        if raw.dtype != dt:
            if raw.dtype not in (np.uint8, np.int8) or raw.ndim == 0:
                raise UnsupportedTypeError(f"to_float: {name} data must be {dt} (or raw uint8 bytes), got {raw.dtype}")
            if raw.shape[-1] % dt.itemsize:
                raise ArgumentError(
                    f"to_float: a row of {raw.shape[-1]} bytes is not a whole number of {dt.itemsize}-byte {name} "
                    "elements"
                )
            raw = np.ascontiguousarray(raw).view(dt)
        if t == GGMLType.BF16:
            out = (raw.astype(np.uint32) << 16).view(F32)
        else:
            out = raw.astype(F32)  # always a copy: the result never aliases the source
        _check_n(t, out.shape[-1] if out.ndim else 1, n)
        return out
    if raw.dtype not in (np.uint8, np.int8):
        raise UnsupportedTypeError(f"to_float: {name} data must be raw bytes (uint8), got {raw.dtype}")
    if raw.ndim == 0:
        raise ArgumentError(f"to_float: {name} data must hold whole blocks, got a scalar")
    row_bytes = raw.shape[-1]
    if row_bytes % tr.type_size:
        raise ArgumentError(
            f"to_float: a row of {row_bytes} bytes is not a whole number of {name} blocks of {tr.type_size} bytes"
        )
    n_elem = row_bytes // tr.type_size * tr.blck_size
    _check_n(t, n_elem, n)
    out = dequantize_blocks(t, raw.view(np.uint8))
    return out.reshape(*raw.shape[:-1], n_elem)


def _bf16_from_f32(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even on the bits; NaN kept, made quiet."""
    u = x.view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = ((u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    quiet = ((u >> 16) | np.uint32(64)).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def from_float(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """float32 rows (last axis = elements) -> type `t` (ggml's from_float).

    Plain types give the type's numpy dtype (BF16 as uint16; integer types
    by a plain C-style cast); quantized types give uint8 with the last axis
    in bytes. The last axis must be a whole number of blocks.
    """
    t = _writable(t, "from_float")
    tr = TYPE_TRAITS[t]
    x = np.ascontiguousarray(values, dtype=F32)
    if not tr.is_quantized:
        if t == GGMLType.BF16:
            return _bf16_from_f32(x)
        with np.errstate(invalid="ignore", over="ignore"):
            return x.astype(tr.np_dtype)
    if x.ndim == 0:
        raise ArgumentError(f"from_float: {tr.name} needs rows of whole blocks of {tr.blck_size}, got a scalar")
    if x.shape[-1] % tr.blck_size:
        raise ArgumentError(
            f"from_float: a row of {x.shape[-1]} elements is not a whole number of {tr.name} blocks of {tr.blck_size}"
        )
    out = quantize_blocks(t, x)
    return out.reshape(*x.shape[:-1], x.shape[-1] // tr.blck_size * tr.type_size)


def _q8_simd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of 32 (rows of x) as ggml-cpu's SIMD quantize_row_q8_0/q8_1 (x86 AVX..AVX512, ARM NEON)
    quantize them: d = amax/127 (unrounded) and the quants x * (127/amax) rounded half to even, where the
    reference rows take x * (1/d) rounded half away."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    return (amax / F32(127)).astype(F32), np.rint(x * inv[:, None]).astype(np.int8)


def _quantize_q8_0_simd(x: np.ndarray) -> np.ndarray:
    d, q = _q8_simd(x)
    out = np.empty((x.shape[0], 34), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:] = q.view(np.uint8)
    return out


def _quantize_q8_1_simd(x: np.ndarray) -> np.ndarray:
    d, q = _q8_simd(x)
    out = np.empty((x.shape[0], 36), np.uint8)
    out[:, :2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(d * q.sum(axis=1, dtype=np.int32).astype(F32))  # s from the unrounded d
    out[:, 4:] = q.view(np.uint8)
    return out


_SIMD_ROWS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q8_0: _quantize_q8_0_simd, GGMLType.Q8_1: _quantize_q8_1_simd,
}


def from_float_cpu(t: GGMLType, values: np.ndarray, simd: bool = True) -> np.ndarray:
    """float32 rows -> `t` as ggml's CPU backend converts them (type_traits_cpu's from_float: CPY, SET_ROWS
    and MUL_MAT's src1): Q8_0 and Q8_1 by their SIMD rows, which round ties differently from the reference;
    every other type as `from_float`. The SIMD rounding is what ggml's x86 and ARM builds compute (its
    scalar fallback, for other CPUs, is the reference row: `simd=False`, the CPU backend's "ref" numerics)."""
    if t not in _SIMD_ROWS or not simd:
        return from_float(t, values)
    x = np.ascontiguousarray(values, dtype=F32)
    if x.ndim == 0 or x.shape[-1] % 32:
        return from_float(t, values)  # the same errors
    out = _SIMD_ROWS[t](x.reshape(-1, 32))
    return out.reshape(*x.shape[:-1], x.shape[-1] // 32 * TYPE_TRAITS[t].type_size)


# ggml_quantize_chunk's block quantizers (without an importance matrix) where they are not from_float's
_QUANTIZE_CHUNK: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.IQ4_NL: lambda x: _quantize_iq4_nl_impl(x, _IQ4_NTRY),
}
# the types ggml_quantize_chunk has no case for (it asserts)
_NOT_CHUNKED = (GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64, GGMLType.F64)


def quantize_chunk(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """float32 rows -> type `t` as ggml_quantize_chunk writes them without an importance matrix (what
    llama-quantize stores in a file): from_float's result, except IQ4_NL, whose file quantizer tries 15
    more scales per block and then redoes every quant. Q8_1, Q8_K and the integer types are not
    among its types (UnsupportedTypeError)."""
    t = _writable(t, "quantize_chunk")
    if t in _NOT_CHUNKED:
        raise UnsupportedTypeError(f"quantize_chunk: ggml_quantize_chunk does not convert to {t.name}")
    if t not in _QUANTIZE_CHUNK:
        return from_float(t, values)
    tr = TYPE_TRAITS[t]
    x = np.ascontiguousarray(values, dtype=F32)
    if x.ndim == 0 or x.shape[-1] % tr.blck_size:
        raise ArgumentError(f"quantize_chunk: rows of {x.shape[-1] if x.ndim else 'a scalar'} elements are not "
                            f"whole {tr.name} blocks of {tr.blck_size}")
    out = _quantize_blocks_with(_QUANTIZE_CHUNK[t], t, x)
    return out.reshape(*x.shape[:-1], x.shape[-1] // tr.blck_size * tr.type_size)


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """Activations -> Q8_0 rows (MUL_MAT's src1 for Q4_0/Q5_0/Q8_0 weights)."""
    return from_float(GGMLType.Q8_0, values)


def quantize_q8_1(values: np.ndarray) -> np.ndarray:
    """Activations -> Q8_1 rows (MUL_MAT's src1 for Q4_1/Q5_1 weights)."""
    return from_float(GGMLType.Q8_1, values)


def quantize_q8_K(values: np.ndarray) -> np.ndarray:
    """Activations -> Q8_K rows (MUL_MAT's src1 for the K-quant weights)."""
    return from_float(GGMLType.Q8_K, values)
