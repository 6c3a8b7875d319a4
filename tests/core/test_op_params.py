"""pyggml.core.ops.params: one layout per op, words as today's ggml.c writes them."""

from __future__ import annotations

import struct

import pytest

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import (
    OP_PARAMS,
    CustomParams,
    PadParams,
    RopeParams,
    UnaryParams,
    UpscaleParams,
    ViewParams,
    op_params_of,
)
from pyggml.core.tensor import GGMLOp, ScaleFlag, ScaleMode, Tensor, UnaryOp
from pyggml.core.types import GGMLType


def f32(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.fixture
def node() -> Tensor:
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    return ctx.new_tensor_1d(GGMLType.F32, 4).set_name("n")


def test_every_layout_fits_and_names_its_ops() -> None:
    for op, cls in OP_PARAMS.items():
        assert op in cls.ops
    assert OP_PARAMS[GGMLOp.SET] is OP_PARAMS[GGMLOp.ACC]
    assert GGMLOp.ADD not in OP_PARAMS  # no words


def test_rope_words_are_ggml_rope_impls(node: Tensor) -> None:
    p = RopeParams(n_dims=64, mode=8, n_ctx_orig=4096, freq_base=1e6, freq_scale=0.5, ext_factor=1.0,
                   attn_factor=0.75, beta_fast=32.0, beta_slow=1.0, sections=(8, 12, 12, 0), n_offs=2)
    node.op = GGMLOp.ROPE
    p.store(node)
    assert [int(w) for w in node.op_params] == [0, 64, 8, 0, 4096, f32(1e6), f32(0.5), f32(1.0), f32(0.75), f32(32.0),
                                                f32(1.0), 8, 12, 12, 0, 2]
    assert RopeParams.of(node) == p
    assert op_params_of(node) == p


def test_two_word_and_flag_fields(node: Tensor) -> None:
    node.op = GGMLOp.VIEW
    ViewParams(offset=(1 << 33) + 5).store(node)
    assert [int(w) for w in node.op_params[:3]] == [5, 2, 0]
    assert ViewParams.of(node).offset == (1 << 33) + 5
    node.op = GGMLOp.CUSTOM
    CustomParams(n_tasks=-1).store(node)
    assert [int(w) for w in node.op_params[:6]] == [0, 0, -1, 0, 0, 0]  # {fun, n_tasks, userdata}
    node.op = GGMLOp.PAD
    PadParams(lp0=1, rp3=2, circular=True).store(node)
    assert [int(w) for w in node.op_params[:10]] == [1, 0, 0, 0, 0, 0, 0, 2, 1, 0]
    up = UpscaleParams(mode=ScaleMode.BILINEAR | ScaleFlag.ALIGN_CORNERS)
    assert (up.scale_mode, up.flags, up.known) == (ScaleMode.BILINEAR, ScaleFlag.ALIGN_CORNERS, True)
    assert not UpscaleParams(mode=3).known and not UpscaleParams(mode=1 << 12).known


def test_an_enum_word_that_is_no_member_is_named(node: Tensor) -> None:
    node.op = GGMLOp.UNARY
    UnaryParams(op=UnaryOp.SILU).store(node)
    assert UnaryParams.of(node).op == UnaryOp.SILU == 10
    node.op_params[0] = 22
    with pytest.raises(ArgumentError, match=r"'n' \(UNARY\): op param 0 \(op\) = 22 is not a UnaryOp"):
        UnaryParams.of(node)


def test_set_op_refuses_a_layout_of_another_op(node: Tensor) -> None:
    from pyggml.core.ops._build import set_op

    with pytest.raises(TypeError, match="RopeParams is not the op_params layout of SCALE"):
        set_op(node, GGMLOp.SCALE, node, params=RopeParams(n_dims=2, mode=0))


def test_mul_mat_hint_is_word_1_as_ggml_mul_mat_set_hint() -> None:
    """ggml.c's ggml_mul_mat_set_hint writes op_params[1] of a MUL_MAT and nothing else; a node of another op or a
    hint that is no GGML_HINT_ is refused before any word changes."""
    from pyggml.capi import ggml_mul_mat_set_hint
    from pyggml.core.ops.matmul import mul_mat_set_hint
    from pyggml.core.ops.params import MulMatParams
    from pyggml.core.tensor import OpHint

    ctx = Context(mem_size=1 << 16, no_alloc=True)
    a, b = ctx.new_tensor_2d(GGMLType.F32, 4, 4), ctx.new_tensor_2d(GGMLType.F32, 4, 3)
    node = ctx.mul_mat(a, b)
    assert op_params_of(node) == MulMatParams()
    mul_mat_set_hint(node, OpHint.SRC0_IS_HADAMARD)
    assert [int(w) for w in node.op_params[:3]] == [0, 1, 0]
    assert MulMatParams.of(node).hint is OpHint.SRC0_IS_HADAMARD
    ggml_mul_mat_set_hint(node, 0)
    assert not node.op_params.any()
    with pytest.raises(ArgumentError, match=r"mul_mat_set_hint: argument 'hint' = 2 is not a OpHint"):
        mul_mat_set_hint(node, 2)
    with pytest.raises(ShapeError, match="mul_mat_set_hint: a must be a MUL_MAT node"):
        mul_mat_set_hint(ctx.add(a, a), OpHint.SRC0_IS_HADAMARD)
    assert not node.op_params.any()
