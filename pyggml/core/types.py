"""Tensor types and their traits (ggml's `type_traits`).

The numbering is the one GGUF files use (`gguf.GGMLQuantizationType`), and
block and type sizes come from the gguf package's `GGML_QUANT_SIZES`, so a
type read from a file is a `GGMLType` without translation.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from pyggml.core.errors import ArgumentError, ArgumentTypeError, UnsupportedTypeError


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30


QK_K = 256  # super-block size of the K-quants


@dataclass(frozen=True)
class TypeTraits:
    """What ggml's `ggml_type_traits_t` says of a type."""

    name: str
    blck_size: int  # elements per block
    type_size: int  # bytes per block
    is_quantized: bool
    # numpy dtype of one element; None for block-quantized types (and BF16,
    # which numpy lacks: its elements are read as uint16)
    np_dtype: np.dtype | None
    # the type ggml converts src1 to before the dot product in MUL_MAT
    vec_dot_type: GGMLType


_NP_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.BF16: np.dtype(np.uint16),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
    GGMLType.F64: np.dtype(np.float64),
}

# ggml's vec_dot_type table (ggml.c, late 2023)
_VEC_DOT_TYPE: dict[GGMLType, GGMLType] = {
    GGMLType.F16: GGMLType.F16,
    GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0,
    GGMLType.Q5_0: GGMLType.Q8_0,
    GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1,
    GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q8_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K,
    GGMLType.Q3_K: GGMLType.Q8_K,
    GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.Q8_K: GGMLType.Q8_K,
}


def _build_traits() -> dict[GGMLType, TypeTraits]:
    traits = {}
    for t in GGMLType:
        blck_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(t))]
        traits[t] = TypeTraits(
            name=t.name.lower(),
            blck_size=blck_size,
            type_size=type_size,
            is_quantized=blck_size > 1,
            np_dtype=_NP_DTYPES.get(t),
            vec_dot_type=_VEC_DOT_TYPE.get(t, GGMLType.F32),
        )
    return traits


TYPE_TRAITS: dict[GGMLType, TypeTraits] = _build_traits()


def as_type(t: GGMLType | int | str) -> GGMLType:
    """Accept a GGMLType, its number, or its name ('f16', 'Q4_0'); 2.5 or True is not a type."""
    if isinstance(t, GGMLType):
        return t
    if not isinstance(t, str) and (isinstance(t, bool) or not isinstance(t, numbers.Integral)):
        raise ArgumentTypeError(f"a ggml type is a GGMLType, its number or its name, got {type(t).__name__} {t!r:.80}")
    try:
        if isinstance(t, str):
            return GGMLType[t.upper()]
        return GGMLType(int(t))
    except (KeyError, ValueError):
        raise UnsupportedTypeError(f"unknown ggml type {t!r}") from None


def type_traits(t: GGMLType) -> TypeTraits:
    return TYPE_TRAITS[t]


def blck_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].blck_size


def type_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].type_size


def type_name(t: GGMLType) -> str:
    return TYPE_TRAITS[t].name


def is_quantized(t: GGMLType) -> bool:
    return TYPE_TRAITS[t].is_quantized


def type_sizef(t: GGMLType) -> float:
    """Bytes per element (ggml_type_sizef)."""
    tr = TYPE_TRAITS[t]
    return tr.type_size / tr.blck_size


def row_size(t: GGMLType, n: int) -> int:
    """Bytes of a row of `n` elements (ggml_row_size); `n` must fill whole blocks."""
    tr = TYPE_TRAITS[t]
    if n % tr.blck_size != 0:
        raise ArgumentError(
            f"a row of {n} elements is not a whole number of {tr.name} blocks of {tr.blck_size}"
        )
    return tr.type_size * (n // tr.blck_size)


def to_float(t: GGMLType, raw: np.ndarray, n: int | None = None) -> np.ndarray:
    """Convert rows of type `t` to float32.

    `raw` holds whole rows: for plain types an array of the type's numpy dtype
    (any shape), for quantized types bytes as uint8 with rows in the last axis.
    Returns float32 with the last axis in elements.
    """
    from pyggml.core import quants

    return quants.to_float(t, raw, n)


def from_float(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """Convert float32 rows (last axis = elements) to type `t`.

    Returns the type's numpy dtype for plain types, uint8 bytes for quantized
    types (last axis = row bytes).
    """
    from pyggml.core import quants

    return quants.from_float(t, values)
