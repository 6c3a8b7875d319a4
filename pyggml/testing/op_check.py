"""The op checker, like ggml's test-backend-ops: every op on a backend against a reference, pyggml's CPU
backend or real ggml (`run(..., against="ggml")`: llama.cpp's libggml through `pyggml.testing.ggml_c`).

Each case builds a small graph (op builder, types, shapes; broadcast and
non-contiguous sources included) twice, once per backend, fills the leafs of
both with the same random values, computes both and compares the output by
normalized mean squared error, `sum((a - b)^2) / sum(a^2)` with `a` the
backend under test, against ggml's thresholds: 1e-7, 5e-4 for MUL_MAT, 1e-3
for ROPE. As in ggml, NaN anywhere fails, and infinities must agree in place
and sign (they are left out of the NMSE).

A case whose builder is not in `pyggml.core` yet, or whose op either backend
does not support, is listed as "not supported" and does not fail the run; so
is a case in the reference's short list of limits (`GGML_LIMITS`). The table
ends with one line per op: cases, passed, failed, not supported.
"""

from __future__ import annotations

import logging
import math
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.quants import FROM_FLOAT_TYPES
from pyggml.core.tensor import (
    GGML_ROPE_TYPE_IMROPE,
    GGML_ROPE_TYPE_MROPE,
    GGML_ROPE_TYPE_NEOX,
    GGML_ROPE_TYPE_NORMAL,
    GGML_ROPE_TYPE_VISION,
    GGMLOp,
    OpPool,
    ScaleFlag,
    ScaleMode,
    SortOrder,
    Tensor,
    UnaryOp,
    is_view_op,
)
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend import Backend, init_backend, op_desc, tensor_get_numpy, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors
from pyggml.testing.random_blocks import random_blocks

log = logging.getLogger("pyggml.op_check")

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
QUANT_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q1_0,
               GGMLType.Q2_0, GGMLType.MXFP4, GGMLType.NVFP4,
               GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
               GGMLType.TQ2_0, GGMLType.TQ1_0,
               GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ1_S, GGMLType.IQ1_M,
               GGMLType.IQ4_NL, GGMLType.IQ3_S, GGMLType.IQ4_XS]
# ggml's all_types of test-backend-ops, and BF16
ALL_TYPES = [F32, F16, BF16, *QUANT_TYPES]

MAX_NMSE = 1e-7
MAX_NMSE_MUL_MAT = 5e-4
MAX_NMSE_ROPE = 1e-3



class MissingBuilder(Exception):
    """The op builder a case needs is not in pyggml.core yet."""


def op(ctx: Context, name: str) -> Callable[..., Tensor]:
    """The op builder `name` of a context (ctx.<name>), or MissingBuilder."""
    fn = getattr(ctx, name, None)
    if fn is None:
        from pyggml.core import ops

        builder = getattr(ops, name, None)
        if builder is None:
            raise MissingBuilder(name)
        return lambda *args, **kw: builder(ctx, *args, **kw)
    return fn


def new(ctx: Context, name: str, type: GGMLType, ne: list[int]) -> Tensor:
    return ctx.new_tensor(type, ne).set_name(name)


def permuted(ctx: Context, name: str, type: GGMLType, ne: list[int], axes: tuple[int, int, int, int]) -> Tensor:
    """A non-contiguous view with shape `ne`: ggml_permute(base, *axes) of a contiguous leaf named `name`."""
    base_ne = [ne[axes[i]] for i in range(4)]
    base = new(ctx, name, type, base_ne)
    return op(ctx, "permute")(base, *axes)


def transposed(ctx: Context, name: str, type: GGMLType, ne: list[int]) -> Tensor:
    return permuted(ctx, name, type, ne, (1, 0, 2, 3))


Init = Callable[[np.random.Generator, Tensor], np.ndarray]


@dataclass
class OpCase:
    """One line of the table: `build(ctx)` returns the output; `inits` fills named leafs specially."""

    label: str  # what -o matches, ggml's op desc ("ADD", "GELU", ...)
    desc: str
    build: Callable[[Context], Tensor]
    inits: dict[str, Init] = field(default_factory=dict)
    max_nmse: float = MAX_NMSE
    sort_rows: bool = False  # the op promises no order within a row (TOP_K): rows are sorted before comparing


@dataclass
class CaseResult:
    case: OpCase
    status: str  # "OK", "FAIL", "not supported"
    nmse: float | None = None
    detail: str = ""


# --- leaf values ---


def uniform(lo: float = -1.0, hi: float = 1.0) -> Init:
    return lambda rng, t: rng.uniform(lo, hi, t.nelements()).astype(np.float32)


