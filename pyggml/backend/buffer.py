"""`Buffer`: ggml's `ggml_backend_buffer`, a block of a backend's memory.

Public methods are the seed's `ggml_backend_buffer_*` functions: they check
their arguments, apply the seed's defaults and call the hooks (the
`ggml_backend_buffer_i` entries, as `_`-prefixed methods) that a backend's
buffer class overrides. `_get_base` is required; the others are optional and
default to what the seed does when the entry is NULL.

`buffer_init` is `ggml_backend_buffer_init` for C-style code: a buffer made
from an interface object of callables (`BufferInterface`) and a context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyggml.core.errors import ArgumentError, BufferFreedError, GGMLError, GraphError
from pyggml.core.tensor import Tensor

if TYPE_CHECKING:
    from pyggml.backend.backend import Backend


class Buffer:
    """Memory of a backend: `size` bytes from address `get_base()`."""

    def __init__(self, backend: Backend | None, size: int, context: Any = None) -> None:
        self.backend = backend
        self.size = int(size)
        self.context = context
        self.freed = False
        self.name = backend.name() if backend is not None else "buffer"

    # --- hooks (ggml_backend_buffer_i) ---

    def _get_base(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_base")

    def _free_buffer(self) -> None:
        """Release the memory (optional: buffers over memory they do not own keep it)."""

    def _get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes the allocator reserves for `tensor` (optional: ggml_nbytes)."""
        return tensor.nbytes()

    def _init_tensor(self, tensor: Tensor) -> None:
        """Called after `tensor` got memory in this buffer (optional)."""

    def _free_tensor(self, tensor: Tensor) -> None:
        """Called before `tensor`'s memory is given back (optional)."""

    def _is_host(self) -> bool:
        """True if the memory is host memory registered in `pyggml.core.memory` (optional: False).

        Not in the seed (ggml added `is_host` a little later); host buffers let
        callers view tensors zero-copy with `Tensor.numpy()`.
        """
        return False

    # --- ggml_backend_buffer_* ---

    def check_alive(self) -> None:
        if self.freed:
            raise BufferFreedError(f"buffer '{self.name}' ({self.size} bytes) was used after it was freed")

    def free(self) -> None:
        """ggml_backend_buffer_free; freeing twice is harmless."""
        if self.freed:
            return
        self._free_buffer()
        self.freed = True

    def get_alignment(self) -> int:
        self.check_alive()
        if self.backend is None:
            raise GGMLError(f"buffer '{self.name}' has no backend to ask for its alignment")
        return self.backend.get_alignment()

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
        return self._get_alloc_size(tensor)

    def init_tensor(self, tensor: Tensor) -> None:
        self.check_alive()
        self._init_tensor(tensor)

    def free_tensor(self, tensor: Tensor) -> None:
        self.check_alive()
        self._free_tensor(tensor)

    def is_host(self) -> bool:
        return self._is_host()

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
        return f"{type(self).__name__}('{self.name}', {state})"


def check_plan_buffers(freed: bool, n_nodes: int, buffers: list[Buffer]) -> None:
    """graph_plan_compute's checks, shared by backends: the plan and every buffer it reads are alive."""
    if freed:
        raise GraphError(f"graph_plan_compute: the plan of {n_nodes} nodes was freed")
    for buffer in buffers:
        if buffer.freed:
            raise BufferFreedError(
                f"graph_plan_compute: buffer '{buffer.name}' ({buffer.size} bytes) used by the plan was freed"
            )


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
    """ggml's `struct ggml_backend_buffer_i`: callables taking the buffer first; None = the seed's default."""

    free_buffer: Callable[[Buffer], None] | None = None
    get_base: Callable[[Buffer], int] | None = None
    get_alloc_size: Callable[[Buffer, Tensor], int] | None = None
    init_tensor: Callable[[Buffer, Tensor], None] | None = None
    free_tensor: Callable[[Buffer, Tensor], None] | None = None


def _entry(iface: Any, name: str) -> Callable[..., Any] | None:
    if isinstance(iface, dict):
        return iface.get(name)
    return getattr(iface, name, None)


class IfaceBuffer(Buffer):
    """A buffer whose hooks are the entries of an interface object (C-style backends)."""

    def __init__(self, backend: Backend | None, iface: Any, context: Any, size: int) -> None:
        super().__init__(backend, size, context)
        self.iface = iface
        # look the entries up once: the iface is a fixed table, as in C
        self._iface_free_buffer = _entry(iface, "free_buffer")
        self._iface_get_base = _entry(iface, "get_base")
        self._iface_get_alloc_size = _entry(iface, "get_alloc_size")
        self._iface_init_tensor = _entry(iface, "init_tensor")
        self._iface_free_tensor = _entry(iface, "free_tensor")

    def _get_base(self) -> int:
        assert self._iface_get_base is not None
        return int(self._iface_get_base(self))

    def _free_buffer(self) -> None:
        if self._iface_free_buffer is not None:
            self._iface_free_buffer(self)

    def _get_alloc_size(self, tensor: Tensor) -> int:
        if self._iface_get_alloc_size is not None:
            return int(self._iface_get_alloc_size(self, tensor))
        return tensor.nbytes()

    def _init_tensor(self, tensor: Tensor) -> None:
        if self._iface_init_tensor is not None:
            self._iface_init_tensor(self, tensor)

    def _free_tensor(self, tensor: Tensor) -> None:
        if self._iface_free_tensor is not None:
            self._iface_free_tensor(self, tensor)


def buffer_init(backend: Backend | None, iface: Any, context: Any, size: int) -> Buffer:
    """ggml_backend_buffer_init: a buffer of `size` bytes from `iface` (a `BufferInterface`,
    any object with those attributes, or a dict) and `context` (the buffer's `context`)."""
    get_base = _entry(iface, "get_base")
    if get_base is None or not callable(get_base):
        raise ArgumentError("buffer_init: the interface must have a get_base callable (the seed asserts it)")
    if size < 0:
        raise ArgumentError(f"buffer_init: size must be >= 0, got {size}")
    return IfaceBuffer(backend, iface, context, size)
