"""CPU plans follow tensors whose memory moved after planning, as ggml's kernels read `data` when they run.

The one-token decoding graphs rely on it: their KV-cache writes move one cell
per token while the plan is made once.
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32


def test_plan_writes_where_a_moved_view_points_now() -> None:
    """A CPY into a view of a 'cache' (a row and a strided column, as K and V^T): moving the views between
    computes moves the writes; nothing is written at the old places again."""
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, 4).set_name("x")
    cache = ctx.new_tensor_2d(F32, 4, 6).set_name("cache")  # 6 rows of 4
    cache_t = ctx.new_tensor_2d(F32, 6, 4).set_name("cache_t")  # 4 rows of 6: cell j is column j
    row = ctx.view_1d(cache, 4, 0)
    col = ctx.view_2d(cache_t, 1, 4, cache_t.nb[1], 0)
    y = ctx.scale(x, 2.0)
    w_row = ctx.cpy(y, row)
    w_col = ctx.cpy(ctx.transpose(ctx.reshape_2d(y, 4, 1)), col)
    g = ctx.new_graph()
    g.build_forward_expand(w_row)
    g.build_forward_expand(w_col)
    buf = alloc_ctx_tensors(ctx, backend)
    tensor_set(cache, np.zeros(24, np.float32))
    tensor_set(cache_t, np.zeros(24, np.float32))
    plan = backend.graph_plan_create(g)
    for cell in range(3):
        if cell:
            for view, node, step in ((row, w_row, 16), (col, w_col, 4)):
                for t in (view, node):
                    t.view_offs += step
                    t.data += step
        tensor_set(x, np.arange(4, dtype=np.float32) + 10 * cell)
        backend.graph_plan_compute(plan)
    want = np.zeros((6, 4), np.float32)
    for cell in range(3):
        want[cell] = 2 * (np.arange(4) + 10 * cell)
    np.testing.assert_array_equal(tensor_get_numpy(cache).reshape(6, 4), want)
    np.testing.assert_array_equal(tensor_get_numpy(cache_t).reshape(4, 6), want.T)
    backend.graph_plan_free(plan)
    buf.free()


def test_plan_follows_tensors_allocated_elsewhere() -> None:
    """Intermediates and inputs given new memory (another buffer) after planning: the plan reads and writes there."""
    backend = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 8).set_name("a")
    b = ctx.add(ctx.mul(a, a), a).set_name("b")
    g = ctx.new_graph()
    g.build_forward_expand(b)
    first = alloc_ctx_tensors(ctx, backend)
    tensor_set(a, np.arange(8, dtype=np.float32))
    plan = backend.graph_plan_create(g)
    backend.graph_plan_compute(plan)
    before = tensor_get_numpy(b).copy()
    np.testing.assert_array_equal(before, np.arange(8) ** 2 + np.arange(8))
    for t in ctx.tensors:
        t.data = None
        t.buffer = None
    second = alloc_ctx_tensors(ctx, backend)
    assert second is not first
    tensor_set(a, -np.arange(8, dtype=np.float32))
    backend.graph_plan_compute(plan)
    np.testing.assert_array_equal(tensor_get_numpy(b), np.arange(8) ** 2 - np.arange(8))
    first.free()  # the plan no longer uses the first buffer
    backend.graph_plan_compute(plan)
    second.free()
