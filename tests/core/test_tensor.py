"""Tensor fields and helpers: strides, quantized row padding, views, layout predicates, op_params, names."""

from __future__ import annotations

import struct

import pytest

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, OutOfBoundsError, ShapeError
from pyggml.core.tensor import GGML_MAX_NAME, GGMLOp, are_same_layout, are_same_shape, can_repeat
from pyggml.core.types import GGMLType

F32, F16, Q4_0, Q4_K, Q8_0, I32 = GGMLType.F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.I32


def f32_word(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


# --- strides and sizes ---


def test_contiguous_strides_and_sizes(ctx: Context) -> None:
    t = ctx.new_tensor_4d(F32, 5, 4, 3, 2)
    assert t.ne == [5, 4, 3, 2]
    assert t.nb == [4, 20, 80, 240]
    assert t.nelements() == 120
    assert t.nrows() == 24
    assert t.nbytes() == 480
    assert t.row_size() == 20
    t16 = ctx.new_tensor_2d(F16, 6, 7)
    assert t16.nb == [2, 12, 84, 84]
    assert t16.nbytes() == 84


def test_missing_dimensions_are_one(ctx: Context) -> None:
    assert ctx.new_tensor_1d(F32, 7).ne == [7, 1, 1, 1]
    assert ctx.new_tensor_3d(I32, 2, 3, 4).ne == [2, 3, 4, 1]


def test_quantized_rows_are_whole_blocks(ctx: Context) -> None:
    # Q4_0: 32 elements in an 18-byte block
    t = ctx.new_tensor_2d(Q4_0, 64, 3)
    assert t.nb == [18, 36, 108, 108]
    assert t.nbytes() == 108
    assert t.row_size() == 36
    # Q4_K: 256 elements in a 144-byte super-block
    k = ctx.new_tensor_3d(Q4_K, 512, 2, 2)
    assert k.nb == [144, 288, 576, 1152]
    assert k.nbytes() == 1152
    # Q8_0: 32 elements in 34 bytes
    assert ctx.new_tensor_1d(Q8_0, 96).nbytes() == 3 * 34


def test_quantized_row_not_a_whole_block_raises(ctx: Context) -> None:
    with pytest.raises(ShapeError, match=r"ne\[0\]=48 .* q4_0 block size 32"):
        ctx.new_tensor_2d(Q4_0, 48, 2)


def test_nbytes_of_a_view_with_gaps(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 8, 6)
    v = ctx.view_2d(a, 3, 4, a.nb[1], 0)  # 3 of 8 columns, 4 rows
    # first to one past the last element: 3 rows of stride 32 plus 3 elements
    assert v.nbytes() == 3 * 32 + 3 * 4
    t = ctx.transpose(a)
    assert t.nbytes() == a.nbytes()


def test_n_dims(ctx: Context) -> None:
    assert ctx.new_tensor_1d(F32, 4).n_dims() == 1
    assert ctx.new_tensor_1d(F32, 1).n_dims() == 1
    assert ctx.new_tensor_4d(F32, 4, 1, 3, 1).n_dims() == 3
    assert ctx.new_tensor_4d(F32, 1, 1, 1, 2).n_dims() == 4


# --- views ---


def test_view_2d_fields(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 8, 6).set_name("a")
    v = ctx.view_2d(a, 4, 3, 2 * a.nb[1], a.nb[1] + 8)  # every other row, from row 1 column 2
    assert v.op == GGMLOp.VIEW
    assert v.src[0] is a
    assert v.view_src is a
    assert v.view_offs == 40
    assert v.ne == [4, 3, 1, 1]
    assert v.nb == [4, 64, 192, 192]
    assert [v.get_op_params_i32(0), v.get_op_params_i32(1)] == [40, 0]  # size_t offset as two words
    assert v.name == "a (view)"
    assert not v.is_contiguous()


def test_view_3d_and_4d_strides(ctx: Context) -> None:
    a = ctx.new_tensor_1d(F32, 240)
    v3 = ctx.view_3d(a, 2, 3, 4, 16, 64, 8)
    assert v3.ne == [2, 3, 4, 1]
    assert v3.nb == [4, 16, 64, 256]
    v4 = ctx.view_4d(a, 2, 3, 2, 2, 12, 36, 100, 4)
    assert v4.ne == [2, 3, 2, 2]
    assert v4.nb == [4, 12, 36, 100]
    assert v4.view_offs == 4


def test_views_of_views_fold_to_the_root(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 8, 6)
    v1 = ctx.view_2d(a, 4, 3, a.nb[1], 8)
    v2 = ctx.view_1d(v1, 2, 36)
    assert v2.src[0] is v1  # the op's source is the view it was made from
    assert v2.view_src is a  # the memory is the root's
    assert v2.view_offs == 44
    v3 = ctx.reshape_1d(ctx.cont(v2), 2)
    assert v3.view_src is v3.src[0]  # a reshape of a fresh tensor is a view of that tensor
    p = ctx.permute(ctx.view_1d(v2, 1, 4), 1, 0, 2, 3)
    assert p.view_src is a
    assert p.view_offs == 48


def test_view_tensor_keeps_strides(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 3, 4)
    t = ctx.transpose(a)
    v = ctx.view_tensor(t)
    assert v.op == GGMLOp.NONE
    assert v.view_src is a
    assert v.ne == t.ne and v.nb == t.nb


def test_view_outside_its_source_raises(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 4, 3).set_name("a")
    with pytest.raises(OutOfBoundsError, match=r"view_1d: view of 16 bytes at offset 40 is outside 'a' \(48 bytes\)"):
        ctx.view_1d(a, 4, 40)


def test_view_data_follows_the_root(ctx: Context) -> None:
    actx = Context(mem_size=1 << 16)
    a = actx.new_tensor_2d(F32, 8, 6)
    v = actx.view_1d(actx.view_2d(a, 4, 3, a.nb[1], 8), 2, 36)
    assert a.data is not None
    assert v.data == a.data + 44


# --- permute and transpose ---


def test_transpose_swaps_ne_and_nb(ctx: Context) -> None:
    a = ctx.new_tensor_3d(F32, 4, 3, 2).set_name("a")
    t = ctx.transpose(a)
    assert t.op == GGMLOp.TRANSPOSE and t.src[0] is a and t.view_src is a
    assert t.ne == [3, 4, 2, 1]
    assert t.nb == [16, 4, 48, 96]
    assert t.is_transposed() and t.is_permuted() and not t.is_contiguous()
    assert t.name == "a (transposed)"


def test_permute_moves_dimension_i_to_axis_i(ctx: Context) -> None:
    a = ctx.new_tensor_4d(F32, 2, 3, 4, 5)
    assert a.nb == [4, 8, 24, 96]
    p = ctx.permute(a, 2, 0, 1, 3)
    # dim 0 (2) goes to axis 2, dim 1 (3) to axis 0, dim 2 (4) to axis 1
    assert p.ne == [3, 4, 2, 5]
    assert p.nb == [8, 24, 4, 96]
    assert list(p.op_params[:4]) == [2, 0, 1, 3]
    assert p.op == GGMLOp.PERMUTE
    assert p.is_permuted()  # nb[1] 24 > nb[2] 4
    assert not p.is_transposed()  # nb[0] 8 < nb[1] 24
    q = ctx.permute(a, 0, 2, 1, 3)
    assert q.ne == [2, 4, 3, 5] and q.nb == [4, 24, 8, 96]
    assert q.is_permuted() and not q.is_transposed()


def test_permute_identity_stays_contiguous(ctx: Context) -> None:
    a = ctx.new_tensor_4d(F32, 2, 3, 4, 5)
    p = ctx.permute(a, 0, 1, 2, 3)
    assert p.is_contiguous() and not p.is_permuted()


# --- predicates ---


def test_is_contiguous_cases(ctx: Context) -> None:
    a = ctx.new_tensor_3d(F32, 4, 3, 2)
    assert a.is_contiguous()
    assert not ctx.view_2d(a, 2, 3, a.nb[1], 0).is_contiguous()  # rows cut short
    assert ctx.view_2d(a, 4, 3, a.nb[1], a.nb[2]).is_contiguous()  # a whole plane
    assert ctx.new_tensor_2d(Q4_0, 64, 2).is_contiguous()


def test_is_transposed_and_is_permuted(ctx: Context) -> None:
    a = ctx.new_tensor_4d(F32, 4, 3, 2, 2)
    assert not a.is_transposed() and not a.is_permuted()
    p = ctx.permute(a, 0, 1, 3, 2)  # swaps dims 2 and 3 only
    assert not p.is_transposed() and p.is_permuted()


def test_same_shape_same_layout(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 4, 4)
    b = ctx.new_tensor_2d(F32, 4, 4)
    t = ctx.transpose(a)
    h = ctx.new_tensor_2d(F16, 4, 4)
    assert are_same_shape(a, t) and not are_same_layout(a, t)
    assert are_same_layout(a, b)
    assert are_same_shape(a, h) and not are_same_layout(a, h)


def test_can_repeat(ctx: Context) -> None:
    row = ctx.new_tensor_2d(F32, 4, 1)
    m = ctx.new_tensor_3d(F32, 4, 6, 2)
    assert can_repeat(row, m)
    assert not can_repeat(m, row)
    assert can_repeat(ctx.new_tensor_3d(F32, 2, 3, 1), ctx.new_tensor_3d(F32, 4, 6, 2))
    assert not can_repeat(ctx.new_tensor_2d(F32, 3, 1), ctx.new_tensor_2d(F32, 4, 1))
    assert can_repeat(ctx.new_tensor_1d(F32, 1), m)  # a scalar repeats to anything


def test_scalar_vector_matrix(ctx: Context) -> None:
    assert ctx.new_tensor_1d(F32, 1).is_scalar()
    v = ctx.new_tensor_1d(F32, 5)
    assert v.is_vector() and v.is_matrix() and not v.is_scalar()
    m = ctx.new_tensor_2d(F32, 5, 2)
    assert m.is_matrix() and not m.is_vector()
    assert not ctx.new_tensor_3d(F32, 5, 2, 2).is_matrix()


# --- op_params, flags, names ---


def test_op_params_words(ctx: Context) -> None:
    t = ctx.new_tensor_1d(F32, 1)
    t.set_op_params([3, -2, 2.5, 1.0])
    assert list(t.op_params[:5]) == [3, -2, f32_word(2.5), f32_word(1.0), 0]
    assert t.get_op_params_i32(1) == -2
    assert t.get_op_params_f32(2) == 2.5
    t.set_op_params_f32(0, -0.5)
    assert t.get_op_params_i32(0) == f32_word(-0.5)
    t.set_op_params_i32(3, 7)
    assert t.get_op_params_i32(3) == 7
    t.set_op_params([1])
    assert list(t.op_params) == [1] + [0] * 15  # setting params clears the rest


def test_too_many_op_params_raise(ctx: Context) -> None:
    t = ctx.new_tensor_1d(F32, 1).set_name("t")
    with pytest.raises(ArgumentError, match="17 op params for 't', at most 16"):
        t.set_op_params(list(range(17)))


def test_flags(ctx: Context) -> None:
    t = ctx.new_tensor_1d(F32, 1)
    assert not t.is_param
    t.set_input().set_output()
    assert not t.is_param
    t.set_param()
    assert t.is_param


def test_names(ctx: Context) -> None:
    t = ctx.new_tensor_1d(F32, 1)
    assert t.get_name() == ""
    t.format_name("blk.%d.%s", 3, "attn_q")
    assert t.name == "blk.3.attn_q"
    t.set_name("x" * 100)
    assert t.name == "x" * (GGML_MAX_NAME - 1)
    assert "blk" not in repr(t) and "F32" in repr(t)
