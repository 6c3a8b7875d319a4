"""Every unary function, LOG and the GELU GLUs, bit for bit libggml's CPU (ggml-cpu's per-element functions:
libm's f32 functions in ggml's order, GCC's fma contraction, its f16 tables, NaN where its comparisons send it):
over every F16 and BF16 value, and F32 values of every magnitude with the specials."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.kernels import element_math
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.ops import elementwise as ew
from pyggml.core.tensor import Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
N = 1 << 16


def _values(type: GGMLType) -> np.ndarray:
    """Every f16 / bf16 (as its bits for BF16); for F32, every f16 value widened and random values of every
    exponent, with the specials."""
    every = np.arange(N, dtype=np.uint16)
    if type == F16:
        return every.view(np.float16)
    if type == BF16:
        return every
    rng = np.random.default_rng(7)
    spread = rng.standard_normal(N // 2).astype(np.float32) * np.exp2(rng.integers(-40, 40, N // 2)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 10.0, -10.0, 20.0, 3e38, -3e38], np.float32)
    values = np.concatenate([every.view(np.float16).astype(np.float32), spread, specials])
    return values[:N]


def _as_f32(type: GGMLType, raw: np.ndarray) -> np.ndarray:
    if type == BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def _bits(type: GGMLType, raw: np.ndarray) -> np.ndarray:
    return raw.view(np.uint32 if type == F32 else np.uint16)


def _check(ctx: Context, inputs: list[Tensor], values: list[np.ndarray], outs: dict[str, Tensor]) -> None:
    from pyggml.testing import ggml_c

    cpu = cpu_init(1)
    buffer = alloc_ctx_tensors(ctx, cpu)
    try:
        for t, v in zip(inputs, values, strict=True):
            tensor_set_numpy(t, v)
        differ = {}
        for name, out in outs.items():
            theirs = ggml_c.compute_like(out)
            graph = Graph()
            graph.build_forward_expand(out)
            with np.errstate(all="ignore"):
                cpu.graph_compute(graph)
            mine = tensor_get_numpy(out)
            a, b = _as_f32(out.type, mine), _as_f32(out.type, theirs)
            bad = (_bits(out.type, mine) != _bits(out.type, theirs)) & ~(np.isnan(a) & np.isnan(b))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                differ[name] = f"{int(bad.sum())} values, first at {i}: {a[i]!r} vs ggml's {b[i]!r}"
        assert not differ, differ
    finally:
        buffer.free()
        cpu.free()


@pytest.mark.parametrize("type", [F32, F16, BF16])
def test_unary_functions_are_ggml_bit_for_bit(ggml_reference: object, type: GGMLType) -> None:
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    x = ctx.new_tensor_1d(type, N)
    outs = {op.name: ew.unary(ctx, x, op) for op in UnaryOp if op != UnaryOp.XIELU}
    outs["LOG"] = ew.log(ctx, x)
    _check(ctx, [x], [_values(type)], outs)


@pytest.mark.parametrize("type", [F32, F16, BF16])
def test_gelu_glus_are_ggml_bit_for_bit(ggml_reference: object, type: GGMLType) -> None:
    """GEGLU's table (f16 data, and F32 data rounded to f16 between its -10 and 10 shortcuts), GEGLU_QUICK's,
    BF16's direct formulas, GEGLU_ERF's erf, each times a gate."""
    from pyggml.core.ops.glu import geglu_erf_split, geglu_quick_split, geglu_split

    ctx = Context(mem_size=1 << 22, no_alloc=True)
    x, g = ctx.new_tensor_1d(type, N), ctx.new_tensor_1d(type, N)
    gate = np.linspace(-2.0, 2.0, N, dtype=np.float32)
    gate = gate.astype(np.float16) if type == F16 else gate
    gate = (gate.view(np.uint32) >> 16).astype(np.uint16) if type == BF16 else gate
    outs = {"GEGLU": geglu_split(ctx, x, g), "GEGLU_QUICK": geglu_quick_split(ctx, x, g),
            "GEGLU_ERF": geglu_erf_split(ctx, x, g)}
    _check(ctx, [x, g], [_values(type), gate], outs)


def test_gelu_tables_are_gelu_of_every_f16_rounded_to_f16() -> None:
    x = np.arange(N, dtype=np.uint16).view(np.float16).astype(np.float32)
    for name in ("gelu", "gelu_quick"):
        table = element_math.f16_table(name)
        with np.errstate(all="ignore"):
            want = element_math.ufunc(name)(x).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(table, want)
        assert not table.flags.writeable
    with pytest.raises(ArgumentError, match="silu"):
        element_math.f16_table("silu")
    with pytest.raises(ArgumentError, match="'gelu_fast'"):
        element_math.ufunc("gelu_fast")
