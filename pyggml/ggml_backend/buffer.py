"""`Buffer`: ggml's `ggml_backend_buffer` (ggml-backend-impl.h's ggml_backend_buffer_i, ggml-backend.cpp).

Public methods are ggml's `ggml_backend_buffer_*`; `_`-prefixed hooks are the interface entries, `_get_base`
required, the others' bodies their NULL defaults (the data hooks ask the buffer's backend). After `free()`
anything touching the memory raises BufferFreedError; `buffer_init` builds one from a table of callables.
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
    from pyggml.ggml_backend.backend import Backend
    from pyggml.ggml_backend.buffer_type import BufferType


class BufferUsage(IntEnum):
    """ggml_backend_buffer_usage; the graph allocator never frees or overwrites a WEIGHTS buffer's tensors."""

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

    def _get_base(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_base")

    def _free_buffer(self) -> None:
        ...

    def _get_alloc_size(self, tensor: Tensor) -> int:
        if self.buft is not None:
            return self.buft.get_alloc_size(tensor)
        return tensor.nbytes()

    def _init_tensor(self, tensor: Tensor) -> None:
        ...

    @property
    def has_init_tensor(self) -> bool:
        """ggml's `buffer->iface.init_tensor != NULL`: a caller that checked a place may skip the call."""
        return type(self)._init_tensor is not Buffer._init_tensor

    def _free_tensor(self, tensor: Tensor) -> None:
        ...

    def _is_host(self) -> bool:
        """Host memory registered in `pyggml.core.memory` (zero-copy `Tensor.numpy()`); default: the type's."""
        return self.buft.is_host() if self.buft is not None else False

    def _clear(self, value: int) -> None:
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
        ...

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """`data` (1-D bytes) into the tensor from `offset` (checked), complete on return; default: the backend's."""
        backend = self._io_backend("_set_tensor")
        backend._set_tensor_async(tensor, data, offset, size)
        backend._synchronize()

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        backend = self._io_backend("_get_tensor")
        backend._get_tensor_async(tensor, data, offset, size)
        backend._synchronize()

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._set_tensor(tensor, memoryview(np.full(size, value, dtype=np.uint8)), offset, size)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy `src` (any buffer) into `dst` (ours); False: not handled."""
        return False

    def backend_moves_bytes(self) -> bool:
        """Whether the buffer's backend has its own data hooks; buffers moving their own bytes defer to it."""
        from pyggml.ggml_backend.backend import Backend

        backend = self.backend
        return backend is not None and type(backend)._set_tensor_async is not Backend._set_tensor_async

    def _io_backend(self, what: str) -> Backend:
        if not self.backend_moves_bytes():
            raise UnsupportedOpError(f"buffer '{self.name}' ({type(self).__name__}) implements no {what}, and has "
                                     f"no backend with data hooks")
        assert self.backend is not None
        return self.backend

    def check_alive(self) -> None:
        if self.freed:
            raise BufferFreedError(f"buffer '{self.name}' ({self.size} bytes) was used after it was freed")

    def free(self) -> None:
        """ggml_backend_buffer_free; a second call does nothing."""
        if self.freed:
            return
        self._free_buffer()
        self.freed = True

    def get_alignment(self) -> int:
        self.check_alive()
        if self.backend is not None:
            return self.backend.get_alignment()
        if self.buft is not None:
            return self.buft.get_alignment()
        raise GGMLError(f"buffer '{self.name}' has no backend and no buffer type to ask for its alignment")

    def get_max_size(self) -> int:
        from pyggml.ggml_backend.buffer_type import SIZE_MAX

        return self.buft.get_max_size() if self.buft is not None else SIZE_MAX

    def get_type(self) -> BufferType | None:
        return self.buft

    def set_usage(self, usage: BufferUsage | int) -> None:
        check_int(usage, f"buffer '{self.name}': set_usage: usage")
        try:
            self.usage = BufferUsage(usage)
        except ValueError:
            names = ", ".join(f"{u.name} = {u.value}" for u in BufferUsage)
            raise ArgumentError(f"buffer '{self.name}': set_usage: {usage} is not a buffer usage ({names})") from None

    def get_usage(self) -> BufferUsage:
        return self.usage

    def reset(self) -> None:
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
        """ggml_backend_buffer_init_tensor: `tensor`'s bytes must lie inside (data None: unchecked, as ggml)."""
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
        """ggml_backend_buffer_clear: every byte to `value` (0..255)."""
        self.check_alive()
        value = check_int(value, f"buffer '{self.name}': clear: value", minimum=0, maximum=255)
        if self.size == 0:
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
    """The byte range [lo, hi) from `tensor.data` its elements occupy (a negative stride reaches below)."""
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
    """The buffer holding `tensor`'s memory: its own, else its view source's (a view not yet init_view'ed)."""
    buffer = tensor.buffer
    if buffer is None and tensor.view_src is not None:
        buffer = tensor.view_src.buffer
    return buffer


@dataclass
class BufferInterface:
    """ggml's `struct ggml_backend_buffer_i`: callables taking the buffer first; None = the default."""

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
    """ggml_backend_buffer_init: a buffer of `size` bytes from `iface` (a `BufferInterface`, an object, a dict);
    `owner` is a backend, a buffer type (no backend: the data hooks must be in `iface`) or None."""
    from pyggml.ggml_backend.backend import Backend
    from pyggml.ggml_backend.buffer_type import BufferType

    get_base = _entry(iface, "get_base")
    if get_base is None or not callable(get_base):
        raise ArgumentError("buffer_init: the interface must have a get_base callable (the seed asserts it)")
    size = check_size(size, "buffer_init: size")
    if owner is not None:
        check_instance(owner, (Backend, BufferType), "buffer_init: backend or buffer type")
    if isinstance(owner, BufferType):
        return IfaceBuffer(None, iface, context, size, owner)
    return IfaceBuffer(owner, iface, context, size)
