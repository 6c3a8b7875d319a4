"""ggml.h by its C names and argument order, each a thin call into pyggml.core.

Code ported from C reads the same:

    ctx = ggml_init(ggml_init_params(mem_size=16 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 3)
    c = ggml_mul_mat(ctx, a, b)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, c)

Pointers are Python objects (`struct ggml_context *` a `Context`, `struct
ggml_tensor *` a `Tensor`, `struct ggml_cgraph *` a `Graph`); NULL is None.
Enums are pyggml's IntEnums with ggml.h's names and numbers (GGML_OP_MUL_MAT
== 29, GGML_UNARY_OP_SILU == 10, GGML_TYPE_I32 == 26, as ggml and GGUF files
number them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any

import numpy as np

from pyggml.core import ops
from pyggml.core.checks import check_int
from pyggml.core.context import GGML_DEFAULT_GRAPH_SIZE as GGML_DEFAULT_GRAPH_SIZE
from pyggml.core.context import GGML_MEM_ALIGN as GGML_MEM_ALIGN
from pyggml.core.context import GGML_OBJECT_SIZE as GGML_OBJECT_SIZE
from pyggml.core.context import GGML_TENSOR_SIZE as GGML_TENSOR_SIZE
from pyggml.core.context import Context, pad, tensor_overhead
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import EvalOrder, Graph, graph_overhead, hash_size
from pyggml.core.ops.custom import GGML_N_TASKS_MAX as GGML_N_TASKS_MAX
from pyggml.core.ops.params import GLUParams, UnaryParams
from pyggml.core.tensor import GGML_GLU_OP_COUNT as _GGML_GLU_OP_COUNT
from pyggml.core.tensor import GGML_MAX_DIMS as GGML_MAX_DIMS
from pyggml.core.tensor import GGML_MAX_NAME as GGML_MAX_NAME
from pyggml.core.tensor import GGML_MAX_OP_PARAMS as GGML_MAX_OP_PARAMS
from pyggml.core.tensor import GGML_MAX_SRC as GGML_MAX_SRC
from pyggml.core.tensor import GGML_MROPE_SECTIONS as GGML_MROPE_SECTIONS
from pyggml.core.tensor import GGML_OP_COUNT as _GGML_OP_COUNT
from pyggml.core.tensor import GGML_OP_POOL_COUNT as _GGML_OP_POOL_COUNT
from pyggml.core.tensor import GGML_ROPE_TYPE_IMROPE as GGML_ROPE_TYPE_IMROPE
from pyggml.core.tensor import GGML_ROPE_TYPE_MROPE as GGML_ROPE_TYPE_MROPE
from pyggml.core.tensor import GGML_ROPE_TYPE_NEOX as GGML_ROPE_TYPE_NEOX
from pyggml.core.tensor import GGML_ROPE_TYPE_NORMAL as GGML_ROPE_TYPE_NORMAL
from pyggml.core.tensor import GGML_ROPE_TYPE_VISION as GGML_ROPE_TYPE_VISION
from pyggml.core.tensor import GGML_SCALE_MODE_COUNT as _GGML_SCALE_MODE_COUNT
from pyggml.core.tensor import GGML_UNARY_OP_COUNT as _GGML_UNARY_OP_COUNT
from pyggml.core.tensor import (
    GGMLOp,
    GLUOp,
    OpHint,
    OpPool,
    Prec,
    ScaleFlag,
    ScaleMode,
    SortOrder,
    Tensor,
    TensorFlag,
    TriType,
    UnaryOp,
    are_same_layout,
    are_same_shape,
    can_repeat,
)
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type

# --- constants ---

GGML_DEFAULT_N_THREADS = 4


def _export(enum: type[IntEnum] | type[IntFlag], prefix: str) -> None:
    """`<prefix><NAME> = member` for every member of `enum` (aliases too): ggml.h's names of pyggml's enums, whose
    values are ggml.h's (tests/core/test_enums_ggml_h.py)."""
    for name, member in enum.__members__.items():
        globals()[prefix + name] = member


_export(GGMLType, "GGML_TYPE_")  # enum ggml_type: the types pyggml has
_export(GGMLOp, "GGML_OP_")  # enum ggml_op
GGML_OP_COUNT = _GGML_OP_COUNT
_export(UnaryOp, "GGML_UNARY_OP_")  # enum ggml_unary_op
GGML_UNARY_OP_COUNT = _GGML_UNARY_OP_COUNT
_export(GLUOp, "GGML_GLU_OP_")  # enum ggml_glu_op
GGML_GLU_OP_COUNT = _GGML_GLU_OP_COUNT
_export(OpPool, "GGML_OP_POOL_")  # enum ggml_op_pool
GGML_OP_POOL_COUNT = _GGML_OP_POOL_COUNT
_export(SortOrder, "GGML_SORT_ORDER_")  # enum ggml_sort_order
_export(Prec, "GGML_PREC_")  # enum ggml_prec (DEFAULT is UNDEFINED's alias)
_export(OpHint, "GGML_HINT_")  # enum ggml_op_hint
_export(ScaleMode, "GGML_SCALE_MODE_")  # enum ggml_scale_mode
GGML_SCALE_MODE_COUNT = _GGML_SCALE_MODE_COUNT
_export(ScaleFlag, "GGML_SCALE_FLAG_")  # enum ggml_scale_flag
_export(TriType, "GGML_TRI_TYPE_")  # enum ggml_tri_type
_export(TensorFlag, "GGML_TENSOR_FLAG_")  # enum ggml_tensor_flag
_export(EvalOrder, "GGML_CGRAPH_EVAL_ORDER_")  # enum ggml_cgraph_eval_order


