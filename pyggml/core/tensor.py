"""`Tensor`: ggml's `struct ggml_tensor` (ggml.h), its enums, and the layout helpers of ggml.c.

A tensor owns no memory: `data` is an integer address (or None) in `buffer`; views point into `view_src`.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Sequence
from enum import IntEnum, IntFlag
from typing import TYPE_CHECKING, Any

import numpy as np

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, ArgumentTypeError, OutOfBoundsError
from pyggml.core.types import TYPE_TRAITS, GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
GGML_MAX_OP_PARAMS = 64  # bytes: 16 int32 words
GGML_MAX_NE = 2**63 - 1  # ne and nb are int64_t/size_t in ggml
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)


class GGMLOp(IntEnum):
    """ggml's `enum ggml_op` as ggml.h of llama.cpp 0c1e570 numbers it (GGML_OP_<name>)."""

    NONE = 0
    DUP = 1
    ADD = 2
    ADD_ID = 3
    ADD1 = 4
    ACC = 5
    SUB = 6
    MUL = 7
    DIV = 8
    SQR = 9
    SQRT = 10
    LOG = 11
    SIN = 12
    COS = 13
    SUM = 14
    SUM_ROWS = 15
    CUMSUM = 16
    MEAN = 17
    ARGMAX = 18
    COUNT_EQUAL = 19
    REPEAT = 20
    REPEAT_BACK = 21
    CONCAT = 22
    SILU_BACK = 23
    NORM = 24
    RMS_NORM = 25
    RMS_NORM_BACK = 26
    GROUP_NORM = 27
    L2_NORM = 28
    MUL_MAT = 29
    MUL_MAT_ID = 30
    OUT_PROD = 31
    SCALE = 32
    SET = 33
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    GET_ROWS_BACK = 41
    SET_ROWS = 42
    DIAG = 43
    DIAG_MASK_INF = 44
    DIAG_MASK_ZERO = 45
    SOFT_MAX = 46
    SOFT_MAX_BACK = 47
    ROPE = 48
    ROPE_BACK = 49
    CLAMP = 50
    CONV_TRANSPOSE_1D = 51
    IM2COL = 52
    IM2COL_BACK = 53
    IM2COL_3D = 54
    COL2IM_1D = 55
    CONV_2D = 56
    CONV_3D = 57
    CONV_2D_DW = 58
    CONV_TRANSPOSE_2D = 59
    POOL_1D = 60
    POOL_2D = 61
    POOL_2D_BACK = 62
    UPSCALE = 63
    PAD = 64
    PAD_REFLECT_1D = 65
    ROLL = 66
    ARANGE = 67
    TIMESTEP_EMBEDDING = 68
    ARGSORT = 69
    TOP_K = 70
    LEAKY_RELU = 71
    TRI = 72
    FILL = 73
    FLASH_ATTN_EXT = 74
    FLASH_ATTN_BACK = 75
    SSM_CONV = 76
    SSM_SCAN = 77
    WIN_PART = 78
    WIN_UNPART = 79
    GET_REL_POS = 80
    ADD_REL_POS = 81
    RWKV_WKV6 = 82
    GATED_LINEAR_ATTN = 83
    RWKV_WKV7 = 84
    SOLVE_TRI = 85
    GATED_DELTA_NET = 86
    LIGHTNING_INDEXER = 87
    DSV4_HC_COMB = 88
    DSV4_HC_PRE = 89
    DSV4_HC_POST = 90
    UNARY = 91
    MAP_CUSTOM1 = 92
    MAP_CUSTOM2 = 93
    MAP_CUSTOM3 = 94
    CUSTOM = 95
    CROSS_ENTROPY_LOSS = 96
    CROSS_ENTROPY_LOSS_BACK = 97
    OPT_STEP_ADAMW = 98
    OPT_STEP_SGD = 99
    GLU = 100


GGML_OP_COUNT = 101  # ggml.c: static_assert(GGML_OP_COUNT == 101)


class UnaryOp(IntEnum):
    """ggml's `enum ggml_unary_op` (GGML_UNARY_OP_<name>): UNARY's function, in op_params[0]."""

    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13
    EXPM1 = 14
    SOFTPLUS = 15
    GELU_ERF = 16
    XIELU = 17
    FLOOR = 18
    CEIL = 19
    ROUND = 20
    TRUNC = 21


GGML_UNARY_OP_COUNT = 22


class GLUOp(IntEnum):
    """ggml's `enum ggml_glu_op` (GGML_GLU_OP_<name>): GLU's function, in op_params[0]."""

    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    SWIGLU_OAI = 3
    GEGLU_ERF = 4
    GEGLU_QUICK = 5
    SWIGLU_CLAMP = 6


