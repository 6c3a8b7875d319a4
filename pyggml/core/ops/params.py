"""op_params as ggml lays them: one dataclass per layout, read and written here only.

A node's `op_params` are 16 int32 words. Each class below names the words of
one op (or of ops that share a layout), in ggml.c's order: fields are
consecutive words from word 0 (ints and enums one word, floats their float32
bits, `int64` two words little end first, the ROPE sections four words).
Builders write them with `params.store(tensor)` (through `set_op`), kernels of
every backend read them with `XParams.of(node)`, so a tensor's op_params mean
the same in pyggml and in C (llama.cpp 0c1e570's ggml.c builders,
ggml-cpu/ops.cpp kernels).

`OP_PARAMS` maps each op to its layout; `op_params_of(node)` reads any node's.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Self, TypeAlias

import numpy as np

from pyggml.core.errors import ArgumentError
from pyggml.core.tensor import (
    GGML_MAX_OP_PARAMS,
    GGML_MROPE_SECTIONS,
    GGMLOp,
    GLUOp,
    OpHint,
    OpPool,
    Prec,
    ScaleFlag,
    ScaleMode,
    SortOrder,
    Tensor,
    UnaryOp,
)

int64: TypeAlias = int  # a field of two words (size_t, pointers), low word first
Sections: TypeAlias = tuple[int, int, int, int]  # GGML_MROPE_SECTIONS words

_N_WORDS = GGML_MAX_OP_PARAMS // 4
_ENUMS: dict[str, type[IntEnum]] = {e.__name__: e for e in (UnaryOp, GLUOp, SortOrder, OpPool, Prec, OpHint)}
_WIDTH = {"int": 1, "bool": 1, "float": 1, "int64": 2, "Sections": GGML_MROPE_SECTIONS}


def _u32(word: int) -> int:
    return word & 0xFFFFFFFF


@functools.cache
def _layout(cls: type[OpParams]) -> tuple[tuple[str, str, int], ...]:
    """(field, kind, first word) of each field of `cls`, the kind its annotation's name."""
    out = []
    word = 0
    for f in dataclasses.fields(cls):
        kind = str(f.type)
        if kind not in _WIDTH and kind not in _ENUMS:
            raise TypeError(f"{cls.__name__}.{f.name}: op param of unknown kind {kind!r}")
        out.append((f.name, kind, word))
        word += _WIDTH.get(kind, 1)
    if word > _N_WORDS:
        raise TypeError(f"{cls.__name__}: {word} words, more than {_N_WORDS}")
    return tuple(out)


_PARSED: dict[tuple[type, bytes], OpParams] = {}  # OpParams.of's results by layout and words
_PARSED_MAX = 4096