# --- context ---


@dataclass
class ggml_init_params:  # ggml's struct name, lower case as in C
    """struct ggml_init_params."""

    mem_size: int = 0
    mem_buffer: np.ndarray | None = None
    no_alloc: bool = False


def ggml_init(params: ggml_init_params | dict[str, Any] | int | None = None, mem_buffer: np.ndarray | None = None,
              no_alloc: bool | None = None, *, mem_size: int | None = None) -> Context:
    """ggml_init: a params struct or dict, or mem_size/mem_buffer/no_alloc as arguments.

    `ggml_init(ggml_init_params(mem_size=n))`, `ggml_init({"mem_size": n, "no_alloc": True})`
    and `ggml_init(mem_size=n, no_alloc=True)` are the same.
    """
    if isinstance(params, dict):
        unknown = sorted(k for k in params if k not in ("mem_size", "mem_buffer", "no_alloc"))
        if unknown:
            raise ArgumentError(f"ggml_init: unknown params {unknown} (mem_size, mem_buffer, no_alloc)")
        p = ggml_init_params(**params)
    elif isinstance(params, ggml_init_params):
        p = ggml_init_params(params.mem_size, params.mem_buffer, params.no_alloc)
    elif params is None:
        p = ggml_init_params()
    else:
        p = ggml_init_params(mem_size=params)  # Context checks it: 2.5 is refused, not taken as 2
    if mem_size is not None:
        p.mem_size = mem_size
    if mem_buffer is not None:
        p.mem_buffer = mem_buffer
    if no_alloc is not None:
        p.no_alloc = no_alloc
    return Context(mem_size=p.mem_size, mem_buffer=p.mem_buffer, no_alloc=p.no_alloc)


def ggml_free(ctx: Context | None) -> None:
    if ctx is not None:
        ctx.free()


def ggml_used_mem(ctx: Context) -> int:
    return ctx.used_mem()


def ggml_get_mem_size(ctx: Context) -> int:
    return ctx.get_mem_size()


def ggml_get_no_alloc(ctx: Context) -> bool:
    return ctx.get_no_alloc()


def ggml_set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    ctx.set_no_alloc(no_alloc)


def ggml_get_max_tensor_size(ctx: Context) -> int:
    return ctx.get_max_tensor_size()


def ggml_tensor_overhead() -> int:
    return tensor_overhead()


def ggml_graph_overhead() -> int:
    return graph_overhead(GGML_DEFAULT_GRAPH_SIZE, False)


def ggml_graph_overhead_custom(size: int, grads: bool) -> int:
    return graph_overhead(size, grads)


# --- tensors ---


def ggml_new_tensor(ctx: Context, type: GGMLType | int, n_dims: int, ne: list[int] | tuple[int, ...]) -> Tensor:
    n_dims = check_int(n_dims, "ggml_new_tensor: n_dims")
    if not 1 <= n_dims <= GGML_MAX_DIMS or len(ne) < n_dims:
        raise ArgumentError(f"ggml_new_tensor: n_dims={n_dims} with ne={list(ne)}")
    return ctx.new_tensor(type, list(ne[:n_dims]))


def ggml_new_tensor_1d(ctx: Context, type: GGMLType | int, ne0: int) -> Tensor:
    return ctx.new_tensor_1d(type, ne0)


def ggml_new_tensor_2d(ctx: Context, type: GGMLType | int, ne0: int, ne1: int) -> Tensor:
    return ctx.new_tensor_2d(type, ne0, ne1)


def ggml_new_tensor_3d(ctx: Context, type: GGMLType | int, ne0: int, ne1: int, ne2: int) -> Tensor:
    return ctx.new_tensor_3d(type, ne0, ne1, ne2)