GGML_GLU_OP_COUNT = 7


class SortOrder(IntEnum):
    """ggml's `enum ggml_sort_order` (GGML_SORT_ORDER_<name>): ARGSORT's op_params[0]."""

    ASC = 0
    DESC = 1


class Prec(IntEnum):
    """ggml's `enum ggml_prec`: MUL_MAT, MUL_MAT_ID and FLASH_ATTN_EXT's precision word (DEFAULT = UNDEFINED)."""

    UNDEFINED = 0
    DEFAULT = 0
    F32 = 10
    BF16 = 15
    F16 = 20
    Q8 = 30
    Q4 = 40


class OpHint(IntEnum):
    """ggml's `enum ggml_op_hint` (GGML_HINT_<name>): MUL_MAT's op_params[1]."""

    NONE = 0
    SRC0_IS_HADAMARD = 1


class ScaleMode(IntEnum):
    """ggml's `enum ggml_scale_mode` (GGML_SCALE_MODE_<name>): the low byte of UPSCALE's op_params[0]."""

    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


GGML_SCALE_MODE_COUNT = 3


class ScaleFlag(IntFlag):
    """ggml's `enum ggml_scale_flag` (GGML_SCALE_FLAG_<name>): bits above the mode in UPSCALE's op_params[0]."""

    ALIGN_CORNERS = 1 << 8
    ANTIALIAS = 1 << 9


class TriType(IntEnum):
    """ggml's `enum ggml_tri_type` (GGML_TRI_TYPE_<name>): TRI's op_params[0]."""

    UPPER_DIAG = 0
    UPPER = 1
    LOWER_DIAG = 2
    LOWER = 3


class OpPool(IntEnum):
    """ggml's `enum ggml_op_pool` (GGML_OP_POOL_<name>): POOL_1D/POOL_2D's op_params[0]."""

    MAX = 0
    AVG = 1


GGML_OP_POOL_COUNT = 2

# ROPE's mode (op_params[2]): ggml.h's GGML_ROPE_TYPE_*; VISION and IMROPE are MROPE with more bits
GGML_ROPE_TYPE_NORMAL = 0
GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40
GGML_MROPE_SECTIONS = 4


class TensorFlag(IntFlag):
    """ggml's `enum ggml_tensor_flag` (GGML_TENSOR_FLAG_<name>)."""

    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


VIEW_OPS = frozenset({GGMLOp.VIEW, GGMLOp.RESHAPE, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE})


def is_view_op(op: GGMLOp) -> bool:
    """ggml_is_view_op: ops whose result is a view of src[0] (no compute)."""
    return op in VIEW_OPS