@dataclass(frozen=True, kw_only=True)
class OpParams:
    """Base of the layouts: `of(node)` reads a node's words, `store(node)` writes them (the others zeroed)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = ()  # the ops with this layout

    @classmethod
    def of(cls, node: Tensor) -> Self:
        """The fields from `node.op_params`; ArgumentError naming the node if an enum word is no member.
        The layouts are immutable: one is made once per (layout, words) and shared (the scheduler and the
        kernels ask it for every node of every graph)."""
        words = node.op_params
        key = (cls, words.tobytes())
        done = _PARSED.get(key)
        if done is not None:
            return done  # type: ignore[return-value]
        parsed = cls._parse(node, words)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = parsed
        return parsed

    @classmethod
    def _parse(cls, node: Tensor, words: np.ndarray) -> Self:
        values: dict[str, Any] = {}
        for name, kind, i in _layout(cls):
            w = int(words[i])
            if kind == "float":
                values[name] = float(words[i: i + 1].view("<f4")[0])
            elif kind == "int":
                values[name] = w
            elif kind == "bool":
                values[name] = w != 0
            elif kind == "int64":
                values[name] = _u32(w) | _u32(int(words[i + 1])) << 32
            elif kind == "Sections":
                values[name] = tuple(int(x) for x in words[i: i + GGML_MROPE_SECTIONS])
            else:
                enum = _ENUMS[kind]
                try:
                    values[name] = enum(w)
                except ValueError:
                    valid = ", ".join(f"{m.name}={int(m)}" for m in enum)
                    raise ArgumentError(f"'{node.name}' ({node.op.name}): op param {i} ({name}) = {w} is not a "
                                        f"{enum.__name__} ({valid})") from None
        return cls(**values)

    def store(self, node: Tensor) -> None:
        """Write the fields into `node.op_params` (checked before any word changes; the rest zeroed)."""
        values: list[int | float] = []
        for name, kind, _ in _layout(type(self)):
            v = getattr(self, name)
            if kind == "float":
                values.append(float(v))
            elif kind == "int64":
                values += self._int64_words(node, name, v)
            elif kind == "Sections":
                values += list(v)
            else:
                values.append(int(v))
        node.set_op_params(values)

    @staticmethod
    def _int64_words(node: Tensor, name: str, v: int) -> list[int]:
        if not -(2**63) <= v < 2**64:
            raise ArgumentError(f"op param {name} of '{node.name}' = {v} does not fit 64 bits")
        v &= (1 << 64) - 1
        lo, hi = v & 0xFFFFFFFF, v >> 32
        return [lo - (1 << 32) if lo >= 1 << 31 else lo, hi - (1 << 32) if hi >= 1 << 31 else hi]


# --- views and copies ---


@dataclass(frozen=True, kw_only=True)
class ViewParams(OpParams):
    """VIEW: the byte offset into the source (ggml_view_impl's size_t)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.VIEW,)
    offset: int64


@dataclass(frozen=True, kw_only=True)
class PermuteParams(OpParams):
    """PERMUTE: where each source dimension goes."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.PERMUTE,)
    axis0: int
    axis1: int
    axis2: int
    axis3: int


@dataclass(frozen=True, kw_only=True)
class AccParams(OpParams):
    """ACC and SET: the window of src0 that src1 goes into (byte strides nb1..nb3 and offset, int32 in ggml)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ACC, GGMLOp.SET)
    nb1: int
    nb2: int
    nb3: int
    offset: int
    inplace: bool


@dataclass(frozen=True, kw_only=True)
class ConcatParams(OpParams):
    """CONCAT: the dimension joined."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CONCAT,)
    dim: int


@dataclass(frozen=True, kw_only=True)
class PadParams(OpParams):
    """PAD: left and right padding of each dimension (ggml_pad_ext), and whether it wraps around."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.PAD,)
    lp0: int = 0
    rp0: int = 0
    lp1: int = 0
    rp1: int = 0
    lp2: int = 0
    rp2: int = 0
    lp3: int = 0
    rp3: int = 0
    circular: bool = False

    def left(self) -> tuple[int, int, int, int]:
        return self.lp0, self.lp1, self.lp2, self.lp3

    def right(self) -> tuple[int, int, int, int]:
        return self.rp0, self.rp1, self.rp2, self.rp3


@dataclass(frozen=True, kw_only=True)
class UpscaleParams(OpParams):
    """UPSCALE: a ggml_scale_mode in the low byte, ggml_scale_flag bits above it."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.UPSCALE,)
    mode: int

    @property
    def scale_mode(self) -> int:
        """The ggml_scale_mode (a ScaleMode value when valid: kernels check)."""
        return self.mode & 0xFF

    @property
    def flags(self) -> ScaleFlag:
        return ScaleFlag(self.mode & (ScaleFlag.ALIGN_CORNERS | ScaleFlag.ANTIALIAS))

    @property
    def known(self) -> bool:
        """Whether the mode is a ScaleMode and only known flags are set."""
        known_flags = int(ScaleFlag.ALIGN_CORNERS | ScaleFlag.ANTIALIAS)
        return self.scale_mode < len(ScaleMode) and (self.mode & ~0xFF & ~known_flags) == 0


# --- element-wise ---


@dataclass(frozen=True, kw_only=True)
class UnaryParams(OpParams):
    """UNARY: the function; XIELU's parameters after it (ggml_xielu: softplus'd alphas, beta, eps)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.UNARY,)
    op: UnaryOp
    alpha_n: float = 0.0
    alpha_p: float = 0.0
    beta: float = 0.0
    eps: float = 0.0