def ggml_new_tensor_4d(ctx: Context, type: GGMLType | int, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return ctx.new_tensor_4d(type, ne0, ne1, ne2, ne3)


def ggml_new_i32(ctx: Context, value: int) -> Tensor:
    return ctx.new_i32(value)


def ggml_new_f32(ctx: Context, value: float) -> Tensor:
    return ctx.new_f32(value)


def ggml_dup_tensor(ctx: Context, src: Tensor) -> Tensor:
    return ctx.dup_tensor(src)


def ggml_view_tensor(ctx: Context, src: Tensor) -> Tensor:
    return ctx.view_tensor(src)


def ggml_get_first_tensor(ctx: Context) -> Tensor | None:
    return ctx.get_first_tensor()


def ggml_get_next_tensor(ctx: Context, tensor: Tensor) -> Tensor | None:
    return ctx.get_next_tensor(tensor)


def ggml_get_tensor(ctx: Context, name: str) -> Tensor | None:
    return ctx.get_tensor(name)


def ggml_set_name(tensor: Tensor, name: str) -> Tensor:
    return tensor.set_name(name)


def ggml_get_name(tensor: Tensor) -> str:
    return tensor.get_name()


def ggml_format_name(tensor: Tensor, fmt: str, *args: object) -> Tensor:
    return tensor.format_name(fmt, *args)


def ggml_set_input(tensor: Tensor) -> None:
    tensor.set_input()


def ggml_set_output(tensor: Tensor) -> None:
    tensor.set_output()


def ggml_set_param(ctx: Context, tensor: Tensor) -> None:
    """Mark a tensor as a parameter (in ggml it gets a gradient; here the PARAM flag)."""
    tensor.set_param()


def ggml_get_op_params_i32(tensor: Tensor, i: int) -> int:
    return tensor.get_op_params_i32(i)


def ggml_get_op_params_f32(tensor: Tensor, i: int) -> float:
    return tensor.get_op_params_f32(i)


def ggml_set_op_params_i32(tensor: Tensor, i: int, value: int) -> None:
    tensor.set_op_params_i32(i, value)


def ggml_set_op_params_f32(tensor: Tensor, i: int, value: float) -> None:
    tensor.set_op_params_f32(i, value)


def ggml_get_unary_op(tensor: Tensor) -> UnaryOp:
    return UnaryParams.of(tensor).op


def ggml_get_glu_op(tensor: Tensor) -> GLUOp:
    return GLUParams.of(tensor).op


# --- sizes, types, layout ---


def ggml_nelements(tensor: Tensor) -> int:
    return tensor.nelements()


def ggml_nrows(tensor: Tensor) -> int:
    return tensor.nrows()


def ggml_nbytes(tensor: Tensor) -> int:
    return tensor.nbytes()


def ggml_nbytes_pad(tensor: Tensor) -> int:
    return pad(tensor.nbytes(), GGML_MEM_ALIGN)


def ggml_element_size(tensor: Tensor) -> int:
    return tensor.element_size()


def ggml_row_size(type: GGMLType | int, ne: int) -> int:
    t = as_type(type)
    tr = TYPE_TRAITS[t]
    ne = check_int(ne, "ggml_row_size: ne", minimum=0)
    if ne % tr.blck_size != 0:
        raise ArgumentError(f"ggml_row_size: {ne} elements are not a whole number of {tr.name} blocks "
                            f"of {tr.blck_size}")
    return tr.type_size * ne // tr.blck_size


def ggml_type_size(type: GGMLType | int) -> int:
    return TYPE_TRAITS[as_type(type)].type_size


def ggml_blck_size(type: GGMLType | int) -> int:
    return TYPE_TRAITS[as_type(type)].blck_size


def ggml_type_sizef(type: GGMLType | int) -> float:
    tr = TYPE_TRAITS[as_type(type)]
    return tr.type_size / tr.blck_size


def ggml_type_name(type: GGMLType | int) -> str:
    return TYPE_TRAITS[as_type(type)].name


def ggml_is_quantized(type: GGMLType | int) -> bool:
    return TYPE_TRAITS[as_type(type)].is_quantized


def ggml_op_name(op: GGMLOp | int) -> str:
    return GGMLOp(op).name


def ggml_unary_op_name(op: UnaryOp | int) -> str:
    return UnaryOp(op).name


def ggml_glu_op_name(op: GLUOp | int) -> str:
    return GLUOp(op).name


def ggml_op_desc(tensor: Tensor) -> str:
    """The op's name, or the function's for UNARY and GLU (ggml_op_desc)."""
    if tensor.op == GGMLOp.UNARY:
        return ggml_unary_op_name(ggml_get_unary_op(tensor))
    if tensor.op == GGMLOp.GLU:
        return ggml_glu_op_name(ggml_get_glu_op(tensor))
    return ggml_op_name(tensor.op)


def ggml_is_contiguous(tensor: Tensor) -> bool:
    return tensor.is_contiguous()


def ggml_is_transposed(tensor: Tensor) -> bool:
    return tensor.is_transposed()


def ggml_is_permuted(tensor: Tensor) -> bool:
    return tensor.is_permuted()


def ggml_is_scalar(tensor: Tensor) -> bool:
    return tensor.is_scalar()


def ggml_is_vector(tensor: Tensor) -> bool:
    return tensor.is_vector()


def ggml_is_matrix(tensor: Tensor) -> bool:
    return tensor.is_matrix()


def ggml_is_3d(tensor: Tensor) -> bool:
    return tensor.ne[3] == 1


def ggml_n_dims(tensor: Tensor) -> int:
    return tensor.n_dims()


def ggml_are_same_shape(t0: Tensor, t1: Tensor) -> bool:
    return are_same_shape(t0, t1)


def ggml_are_same_layout(a: Tensor, b: Tensor) -> bool:
    return are_same_layout(a, b)


def ggml_can_repeat(t0: Tensor, t1: Tensor) -> bool:
    """Whether t0 repeats to t1's shape."""
    return can_repeat(t0, t1)


# --- ops: copies, views and layout ---


def ggml_dup(ctx: Context, a: Tensor) -> Tensor:
    return ops.dup(ctx, a)


def ggml_dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.dup_inplace(ctx, a)


def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.cpy(ctx, a, b)


def ggml_cont(ctx: Context, a: Tensor) -> Tensor:
    return ops.cont(ctx, a)


def ggml_cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return ops.cont_1d(ctx, a, ne0)


def ggml_cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return ops.cont_2d(ctx, a, ne0, ne1)


def ggml_cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return ops.cont_3d(ctx, a, ne0, ne1, ne2)


def ggml_cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return ops.cont_4d(ctx, a, ne0, ne1, ne2, ne3)


def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.reshape(ctx, a, b)


def ggml_reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return ops.reshape_1d(ctx, a, ne0)


def ggml_reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return ops.reshape_2d(ctx, a, ne0, ne1)


def ggml_reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return ops.reshape_3d(ctx, a, ne0, ne1, ne2)


def ggml_reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return ops.reshape_4d(ctx, a, ne0, ne1, ne2, ne3)


def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    return ops.view_1d(ctx, a, ne0, offset)


def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    return ops.view_2d(ctx, a, ne0, ne1, nb1, offset)


def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    return ops.view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset)


