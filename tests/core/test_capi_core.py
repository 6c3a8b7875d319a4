"""pyggml.capi's ggml.h names: each a thin call into the classes, with C's argument order."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType

import pyggml.capi as capi
from pyggml.capi import (
    GGML_DEFAULT_GRAPH_SIZE,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_MAX_OP_PARAMS,
    GGML_MAX_SRC,
    GGML_OP_ADD,
    GGML_OP_COUNT,
    GGML_OP_MUL_MAT,
    GGML_OP_NONE,
    GGML_OP_POOL_AVG,
    GGML_OP_ROPE,
    GGML_OP_UNARY,
    GGML_SORT_ORDER_DESC,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    GGML_TYPE_Q4_0,
    GGML_TYPE_Q8_0,
    GGML_UNARY_OP_GELU,
    GGML_UNARY_OP_SILU,
    ggml_build_forward_expand,
    ggml_format_name,
    ggml_get_name,
    ggml_get_tensor,
    ggml_graph_cpy,
    ggml_graph_dump_dot,
    ggml_graph_overhead,
    ggml_graph_print,
    ggml_graph_view,
    ggml_init,
    ggml_init_params,
    ggml_mul_mat,
    ggml_nbytes,
    ggml_new_graph,
    ggml_new_graph_custom,
    ggml_new_tensor,
    ggml_new_tensor_1d,
    ggml_new_tensor_2d,
    ggml_new_tensor_3d,
    ggml_new_tensor_4d,
    ggml_set_name,
    ggml_tensor_overhead,
)
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, ContextFullError
from pyggml.core.tensor import GGMLOp, GLUOp, Tensor, UnaryOp
from pyggml.core.types import GGMLType

# ggml.h's numbers (llama.cpp 0c1e570), written out here so that the test compares pyggml's enums with ggml's and
# not with themselves (tests/core/test_enums_ggml_h.py reads them from the header itself). `enum ggml_op` by
# position:
GGML_H_OPS = (
    "NONE", "DUP", "ADD", "ADD_ID", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SUM",
    "SUM_ROWS", "CUMSUM", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CONCAT", "SILU_BACK", "NORM",
    "RMS_NORM", "RMS_NORM_BACK", "GROUP_NORM", "L2_NORM", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "SCALE", "SET", "CPY",
    "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "GET_ROWS_BACK", "SET_ROWS", "DIAG",
    "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX", "SOFT_MAX_BACK", "ROPE", "ROPE_BACK", "CLAMP",
    "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK", "IM2COL_3D", "COL2IM_1D", "CONV_2D", "CONV_3D", "CONV_2D_DW",
    "CONV_TRANSPOSE_2D", "POOL_1D", "POOL_2D", "POOL_2D_BACK", "UPSCALE", "PAD", "PAD_REFLECT_1D", "ROLL", "ARANGE",
    "TIMESTEP_EMBEDDING", "ARGSORT", "TOP_K", "LEAKY_RELU", "TRI", "FILL", "FLASH_ATTN_EXT", "FLASH_ATTN_BACK",
    "SSM_CONV", "SSM_SCAN", "WIN_PART", "WIN_UNPART", "GET_REL_POS", "ADD_REL_POS", "RWKV_WKV6", "GATED_LINEAR_ATTN",
    "RWKV_WKV7", "SOLVE_TRI", "GATED_DELTA_NET", "LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST",
    "UNARY", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK",
    "OPT_STEP_ADAMW", "OPT_STEP_SGD", "GLU",
)
# `enum ggml_unary_op` and `enum ggml_glu_op` by position
GGML_H_UNARY_OPS = (
    "ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK", "SILU", "HARDSWISH",
    "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU", "FLOOR", "CEIL", "ROUND", "TRUNC",
)
GGML_H_GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_CLAMP")
# `enum ggml_type` (GGUF files store these numbers; the holes are types ggml removed)
GGML_H_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
    "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28,
    "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41, "Q2_0": 42,
}


def test_constants() -> None:
    assert GGML_MAX_DIMS == 4
    assert GGML_MAX_SRC == 10
    assert GGML_MAX_NAME == 64
    assert GGML_MAX_OP_PARAMS == 64
    assert GGML_DEFAULT_GRAPH_SIZE == 2048
    assert capi.GGML_MEM_ALIGN == 16
    assert GGML_TYPE_F32 == 0 and GGML_TYPE_F16 == 1 and GGML_TYPE_Q4_0 == 2 and GGML_TYPE_Q8_0 == 8
    assert GGML_TYPE_I32 == 26  # the gguf package's numbering
    assert GGML_OP_NONE == 0 and GGML_OP_ADD == 2 and GGML_OP_MUL_MAT == 29 and GGML_OP_ROPE == 48
    assert GGML_OP_UNARY == 91 and GGML_OP_COUNT == 101
    assert GGML_UNARY_OP_GELU == 8 and GGML_UNARY_OP_SILU == 10 and capi.GGML_UNARY_OP_COUNT == 22
    assert capi.GGML_GLU_OP_SWIGLU == 2 and capi.GGML_GLU_OP_COUNT == 7
    assert GGML_SORT_ORDER_DESC == 1 and GGML_OP_POOL_AVG == 1
    assert (capi.GGML_SORT_ORDER_ASC, capi.GGML_OP_POOL_MAX, capi.GGML_OP_POOL_COUNT) == (0, 0, 2)
    assert (capi.GGML_ROPE_TYPE_NORMAL, capi.GGML_ROPE_TYPE_NEOX, capi.GGML_ROPE_TYPE_MROPE,
            capi.GGML_ROPE_TYPE_VISION, capi.GGML_ROPE_TYPE_IMROPE, capi.GGML_MROPE_SECTIONS) == (0, 2, 8, 24, 40, 4)
    assert (capi.GGML_TENSOR_FLAG_INPUT, capi.GGML_TENSOR_FLAG_OUTPUT, capi.GGML_TENSOR_FLAG_PARAM,
            capi.GGML_TENSOR_FLAG_LOSS, capi.GGML_TENSOR_FLAG_COMPUTE) == (1, 2, 4, 8, 16)
    assert (capi.GGML_PREC_DEFAULT, capi.GGML_PREC_F32, capi.GGML_SCALE_MODE_BICUBIC,
            capi.GGML_SCALE_FLAG_ALIGN_CORNERS, capi.GGML_TRI_TYPE_LOWER) == (0, 10, 2, 256, 3)
    assert capi.GGML_N_TASKS_MAX == -1


def test_enums_have_ggml_h_numbers() -> None:
    """Every op, unary op, GLU op and type: its capi constant and its enum member carry ggml.h's number."""
    assert len(GGML_H_OPS) == GGML_OP_COUNT == 101
    for number, name in enumerate(GGML_H_OPS):
        assert getattr(capi, f"GGML_OP_{name}") == number, name
        assert GGMLOp[name] == number, name
    assert [op.name for op in GGMLOp] == list(GGML_H_OPS)  # no op beyond ggml.h's list
    for table, enum, prefix in ((GGML_H_UNARY_OPS, UnaryOp, "GGML_UNARY_OP_"), (GGML_H_GLU_OPS, GLUOp, "GGML_GLU_OP_")):
        for number, name in enumerate(table):
            assert getattr(capi, prefix + name) == number, name
            assert enum[name] == number, name
        assert [u.name for u in enum] == list(table)
    for t in GGMLType:  # the types pyggml has carry their ggml.h number
        assert GGML_H_TYPES[t.name] == t, t.name
        assert getattr(capi, f"GGML_TYPE_{t.name}") == t, t.name
        if t.name in GGMLQuantizationType.__members__:  # the gguf package agrees (where it knows the type)
            assert GGMLQuantizationType[t.name] == t, t.name


