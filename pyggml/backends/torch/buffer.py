"""Torch buffers: a backend's memory as one torch uint8 tensor on a device.

A buffer of `size` bytes is a uint8 tensor of `size + TORCH_ALIGNMENT` bytes
on the backend's device (`cpu`, `cuda:N`); the extra bytes move the base to a
multiple of TORCH_ALIGNMENT, as the CPU buffer does, so the addresses the
allocators hand out are aligned the way ggml's arithmetic expects.
`get_base()` is that aligned data pointer inside the tensor's storage: a real
device address, so `tensor.data` means the same thing on every backend.

Tensors are read and written as torch views of the storage: the uint8 tensor
is viewed as the tensor's dtype once (`_flat`), then `torch.as_strided` with
ggml's `ne`/`nb` (in elements) gives a 4-D view (ne3, ne2, ne1, ne0), exactly
as `pyggml.core.memory.view` does for host memory. Quantized types come as
raw rows (ne3, ne2, ne1, row bytes) of uint8.

`is_host()` is False, also on the `cpu` device, where the bytes are in fact
host memory. The buffer stands in for device memory: pyggml's host-memory
registry (`pyggml.core.memory`) does not know it, so the CPU backend cannot
read it by address, and graphs split between torch and CPU must go through
the scheduler's copies exactly as they would with `cuda:0`. A `cpu` run then
exercises the same code paths a GPU run does, instead of hiding missing copies
behind zero-copy views. It also keeps the weight cache honest: every write
into a torch buffer goes through the backend's hooks (`note_write`), none
behind its back through a numpy view.

A buffer belongs to a backend (`TorchBackend.alloc_buffer`, written through
the backend's non-blocking copies) or to none (the device's buffer type,
`pyggml.backends.torch.device`): then it moves its own bytes with blocking
copies (`_set_tensor`, `_get_tensor`, `_cpy_tensor`). Every torch backend's
weight cache is told of every write into any torch buffer (`note_writes`),
whichever backend made it.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import TYPE_CHECKING

import torch

from pyggml.core import memory
from pyggml.core.checks import check_host_alloc
from pyggml.core.errors import LayoutError, OutOfBoundsError, OutOfMemoryError, UnsupportedTypeError
from pyggml.core.tensor import Tensor, nbytes_of
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.buffer import Buffer, tensor_buffer

if TYPE_CHECKING:
    from pyggml.backends.torch.cache import WeightCache
    from pyggml.ggml_backend.backend import Backend
    from pyggml.ggml_backend.buffer_type import BufferType

log = logging.getLogger("pyggml.backends.torch")

TORCH_ALIGNMENT = 256

# ggml types whose elements torch holds natively; quantized types are viewed as raw uint8 rows
TORCH_DTYPES: dict[GGMLType, torch.dtype] = {
    GGMLType.F32: torch.float32,
    GGMLType.F16: torch.float16,
    GGMLType.BF16: torch.bfloat16,
    GGMLType.F64: torch.float64,
    GGMLType.I8: torch.int8,
    GGMLType.I16: torch.int16,
    GGMLType.I32: torch.int32,
    GGMLType.I64: torch.int64,
}


# every live torch backend's weight cache: writes into any torch buffer drop what they derived from it
_weight_caches: weakref.WeakSet[WeightCache] = weakref.WeakSet()


def watch_weight_cache(cache: WeightCache) -> None:
    """Tell `cache` of every write into, and free of, any torch buffer from now on."""
    _weight_caches.add(cache)


def host_source(data: memoryview, size: int) -> torch.Tensor:
    """A uint8 torch tensor over the caller's bytes (read only here; torch warns about read-only memory)."""
    if data.readonly:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(data, dtype=torch.uint8, count=size)
    return torch.frombuffer(data, dtype=torch.uint8, count=size)


def host_view(t: Tensor, nbytes: int) -> torch.Tensor | None:
    """A writable uint8 torch view of nbytes of host memory at t.data, or None if it is not host memory."""
    assert t.data is not None
    found = memory.find(t.data, max(nbytes, 1))
    if found is None:
        return None
    array, pos = found
    return torch.from_numpy(array[pos: pos + nbytes])