def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                 nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return ops.view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset)


def ggml_permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    return ops.permute(ctx, a, axis0, axis1, axis2, axis3)


def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    return ops.transpose(ctx, a)


def ggml_get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.get_rows(ctx, a, b)


def ggml_repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.repeat(ctx, a, b)


def ggml_concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    return ops.concat(ctx, a, b, dim)


def ggml_diag(ctx: Context, a: Tensor) -> Tensor:
    return ops.diag(ctx, a)


def ggml_pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    return ops.pad(ctx, a, p0, p1, p2, p3)


def ggml_pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    return ops.pad_circular(ctx, a, p0, p1, p2, p3)


def ggml_pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int, lp3: int,
                 rp3: int) -> Tensor:
    return ops.pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)


def ggml_pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
                          lp3: int, rp3: int) -> Tensor:
    return ops.pad_ext_circular(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)


def ggml_upscale(ctx: Context, a: Tensor, scale_factor: int, mode: ScaleMode | int) -> Tensor:
    return ops.upscale(ctx, a, scale_factor, mode)


def ggml_upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                     mode: ScaleMode | int) -> Tensor:
    return ops.upscale_ext(ctx, a, ne0, ne1, ne2, ne3, mode)


def ggml_interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    return ops.interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


# --- ops: element-wise ---


def ggml_add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.add(ctx, a, b)


def ggml_add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.add_inplace(ctx, a, b)


def ggml_add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.add1(ctx, a, b)


def ggml_add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.add1_inplace(ctx, a, b)


def ggml_acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return ops.acc(ctx, a, b, nb1, nb2, nb3, offset)


def ggml_acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return ops.acc_inplace(ctx, a, b, nb1, nb2, nb3, offset)


def ggml_sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.sub(ctx, a, b)


def ggml_sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.sub_inplace(ctx, a, b)


def ggml_mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.mul(ctx, a, b)


def ggml_mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.mul_inplace(ctx, a, b)


def ggml_div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.div(ctx, a, b)


def ggml_div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.div_inplace(ctx, a, b)


def ggml_sqr(ctx: Context, a: Tensor) -> Tensor:
    return ops.sqr(ctx, a)


def ggml_sqr_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.sqr_inplace(ctx, a)


def ggml_sqrt(ctx: Context, a: Tensor) -> Tensor:
    return ops.sqrt(ctx, a)


def ggml_sqrt_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.sqrt_inplace(ctx, a)


def ggml_log(ctx: Context, a: Tensor) -> Tensor:
    return ops.log(ctx, a)


def ggml_log_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.log_inplace(ctx, a)


def ggml_scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    return ops.scale(ctx, a, s)


def ggml_scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    return ops.scale_inplace(ctx, a, s)


def ggml_scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return ops.scale_bias(ctx, a, s, b)


def ggml_scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return ops.scale_bias_inplace(ctx, a, s, b)


def ggml_set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return ops.set(ctx, a, b, nb1, nb2, nb3, offset)


def ggml_set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return ops.set_inplace(ctx, a, b, nb1, nb2, nb3, offset)


def ggml_set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return ops.set_1d(ctx, a, b, offset)


def ggml_set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return ops.set_1d_inplace(ctx, a, b, offset)


def ggml_set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return ops.set_2d(ctx, a, b, nb1, offset)


def ggml_set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return ops.set_2d_inplace(ctx, a, b, nb1, offset)


def ggml_clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    return ops.clamp(ctx, a, min, max)


def ggml_clamp_inplace(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    return ops.clamp_inplace(ctx, a, min, max)


def ggml_leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool) -> Tensor:
    return ops.leaky_relu(ctx, a, negative_slope, inplace)


def ggml_unary(ctx: Context, a: Tensor, op: UnaryOp | int) -> Tensor:
    return ops.unary(ctx, a, op)  # the builder checks op (ArgumentError for a number that is no unary op)


def ggml_unary_inplace(ctx: Context, a: Tensor, op: UnaryOp | int) -> Tensor:
    return ops.unary_inplace(ctx, a, op)


def ggml_abs(ctx: Context, a: Tensor) -> Tensor:
    return ops.abs(ctx, a)


def ggml_abs_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.abs_inplace(ctx, a)


def ggml_sgn(ctx: Context, a: Tensor) -> Tensor:
    return ops.sgn(ctx, a)


def ggml_sgn_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.sgn_inplace(ctx, a)


def ggml_neg(ctx: Context, a: Tensor) -> Tensor:
    return ops.neg(ctx, a)


def ggml_neg_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.neg_inplace(ctx, a)


def ggml_step(ctx: Context, a: Tensor) -> Tensor:
    return ops.step(ctx, a)


def ggml_step_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.step_inplace(ctx, a)


def ggml_tanh(ctx: Context, a: Tensor) -> Tensor:
    return ops.tanh(ctx, a)


def ggml_tanh_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.tanh_inplace(ctx, a)


def ggml_elu(ctx: Context, a: Tensor) -> Tensor:
    return ops.elu(ctx, a)


def ggml_elu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.elu_inplace(ctx, a)


def ggml_relu(ctx: Context, a: Tensor) -> Tensor:
    return ops.relu(ctx, a)


def ggml_relu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.relu_inplace(ctx, a)