def test_ggml_init_forms() -> None:
    c1 = ggml_init(ggml_init_params(mem_size=4096, mem_buffer=None, no_alloc=True))
    c2 = ggml_init({"mem_size": 4096, "no_alloc": True})
    c3 = ggml_init(mem_size=4096, no_alloc=True)
    c4 = ggml_init(4096, None, True)
    for c in (c1, c2, c3, c4):
        assert isinstance(c, Context)
        assert capi.ggml_get_mem_size(c) == 4096
        assert capi.ggml_get_no_alloc(c)
    c5 = ggml_init(mem_size=4096)
    assert not c5.no_alloc
    assert ggml_new_tensor_1d(c5, GGML_TYPE_F32, 4).data is not None
    buf = np.zeros(8192, np.uint8)
    c6 = ggml_init(ggml_init_params(mem_size=8192, mem_buffer=buf))
    t = ggml_new_tensor_1d(c6, GGML_TYPE_F32, 2)
    assert buf.__array_interface__["data"][0] <= t.data < buf.__array_interface__["data"][0] + 8192
    with pytest.raises(ArgumentError, match=r"unknown params \['mem'\]"):
        ggml_init({"mem": 4096})
    capi.ggml_free(c5)
    capi.ggml_free(None)


def test_ported_c_code_reads_the_same() -> None:
    # from ggml's simple example: two matrices, their product, a graph
    ctx = ggml_init(ggml_init_params(mem_size=3 * ggml_tensor_overhead() + ggml_graph_overhead(), no_alloc=True))
    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2, 4)
    b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2, 3)
    ggml_set_name(a, "a")
    ggml_format_name(b, "%s_%d", "b", 0)
    result = ggml_mul_mat(ctx, a, b)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, result)
    assert result.ne == [4, 3, 1, 1]
    assert gf.nodes == [result] and gf.leafs == [a, b]
    assert ggml_get_name(b) == "b_0"
    assert ggml_get_tensor(ctx, "a") is a
    assert capi.ggml_graph_get_tensor(gf, "node_0") is result
    assert capi.ggml_graph_n_nodes(gf) == 1 and capi.ggml_graph_node(gf, -1) is result
    with pytest.raises(ContextFullError):  # exactly the room for 3 tensors and one graph
        ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)