@dataclass(frozen=True, kw_only=True)
class GLUParams(OpParams):
    """GLU: the function, whether the halves are swapped, SWIGLU_OAI's alpha and the clamp limit."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.GLU,)
    op: GLUOp
    swapped: bool = False
    alpha: float = 0.0
    limit: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LeakyReluParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.LEAKY_RELU,)
    negative_slope: float


@dataclass(frozen=True, kw_only=True)
class ScaleParams(OpParams):
    """SCALE: x * s + b."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.SCALE,)
    s: float
    b: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ClampParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CLAMP,)
    min: float
    max: float


# --- norms, attention, positions ---


@dataclass(frozen=True, kw_only=True)
class NormParams(OpParams):
    """NORM, RMS_NORM, RMS_NORM_BACK, L2_NORM: eps."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.NORM, GGMLOp.RMS_NORM, GGMLOp.RMS_NORM_BACK, GGMLOp.L2_NORM)
    eps: float


@dataclass(frozen=True, kw_only=True)
class GroupNormParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.GROUP_NORM,)
    n_groups: int
    eps: float


@dataclass(frozen=True, kw_only=True)
class SoftMaxParams(OpParams):
    """SOFT_MAX: softmax(x * scale + slope * mask), the ALiBi slope from max_bias (none when 0)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.SOFT_MAX, GGMLOp.SOFT_MAX_BACK)
    scale: float = 1.0
    max_bias: float = 0.0


@dataclass(frozen=True, kw_only=True)
class MulMatParams(OpParams):
    """MUL_MAT: the accumulator precision (ggml_prec_set_acc) and what src0 is (ggml_mul_mat_set_hint)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.MUL_MAT,)
    prec: Prec = Prec.DEFAULT
    hint: OpHint = OpHint.NONE


@dataclass(frozen=True, kw_only=True)
class FlashAttnExtParams(OpParams):
    """FLASH_ATTN_EXT (ggml_flash_attn_ext): scale, ALiBi max_bias, logit_softcap (0: none); prec in word 3
    (ggml_prec_set_acc); n_kv_max in word 4 (ggml_flash_attn_ext_set_n_kv_max, 0: dense; ggml's CPU ignores it)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.FLASH_ATTN_EXT,)
    scale: float = 1.0
    max_bias: float = 0.0
    logit_softcap: float = 0.0
    prec: Prec = Prec.DEFAULT
    n_kv_max: int = 0


@dataclass(frozen=True, kw_only=True)
class DiagMaskParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.DIAG_MASK_INF, GGMLOp.DIAG_MASK_ZERO)
    n_past: int


@dataclass(frozen=True, kw_only=True)
class RopeParams(OpParams):
    """ROPE, ROPE_BACK (ggml_rope_impl): n_past and n_ctx are 0 today; the sections are multi-rope's (the
    MROPE bit of mode); n_offs (word 15) rotates from that dimension on (ggml_rope_set_offset)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ROPE, GGMLOp.ROPE_BACK)
    n_past: int = 0
    n_dims: int
    mode: int
    n_ctx: int = 0
    n_ctx_orig: int = 0
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 0.0
    beta_slow: float = 0.0
    sections: Sections = (0, 0, 0, 0)
    n_offs: int = 0


@dataclass(frozen=True, kw_only=True)
class ArgsortParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ARGSORT,)
    order: SortOrder


# --- convolution and pooling ---


@dataclass(frozen=True, kw_only=True)
class Im2colParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.IM2COL, GGMLOp.IM2COL_BACK)
    s0: int
    s1: int
    p0: int
    p1: int
    d0: int
    d1: int
    is_2D: bool


@dataclass(frozen=True, kw_only=True)
class ConvTranspose1dParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CONV_TRANSPOSE_1D,)
    s0: int
    p0: int
    d0: int


@dataclass(frozen=True, kw_only=True)
class Pool1dParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.POOL_1D,)
    op: OpPool
    k0: int
    s0: int
    p0: int


@dataclass(frozen=True, kw_only=True)
class Pool2dParams(OpParams):
    """POOL_2D, POOL_2D_BACK: paddings are ints in the words (ggml converts its float arguments)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.POOL_2D, GGMLOp.POOL_2D_BACK)
    op: OpPool
    k0: int
    k1: int
    s0: int
    s1: int
    p0: int
    p1: int


