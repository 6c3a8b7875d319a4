"""Buffer types, buffer usage, devices and events: the base classes' checks and ggml's defaults.

A minimal device (`tiny_backend`: host memory, one op) shows what a backend of a device gets for free:
its buffers, alignment, transfers and supports_op come from the device and its buffer type.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_backend import TinyBackend, TinyBuffer, TinyBufferType, TinyDevice

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.buffer import cpu_alloc_buffer
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    GGMLError,
    InvalidStateError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    SIZE_MAX,
    Backend,
    BackendBufferType,
    Buffer,
    BufferUsage,
    Device,
    DeviceCaps,
    DeviceType,
    Event,
    tensor_get_numpy,
    tensor_memset,
    tensor_set,
    tensor_set_numpy,
)
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32


# --- buffer types ---


def test_buffer_type_defaults_and_alloc() -> None:
    buft = TinyBufferType(None)
    t = Context(mem_size=1 << 20, no_alloc=True).new_tensor_2d(F32, 4, 3)
    assert buft.name() == "Tiny" and buft.get_alignment() == 32 and buft.is_host() and buft.get_device() is None
    assert buft.get_max_size() == SIZE_MAX and buft.get_alloc_size(t) == t.nbytes() == 48
    buf = buft.alloc_buffer(100)
    assert isinstance(buf, TinyBuffer) and buf.buft is buft and buf.get_type() is buft and buf.backend is None
    assert buf.name == "Tiny" and buf.get_size() == 100 and buf.get_alignment() == 32 and buf.get_max_size() == SIZE_MAX
    assert buf.is_host() and buf.get_alloc_size(t) == 48  # the buffer asks its type
    buf.free()


def test_buffer_type_checks_sizes_and_what_the_hooks_answer() -> None:
    buft = TinyBufferType(None, max_size=1000)
    with pytest.raises(ArgumentTypeError, match="buffer type 'Tiny': alloc_buffer: size must be an integer"):
        buft.alloc_buffer(2.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="size must be >= 0, got -1"):
        buft.alloc_buffer(-1)
    with pytest.raises(OutOfMemoryError, match=r"alloc_buffer of 1001 bytes exceeds its max size \(1000 bytes\)"):
        buft.alloc_buffer(1001)
    with pytest.raises(ArgumentTypeError, match="get_alloc_size: tensor must be a Tensor"):
        buft.get_alloc_size(3)  # type: ignore[arg-type]
    with pytest.raises(GGMLError, match="alignment must be a power of 2, got 24"):
        TinyBufferType(None, alignment=24).get_alignment()

    class Short(TinyBufferType):
        def _get_alloc_size(self, tensor: Tensor) -> int:
            return 1

    t = Context(mem_size=1 << 20, no_alloc=True).new_tensor_1d(F32, 4).set_name("t")
    with pytest.raises(GGMLError, match="get_alloc_size of 't' is 1 bytes, less than its 16 bytes"):
        Short(None).get_alloc_size(t)


def test_buffer_usage() -> None:
    buf = TinyBufferType(None).alloc_buffer(16)
    assert buf.get_usage() == BufferUsage.ANY
    buf.set_usage(BufferUsage.WEIGHTS)
    assert buf.get_usage() == BufferUsage.WEIGHTS and "WEIGHTS" in repr(buf)
    buf.set_usage(2)
    assert buf.get_usage() is BufferUsage.COMPUTE
    with pytest.raises(ArgumentError, match="set_usage: 7 is not a buffer usage"):
        buf.set_usage(7)
    with pytest.raises(ArgumentTypeError):
        buf.set_usage("WEIGHTS")  # type: ignore[arg-type]
    assert buf.get_usage() is BufferUsage.COMPUTE  # a refused usage changes nothing
    buf.reset()
    assert buf.resets == 1
    buf.free()


# --- devices ---


def test_device_props_and_checks() -> None:
    dev = TinyDevice(DeviceCaps(events=True))
    props = dev.get_props()
    assert (props.name, props.description, props.type, props.memory_free, props.memory_total, props.device_id) == (
        "Tiny", "a test device", DeviceType.ACCEL, 1 << 20, 1 << 30, None)
    assert props.caps == DeviceCaps(events=True) and props.caps.names() == ["events"]
    assert dev.memory() == (1 << 20, 1 << 30) and dev.backend_reg() is None
    assert dev.host_buffer_type() is None and dev.buffer_type() is dev.buft
    with pytest.raises(ArgumentError, match="device 'Tiny': free memory must be >= 0"):
        TinyDevice(memory=(-1, 10)).memory()
    with pytest.raises(ArgumentTypeError, match="init_backend: params must be a str or None"):
        dev.init_backend(3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="supports_op: op must be a Tensor"):
        dev.supports_op("ADD")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="supports_buft: buft must be a BufferType"):
        dev.supports_buft(None)  # type: ignore[arg-type]
    # no buffer_from_host_ptr in the caps: refused, whatever the hook would do
    with pytest.raises(UnsupportedOpError, match="cannot make buffers over host memory"):
        dev.buffer_from_host_ptr(np.zeros(64, np.uint8), 64)
    assert TinyDevice().event_new() is None  # no events in the caps


def test_device_init_backend_must_give_a_backend_of_the_device() -> None:
    class Liar(TinyDevice):
        def _init_backend(self, params: str | None) -> Backend:
            return cpu_init()

    with pytest.raises(InvalidStateError, match="init_backend made backend 'CPU' of device 'CPU'"):
        Liar().init_backend()


def test_a_backend_of_a_device_gets_buffers_alignment_transfers_and_supports_from_it() -> None:
    dev = TinyDevice()
    backend = dev.init_backend()
    assert backend.get_device() is dev and backend.get_default_buffer_type() is dev.buft
    assert backend.get_alignment() == 32 and backend.get_max_size() == SIZE_MAX
    buf = backend.alloc_buffer(64)
    assert isinstance(buf, TinyBuffer) and buf.backend is backend and buf.buft is dev.buft
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    b = ctx.scale(a, -1.0)
    g = ctx.new_graph()
    g.build_forward_expand(b)
    alloc_ctx_tensors(ctx, backend)
    tensor_set_numpy(a, [1, 2, 3, 4])  # through the buffer's hooks: the backend has none
    backend.graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(b), [-1, -2, -3, -4])
    tensor_memset(a, 0)
    np.testing.assert_array_equal(tensor_get_numpy(a), [0, 0, 0, 0])
    assert backend.supports_op(b) and not backend.supports_op(ctx.sqr(a))
    assert backend.supports_buft(dev.buft) and backend.supports_buft(cpu_init().get_default_buffer_type())
    assert not backend.offload_op(b)


def test_a_backend_without_device_keeps_the_seed_ways() -> None:
    class Seed(Backend):
        def _get_name(self) -> str:
            return "Seed"

        def _alloc_buffer(self, size: int) -> Buffer:
            return cpu_alloc_buffer(self, size)

        def _get_alignment(self) -> int:
            return 16

        def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
            cpu_init()._set_tensor_async(tensor, data, offset, size)

        def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
            cpu_init()._get_tensor_async(tensor, data, offset, size)

    seed = Seed()
    buft = seed.get_default_buffer_type()
    assert seed.get_device() is None and isinstance(buft, BackendBufferType) and buft is seed.get_default_buffer_type()
    assert buft.name() == "Seed" and buft.get_alignment() == 16 and buft.is_host()  # a 1-byte buffer said so
    buf = seed.alloc_buffer(32)
    assert buf.backend is seed and buf.buft is buft and buf.is_host()
    assert seed.supports_buft(buft) and not seed.supports_buft(cpu_init().get_default_buffer_type())
    assert not seed.plans_follow_moves()
    with pytest.raises(UnsupportedOpError, match="backend 'Seed' has no device"):
        seed.buffer_from_host_ptr(np.zeros(16, np.uint8), 16)


def test_a_backend_with_neither_transfer_hooks_says_so() -> None:
    class Mute(Backend):
        def _get_name(self) -> str:
            return "Mute"

        def _alloc_buffer(self, size: int) -> Buffer:
            return cpu_alloc_buffer(self, size)

        def _get_alignment(self) -> int:
            return 16

    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 2).set_name("a")
    alloc_ctx_tensors(ctx, Mute())
    # the CPU buffer moves its own bytes when its backend has no data hooks: no recursion, no error
    tensor_set(a, np.ones(2, np.float32))
    np.testing.assert_array_equal(tensor_get_numpy(a), [1, 1])


# --- events ---


def test_events_are_recorded_on_a_backend_of_their_device_then_waited_on() -> None:
    dev = TinyDevice(DeviceCaps(events=True))
    backend = dev.init_backend()
    event = dev.event_new()
    assert isinstance(event, Event) and event.device is dev and "new" in repr(event)
    with pytest.raises(InvalidStateError, match="synchronize before it was recorded"):
        event.synchronize()
    with pytest.raises(ArgumentError, match="cannot be recorded on backend 'CPU'"):
        event.record(cpu_init())
    event.record(backend)
    event.synchronize()
    event.wait(cpu_init())  # another device's backend waits on the host (the default)
    assert dev.log == ["event_synchronize", "event_synchronize"]
    event.free()
    event.free()
    with pytest.raises(InvalidStateError, match="record after free"):
        event.record(backend)


def test_event_record_and_wait_order_two_backends_work() -> None:
    """The hooks run where ggml runs them: record after the producer's queued work, wait before the
    consumer's next; a synchronous producer is done when it records."""
    log: list[str] = []

    class Logged(TinyBackend):
        def __init__(self, device: Device, label: str) -> None:
            super().__init__(device)
            self.label = label

        def _graph_compute(self, graph: Graph) -> None:
            log.append(f"{self.label}.compute")
            super()._graph_compute(graph)

        def _synchronize(self) -> None:
            log.append(f"{self.label}.synchronize")

        def _event_wait(self, event: Event) -> None:
            log.append(f"{self.label}.wait")
            super()._event_wait(event)

    dev = TinyDevice(DeviceCaps(events=True))
    producer, consumer = Logged(dev, "A"), Logged(dev, "B")
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 3).set_name("a")
    b = ctx.scale(a, -1.0)
    c = ctx.scale(b, -1.0)
    g1, g2 = ctx.new_graph(), ctx.new_graph()
    g1.build_forward_expand(b)
    g2.nodes = [c]
    alloc_ctx_tensors(ctx, producer)
    tensor_set_numpy(a, [1, 2, 3])
    event = dev.event_new()
    assert event is not None
    producer.graph_compute_async(g1)
    event.record(producer)
    event.wait(consumer)
    consumer.graph_compute_async(g2)
    assert log == ["A.compute", "A.synchronize", "B.wait", "B.compute"]
    assert dev.log == ["event_synchronize"]
    consumer.synchronize()
    np.testing.assert_array_equal(tensor_get_numpy(c), [1, 2, 3])
    log.clear()
    producer.graph_compute(g1)  # the synchronous form: graph_compute_async, then synchronize (as ggml)
    assert log == ["A.compute", "A.synchronize"]