def ggml_gelu(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu(ctx, a)


def ggml_gelu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu_inplace(ctx, a)


def ggml_gelu_quick(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu_quick(ctx, a)


def ggml_gelu_quick_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu_quick_inplace(ctx, a)


def ggml_silu(ctx: Context, a: Tensor) -> Tensor:
    return ops.silu(ctx, a)


def ggml_silu_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.silu_inplace(ctx, a)


def ggml_hardswish(ctx: Context, a: Tensor) -> Tensor:
    return ops.hardswish(ctx, a)


def ggml_hardswish_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.hardswish_inplace(ctx, a)


def ggml_hardsigmoid(ctx: Context, a: Tensor) -> Tensor:
    return ops.hardsigmoid(ctx, a)


def ggml_hardsigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.hardsigmoid_inplace(ctx, a)


def ggml_sigmoid(ctx: Context, a: Tensor) -> Tensor:
    return ops.sigmoid(ctx, a)


def ggml_sigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.sigmoid_inplace(ctx, a)

def ggml_gelu_erf(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu_erf(ctx, a)


def ggml_gelu_erf_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.gelu_erf_inplace(ctx, a)

def ggml_exp(ctx: Context, a: Tensor) -> Tensor:
    return ops.exp(ctx, a)


def ggml_exp_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.exp_inplace(ctx, a)

def ggml_expm1(ctx: Context, a: Tensor) -> Tensor:
    return ops.expm1(ctx, a)


def ggml_expm1_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.expm1_inplace(ctx, a)

def ggml_softplus(ctx: Context, a: Tensor) -> Tensor:
    return ops.softplus(ctx, a)


def ggml_softplus_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.softplus_inplace(ctx, a)

def ggml_floor(ctx: Context, a: Tensor) -> Tensor:
    return ops.floor(ctx, a)


def ggml_floor_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.floor_inplace(ctx, a)

def ggml_ceil(ctx: Context, a: Tensor) -> Tensor:
    return ops.ceil(ctx, a)


def ggml_ceil_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.ceil_inplace(ctx, a)

def ggml_round(ctx: Context, a: Tensor) -> Tensor:
    return ops.round(ctx, a)


def ggml_round_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.round_inplace(ctx, a)

def ggml_trunc(ctx: Context, a: Tensor) -> Tensor:
    return ops.trunc(ctx, a)


def ggml_trunc_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.trunc_inplace(ctx, a)


def ggml_xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    return ops.xielu(ctx, a, alpha_n, alpha_p, beta, eps)


# --- ops: reductions and sorting ---


def ggml_sum(ctx: Context, a: Tensor) -> Tensor:
    return ops.sum(ctx, a)


def ggml_sum_rows(ctx: Context, a: Tensor) -> Tensor:
    return ops.sum_rows(ctx, a)


def ggml_mean(ctx: Context, a: Tensor) -> Tensor:
    return ops.mean(ctx, a)


def ggml_argmax(ctx: Context, a: Tensor) -> Tensor:
    return ops.argmax(ctx, a)


def ggml_argsort(ctx: Context, a: Tensor, order: SortOrder | int) -> Tensor:
    return ops.argsort(ctx, a, order)


def ggml_argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    return ops.argsort_top_k(ctx, a, k)


def ggml_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    return ops.top_k(ctx, a, k)


# --- ops: matrix products ---


def ggml_mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.mul_mat(ctx, a, b)


def ggml_mul_mat_set_hint(a: Tensor, hint: int) -> None:
    ops.mul_mat_set_hint(a, hint)


def ggml_out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.out_prod(ctx, a, b)


# --- ops: norms, soft_max, masks, positions ---


def ggml_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.norm(ctx, a, eps)


def ggml_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.norm_inplace(ctx, a, eps)


def ggml_rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.rms_norm(ctx, a, eps)


def ggml_rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.rms_norm_inplace(ctx, a, eps)


def ggml_group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return ops.group_norm(ctx, a, n_groups, eps)


def ggml_group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return ops.group_norm_inplace(ctx, a, n_groups, eps)


def ggml_soft_max(ctx: Context, a: Tensor) -> Tensor:
    return ops.soft_max(ctx, a)


def ggml_soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.soft_max_inplace(ctx, a)


def ggml_soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    return ops.soft_max_ext(ctx, a, mask, scale, max_bias)


def ggml_soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                              max_bias: float) -> Tensor:
    return ops.soft_max_ext_inplace(ctx, a, mask, scale, max_bias)


def ggml_soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    ops.soft_max_add_sinks(a, sinks)


def ggml_flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                        max_bias: float, logit_softcap: float) -> Tensor:
    return ops.flash_attn_ext(ctx, q, k, v, mask, scale, max_bias, logit_softcap)


def ggml_flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    ops.flash_attn_ext_set_prec(a, prec)


def ggml_flash_attn_ext_get_prec(a: Tensor) -> int:
    return int(ops.flash_attn_ext_get_prec(a))


def ggml_flash_attn_ext_set_n_kv_max(a: Tensor, n_kv_max: int) -> None:
    ops.flash_attn_ext_set_n_kv_max(a, n_kv_max)


def ggml_flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    ops.flash_attn_ext_add_sinks(a, sinks)


def ggml_diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return ops.diag_mask_inf(ctx, a, n_past)


def ggml_diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return ops.diag_mask_inf_inplace(ctx, a, n_past)


def ggml_diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return ops.diag_mask_zero(ctx, a, n_past)


def ggml_diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return ops.diag_mask_zero_inplace(ctx, a, n_past)


def ggml_rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return ops.rope(ctx, a, b, n_dims, mode)


def ggml_rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return ops.rope_inplace(ctx, a, b, n_dims, mode)


def ggml_rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
                  freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
                  beta_slow: float) -> Tensor:
    return ops.rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                        beta_fast, beta_slow)