class Tensor:
    """ggml's tensor. Build tensors through a `Context`, not directly."""

    __slots__ = (
        "type", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs",
        "data", "buffer", "name", "extra", "ctx", "__weakref__",
    )

    def __init__(self, ctx: Context | None, type: GGMLType, ne: list[int], nb: list[int] | None = None) -> None:
        self.type: GGMLType = type
        self.ne: list[int] = list(ne) + [1] * (GGML_MAX_DIMS - len(ne))
        if nb is None:
            nb = default_strides(type, self.ne)
        self.nb: list[int] = list(nb)
        self.op: GGMLOp = GGMLOp.NONE
        self.op_params: np.ndarray = np.zeros(GGML_MAX_OP_PARAMS // 4, dtype=np.int32)
        self.flags: TensorFlag = TensorFlag(0)
        self.src: list[Tensor | None] = [None] * GGML_MAX_SRC
        self.view_src: Tensor | None = None
        self.view_offs: int = 0
        self.data: int | None = None
        self.buffer: Any = None  # a Buffer: typed loosely, core does not import the backend layer
        self.name: str = ""
        self.extra: Any = None  # backend-specific per-tensor data (ggml's `extra`)
        self.ctx: Context | None = ctx

    def set_op_params(self, values: list[int | float] | tuple[int | float, ...]) -> None:
        """Ints as int32 words, floats as their float32 bits; all checked before any word is written."""
        n_max = GGML_MAX_OP_PARAMS // 4
        if len(values) > n_max:
            raise ArgumentError(f"{len(values)} op params for '{self.name}', at most {n_max} ({self.op.name})")
        words = [self._op_param_word(i, v) for i, v in enumerate(values)]
        self.op_params[:] = 0
        self.op_params[: len(words)] = words

    def _op_param_word(self, i: int, v: object) -> int:
        """One op param as its int32 word: an int that fits int32, or a float that fits float32 (its bits)."""
        if type(v) is int and _INT32_MIN <= v <= _INT32_MAX:
            return v
        if type(v) is float and (abs(v) <= _F32_MAX or not math.isfinite(v)):
            return struct.unpack("<i", struct.pack("<f", v))[0]
        what = f"op param {i} of '{self.name}' ({self.op.name})"
        if isinstance(v, numbers.Integral):  # bools too: ggml stores them as 0/1
            if not _INT32_MIN <= int(v) <= _INT32_MAX:
                raise ArgumentError(f"{what} = {int(v)} does not fit an int32 word")
            return int(v)
        if isinstance(v, numbers.Real):  # np.float32 is not a float
            f = float(v)
            if math.isfinite(f) and abs(f) > _F32_MAX:
                raise ArgumentError(f"{what} = {f!r} does not fit a float32")
            return struct.unpack("<i", struct.pack("<f", f))[0]
        raise ArgumentTypeError(f"{what} must be an int or a float, got {type(v).__name__} {v!r:.80}")

    def _op_param_index(self, i: object) -> int:
        n_max = GGML_MAX_OP_PARAMS // 4
        if type(i) is int and 0 <= i < n_max:
            return i
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= int(i) < n_max:
            raise OutOfBoundsError(f"op param index {i!r} of '{self.name}' is outside [0, {n_max})")
        return int(i)

    def get_op_params_i32(self, i: int) -> int:
        return int(self.op_params[self._op_param_index(i)])

    def get_op_params_f32(self, i: int) -> float:
        i = self._op_param_index(i)
        return float(self.op_params[i : i + 1].view(np.float32)[0])

    def set_op_params_i32(self, i: int, value: int) -> None:
        i = self._op_param_index(i)
        self.op_params[i] = check_int(value, f"op param {i} of '{self.name}'", minimum=_INT32_MIN,
                                      maximum=_INT32_MAX)

    def set_op_params_f32(self, i: int, value: float) -> None:
        i = self._op_param_index(i)
        self.op_params[i] = self._op_param_word(i, float(value) if isinstance(value, numbers.Real) else value)

    def set_input(self) -> Tensor:
        self.flags |= TensorFlag.INPUT
        return self

    def set_output(self) -> Tensor:
        self.flags |= TensorFlag.OUTPUT
        return self

    def set_param(self) -> Tensor:
        self.flags |= TensorFlag.PARAM
        return self

    @property
    def is_param(self) -> bool:
        return bool(self.flags & TensorFlag.PARAM)

    def set_name(self, name: str) -> Tensor:
        if not isinstance(name, str):
            check_instance(name, str, f"name of tensor '{self.name}'")
        self.name = name[: GGML_MAX_NAME - 1]
        return self

    def format_name(self, fmt: str, *args: object) -> Tensor:
        return self.set_name(fmt % args if args else fmt)

    def get_name(self) -> str:
        return self.name

    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    def nrows(self) -> int:
        ne = self.ne
        return ne[1] * ne[2] * ne[3]

    def nbytes(self) -> int:
        """ggml_nbytes: the bytes from the first to one past the last element."""
        return nbytes_of(self.type, self.ne, self.nb)

    def element_size(self) -> int:
        return TYPE_TRAITS[self.type].type_size

    def row_size(self) -> int:
        tr = TYPE_TRAITS[self.type]
        return self.ne[0] * tr.type_size // tr.blck_size

    def n_dims(self) -> int:
        """ggml_n_dims: index of the last dimension above 1, plus one (at least 1)."""
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    def is_contiguous(self) -> bool:
        tr = TYPE_TRAITS[self.type]
        ne, nb = self.ne, self.nb
        return (
            nb[0] == tr.type_size
            and nb[1] == nb[0] * ne[0] // tr.blck_size
            and nb[2] == nb[1] * ne[1]
            and nb[3] == nb[2] * ne[2]
        )

    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    def is_scalar(self) -> bool:
        return self.ne == [1, 1, 1, 1]

    def is_vector(self) -> bool:
        return self.ne[1] == 1 and self.ne[2] == 1 and self.ne[3] == 1

    def is_matrix(self) -> bool:
        return self.ne[2] == 1 and self.ne[3] == 1

    def is_view(self) -> bool:
        return self.view_src is not None

    def numpy(self) -> np.ndarray:
        """A zero-copy numpy view of host memory: reversed `ne` and `nb`, quantized types as raw blocks."""
        from pyggml.core.memory import tensor_view

        return tensor_view(self)

    def __repr__(self) -> str:
        ne = "x".join(str(n) for n in self.ne[: self.n_dims()])
        return f"Tensor('{self.name}', {self.type.name}, ne={ne}, op={self.op.name})"


def check_ne(ne: object, what: str) -> list[int]:
    """A shape of 1 to 4 ints in [0, 2^63) padded to 4 with 1s (0: ggml's empty tensor)."""
    if type(ne) is list or type(ne) is tuple:
        if 1 <= len(ne) <= GGML_MAX_DIMS:
            for n in ne:
                if type(n) is not int or n < 0 or n > GGML_MAX_NE:
                    break
            else:
                return list(ne) + [1] * (GGML_MAX_DIMS - len(ne))
    elif isinstance(ne, (str, bytes)) or not isinstance(ne, (Sequence, np.ndarray)):
        raise ArgumentTypeError(f"{what}: ne must be a sequence of ints, got {type(ne).__name__} {ne!r:.80}")
    if not 1 <= len(ne) <= GGML_MAX_DIMS:
        raise ArgumentError(f"{what}: a tensor has 1 to {GGML_MAX_DIMS} dimensions, got {len(ne)} (ne={list(ne)})")
    out = [check_int(n, f"{what}: ne[{i}]", minimum=0, maximum=GGML_MAX_NE) for i, n in enumerate(ne)]
    return out + [1] * (GGML_MAX_DIMS - len(out))


def strides(type: GGMLType, ne: list[int], nb_given: Sequence[int] = ()) -> list[int]:
    """ggml's strides for `ne`: `nb_given`, then each the previous times the previous dimension (as
    ggml_new_tensor_impl and ggml_view_2d/3d fill them)."""
    tr = TYPE_TRAITS[type]
    nb = list(nb_given[:GGML_MAX_DIMS]) or [tr.type_size]
    for i in range(len(nb), GGML_MAX_DIMS):
        nb.append(nb[i - 1] * (ne[i - 1] // tr.blck_size if i == 1 else ne[i - 1]))
    return nb


def default_strides(type: GGMLType, ne: list[int]) -> list[int]:
    """Strides of a contiguous tensor (ggml_new_tensor_impl): rows padded to whole blocks."""
    return strides(type, ne)


def nbytes_of(type: GGMLType, ne: list[int], nb: list[int]) -> int:
    """ggml_nbytes for a type, shape and strides: one past the last byte touched (0 for an empty tensor)."""
    n0, n1, n2, n3 = ne  # unrolled: hot
    if n0 <= 0 or n1 <= 0 or n2 <= 0 or n3 <= 0:
        return 0
    tr = TYPE_TRAITS[type]
    b0, b1, b2, b3 = nb
    rest = (n1 - 1) * b1 + (n2 - 1) * b2 + (n3 - 1) * b3
    if tr.blck_size == 1:
        return tr.type_size + (n0 - 1) * b0 + rest
    return n0 * b0 // tr.blck_size + rest


def check_window(what: str, type: GGMLType, ne: list[int], nb: list[int], offset: int, src: Tensor,
                 src_nbytes: int | None = None, kind: str = "view") -> None:
    """OutOfBoundsError unless (type, ne, nb) at `offset` lies inside `src`: the bounds rule of views and of
    ACC's and SET's windows (an empty window must start inside or just past `src`)."""
    size = src.nbytes() if src_nbytes is None else src_nbytes
    if offset < 0:
        raise OutOfBoundsError(f"{what}: offset {offset} is negative: it starts before '{src.name}' ({size} bytes)")
    extent = nbytes_of(type, ne, nb)
    if offset + extent > size or offset > size:
        raise OutOfBoundsError(
            f"{what}: {kind} of {extent} bytes at offset {offset} is outside '{src.name}' ({size} bytes): "
            f"ne={ne}, nb={nb} reach byte {offset + extent - 1}"
        )


def are_same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def are_same_layout(a: Tensor, b: Tensor) -> bool:
    """Same type, `ne` and `nb` (ggml_are_same_layout)."""
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def divides(n: int, m: int) -> bool:
    """m is a whole number of n's (broadcasting's rule), with 0 dividing only 0 (empty tiles only empty)."""
    return m % n == 0 if n > 0 else m == 0


def can_repeat(a: Tensor, b: Tensor) -> bool:
    """ggml_can_repeat: `a` tiles `b` (each of b's dims a multiple of a's)."""
    if a.nelements() == 0:
        return b.nelements() == 0
    return all(b.ne[i] % a.ne[i] == 0 for i in range(GGML_MAX_DIMS))


def can_repeat_rows(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and can_repeat(a, b)


def shape_str(t: Tensor) -> str:
    """'name' [ne0, ne1, ne2, ne3] type, for error messages."""
    return f"'{t.name}' {t.type.name}{list(t.ne)}"
