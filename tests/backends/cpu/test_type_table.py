"""The CPU's per-type table (`vec_dot.type_table`) against every type list of the CPU backend and the device's
supports_op answers: a list that disagrees with the table fails here."""

from __future__ import annotations

import numpy as np
import pytest
from numba import types

from pyggml.backends.cpu import cpu_init, repack
from pyggml.backends.cpu.kernels import _common, matmul, matmul_id
from pyggml.backends.cpu.kernels.vec_dot import (
    kquant_loops,
    kquant_tiles,
    mul_mat_job,
    quant_loops,
    quantize_src1,
    tiles_x8,
    to_float,
)
from pyggml.backends.cpu.kernels.vec_dot import type_table as tt
from pyggml.backends.cpu.kernels.vec_dot.kinds import TILED, X8_GEMV, X8_REPACKED, X8_TILE
from pyggml.core import types as core_types
from pyggml.core.context import Context
from pyggml.core.errors import ShapeError, UnsupportedTypeError
from pyggml.core.quants import BLOCK_DTYPES, FROM_FLOAT_TYPES, is_implemented
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.testing import op_check
from pyggml.testing.random_blocks import random_blocks

T = GGMLType
K = 256  # a whole block of every type


def test_rows_come_in_ggml_enum_order_with_ggml_block_sizes() -> None:
    assert list(tt.CPU_TYPE_TRAITS) == sorted(tt.CPU_TYPE_TRAITS, key=int)
    for t, row in tt.CPU_TYPE_TRAITS.items():
        assert row.type == t
        if t in BLOCK_DTYPES:
            assert row.block_bytes == BLOCK_DTYPES[t].itemsize and row.block_size == TYPE_TRAITS[t].blck_size


def test_each_weight_type_has_one_dot_and_its_vec_dot_type_is_ggml_s() -> None:
    for t, row in tt.CPU_TYPE_TRAITS.items():
        if row.vec_dot_type is None:
            assert row.cols is row.cols_x86 is row.reference_dot is row.reference_dot_x86 is row.x8 is None, t
            assert not row.repack, t
            continue
        assert row.vec_dot_type == TYPE_TRAITS[t].vec_dot_type, t
        assert (row.cols is None) != (row.reference_dot is None), t  # a row loop or a scalar dot, not both
        assert row.cols_x86 is None or row.cols is not None, t
        assert row.tiled is None or (row.cols is not None and row.vec_dot_type == T.Q8_K), t
        assert row.reference_dot_x86 is None or row.reference_dot is not None, t
        assert not row.repack or row.x8 is not None, t
        assert row.x8 is None or row.block_size == 32 or row.repack, t  # tiles of 32-value blocks, or held
        assert row.x8_gemv is None or row.repack, t


def test_the_kernels_block_bytes_are_the_table_s() -> None:
    specs = {T.Q8_0: quant_loops.Q8_0_SPEC, T.Q4_0: quant_loops.Q4_0_SPEC, T.Q4_1: quant_loops.Q4_1_SPEC,
             T.Q5_0: quant_loops.Q5_0_SPEC, T.IQ4_NL: quant_loops.IQ4_NL_SPEC, T.MXFP4: quant_loops.MXFP4_SPEC,
             T.Q4_K: kquant_loops.Q4_K_SPEC, T.Q6_K: kquant_loops.Q6_K_SPEC}
    for t, spec in specs.items():
        assert spec["block_bytes"] == tt.CPU_TYPE_TRAITS[t].block_bytes, t
    for name, spec in kquant_tiles.TILED_SPECS.items():
        assert spec.block_bytes == tt.CPU_TYPE_TRAITS[T[name]].block_bytes, name
    for t, (_, block_bytes) in repack.BLOCK32_FIELDS.items():
        assert block_bytes == tt.CPU_TYPE_TRAITS[t].block_bytes, t


def test_the_derived_lists_match_the_rows() -> None:
    rows = tt.CPU_TYPE_TRAITS
    assert set(tt.MUL_MAT_TYPES) == {t for t, r in rows.items() if r.vec_dot_type is not None}
    assert set(tt.QUANT_MUL_MAT_TYPES) == {t for t in tt.MUL_MAT_TYPES if TYPE_TRAITS[t].is_quantized}
    assert tt.COLS_KINDS == {int(t) for t, r in rows.items() if r.cols is not None}
    assert tt.X8_KINDS == {int(t): X8_REPACKED + int(t) for t, r in rows.items() if r.repack}
    assert tt.X8_TILE_KINDS == {int(t): X8_TILE + int(t) for t, r in rows.items()
                                if r.x8 is not None and t in tiles_x8.TILE_TYPES}
    assert tt.X8_GEMV_KINDS == {int(t): X8_GEMV + int(t) for t, r in rows.items() if r.x8_gemv is not None}
    assert tt.TILED_KINDS == {int(t): TILED + int(t) for t, r in rows.items() if r.tiled is not None}
    assert set(repack.LAYOUTS) == {t for t, r in rows.items() if r.repack}  # every held layout has its loop
    assert tt.QUANTIZED_SRC1_TYPES == {T.Q8_0, T.Q8_1, T.Q8_K}
    assert tt.QUANTIZED_SRC1_TYPES <= set(rows)  # src1's types convert back too
    assert tt.ROUNDED_SRC1_TYPES == {T.F16, T.BF16}