def test_tensor_creation_and_sizes() -> None:
    ctx = ggml_init(mem_size=1 << 16, no_alloc=True)
    t = ggml_new_tensor(ctx, GGML_TYPE_F32, 3, [4, 3, 2, 99])  # only n_dims of ne are read
    assert t.ne == [4, 3, 2, 1]
    with pytest.raises(ArgumentError, match="n_dims=5"):
        ggml_new_tensor(ctx, GGML_TYPE_F32, 5, [1, 1, 1, 1, 1])
    q = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 64, 2)
    assert ggml_nbytes(q) == 72
    assert capi.ggml_nbytes_pad(q) == 80
    assert capi.ggml_nrows(q) == 2 and capi.ggml_nelements(q) == 128
    assert capi.ggml_row_size(GGML_TYPE_Q4_0, 64) == 36
    assert capi.ggml_row_size(GGML_TYPE_F16, 7) == 14
    with pytest.raises(ArgumentError, match="40 elements are not a whole number of q4_0 blocks of 32"):
        capi.ggml_row_size(GGML_TYPE_Q4_0, 40)
    assert capi.ggml_type_size(GGML_TYPE_Q8_0) == 34 and capi.ggml_blck_size(GGML_TYPE_Q8_0) == 32
    assert capi.ggml_type_sizef(GGML_TYPE_Q8_0) == 34 / 32
    assert capi.ggml_type_name(GGML_TYPE_Q4_0) == "q4_0" and capi.ggml_type_name(0) == "f32"
    assert capi.ggml_is_quantized(GGML_TYPE_Q4_0) and not capi.ggml_is_quantized(GGML_TYPE_F16)
    assert capi.ggml_element_size(q) == 18
    t4 = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 2, 3, 4, 5)
    assert capi.ggml_n_dims(t4) == 4 and capi.ggml_is_contiguous(t4)
    tr = capi.ggml_transpose(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2, 3, 4))
    assert capi.ggml_is_transposed(tr) and capi.ggml_is_permuted(tr) and not capi.ggml_is_contiguous(tr)
    s = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)
    assert capi.ggml_is_scalar(s) and capi.ggml_is_vector(s) and capi.ggml_is_matrix(s) and capi.ggml_is_3d(s)
    assert capi.ggml_can_repeat(s, t4) and not capi.ggml_can_repeat(t4, s)
    assert capi.ggml_are_same_shape(t4, capi.ggml_dup_tensor(ctx, t4))
    assert not capi.ggml_are_same_layout(tr, capi.ggml_dup_tensor(ctx, tr))
    v = capi.ggml_view_tensor(ctx, t4)
    assert v.view_src is t4
    assert capi.ggml_get_first_tensor(ctx) is t
    assert capi.ggml_get_next_tensor(ctx, t) is q
    assert capi.ggml_used_mem(ctx) == len(ctx.tensors) * ggml_tensor_overhead()


def test_names_flags_and_op_params() -> None:
    ctx = ggml_init(mem_size=1 << 20, no_alloc=True)
    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 2)
    r = capi.ggml_rms_norm(ctx, x, 1e-6)
    assert capi.ggml_get_op_params_f32(r, 0) == np.float32(1e-6)
    capi.ggml_set_op_params_i32(r, 1, 5)
    assert capi.ggml_get_op_params_i32(r, 1) == 5
    capi.ggml_set_op_params_f32(r, 2, 0.5)
    assert capi.ggml_get_op_params_f32(r, 2) == 0.5
    g = capi.ggml_gelu(ctx, x)
    assert capi.ggml_get_unary_op(g) == GGML_UNARY_OP_GELU
    assert capi.ggml_op_desc(g) == "GELU" and capi.ggml_op_desc(r) == "RMS_NORM"
    assert capi.ggml_op_name(GGML_OP_MUL_MAT) == "MUL_MAT" and capi.ggml_unary_op_name(10) == "SILU"
    w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 8)
    capi.ggml_set_param(ctx, w)
    capi.ggml_set_input(x)
    capi.ggml_set_output(r)
    assert x.flags & capi.GGML_TENSOR_FLAG_INPUT and r.flags & capi.GGML_TENSOR_FLAG_OUTPUT
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, ggml_mul_mat(ctx, w, x))
    assert gf.n_nodes == 2 and gf.nodes[0] is w  # a param is a node
    assert gf.leafs == [x]


def test_graph_functions(tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    ctx = ggml_init(mem_size=1 << 22, no_alloc=True)
    a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    x = capi.ggml_sqr(ctx, capi.ggml_neg(ctx, capi.ggml_relu(ctx, a)))
    gf = ggml_new_graph_custom(ctx, 16, False)
    assert gf.size == 16
    ggml_build_forward_expand(gf, x)
    gv = ggml_graph_view(ctx, gf, 1, 3)
    assert gv.nodes == gf.nodes[1:3] and gv.n_leafs == 0
    dst = ggml_new_graph(ctx)
    ggml_graph_cpy(gf, dst)
    assert dst.nodes == gf.nodes
    capi.ggml_graph_clear(dst)
    assert dst.n_nodes == 0
    assert capi.ggml_hash_size(4096) == 4099
    assert capi.ggml_graph_overhead_custom(16, False) < ggml_graph_overhead()
    path = f"{tmp_path}/gf.dot"
    ggml_graph_dump_dot(gf, None, path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("digraph G {") and text.count(" -> ") == 3
    with caplog.at_level(logging.INFO, logger="pyggml.graph"):
        ggml_graph_print(gf)
    assert "n_nodes = 3" in caplog.text and "n_leafs = 1" in caplog.text


# --- every ggml_<op> is the builder, with C's argument order ---


def _fun(*args: object) -> None:
    pass


def _glu_rows_moe_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                                           tuple[object, ...]]]:
    """_op_cases of GLU, SET_ROWS, ADD_ID and MUL_MAT_ID."""
    f32 = GGMLType.F32
    g = ctx.new_tensor_3d(f32, 8, 6, 4)
    h = ctx.new_tensor_3d(f32, 8, 6, 4)
    cases: list[tuple[str, tuple[object, ...], Callable[..., Tensor], tuple[object, ...]]] = [
        ("ggml_glu", (g, 2, True), ops.glu, (g, 2, True)),
        ("ggml_glu_split", (g, h, 1), ops.glu_split, (g, h, 1)),
        ("ggml_swiglu_oai", (g, h, 1.702, 7.0), ops.swiglu_oai, (g, h, 1.702, 7.0)),
        ("ggml_swiglu_clamp", (g, h, 7.0), ops.swiglu_clamp, (g, h, 7.0)),
    ]
    for name in ("reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"):
        cases.append((f"ggml_{name}", (g,), getattr(ops, name), (g,)))
        cases.append((f"ggml_{name}_swapped", (g,), getattr(ops, f"{name}_swapped"), (g,)))
        cases.append((f"ggml_{name}_split", (g, h), getattr(ops, f"{name}_split"), (g, h)))
    cache = ctx.new_tensor_3d(GGMLType.F16, 8, 10, 4)
    rows = ctx.new_tensor_1d(GGMLType.I64, 6)
    experts = ctx.new_tensor_3d(f32, 8, 5, 3)
    x = ctx.new_tensor_3d(f32, 8, 1, 4)
    ids = ctx.new_tensor_2d(GGMLType.I32, 6, 4)
    cases += [
        ("ggml_set_rows", (cache, g, rows), ops.set_rows, (cache, g, rows)),
        ("ggml_add_id", (g, ctx.new_tensor_2d(f32, 8, 3), ids), ops.add_id, None),
        ("ggml_mul_mat_id", (experts, x, ids), ops.mul_mat_id, (experts, x, ids)),
    ]
    return cases