def ggml_rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                          n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                          attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_ext_inplace(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                attn_factor, beta_fast, beta_slow)


def ggml_rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int],
                    mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow)


def ggml_rope_multi_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int,
                            sections: list[int], mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
                            ext_factor: float, attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_multi_inplace(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                                  ext_factor, attn_factor, beta_fast, beta_slow)


def ggml_rope_custom(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                     freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_custom(ctx, a, b, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                           beta_fast, beta_slow)


def ggml_rope_custom_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int, n_ctx_orig: int,
                             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                             beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_custom_inplace(ctx, a, b, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                   attn_factor, beta_fast, beta_slow)


def ggml_rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    return ops.rope_set_offset(a, n_offs)


def ggml_rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                             beta_slow: float) -> tuple[float, float]:
    """The first and last dimension of YaRN's ramp (C fills a float[2]: here a tuple)."""
    from pyggml.core.rope import rope_yarn_corr_dims

    return rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)


# --- ops: convolution and pooling ---


def ggml_im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                is_2D: bool, dst_type: GGMLType | int) -> Tensor:
    return ops.im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2D, as_type(dst_type))


def ggml_conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    return ops.conv_1d(ctx, a, b, s0, p0, d0)


def ggml_conv_1d_ph(ctx: Context, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    return ops.conv_1d_ph(ctx, a, b, s, d)


def ggml_conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                 d1: int) -> Tensor:
    return ops.conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1)


def ggml_conv_2d_sk_p0(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.conv_2d_sk_p0(ctx, a, b)


def ggml_conv_2d_s1_ph(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.conv_2d_s1_ph(ctx, a, b)


def ggml_conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    return ops.conv_transpose_1d(ctx, a, b, s0, p0, d0)


def ggml_pool_1d(ctx: Context, a: Tensor, op: OpPool | int, k0: int, s0: int, p0: int) -> Tensor:
    return ops.pool_1d(ctx, a, op, k0, s0, p0)


def ggml_pool_2d(ctx: Context, a: Tensor, op: OpPool | int, k0: int, k1: int, s0: int, s1: int,
                 p0: float, p1: float) -> Tensor:
    return ops.pool_2d(ctx, a, op, k0, k1, s0, s1, p0, p1)


# --- ops: custom ---


def ggml_map_custom1(ctx: Context, a: Tensor, fun: Callable[..., None], n_tasks: int, userdata: Any) -> Tensor:
    return ops.map_custom1(ctx, a, fun, n_tasks, userdata)


def ggml_map_custom1_inplace(ctx: Context, a: Tensor, fun: Callable[..., None], n_tasks: int,
                             userdata: Any) -> Tensor:
    return ops.map_custom1_inplace(ctx, a, fun, n_tasks, userdata)


def ggml_map_custom2(ctx: Context, a: Tensor, b: Tensor, fun: Callable[..., None], n_tasks: int,
                     userdata: Any) -> Tensor:
    return ops.map_custom2(ctx, a, b, fun, n_tasks, userdata)


def ggml_map_custom2_inplace(ctx: Context, a: Tensor, b: Tensor, fun: Callable[..., None], n_tasks: int,
                             userdata: Any) -> Tensor:
    return ops.map_custom2_inplace(ctx, a, b, fun, n_tasks, userdata)


def ggml_map_custom3(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable[..., None], n_tasks: int,
                     userdata: Any) -> Tensor:
    return ops.map_custom3(ctx, a, b, c, fun, n_tasks, userdata)


def ggml_map_custom3_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable[..., None],
                             n_tasks: int, userdata: Any) -> Tensor:
    return ops.map_custom3_inplace(ctx, a, b, c, fun, n_tasks, userdata)


def ggml_custom_4d(ctx: Context, type: GGMLType | int, ne0: int, ne1: int, ne2: int, ne3: int, args: list[Tensor],
                   n_args: int, fun: Callable[..., None], n_tasks: int, userdata: Any) -> Tensor:
    """CUSTOM: `args` the first n_args sources, fun(dst, ith, nth, userdata)."""
    return ops.custom_4d(ctx, as_type(type), ne0, ne1, ne2, ne3, _args(args, n_args, "ggml_custom_4d"), fun,
                         n_tasks, userdata)


def ggml_custom_inplace(ctx: Context, a: Tensor, args: list[Tensor], n_args: int, fun: Callable[..., None],
                        n_tasks: int, userdata: Any) -> Tensor:
    return ops.custom_inplace(ctx, a, _args(args, n_args, "ggml_custom_inplace"), fun, n_tasks, userdata)


def _args(args: list[Tensor], n_args: int, fn: str) -> list[Tensor]:
    n_args = check_int(n_args, f"{fn}: n_args", minimum=0)
    if n_args > len(args):
        raise ArgumentError(f"{fn}: n_args={n_args} but {len(args)} args")
    return list(args[:n_args])


# --- graphs ---


def ggml_new_graph(ctx: Context) -> Graph:
    return ctx.new_graph(GGML_DEFAULT_GRAPH_SIZE, False)


def ggml_new_graph_custom(ctx: Context, size: int, grads: bool) -> Graph:
    return ctx.new_graph(size, grads)


def ggml_graph_view(ctx: Context, cgraph: Graph, i0: int, i1: int) -> Graph:
    return ctx.graph_view(cgraph, i0, i1)


def ggml_graph_cpy(src: Graph, dst: Graph) -> None:
    src.cpy(dst)


def ggml_graph_clear(cgraph: Graph) -> None:
    cgraph.clear()


def ggml_build_forward_expand(cgraph: Graph, tensor: Tensor) -> None:
    cgraph.build_forward_expand(tensor)


def ggml_graph_get_tensor(cgraph: Graph, name: str) -> Tensor | None:
    return cgraph.get_tensor(name)


def ggml_graph_n_nodes(cgraph: Graph) -> int:
    return cgraph.n_nodes


def ggml_graph_node(cgraph: Graph, i: int) -> Tensor:
    return cgraph.node(i)


def ggml_graph_print(cgraph: Graph) -> None:
    """Log the graph's nodes and leafs (logger 'pyggml.graph', level INFO)."""
    cgraph.print()


def ggml_graph_dump_dot(gb: Graph, gf: Graph | None, filename: str) -> None:
    """Write Graphviz source of `gb` to `filename` (`gf`, the forward graph of a backward one, is unused)."""
    gb.dump_dot(filename)


def ggml_hash_size(min_sz: int) -> int:
    return hash_size(min_sz)


# --- small ops (pyggml.core.ops.misc) ---


def ggml_sin(ctx: Context, a: Tensor) -> Tensor:
    return ops.sin(ctx, a)


def ggml_sin_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.sin_inplace(ctx, a)


def ggml_cos(ctx: Context, a: Tensor) -> Tensor:
    return ops.cos(ctx, a)


def ggml_cos_inplace(ctx: Context, a: Tensor) -> Tensor:
    return ops.cos_inplace(ctx, a)


def ggml_fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    return ops.fill(ctx, a, c)


def ggml_fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    return ops.fill_inplace(ctx, a, c)


def ggml_arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    return ops.arange(ctx, start, stop, step)


def ggml_timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    return ops.timestep_embedding(ctx, timesteps, dim, max_period)


def ggml_tri(ctx: Context, a: Tensor, type: int) -> Tensor:
    return ops.tri(ctx, a, type)


def ggml_cumsum(ctx: Context, a: Tensor) -> Tensor:
    return ops.cumsum(ctx, a)


def ggml_count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.count_equal(ctx, a, b)


def ggml_l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.l2_norm(ctx, a, eps)


def ggml_l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return ops.l2_norm_inplace(ctx, a, eps)


def ggml_roll(ctx: Context, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    return ops.roll(ctx, a, shift0, shift1, shift2, shift3)


def ggml_pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    return ops.pad_reflect_1d(ctx, a, p0, p1)


def ggml_repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.repeat_back(ctx, a, b)


def ggml_solve_tri(ctx: Context, a: Tensor, b: Tensor, left: bool, lower: bool, uni: bool) -> Tensor:
    return ops.solve_tri(ctx, a, b, left, lower, uni)


def ggml_conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                        d1: int) -> Tensor:
    return ops.conv_2d_direct(ctx, a, b, s0, s1, p0, p1, d0, d1)


def ggml_conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                           dilation0: int, dilation1: int) -> Tensor:
    return ops.conv_2d_dw_direct(ctx, a, b, stride0, stride1, pad0, pad1, dilation0, dilation1)