def view_dtype(type: GGMLType) -> torch.dtype:
    """The torch dtype a tensor of `type` is viewed as (uint8 raw blocks for quantized types)."""
    if TYPE_TRAITS[type].is_quantized:
        return torch.uint8
    dtype = TORCH_DTYPES.get(type)
    if dtype is None:
        raise UnsupportedTypeError(f"torch backend: no torch dtype for type {type.name}")
    return dtype


class TorchBuffer(Buffer):
    """`size` bytes of a device's memory from `base` (TORCH_ALIGNMENT-aligned), in the uint8 tensor `raw`.

    `generation` counts the writes into the buffer (set, copies, graph
    computes); `note_write` bumps it and drops what the backend's weight cache
    derived from the bytes written.
    """

    def __init__(self, backend: Backend | None, size: int, device: torch.device,
                 buft: BufferType | None = None) -> None:
        super().__init__(backend, size, buft=buft)
        self.device: torch.device = device
        # the extra 8 bytes keep every dtype's flat view (rounded down to whole elements) past the last byte
        self.raw: torch.Tensor | None = torch.zeros(size + TORCH_ALIGNMENT + 8, dtype=torch.uint8,
                                                    device=self.device)
        self.storage_ptr = self.raw.untyped_storage().data_ptr()
        shift = (-self.storage_ptr) % TORCH_ALIGNMENT
        self.shift = shift
        self.base = self.storage_ptr + shift
        self.generation = 0
        self._flat: dict[torch.dtype, torch.Tensor] = {}

    # --- hooks ---

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        for cache in list(_weight_caches):
            cache.drop_buffer(self)
        # the storage goes when the last view of it does (plans hold views, checked against `freed`)
        self.raw = None
        self._flat = {}

    def _is_host(self) -> bool:
        return False  # see the module docstring

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self.backend_moves_bytes():
            super()._set_tensor(tensor, data, offset, size)
            return
        if size:
            assert tensor.data is not None
            start = self.check_range(tensor.data + offset, size, tensor.name)
            self.bytes_at(start, size).copy_(host_source(data, size))
            self.note_write(start, size)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self.backend_moves_bytes():
            super()._get_tensor(tensor, data, offset, size)
            return
        if size:
            assert tensor.data is not None
            start = self.check_range(tensor.data + offset, size, tensor.name)
            torch.frombuffer(data, dtype=torch.uint8, count=size).copy_(self.bytes_at(start, size))

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        if self.backend_moves_bytes():
            return False  # the backend's cpy hooks were asked first
        done = copy_into(self, src, dst, non_blocking=False)
        if done and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return done

    # --- torch views ---

    def _alive_raw(self) -> torch.Tensor:
        self.check_alive()
        assert self.raw is not None
        return self.raw

    def flat(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole allocation as a 1-D tensor of `dtype` (a view, made once per dtype)."""
        t = self._flat.get(dtype)
        if t is None:
            raw = self._alive_raw()
            itemsize = torch.empty(0, dtype=dtype).element_size()
            t = raw[: raw.numel() // itemsize * itemsize].view(dtype)
            self._flat[dtype] = t
        return t

    def check_range(self, addr: int, nbytes: int, name: str) -> int:
        """The byte offset of [addr, addr + nbytes) from the base; OutOfBoundsError if it is not inside."""
        offset = addr - self.base
        if offset < 0 or offset + nbytes > self.size:
            raise OutOfBoundsError(
                f"torch buffer '{self.name}': {nbytes} bytes of '{name}' at offset {offset} are outside its "
                f"{self.size} bytes"
            )
        return offset

    def bytes_at(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 view of `nbytes` from byte `offset` (from the base), checked against the size."""
        if offset < 0 or offset + nbytes > self.size:
            raise OutOfBoundsError(f"torch buffer '{self.name}': bytes {offset}..{offset + nbytes} are outside its "
                                   f"{self.size} bytes")
        start = self.shift + offset
        return self._alive_raw()[start: start + nbytes]

    def view(self, addr: int, type: GGMLType, ne: list[int], nb: list[int], name: str = "?") -> torch.Tensor:
        """A 4-D torch view (ne3, ne2, ne1, ne0) of a tensor at `addr` with ggml's strides `nb` (bytes).

        Quantized types: raw rows (ne3, ne2, ne1, row bytes) of uint8. The
        address and strides must be whole elements of the dtype (LayoutError).
        """
        extent = nbytes_of(type, ne, nb)
        self.check_range(addr, extent, name)
        dtype = view_dtype(type)
        tr = TYPE_TRAITS[type]
        if tr.is_quantized:
            shape = (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size)
            byte_strides = (nb[3], nb[2], nb[1], 1)
        else:
            shape = (ne[3], ne[2], ne[1], ne[0])
            byte_strides = (nb[3], nb[2], nb[1], nb[0])
        itemsize = 1 if tr.is_quantized else tr.type_size
        rel = addr - self.storage_ptr
        if rel % itemsize or any(s % itemsize for s in byte_strides):
            raise LayoutError(
                f"torch buffer '{self.name}': tensor '{name}' ({type.name}) at offset {addr - self.base} with "
                f"strides nb={list(nb)} is not aligned to its {itemsize}-byte elements"
            )
        return torch.as_strided(self.flat(dtype), shape, tuple(s // itemsize for s in byte_strides), rel // itemsize)

    def tensor_view(self, t: Tensor) -> torch.Tensor:
        """The torch view of ggml tensor `t` (which must have memory in this buffer)."""
        assert t.data is not None
        return self.view(t.data, t.type, t.ne, t.nb, t.name)

    # --- writes ---

    def _clear(self, value: int) -> None:
        assert self.raw is not None  # alive: checked by clear()
        self.raw[self.shift: self.shift + self.size].fill_(value)
        self.note_write(0, self.size)

    def note_write(self, offset: int, nbytes: int) -> None:
        """Record that bytes [offset, offset + nbytes) (from the base) changed: weight caches forget them."""
        self.note_writes([(offset, offset + nbytes)])

    def note_writes(self, intervals: list[tuple[int, int]]) -> None:
        """Record that the byte ranges [start, end) changed (one generation): weight caches forget them."""
        self.generation += 1
        for cache in _weight_caches:
            if cache.has_buffer(self):
                for start, end in intervals:
                    cache.invalidate(self, start, end)


def copy_into(dbuf: TorchBuffer, src: Tensor, dst: Tensor, non_blocking: bool) -> bool:
    """dst (in `dbuf`) <- src from host memory or any torch buffer: one copy_ between views, no temporary;
    False if src is neither."""
    nbytes = src.nbytes()
    assert dst.data is not None and src.data is not None
    dstart = dbuf.check_range(dst.data, nbytes, dst.name)
    sbuf = tensor_buffer(src)
    if isinstance(sbuf, TorchBuffer):
        source = sbuf.bytes_at(sbuf.check_range(src.data, nbytes, src.name), nbytes)
    elif sbuf is not None and sbuf.is_host():
        host = host_view(src, nbytes)
        if host is None:
            return False
        source = host
    else:
        return False
    if nbytes:
        dbuf.bytes_at(dstart, nbytes).copy_(source, non_blocking=non_blocking)
        dbuf.note_write(dstart, nbytes)
    return True


def torch_alloc_buffer(backend: Backend | None, size: int, device: torch.device,
                       buft: BufferType | None = None) -> TorchBuffer:
    """A zero-filled buffer of `size` bytes on `device`, of `backend` (or of none: a buffer type's).

    On the cpu device the size is checked against the host memory available
    first: torch would otherwise get the pages from an overcommitting kernel
    and be killed while zero-filling them.
    """
    name = backend.name() if backend is not None else f"Torch({device})"
    if device.type == "cpu":
        check_host_alloc(size, f"torch backend '{name}': buffer")
    try:
        return TorchBuffer(backend, size, device, buft)
    except RuntimeError as e:  # torch's OutOfMemoryError is a RuntimeError; the CPU allocator raises one too
        raise OutOfMemoryError(f"torch backend '{name}': cannot allocate a buffer of {size} bytes "
                               f"on {device}: {e}") from e
