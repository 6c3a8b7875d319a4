"""The lattice IQ types (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M): block layouts and to_float.

Each group of 8 weights (4 in IQ3's grids) is one point of a fixed lattice (pyggml.core.iq_grids) times a
sub-block scale, with sign bits (IQ2, IQ3) or a shift of +-1/8 (IQ1). The dequantizers are ggml-quants.c's
dequantize_row_* (llama.cpp 0c1e570) over all blocks at once with the same float32 operations, so their values
are ggml's bit for bit.

ggml's CPU has no from_float for these types (type_traits_cpu leaves it NULL or commented out): ggml writes them
only in ggml_quantize_chunk, after ggml_quantize_init builds its search tables, and llama-quantize needs an
importance matrix for IQ2_XXS, IQ2_XS and IQ1_S (ggml_quantize_requires_imatrix). pyggml reads them and does not
write them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pyggml.core.iq_grids import (
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KMASK_IQ2XS,
    KSIGNS_IQ2XS,
)
from pyggml.core.types import GGMLType

F32 = np.float32
IQ1S_DELTA = F32(0.125)  # ggml-common.h's IQ1S_DELTA and IQ1M_DELTA


def _fields(b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Blocks as raw bytes (nb, type_size) viewed as their C struct (nb,)."""
    return np.ascontiguousarray(b).view(dtype)[:, 0]


def _signs(bits: np.ndarray) -> np.ndarray:
    """Sign bytes (...) -> (..., 8) float32: -1 where bit j is set (kmask_iq2xs[j]), else 1."""
    return np.where(bits[..., None] & KMASK_IQ2XS, F32(-1), F32(1))


