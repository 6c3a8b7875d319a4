"""`Buffer`: ggml's `ggml_backend_buffer`, a block of a backend's memory.

Public methods are the seed's `ggml_backend_buffer_*` functions: they check
their arguments, apply the seed's defaults and call the hooks (the
`ggml_backend_buffer_i` entries, as `_`-prefixed methods) that a backend's
buffer class overrides. `_get_base` is required; the others are optional and
default to what the seed does when the entry is NULL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.errors import BufferFreedError, GGMLError
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
