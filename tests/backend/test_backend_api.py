"""Backend and Buffer public wrappers: buffer_init, lifecycles, graph checks, the registry."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.backends.cpu import CPUBackend, CPUBuffer, cpu_init
from pyggml.backends.cpu.buffer import cpu_alloc_buffer
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, BufferFreedError, GGMLError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    Backend,
    BufferInterface,
    buffer_init,
    init_backend,
    list_backends,
    register_backend,
    tensor_get_numpy,
    tensor_set,
    unregister_backend,
)
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32


class NothingBackend(Backend):
    """A tiny backend with host memory that supports no op at all."""

    def __init__(self) -> None:
        super().__init__()
        self.computed = 0

    def _get_name(self) -> str:
        return "Nothing"

    def _alloc_buffer(self, size: int) -> CPUBuffer:
        return cpu_alloc_buffer(self, size)

    def _get_alignment(self) -> int:
        return 32

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        cpu_init()._set_tensor_async(tensor, data, offset, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        cpu_init()._get_tensor_async(tensor, data, offset, size)

    def _graph_compute(self, graph: Graph) -> None:
        self.computed += 1

    def _supports_op(self, op: Tensor) -> bool:
        return False


# --- buffer_init ---


def test_buffer_init_calls_the_interface() -> None:
    calls: list[str] = []
    memory = np.zeros(256, np.uint8)
    iface = BufferInterface(
        get_base=lambda buf: calls.append("get_base") or 0x1000,
        free_buffer=lambda buf: calls.append(f"free:{buf.context}"),
        init_tensor=lambda buf, t: calls.append(f"init:{t.name}"),
    )
    backend = cpu_init()
    buf = buffer_init(backend, iface, "ctx0", 256)
    t = Context(mem_size=1 << 16, no_alloc=True).new_tensor_1d(F32, 10).set_name("t")
    assert buf.get_base() == 0x1000
    assert buf.get_size() == 256
    assert buf.get_alignment() == 64  # the backend's
    assert buf.get_alloc_size(t) == 40  # default: ggml_nbytes
    buf.init_tensor(t)
    buf.free_tensor(t)  # NULL entry: nothing
    buf.free()
    buf.free()
    assert calls == ["get_base", "init:t", "free:ctx0"]
    with pytest.raises(BufferFreedError):
        buf.get_base()
    del memory


def test_buffer_init_with_dict_iface_and_alloc_size() -> None:
    buf = buffer_init(None, {"get_base": lambda b: 64, "get_alloc_size": lambda b, t: 1000}, None, 10)
    t = Context(mem_size=1 << 16, no_alloc=True).new_tensor_1d(F32, 1)
    assert buf.get_alloc_size(t) == 1000
    with pytest.raises(GGMLError, match="no backend"):
        buf.get_alignment()


def test_buffer_init_requires_get_base() -> None:
    with pytest.raises(ArgumentError, match="get_base"):
        buffer_init(None, BufferInterface(), None, 16)
    with pytest.raises(ArgumentError):
        buffer_init(None, BufferInterface(get_base=lambda b: 1), None, -1)
    with pytest.raises(GGMLError, match="NULL"):
        buffer_init(None, BufferInterface(get_base=lambda b: 0), None, 8).get_base()


# --- lifecycles ---


def test_buffers_and_backends_are_context_managers() -> None:
    with cpu_init() as backend:
        with backend.alloc_buffer(128) as buf:
            assert buf.get_size() == 128
            assert not buf.freed
        assert buf.freed
        with pytest.raises(BufferFreedError):
            buf.get_base()
        assert not backend.freed
    assert backend.freed
    with pytest.raises(BufferFreedError, match="backend 'CPU'"):
        backend.alloc_buffer(16)
    backend.free()  # twice is harmless


def test_alloc_buffer_rejects_negative_size() -> None:
    with pytest.raises(ArgumentError, match="-5 bytes"):
        cpu_init().alloc_buffer(-5)


# --- graph checks ---


def small_graph(backend: Backend) -> tuple[Graph, dict[str, Tensor], CPUBuffer]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    b = ctx.new_tensor_1d(F32, 4).set_name("b")
    c = ctx.add(a, b).set_name("c")
    d = ctx.unary(c, UnaryOp.NEG).set_name("d")
    g = ctx.new_graph()
    g.build_forward_expand(d)
    buf = alloc_ctx_tensors(ctx, backend)
    assert isinstance(buf, CPUBuffer)
    tensor_set(a, np.arange(4, dtype=np.float32))
    tensor_set(b, np.ones(4, np.float32))
    tensor_set(c, np.full(4, 9, np.float32))
    tensor_set(d, np.full(4, 9, np.float32))
    return g, {"a": a, "b": b, "c": c, "d": d}, buf


def test_unsupported_op_raises_before_anything_runs() -> None:
    backend = NothingBackend()
    g, ts, buf = small_graph(backend)
    assert buf.array is not None
    before = buf.array.tobytes()
    with pytest.raises(UnsupportedOpError) as e:
        backend.graph_compute(g)
    msg = str(e.value)
    assert "'Nothing'" in msg and "ADD" in msg and "node 0 'c'" in msg
    assert backend.computed == 0
    with pytest.raises(UnsupportedOpError):
        backend.graph_plan_create(g)
    assert buf.array.tobytes() == before
    assert not backend.supports_op(ts["c"])


def test_unallocated_node_raises_before_anything_runs() -> None:
    backend = cpu_init()
    g, ts, buf = small_graph(backend)
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    e = ctx.unary(ts["d"], UnaryOp.ABS).set_name("e")  # no memory
    g.build_forward_expand(e)
    assert buf.array is not None
    before = buf.array.tobytes()
    with pytest.raises(NotAllocatedError, match=r"node 2 'e' \(ABS\) is not allocated"):
        backend.graph_compute(g)
    assert buf.array.tobytes() == before  # c and d were not computed
    np.testing.assert_array_equal(tensor_get_numpy(ts["c"]), 9)


def test_freed_buffer_in_graph_raises() -> None:
    backend = cpu_init()
    g, ts, buf = small_graph(backend)
    buf.free()
    with pytest.raises(BufferFreedError, match=r"node 0 'c' \(ADD\) is in buffer 'CPU' \(256 bytes\), which was freed"):
        backend.graph_compute(g)


def test_graph_compute_computes_in_order() -> None:
    backend = cpu_init()
    g, ts, buf = small_graph(backend)
    backend.graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(ts["d"]), -(np.arange(4) + 1))


# --- registry ---


def test_registry_finds_cpu_by_name() -> None:
    assert "cpu" in list_backends()
    for name in ("cpu", "CPU"):
        b = init_backend(name)
        assert isinstance(b, CPUBackend) and b.name() == "CPU"
    with pytest.raises(ArgumentError, match="no backend named 'vulkan'"):
        init_backend("vulkan")
    with pytest.raises(ArgumentError):
        init_backend("cpu:1")


def test_registry_passes_the_argument_after_the_colon() -> None:
    seen: list[str | None] = []

    def factory(arg: str | None = None) -> Backend:
        seen.append(arg)
        return NothingBackend()

    register_backend("nothing", factory)
    try:
        assert "nothing" in list_backends()
        assert init_backend("Nothing").name() == "Nothing"
        init_backend("nothing:dev:0")
        assert seen == [None, "dev:0"]
    finally:
        unregister_backend("nothing")
    assert "nothing" not in list_backends()
    with pytest.raises(ArgumentError):
        register_backend("a:b", factory)
