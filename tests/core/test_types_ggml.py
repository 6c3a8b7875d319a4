"""`GGMLType` and `TYPE_TRAITS` are ggml's, at llama.cpp 0c1e570.

The enum is checked against ggml.h of the sdist (parsed by
`pyggml.testing.ggml_c.parse_enums`), the traits of every type id against the
C library itself (ggml_get_type_traits, ggml_blck_size, ggml_type_size and
ggml-cpu's vec_dot_type, through ctypes).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.core import quants
from pyggml.core.errors import ArgumentTypeError, UnsupportedTypeError
from pyggml.core.types import (
    GGML_TYPE_COUNT,
    TYPE_TRAITS,
    GGMLType,
    as_type,
    row_size,
    type_name,
    type_sizef,
    type_traits,
)
from pyggml.testing import llamacpp

REMOVED_IDS = (4, 5, 31, 32, 33, 36, 37, 38)


@pytest.fixture(scope="module")
def ggml_types() -> dict[str, int]:
    """`enum ggml_type` of ggml.h at the oracle's commit (extracted from the sdist, no compiler needed)."""
    from pyggml.testing.ggml_c import parse_enums

    header = (llamacpp.include_dir() / "ggml.h").read_text()  # a failed download fails the test
    return parse_enums(header)["ggml_type"]


@pytest.fixture(scope="module")
def clib() -> object:
    """The C library (libggml-base and libggml-cpu), built if this machine lacks it."""
    from pyggml.testing import ggml_c

    try:
        return ggml_c.load()
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


@pytest.mark.interop
def test_enum_is_ggml_h(ggml_types: dict[str, int]) -> None:
    theirs = {name.removeprefix("GGML_TYPE_"): value for name, value in ggml_types.items()}
    assert theirs.pop("COUNT") == GGML_TYPE_COUNT == 43
    assert {t.name: t.value for t in GGMLType} == theirs
    # the gaps are the removed types, which ggml.h keeps only as comments
    assert set(range(GGML_TYPE_COUNT)) - set(theirs.values()) == set(REMOVED_IDS)


def test_traits_have_a_row_per_id_as_in_c() -> None:
    assert list(TYPE_TRAITS) == list(range(GGML_TYPE_COUNT))
    for i in REMOVED_IDS:
        tr = type_traits(i)
        assert (tr.blck_size, tr.type_size, tr.is_quantized) == (0, 0, False)
    assert type_traits(4).name == "DEPRECATED"
    assert type_traits(31).name == "TYPE_Q4_0_4_4 REMOVED, use Q4_0 with runtime repacking"
    assert type_name(GGMLType.Q4_K) == "q4_K" and type_name(GGMLType.IQ4_NL) == "iq4_nl"


def test_traits_are_the_c_librarys(clib: object) -> None:
    from pyggml.testing import ggml_c

    for i in range(GGML_TYPE_COUNT):
        c, ours = ggml_c.c_type_traits(i), TYPE_TRAITS[i]
        assert (c.type_name.decode(), c.blck_size, c.type_size, c.is_quantized) == \
            (ours.name, ours.blck_size, ours.type_size, ours.is_quantized), i
        assert (ggml_c.c_blck_size(i), ggml_c.c_type_size(i)) == (ours.blck_size, ours.type_size), i
        if ours.blck_size:  # the CPU's table has no rows for removed ids
            assert ggml_c.c_type_traits_cpu(i).vec_dot_type == ours.vec_dot_type, i


def test_every_type_converts_to_float_and_from_it_where_ggmls_cpu_does() -> None:
    """Every ggml type converts to float32; the lattice types alone refuse float32 (ggml's CPU has no
    from_float for them), naming the type."""
    assert set(quants.IMPLEMENTED_TYPES) == set(GGMLType)
    not_written = [t for t in GGMLType if t not in quants.FROM_FLOAT_TYPES]
    assert {t.name for t in not_written} == {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M"}
    for t in not_written:
        tr = TYPE_TRAITS[t]
        assert quants.to_float(t, np.zeros(tr.type_size, np.uint8)).shape == (tr.blck_size,)
        with pytest.raises(UnsupportedTypeError, match=rf"{t.name}"):
            quants.from_float(t, np.zeros(tr.blck_size, np.float32))
        assert quants.is_implemented(t)
        assert row_size(t, 2 * tr.blck_size) == 2 * tr.type_size


def test_removed_ids_are_not_types() -> None:
    for i in REMOVED_IDS:
        with pytest.raises(UnsupportedTypeError, match=rf"unknown ggml type {i} \(removed from ggml: "):
            as_type(i)
        with pytest.raises(UnsupportedTypeError, match="removed"):
            row_size(i, 32)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedTypeError, match="removed"):
            type_sizef(i)  # type: ignore[arg-type]
        assert not quants.is_implemented(i)
    with pytest.raises(UnsupportedTypeError, match="unknown ggml type 43"):
        as_type(GGML_TYPE_COUNT)
    with pytest.raises(ArgumentTypeError):
        as_type(True)
    assert as_type("iq4_xs") == as_type(23) == GGMLType.IQ4_XS