def test_the_backend_s_type_lists_are_the_table_s() -> None:
    assert matmul_id.MUL_MAT_TYPES is tt.MUL_MAT_TYPES and matmul.COLS_KINDS is tt.COLS_KINDS
    assert matmul.X8_KINDS is tt.X8_KINDS and matmul.X8_TILE_KINDS is tt.X8_TILE_KINDS
    assert set(op_check.QUANT_TYPES) == set(tt.QUANT_MUL_MAT_TYPES)  # the op tests' quantized types
    for t in GGMLType:
        assert _common.is_convertible(t) == (t in tt.CPU_TYPE_TRAITS), t
        if TYPE_TRAITS[t].is_quantized:  # what the CPU converts, the core converts too
            assert (t in tt.CPU_TYPE_TRAITS) == is_implemented(t), t
            assert _common.is_writable(t) == (t in tt.CPU_TYPE_TRAITS and t in FROM_FLOAT_TYPES), t


@pytest.mark.parametrize("rounding", [quantize_src1.ROUND_REF, quantize_src1.ROUND_X86])
def test_the_dispatch_has_a_kernel_for_every_kind(rounding: int) -> None:
    """mul_mat_range's choice (made while numba types a job) gives a loop for each weight type and x8 kind,
    and refuses a type without a vec_dot; to_float's for every row."""
    args = [types.none] * 14
    kinds = [*map(int, tt.MUL_MAT_TYPES), *tt.X8_KINDS.values(), *tt.X8_TILE_KINDS.values(),
             *tt.X8_GEMV_KINDS.values(), *tt.TILED_KINDS.values()]
    for kind in kinds:
        impl = mul_mat_job._mul_mat_range(types.IntegerLiteral(kind), *args, types.IntegerLiteral(rounding))
        assert callable(impl), kind
    for t, row in tt.CPU_TYPE_TRAITS.items():
        if row.vec_dot_type is None:
            with pytest.raises(Exception, match="has no vec_dot"):
                mul_mat_job._mul_mat_range(types.IntegerLiteral(int(t)), *args, types.IntegerLiteral(rounding))
        assert callable(to_float._dequantize_row(types.IntegerLiteral(int(t)), *[types.none] * 5)), t


def _nodes(ctx: Context, t: GGMLType) -> dict[str, Tensor]:
    """A MUL_MAT, MUL_MAT_ID, GET_ROWS and CPYs to and from F32 of a tensor of type t."""
    w = ctx.new_tensor(t, [K, 8])
    x = ctx.new_tensor(T.F32, [K, 2])
    experts = ctx.new_tensor(t, [K, 8, 2])
    ids = ctx.new_tensor(T.I32, [1, 2])
    return {"MUL_MAT": ctx.mul_mat(w, x),
            "MUL_MAT_ID": ctx.mul_mat_id(experts, ctx.new_tensor(T.F32, [K, 1, 2]), ids),
            "GET_ROWS": ctx.get_rows(w, ctx.new_tensor(T.I32, [3])),
            "CPY to": ctx.cpy(ctx.new_tensor(T.F32, [K, 8]), ctx.new_tensor(t, [K, 8])),
            "CPY from": ctx.cpy(w, ctx.new_tensor(T.F32, [K, 8]))}


def test_supports_op_answers_from_the_table() -> None:
    """For every ggml type: the CPU device takes MUL_MAT and MUL_MAT_ID of the table's weight types, GET_ROWS and
    CPY from the types it converts, CPY to those it writes (ggml's CPU: not the lattice IQ types), besides the plain
    integer types, which GET_ROWS and CPY copy as they are."""
    backend = cpu_init()
    plain_ints = {T.I8, T.I16, T.I32, T.I64, T.F64}
    for t in GGMLType:
        if TYPE_TRAITS[t].blck_size == 0 or K % TYPE_TRAITS[t].blck_size:
            continue  # no tensor of this id can be made (removed ids)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        answers = {op: backend.supports_op(node) for op, node in _nodes(ctx, t).items()}
        want_mm = t in tt.MUL_MAT_TYPES
        assert answers["MUL_MAT"] == want_mm and answers["MUL_MAT_ID"] == want_mm, (t, answers)
        if t not in plain_ints:
            want = t in tt.CPU_TYPE_TRAITS
            assert answers["GET_ROWS"] == want and answers["CPY from"] == want, (t, answers)
            assert answers["CPY to"] == (want and tt.CPU_TYPE_TRAITS[t].from_float), (t, answers)


@pytest.mark.parametrize("t", list(tt.CPU_TYPE_TRAITS), ids=lambda t: t.name)
def test_the_cpu_dequantizer_gives_the_core_s_bits(t: GGMLType) -> None:
    """to_f32 (the table's to_float, compiled) against the core's numpy to_float, both ggml's arithmetic: rows
    of whole blocks, 3-D, bit for bit."""
    rng = np.random.default_rng(int(t))
    if t in FROM_FLOAT_TYPES:
        raw = core_types.from_float(t, (rng.standard_normal((2, 3, 512)) * 4).astype(np.float32))
    else:
        raw = random_blocks(t, (2, 3, 512), rng)
    got = to_float.to_f32(t, raw)
    assert got.shape == (2, 3, 512)
    np.testing.assert_array_equal(got.view(np.uint32), core_types.to_float(t, raw).view(np.uint32))


def test_the_cpu_dequantizer_refuses_what_it_cannot_read() -> None:
    with pytest.raises(UnsupportedTypeError, match="I32"):
        to_float.to_f32(T.I32, np.zeros(4, np.uint8))
    with pytest.raises(ShapeError, match="35 bytes .* 34-byte blocks of Q8_0"):
        to_float.to_f32(T.Q8_0, np.zeros(35, np.uint8))


def test_the_cpu_multiplies_by_every_quantized_weight_type() -> None:
    from pyggml.backends.cpu.kernels.vec_dot.type_table import QUANT_MUL_MAT_TYPES
    from pyggml.core.types import QUANT_WEIGHT_TYPES

    assert QUANT_MUL_MAT_TYPES == QUANT_WEIGHT_TYPES