def _op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor], tuple[object, ...]]]:
    """(capi name, its arguments after ctx, the builder, the builder's arguments after ctx)."""
    f32 = GGMLType.F32
    a = ctx.new_tensor_3d(f32, 8, 6, 4)
    b = ctx.new_tensor_3d(f32, 8, 1, 4)
    m = ctx.new_tensor_2d(f32, 8, 5)
    s = ctx.new_tensor_1d(f32, 1)
    pos = ctx.new_tensor_1d(GGMLType.I32, 4)
    pos4 = ctx.new_tensor_1d(GGMLType.I32, 16)  # multi-rope: 4 positions per token
    ff = ctx.new_tensor_1d(f32, 4)  # rope frequency factors
    mask = ctx.new_tensor_2d(f32, 8, 6)
    k2 = ctx.new_tensor_4d(GGMLType.F16, 3, 3, 4, 2)
    x2 = ctx.new_tensor_4d(f32, 8, 8, 4, 1)
    k1 = ctx.new_tensor_3d(GGMLType.F16, 3, 6, 2)
    k1t = ctx.new_tensor_3d(GGMLType.F16, 3, 2, 6)
    x1 = ctx.new_tensor_2d(f32, 10, 6)
    idx = ctx.new_tensor_2d(GGMLType.I32, 3, 4)
    cases: list[tuple[str, tuple[object, ...], Callable[..., Tensor], tuple[object, ...]]] = []
    for name in ["add", "sub", "mul", "div"]:
        cases.append((f"ggml_{name}", (a, b), getattr(ops, name), (a, b)))
        cases.append((f"ggml_{name}_inplace", (a, b), getattr(ops, f"{name}_inplace"), (a, b)))
    for name in ["dup", "dup_inplace", "cont", "transpose", "sqr", "sqr_inplace", "sqrt", "sqrt_inplace", "log",
                 "log_inplace", "sum", "sum_rows", "mean", "soft_max", "soft_max_inplace",
                 "abs", "abs_inplace", "sgn", "sgn_inplace", "neg", "neg_inplace", "step", "step_inplace", "tanh",
                 "tanh_inplace", "elu", "elu_inplace", "relu", "relu_inplace", "gelu", "gelu_inplace", "gelu_quick",
                 "gelu_quick_inplace", "silu", "silu_inplace", "hardswish", "hardswish_inplace", "hardsigmoid",
                 "hardsigmoid_inplace", "sigmoid", "sigmoid_inplace", "gelu_erf", "gelu_erf_inplace", "exp",
                 "exp_inplace", "expm1", "expm1_inplace", "softplus", "softplus_inplace", "floor", "floor_inplace",
                 "ceil", "ceil_inplace", "round", "round_inplace", "trunc", "trunc_inplace"]:
        cases.append((f"ggml_{name}", (a,), getattr(ops, name), (a,)))
    cases += [
        ("ggml_add1", (a, s), ops.add1, (a, s)),
        ("ggml_add1_inplace", (a, s), ops.add1_inplace, (a, s)),
        ("ggml_acc", (a, b, 32, 192, 768, 4), ops.acc, (a, b, 32, 192, 768, 4)),
        ("ggml_acc_inplace", (a, b, 32, 192, 768, 4), ops.acc_inplace, (a, b, 32, 192, 768, 4)),
        ("ggml_set", (a, b, 32, 192, 768, 4), ops.set, (a, b, 32, 192, 768, 4)),
        ("ggml_set_inplace", (a, b, 32, 192, 768, 4), ops.set_inplace, (a, b, 32, 192, 768, 4)),
        ("ggml_set_1d", (a, s, 8), ops.set_1d, (a, s, 8)),
        ("ggml_set_1d_inplace", (a, s, 8), ops.set_1d_inplace, (a, s, 8)),
        ("ggml_set_2d", (a, b, 64, 8), ops.set_2d, (a, b, 64, 8)),
        ("ggml_set_2d_inplace", (a, b, 64, 8), ops.set_2d_inplace, (a, b, 64, 8)),
        ("ggml_scale", (a, 0.5), ops.scale, (a, 0.5)),
        ("ggml_scale_inplace", (a, 0.5), ops.scale_inplace, (a, 0.5)),
        ("ggml_scale_bias", (a, 0.5, 1.5), ops.scale_bias, (a, 0.5, 1.5)),
        ("ggml_scale_bias_inplace", (a, 0.5, 1.5), ops.scale_bias_inplace, (a, 0.5, 1.5)),
        ("ggml_clamp", (a, -1.0, 2.0), ops.clamp, (a, -1.0, 2.0)),
        ("ggml_clamp_inplace", (a, -1.0, 2.0), ops.clamp_inplace, (a, -1.0, 2.0)),
        ("ggml_xielu", (a, 0.8, 0.8, 0.5, -1e-6), ops.xielu, (a, 0.8, 0.8, 0.5, -1e-6)),
        ("ggml_leaky_relu", (a, 0.1, True), ops.leaky_relu, (a, 0.1, True)),
        ("ggml_unary", (a, UnaryOp.ELU), ops.unary, (a, UnaryOp.ELU)),
        ("ggml_unary_inplace", (a, 6), ops.unary_inplace, (a, UnaryOp.RELU)),
        ("ggml_argmax", (m,), ops.argmax, (m,)),
        ("ggml_argsort", (a, GGML_SORT_ORDER_DESC), ops.argsort, (a, 1)),
        ("ggml_argsort_top_k", (a, 3), ops.argsort_top_k, (a, 3)),
        ("ggml_top_k", (a, 3), ops.top_k, (a, 3)),
        ("ggml_cpy", (a, ctx.new_tensor_1d(GGMLType.F16, 192)), ops.cpy, None),
        ("ggml_cont_1d", (a, 192), ops.cont_1d, (a, 192)),
        ("ggml_cont_2d", (a, 48, 4), ops.cont_2d, (a, 48, 4)),
        ("ggml_cont_3d", (a, 6, 8, 4), ops.cont_3d, (a, 6, 8, 4)),
        ("ggml_cont_4d", (a, 6, 8, 2, 2), ops.cont_4d, (a, 6, 8, 2, 2)),
        ("ggml_reshape", (a, ctx.new_tensor_2d(GGMLType.I32, 48, 4)), ops.reshape, None),
        ("ggml_reshape_1d", (a, 192), ops.reshape_1d, (a, 192)),
        ("ggml_reshape_2d", (a, 48, 4), ops.reshape_2d, (a, 48, 4)),
        ("ggml_reshape_3d", (a, 6, 8, 4), ops.reshape_3d, (a, 6, 8, 4)),
        ("ggml_reshape_4d", (a, 6, 8, 2, 2), ops.reshape_4d, (a, 6, 8, 2, 2)),
        ("ggml_view_1d", (a, 5, 12), ops.view_1d, (a, 5, 12)),
        ("ggml_view_2d", (a, 4, 3, 64, 8), ops.view_2d, (a, 4, 3, 64, 8)),
        ("ggml_view_3d", (a, 4, 3, 2, 64, 192, 8), ops.view_3d, (a, 4, 3, 2, 64, 192, 8)),
        ("ggml_view_4d", (a, 4, 3, 2, 1, 64, 192, 384, 8), ops.view_4d, (a, 4, 3, 2, 1, 64, 192, 384, 8)),
        ("ggml_permute", (a, 1, 2, 0, 3), ops.permute, (a, 1, 2, 0, 3)),
        ("ggml_get_rows", (a, idx), ops.get_rows, None),
        ("ggml_repeat", (b, a), ops.repeat, (b, a)),
        ("ggml_concat", (a, a, 1), ops.concat, (a, a, 1)),
        ("ggml_diag", (b,), ops.diag, (b,)),
        ("ggml_pad", (a, 1, 2, 0, 1), ops.pad, (a, 1, 2, 0, 1)),
        ("ggml_pad_circular", (a, 1, 2, 0, 1), ops.pad_circular, (a, 1, 2, 0, 1)),
        ("ggml_pad_ext", (a, 1, 2, 0, 1, 3, 0, 0, 0), ops.pad_ext, (a, 1, 2, 0, 1, 3, 0, 0, 0)),
        ("ggml_pad_ext_circular", (a, 1, 2, 0, 1, 3, 0, 0, 0), ops.pad_ext_circular, (a, 1, 2, 0, 1, 3, 0, 0, 0)),
        ("ggml_upscale", (a, 2, capi.GGML_SCALE_MODE_BILINEAR), ops.upscale, (a, 2, 1)),
        ("ggml_upscale_ext", (a, 9, 7, 4, 2, 0), ops.upscale_ext, (a, 9, 7, 4, 2, 0)),
        ("ggml_interpolate", (a, 9, 7, 4, 2, 1 | 256), ops.interpolate, (a, 9, 7, 4, 2, 257)),
        ("ggml_mul_mat", (m, a), ops.mul_mat, (m, a)),
        ("ggml_out_prod", (a, a), ops.out_prod, (a, a)),
        ("ggml_norm", (a, 1e-5), ops.norm, (a, 1e-5)),
        ("ggml_norm_inplace", (a, 1e-5), ops.norm_inplace, (a, 1e-5)),
        ("ggml_rms_norm", (a, 1e-5), ops.rms_norm, (a, 1e-5)),
        ("ggml_rms_norm_inplace", (a, 1e-5), ops.rms_norm_inplace, (a, 1e-5)),
        ("ggml_group_norm", (a, 2, 1e-6), ops.group_norm, (a, 2, 1e-6)),
        ("ggml_group_norm_inplace", (a, 2, 1e-6), ops.group_norm_inplace, (a, 2, 1e-6)),
        ("ggml_soft_max_ext", (a, mask, 0.25, 0.0), ops.soft_max_ext, (a, mask, 0.25)),
        ("ggml_soft_max_ext_inplace", (a, mask, 0.25, 8.0), ops.soft_max_ext_inplace, (a, mask, 0.25, 8.0)),
        ("ggml_diag_mask_inf", (a, 2), ops.diag_mask_inf, (a, 2)),
        ("ggml_diag_mask_inf_inplace", (a, 2), ops.diag_mask_inf_inplace, (a, 2)),
        ("ggml_diag_mask_zero", (a, 2), ops.diag_mask_zero, (a, 2)),
        ("ggml_diag_mask_zero_inplace", (a, 2), ops.diag_mask_zero_inplace, (a, 2)),
        ("ggml_rope", (a, pos, 8, 2), ops.rope, (a, pos, 8, 2)),
        ("ggml_rope_inplace", (a, pos, 8, 0), ops.rope_inplace, (a, pos, 8, 0)),
        ("ggml_rope_ext", (a, pos, ff, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0),
         ops.rope_ext, (a, pos, ff, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0)),
        ("ggml_rope_ext_inplace", (a, pos, None, 8, 0, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0),
         ops.rope_ext_inplace, (a, pos, None, 8, 0, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0)),
        ("ggml_rope_multi", (a, pos4, None, 8, [2, 1, 1, 0], 8, 256, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0),
         ops.rope_multi, (a, pos4, None, 8, [2, 1, 1, 0], 8, 256, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0)),
        ("ggml_rope_multi_inplace", (a, pos4, None, 8, [2, 1, 1, 0], 40, 256, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0),
         ops.rope_multi_inplace, (a, pos4, None, 8, [2, 1, 1, 0], 40, 256, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0)),
        ("ggml_rope_custom", (a, pos, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0),
         ops.rope_custom, (a, pos, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0)),
        ("ggml_rope_custom_inplace", (a, pos, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0),
         ops.rope_custom_inplace, (a, pos, 8, 2, 256, 1e4, 0.5, 1.0, 1.0, 32.0, 1.0)),
        ("ggml_im2col", (k2, x2, 1, 1, 1, 1, 1, 1, True, GGML_TYPE_F16), ops.im2col,
         (k2, x2, 1, 1, 1, 1, 1, 1, True)),
        ("ggml_conv_1d", (k1, x1, 1, 1, 1), ops.conv_1d, (k1, x1, 1, 1, 1)),
        ("ggml_conv_1d_ph", (k1, x1, 1, 1), ops.conv_1d_ph, (k1, x1, 1, 1)),
        ("ggml_conv_2d", (k2, x2, 2, 2, 1, 1, 1, 1), ops.conv_2d, (k2, x2, 2, 2, 1, 1, 1, 1)),
        ("ggml_conv_2d_sk_p0", (k2, x2), ops.conv_2d_sk_p0, (k2, x2)),
        ("ggml_conv_2d_s1_ph", (k2, x2), ops.conv_2d_s1_ph, (k2, x2)),
        ("ggml_conv_transpose_1d", (k1t, x1, 2, 0, 1), ops.conv_transpose_1d, (k1t, x1, 2, 0, 1)),
        ("ggml_pool_1d", (a, GGML_OP_POOL_AVG, 2, 2, 0), ops.pool_1d, (a, 1, 2, 2, 0)),
        ("ggml_pool_2d", (a, 0, 2, 2, 2, 2, 0, 0), ops.pool_2d, (a, 0, 2, 2, 2, 2, 0, 0)),
        ("ggml_map_custom1", (a, _fun, 2, None), ops.map_custom1, (a, _fun, 2, None)),
        ("ggml_map_custom1_inplace", (a, _fun, 2, None), ops.map_custom1_inplace, (a, _fun, 2, None)),
        ("ggml_map_custom2", (a, b, _fun, 2, None), ops.map_custom2, (a, b, _fun, 2, None)),
        ("ggml_map_custom2_inplace", (a, b, _fun, 2, None), ops.map_custom2_inplace, (a, b, _fun, 2, None)),
        ("ggml_map_custom3", (a, b, s, _fun, 2, None), ops.map_custom3, (a, b, s, _fun, 2, None)),
        ("ggml_map_custom3_inplace", (a, b, s, _fun, 2, None), ops.map_custom3_inplace, (a, b, s, _fun, 2, None)),
        ("ggml_custom_4d", (GGML_TYPE_F32, 3, 4, 1, 1, [a, b, s], 2, _fun, 2, None), ops.custom_4d,
         (GGMLType.F32, 3, 4, 1, 1, [a, b], _fun, 2, None)),
        ("ggml_custom_inplace", (a, [b], 1, _fun, -1, None), ops.custom_inplace, (a, [b], _fun, -1, None)),
    ]
    cases += _glu_rows_moe_op_cases(ctx)
    cases += _flash_attn_op_cases(ctx)
    cases += _misc_train_op_cases(ctx)
    cases += _conv_back_op_cases(ctx)
    cases += _ssm_op_cases(ctx)
    cases += _extra_op_cases(ctx)
    return cases


