"""Tensor types: ggml.h's `enum ggml_type` (GGUF's numbers), ggml.c's `type_traits` with ggml-cpu's `vec_dot_type`.

Removed ids keep placeholder rows (block size 0), as in C; `quants.IMPLEMENTED_TYPES` says which types convert.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from pyggml.core.errors import ArgumentError, ArgumentTypeError, UnsupportedTypeError


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    # 4 (Q4_2) and 5 (Q4_3): removed from ggml
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
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    # 31-33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8): removed, Q4_0 is repacked at run time
    TQ1_0 = 34
    TQ2_0 = 35
    # 36-38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8): removed likewise
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


GGML_TYPE_COUNT = 43
QK_K = 256


@dataclass(frozen=True)
class TypeTraits:
    """What ggml's `struct ggml_type_traits` says of a type (and ggml-cpu's `vec_dot_type`)."""

    name: str
    blck_size: int
    type_size: int
    is_quantized: bool
    np_dtype: np.dtype | None  # None for blocks, and for BF16 (read as uint16)
    vec_dot_type: GGMLType  # F32 where ggml-cpu's table leaves it unset (Q8_K)


def _removed(name: str) -> TypeTraits:
    return TypeTraits(name, 0, 0, False, None, GGMLType.F32)


_REPACKED = "TYPE_{} REMOVED, use {} with runtime repacking"

_T = GGMLType
_TABLE: dict[int, TypeTraits] = {
    _T.F32: TypeTraits("f32", 1, 4, False, np.dtype(np.float32), _T.F32),
    _T.F16: TypeTraits("f16", 1, 2, False, np.dtype(np.float16), _T.F16),
    _T.Q4_0: TypeTraits("q4_0", 32, 18, True, None, _T.Q8_0),
    _T.Q4_1: TypeTraits("q4_1", 32, 20, True, None, _T.Q8_1),
    4: _removed("DEPRECATED"),
    5: _removed("DEPRECATED"),
    _T.Q5_0: TypeTraits("q5_0", 32, 22, True, None, _T.Q8_0),
    _T.Q5_1: TypeTraits("q5_1", 32, 24, True, None, _T.Q8_1),
    _T.Q8_0: TypeTraits("q8_0", 32, 34, True, None, _T.Q8_0),
    _T.Q8_1: TypeTraits("q8_1", 32, 36, True, None, _T.Q8_1),
    _T.Q2_K: TypeTraits("q2_K", QK_K, 84, True, None, _T.Q8_K),
    _T.Q3_K: TypeTraits("q3_K", QK_K, 110, True, None, _T.Q8_K),
    _T.Q4_K: TypeTraits("q4_K", QK_K, 144, True, None, _T.Q8_K),
    _T.Q5_K: TypeTraits("q5_K", QK_K, 176, True, None, _T.Q8_K),
    _T.Q6_K: TypeTraits("q6_K", QK_K, 210, True, None, _T.Q8_K),
    _T.Q8_K: TypeTraits("q8_K", QK_K, 292, True, None, _T.F32),
    _T.IQ2_XXS: TypeTraits("iq2_xxs", QK_K, 66, True, None, _T.Q8_K),
    _T.IQ2_XS: TypeTraits("iq2_xs", QK_K, 74, True, None, _T.Q8_K),
    _T.IQ3_XXS: TypeTraits("iq3_xxs", QK_K, 98, True, None, _T.Q8_K),
    _T.IQ1_S: TypeTraits("iq1_s", QK_K, 50, True, None, _T.Q8_K),
    _T.IQ4_NL: TypeTraits("iq4_nl", 32, 18, True, None, _T.Q8_0),
    _T.IQ3_S: TypeTraits("iq3_s", QK_K, 110, True, None, _T.Q8_K),
    _T.IQ2_S: TypeTraits("iq2_s", QK_K, 82, True, None, _T.Q8_K),
    _T.IQ4_XS: TypeTraits("iq4_xs", QK_K, 136, True, None, _T.Q8_K),
    _T.I8: TypeTraits("i8", 1, 1, False, np.dtype(np.int8), _T.F32),
    _T.I16: TypeTraits("i16", 1, 2, False, np.dtype(np.int16), _T.F32),
    _T.I32: TypeTraits("i32", 1, 4, False, np.dtype(np.int32), _T.F32),
    _T.I64: TypeTraits("i64", 1, 8, False, np.dtype(np.int64), _T.F32),
    _T.F64: TypeTraits("f64", 1, 8, False, np.dtype(np.float64), _T.F32),
    _T.IQ1_M: TypeTraits("iq1_m", QK_K, 56, True, None, _T.Q8_K),
    _T.BF16: TypeTraits("bf16", 1, 2, False, np.dtype(np.uint16), _T.BF16),
    31: _removed(_REPACKED.format("Q4_0_4_4", "Q4_0")),
    32: _removed(_REPACKED.format("Q4_0_4_8", "Q4_0")),
    33: _removed(_REPACKED.format("Q4_0_8_8", "Q4_0")),
    _T.TQ1_0: TypeTraits("tq1_0", QK_K, 54, True, None, _T.Q8_K),
    _T.TQ2_0: TypeTraits("tq2_0", QK_K, 66, True, None, _T.Q8_K),
    36: _removed(_REPACKED.format("IQ4_NL_4_4", "IQ4_NL")),
    37: _removed(_REPACKED.format("IQ4_NL_4_8", "IQ4_NL")),
    38: _removed(_REPACKED.format("IQ4_NL_8_8", "IQ4_NL")),
    _T.MXFP4: TypeTraits("mxfp4", 32, 17, True, None, _T.Q8_0),
    _T.NVFP4: TypeTraits("nvfp4", 64, 36, True, None, _T.Q8_0),
    _T.Q1_0: TypeTraits("q1_0", 128, 18, True, None, _T.Q8_0),
    _T.Q2_0: TypeTraits("q2_0", 64, 18, True, None, _T.Q8_0),
}

TYPE_TRAITS: dict[int, TypeTraits] = {i: _TABLE[i] for i in range(GGML_TYPE_COUNT)}
assert set(_TABLE) == set(range(GGML_TYPE_COUNT))
assert all(tr.blck_size > 0 for i, tr in TYPE_TRAITS.items() if i in GGMLType._value2member_map_)


# the quantized types of weights: all but Q8_1 and Q8_K, which are only src1's partners in ggml's dot products
QUANT_WEIGHT_TYPES: tuple[GGMLType, ...] = tuple(
    t for t in GGMLType if TYPE_TRAITS[t].is_quantized and t not in (GGMLType.Q8_1, GGMLType.Q8_K))


def as_type(t: GGMLType | int | str) -> GGMLType:
    """A GGMLType from itself, its number or its name ('f16', 'Q4_0'); not 2.5, True or a removed id."""
    if isinstance(t, GGMLType):
        return t
    if not isinstance(t, str) and (isinstance(t, bool) or not isinstance(t, numbers.Integral)):
        raise ArgumentTypeError(f"a ggml type is a GGMLType, its number or its name, got {type(t).__name__} {t!r:.80}")
    try:
        if isinstance(t, str):
            return GGMLType[t.upper()]
        return GGMLType(int(t))
    except (KeyError, ValueError):
        tr = None if isinstance(t, str) else TYPE_TRAITS.get(int(t))
        removed = f" (removed from ggml: {tr.name})" if tr is not None else ""
        raise UnsupportedTypeError(f"unknown ggml type {t!r}{removed}") from None


def type_traits(t: GGMLType | int) -> TypeTraits:
    """ggml_get_type_traits: the row of id `t` (placeholder rows for removed ids, as in C)."""
    return TYPE_TRAITS[t]


def blck_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].blck_size


def type_size(t: GGMLType) -> int:
    return TYPE_TRAITS[t].type_size


def type_name(t: GGMLType) -> str:
    return TYPE_TRAITS[t].name


def is_quantized(t: GGMLType) -> bool:
    return TYPE_TRAITS[t].is_quantized


def _live_traits(t: GGMLType) -> TypeTraits:
    """The traits of a type that exists (a removed id has no blocks to count)."""
    tr = TYPE_TRAITS[t]
    if tr.blck_size == 0:
        raise UnsupportedTypeError(f"ggml type {int(t)} has been removed ({tr.name})")
    return tr


def type_sizef(t: GGMLType) -> float:
    """Bytes per element (ggml_type_sizef)."""
    tr = _live_traits(t)
    return tr.type_size / tr.blck_size


def row_size(t: GGMLType, n: int) -> int:
    """Bytes of a row of `n` elements (ggml_row_size); `n` must fill whole blocks."""
    tr = _live_traits(t)
    if n % tr.blck_size != 0:
        raise ArgumentError(
            f"a row of {n} elements is not a whole number of {tr.name} blocks of {tr.blck_size}"
        )
    return tr.type_size * (n // tr.blck_size)


def to_float(t: GGMLType, raw: np.ndarray, n: int | None = None) -> np.ndarray:
    """Rows of type `t` (quantized: uint8 blocks, rows in the last axis) to float32."""
    from pyggml.core import quants

    return quants.to_float(t, raw, n)


def from_float(t: GGMLType, values: np.ndarray) -> np.ndarray:
    """float32 rows to type `t` (quantized: uint8 blocks)."""
    from pyggml.core import quants

    return quants.from_float(t, values)
