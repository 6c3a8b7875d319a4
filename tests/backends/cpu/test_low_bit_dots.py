"""The block sums of the TQ1_0, TQ2_0, Q2_0 and NVFP4 vec_dots (vec_dot.low_bit) in every variant the host runs
(portable vector IR always, AVX2 and AVX512-VNNI where the CPU has them), against integer sums in numpy.

The weights' values come from the core's dequantizer (bit-exact with ggml) of the same bytes with a scale of 1, so
a wrong field, trit or table entry in any variant fails here, whatever CPU the tests run on.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from numba import njit

from pyggml.backends.cpu.kernels.vec_dot import block_sums, low_bit, table_lookup
from pyggml.core import quants
from pyggml.core.types import TYPE_TRAITS, GGMLType

T = GGMLType
NB = 64  # blocks of each type
ONE_F16 = np.array([1.0], "<f2").view(np.uint8)
ONE_UE4M3 = 0x40  # ggml_ue4m3_to_fp32(0x40) = 1.0: NVFP4's values are then kvalues_fp4 themselves


def variants() -> dict[str, tuple[Callable, Callable, Callable]]:
    """(unsigned sums, signed sums with the quads layout, table lookup) of every variant this host runs."""
    out = {"portable": (block_sums.block_sums_unsigned_portable, block_sums.block_sums_quads,
                        table_lookup.lookup16_portable)}
    if block_sums.HAS_AVX2:
        out["avx2"] = (block_sums.block_sums_unsigned_avx2, block_sums.block_sums_avx2, table_lookup.lookup16_avx2)
    if block_sums.HAS_VNNI:
        out["vnni"] = (block_sums.block_sums_unsigned_vnni, block_sums.block_sums_vnni, table_lookup.lookup16_avx2)
    return out


def unit_blocks(t: GGMLType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(NB random blocks of t with scale 1, their values as int64 (NB, block size)): every byte value occurs."""
    tr = TYPE_TRAITS[t]
    raw = rng.integers(0, 256, (NB, tr.type_size), dtype=np.uint8)
    if t == T.NVFP4:
        raw[:, :4] = ONE_UE4M3
    else:
        off = quants.BLOCK_DTYPES[t].fields["d"][1]
        raw[:, off:off + 2] = ONE_F16
    values = quants.to_float(t, raw)
    assert np.array_equal(values, np.round(values))
    return raw, values.astype(np.int64)


@pytest.fixture(params=list(variants()))
def dots(request: pytest.FixtureRequest) -> low_bit.LowBitDots:
    return low_bit.make_low_bit_dots(*variants()[request.param])


def test_ternary_block_sums(dots: low_bit.LowBitDots, rng: np.random.Generator) -> None:
    """TQ1_0's trits and TQ2_0's fields (value + 1) times a whole Q8_K block of src1."""
    tq1, tq2 = dots.tq1_0, dots.tq2_0

    @njit
    def run(w: np.ndarray, y: np.ndarray, size: int, ternary1: bool, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            out[b] = tq1(w, size * b, y, 256 * b) if ternary1 else tq2(w, size * b, y, 256 * b)

    for t in (T.TQ1_0, T.TQ2_0):
        raw, values = unit_blocks(t, rng)
        y = rng.integers(-127, 128, (NB, 256), dtype=np.int8)
        got = np.zeros(NB, np.int32)
        run(raw.reshape(-1), y.reshape(-1), TYPE_TRAITS[t].type_size, t == T.TQ1_0, got)
        np.testing.assert_array_equal(got, ((values + 1) * y).sum(axis=1), err_msg=t.name)


def test_q2_0_and_nvfp4_block_sums(dots: low_bit.LowBitDots, rng: np.random.Generator) -> None:
    """Q2_0's fields (value + 1) by halves of 32, NVFP4's kvalues_fp4 by sub-blocks of 16."""
    q2, fp4 = dots.q2_0_32, dots.fp4_pair

    @njit
    def run_q2(w: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            for k in range(2):
                out[b, k] = q2(w, 18 * b + 2 + 8 * k, y, 64 * b + 32 * k)

    @njit
    def run_fp4(w: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for b in range(out.shape[0]):
            for p in range(2):
                out[b, 2 * p], out[b, 2 * p + 1] = fp4(w, 36 * b + 4 + 16 * p, y, 64 * b + 32 * p)

    y = rng.integers(-127, 128, (NB, 64), dtype=np.int8)
    raw, values = unit_blocks(T.Q2_0, rng)
    got = np.zeros((NB, 2), np.int32)
    run_q2(raw.reshape(-1), y.reshape(-1), got)
    np.testing.assert_array_equal(got, ((values + 1) * y).reshape(NB, 2, 32).sum(axis=2))
    raw, values = unit_blocks(T.NVFP4, rng)
    got = np.zeros((NB, 4), np.int32)
    run_fp4(raw.reshape(-1), y.reshape(-1), got)
    np.testing.assert_array_equal(got, (values * y).reshape(NB, 4, 16).sum(axis=2))