def _conv_back_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                                     tuple[object, ...] | None]]:
    """_op_cases of pyggml.core.ops.conv_back (capi and builder take the same arguments, but dst_type)."""
    f32 = GGMLType.F32
    k2, g2 = ctx.new_tensor_4d(f32, 3, 3, 2, 4), ctx.new_tensor_4d(f32, 18, 8, 6, 1)
    k3, x3 = ctx.new_tensor_4d(GGMLType.F16, 3, 2, 2, 6), ctx.new_tensor_4d(f32, 7, 6, 5, 4)
    spd = (1, 1, 1, 1, 0, 1, 1, 1, 1)
    af = ctx.new_tensor_4d(f32, 8, 6, 3, 1)
    return [
        ("ggml_im2col_back", (g2, k2, [8, 6, 2, 1], 1, 1, 1, 1, 1, 1, True), ops.im2col_back, None),
        ("ggml_im2col_3d", (k3, x3, 2, *spd, GGML_TYPE_F32), ops.im2col_3d, (k3, x3, 2, *spd, GGMLType.F32)),
        ("ggml_conv_3d", (k3, x3, 2, *spd), ops.conv_3d, None),
        ("ggml_conv_3d_direct", (k3, x3, *spd, 2, 2, 3), ops.conv_3d_direct, None),
        ("ggml_col2im_1d", (ctx.new_tensor_2d(f32, 12, 5), 2, 3, 1), ops.col2im_1d, None),
        ("ggml_pool_2d_back", (ctx.new_tensor_4d(f32, 4, 3, 3, 1), af, 1, 2, 2, 2, 2, 0.0, 0.0), ops.pool_2d_back,
         None),
    ]


