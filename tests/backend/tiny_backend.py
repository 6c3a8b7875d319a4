"""A minimal device for the tests ("Tiny": host memory that moves its own bytes, one op: SCALE of F32),
written with the hooks only, as an out-of-tree backend would be."""

from __future__ import annotations

import numpy as np

from pyggml.core import memory
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import SIZE_MAX, Backend, Buffer, BufferType, Device, DeviceCaps, DeviceType, Event

F32 = GGMLType.F32


class TinyBuffer(Buffer):
    """Host memory that moves its own bytes (no backend needed)."""

    def __init__(self, buft: BufferType, size: int) -> None:
        super().__init__(None, size, buft=buft)
        self.array = np.zeros(max(size, 1), np.uint8)
        self.base = memory.register(self.array)
        self.resets = 0

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        memory.unregister(self.array)

    def _reset(self) -> None:
        self.resets += 1

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        start = tensor.data + offset - self.base
        self.array[start: start + size] = np.frombuffer(data, np.uint8, size)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        start = tensor.data + offset - self.base
        np.frombuffer(data, np.uint8, size)[:] = self.array[start: start + size]


class TinyBufferType(BufferType):
    def __init__(self, device: Device | None, max_size: int = SIZE_MAX, alignment: int = 32) -> None:
        super().__init__(device)
        self.max_size = max_size
        self.alignment = alignment

    def _get_name(self) -> str:
        return "Tiny"

    def _alloc_buffer(self, size: int) -> Buffer:
        return TinyBuffer(self, size)

    def _get_alignment(self) -> int:
        return self.alignment

    def _get_max_size(self) -> int:
        return self.max_size

    def _is_host(self) -> bool:
        return True


class TinyBackend(Backend):
    """Only a name and a compute: SCALE by -1 of F32 (negation)."""

    def _get_name(self) -> str:
        return "Tiny"

    def _graph_compute(self, graph: Graph) -> None:
        for node in graph.nodes:
            node.numpy()[...] = -node.src[0].numpy()


class TinyDevice(Device):
    def __init__(self, caps: DeviceCaps | None = None, memory: tuple[int, int] = (1 << 20, 1 << 30)) -> None:
        super().__init__()
        self.buft = TinyBufferType(self)
        self.caps_ = caps or DeviceCaps()
        self.memory_ = memory
        self.log: list[str] = []

    def _get_name(self) -> str:
        return "Tiny"

    def _get_description(self) -> str:
        return "a test device"

    def _get_memory(self) -> tuple[int, int]:
        return self.memory_

    def _get_type(self) -> DeviceType:
        return DeviceType.ACCEL

    def _get_caps(self) -> DeviceCaps:
        return self.caps_

    def _init_backend(self, params: str | None) -> Backend:
        return TinyBackend(self)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _supports_op(self, op: Tensor) -> bool:
        return op.op == GGMLOp.NONE or (op.op == GGMLOp.SCALE and op.type == F32)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host()

    def _event_new(self) -> Event | None:
        return Event(self) if self.caps_.events else None

    def _event_synchronize(self, event: Event) -> None:
        self.log.append("event_synchronize")


# the source of a module that ggml_backend_load (and an entry point) can load: one TinyDevice in a Reg named
# {name}
REG_MODULE = """
from pyggml.ggml_backend import Reg
import tiny_backend

class FileReg(Reg):
    def __init__(self):
        super().__init__()
        self.dev = tiny_backend.TinyDevice()
        self.dev.reg = self

    def _get_name(self):
        return "{name}"

    def _get_device_count(self):
        return 1

    def _get_device(self, index):
        return self.dev

def ggml_backend_init():
    return FileReg()
"""