# --- misc (pyggml.core.ops.misc) ---


@dataclass(frozen=True, kw_only=True)
class FillParams(OpParams):
    """FILL: the constant."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.FILL,)
    c: float


@dataclass(frozen=True, kw_only=True)
class ArangeParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ARANGE,)
    start: float
    stop: float
    step: float


@dataclass(frozen=True, kw_only=True)
class TriParams(OpParams):
    """TRI: a ggml_tri_type (TriType value; kernels check it)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.TRI,)
    type: int


@dataclass(frozen=True, kw_only=True)
class RollParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ROLL,)
    shift0: int
    shift1: int
    shift2: int
    shift3: int


@dataclass(frozen=True, kw_only=True)
class PadReflect1dParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.PAD_REFLECT_1D,)
    p0: int
    p1: int


@dataclass(frozen=True, kw_only=True)
class Conv2dParams(OpParams):
    """CONV_2D (ggml_conv_2d_direct) and CONV_2D_DW (ggml_conv_2d_dw_direct)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CONV_2D, GGMLOp.CONV_2D_DW)
    s0: int
    s1: int
    p0: int
    p1: int
    d0: int
    d1: int


@dataclass(frozen=True, kw_only=True)
class ConvTranspose2dParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CONV_TRANSPOSE_2D,)
    stride: int


@dataclass(frozen=True, kw_only=True)
class TimestepEmbeddingParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.TIMESTEP_EMBEDDING,)
    dim: int
    max_period: int


# --- custom ---


@dataclass(frozen=True, kw_only=True)
class CustomParams(OpParams):
    """MAP_CUSTOM1/2/3 and CUSTOM: ggml's struct {fun, n_tasks, userdata} on a 64-bit machine (a pointer, an
    int, 4 bytes of padding, a pointer). pyggml's function and userdata are Python objects kept beside the
    node (`pyggml.core.ops.custom`): their pointer words stay 0; n_tasks is where C has it."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3, GGMLOp.CUSTOM)
    fun: int64 = 0
    n_tasks: int
    padding: int = 0
    userdata: int64 = 0


OP_PARAMS: dict[GGMLOp, type[OpParams]] = {
    op: cls
    for cls in (ViewParams, PermuteParams, AccParams, ConcatParams, PadParams, UpscaleParams, UnaryParams,
                GLUParams, LeakyReluParams, ScaleParams, ClampParams, NormParams, GroupNormParams, SoftMaxParams,
                DiagMaskParams, RopeParams, ArgsortParams, Im2colParams, ConvTranspose1dParams, Pool1dParams,
                FlashAttnExtParams, MulMatParams,
                Pool2dParams, CustomParams, FillParams, ArangeParams, TriParams, RollParams, PadReflect1dParams,
                TimestepEmbeddingParams, Conv2dParams, ConvTranspose2dParams)
    for op in cls.ops
}


def op_params_of(node: Tensor) -> OpParams | None:
    """The op_params of `node` by its op's layout, or None for an op whose words pyggml does not name."""
    cls = OP_PARAMS.get(node.op)
    return None if cls is None else cls.of(node)


__all__ = [
    "OP_PARAMS", "AccParams", "ArangeParams", "FillParams", "PadReflect1dParams", "RollParams",
    "TimestepEmbeddingParams", "TriParams", "Conv2dParams", "ConvTranspose2dParams",
    "ArgsortParams", "ClampParams", "ConcatParams", "ConvTranspose1dParams",
    "CustomParams", "DiagMaskParams", "GLUParams", "GroupNormParams", "Im2colParams", "LeakyReluParams",
    "FlashAttnExtParams", "MulMatParams",
    "NormParams", "OpParams", "PadParams", "PermuteParams", "Pool1dParams", "Pool2dParams", "RopeParams",
    "ScaleParams", "SoftMaxParams", "UnaryParams", "UpscaleParams", "ViewParams", "op_params_of",
]


