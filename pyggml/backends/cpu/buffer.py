"""CPU buffers: host memory in numpy arrays, registered by real address, aligned as ggml_backend_cpu_buffer_get_base
aligns (DESIGN.md, "The backend, its plans and its memory"), or memory the caller owns (`cpu_buffer_from_ptr`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pyggml.core import memory
from pyggml.core.checks import check_size
from pyggml.core.errors import ArgumentError, OutOfBoundsError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_get

if TYPE_CHECKING:
    from pyggml.ggml_backend.backend import Backend
    from pyggml.ggml_backend.buffer_type import BufferType

TENSOR_ALIGNMENT = 64  # enough for AVX-512 (ggml's is 32: what mmapped GGUF data guarantees)


class CPUBuffer(Buffer):
    """`size` bytes of host memory from `base`; `array` is a uint8 view of those bytes (one byte for size 0)."""

    def __init__(self, backend: Backend | None, array: np.ndarray | None, base: int, size: int,
                 owned: bool, registered: bool, owner: object = None, buft: BufferType | None = None) -> None:
        super().__init__(backend, size, context=array, buft=buft)
        self.array = array
        self.base = base
        self.owned = owned
        self.registered = registered
        self.owner = owner  # the caller's object for from_ptr buffers, kept alive while the buffer lives

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        if self.registered and self.array is not None:
            memory.unregister(self.array)
        # drop our references; numpy views made earlier (plans) keep the memory alive, never dangling
        self.array = None
        self.context = None
        self.owner = None

    def _is_host(self) -> bool:
        return True

    def _clear(self, value: int) -> None:
        assert self.array is not None  # alive: checked by clear()
        self.array[: self.size] = value

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self.backend_moves_bytes():
            super()._set_tensor(tensor, data, offset, size)
        else:
            host_write(tensor, data, offset, size)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self.backend_moves_bytes():
            super()._get_tensor(tensor, data, offset, size)
        else:
            host_read(tensor, data, offset, size)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """dst (here) <- src from any buffer, read straight into dst's memory unless a backend writes it."""
        if self.backend_moves_bytes():
            return False
        tensor_get(src, host_bytes(dst, "cpy_tensor"), 0, src.nbytes())
        return True


def host_bytes(t: Tensor, what: str) -> np.ndarray:
    assert t.data is not None
    nbytes = t.nbytes()
    found = memory.find(t.data, max(nbytes, 1))
    if found is None:
        raise OutOfBoundsError(f"CPU {what}: {nbytes} bytes of '{t.name}' at {t.data:#x} are not in host memory")
    array, offset = found
    return array[offset: offset + nbytes]


def _host_range(tensor: Tensor, offset: int, size: int, what: str) -> np.ndarray:
    assert tensor.data is not None
    found = memory.find(tensor.data + offset, size)
    if found is None:
        raise OutOfBoundsError(f"CPU {what}: bytes {offset}..{offset + size} of '{tensor.name}' are not in host "
                               f"memory")
    array, pos = found
    return array[pos: pos + size]


def host_write(tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
    if size:
        _host_range(tensor, offset, size, "tensor_set")[:] = np.frombuffer(data, dtype=np.uint8, count=size)


def host_read(tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
    if size:
        np.frombuffer(data, dtype=np.uint8, count=size)[:] = _host_range(tensor, offset, size, "tensor_get")


def cpu_alloc_buffer(backend: Backend | None, size: int, buft: BufferType | None = None,
                     cls: type[CPUBuffer] = CPUBuffer) -> CPUBuffer:
    """A buffer (of class `cls`) of `size` bytes whose base is TENSOR_ALIGNMENT-aligned (zero-filled)."""
    size = check_size(size, "CPU buffer: size")
    name = backend.name() if backend is not None else "CPU"
    raw = memory.allocate_host(size + TENSOR_ALIGNMENT, f"backend '{name}': buffer of {size} bytes")
    shift = (-memory.address_of(raw)) % TENSOR_ALIGNMENT
    # a 0-byte buffer still gets one byte: numpy puts empty slices at the array's start, unaligned
    array = raw[shift: shift + max(size, 1)]
    base = memory.register(array)
    return cls(backend, array, base, size, owned=True, registered=True, buft=buft)


def cpu_buffer_from_ptr(backend: Backend | None, ptr: object, size: int,
                        buft: BufferType | None = None) -> CPUBuffer:
    """ggml_backend_cpu_buffer_from_ptr: a buffer over `size` bytes the caller owns (never released): a writable,
    C-contiguous buffer-protocol object, or an int address inside registered host memory."""
    size = check_size(size, "cpu_buffer_from_ptr: size")
    if isinstance(ptr, (int, np.integer)) and not isinstance(ptr, bool):
        addr = int(ptr)
        if addr == 0:
            raise ArgumentError("cpu_buffer_from_ptr: ptr is NULL")
        found = memory.find(addr, max(size, 1))
        if found is None:
            raise OutOfBoundsError(
                f"cpu_buffer_from_ptr: {size} bytes at address {addr:#x} are not inside any registered host memory"
            )
        array, offset = found
        return CPUBuffer(backend, array[offset: offset + size], addr, size, owned=False, registered=False, buft=buft)
    if isinstance(ptr, np.ndarray):
        arr = ptr
        if not arr.flags.writeable:
            raise ArgumentError("cpu_buffer_from_ptr: the array is read-only")
        if not arr.flags.c_contiguous:
            raise ArgumentError(f"cpu_buffer_from_ptr: the array is not C-contiguous (strides {arr.strides})")
        raw = arr.reshape(-1).view(np.uint8)
    else:
        try:
            mv = memoryview(ptr)  # type: ignore[arg-type]
        except TypeError:
            raise ArgumentError(f"cpu_buffer_from_ptr: {type(ptr).__name__} is neither an address "
                                f"nor a buffer-protocol object") from None
        if mv.readonly:
            raise ArgumentError(f"cpu_buffer_from_ptr: the {type(ptr).__name__} is read-only")
        if not mv.c_contiguous:
            raise ArgumentError(f"cpu_buffer_from_ptr: the {type(ptr).__name__} is not contiguous")
        raw = np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, dtype=np.uint8)
    if size > raw.nbytes:
        raise OutOfBoundsError(f"cpu_buffer_from_ptr: size {size} is larger than the memory given ({raw.nbytes} bytes)")
    if size == 0:
        raise ArgumentError("cpu_buffer_from_ptr: an empty buffer over caller memory has no base address")
    array = raw[:size]
    base = memory.register(array)
    return CPUBuffer(backend, array, base, size, owned=False, registered=True, owner=ptr, buft=buft)
