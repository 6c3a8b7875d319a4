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
)

from pyggml.backends.cpu.kernels import reduce
from pyggml.core.context import Context
from pyggml.core.errors import GGMLError
from pyggml.core.tensor import GGMLOp, Tensor
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


def spaced_rows(ctx: Context, type: GGMLType, x: np.ndarray) -> Tensor:
    """A non-contiguous matrix holding `x` (rows, cols): its rows 3 elements apart, each row's elements
    contiguous (what ggml's row kernels take)."""
    rows, cols = x.shape
    base = tensor(ctx, type, np.pad(x, ((0, 0), (1, 2))))
    return ctx.view_2d(base, cols, rows, base.nb[1], base.nb[0])


@pytest.mark.parametrize("type", TYPES)
def test_argmax(type: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 9)).astype(np.float32)
    x[2, 3] = x[2, 7] = 10.0  # ties: the first one wins
    ctx = new_ctx()
    node = build(ctx, "argmax", spaced_rows(ctx, type, x), op=GGMLOp.ARGMAX, type=I32, ne=[5])
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
    x = rng.permutation(6 * 16).reshape(6, 16).astype(np.float32) / 8  # distinct values
    ctx = new_ctx()
    node = ctx.argsort(spaced_rows(ctx, type, x), order)
    got = run(node)[0, 0]
    xs = stored(type, x)
    for i1 in range(6):
        row = list(xs[i1])
        want = sorted(range(16), key=lambda i, r=row: r[i], reverse=order == 1)
        assert list(got[i1]) == want


def ggml_row_reads(base: np.ndarray, t: Tensor, flat: bool) -> np.ndarray:
    """The rows of `t` (a view of the contiguous `base`) as ggml's row kernels read them, written from their
    pointer arithmetic: row (i1, i2, i3) from byte i1 nb1 + i2 nb2 + i3 nb3 (`flat`: row i = i1 + ne1 (i2 + ne2 i3)
    from byte i nb1), ne0 elements one after another, whatever nb0 is."""
    words = base.reshape(-1)
    es = t.nb[0] if t.nb[0] < t.nb[1] else base.itemsize
    rows = []
    for i3 in range(t.ne[3]):
        for i2 in range(t.ne[2]):
            for i1 in range(t.ne[1]):
                r = i1 + t.ne[1] * (i2 + t.ne[2] * i3)
                start = r * t.nb[1] if flat else i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
                rows.append(words[start // es: start // es + t.ne[0]])
    return np.array(rows).reshape(t.ne[3], t.ne[2], t.ne[1], t.ne[0])


@pytest.mark.parametrize("op", ["sum", "mean", "argmax", "argsort", "top_k"])
def test_a_source_with_strided_elements_is_read_as_ggml_reads_it(op: str, rng: np.random.Generator) -> None:
    # ggml's kernels take each row's elements to be contiguous (their nb0 assert is compiled out): llama.cpp's
    # test-backend-ops holds every backend to the result of that reading (SUM of a transposed [256, 33])
    x = rng.permutation(9 * 5).reshape(9, 5).astype(np.float32) / 8  # distinct values: no ties to break
    ctx = new_ctx()
    base = tensor(ctx, F32, x)
    t = ctx.transpose(base)  # ne [9, 5], nb0 = 5 floats, nb1 = 1 float
    node = {"sum": ctx.sum, "mean": ctx.mean, "argmax": ctx.argmax, "argsort": ctx.argsort,
            "top_k": lambda a: ctx.top_k(a, 3)}[op](t)
    rows = ggml_row_reads(x, t, flat=op in ("argsort", "top_k")).astype(np.float64)
    got = run(node)
    if op == "sum":
        np.testing.assert_allclose(got.reshape(()), rows.sum(), rtol=1e-6)
    elif op == "mean":
        np.testing.assert_allclose(got[..., 0], rows.mean(axis=-1), rtol=1e-6)
    elif op == "argmax":
        np.testing.assert_array_equal(got.reshape(-1), rows[0, 0].argmax(axis=-1))
    else:
        want = np.argsort(-rows, axis=-1) if op == "top_k" else np.argsort(rows, axis=-1)
        np.testing.assert_array_equal(got, want[..., :got.shape[-1]])



def test_supports_and_errors() -> None:
    ctx = new_ctx()
    f = tensor(ctx, F32, np.zeros((3, 4), np.float32))
    node = build(ctx, "argmax", f, op=GGMLOp.ARGMAX, type=I32, ne=[3])
    assert reduce.supports(node)
    bad = manual_node(ctx, GGMLOp.SUM_ROWS, [ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2)], type=F32, ne=[1, 2])
    assert not reduce.supports(bad)
    with pytest.raises(GGMLError, match="SUM_ROWS"):
        compile_node(bad)
