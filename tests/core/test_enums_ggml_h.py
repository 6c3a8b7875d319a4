"""pyggml's enums against ggml.h itself: every name and value, read from the header of the llama.cpp sdist
(pyggml.testing.llamacpp.include_dir(): downloaded and extracted once per machine, no compiler needed).

ggml_op, ggml_unary_op and ggml_glu_op, the small enums that travel in op_params (sort order, precision, op hint,
scale mode and flags, tri type, pool op), the tensor flags and the #defines pyggml mirrors (rope types, limits).
The types are checked apart (`test_types_match_ggml_h`): ggml_type is the types engineer's.
"""

from __future__ import annotations

import functools
from enum import IntEnum, IntFlag

import pytest

from pyggml.core import tensor
from pyggml.core.ops.custom import GGML_N_TASKS_MAX
from pyggml.core.tensor import (
    GGMLOp,
    GLUOp,
    OpHint,
    OpPool,
    Prec,
    ScaleFlag,
    ScaleMode,
    SortOrder,
    TensorFlag,
    TriType,
    UnaryOp,
)
from pyggml.core.types import GGMLType
from pyggml.testing import llamacpp
from pyggml.testing.ggml_c import parse_defines, parse_enums

# pyggml's enum, ggml.h's enum, its members' prefix, the name of its *_COUNT member (None: it has none)
ENUMS: list[tuple[type[IntEnum] | type[IntFlag], str, str, str | None]] = [
    (GGMLOp, "ggml_op", "GGML_OP_", "GGML_OP_COUNT"),
    (UnaryOp, "ggml_unary_op", "GGML_UNARY_OP_", "GGML_UNARY_OP_COUNT"),
    (GLUOp, "ggml_glu_op", "GGML_GLU_OP_", "GGML_GLU_OP_COUNT"),
    (SortOrder, "ggml_sort_order", "GGML_SORT_ORDER_", None),
    (Prec, "ggml_prec", "GGML_PREC_", None),
    (OpHint, "ggml_op_hint", "GGML_HINT_", None),
    (ScaleMode, "ggml_scale_mode", "GGML_SCALE_MODE_", "GGML_SCALE_MODE_COUNT"),
    (ScaleFlag, "ggml_scale_flag", "GGML_SCALE_FLAG_", None),
    (TriType, "ggml_tri_type", "GGML_TRI_TYPE_", None),
    (OpPool, "ggml_op_pool", "GGML_OP_POOL_", "GGML_OP_POOL_COUNT"),
    (TensorFlag, "ggml_tensor_flag", "GGML_TENSOR_FLAG_", None),
]

pytestmark = pytest.mark.interop  # ggml.h of the sdist

# pyggml's module constants for the *_COUNT members
COUNTS = {"GGML_OP_COUNT": tensor.GGML_OP_COUNT, "GGML_UNARY_OP_COUNT": tensor.GGML_UNARY_OP_COUNT,
          "GGML_GLU_OP_COUNT": tensor.GGML_GLU_OP_COUNT, "GGML_SCALE_MODE_COUNT": tensor.GGML_SCALE_MODE_COUNT,
          "GGML_OP_POOL_COUNT": tensor.GGML_OP_POOL_COUNT}


@functools.cache
def _ggml_h() -> str:
    return (llamacpp.include_dir() / "ggml.h").read_text()


@functools.cache
def _enums() -> dict[str, dict[str, int]]:
    return parse_enums(_ggml_h())


@pytest.mark.parametrize("enum, c_name, prefix, count", ENUMS, ids=[e[1] for e in ENUMS])
def test_enum_matches_ggml_h(enum: type[IntEnum] | type[IntFlag], c_name: str, prefix: str,
                             count: str | None) -> None:
    """The same members (aliases included), in the header's order, with the header's values."""
    header = dict(_enums()[c_name])
    if count is not None:
        assert COUNTS[count] == header.pop(count), count
    ours = {prefix + name: int(member) for name, member in enum.__members__.items()}
    assert ours == header
    assert list(ours) == list(header)  # the header's order


def test_ops_are_the_101_of_ggml_c() -> None:
    assert len(GGMLOp) == tensor.GGML_OP_COUNT == 101  # ggml.c: static_assert(GGML_OP_COUNT == 101)
    assert [int(op) for op in GGMLOp] == list(range(101))
    assert (len(UnaryOp), len(GLUOp)) == (22, 7)
    for gone in ("ALIBI", "FLASH_ATTN", "FLASH_FF", "MAP_UNARY", "MAP_BINARY", "MAP_CUSTOM1_F32", "MAP_CUSTOM2_F32",
                 "MAP_CUSTOM3_F32", "CONV_1D"):
        assert gone not in GGMLOp.__members__, gone
    assert "LEAKY" not in UnaryOp.__members__  # today an op of its own, LEAKY_RELU


def test_defines_match_ggml_h() -> None:
    defines = parse_defines(_ggml_h())
    ours = {
        "GGML_MAX_DIMS": tensor.GGML_MAX_DIMS, "GGML_MAX_SRC": tensor.GGML_MAX_SRC,
        "GGML_MAX_NAME": tensor.GGML_MAX_NAME, "GGML_MAX_OP_PARAMS": tensor.GGML_MAX_OP_PARAMS,
        "GGML_ROPE_TYPE_NORMAL": tensor.GGML_ROPE_TYPE_NORMAL, "GGML_ROPE_TYPE_NEOX": tensor.GGML_ROPE_TYPE_NEOX,
        "GGML_ROPE_TYPE_MROPE": tensor.GGML_ROPE_TYPE_MROPE, "GGML_ROPE_TYPE_VISION": tensor.GGML_ROPE_TYPE_VISION,
        "GGML_ROPE_TYPE_IMROPE": tensor.GGML_ROPE_TYPE_IMROPE, "GGML_MROPE_SECTIONS": tensor.GGML_MROPE_SECTIONS,
        "GGML_N_TASKS_MAX": GGML_N_TASKS_MAX,
    }
    assert {name: defines[name] for name in ours} == ours


def test_types_match_ggml_h() -> None:
    """Every GGMLType member is ggml.h's GGML_TYPE_<name> with its value, and every type of ggml.h is a member."""
    header = dict(_enums()["ggml_type"])
    header.pop("GGML_TYPE_COUNT")
    ours = {"GGML_TYPE_" + name: int(member) for name, member in GGMLType.__members__.items()}
    assert ours == header
