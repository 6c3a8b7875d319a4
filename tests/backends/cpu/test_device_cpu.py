"""The CPU backend's registry, device and buffer types; buffers of no backend; graph copies; weights loaded
through the device's capabilities."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.alloc import alloc_ctx_tensors, alloc_ctx_tensors_from_buft
from pyggml.alloc.ctx_tensors import alloc_size
from pyggml.backends.cpu import CPUBackend, CPUBuffer, cpu_buffer_type, cpu_device, cpu_init, cpu_reg
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, NotAllocatedError, OutOfBoundsError
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    SIZE_MAX,
    BufferUsage,
    DeviceType,
    compare_graph_backend,
    graph_copy,
    host_memory,
    init_backend,
    tensor_alloc,
    tensor_get_numpy,
    tensor_set_numpy,
    view_init,
)
from pyggml.gguf.loader import load_tensors, maps_weights
from pyggml.gguf.reader import read_gguf
from pyggml.models import builtin_model_path
from pyggml.seed import Scheduler

F32 = GGMLType.F32


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def test_the_cpu_device() -> None:
    dev = cpu_device()
    props = dev.get_props()
    assert (props.name, props.type, props.device_id) == ("CPU", DeviceType.CPU, None) and props.description
    assert 0 < props.memory_free <= props.memory_total == host_memory()[1]
    caps = props.caps
    assert caps.buffer_from_host_ptr and caps.mmap_support
    assert not (caps.async_ or caps.host_buffer or caps.events)
    assert dev.backend_reg() is cpu_reg() and cpu_reg().devices() == [dev] and cpu_reg().name() == "CPU"
    assert dev.event_new() is None and dev.host_buffer_type() is None
    backend = dev.init_backend()
    assert isinstance(backend, CPUBackend) and backend.get_device() is dev
    # each CPU backend allocates from a buffer type of its own, laid out as the device's (see CPUBufferType)
    own = backend.get_default_buffer_type()
    assert backend.plans_follow_moves() and own is not cpu_buffer_type() and own.owner is backend
    assert own.name() == "CPU" and own.get_alignment() == 64 and own.get_device() is cpu_device()
    assert backend.supports_buft(own) and backend.supports_buft(cpu_buffer_type())
    assert not cpu_init().supports_buft(own) and not cpu_device().supports_buft(own)


def test_cpu_buffer_type(ctx: Context) -> None:
    buft = cpu_buffer_type()
    t = ctx.new_tensor_2d(F32, 5, 3)
    assert buft.name() == "CPU" and buft.get_alignment() == 64 and buft.get_max_size() == SIZE_MAX
    assert buft.is_host() and buft.get_alloc_size(t) == t.nbytes() and buft.get_device() is cpu_device()
    buf = buft.alloc_buffer(1000)
    assert isinstance(buf, CPUBuffer) and buf.backend is None and buf.buft is buft and buf.name == "CPU"
    assert buf.get_base() % 64 == 0 and buf.get_alignment() == 64 and buf.is_host()
    assert cpu_device().supports_buft(buft) and cpu_device().supports_buft(cpu_device().mapped_buft)
    buf.free()


def test_a_buffer_of_no_backend_is_written_read_and_computed_with(ctx: Context) -> None:
    a = ctx.new_tensor_2d(F32, 4, 3).set_name("a")
    b = ctx.new_tensor_1d(F32, 4).set_name("b")
    view = ctx.view_1d(a, 4, a.nb[1]).set_name("row1")
    out = ctx.add(a, b)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    need = alloc_size(list(ctx), cpu_buffer_type())
    buf = alloc_ctx_tensors_from_buft(ctx, cpu_buffer_type())
    assert buf is not None and buf.backend is None and buf.get_size() == need == 3 * 64
    assert view.buffer is buf and view.data == a.data + a.nb[1]
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor_set_numpy(a, values)
    tensor_set_numpy(b, [10, 20, 30, 40])
    np.testing.assert_array_equal(tensor_get_numpy(view), values[1])
    cpu_init().graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(out), values + [10, 20, 30, 40])
    assert alloc_ctx_tensors_from_buft(ctx, cpu_buffer_type()) is None  # nothing left to allocate


def test_buffer_from_host_ptr_wraps_caller_memory(ctx: Context) -> None:
    memory = np.zeros(256, np.uint8)
    buf = cpu_device().buffer_from_host_ptr(memory, 256, 64)
    assert buf.backend is None and buf.buft is cpu_device().mapped_buft and buf.buft.name() == "CPU_Mapped"
    t = ctx.new_tensor_1d(F32, 4).set_name("t")
    tensor_alloc(buf, t, buf.get_base() + 64)
    memory[64:80] = np.arange(4, dtype=np.float32).view(np.uint8)  # the caller's bytes are the tensor's
    np.testing.assert_array_equal(tensor_get_numpy(t), [0, 1, 2, 3])
    buf.free()
    assert memory[64:80].view(np.float32).tolist() == [0, 1, 2, 3]  # never freed, never copied
    cpu = cpu_init()
    bound = cpu.buffer_from_host_ptr(np.zeros(64, np.uint8), 64)
    assert bound.backend is cpu and bound.name == "CPU"


def test_tensor_alloc_and_view_init_check_what_they_are_given(ctx: Context) -> None:
    buf = cpu_buffer_type().alloc_buffer(64)
    a = ctx.new_tensor_1d(F32, 8).set_name("a")
    big = ctx.new_tensor_1d(F32, 32).set_name("big")
    v = ctx.view_1d(a, 4, 16).set_name("v")
    with pytest.raises(OutOfBoundsError, match="128 bytes of 'big' at offset 0 are outside the 64 bytes"):
        tensor_alloc(buf, big, buf.get_base())
    with pytest.raises(NotAllocatedError, match="the source 'a' of view 'v' has no memory"):
        view_init(v)
    with pytest.raises(ArgumentError, match="'v' is a view of 'a'"):
        tensor_alloc(buf, v, buf.get_base())
    tensor_alloc(buf, a, buf.get_base() + 32)
    with pytest.raises(ArgumentError, match="'a' has memory already"):
        tensor_alloc(buf, a, buf.get_base())
    view_init(v)
    assert v.data == a.data + 16 and v.buffer is buf
    assert big.data is None and big.buffer is None  # a refused allocation changes nothing


def small_graph(ctx: Context) -> tuple[list[Tensor], Tensor]:
    x = ctx.new_tensor_2d(F32, 8, 4).set_name("x")
    w = ctx.new_tensor_2d(F32, 8, 6).set_name("w")
    h = ctx.mul_mat(w, x).set_name("h")
    out = ctx.soft_max(ctx.cont(ctx.transpose(h))).set_name("out")
    return [x, w], out


def test_graph_copy_to_another_backend(ctx: Context) -> None:
    (x, w), out = small_graph(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    buf = alloc_ctx_tensors(ctx, cpu_init())
    assert buf is not None
    rng = np.random.default_rng(0)
    tensor_set_numpy(x, rng.standard_normal((4, 8)))
    tensor_set_numpy(w, rng.standard_normal((6, 8)))
    other = cpu_init()
    copy = graph_copy(other, g)
    try:
        assert copy.buffer.backend is other and len(copy.graph.nodes) == len(g.nodes)
        for t1, t2 in zip(g.nodes, copy.graph.nodes, strict=True):
            assert (t2.name, t2.op, t2.type, t2.ne, t2.nb) == (t1.name, t1.op, t1.type, t1.ne, t1.nb)
            assert t2.buffer is copy.buffer and t1.buffer is buf
        np.testing.assert_array_equal(tensor_get_numpy(copy.graph.leafs[0]), tensor_get_numpy(g.leafs[0]))
        cpu_init().graph_compute(g)
        other.graph_compute(copy.graph)
        np.testing.assert_array_equal(tensor_get_numpy(copy.graph.nodes[-1]), tensor_get_numpy(out))
    finally:
        copy.free()
    assert copy.buffer.freed


def test_compare_graph_backend_sees_every_computing_node(ctx: Context) -> None:
    (x, w), out = small_graph(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, cpu_init())
    tensor_set_numpy(x, np.ones((4, 8)))
    tensor_set_numpy(w, np.ones((6, 8)))
    seen: list[str] = []

    def check(i: int, t1: Tensor, t2: Tensor) -> bool:
        np.testing.assert_array_equal(tensor_get_numpy(t1), tensor_get_numpy(t2))
        seen.append(t1.name)
        return True

    assert compare_graph_backend(cpu_init(), cpu_init(), g, check)
    assert seen[0] == "h" and seen[-1] == "out" and len(seen) == 3  # the transpose is a view
    seen.clear()
    compare_graph_backend(cpu_init(), cpu_init(), g, check, test_nodes=[out])
    assert seen == ["out"]


def test_graph_copy_refuses_an_unallocated_graph(ctx: Context) -> None:
    _, out = small_graph(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    with pytest.raises(NotAllocatedError, match="is not allocated"):
        graph_copy(cpu_init(), g)


def test_the_scheduler_runs_a_node_where_a_buffer_of_no_backend_is_supported() -> None:
    """A weight in a buffer of the CPU buffer type (no backend): the scheduler gives its node to the first
    backend whose device supports the type, as ggml_backend_sched_backend_from_buffer does."""
    wctx = Context(mem_size=1 << 16, no_alloc=True)
    w = wctx.new_tensor_2d(F32, 8, 6).set_name("w")
    alloc_ctx_tensors_from_buft(wctx, cpu_buffer_type())
    tensor_set_numpy(w, np.eye(6, 8))
    cpu_a, cpu_b = cpu_init(), cpu_init()
    sched = Scheduler([cpu_a, cpu_b])

    def build() -> tuple[Tensor, Tensor, object]:
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        x = ctx.new_tensor_2d(F32, 8, 2).set_name("x")
        sched.get_tallocr(cpu_b).alloc(x)  # the input lives on backend B
        out = ctx.mul_mat(w, x).set_name("out")
        g = ctx.new_graph()
        g.build_forward_expand(out)
        return x, out, g

    try:
        sched.init_measure(build()[2])
        assert all(sched.get_buffer(b).get_usage() == BufferUsage.COMPUTE for b in sched.backends)
        x, out, g = build()
        tensor_set_numpy(x, np.arange(16).reshape(2, 8))
        sched.graph_compute(g)
        assert sched.tensor_backend(out) is cpu_a  # where the weight's buffer type is supported first
        np.testing.assert_array_equal(tensor_get_numpy(out), np.arange(16).reshape(2, 8)[:, :6])
    finally:
        sched.free()


@pytest.mark.parametrize("use_mmap", [True, False], ids=["mapped", "copied"])
def test_the_loader_asks_the_device_and_marks_weights(use_mmap: bool) -> None:
    gf = read_gguf(builtin_model_path())
    cpu = init_backend("cpu")
    assert maps_weights(cpu)
    names = [t.name for t in gf][:5]
    loaded = load_tensors(gf, names, lambda _: cpu, use_mmap=use_mmap, progress=False)
    try:
        (buffer,) = loaded.buffers
        assert loaded.zero_copy[id(cpu)] is use_mmap
        assert buffer.get_usage() == BufferUsage.WEIGHTS and buffer.backend is cpu
        # the backend's own types (see CPUBufferType): named as the device's
        assert buffer.buft is (cpu.mapped_buft if use_mmap else cpu.buft)
        assert buffer.buft.name() == ("CPU_Mapped" if use_mmap else "CPU") and buffer.buft.owner is cpu
        for name in names:
            np.testing.assert_array_equal(tensor_get_numpy(loaded.tensors[name]).reshape(-1),
                                          gf.tensor_bytes(name).view(np.uint8).view(
                                              tensor_get_numpy(loaded.tensors[name]).dtype).reshape(-1))
    finally:
        loaded.free()
        gf.close()
