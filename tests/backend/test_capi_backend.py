"""Every function of ggml-backend.h (plus ggml_backend_buffer_init) by its C name, used the C way."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml.capi.backend as capi_backend
from pyggml.capi.backend import (
    ggml_backend_alloc_buffer,
    ggml_backend_buffer_free,
    ggml_backend_buffer_free_tensor,
    ggml_backend_buffer_get_alignment,
    ggml_backend_buffer_get_alloc_size,
    ggml_backend_buffer_get_base,
    ggml_backend_buffer_get_size,
    ggml_backend_buffer_i,
    ggml_backend_buffer_init,
    ggml_backend_buffer_init_tensor,
    ggml_backend_cpu_buffer_from_ptr,
    ggml_backend_cpu_init,
    ggml_backend_cpu_set_n_threads,
    ggml_backend_free,
    ggml_backend_get_alignment,
    ggml_backend_graph_compute,
    ggml_backend_graph_plan_compute,
    ggml_backend_graph_plan_create,
    ggml_backend_graph_plan_free,
    ggml_backend_is_cpu,
    ggml_backend_name,
    ggml_backend_supports_op,
    ggml_backend_synchronize,
    ggml_backend_tensor_copy,
    ggml_backend_tensor_get,
    ggml_backend_tensor_get_async,
    ggml_backend_tensor_set,
    ggml_backend_tensor_set_async,
    ggml_get_backend,
    ggml_graph_compute_with_ctx,
)
from pyggml.core.context import Context
from pyggml.core.errors import BufferFreedError, LayoutError, OutOfBoundsError
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType

F32 = GGMLType.F32

# the seed's ggml-backend.h, in order, plus ggml_backend_buffer_init
SEED_FUNCTIONS = [
    "ggml_backend_buffer_free", "ggml_backend_buffer_get_alignment", "ggml_backend_buffer_get_base",
    "ggml_backend_buffer_get_size", "ggml_backend_buffer_get_alloc_size", "ggml_backend_buffer_init_tensor",
    "ggml_backend_buffer_free_tensor", "ggml_get_backend", "ggml_backend_name", "ggml_backend_free",
    "ggml_backend_alloc_buffer", "ggml_backend_get_alignment", "ggml_backend_tensor_set_async",
    "ggml_backend_tensor_get_async", "ggml_backend_tensor_set", "ggml_backend_tensor_get",
    "ggml_backend_synchronize", "ggml_backend_graph_plan_create", "ggml_backend_graph_plan_free",
    "ggml_backend_graph_plan_compute", "ggml_backend_graph_compute", "ggml_backend_supports_op",
    "ggml_backend_tensor_copy", "ggml_backend_cpu_init", "ggml_backend_is_cpu", "ggml_backend_cpu_set_n_threads",
    "ggml_backend_cpu_buffer_from_ptr", "ggml_backend_buffer_init", "ggml_graph_compute_with_ctx",
]


def test_every_seed_function_is_exported() -> None:
    import pyggml.capi as capi

    for name in SEED_FUNCTIONS:
        assert callable(getattr(capi_backend, name)), name
        assert name in capi_backend.__all__, name
        assert getattr(capi, name) is getattr(capi_backend, name), name


def place(t: Tensor, buffer: object, offset: int) -> None:
    """What ggml_tallocr_alloc does for one tensor: data inside the buffer, then init_tensor."""
    t.data = ggml_backend_buffer_get_base(buffer) + offset
    t.buffer = buffer
    ggml_backend_buffer_init_tensor(buffer, t)


def test_a_c_style_program() -> None:
    backend = ggml_backend_cpu_init()
    assert ggml_backend_is_cpu(backend)
    assert ggml_backend_name(backend) == "CPU" and ggml_backend_name(None) == "NULL"
    assert ggml_backend_get_alignment(backend) == 64
    ggml_backend_cpu_set_n_threads(backend, 1)
    assert backend.n_threads == 1

    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    b = ctx.new_tensor_1d(F32, 4).set_name("b")
    c = ctx.add(a, b).set_name("c")
    graph = ctx.new_graph()
    graph.build_forward_expand(c)
    assert ggml_backend_supports_op(backend, c)

    buffer = ggml_backend_alloc_buffer(backend, 3 * 64)
    assert ggml_backend_buffer_get_size(buffer) == 192
    assert ggml_backend_buffer_get_alignment(buffer) == 64
    assert ggml_backend_buffer_get_base(buffer) % 64 == 0
    assert ggml_backend_buffer_get_alloc_size(buffer, a) == 16
    for i, t in enumerate((a, b, c)):
        place(t, buffer, 64 * i)
    assert ggml_get_backend(a) is backend

    ggml_backend_tensor_set(a, np.array([1, 2, 3, 4], np.float32), 0, 16)
    ggml_backend_tensor_set_async(b, np.full(4, 10, np.float32), 0, 16)
    ggml_backend_synchronize(backend)
    ggml_backend_graph_compute(backend, graph)
    out = np.zeros(4, np.float32)
    ggml_backend_tensor_get(c, out, 0, 16)
    np.testing.assert_array_equal(out, [11, 12, 13, 14])

    plan = ggml_backend_graph_plan_create(backend, graph)
    ggml_backend_tensor_set(a, np.zeros(4, np.float32), 0, 16)
    ggml_backend_graph_plan_compute(backend, plan)
    part = np.zeros(2, np.float32)
    ggml_backend_tensor_get_async(c, part, 8, 8)
    ggml_backend_synchronize(backend)
    np.testing.assert_array_equal(part, [10, 10])
    ggml_backend_graph_plan_free(backend, plan)

    ggml_backend_tensor_copy(c, a)
    ggml_backend_tensor_get(a, out, 0, 16)
    np.testing.assert_array_equal(out, 10)
    with pytest.raises(OutOfBoundsError):
        ggml_backend_tensor_set(a, np.zeros(8, np.float32), 0, 32)

    ggml_backend_buffer_free_tensor(buffer, a)
    ggml_backend_buffer_free(buffer)
    ggml_backend_buffer_free(None)
    with pytest.raises(BufferFreedError):
        ggml_backend_tensor_get(a, out, 0, 16)
    ggml_backend_free(backend)
    ggml_backend_free(None)
    assert backend.freed


def test_cpu_buffer_from_ptr_and_copy_layout_check() -> None:
    backend = ggml_backend_cpu_init()
    mem = np.zeros(32, np.float32)
    buffer = ggml_backend_cpu_buffer_from_ptr(backend, mem, mem.nbytes)
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    x = ctx.new_tensor_2d(F32, 4, 2).set_name("x")
    y = ctx.new_tensor_2d(F32, 2, 4).set_name("y")
    place(x, buffer, 0)
    place(y, buffer, 64)
    ggml_backend_tensor_set(x, np.arange(8, dtype=np.float32), 0, 32)
    np.testing.assert_array_equal(mem[:8], np.arange(8))
    with pytest.raises(LayoutError):
        ggml_backend_tensor_copy(x, y)
    np.testing.assert_array_equal(mem[16:24], 0)
    ggml_backend_buffer_free(buffer)
    assert mem[3] == 3


def test_buffer_init_with_an_iface_struct() -> None:
    freed: list[object] = []
    store = np.zeros(128, np.uint8)
    iface = ggml_backend_buffer_i(
        free_buffer=lambda buf: freed.append(buf.context),
        get_base=lambda buf: store.__array_interface__["data"][0],
        get_alloc_size=lambda buf, t: 2 * t.nbytes(),
    )
    backend = ggml_backend_cpu_init()
    buffer = ggml_backend_buffer_init(backend, iface, "my-context", 128)
    t = Context(mem_size=1 << 16, no_alloc=True).new_tensor_1d(F32, 4)
    assert ggml_backend_buffer_get_base(buffer) == store.__array_interface__["data"][0]
    assert ggml_backend_buffer_get_alloc_size(buffer, t) == 32
    assert ggml_backend_buffer_get_size(buffer) == 128
    ggml_backend_buffer_free(buffer)
    assert freed == ["my-context"]


def test_graph_compute_with_ctx() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=False)
    a = ctx.new_tensor_1d(F32, 3)
    s = ctx.scale(a, 0.5)
    graph = ctx.new_graph()
    graph.build_forward_expand(s)
    a.numpy()[...] = [2, 4, 6]
    ggml_graph_compute_with_ctx(ctx, graph, 1)
    np.testing.assert_array_equal(s.numpy().ravel(), [1, 2, 3])
