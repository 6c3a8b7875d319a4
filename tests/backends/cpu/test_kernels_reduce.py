"""CPU kernels of the reductions against numpy references written here from ggml's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (
    F16,
    F32,
    assert_close,
    build,
    compile_node,
    manual_node,
    new_ctx,
    permuted,
    run,
    stored,
    tensor,
    transposed,
)

from pyggml.backends.cpu.kernels import reduce
from pyggml.core.errors import GGMLError
from pyggml.core.tensor import GGMLOp
from pyggml.core.types import GGMLType

TYPES = [F32, F16]
I32 = GGMLType.I32


@pytest.mark.parametrize("type", TYPES)
def test_sum(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4, 50)).astype(np.float32)
    ctx = new_ctx()
    node = build(ctx, "sum", permuted(ctx, type, x), op=GGMLOp.SUM, ne=[1])
    total = 0.0
    for v in stored(type, x).reshape(-1):
        total += float(v)
    assert_close(run(node), stored(node.type, np.array([total])).reshape(1, 1, 1, 1), node.type)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("op", [GGMLOp.SUM_ROWS, GGMLOp.MEAN])
def test_sum_rows_and_mean(type: GGMLType, op: GGMLOp, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4, 33)).astype(np.float32)
    ctx = new_ctx()
    name = "sum_rows" if op == GGMLOp.SUM_ROWS else "mean"
    node = build(ctx, name, permuted(ctx, type, x), op=op, ne=[1, 4, 3, 2])
    xs = stored(type, x).astype(np.float64)
    want = np.zeros((2, 3, 4, 1))
    for i3 in range(2):
        for i2 in range(3):
            for i1 in range(4):
                s = xs[i3, i2, i1].sum()
                want[i3, i2, i1, 0] = s / 33 if op == GGMLOp.MEAN else s
    assert_close(run(node), stored(node.type, want), node.type, atol=1e-5 if node.type == F32 else 2e-3)


@pytest.mark.parametrize("type", TYPES)
def test_argmax(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 9)).astype(np.float32)
    x[2, 3] = x[2, 7] = 10.0  # ties: the first one wins
    ctx = new_ctx()
    node = build(ctx, "argmax", transposed(ctx, type, x), op=GGMLOp.ARGMAX, type=I32, ne=[5])
    xs = stored(type, x)
    want = []
    for row in xs:
        best, idx = -np.inf, 0
        for i, v in enumerate(row):
            if v > best:
                best, idx = v, i
        want.append(idx)
    np.testing.assert_array_equal(run(node).reshape(-1), want)


@pytest.mark.parametrize("type", TYPES)
@pytest.mark.parametrize("order", [0, 1])
def test_argsort(type: GGMLType, order: int, rng: np.random.Generator) -> None:
    x = rng.permutation(2 * 3 * 16).reshape(2, 3, 16).astype(np.float32) / 8  # distinct values
    ctx = new_ctx()
    t = transposed(ctx, type, x)
    if hasattr(ctx, "argsort"):
        node = ctx.argsort(t, order)
    else:
        node = build(ctx, "argsort", t, op=GGMLOp.ARGSORT, type=I32, params=[order])
    got = run(node)[0]
    xs = stored(type, x)
    for i2 in range(2):
        for i1 in range(3):
            row = list(xs[i2, i1])
            want = sorted(range(16), key=lambda i, r=row: r[i], reverse=order == 1)
            assert list(got[i2, i1]) == want


def test_supports_and_errors() -> None:
    ctx = new_ctx()
    f = tensor(ctx, F32, np.zeros((3, 4), np.float32))
    node = build(ctx, "argmax", f, op=GGMLOp.ARGMAX, type=I32, ne=[3])
    assert reduce.supports(node)
    bad = manual_node(ctx, GGMLOp.SUM_ROWS, [ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2)], type=F32, ne=[1, 2])
    assert not reduce.supports(bad)
    with pytest.raises(GGMLError, match="SUM_ROWS"):
        compile_node(bad)