def _extra_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                              tuple[object, ...] | None]]:
    f32 = GGMLType.F32
    a = ctx.new_tensor_3d(f32, 8, 6, 4)
    pos, pos4 = ctx.new_tensor_1d(GGMLType.I32, 4), ctx.new_tensor_1d(GGMLType.I32, 16)
    img = ctx.new_tensor_3d(f32, 4, 10, 7)
    parts = ctx.new_tensor_4d(f32, 4, 3, 3, 12)
    pw = ctx.new_tensor_4d(f32, 3, 2, 3, 4)
    hx = ctx.new_tensor_3d(f32, 6, 4, 5)  # hyper-connection streams: [n_embd, hc, n_tokens]
    return [
        ("ggml_rope_ext_back", (a, pos, None, 8, 2, 256, 1e4, 1.0, 0.5, 1.0, 32.0, 1.0), ops.rope_ext_back, None),
        ("ggml_rope_multi_back", (a, pos4, None, 8, [2, 1, 1, 0], 8, 256, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0),
         ops.rope_multi_back, None),
        ("ggml_win_part", (img, 3), ops.win_part, None),
        ("ggml_win_unpart", (parts, 10, 7, 3), ops.win_unpart, None),
        ("ggml_get_rel_pos", (ctx.new_tensor_2d(GGMLType.F16, 8, 9), 5, 5), ops.get_rel_pos, None),
        ("ggml_add_rel_pos", (ctx.new_tensor_4d(f32, 9, 6, 4, 1), pw, pw), ops.add_rel_pos, None),
        ("ggml_add_rel_pos_inplace", (ctx.new_tensor_4d(f32, 9, 6, 4, 1), pw, pw), ops.add_rel_pos_inplace, None),
        ("ggml_lightning_indexer", (ctx.new_tensor_4d(f32, 16, 3, 5, 2), ctx.new_tensor_4d(GGMLType.F16, 16, 1, 7, 2),
                                    ctx.new_tensor_4d(f32, 3, 5, 1, 2), ctx.new_tensor_4d(GGMLType.F16, 7, 5, 1, 1)),
         ops.lightning_indexer, None),
        ("ggml_dsv4_hc_comb", (ctx.new_tensor_2d(f32, 24, 5), ctx.new_tensor_1d(f32, 3), ctx.new_tensor_1d(f32, 24),
                               1e-6, 3), ops.dsv4_hc_comb, None),
        ("ggml_dsv4_hc_pre", (hx, ctx.new_tensor_2d(f32, 4, 5)), ops.dsv4_hc_pre, None),
        ("ggml_dsv4_hc_pre_gated", (hx, hx, 0.25), ops.dsv4_hc_pre_gated, None),
        ("ggml_dsv4_hc_post", (ctx.new_tensor_2d(f32, 6, 5), hx, ctx.new_tensor_2d(f32, 4, 5),
                               ctx.new_tensor_3d(f32, 4, 4, 5)), ops.dsv4_hc_post, None),
    ]