def ggml_conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    return ops.conv_transpose_2d_p0(ctx, a, b, stride)


# --- training ops (pyggml.core.ops.train) ---


def ggml_silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.silu_back(ctx, a, b)


def ggml_rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    return ops.rms_norm_back(ctx, a, b, eps)


def ggml_soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return ops.soft_max_ext_back(ctx, a, b, scale, max_bias)


def ggml_soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return ops.soft_max_ext_back_inplace(ctx, a, b, scale, max_bias)


def ggml_get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return ops.get_rows_back(ctx, a, b, c)


def ggml_cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.cross_entropy_loss(ctx, a, b)


def ggml_cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return ops.cross_entropy_loss_back(ctx, a, b, c)


def ggml_opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor,
                        adamw_params: Tensor) -> Tensor:
    return ops.opt_step_adamw(ctx, a, grad, m, v, adamw_params)


def ggml_opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, params: Tensor) -> Tensor:
    return ops.opt_step_sgd(ctx, a, grad, params)

# --- GLU, SET_ROWS, mixture of experts (ggml.h) ---


def ggml_glu(ctx: Context, a: Tensor, op: GLUOp | int, swapped: bool) -> Tensor:
    return ops.glu(ctx, a, op, swapped)


def ggml_glu_split(ctx: Context, a: Tensor, b: Tensor, op: GLUOp | int) -> Tensor:
    return ops.glu_split(ctx, a, b, op)


def ggml_reglu(ctx: Context, a: Tensor) -> Tensor:
    return ops.reglu(ctx, a)


def ggml_reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return ops.reglu_swapped(ctx, a)


