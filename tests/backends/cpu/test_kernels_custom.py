"""CPU kernels of MAP_CUSTOM1/2/3: the user's callable gets the tensors, once per task."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kernel_helpers import F16, F32, assert_close, compile_node, new_ctx, run, stored, tensor

from pyggml.backends.cpu.kernels import ComputeParams, custom
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType


def _rows(t: Tensor, ith: int, nth: int) -> slice:
    """Task ith's share of the rows (ne1), as ggml's custom ops split work."""
    n = t.ne[1]
    per = (n + nth - 1) // nth
    return slice(per * ith, min(n, per * ith + per))


def twice_plus_one(dst: Tensor, a: Tensor, ith: int, nth: int, userdata: Any) -> None:
    r = _rows(dst, ith, nth)
    dst.numpy()[:, :, r] = a.numpy()[:, :, r].astype(np.float32) * 2 + 1


@pytest.mark.parametrize("type", [F32, F16])
@pytest.mark.parametrize("n_tasks,n_threads", [(1, 1), (-1, 2), (3, 2), (4, 8)])
def test_map_custom1(type: GGMLType, n_tasks: int, n_threads: int, rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 7)).astype(np.float32)
    calls: list[tuple[int, int]] = []

    def fun(dst: Tensor, a: Tensor, ith: int, nth: int, userdata: Any) -> None:
        userdata.append((ith, nth))
        twice_plus_one(dst, a, ith, nth, None)

    ctx = new_ctx()
    node = ctx.map_custom1(tensor(ctx, type, x), fun, n_tasks, calls)
    assert custom.supports(node)
    got = run(node, ComputeParams(n_threads=n_threads))
    assert_close(got, stored(type, stored(type, x) * 2 + 1), type)
    nth = n_threads if n_tasks == -1 else min(n_tasks, n_threads)
    assert calls == [(i, nth) for i in range(nth)]


def test_map_custom2_and_3(rng: np.random.Generator) -> None:
    a, b, c = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    ctx = new_ctx()
    ta, tb, tc = tensor(ctx, F32, a), tensor(ctx, F32, b), tensor(ctx, F32, c)

    def f2(dst: Tensor, x: Tensor, y: Tensor, ith: int, nth: int, userdata: Any) -> None:
        dst.numpy()[...] = x.numpy() * y.numpy() - userdata

    def f3(dst: Tensor, x: Tensor, y: Tensor, z: Tensor, ith: int, nth: int, userdata: Any) -> None:
        dst.numpy()[...] = x.numpy() + y.numpy() * z.numpy()

    n2 = ctx.map_custom2(ta, tb, f2, 1, 1.0)
    n3 = ctx.map_custom3(ta, tb, tc, f3, 1, None)
    assert n2.op == GGMLOp.MAP_CUSTOM2 and n3.op == GGMLOp.MAP_CUSTOM3
    assert_close(run(n2), a * b - 1.0, F32)
    assert_close(run(n3), a + b * c, F32)


def test_map_custom_inplace_and_rerun(rng: np.random.Generator) -> None:
    ctx = new_ctx()
    t = tensor(ctx, F32, np.ones((2, 3), np.float32))
    node = ctx.map_custom1_inplace(t, twice_plus_one, 1, None)
    fn = compile_node(node)
    fn()
    fn()
    np.testing.assert_array_equal(t.numpy()[0, 0], np.full((2, 3), 7.0, np.float32))


def test_node_without_function_is_not_supported() -> None:
    ctx = new_ctx()
    a = ctx.new_tensor_1d(F32, 4)
    node = ctx.dup_tensor(a)
    node.op, node.src[0] = GGMLOp.MAP_CUSTOM1, a
    assert not custom.supports(node)
