"""`Buffer`: ggml's `ggml_backend_buffer`, a block of a backend's memory.

Public methods are ggml's `ggml_backend_buffer_*` functions: they check
their arguments, apply ggml's defaults and call the hooks (the
`ggml_backend_buffer_i` entries, as `_`-prefixed methods) that a backend's
buffer class overrides. `_get_base` is required; the others are optional and
default to what ggml does when the entry is NULL.

A buffer has a buffer type (`buft`, see
`pyggml.backend.buffer_type`), which answers for the buffer's alignment, max
size, alloc size and `is_host` when the buffer's class does not; a usage
(`BufferUsage`: ANY, WEIGHTS, COMPUTE) that allocators and the scheduler read;
and the tensor data hooks `_set_tensor`, `_get_tensor`, `_memset_tensor`,
`_cpy_tensor` (the buffer moves its own bytes, so a buffer made by a buffer
type needs no backend). Their defaults ask the buffer's backend
(`_set_tensor_async` then `_synchronize`, ...). `backend` is the backend the
buffer was allocated for (`Backend.alloc_buffer`), or None for a buffer made
by a buffer type or over caller memory.

`buffer_init` is `ggml_backend_buffer_init` for C-style code: a buffer made
from an interface object of callables (`BufferInterface`), a context, and a
backend or a buffer type.

Freed buffers: every method that reads or writes the memory (`get_base`,
`get_alignment`, `get_alloc_size`, `init_tensor`, `free_tensor`, `clear`)
raises BufferFreedError naming the buffer and its size. `free()` itself is
idempotent: the first call releases the memory (the seed frees once), later
calls do nothing, as Python's `close()` methods. `get_size`, `is_host` and
`repr` stay answerable after free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from pyggml.core import memory
from pyggml.core.checks import check_instance, check_int, check_size
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    GGMLError,
    GraphError,
    OutOfBoundsError,
    UnsupportedOpError,
)
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS

if TYPE_CHECKING:
    from pyggml.backend.backend import Backend
    from pyggml.backend.buffer_type import BufferType


class BufferUsage(IntEnum):
    """ggml_backend_buffer_usage: what a buffer holds. The loader marks weights, allocators their
    compute buffers; the graph allocator never frees or overwrites a tensor of a WEIGHTS buffer."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class Buffer:
    """Memory of a backend: `size` bytes from address `get_base()`."""

    def __init__(self, backend: Backend | None, size: int, context: Any = None, buft: BufferType | None = None) -> None:
        self.backend = backend
        self.size = check_size(size, "buffer size")
        self.context = context
        self.buft = buft
        self.usage = BufferUsage.ANY
        self.freed = False
        if backend is not None:
            self.name = backend.name()
        else:
            self.name = buft.name() if buft is not None else "buffer"

    # --- hooks (ggml_backend_buffer_i) ---

    def _get_base(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_base")

    def _free_buffer(self) -> None:
        """Release the memory (optional: buffers over memory they do not own keep it)."""

    def _get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes the allocator reserves for `tensor` (optional: the buffer type's, else ggml_nbytes)."""
        if self.buft is not None:
            return self.buft.get_alloc_size(tensor)
        return tensor.nbytes()

    def _init_tensor(self, tensor: Tensor) -> None:
        """Called after `tensor` got memory in this buffer (optional)."""

    @property
    def has_init_tensor(self) -> bool:
        """Whether this buffer has the init_tensor hook (ggml: `buffer->iface.init_tensor != NULL`); a caller
        that has checked a tensor's place itself may skip the call when it has not."""
        return type(self)._init_tensor is not Buffer._init_tensor

    def _free_tensor(self, tensor: Tensor) -> None:
        """Called before `tensor`'s memory is given back (optional)."""

    def _is_host(self) -> bool:
        """True if the memory is host memory registered in `pyggml.core.memory` (optional: the buffer
        type's answer, else False).

        Not in the seed (ggml added `is_host` a little later); host buffers let
        callers view tensors zero-copy with `Tensor.numpy()`.
        """
        return self.buft.is_host() if self.buft is not None else False

    def _clear(self, value: int) -> None:
        """Set every byte to `value` (optional: host buffers fill their registered memory, others refuse)."""
        if not self._is_host():
            raise UnsupportedOpError(f"buffer '{self.name}' ({type(self).__name__}) cannot be cleared: "
                                     f"its backend does not implement clear")
        if self.size == 0:
            return
        found = memory.find(self._get_base(), self.size)
        if found is None:
            raise OutOfBoundsError(f"buffer '{self.name}': its {self.size} bytes are not in host memory")
        array, offset = found
        array[offset: offset + self.size] = value

    def _reset(self) -> None:
        """Forget per-tensor state made by `_init_tensor` (optional: nothing)."""

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Copy `size` bytes of `data` (1-D, format 'B') to the tensor's bytes from `offset`, complete on return
        (checked already). Optional: through the buffer's backend (`_set_tensor_async`, `_synchronize`)."""
        backend = self._io_backend("_set_tensor")
        backend._set_tensor_async(tensor, data, offset, size)
        backend._synchronize()

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Copy `size` bytes of the tensor from `offset` into `data` (1-D, writable, format 'B'), complete on
        return. Optional: the buffer's backend (`_get_tensor_async`, `_synchronize`)."""
        backend = self._io_backend("_get_tensor")
        backend._get_tensor_async(tensor, data, offset, size)
        backend._synchronize()

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        """Set `size` bytes of the tensor from `offset` to `value` (optional: a `_set_tensor` of filled bytes)."""
        self._set_tensor(tensor, memoryview(np.full(size, value, dtype=np.uint8)), offset, size)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy `src` (any buffer) into `dst` (this buffer); False if not handled (optional: False)."""
        return False

    def backend_moves_bytes(self) -> bool:
        """Whether the buffer has a backend with its own data hooks (`_set_tensor_async`): a buffer a backend
        allocated is read and written through it. Buffer classes that move their own bytes ask this first, so a
        backend that watches its transfers sees them."""
        from pyggml.backend.backend import Backend

        backend = self.backend
        return backend is not None and type(backend)._set_tensor_async is not Backend._set_tensor_async

    def _io_backend(self, what: str) -> Backend:
        """The backend that moves this buffer's bytes for the default data hooks, or an error naming why not."""
        if not self.backend_moves_bytes():
            raise UnsupportedOpError(f"buffer '{self.name}' ({type(self).__name__}) implements no {what}, and has "
                                     f"no backend with data hooks")
        assert self.backend is not None
        return self.backend

    # --- ggml_backend_buffer_* ---

    def check_alive(self) -> None:
        if self.freed:
            raise BufferFreedError(f"buffer '{self.name}' ({self.size} bytes) was used after it was freed")

    def free(self) -> None:
        """ggml_backend_buffer_free. Idempotent: the memory is released once, a second call does nothing."""
        if self.freed:
            return
        self._free_buffer()
        self.freed = True

    def get_alignment(self) -> int:
        """The buffer's backend's alignment; a buffer without one asks its buffer type."""
        self.check_alive()
        if self.backend is not None:
            return self.backend.get_alignment()
        if self.buft is not None:
            return self.buft.get_alignment()
        raise GGMLError(f"buffer '{self.name}' has no backend and no buffer type to ask for its alignment")

    def get_max_size(self) -> int:
        """ggml_backend_buffer_get_max_size: the largest buffer its type allocates (SIZE_MAX without a type)."""
        from pyggml.backend.buffer_type import SIZE_MAX

        return self.buft.get_max_size() if self.buft is not None else SIZE_MAX

    def get_type(self) -> BufferType | None:
        """ggml_backend_buffer_get_type: the buffer type that made this buffer (None for a buffer made without one)."""
        return self.buft

    def set_usage(self, usage: BufferUsage | int) -> None:
        """ggml_backend_buffer_set_usage: ANY, WEIGHTS or COMPUTE (a `BufferUsage` or its number)."""
        check_int(usage, f"buffer '{self.name}': set_usage: usage")
        try:
            self.usage = BufferUsage(usage)
        except ValueError:
            names = ", ".join(f"{u.name} = {u.value}" for u in BufferUsage)
            raise ArgumentError(f"buffer '{self.name}': set_usage: {usage} is not a buffer usage ({names})") from None

    def get_usage(self) -> BufferUsage:
        return self.usage

    def reset(self) -> None:
        """ggml_backend_buffer_reset: forget per-tensor state made by init_tensor (the `_reset` hook)."""
        self.check_alive()
        self._reset()

    def get_size(self) -> int:
        return self.size

    def get_base(self) -> int:
        self.check_alive()
        base = self._get_base()
        if not base:
            raise GGMLError(f"buffer '{self.name}': base address cannot be NULL")
        return base

    def get_alloc_size(self, tensor: Tensor) -> int:
        self.check_alive()
        check_instance(tensor, Tensor, f"buffer '{self.name}': get_alloc_size: tensor")
        return self._get_alloc_size(tensor)

    def init_tensor(self, tensor: Tensor) -> None:
        """ggml_backend_buffer_init_tensor: `tensor` got memory here; its bytes must lie inside the buffer.

        A tensor without an address yet (data None) is passed to the hook unchecked, as the seed does.
        """
        self.check_alive()
        check_instance(tensor, Tensor, f"buffer '{self.name}': init_tensor: tensor")
        if tensor.data is not None:
            # a tensor placed outside the buffer would make kernels write another buffer's bytes
            self.check_tensor(tensor, "init_tensor")
        self._init_tensor(tensor)

    def free_tensor(self, tensor: Tensor) -> None:
        self.check_alive()
        check_instance(tensor, Tensor, f"buffer '{self.name}': free_tensor: tensor")
        self._free_tensor(tensor)

    def is_host(self) -> bool:
        return self._is_host()

    def clear(self, value: int = 0) -> None:
        """ggml_backend_buffer_clear (ggml's later name): set every byte of the buffer to `value` (0..255)."""
        self.check_alive()
        value = check_int(value, f"buffer '{self.name}': clear: value", minimum=0, maximum=255)
        if self.size == 0:  # nothing to clear
            return
        self._clear(value)

    def check_extent(self, addr: int, nbytes: int, name: str, what: str) -> None:
        """OutOfBoundsError unless [addr, addr + nbytes) lies inside this buffer (alive: checked by the caller)."""
        offset = addr - self._get_base()
        if offset < 0 or offset + nbytes > self.size:
            raise OutOfBoundsError(
                f"{what}: {nbytes} bytes of '{name}' at offset {offset} are outside its {self.size} bytes of "
                f"buffer '{self.name}'"
            )

    def check_tensor(self, tensor: Tensor, what: str) -> None:
        """OutOfBoundsError unless every byte `tensor` can reach (negative strides included) is in this buffer."""
        assert tensor.data is not None
        lo, hi = tensor_span(tensor)
        self.check_extent(tensor.data + lo, hi - lo, tensor.name, what)

    # --- Python conveniences ---

    def contains(self, addr: int, nbytes: int) -> bool:
        """True if [addr, addr + nbytes) lies inside this buffer."""
        base = self.get_base()
        return base <= addr and addr + nbytes <= base + self.size

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"{self.size} bytes"
        usage = "" if self.usage == BufferUsage.ANY else f", {self.usage.name}"
        return f"{type(self).__name__}('{self.name}', {state}{usage})"


def check_plan_buffers(freed: bool, n_nodes: int, buffers: list[Buffer]) -> None:
    """graph_plan_compute's checks, shared by backends: the plan and every buffer it reads are alive."""
    if freed:
        raise GraphError(f"graph_plan_compute: the plan of {n_nodes} nodes was freed")
    for buffer in buffers:
        if buffer.freed:
            raise BufferFreedError(
                f"graph_plan_compute: buffer '{buffer.name}' ({buffer.size} bytes) used by the plan was freed"
            )


def tensor_span(tensor: Tensor) -> tuple[int, int]:
    """The byte range [lo, hi) from `tensor.data` that its elements occupy: (0, nbytes) for
    non-negative strides; a negative stride reaches below `data`. (0, 0) for an empty tensor."""
    ne, nb = tensor.ne, tensor.nb
    if min(ne) <= 0:
        return 0, 0
    if min(nb) >= 0:
        return 0, tensor.nbytes()
    tr = TYPE_TRAITS[tensor.type]
    if tr.blck_size == 1:
        first, last = 0, tr.type_size
        dims = range(len(ne))
    else:  # rows of whole blocks
        first, last = 0, max(ne[0] * nb[0] // tr.blck_size, 0)
        dims = range(1, len(ne))
    for i in dims:
        step = (ne[i] - 1) * nb[i]
        if step < 0:
            first += step
        else:
            last += step
    return first, last


def tensor_buffer(tensor: Tensor) -> Buffer | None:
    """The buffer holding `tensor`'s memory: its own, else its view source's.

    A view made in a context after its source got memory has `data` but no
    `buffer` until an allocator's init_view sets it; its memory is the source's.
    """
    buffer = tensor.buffer
    if buffer is None and tensor.view_src is not None:
        buffer = tensor.view_src.buffer
    return buffer


# --- ggml_backend_buffer_init: buffers from an interface of callables ---


@dataclass
class BufferInterface:
    """ggml's `struct ggml_backend_buffer_i`: callables taking the buffer first; None = the default.

    Its entries: `free_buffer`, `get_base`, `get_alloc_size`, `init_tensor`, `free_tensor`, `memset_tensor`,
    `set_tensor`, `get_tensor`, `cpy_tensor`, `clear`, `reset`.
    """

    free_buffer: Callable[[Buffer], None] | None = None
    get_base: Callable[[Buffer], int] | None = None
    get_alloc_size: Callable[[Buffer, Tensor], int] | None = None
    init_tensor: Callable[[Buffer, Tensor], None] | None = None
    free_tensor: Callable[[Buffer, Tensor], None] | None = None
    memset_tensor: Callable[[Buffer, Tensor, int, int, int], None] | None = None
    set_tensor: Callable[[Buffer, Tensor, memoryview, int, int], None] | None = None
    get_tensor: Callable[[Buffer, Tensor, memoryview, int, int], None] | None = None
    cpy_tensor: Callable[[Buffer, Tensor, Tensor], bool] | None = None
    clear: Callable[[Buffer, int], None] | None = None
    reset: Callable[[Buffer], None] | None = None


def _entry(iface: Any, name: str) -> Callable[..., Any] | None:
    if isinstance(iface, dict):
        return iface.get(name)
    return getattr(iface, name, None)


class IfaceBuffer(Buffer):
    """A buffer whose hooks are the entries of an interface object (C-style backends)."""

    def __init__(self, backend: Backend | None, iface: Any, context: Any, size: int,
                 buft: BufferType | None = None) -> None:
        super().__init__(backend, size, context, buft)
        self.iface = iface
        # look the entries up once: the iface is a fixed table, as in C
        self._iface_free_buffer = _entry(iface, "free_buffer")
        self._iface_get_base = _entry(iface, "get_base")
        self._iface_get_alloc_size = _entry(iface, "get_alloc_size")
        self._iface_init_tensor = _entry(iface, "init_tensor")
        self._iface_free_tensor = _entry(iface, "free_tensor")
        self._iface_memset_tensor = _entry(iface, "memset_tensor")
        self._iface_set_tensor = _entry(iface, "set_tensor")
        self._iface_get_tensor = _entry(iface, "get_tensor")
        self._iface_cpy_tensor = _entry(iface, "cpy_tensor")
        self._iface_clear = _entry(iface, "clear")
        self._iface_reset = _entry(iface, "reset")

    def _get_base(self) -> int:
        assert self._iface_get_base is not None
        return int(self._iface_get_base(self))

    def _free_buffer(self) -> None:
        if self._iface_free_buffer is not None:
            self._iface_free_buffer(self)

    def _get_alloc_size(self, tensor: Tensor) -> int:
        if self._iface_get_alloc_size is not None:
            return int(self._iface_get_alloc_size(self, tensor))
        return super()._get_alloc_size(tensor)

    def _init_tensor(self, tensor: Tensor) -> None:
        if self._iface_init_tensor is not None:
            self._iface_init_tensor(self, tensor)

    @property
    def has_init_tensor(self) -> bool:
        return self._iface_init_tensor is not None

    def _free_tensor(self, tensor: Tensor) -> None:
        if self._iface_free_tensor is not None:
            self._iface_free_tensor(self, tensor)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        if self._iface_memset_tensor is not None:
            self._iface_memset_tensor(self, tensor, value, offset, size)
        else:
            super()._memset_tensor(tensor, value, offset, size)

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self._iface_set_tensor is not None:
            self._iface_set_tensor(self, tensor, data, offset, size)
        else:
            super()._set_tensor(tensor, data, offset, size)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if self._iface_get_tensor is not None:
            self._iface_get_tensor(self, tensor, data, offset, size)
        else:
            super()._get_tensor(tensor, data, offset, size)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        if self._iface_cpy_tensor is not None:
            return bool(self._iface_cpy_tensor(self, src, dst))
        return False

    def _clear(self, value: int) -> None:
        if self._iface_clear is not None:
            self._iface_clear(self, value)
        else:
            super()._clear(value)

    def _reset(self) -> None:
        if self._iface_reset is not None:
            self._iface_reset(self)


def buffer_init(owner: Backend | BufferType | None, iface: Any, context: Any, size: int) -> Buffer:
    """ggml_backend_buffer_init: a buffer of `size` bytes from `iface` (a `BufferInterface`,
    any object with those attributes, or a dict) and `context` (the buffer's `context`).

    `owner` is a backend, or a buffer type (the buffer then has no backend, and
    its data hooks must be in `iface` or it cannot be read or written), or None.
    """
    from pyggml.backend.backend import Backend
    from pyggml.backend.buffer_type import BufferType

    get_base = _entry(iface, "get_base")
    if get_base is None or not callable(get_base):
        raise ArgumentError("buffer_init: the interface must have a get_base callable (the seed asserts it)")
    size = check_size(size, "buffer_init: size")
    if owner is not None:
        check_instance(owner, (Backend, BufferType), "buffer_init: backend or buffer type")
    if isinstance(owner, BufferType):
        return IfaceBuffer(None, iface, context, size, owner)
    return IfaceBuffer(owner, iface, context, size)
