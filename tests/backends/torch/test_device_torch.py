"""The torch backend's registry, devices and buffer types (cpu; cuda when present): memory figures,
alignment, max size, buffers of no backend, the weight cache across them, events ordering work between
backends, graph copies to torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyggml.alloc import alloc_ctx_tensors, alloc_ctx_tensors_from_buft
from pyggml.backends.cpu import cpu_buffer_type, cpu_device, cpu_init
from pyggml.backends.torch import (
    TORCH_ALIGNMENT,
    TorchBackend,
    TorchBuffer,
    TorchDevice,
    torch_device_for,
    torch_init,
    torch_reg,
)
from pyggml.core.context import Context
from pyggml.core.errors import UnsupportedOpError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    SIZE_MAX,
    DeviceType,
    graph_copy,
    host_memory,
    init_backend,
    init_by_name,
    reg_by_name,
    tensor_copy,
    tensor_get_numpy,
    tensor_set_numpy,
)
from pyggml.gguf.loader import maps_weights

F32, F16 = GGMLType.F32, GGMLType.F16
DEVICES = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def test_the_registry_lists_cpu_then_each_cuda_device() -> None:
    reg = reg_by_name("torch")
    assert reg is torch_reg() and reg.name() == "torch"
    assert [d.name() for d in reg.devices()] == [f"Torch({d})" for d in DEVICES]
    assert all(isinstance(d, TorchDevice) and d.backend_reg() is reg for d in reg.devices())


@pytest.mark.parametrize("name", DEVICES)
def test_device_props_from_torch(name: str) -> None:
    dev = torch_device_for(torch.device(name))
    props = dev.get_props()
    assert props.name == f"Torch({name})" and torch.__version__ in props.description
    if name == "cpu":
        assert props.type == DeviceType.ACCEL and props.memory_total == host_memory()[1]
        assert props.caps.names() == ["events"]
    else:
        free, total = torch.cuda.mem_get_info(torch.device(name))
        assert props.type == DeviceType.GPU and props.memory_total == total
        assert abs(props.memory_free - free) <= total // 10  # other processes allocate in between
        assert props.caps.async_ and props.caps.events
    assert 0 < props.memory_free <= props.memory_total
    assert not props.caps.buffer_from_host_ptr and not maps_weights(dev.init_backend())  # weights are copied in
    with pytest.raises(UnsupportedOpError, match="cannot make buffers over host memory"):
        dev.buffer_from_host_ptr(np.zeros(64, np.uint8), 64)


@pytest.mark.parametrize("name", DEVICES)
def test_buffer_type_and_buffers_of_no_backend(name: str, ctx: Context) -> None:
    dev = torch_device_for(torch.device(name))
    buft = dev.buffer_type()
    t = ctx.new_tensor_2d(F16, 6, 4).set_name("t")
    assert buft.name() == f"Torch({name})" and buft.get_alignment() == TORCH_ALIGNMENT == 256
    assert buft.get_max_size() == SIZE_MAX and not buft.is_host() and buft.get_alloc_size(t) == t.nbytes()
    assert dev.supports_buft(buft) and not dev.supports_buft(cpu_buffer_type())
    assert not cpu_device().supports_buft(buft)  # the CPU cannot compute with torch memory
    buf = alloc_ctx_tensors_from_buft(ctx, buft)
    assert isinstance(buf, TorchBuffer) and buf.backend is None and buf.device == torch.device(name)
    values = np.arange(24, dtype=np.float16).reshape(4, 6)
    tensor_set_numpy(t, values)  # the buffer moves its own bytes
    np.testing.assert_array_equal(tensor_get_numpy(t), values)
    backend = dev.init_backend("matmul_precision=f32")
    assert isinstance(backend, TorchBackend) and backend.get_device() is dev and backend.matmul_precision == "f32"
    assert backend.supports_buft(buft) and backend.get_default_buffer_type() is buft
    bound = backend.alloc_buffer(64)
    assert bound.backend is backend and bound.buft is buft
    assert init_by_name(f"Torch({name})").get_device() is dev  # a device by its name
    assert init_backend(f"torch:{name}").get_device() is dev  # the registry's spec


def test_a_weight_in_a_buffer_of_no_backend_is_recomputed_after_it_changes(ctx: Context) -> None:
    """Every torch backend's weight cache hears of writes into any torch buffer, whoever owns it."""
    backend = torch_init("cpu", matmul_precision="f32")
    wctx = Context(mem_size=1 << 16, no_alloc=True)
    w = wctx.new_tensor_2d(F16, 8, 4).set_name("w")
    alloc_ctx_tensors_from_buft(wctx, backend.get_default_buffer_type())
    x = ctx.new_tensor_2d(F32, 8, 2).set_name("x")
    out = ctx.mul_mat(w, x).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    tensor_set_numpy(x, np.ones((2, 8)))
    for scale in (1.0, 2.0):
        tensor_set_numpy(w, np.full((4, 8), scale))
        backend.graph_compute(g)  # the F16 weight converted once and cached, until it is written
        np.testing.assert_array_equal(tensor_get_numpy(out), np.full((2, 4), 8 * scale))


@pytest.mark.parametrize("name", DEVICES)
def test_events_order_two_backends_work(name: str, ctx: Context) -> None:
    """Torch computes, records an event; the CPU backend waits on it, then reads the result."""
    dev = torch_device_for(torch.device(name))
    producer, consumer = dev.init_backend(), cpu_init(1)
    event = dev.event_new()
    assert event is not None and cpu_device().event_new() is None  # the CPU device has no events
    a = ctx.new_tensor_1d(F32, 1 << 16).set_name("a")
    b = ctx.scale(ctx.mul(a, a), 0.5).set_name("b")
    g = ctx.new_graph()
    g.build_forward_expand(b)
    alloc_ctx_tensors(ctx, producer)
    cctx = Context(mem_size=1 << 16, no_alloc=True)
    c = cctx.new_tensor_1d(F32, 1 << 16).set_name("c")
    alloc_ctx_tensors(cctx, consumer)
    values = np.linspace(-3, 3, 1 << 16, dtype=np.float32)
    tensor_set_numpy(a, values)
    producer.graph_compute(g)
    event.record(producer)
    event.wait(consumer)
    tensor_copy(b, c)
    event.synchronize()
    np.testing.assert_allclose(tensor_get_numpy(c), values * values * 0.5, rtol=1e-6)
    event.free()


def test_graph_copy_from_the_cpu_to_torch(ctx: Context) -> None:
    x = ctx.new_tensor_2d(F32, 16, 3).set_name("x")
    w = ctx.new_tensor_2d(F16, 16, 5).set_name("w")
    out = ctx.soft_max(ctx.mul_mat(w, x)).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    alloc_ctx_tensors(ctx, cpu_init(1))
    rng = np.random.default_rng(1)
    tensor_set_numpy(x, rng.standard_normal((3, 16)))
    tensor_set_numpy(w, rng.standard_normal((5, 16)))
    tb = torch_init(matmul_precision="f32")
    copy = graph_copy(tb, g)
    try:
        assert isinstance(copy.buffer, TorchBuffer) and copy.buffer.backend is tb
        cpu_init(1).graph_compute(g)
        tb.graph_compute(copy.graph)
        np.testing.assert_allclose(tensor_get_numpy(copy.graph.nodes[-1]), tensor_get_numpy(out), rtol=1e-5)
    finally:
        copy.free()
