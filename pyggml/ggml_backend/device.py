"""`Device`: ggml's `ggml_backend_device` (ggml-backend-impl.h's ggml_backend_device_i, ggml-backend.cpp).

Public methods are ggml's `ggml_backend_dev_*`; `_`-prefixed hooks are the interface entries (an optional one's
body is its NULL default). Code above the backends asks a device's caps and never tests which backend it has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from pyggml.core.checks import available_host_memory, check_instance, check_size
from pyggml.core.errors import ArgumentTypeError, GGMLError, InvalidStateError, UnsupportedOpError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.event import Event

if TYPE_CHECKING:
    from pyggml.ggml_backend.registry import Reg


class DeviceType(IntEnum):
    """ggml_backend_dev_type."""

    CPU = 0
    GPU = 1
    IGPU = 2  # integrated GPU device using host memory
    ACCEL = 3  # accelerator used together with the CPU backend (BLAS, AMX, ...)
    META = 4  # a device wrapping several others


@dataclass(frozen=True)
class DeviceCaps:
    """ggml_backend_dev_caps: what the device can do (`async` is a Python keyword: `async_`)."""

    async_: bool = False
    host_buffer: bool = False  # a pinned host buffer type
    buffer_from_host_ptr: bool = False
    events: bool = False
    mmap_support: bool = False

    def names(self) -> list[str]:
        return [name for name, has in (("async", self.async_), ("host_buffer", self.host_buffer),
                                       ("buffer_from_host_ptr", self.buffer_from_host_ptr),
                                       ("events", self.events), ("mmap", self.mmap_support)) if has]


@dataclass(frozen=True)
class DeviceProps:
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None
    caps: DeviceCaps


def host_cpu_name() -> str:
    """The host CPU's model name (/proc/cpuinfo's "model name"), or "CPU" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or "CPU"
    except OSError:
        pass
    return "CPU"


def host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory: MemAvailable and the physical memory (free <= total)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        free = available_host_memory()
        return free, free
    return min(available_host_memory(), total), total


class Device:
    """A device of a registry: name, memory, type, capabilities; makes backends and buffers."""

    def __init__(self, reg: Reg | None = None, context: Any = None) -> None:
        self.reg = reg
        self.context = context

    # --- hooks (ggml_backend_device_i) ---

    def _get_name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_name")

    def _get_description(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_description")

    def _get_memory(self) -> tuple[int, int]:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_memory")

    def _get_type(self) -> DeviceType:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_type")

    def _get_caps(self) -> DeviceCaps:
        return DeviceCaps()

    def _get_device_id(self) -> str | None:
        return None

    def _init_backend(self, params: str | None) -> Backend:
        raise NotImplementedError(f"{type(self).__name__} must implement _init_backend")

    def _get_buffer_type(self) -> BufferType:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_buffer_type")

    def _get_host_buffer_type(self) -> BufferType | None:
        return None

    def _buffer_from_host_ptr(self, ptr: object, size: int, max_tensor_size: int) -> Buffer:
        """Asked for only when the caps say `buffer_from_host_ptr`."""
        raise NotImplementedError(f"{type(self).__name__} says it wraps host memory but does not implement "
                                  f"_buffer_from_host_ptr")

    def _supports_op(self, op: Tensor) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement _supports_op")

    def _supports_buft(self, buft: BufferType) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement _supports_buft")

    def _offload_op(self, op: Tensor) -> bool:
        return False

    def _event_new(self) -> Event | None:
        return None

    def _event_free(self, event: Event) -> None:
        ...

    def _event_synchronize(self, event: Event) -> None:
        ...

    # --- ggml_backend_dev_* ---

    def name(self) -> str:
        return self._get_name()

    def description(self) -> str:
        return self._get_description()

    def memory(self) -> tuple[int, int]:
        free, total = self._get_memory()
        return (check_size(free, f"device '{self.name()}': free memory"),
                check_size(total, f"device '{self.name()}': total memory"))

    def type(self) -> DeviceType:
        return DeviceType(self._get_type())

    def caps(self) -> DeviceCaps:
        """get_props' caps, without asking for the memory."""
        caps = self._get_caps()
        check_instance(caps, DeviceCaps, f"device '{self.name()}': caps")
        return caps

    def get_props(self) -> DeviceProps:
        free, total = self.memory()
        return DeviceProps(self.name(), self.description(), free, total, self.type(), self._get_device_id(),
                           self.caps())

    def backend_reg(self) -> Reg | None:
        return self.reg

    def init_backend(self, params: str | None = None) -> Backend:
        if params is not None and not isinstance(params, str):
            raise ArgumentTypeError(f"device '{self.name()}': init_backend: params must be a str or None, got "
                                    f"{type(params).__name__} {params!r:.80}")
        backend = self._init_backend(params)
        check_instance(backend, Backend, f"device '{self.name()}': init_backend's result")
        if backend.get_device() is not self:
            dev = backend.get_device()
            raise InvalidStateError(f"device '{self.name()}': init_backend made backend '{backend.name()}' of "
                                    f"device '{dev.name() if dev is not None else None}'")
        return backend

    def buffer_type(self) -> BufferType:
        buft = self._get_buffer_type()
        check_instance(buft, BufferType, f"device '{self.name()}': buffer_type")
        return buft

    def host_buffer_type(self) -> BufferType | None:
        return self._get_host_buffer_type()

    def buffer_from_host_ptr(self, ptr: object, size: int, max_tensor_size: int = 0) -> Buffer:
        """ggml_backend_dev_buffer_from_host_ptr: over `ptr` (writable buffer or registered address), never freed."""
        size = check_size(size, f"device '{self.name()}': buffer_from_host_ptr: size")
        max_tensor_size = check_size(max_tensor_size, f"device '{self.name()}': buffer_from_host_ptr: "
                                                      f"max_tensor_size")
        if not self.caps().buffer_from_host_ptr:
            raise UnsupportedOpError(f"device '{self.name()}' cannot make buffers over host memory (its caps do not "
                                     f"say buffer_from_host_ptr)")
        buffer = self._buffer_from_host_ptr(ptr, size, max_tensor_size)
        check_instance(buffer, Buffer, f"device '{self.name()}': buffer_from_host_ptr's result")
        return buffer

    def supports_op(self, op: Tensor) -> bool:
        check_instance(op, Tensor, f"device '{self.name()}': supports_op: op")
        return bool(self._supports_op(op))

    def supports_buft(self, buft: BufferType) -> bool:
        check_instance(buft, BufferType, f"device '{self.name()}': supports_buft: buft")
        return bool(self._supports_buft(buft))

    @property
    def has_offload_op(self) -> bool:
        """ggml's `dev->iface.offload_op != NULL`: without it a caller may skip asking per node."""
        return type(self)._offload_op is not Device._offload_op

    def offload_op(self, op: Tensor) -> bool:
        check_instance(op, Tensor, f"device '{self.name()}': offload_op: op")
        return bool(self._offload_op(op))

    def event_new(self) -> Event | None:
        event = self._event_new()
        if event is not None:
            check_instance(event, Event, f"device '{self.name()}': event_new's result")
            if event.device is not self:
                raise GGMLError(f"device '{self.name()}': event_new made an event of another device")
        return event

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"