def _misc_train_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                                      tuple[object, ...] | None]]:
    """_op_cases of pyggml.core.ops.misc and pyggml.core.ops.train (capi and builder take the same arguments)."""
    f32 = GGMLType.F32
    a = ctx.new_tensor_4d(f32, 6, 6, 3, 2)
    b = ctx.new_tensor_4d(f32, 4, 6, 3, 2)
    i32 = ctx.new_tensor_2d(GGMLType.I32, 5, 3)
    p = ctx.new_tensor_2d(f32, 6, 4).set_param()
    g = ctx.new_tensor_2d(f32, 6, 4)
    rows = ctx.new_tensor_1d(GGMLType.I32, 4)
    kernel = ctx.new_tensor_4d(f32, 3, 3, 3, 4)
    dw = ctx.new_tensor_4d(f32, 3, 3, 1, 3)
    x = ctx.new_tensor_4d(f32, 9, 8, 3, 2)
    kt = ctx.new_tensor_4d(f32, 3, 3, 4, 3)
    cases: list[tuple[str, tuple[object, ...], Callable[..., Tensor], tuple[object, ...] | None]] = [
        (f"ggml_{name}", (a,), getattr(ops, name), None)
        for name in ("sin", "sin_inplace", "cos", "cos_inplace", "cumsum")
    ]
    cases += [
        ("ggml_fill", (a, 1.5), ops.fill, None), ("ggml_fill_inplace", (a, 1.5), ops.fill_inplace, None),
        ("ggml_arange", (0.0, 5.0, 0.5), ops.arange, None),
        ("ggml_timestep_embedding", (g, 7, 100), ops.timestep_embedding, None),
        ("ggml_tri", (a, 3), ops.tri, None), ("ggml_count_equal", (i32, i32), ops.count_equal, None),
        ("ggml_l2_norm", (a, 1e-6), ops.l2_norm, None), ("ggml_l2_norm_inplace", (a, 1e-6), ops.l2_norm_inplace, None),
        ("ggml_roll", (a, 1, -2, 0, 1), ops.roll, None), ("ggml_pad_reflect_1d", (a, 2, 3), ops.pad_reflect_1d, None),
        ("ggml_repeat_back", (a, ctx.new_tensor_4d(f32, 3, 2, 3, 1)), ops.repeat_back, None),
        ("ggml_solve_tri", (a, b, True, True, False), ops.solve_tri, None),
        ("ggml_conv_2d_direct", (kernel, x, 1, 1, 1, 1, 1, 1), ops.conv_2d_direct, None),
        ("ggml_conv_2d_dw_direct", (dw, x, 2, 1, 0, 1, 1, 2), ops.conv_2d_dw_direct, None),
        ("ggml_conv_transpose_2d_p0", (kt, ctx.new_tensor_4d(f32, 5, 4, 3, 1), 2), ops.conv_transpose_2d_p0, None),
        ("ggml_silu_back", (g, g), ops.silu_back, None), ("ggml_rms_norm_back", (g, g, 1e-5), ops.rms_norm_back, None),
        ("ggml_soft_max_ext_back", (g, g, 0.5, 0.0), ops.soft_max_ext_back, None),
        ("ggml_soft_max_ext_back_inplace", (g, g, 0.5, 0.0), ops.soft_max_ext_back_inplace, None),
        ("ggml_get_rows_back", (g, rows, ctx.new_tensor_2d(f32, 6, 3)), ops.get_rows_back, None),
        ("ggml_cross_entropy_loss", (g, g), ops.cross_entropy_loss, None),
        ("ggml_cross_entropy_loss_back", (ctx.new_tensor_1d(f32, 1), g, g), ops.cross_entropy_loss_back, None),
        ("ggml_opt_step_adamw", (p, g, g, g, ctx.new_tensor_1d(f32, 7)), ops.opt_step_adamw, None),
        ("ggml_opt_step_sgd", (p, g, ctx.new_tensor_1d(f32, 2)), ops.opt_step_sgd, None),
    ]
    return cases