def ggml_geglu(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu(ctx, a)


def ggml_geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu_swapped(ctx, a)


def ggml_swiglu(ctx: Context, a: Tensor) -> Tensor:
    return ops.swiglu(ctx, a)


def ggml_swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    return ops.swiglu_swapped(ctx, a)


def ggml_geglu_erf(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu_erf(ctx, a)


def ggml_geglu_erf_swapped(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu_erf_swapped(ctx, a)


def ggml_geglu_quick(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu_quick(ctx, a)


def ggml_geglu_quick_swapped(ctx: Context, a: Tensor) -> Tensor:
    return ops.geglu_quick_swapped(ctx, a)


def ggml_reglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.reglu_split(ctx, a, b)


def ggml_geglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.geglu_split(ctx, a, b)


def ggml_swiglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.swiglu_split(ctx, a, b)


def ggml_geglu_erf_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.geglu_erf_split(ctx, a, b)


def ggml_geglu_quick_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return ops.geglu_quick_split(ctx, a, b)


def ggml_swiglu_oai(ctx: Context, a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
    return ops.swiglu_oai(ctx, a, b, alpha, limit)


def ggml_swiglu_clamp(ctx: Context, a: Tensor, b: Tensor, limit: float) -> Tensor:
    return ops.swiglu_clamp(ctx, a, b, limit)


def ggml_set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return ops.set_rows(ctx, a, b, c)


def ggml_add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    return ops.add_id(ctx, a, b, ids)


def ggml_mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    return ops.mul_mat_id(ctx, as_, b, ids)



# --- IM2COL_BACK, IM2COL_3D, COL2IM_1D, CONV_3D, POOL_2D_BACK (pyggml.core.ops.conv_back) ---


def ggml_im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: list[int], s0: int, s1: int, p0: int, p1: int, d0: int,
                     d1: int, is_2D: bool) -> Tensor:
    return ops.im2col_back(ctx, a, b, ne, s0, s1, p0, p1, d0, d1, is_2D)


def ggml_im2col_3d(ctx: Context, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int,
                   p2: int, d0: int, d1: int, d2: int, dst_type: GGMLType | int) -> Tensor:
    return ops.im2col_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, as_type(dst_type))


def ggml_conv_3d(ctx: Context, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                 d0: int, d1: int, d2: int) -> Tensor:
    return ops.conv_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2)


def ggml_conv_3d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                        d0: int, d1: int, d2: int, n_channels: int, n_batch: int, n_channels_out: int) -> Tensor:
    return ops.conv_3d_direct(ctx, a, b, s0, s1, s2, p0, p1, p2, d0, d1, d2, n_channels, n_batch, n_channels_out)


def ggml_col2im_1d(ctx: Context, a: Tensor, s0: int, oc: int, p0: int) -> Tensor:
    return ops.col2im_1d(ctx, a, s0, oc, p0)


def ggml_pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: OpPool | int, k0: int, k1: int, s0: int, s1: int,
                      p0: float, p1: float) -> Tensor:
    return ops.pool_2d_back(ctx, a, af, op, k0, k1, s0, s1, p0, p1)


# --- recurrent-state ops (pyggml.core.ops.ssm) ---


def ggml_ssm_conv(ctx: Context, sx: Tensor, c: Tensor) -> Tensor:
    return ops.ssm_conv(ctx, sx, c)


def ggml_ssm_scan(ctx: Context, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ids: Tensor,
                  K: int) -> Tensor:
    return ops.ssm_scan(ctx, s, x, dt, A, B, C, ids, K)


def ggml_rwkv_wkv6(ctx: Context, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    return ops.rwkv_wkv6(ctx, k, v, r, tf, td, state)


def ggml_gated_linear_attn(ctx: Context, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor,
                           scale: float) -> Tensor:
    return ops.gated_linear_attn(ctx, k, v, q, g, state, scale)


def ggml_rwkv_wkv7(ctx: Context, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
                   state: Tensor) -> Tensor:
    return ops.rwkv_wkv7(ctx, r, w, k, v, a, b, state)


def ggml_gated_delta_net(ctx: Context, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                         K: int) -> Tensor:
    return ops.gated_delta_net(ctx, q, k, v, g, beta, state, K)


# --- ROPE_BACK and SAM's ops (pyggml.core.ops.extra) ---


def ggml_rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                       n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                       beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_ext_back(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                             attn_factor, beta_fast, beta_slow)


def ggml_rope_multi_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: list[int],
                         mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                         attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return ops.rope_multi_back(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                               ext_factor, attn_factor, beta_fast, beta_slow)


def ggml_win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    return ops.win_part(ctx, a, w)


def ggml_win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    return ops.win_unpart(ctx, a, w0, h0, w)


def ggml_get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    return ops.get_rel_pos(ctx, a, qh, kh)


def ggml_add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    return ops.add_rel_pos(ctx, a, pw, ph)


def ggml_add_rel_pos_inplace(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    return ops.add_rel_pos_inplace(ctx, a, pw, ph)


def ggml_lightning_indexer(ctx: Context, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    return ops.lightning_indexer(ctx, q, k, weights, mask)


def ggml_dsv4_hc_comb(ctx: Context, mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
    return ops.dsv4_hc_comb(ctx, mixes, scale, base, eps, n_iter)


def ggml_dsv4_hc_pre(ctx: Context, x: Tensor, weights: Tensor) -> Tensor:
    return ops.dsv4_hc_pre(ctx, x, weights)


def ggml_dsv4_hc_pre_gated(ctx: Context, x: Tensor, gate: Tensor, scale: float) -> Tensor:
    return ops.dsv4_hc_pre_gated(ctx, x, gate, scale)


def ggml_dsv4_hc_post(ctx: Context, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None) -> Tensor:
    return ops.dsv4_hc_post(ctx, x, residual, post, comb)


__all__ = [name for name in dir() if name.startswith(("ggml_", "GGML_"))]
