"""The CPU backend's registry, device and buffer types (ggml-cpu.cpp's reg and device, ggml-backend.cpp's CPU buffer
types; DESIGN.md, "The CPU device"). `cpu_reg` is the entry point `pyggml.backends: cpu`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyggml.backends.cpu.buffer import TENSOR_ALIGNMENT, cpu_alloc_buffer, cpu_buffer_from_ptr
from pyggml.backends.cpu.plan import kernel_supports
from pyggml.backends.cpu.repack import CPURepackBufferType
from pyggml.core.checks import check_instance
from pyggml.core.errors import ArgumentError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceCaps, DeviceType, host_cpu_name, host_memory
from pyggml.ggml_backend.registry import (
    COMPILE_CACHE_FOLDER,
    EXTRA_BUFTS,
    SET_BATCH_INVARIANT,
    SET_N_THREADS,
    WATCH_COMPILES,
    Reg,
)

if TYPE_CHECKING:
    from pyggml.backends.cpu.backend import CPUBackend


class CPUBufferType(BufferType):
    """Host memory in aligned numpy arrays ("CPU"), or the caller's ("CPU_Mapped"): the device's, or one CPU
    backend's own (`owner`), which only it computes with."""

    def __init__(self, device: CPUDevice, name: str, owner: CPUBackend | None = None) -> None:
        super().__init__(device)
        self._name = name
        self.owner = owner

    def _get_name(self) -> str:
        return self._name

    def _alloc_buffer(self, size: int) -> Buffer:
        return cpu_alloc_buffer(None, size, self)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _is_host(self) -> bool:
        return True


class CPUDevice(Device):
    """The CPU."""

    def __init__(self, reg: CPUReg) -> None:
        super().__init__(reg)
        self._description = host_cpu_name()
        self.buft = CPUBufferType(self, "CPU")
        self.mapped_buft = CPUBufferType(self, "CPU_Mapped")
        self.repack_buft = CPURepackBufferType(self)  # the extra buffer type

    def _get_name(self) -> str:
        return "CPU"

    def _get_description(self) -> str:
        return self._description

    def _get_memory(self) -> tuple[int, int]:
        return host_memory()

    def _get_type(self) -> DeviceType:
        return DeviceType.CPU

    def _get_caps(self) -> DeviceCaps:
        return DeviceCaps(buffer_from_host_ptr=True, mmap_support=True)

    def _init_backend(self, params: str | None) -> CPUBackend:
        from pyggml.backends.cpu.backend import cpu_init

        if params:
            raise ArgumentError(f"the CPU backend takes no parameters, got {params!r}")
        return cpu_init()

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _buffer_from_host_ptr(self, ptr: object, size: int, max_tensor_size: int) -> Buffer:
        return cpu_buffer_from_ptr(None, ptr, size, self.mapped_buft)

    def _supports_op(self, op: Tensor) -> bool:
        return kernel_supports(op)

    def _supports_buft(self, buft: BufferType) -> bool:
        if buft is self.repack_buft:
            return True
        return buft.is_host() and not (isinstance(buft, CPUBufferType) and buft.owner is not None)


class CPUReg(Reg):
    """The CPU backend's registry: the one CPU device."""

    def __init__(self) -> None:
        super().__init__()
        self._device = CPUDevice(self)

    def _get_name(self) -> str:
        return "CPU"

    def _get_device_count(self) -> int:
        return 1

    def _get_device(self, index: int) -> Device:
        return self._device

    def _get_proc_address(self, name: str) -> Callable[..., Any] | None:
        if name == SET_N_THREADS:
            from pyggml.backends.cpu.backend import cpu_set_n_threads

            return cpu_set_n_threads
        if name == SET_BATCH_INVARIANT:
            from pyggml.backends.cpu.backend import cpu_set_batch_invariant

            return cpu_set_batch_invariant
        if name == EXTRA_BUFTS:
            return extra_bufts
        if name in (WATCH_COMPILES, COMPILE_CACHE_FOLDER):
            from pyggml.backends.cpu import jit

            return jit.watch_compiles if name == WATCH_COMPILES else jit.cache_folder
        return None

    def _init_backend(self, arg: str | None) -> Backend:
        if arg is not None:
            raise ArgumentError(f"the CPU backend takes no argument, got 'cpu:{arg}'")
        return self._device.init_backend(None)


_reg: CPUReg | None = None


def cpu_reg() -> CPUReg:
    """ggml_backend_cpu_reg: the CPU registry (one per process)."""
    global _reg
    if _reg is None:
        _reg = CPUReg()
    return _reg


def cpu_device() -> CPUDevice:
    """The CPU device."""
    return cpu_reg()._device


def extra_bufts(device: Device) -> list[BufferType]:
    """ggml_backend_dev_get_extra_bufts: the device's extra buffer types, CPU_REPACK (a list, not NULL-ended)."""
    check_instance(device, CPUDevice, f"{EXTRA_BUFTS}: device")
    return [device.repack_buft]


def cpu_buffer_type() -> CPUBufferType:
    """ggml_backend_cpu_buffer_type."""
    return cpu_device().buft