def _flash_attn_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                                     tuple[object, ...] | None]]:
    q = ctx.new_tensor_4d(GGMLType.F32, 64, 3, 4, 1)
    kv = ctx.new_tensor_4d(GGMLType.F16, 64, 16, 2, 1)
    mask = ctx.new_tensor_4d(GGMLType.F16, 16, 3, 1, 1)
    args = (q, kv, kv, mask, 0.125, 0.0, 0.0)
    return [("ggml_flash_attn_ext", args, ops.flash_attn_ext, args)]



def _ssm_op_cases(ctx: Context) -> list[tuple[str, tuple[object, ...], Callable[..., Tensor],
                                              tuple[object, ...] | None]]:
    f32 = GGMLType.F32
    tok, st = ctx.new_tensor_3d(f32, 4, 3, 6), ctx.new_tensor_2d(f32, 4 * 4 * 3, 2)
    tf = ctx.new_tensor_2d(f32, 4, 3)
    s, x = ctx.new_tensor_4d(f32, 8, 4, 6, 2), ctx.new_tensor_4d(f32, 4, 6, 5, 2)
    dt, A = ctx.new_tensor_3d(f32, 6, 5, 2), ctx.new_tensor_2d(f32, 1, 6)
    B, ids = ctx.new_tensor_4d(f32, 8, 2, 5, 2), ctx.new_tensor_1d(GGMLType.I32, 2)
    v, g = ctx.new_tensor_4d(f32, 8, 4, 5, 2), ctx.new_tensor_4d(f32, 1, 4, 5, 2)
    return [
        ("ggml_ssm_conv", (ctx.new_tensor_3d(f32, 9, 5, 2), ctx.new_tensor_2d(f32, 4, 5)), ops.ssm_conv, None),
        ("ggml_ssm_scan", (s, x, dt, A, B, B, ids, 3), ops.ssm_scan, None),
        ("ggml_rwkv_wkv6", (tok, tok, tok, tf, tok, st), ops.rwkv_wkv6, None),
        ("ggml_gated_linear_attn", (tok, tok, tok, tok, st, 0.5), ops.gated_linear_attn, None),
        ("ggml_rwkv_wkv7", (tok, tok, tok, tok, tok, tok, st), ops.rwkv_wkv7, None),
        ("ggml_gated_delta_net", (v, v, v, g, g, ctx.new_tensor_4d(f32, 8, 8, 4, 2), 2), ops.gated_delta_net, None),
    ]


def _same_node(x: Tensor, y: Tensor) -> None:
    assert (x.op, x.type, x.ne, x.nb) == (y.op, y.type, y.ne, y.nb)
    assert list(x.op_params) == list(y.op_params)
    assert (x.view_src is None) == (y.view_src is None) and x.view_offs == y.view_offs
    for sx, sy in zip(x.src, y.src, strict=True):
        if sx is None or sy is None:
            assert sx is sy
        elif sx.op == GGMLOp.NONE:
            assert sx is sy  # operands are the same tensors
        else:
            _same_node(sx, sy)  # intermediate nodes (conv's im2col, top_k's argsort) are built alike


def test_every_op_function_matches_its_builder() -> None:
    ctx = ggml_init(mem_size=1 << 22, no_alloc=True)
    for cname, args, builder, bargs in _op_cases(ctx):
        got = getattr(capi, cname)(ctx, *args)
        want = builder(ctx, *(args if bargs is None else bargs))
        try:
            _same_node(got, want)
        except AssertionError as e:
            raise AssertionError(f"{cname}: {e}") from e


def test_every_builder_has_a_capi_function() -> None:
    ctx = ggml_init(mem_size=1 << 22, no_alloc=True)
    covered = {c[0] for c in _op_cases(ctx)}
    from pyggml.core.ops import OpBuilders

    builders = {n for n in vars(OpBuilders) if not n.startswith("_")}
    missing = sorted(n for n in builders if not hasattr(capi, f"ggml_{n}"))
    assert missing == []
    untested = sorted(f"ggml_{n}" for n in builders if f"ggml_{n}" not in covered)
    assert untested == []


def test_capi_functions_take_ctx_first_like_c() -> None:
    ctx_first = [n for n in dir(capi) if n.startswith("ggml_") and callable(getattr(capi, n))
                 and inspect.signature(getattr(capi, n)).parameters.get("ctx") is not None]
    for n in ctx_first:
        assert next(iter(inspect.signature(getattr(capi, n)).parameters)) == "ctx", n
    assert len(ctx_first) > 120
