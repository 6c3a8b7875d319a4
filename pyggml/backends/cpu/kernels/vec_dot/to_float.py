"""The CPU backend's one dequantizer: rows to float32 by the type table's `to_float`, compiled per type."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, types
from numba.extending import overload

from pyggml.backends.cpu.kernels.vec_dot.ir import load_f16
from pyggml.backends.cpu.kernels.vec_dot.kinds import Q4_1, kind_name
from pyggml.backends.cpu.kernels.vec_dot.type_table import CPU_TYPE_TRAITS, row_of_kind
from pyggml.core.errors import ShapeError, UnsupportedTypeError
from pyggml.core.types import TYPE_TRAITS, GGMLType


@njit(nogil=True, cache=True)
def block_mins_to_f32(kind, w, w_off, r0, nb, out):
    """out[i, K + b] = the min of block b of Q4_1/Q5_1 row w_off[r0 + i], after the row's values (K = width - nb)."""
    size = 20 if kind == Q4_1 else 24
    K = out.shape[1] - nb
    for i in range(out.shape[0]):
        o = w_off[r0 + i]
        for b in range(nb):
            out[i, K + b] = load_f16(w, o + size * b + 2)


def rows_to_f32(kind: int, w: np.ndarray, w_off: np.ndarray, r0: int, nb: int, out: np.ndarray) -> None:
    """out[i] = weight row w_off[r0 + i] (nb blocks) as float32; one thread (it runs between BLAS calls)."""
    _rows_to_f32_of(kind)(w, w_off, r0, nb, out)


def to_f32(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    """Rows of type `t` (whole rows in `raw`'s last axis, as bytes or the type's dtype) as float32."""
    t = GGMLType(t)
    if t not in CPU_TYPE_TRAITS:
        raise UnsupportedTypeError(f"to_f32: the CPU has no to_float for type {t.name}")
    tr = TYPE_TRAITS[t]
    rows = np.ascontiguousarray(raw)
    rows = (rows.reshape(1) if rows.ndim == 0 else rows).view(np.uint8)
    row_bytes = rows.shape[-1]
    if row_bytes % tr.type_size:
        raise ShapeError(f"to_f32: a row of {row_bytes} bytes is not whole {tr.type_size}-byte blocks of {t.name}")
    nb = row_bytes // tr.type_size
    flat = rows.reshape(-1, row_bytes)
    out = np.empty((flat.shape[0], nb * tr.blck_size), np.float32)
    if out.size:
        offsets = np.arange(flat.shape[0], dtype=np.int64) * row_bytes
        rows_to_f32(int(t), flat.reshape(-1), offsets, 0, nb, out)
    return out.reshape(*rows.shape[:-1], nb * tr.blck_size)


def dequantize_row(kind, w, o, nb, out, i):
    """out[i] = the weight row at byte o of w as float32, by the type table's `to_float` of constant `kind`."""
    raise NotImplementedError("dequantize_row runs compiled only")


@overload(dequantize_row, prefer_literal=True, inline="always")
def _dequantize_row(kind, w, o, nb, out, i):
    if not isinstance(kind, types.IntegerLiteral):
        raise numba.errors.TypingError(f"dequantize_row: kind must be a constant, not {kind}")
    row = row_of_kind(kind.literal_value)
    to_float, arg = row.to_float, row.to_float_arg
    if arg is None:
        def impl(kind, w, o, nb, out, i):
            to_float(w, o, nb, out, i)

        return impl

    def impl_arg(kind, w, o, nb, out, i):
        to_float(w, o, nb, out, i, arg)

    return impl_arg


@functools.cache
def _rows_to_f32_of(kind: int):
    """`rows_to_f32` of one weight type, compiled alone."""

    def rows_to_f32_of(w, w_off, r0, nb, out):
        for i in range(out.shape[0]):
            dequantize_row(kind, w, w_off[r0 + i], nb, out, i)

    rows_to_f32_of.__name__ = rows_to_f32_of.__qualname__ = f"rows_to_f32_{kind_name(kind)}"
    return njit(nogil=True, cache=True)(rows_to_f32_of)