def away_from_zero(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """Magnitudes in [0.5, 1.5), random sign: divisors."""
    n = t.nelements()
    return (rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def indices(limit: int) -> Init:
    return lambda rng, t: rng.integers(0, limit, t.nelements()).astype(np.int32)


def distinct(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """Distinct values in each row (argsort and top-k have no ties to break differently)."""
    rows = t.nelements() // t.ne[0]
    return np.stack([rng.permutation(t.ne[0]) for _ in range(rows)]).astype(np.float32).ravel() / t.ne[0]


def default_values(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    if t.type not in FROM_FLOAT_TYPES:  # the lattice types: random blocks, as bytes
        return random_blocks(t.type, (t.nelements(),), rng)
    if TYPE_TRAITS[t.type].np_dtype is not None and np.issubdtype(TYPE_TRAITS[t.type].np_dtype, np.integer) \
            and t.type != BF16:
        return rng.integers(0, 8, t.nelements()).astype(np.int32)
    return rng.uniform(-1.0, 1.0, t.nelements()).astype(np.float32)


# --- the cases ---


def _ne(ne: list[int]) -> str:
    return "[" + ",".join(str(n) for n in ne) + "]"


def _t(type: GGMLType) -> str:
    return TYPE_TRAITS[type].name


def bin_bcast_cases() -> list[OpCase]:
    cases = []
    shapes = [([1, 1, 8, 1], [1, 1, 1, 1]), ([1, 1, 1, 1], [32, 1, 1, 1]), ([1, 1, 320, 320], [1, 1, 1, 1]),
              ([16, 10, 1, 1], [1, 1, 1, 1]), ([16, 10, 10, 10], [1, 1, 1, 1]), ([16, 10, 10, 10], [2, 1, 1, 1]),
              ([16, 10, 10, 10], [1, 2, 1, 1]), ([16, 10, 10, 10], [1, 1, 2, 1]), ([16, 10, 10, 10], [1, 1, 1, 2]),
              ([16, 10, 10, 10], [1, 1, 2, 2]), ([16, 10, 10, 10], [1, 2, 2, 2]), ([16, 10, 10, 10], [2, 2, 2, 2])]
    for name, label in (("add", "ADD"), ("sub", "SUB"), ("mul", "MUL"), ("div", "DIV")):
        inits = {"b": away_from_zero} if name == "div" else {}
        for type in (F32, F16):
            for ne, nr in shapes:
                if type == F16 and ne[2] == 320:
                    continue

                def build(ctx: Context, name: str = name, type: GGMLType = type, ne: list[int] = ne,
                          nr: list[int] = nr) -> Tensor:
                    a = new(ctx, "a", type, [n * r for n, r in zip(ne, nr, strict=True)])
                    b = new(ctx, "b", type, ne)
                    return op(ctx, name)(a, b)

                cases.append(OpCase(label, f"type={_t(type)},ne={_ne(ne)},nr={_ne(nr)}", build, inits))
        # a permuted src0 and a transposed src1
        def build_nc(ctx: Context, name: str = name) -> Tensor:
            a = permuted(ctx, "a", F32, [8, 6, 4, 2], (0, 2, 1, 3))
            b = transposed(ctx, "b", F32, [8, 6, 1, 1])
            return op(ctx, name)(a, b)

        cases.append(OpCase(label, "type=f32,ne=[8,6,4,2],src0 permuted,src1 transposed", build_nc, inits))

        def build_inplace(ctx: Context, name: str = name) -> Tensor:
            return op(ctx, name + "_inplace")(new(ctx, "a", F32, [16, 5, 3, 1]), new(ctx, "b", F32, [16, 1, 1, 1]))

        cases.append(OpCase(label, "type=f32,ne=[16,5,3,1],inplace", build_inplace, inits))
    return cases


def unary_cases() -> list[OpCase]:
    cases = []
    for u in UnaryOp:
        if u == UnaryOp.XIELU:
            continue  # its parameters come from ggml_xielu: a case of its own below
        for type in (F32, F16):
            def build(ctx: Context, u: UnaryOp = u, type: GGMLType = type) -> Tensor:
                return op(ctx, "unary")(new(ctx, "a", type, [128, 10, 10, 10]), u)

            cases.append(OpCase(u.name, f"type={_t(type)},ne=[128,10,10,10]", build, {"a": uniform(-3.0, 3.0)}))

        def build_nc(ctx: Context, u: UnaryOp = u) -> Tensor:
            return op(ctx, "unary")(transposed(ctx, "a", F32, [7, 9, 3, 1]), u)

        cases.append(OpCase(u.name, "type=f32,ne=[7,9,3,1],transposed", build_nc, {"a": uniform(-3.0, 3.0)}))

    def build_xielu(ctx: Context) -> Tensor:
        return op(ctx, "xielu")(new(ctx, "a", F32, [64, 10, 4, 1]), 0.8, 0.8, 0.5, -1e-6)

    cases.append(OpCase("XIELU", "type=f32,ne=[64,10,4,1],alpha_n=0.8,alpha_p=0.8,beta=0.5,eps=-1e-6", build_xielu,
                        {"a": uniform(-3.0, 3.0)}))
    return cases


def simple_unary_cases() -> list[OpCase]:
    """SQR, SQRT, LOG, SCALE, CLAMP, LEAKY_RELU: one source, some parameters."""
    cases = []
    specs: list[tuple[str, str, tuple[Any, ...], dict[str, Init]]] = [
        ("SQR", "sqr", (), {}),
        ("SQRT", "sqrt", (), {"a": uniform(0.01, 2.0)}),
        ("LOG", "log", (), {"a": uniform(0.01, 2.0)}),
        ("SCALE", "scale", (0.75,), {}),
        ("SCALE", "scale_bias", (0.75, -0.25), {}),
        ("CLAMP", "clamp", (-0.5, 0.5), {}),
        ("LEAKY_RELU", "leaky_relu", (0.1, False), {}),
    ]
    for label, name, args, inits in specs:
        for type in (F32, F16):
            def build(ctx: Context, name: str = name, args: tuple[Any, ...] = args, type: GGMLType = type) -> Tensor:
                return op(ctx, name)(new(ctx, "a", type, [10, 10, 10, 10]), *args)

            cases.append(OpCase(label, f"type={_t(type)},ne=[10,10,10,10]" + (f",args={args}" if args else ""),
                                build, inits))

        def build_nc(ctx: Context, name: str = name, args: tuple[Any, ...] = args) -> Tensor:
            return op(ctx, name)(permuted(ctx, "a", F32, [6, 5, 4, 3], (0, 2, 1, 3)), *args)

        cases.append(OpCase(label, "type=f32,ne=[6,5,4,3],permuted" + (f",args={args}" if args else ""), build_nc,
                            inits))
    return cases


def copy_cases() -> list[OpCase]:
    cases = []
    for type in (F32, F16, BF16):
        def build_dup(ctx: Context, type: GGMLType = type) -> Tensor:
            return op(ctx, "dup")(new(ctx, "a", type, [10, 10, 10, 1]))

        cases.append(OpCase("DUP", f"type={_t(type)},ne=[10,10,10,1]", build_dup))

        def build_dup_nc(ctx: Context, type: GGMLType = type) -> Tensor:
            return op(ctx, "dup")(permuted(ctx, "a", type, [10, 8, 3, 1], (0, 2, 1, 3)))

        cases.append(OpCase("DUP", f"type={_t(type)},ne=[10,8,3,1],permuted", build_dup_nc))
    # CPY between F32, F16, BF16 and the quantized types
    pairs = ([(s, d) for s in (F32, F16, BF16) for d in ALL_TYPES if d in FROM_FLOAT_TYPES]
             + [(q, F32) for q in QUANT_TYPES])
    for src, dst in pairs:
        def build_cpy(ctx: Context, src: GGMLType = src, dst: GGMLType = dst) -> Tensor:
            return op(ctx, "cpy")(new(ctx, "a", src, [256, 4, 2, 1]), new(ctx, "b", dst, [256, 4, 2, 1]))

        cases.append(OpCase("CPY", f"type_src={_t(src)},type_dst={_t(dst)},ne=[256,4,2,1]", build_cpy))
    for src, dst in ((F32, F32), (F32, F16), (F16, F32)):
        def build_cpy_nc(ctx: Context, src: GGMLType = src, dst: GGMLType = dst) -> Tensor:
            a = permuted(ctx, "a", src, [16, 6, 4, 1], (0, 2, 1, 3))
            return op(ctx, "cpy")(a, new(ctx, "b", dst, [16, 6, 4, 1]))

        cases.append(OpCase("CPY", f"type_src={_t(src)},type_dst={_t(dst)},ne=[16,6,4,1],src permuted", build_cpy_nc))
    for type in (F32, F16):
        def build_cont(ctx: Context, type: GGMLType = type) -> Tensor:
            return op(ctx, "cont")(transposed(ctx, "a", type, [10, 10, 10, 1]))

        cases.append(OpCase("CONT", f"type={_t(type)},ne=[10,10,10,1],transposed", build_cont))
    return cases


def view_op_cases() -> list[OpCase]:
    """RESHAPE, VIEW, PERMUTE, TRANSPOSE compute nothing: each is checked through a CONT of its result."""
    def reshape(ctx: Context) -> Tensor:
        return op(ctx, "cont")(op(ctx, "reshape_3d")(new(ctx, "a", F32, [12, 5, 1, 1]), 6, 2, 5))

    def view(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, [10, 6, 1, 1])
        return op(ctx, "cont")(op(ctx, "view_2d")(a, 4, 3, a.nb[1] * 2, 3 * a.nb[0]))

    def permute(ctx: Context) -> Tensor:
        return op(ctx, "cont")(op(ctx, "permute")(new(ctx, "a", F32, [5, 4, 3, 2]), 2, 0, 3, 1))

    def transpose(ctx: Context) -> Tensor:
        return op(ctx, "cont")(op(ctx, "transpose")(new(ctx, "a", F16, [7, 3, 2, 1])))

    return [OpCase("RESHAPE", "type=f32,ne=[12,5,1,1]->[6,2,5]", reshape),
            OpCase("VIEW", "type=f32,ne=[10,6,1,1],view [4,3] every 2nd row from element 3", view),
            OpCase("PERMUTE", "type=f32,ne=[5,4,3,2],axes=[2,0,3,1]", permute),
            OpCase("TRANSPOSE", "type=f16,ne=[7,3,2,1]", transpose)]


def get_rows_cases() -> list[OpCase]:
    cases = []
    for type in ALL_TYPES:
        n = 256 if TYPE_TRAITS[type].is_quantized else 10
        for m, r, b in ((5, 3, 1), (5, 3, 3)):
            def build(ctx: Context, type: GGMLType = type, n: int = n, m: int = m, r: int = r, b: int = b) -> Tensor:
                return op(ctx, "get_rows")(new(ctx, "a", type, [n, m, b, 1]), new(ctx, "idx", I32, [r, b, 1, 1]))

            cases.append(OpCase("GET_ROWS", f"type={_t(type)},n={n},m={m},r={r},b={b}", build,
                                {"idx": indices(m)}))
    return cases


def reduce_cases() -> list[OpCase]:
    """F16 SUM, SUM_ROWS, MEAN, ARGMAX (their F32 cases are test-backend-ops': `cases_backend_ops`), ARGSORT, TOP_K."""
    cases = []
    for label, name in (("SUM", "sum"), ("SUM_ROWS", "sum_rows"), ("MEAN", "mean"), ("ARGMAX", "argmax")):
        ne = [32, 10, 1, 1] if name == "argmax" else [10, 10, 10, 10]

        def build(ctx: Context, name: str = name, ne: list[int] = ne) -> Tensor:
            return op(ctx, name)(new(ctx, "a", F16, ne))

        inits = {"a": distinct} if name == "argmax" else {}
        cases.append(OpCase(label, f"type=f16,ne={_ne(ne)}", build, inits))
    for order in SortOrder:
        def build_sort(ctx: Context, order: SortOrder = order) -> Tensor:
            return op(ctx, "argsort")(new(ctx, "a", F32, [16, 10, 10, 1]), order)

        cases.append(OpCase("ARGSORT", f"type=f32,ne=[16,10,10,1],order={int(order)}", build_sort, {"a": distinct}))

    def build_argsort_top_k(ctx: Context) -> Tensor:
        return op(ctx, "cont")(op(ctx, "argsort_top_k")(new(ctx, "a", F32, [16, 10, 2, 1]), 4))

    cases.append(OpCase("ARGSORT", "type=f32,ne=[16,10,2,1],argsort_top_k k=4", build_argsort_top_k,
                        {"a": distinct}))
    for k in (1, 4, 16):
        def build_top_k(ctx: Context, k: int = k) -> Tensor:
            return op(ctx, "top_k")(new(ctx, "a", F32, [16, 10, 2, 1]), k)

        cases.append(OpCase("TOP_K", f"type=f32,ne=[16,10,2,1],k={k}", build_top_k, {"a": distinct}, sort_rows=True))
    return cases


def layout_cases() -> list[OpCase]:
    cases = []
    for nr in ([2, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [1, 1, 1, 2], [2, 2, 2, 2]):
        def build_repeat(ctx: Context, nr: list[int] = nr) -> Tensor:
            ne = [10, 10, 10, 10]
            return op(ctx, "repeat")(new(ctx, "a", F32, ne), new(ctx, "b", F32, [n * r for n, r in zip(ne, nr,
                                                                                                        strict=True)]))

        cases.append(OpCase("REPEAT", f"type=f32,ne=[10,10,10,10],nr={_ne(nr)}", build_repeat))
    for type in (F32, F16):
        for dim in range(4):
            def build_concat(ctx: Context, type: GGMLType = type, dim: int = dim) -> Tensor:
                ne_b = [10, 9, 8, 3]
                ne_b[dim] = 5
                return op(ctx, "concat")(new(ctx, "a", type, [10, 9, 8, 3]), new(ctx, "b", type, ne_b), dim)

            cases.append(OpCase("CONCAT", f"type={_t(type)},ne_a=[10,9,8,3],dim={dim}", build_concat))

    def build_concat_nc(ctx: Context) -> Tensor:
        a = permuted(ctx, "a", F32, [10, 9, 8, 1], (0, 2, 1, 3))
        return op(ctx, "concat")(a, new(ctx, "b", F32, [10, 4, 8, 1]), 1)

    cases.append(OpCase("CONCAT", "type=f32,ne_a=[10,9,8,1],dim=1,a permuted", build_concat_nc))

    def build_diag(ctx: Context) -> Tensor:
        return op(ctx, "diag")(new(ctx, "a", F32, [10, 1, 3, 2]))

    cases.append(OpCase("DIAG", "type=f32,ne=[10,1,3,2]", build_diag))

    def build_pad(ctx: Context) -> Tensor:
        return op(ctx, "pad")(new(ctx, "a", F32, [10, 7, 3, 2]), 2, 1, 1, 0)

    cases.append(OpCase("PAD", "type=f32,ne=[10,7,3,2],pad=[2,1,1,0]", build_pad))
    for circular in (False, True):
        def build_pad_ext(ctx: Context, circular: bool = circular) -> Tensor:
            name = "pad_ext_circular" if circular else "pad_ext"
            return op(ctx, name)(new(ctx, "a", F32, [10, 7, 3, 2]), 1, 2, 3, 0, 0, 1, 1, 1)

        cases.append(OpCase("PAD", f"type=f32,ne=[10,7,3,2],lp=[1,3,0,1],rp=[2,0,1,1],circular={int(circular)}",
                            build_pad_ext))

    def build_upscale(ctx: Context) -> Tensor:
        return op(ctx, "upscale")(new(ctx, "a", F32, [16, 8, 3, 2]), 2)

    cases.append(OpCase("UPSCALE", "type=f32,ne=[16,8,3,2],factor=2", build_upscale))
    for mode, ne in ((ScaleMode.NEAREST, [23, 5, 6, 2]), (ScaleMode.BILINEAR, [23, 13, 3, 2]),
                     (ScaleMode.BILINEAR, [9, 4, 3, 2]), (ScaleMode.BICUBIC, [23, 13, 3, 2]),
                     (ScaleMode.BILINEAR | ScaleFlag.ALIGN_CORNERS, [23, 13, 3, 2]),
                     (ScaleMode.BICUBIC | ScaleFlag.ALIGN_CORNERS, [23, 13, 3, 2])):
        def build_interpolate(ctx: Context, mode: int = int(mode), ne: list[int] = ne) -> Tensor:
            return op(ctx, "interpolate")(new(ctx, "a", F32, [16, 8, 3, 2]), *ne, mode)

        cases.append(OpCase("UPSCALE", f"type=f32,ne=[16,8,3,2]->{_ne(ne)},mode={int(mode):#x}", build_interpolate))

    def build_acc(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, [64, 17, 3, 1])
        b = new(ctx, "b", F32, [32, 16, 3, 1])
        return op(ctx, "acc")(a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 4 * a.nb[0])

    cases.append(OpCase("ACC", "type=f32,ne_a=[64,17,3,1],ne_b=[32,16,3,1]", build_acc))

    def build_add1(ctx: Context) -> Tensor:
        return op(ctx, "add1")(new(ctx, "a", F32, [10, 5, 4, 3]), new(ctx, "b", F32, [1, 1, 1, 1]))

    cases.append(OpCase("ADD1", "type=f32,ne=[10,5,4,3]", build_add1))

    def build_set(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, [16, 8, 2, 1])
        b = new(ctx, "b", F32, [5, 3, 2, 1])
        return op(ctx, "set")(a, b, a.nb[1], a.nb[2], a.nb[3], 2 * a.nb[1] + 3 * a.nb[0])

    cases.append(OpCase("SET", "type=f32,ne_a=[16,8,2,1],ne_b=[5,3,2,1]", build_set))
    return cases


def norm_cases() -> list[OpCase]:
    cases = []
    for type in (F32, F16):
        for label, name, args in (("NORM", "norm", (1e-5,)), ("RMS_NORM", "rms_norm", (1e-6,))):
            def build(ctx: Context, name: str = name, args: tuple[Any, ...] = args, type: GGMLType = type) -> Tensor:
                return op(ctx, name)(new(ctx, "a", type, [64, 10, 10, 10]), *args)

            cases.append(OpCase(label, f"type={_t(type)},ne=[64,10,10,10],eps={args[0]}", build))

        def build_group(ctx: Context, type: GGMLType = type) -> Tensor:
            return op(ctx, "group_norm")(new(ctx, "a", type, [64, 64, 32, 1]), 8, 1e-6)

        cases.append(OpCase("GROUP_NORM", f"type={_t(type)},ne=[64,64,32,1],n_groups=8,eps=1e-6", build_group))

    def build_norm_nc(ctx: Context) -> Tensor:
        return op(ctx, "rms_norm")(permuted(ctx, "a", F32, [32, 6, 4, 1], (0, 2, 1, 3)), 1e-6)

    cases.append(OpCase("RMS_NORM", "type=f32,ne=[32,6,4,1],permuted", build_norm_nc))
    return cases


def attention_cases() -> list[OpCase]:
    cases = []
    for label, name in (("DIAG_MASK_INF", "diag_mask_inf"), ("DIAG_MASK_ZERO", "diag_mask_zero")):
        for n_past in (0, 5):
            def build_mask(ctx: Context, name: str = name, n_past: int = n_past) -> Tensor:
                return op(ctx, name)(new(ctx, "a", F32, [10, 10, 3, 2]), n_past)

            cases.append(OpCase(label, f"type=f32,ne=[10,10,3,2],n_past={n_past}", build_mask))
    for type in (F32, F16):
        def build_sm(ctx: Context, type: GGMLType = type) -> Tensor:
            return op(ctx, "soft_max")(new(ctx, "a", type, [16, 10, 10, 1]))

        cases.append(OpCase("SOFT_MAX", f"type={_t(type)},ne=[16,10,10,1]", build_sm))
    for mask_type, ne_mask, max_bias in ((F32, [32, 8, 1, 1], 0.0), (F16, [32, 8, 1, 1], 0.0),
                                         (F32, [32, 11, 2, 1], 0.0), (F32, [32, 8, 1, 1], 8.0),
                                         (F16, [32, 9, 4, 2], 2.0)):
        def build_sm_ext(ctx: Context, mask_type: GGMLType = mask_type, ne_mask: list[int] = ne_mask,
                         max_bias: float = max_bias) -> Tensor:
            return op(ctx, "soft_max_ext")(new(ctx, "a", F32, [32, 8, 4, 2]), new(ctx, "mask", mask_type, ne_mask),
                                           0.125, max_bias)

        cases.append(OpCase("SOFT_MAX", f"type=f32,ne=[32,8,4,2],mask={_t(mask_type)}{_ne(ne_mask)},scale=0.125,"
                                        f"max_bias={max_bias:g}", build_sm_ext))

    def build_sm_sinks(ctx: Context) -> Tensor:
        kq = op(ctx, "soft_max_ext")(new(ctx, "a", F32, [32, 8, 4, 1]), new(ctx, "mask", F32, [32, 8, 1, 1]), 0.25)
        from pyggml.core.ops import soft_max_add_sinks

        soft_max_add_sinks(kq, new(ctx, "sinks", F32, [4, 1, 1, 1]))
        return kq

    cases.append(OpCase("SOFT_MAX", "type=f32,ne=[32,8,4,1],mask,scale=0.25,sinks", build_sm_sinks))

    def build_sm_masked(ctx: Context) -> Tensor:
        kq = op(ctx, "diag_mask_inf")(new(ctx, "a", F32, [12, 12, 4, 1]), 0)
        return op(ctx, "soft_max")(kq)

    cases.append(OpCase("SOFT_MAX", "type=f32,ne=[12,12,4,1],after diag_mask_inf", build_sm_masked))
    return cases + rope_cases()


def rope_cases() -> list[OpCase]:
    cases = []
    normal, neox = GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX
    for type in (F32, F16):
        for mode, n_dims, ne in ((normal, 128, [128, 4, 10, 1]), (normal, 64, [128, 4, 10, 1]),
                                 (neox, 128, [128, 4, 10, 1]), (neox, 64, [64, 8, 10, 1]),
                                 (neox, 32, [64, 8, 10, 1])):
            def build_rope(ctx: Context, type: GGMLType = type, mode: int = mode, n_dims: int = n_dims,
                           ne: list[int] = ne) -> Tensor:
                pos = new(ctx, "pos", I32, [ne[2], 1, 1, 1])
                return op(ctx, "rope")(new(ctx, "a", type, ne), pos, n_dims, mode)

            cases.append(OpCase("ROPE", f"type={_t(type)},ne={_ne(ne)},n_dims={n_dims},mode={mode}", build_rope,
                                {"pos": indices(512)}, MAX_NMSE_ROPE))
    for mode, ext_factor in ((normal, 0.0), (neox, 1.0)):
        def build_rope_ext(ctx: Context, mode: int = mode, ext_factor: float = ext_factor) -> Tensor:
            pos = new(ctx, "pos", I32, [10, 1, 1, 1])
            return op(ctx, "rope_ext")(new(ctx, "a", F32, [64, 4, 10, 1]), pos, None, 64, mode, 4096, 20000.0, 0.5,
                                       ext_factor, 1.0, 32.0, 1.0)

        cases.append(OpCase("ROPE", f"type=f32,ne=[64,4,10,1],mode={mode},freq_base=20000,freq_scale=0.5,"
                                    f"ext_factor={ext_factor:g}", build_rope_ext, {"pos": indices(512)},
                            MAX_NMSE_ROPE))

    def build_rope_ff(ctx: Context) -> Tensor:
        pos = new(ctx, "pos", I32, [10, 1, 1, 1])
        ff = new(ctx, "freq_factors", F32, [16, 1, 1, 1])
        return op(ctx, "rope_ext")(new(ctx, "a", F32, [64, 4, 10, 1]), pos, ff, 32, neox, 4096, 10000.0, 1.0, 0.0,
                                   1.0, 32.0, 1.0)

    cases.append(OpCase("ROPE", "type=f32,ne=[64,4,10,1],n_dims=32,mode=2,freq_factors", build_rope_ff,
                        {"pos": indices(512), "freq_factors": uniform(1.0, 4.0)}, MAX_NMSE_ROPE))

    def build_rope_offs(ctx: Context) -> Tensor:
        from pyggml.core.ops import rope_set_offset

        pos = new(ctx, "pos", I32, [10, 1, 1, 1])
        return rope_set_offset(op(ctx, "rope")(new(ctx, "a", F32, [64, 4, 10, 1]), pos, 32, neox), 16)

    cases.append(OpCase("ROPE", "type=f32,ne=[64,4,10,1],n_dims=32,mode=2,n_offs=16", build_rope_offs,
                        {"pos": indices(512)}, MAX_NMSE_ROPE))
    multi = ((GGML_ROPE_TYPE_MROPE, 32, [6, 5, 5, 0]), (GGML_ROPE_TYPE_IMROPE, 32, [6, 5, 5, 0]),
             (GGML_ROPE_TYPE_MROPE, 24, [4, 4, 2, 2]), (GGML_ROPE_TYPE_VISION, 32, [16, 16, 0, 0]))
    for mode, n_dims, sections in multi:
        def build_rope_multi(ctx: Context, mode: int = mode, n_dims: int = n_dims,
                             sections: list[int] = sections) -> Tensor:
            pos = new(ctx, "pos", I32, [40, 1, 1, 1])  # 4 positions per token
            return op(ctx, "rope_multi")(new(ctx, "a", F32, [64, 4, 10, 1]), pos, None, n_dims, sections, mode,
                                         4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

        cases.append(OpCase("ROPE", f"type=f32,ne=[64,4,10,1],n_dims={n_dims},mode={mode},sections={_ne(sections)}",
                            build_rope_multi, {"pos": indices(512)}, MAX_NMSE_ROPE))
    return cases


def matmul_cases() -> list[OpCase]:
    cases = []
    for type_a in ALL_TYPES:
        k = 256 if TYPE_TRAITS[type_a].is_quantized else 32
        type_bs = (F32, F16) if type_a == F16 else (F32,)
        for type_b in type_bs:
            for m, n, bs, nr in ((16, 1, [1, 1], [1, 1]), (16, 8, [1, 1], [1, 1]), (16, 8, [3, 2], [1, 1]),
                                 (16, 8, [3, 2], [2, 2])):
                if TYPE_TRAITS[type_a].is_quantized and bs != [1, 1] and nr == [1, 1]:
                    continue  # fewer quantized cases: the broadcast one covers batches

                def build(ctx: Context, type_a: GGMLType = type_a, type_b: GGMLType = type_b, m: int = m, n: int = n,
                          k: int = k, bs: list[int] = bs, nr: list[int] = nr) -> Tensor:
                    a = new(ctx, "a", type_a, [k, m, bs[0], bs[1]])
                    b = new(ctx, "b", type_b, [k, n, bs[0] * nr[0], bs[1] * nr[1]])
                    return op(ctx, "mul_mat")(a, b)

                cases.append(OpCase("MUL_MAT", f"type_a={_t(type_a)},type_b={_t(type_b)},m={m},n={n},k={k},"
                                               f"bs={_ne(bs)},nr={_ne(nr)}", build, {}, MAX_NMSE_MUL_MAT))

    def build_nc(ctx: Context) -> Tensor:
        a = new(ctx, "a", F32, [32, 16, 2, 1])
        b = permuted(ctx, "b", F32, [32, 8, 2, 1], (0, 2, 1, 3))
        return op(ctx, "mul_mat")(a, b)

    cases.append(OpCase("MUL_MAT", "type_a=f32,type_b=f32,m=16,n=8,k=32,b permuted", build_nc, {}, MAX_NMSE_MUL_MAT))

    def build_bt(ctx: Context) -> Tensor:
        a = new(ctx, "a", F16, [32, 16, 1, 1])
        b = transposed(ctx, "b", F32, [32, 8, 1, 1])
        return op(ctx, "mul_mat")(a, b)

    cases.append(OpCase("MUL_MAT", "type_a=f16,type_b=f32,m=16,n=8,k=32,b transposed", build_bt, {},
                        MAX_NMSE_MUL_MAT))

    def build_out_prod(ctx: Context) -> Tensor:
        return op(ctx, "out_prod")(new(ctx, "a", F32, [16, 32, 1, 1]), new(ctx, "b", F32, [8, 32, 1, 1]))

    cases.append(OpCase("OUT_PROD", "type=f32,m=16,n=8,k=32", build_out_prod, {}, MAX_NMSE_MUL_MAT))
    return cases


def conv_cases() -> list[OpCase]:
    cases = []
    for kernel_type in (F32, F16):
        def build_im2col(ctx: Context, kernel_type: GGMLType = kernel_type) -> Tensor:
            kernel = new(ctx, "kernel", kernel_type, [3, 3, 3, 4])
            x = new(ctx, "x", F32, [10, 10, 3, 1])
            return op(ctx, "im2col")(kernel, x, 1, 1, 1, 1, 1, 1, True)

        cases.append(OpCase("IM2COL", f"type_kernel={_t(kernel_type)},ne_input=[10,10,3,1],ne_kernel=[3,3,3,4]",
                            build_im2col))

    def build_conv1d(ctx: Context) -> Tensor:
        return op(ctx, "conv_1d")(new(ctx, "kernel", F16, [3, 4, 6, 1]), new(ctx, "x", F32, [20, 4, 1, 1]), 1, 1, 1)

    cases.append(OpCase("IM2COL", "conv_1d,kernel=[3,4,6],input=[20,4],s0=1,p0=1,d0=1", build_conv1d, {},
                        MAX_NMSE_MUL_MAT))

    def build_conv2d(ctx: Context) -> Tensor:
        return op(ctx, "conv_2d")(new(ctx, "kernel", F16, [3, 3, 4, 5]), new(ctx, "x", F32, [12, 10, 4, 1]),
                                  1, 1, 1, 1, 1, 1)

    cases.append(OpCase("IM2COL", "conv_2d,kernel=[3,3,4,5],input=[12,10,4,1],s=1,p=1,d=1", build_conv2d, {},
                        MAX_NMSE_MUL_MAT))

    def build_convt(ctx: Context) -> Tensor:
        return op(ctx, "conv_transpose_1d")(new(ctx, "kernel", F32, [3, 5, 4, 1]), new(ctx, "x", F32, [10, 4, 1, 1]),
                                            2, 0, 1)

    cases.append(OpCase("CONV_TRANSPOSE_1D", "kernel=[3,5,4],input=[10,4],s0=2", build_convt))
    for pool in OpPool:
        for p0 in (0, 1):
            def build_pool1(ctx: Context, pool: OpPool = pool, p0: int = p0) -> Tensor:
                return op(ctx, "pool_1d")(new(ctx, "a", F32, [20, 6, 1, 1]), pool, 3, 2, p0)

            cases.append(OpCase("POOL_1D", f"type=f32,ne=[20,6,1,1],op={int(pool)},k=3,s=2,p={p0}", build_pool1))

            def build_pool2(ctx: Context, pool: OpPool = pool, p0: int = p0) -> Tensor:
                return op(ctx, "pool_2d")(new(ctx, "a", F32, [12, 10, 3, 1]), pool, 3, 2, 2, 2, float(p0), 0.0)

            cases.append(OpCase("POOL_2D", f"type=f32,ne=[12,10,3,1],op={int(pool)},k=[3,2],s=2,p=[{p0},0]",
                                build_pool2))
    return cases


def _custom1(dst: Tensor, a: Tensor, ith: int, nth: int, userdata: Any) -> None:
    """y = 2a + 1 on the rows of task ith of nth (Tensors, read and written through .numpy())."""
    d, x = dst.numpy(), a.numpy()
    d[:, :, ith::nth] = 2 * x[:, :, ith::nth] + 1


def _custom2(dst: Tensor, a: Tensor, b: Tensor, ith: int, nth: int, userdata: Any) -> None:
    d, x, y = dst.numpy(), a.numpy(), b.numpy()
    d[:, :, ith::nth] = x[:, :, ith::nth] * y[:, :, ith::nth] - 1


def _custom3(dst: Tensor, a: Tensor, b: Tensor, c: Tensor, ith: int, nth: int, userdata: Any) -> None:
    d, x, y, z = dst.numpy(), a.numpy(), b.numpy(), c.numpy()
    d[:, :, ith::nth] = x[:, :, ith::nth] + y[:, :, ith::nth] * z[:, :, ith::nth]


def _custom(dst: Tensor, ith: int, nth: int, userdata: Any) -> None:
    """CUSTOM's function (ggml_custom_op_t): the arguments are dst.src."""
    a, b = dst.src[0], dst.src[1]
    assert a is not None and b is not None
    d, x, y = dst.numpy(), a.numpy(), b.numpy()
    d[:, :, ith::nth] = x[:, :, ith::nth] - 2 * y[:, :, ith::nth]


def custom_cases() -> list[OpCase]:
    def build1(ctx: Context) -> Tensor:
        return op(ctx, "map_custom1")(new(ctx, "a", F32, [10, 4, 1, 1]), _custom1, 1, None)

    def build2(ctx: Context) -> Tensor:
        return op(ctx, "map_custom2")(new(ctx, "a", F32, [10, 4, 1, 1]), new(ctx, "b", F32, [10, 4, 1, 1]),
                                      _custom2, 1, None)

    def build3(ctx: Context) -> Tensor:
        return op(ctx, "map_custom3")(new(ctx, "a", F32, [10, 4, 1, 1]), new(ctx, "b", F32, [10, 4, 1, 1]),
                                      new(ctx, "c", F32, [10, 4, 1, 1]), _custom3, 1, None)

    def build4(ctx: Context) -> Tensor:
        args = [new(ctx, "a", F32, [10, 4, 1, 1]), new(ctx, "b", F32, [10, 4, 1, 1])]
        return op(ctx, "custom_4d")(F32, 10, 4, 1, 1, args, _custom, 1, None)

    return [OpCase("MAP_CUSTOM1", "type=f32,ne=[10,4,1,1],2a+1", build1),
            OpCase("MAP_CUSTOM2", "type=f32,ne=[10,4,1,1],a*b-1", build2),
            OpCase("MAP_CUSTOM3", "type=f32,ne=[10,4,1,1],a+b*c", build3),
            OpCase("CUSTOM", "type=f32,ne=[10,4,1,1],a-2b", build4)]


def all_cases() -> list[OpCase]:
    """Every case once: test-backend-ops lists a few twice, and a case is named by its op and desc."""
    cases = (copy_cases() + view_op_cases() + bin_bcast_cases() + layout_cases() + simple_unary_cases()
            + unary_cases() + reduce_cases() + get_rows_cases() + norm_cases() + attention_cases()
            + matmul_cases() + conv_cases() + custom_cases() + _misc_cases()
            + _flash_attn_cases()
            + _glu_rows_moe_cases()
            + _conv_back_cases()
            + _ssm_cases()
            + _extra_cases()
            + _backend_ops_cases()
            + _ggml_suite_cases())
    unique: dict[tuple[str, str], OpCase] = {}
    for c in cases:
        unique.setdefault((c.label, c.desc), c)
    return list(unique.values())


def _backend_ops_cases() -> list[OpCase]:
    from pyggml.testing.cases_backend_ops import backend_ops_cases  # it builds on this module's helpers

    return backend_ops_cases()


def _misc_cases() -> list[OpCase]:
    from pyggml.testing.cases_misc import misc_cases  # it builds on this module's helpers

    return misc_cases()


def _glu_rows_moe_cases() -> list[OpCase]:
    from pyggml.testing.cases_glu_rows_moe import glu_rows_moe_cases  # it builds on this module's helpers

    return glu_rows_moe_cases()


def _conv_back_cases() -> list[OpCase]:
    from pyggml.testing.cases_conv_back import conv_back_cases  # it builds on this module's helpers

    return conv_back_cases()


def _ssm_cases() -> list[OpCase]:
    from pyggml.testing.cases_ssm import ssm_cases  # it builds on this module's helpers

    return ssm_cases()


def _extra_cases() -> list[OpCase]:
    from pyggml.testing.cases_extra import extra_cases  # it builds on this module's helpers

    return extra_cases()


def _ggml_suite_cases() -> list[OpCase]:
    from pyggml.testing.cases_ggml_suite import ggml_suite_cases  # it builds on this module's helpers

    return ggml_suite_cases()


def _flash_attn_cases() -> list[OpCase]:
    from pyggml.testing.cases_flash_attn import flash_attn_ext_cases  # it builds on this module's helpers

    return flash_attn_ext_cases()


# --- running a case ---


def to_f64(t: Tensor, values: np.ndarray) -> np.ndarray:
    """The values of a tensor read with tensor_get_numpy, as float64 (BF16 from bits, quantized dequantized)."""
    if t.type == BF16:
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64).ravel()
    if TYPE_TRAITS[t.type].is_quantized:
        from pyggml.core.types import to_float

        return np.asarray(to_float(t.type, values), dtype=np.float64).ravel()
    return values.astype(np.float64).ravel()


def compare(a: np.ndarray, b: np.ndarray) -> tuple[float, str]:
    """ggml's checks: NaN fails; infinities must match in place and sign; then NMSE (a: the tested backend)."""
    nan = np.isnan(a) | np.isnan(b)
    if nan.any():
        i = int(np.argmax(nan))
        return math.inf, f"NaN at index {i} ({a[i]} {b[i]})"
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if (inf_a != inf_b).any() or (np.signbit(a[inf_a]) != np.signbit(b[inf_a])).any():
        i = int(np.argmax((inf_a != inf_b) | (inf_a & (np.signbit(a) != np.signbit(b)))))
        return math.inf, f"inf mismatch at index {i} ({a[i]} {b[i]})"
    fa, fb = a[~inf_a], b[~inf_a]
    mse_a_b = float(np.sum((fa - fb) ** 2))
    mse_a_0 = float(np.sum(fa * fa))
    if mse_a_0 == 0.0:
        return (0.0 if mse_a_b == 0.0 else math.inf), ""
    return mse_a_b / mse_a_0, ""


def _graph_of(case: OpCase, ctx: Context) -> tuple[Graph, Tensor]:
    out = case.build(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    return g, out


def _unsupported(backend: Backend, g: Graph) -> Tensor | None:
    for node in g.nodes:
        if node.op == GGMLOp.NONE or is_view_op(node.op):
            continue
        if not backend.supports_op(node):
            return node
    return None


def _seed(case: OpCase) -> int:
    return zlib.crc32(f"{case.label}|{case.desc}".encode())


def _inputs(g: Graph) -> list[Tensor]:
    """The tensors a case's values go into: its graph's leafs, then its nodes of op NONE (parameters)."""
    return [*g.leafs, *(n for n in g.nodes if n.op == GGMLOp.NONE)]


def run_case(case: OpCase, backend: Backend, reference: Backend,
             limits: Mapping[tuple[str, str], str] | None = None) -> CaseResult:
    """Build, fill, compute and compare one case. Never raises for the case's own problems.

    `limits` maps (label, desc) of the cases the reference cannot be trusted with to the reason: they are
    "not supported" (the reference's limit, not a failure of the backend).
    """
    reason = (limits or {}).get((case.label, case.desc))
    if reason is not None:
        return CaseResult(case, "not supported", detail=f"{reference.name()}: {reason}")
    ctx1 = Context(mem_size=1 << 22, no_alloc=True)
    ctx2 = Context(mem_size=1 << 22, no_alloc=True)
    try:
        g1, out1 = _graph_of(case, ctx1)
        g2, out2 = _graph_of(case, ctx2)
    except MissingBuilder as e:
        return CaseResult(case, "not supported", detail=f"no builder {e}")
    except Exception as e:  # a builder that exists but fails is a failure of the case
        return CaseResult(case, "FAIL", detail=f"build: {type(e).__name__}: {e}")
    for b, g in ((backend, g1), (reference, g2)):
        node = _unsupported(b, g)
        if node is not None:
            return CaseResult(case, "not supported", detail=f"{b.name()}: {op_desc(node)} '{node.name}'")
    buffers = []
    try:
        buffers.append(alloc_ctx_tensors(ctx1, backend))
        buffers.append(alloc_ctx_tensors(ctx2, reference))
        rng = np.random.default_rng(_seed(case))
        # the leafs, and the nodes that compute nothing: parameters (ggml lists a PARAM tensor among the nodes),
        # which the optimizer steps update in place (left as they were, they would hold the buffer's old bytes)
        for leaf1, leaf2 in zip(_inputs(g1), _inputs(g2), strict=True):
            init = case.inits.get(leaf1.name, default_values)
            values = init(rng, leaf1)
            tensor_set_numpy(leaf1, values)
            tensor_set_numpy(leaf2, values)
        backend.graph_compute(g1)
        reference.graph_compute(g2)
        got_raw, want_raw = tensor_get_numpy(out1), tensor_get_numpy(out2)
        if case.sort_rows:
            got_raw, want_raw = np.sort(got_raw, axis=-1), np.sort(want_raw, axis=-1)
        got = to_f64(out1, got_raw)
        want = to_f64(out2, want_raw)
    except Exception as e:
        log.debug("case %s(%s) raised", case.label, case.desc, exc_info=True)
        return CaseResult(case, "FAIL", detail=f"{type(e).__name__}: {e}")
    finally:
        for buf in buffers:
            buf.free()
    if got.shape != want.shape:
        return CaseResult(case, "FAIL", detail=f"{got.size} values vs {want.size}")
    nmse, why = compare(got, want)
    if why or not nmse <= case.max_nmse:
        return CaseResult(case, "FAIL", nmse, why or f"NMSE {nmse:.3e} > {case.max_nmse:g}")
    return CaseResult(case, "OK", nmse)


def select(cases: list[OpCase], op_name: str | None) -> list[OpCase]:
    if not op_name:
        return cases
    want = op_name.upper()
    return [c for c in cases if c.label.upper() == want]


# Cases real ggml (the "ggml" reference) cannot be trusted with: its CPU kernels check these layouts with plain
# `assert`s, compiled out in the release build, and compute garbage instead of aborting (so probing cannot catch
# them). (label, desc) -> the reason. Keep this short: everything else must agree with ggml.
_WALKS_ROWS_BY_NB1 = "ggml's kernel walks the rows of src0 by nb[1] alone (a 2-D walk): a permuted source is read " \
                     "from the wrong places"
_ASSUMES_NB0 = "ggml's kernel reads each row as contiguous floats (its assert nb[0] == sizeof(float) is compiled " \
               "out): a transposed source is read from the wrong places"
GGML_LIMITS: dict[tuple[str, str], str] = {
    ("CLAMP", "type=f32,ne=[6,5,4,3],permuted,args=(-0.5, 0.5)"): _WALKS_ROWS_BY_NB1,
    ("LEAKY_RELU", "type=f32,ne=[6,5,4,3],permuted,args=(0.1, False)"): _WALKS_ROWS_BY_NB1,
    ("GELU", "type=f32,ne=[7,9,3,1],transposed"): _ASSUMES_NB0,
    ("GELU_QUICK", "type=f32,ne=[7,9,3,1],transposed"): _ASSUMES_NB0,
    ("SILU", "type=f32,ne=[7,9,3,1],transposed"): _ASSUMES_NB0,
    ("GELU_ERF", "type=f32,ne=[7,9,3,1],transposed"): _ASSUMES_NB0,
}

AGAINST = ("cpu", "ggml")


def run_cases(cases: Sequence[OpCase], reference: Backend) -> list[CaseResult]:
    """Each case on a fresh one-thread CPU backend against `reference` (for tests of one op's cases)."""
    backend = cpu_init(n_threads=1)
    try:
        return [run_case(c, backend, reference) for c in cases]
    finally:
        backend.free()


def reference_backend(against: str) -> tuple[Backend, Mapping[tuple[str, str], str]]:
    """The reference of `run`: pyggml's CPU backend ("cpu"), or real ggml ("ggml": llama.cpp's libggml, built
    on first use; pyggml.testing.llamacpp.LlamaCppError if it cannot be, NoCompilerError without a compiler),
    with the cases it cannot be trusted with."""
    if against == "cpu":
        return cpu_init(n_threads=1), {}
    if against == "ggml":
        from pyggml.testing import ggml_c

        return ggml_c.ggml_c_init(probe=True), GGML_LIMITS
    raise ArgumentError(f"test-ops: no reference '{against}' (one of {', '.join(AGAINST)})")


def _summary(results: list[CaseResult], out: TextIO) -> None:
    """One line per op: cases, passed, failed, not supported (the op's label, in the table's order)."""
    per_op: dict[str, dict[str, int]] = {}
    for r in results:
        counts = per_op.setdefault(r.case.label, {"OK": 0, "FAIL": 0, "not supported": 0})
        counts[r.status] += 1
    width = max(len("OP"), *(len(label) for label in per_op))
    out.write(f"\n  {'OP':<{width}}  {'CASES':>5}  {'PASSED':>6}  {'FAILED':>6}  {'NOT SUPPORTED':>13}\n")
    for label, c in per_op.items():
        n = sum(c.values())
        out.write(f"  {label:<{width}}  {n:>5}  {c['OK']:>6}  {c['FAIL']:>6}  {c['not supported']:>13}\n")


def run(backend_name: str = "cpu", op_name: str | None = None, out: TextIO = sys.stdout,
        verbose: bool = False, against: str = "cpu") -> int:
    """Run the table against the reference `against` ("cpu" or "ggml"); returns the process exit code (1 if any
    case failed or none matched)."""
    cases = select(all_cases(), op_name)
    if not cases:
        out.write(f"no test case for op '{op_name}'\n")
        return 1
    backend = init_backend(backend_name)
    try:
        reference, limits = reference_backend(against)
    except BaseException:
        backend.free()
        raise
    width = max(len(c.desc) for c in cases)
    out.write(f"Testing backend {backend.name()} against {reference.name()} ({len(cases)} cases)\n")
    out.write(f"  {'OP':<18} {'CASE':<{width}}  {'NMSE':>10}  RESULT\n")
    results: list[CaseResult] = []
    try:
        for case in cases:
            r = run_case(case, backend, reference, limits)
            results.append(r)
            nmse = "" if r.nmse is None else f"{r.nmse:.3e}"
            line = f"  {case.label:<18} {case.desc:<{width}}  {nmse:>10}  {r.status}"
            if r.detail and (r.status == "FAIL" or verbose):
                line += f" ({r.detail})"
            out.write(line + "\n")
    finally:
        backend.free()
        reference.free()
    _summary(results, out)
    counts = {s: sum(r.status == s for r in results) for s in ("OK", "FAIL", "not supported")}
    out.write(f"{counts['OK']}/{len(cases)} passed, {counts['FAIL']} failed, "
              f"{counts['not supported']} not supported\n")
    return 1 if counts["FAIL"] else 0