# --- IM2COL_3D, COL2IM_1D, CONV_3D (pyggml.core.ops.conv_back; IM2COL_BACK and POOL_2D_BACK share the forward
# ops' layouts above) ---


@dataclass(frozen=True, kw_only=True)
class Im2col3dParams(OpParams):
    """IM2COL_3D: strides, paddings, dilations (width, height, depth) and the input channels IC."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.IM2COL_3D,)
    s0: int
    s1: int
    s2: int
    p0: int
    p1: int
    p2: int
    d0: int
    d1: int
    d2: int
    IC: int


@dataclass(frozen=True, kw_only=True)
class Col2im1dParams(OpParams):
    """COL2IM_1D: stride, output channels, padding cropped from both ends."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.COL2IM_1D,)
    s0: int
    oc: int
    p0: int


@dataclass(frozen=True, kw_only=True)
class Conv3dParams(OpParams):
    """CONV_3D (ggml_conv_3d_direct): strides, paddings, dilations (width, height, depth), then the input
    channels c, the batch n and the output channels oc."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.CONV_3D,)
    s0: int
    s1: int
    s2: int
    p0: int
    p1: int
    p2: int
    d0: int
    d1: int
    d2: int
    c: int
    n: int
    oc: int


OP_PARAMS.update({op: cls for cls in (Im2col3dParams, Col2im1dParams, Conv3dParams) for op in cls.ops})
__all__ += ["Col2im1dParams", "Conv3dParams", "Im2col3dParams"]


# --- recurrent-state ops (pyggml.core.ops.ssm) ---


@dataclass(frozen=True, kw_only=True)
class SsmScanParams(OpParams):
    """SSM_SCAN: K, the number of state slots kept (the final state and K - 1 before it)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.SSM_SCAN,)
    K: int


@dataclass(frozen=True, kw_only=True)
class GatedLinearAttnParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.GATED_LINEAR_ATTN,)
    scale: float


@dataclass(frozen=True, kw_only=True)
class GatedDeltaNetParams(OpParams):
    """GATED_DELTA_NET: K, the number of state snapshot slots."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.GATED_DELTA_NET,)
    K: int


for _cls in (SsmScanParams, GatedLinearAttnParams, GatedDeltaNetParams):
    OP_PARAMS.update(dict.fromkeys(_cls.ops, _cls))
__all__ += ["GatedDeltaNetParams", "GatedLinearAttnParams", "SsmScanParams"]


# --- SAM's windows and relative positions (pyggml.core.ops.extra) ---


@dataclass(frozen=True, kw_only=True)
class WinPartParams(OpParams):
    """WIN_PART: windows along ne[1] (npx) and ne[2] (npy), the window size w."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.WIN_PART,)
    npx: int
    npy: int
    w: int


@dataclass(frozen=True, kw_only=True)
class WinUnpartParams(OpParams):
    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.WIN_UNPART,)
    w: int


@dataclass(frozen=True, kw_only=True)
class AddRelPosParams(OpParams):
    """ADD_REL_POS: whether dst is a view of src0 (ggml then skips the copy)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.ADD_REL_POS,)
    inplace: bool


@dataclass(frozen=True, kw_only=True)
class Dsv4HcCombParams(OpParams):
    """DSV4_HC_COMB: the eps of the normalizations and how many row/column rounds (n_iter > 0)."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.DSV4_HC_COMB,)
    eps: float
    n_iter: int


@dataclass(frozen=True, kw_only=True)
class Dsv4HcPreParams(OpParams):
    """DSV4_HC_PRE: the result's scale, and whether src1 is a per-element gate (sigmoid) or per-stream weights."""

    ops: ClassVar[tuple[GGMLOp, ...]] = (GGMLOp.DSV4_HC_PRE,)
    scale: float
    gated: bool


OP_PARAMS.update({op: cls for cls in (WinPartParams, WinUnpartParams, AddRelPosParams, Dsv4HcCombParams,
                                      Dsv4HcPreParams) for op in cls.ops})
__all__ += ["AddRelPosParams", "Dsv4HcCombParams", "Dsv4HcPreParams", "WinPartParams", "WinUnpartParams"]