def _scaled(db: np.ndarray, points: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """ggml's `db * grid[j] * (sign ? -1.f : 1.f)` for groups of 8: db (nb, 8 sub-blocks, 4 groups)."""
    return (db[..., None] * points.astype(F32)) * signs


def _two_scales(d: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """IQ2_XS and IQ2_S: the scales of each sub-block's groups (nb, 8, 4), `d * (0.5f + nibble) * 0.25f`, the low
    nibble for groups 0-1, the high one for 2-3."""
    nib = np.stack([scales & 15, scales & 15, scales >> 4, scales >> 4], axis=-1).astype(F32)
    return (d[:, None, None] * (F32(0.5) + nib)) * F32(0.25)


IQ2_XXS_DTYPE = np.dtype([("d", "<f2"), ("qs", "<u2", 32)])


def _dequantize_iq2_xxs(b: np.ndarray) -> np.ndarray:
    """IQ2_XXS, 256 weights in 66 bytes: d fp16 @0, qs u16[32] @2. Sub-block ib (32 weights) is 8 bytes of qs: 4
    grid indices (bytes 0-3) and a u32 aux (bytes 4-7) whose bits 7l..7l+6 are group l's ksigns index and bits 28-31
    the scale s; x = d * (0.5 + s) * 0.25 * iq2xxs_grid[index][j] * sign."""
    f = _fields(b, IQ2_XXS_DTYPE)
    nb = f.shape[0]
    q = f["qs"].view(np.uint8).reshape(nb, 8, 8)
    aux = np.ascontiguousarray(q[:, :, 4:]).view("<u4")[..., 0]
    db = (f["d"].astype(F32)[:, None] * (F32(0.5) + (aux >> 28).astype(F32))) * F32(0.25)
    signs = KSIGNS_IQ2XS[(aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
    out = _scaled(np.repeat(db[..., None], 4, axis=-1), IQ2XXS_GRID[q[:, :, :4]], _signs(signs))
    return out.reshape(nb, 256)


IQ2_XS_DTYPE = np.dtype([("d", "<f2"), ("qs", "<u2", 32), ("scales", "u1", 8)])


def _dequantize_iq2_xs(b: np.ndarray) -> np.ndarray:
    """IQ2_XS, 256 weights in 74 bytes: d fp16 @0, qs u16[32] @2, scales u8[8] @66. Group l of sub-block ib is
    qs[4ib + l]: bits 0-8 an iq2xs_grid index, bits 9-15 a ksigns index; its scale is d * (0.5 + s) * 0.25, s the
    low nibble of scales[ib] for groups 0-1, the high one for 2-3."""
    f = _fields(b, IQ2_XS_DTYPE)
    nb = f.shape[0]
    q = f["qs"].reshape(nb, 8, 4)
    db = _two_scales(f["d"].astype(F32), f["scales"])
    return _scaled(db, IQ2XS_GRID[q & 511], _signs(KSIGNS_IQ2XS[q >> 9])).reshape(nb, 256)


IQ2_S_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", 64), ("qh", "u1", 8), ("scales", "u1", 8)])


def _dequantize_iq2_s(b: np.ndarray) -> np.ndarray:
    """IQ2_S, 256 weights in 82 bytes: d fp16 @0, qs u8[64] @2, qh u8[8] @66, scales u8[8] @74. Group l of
    sub-block ib is iq2s_grid[qs[4ib + l] | bits 2l..2l+1 of qh[ib] << 8] with the sign byte qs[32 + 4ib + l]; scales
    as IQ2_XS."""
    f = _fields(b, IQ2_S_DTYPE)
    nb = f.shape[0]
    low = f["qs"][:, :32].reshape(nb, 8, 4).astype(np.int32)
    high = (f["qh"].astype(np.int32)[..., None] << (8 - 2 * np.arange(4))) & 0x300
    db = _two_scales(f["d"].astype(F32), f["scales"])
    return _scaled(db, IQ2S_GRID[low | high], _signs(f["qs"][:, 32:].reshape(nb, 8, 4))).reshape(nb, 256)


IQ3_XXS_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", 64), ("scales_and_signs", "<u4", 8)])


def _dequantize_iq3_xxs(b: np.ndarray) -> np.ndarray:
    """IQ3_XXS, 256 weights in 98 bytes: d fp16 @0, qs u8[64] @2 (iq3xxs_grid indices, 4 weights each), then a u32
    per sub-block @66: bits 7l..7l+6 group l's ksigns index (its 8 weights are the points of qs[8ib + 2l] and
    qs[8ib + 2l + 1]), bits 28-31 the scale s; x = d * (0.5 + s) * 0.5 * point * sign."""
    f = _fields(b, IQ3_XXS_DTYPE)
    nb = f.shape[0]
    aux = f["scales_and_signs"]
    db = (f["d"].astype(F32)[:, None] * (F32(0.5) + (aux >> 28).astype(F32))) * F32(0.5)
    signs = KSIGNS_IQ2XS[(aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]
    points = IQ3XXS_GRID[f["qs"].reshape(nb, 8, 4, 2)].reshape(nb, 8, 4, 8)
    return _scaled(np.repeat(db[..., None], 4, axis=-1), points, _signs(signs)).reshape(nb, 256)


IQ3_S_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", 64), ("qh", "u1", 8), ("signs", "u1", 32), ("scales", "u1", 4)])


def _dequantize_iq3_s(b: np.ndarray) -> np.ndarray:
    """IQ3_S, 256 weights in 110 bytes: d fp16 @0, qs u8[64] @2, qh u8[8] @66, signs u8[32] @74, scales u8[4] @106.
    Group l of sub-block ib is the points iq3s_grid[qs[8ib + 2l + k] | bit 2l + k of qh[ib] << 8] (k = 0, 1) with
    the sign byte signs[4ib + l]; x = d * (1 + 2s) * point * sign, s nibble ib % 2 of scales[ib / 2]."""
    f = _fields(b, IQ3_S_DTYPE)
    nb = f.shape[0]
    high = (f["qh"].astype(np.int32)[..., None] << (8 - np.arange(8))) & 256
    points = IQ3S_GRID[f["qs"].reshape(nb, 8, 8).astype(np.int32) | high].reshape(nb, 8, 4, 8)
    s = np.stack([f["scales"] & 15, f["scales"] >> 4], axis=-1).reshape(nb, 8).astype(np.int32)
    db = f["d"].astype(F32)[:, None] * (1 + 2 * s).astype(F32)
    signs = _signs(f["signs"].reshape(nb, 8, 4))
    return _scaled(np.repeat(db[..., None], 4, axis=-1), points, signs).reshape(nb, 256)


IQ1_S_DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", 32), ("qh", "<u2", 8)])


def _iq1_values(dl: np.ndarray, index: np.ndarray, negative_shift: np.ndarray) -> np.ndarray:
    """ggml's `dl * (grid[j] + delta)` for groups of 8 of iq1s_grid: dl, index, negative_shift (nb, 8, 4)."""
    delta = np.where(negative_shift, -IQ1S_DELTA, IQ1S_DELTA)
    return dl[..., None] * (IQ1S_GRID[index].astype(F32) + delta[..., None])


def _dequantize_iq1_s(b: np.ndarray) -> np.ndarray:
    """IQ1_S, 256 weights in 50 bytes: d fp16 @0, qs u8[32] @2, qh u16[8] @34. Group l of sub-block ib is
    iq1s_grid[qs[4ib + l] | bits 3l..3l+2 of qh[ib] << 8]; bits 12-14 of qh[ib] are the scale s, bit 15 the sign of
    the shift; x = d * (2s + 1) * (point + shift), shift +-0.125."""
    f = _fields(b, IQ1_S_DTYPE)
    nb = f.shape[0]
    qh = f["qh"].astype(np.int32)
    index = f["qs"].reshape(nb, 8, 4).astype(np.int32) | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
    dl = f["d"].astype(F32)[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    shift = np.repeat((qh & 0x8000)[..., None] != 0, 4, axis=-1)
    return _iq1_values(np.repeat(dl[..., None], 4, axis=-1), index, shift).reshape(nb, 256)


IQ1_M_DTYPE = np.dtype([("qs", "u1", 32), ("qh", "u1", 16), ("scales", "<u2", 4)])


def _dequantize_iq1_m(b: np.ndarray) -> np.ndarray:
    """IQ1_M, 256 weights in 56 bytes: qs u8[32] @0, qh u8[16] @32, scales u16[4] @48. d is the fp16 made of the top
    nibbles of the 4 scales; group l of sub-block ib is iq1s_grid[qs[4ib + l] | 3 bits of qh[2ib + l/2] << 8] (its low
    nibble for even l, high for odd), the nibble's bit 3 the sign of the shift; the 3-bit scales of sub-block ib are
    bits 6(ib%2).. (groups 0-1) and 6(ib%2)+3.. (groups 2-3) of scales[ib/2]; x = d * (2s + 1) * (point + shift)."""
    f = _fields(b, IQ1_M_DTYPE)
    nb = f.shape[0]
    sc = f["scales"].astype(np.uint16)
    bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    d = bits.view("<f2").astype(F32)
    nibbles = np.stack([f["qh"] & 15, f["qh"] >> 4], axis=-1).reshape(nb, 8, 4).astype(np.int32)
    index = f["qs"].reshape(nb, 8, 4).astype(np.int32) | ((nibbles & 7) << 8)
    shifts = 6 * (np.arange(8) % 2)
    s = sc[:, np.arange(8) // 2].astype(np.int32)
    ls = np.stack([(s >> shifts) & 7, (s >> shifts) & 7, (s >> (shifts + 3)) & 7, (s >> (shifts + 3)) & 7], axis=-1)
    dl = d[:, None, None] * (2 * ls + 1).astype(F32)
    return _iq1_values(dl, index, (nibbles & 8) != 0).reshape(nb, 256)


@dataclass(frozen=True)
class IQType:
    """One lattice type: its block struct, its dequantize_row, and whether llama-quantize needs an importance
    matrix to write it (ggml_quantize_requires_imatrix)."""

    dtype: np.dtype
    dequantize: Callable[[np.ndarray], np.ndarray]
    requires_imatrix: bool


_T = GGMLType
# in ggml's enum order
IQ_TYPES: dict[GGMLType, IQType] = {
    _T.IQ2_XXS: IQType(IQ2_XXS_DTYPE, _dequantize_iq2_xxs, True),
    _T.IQ2_XS: IQType(IQ2_XS_DTYPE, _dequantize_iq2_xs, True),
    _T.IQ3_XXS: IQType(IQ3_XXS_DTYPE, _dequantize_iq3_xxs, False),
    _T.IQ1_S: IQType(IQ1_S_DTYPE, _dequantize_iq1_s, True),
    _T.IQ3_S: IQType(IQ3_S_DTYPE, _dequantize_iq3_s, False),
    _T.IQ2_S: IQType(IQ2_S_DTYPE, _dequantize_iq2_s, False),
    _T.IQ1_M: IQType(IQ1_M_DTYPE, _dequantize_iq1_m, False),
}


def no_from_float_error(t: GGMLType, what: str) -> str:
    """Why `what` cannot write lattice type `t`: ggml's CPU has no from_float for it."""
    imatrix = ", with an importance matrix" if IQ_TYPES[t].requires_imatrix else ""
    return (f"{what}: ggml's CPU has no from_float for {t.name}: ggml writes it only in ggml_quantize_chunk "
            f"(llama-quantize{imatrix}); pyggml reads {t.name} and does not write it")
