"""`BufferType`: ggml's `ggml_backend_buffer_type`, a kind of memory a device allocates.

Public methods are ggml's `ggml_backend_buft_*` functions; the `_`-prefixed
methods are the hooks of `ggml_backend_buffer_type_i` that a backend
overrides. Required: `_get_name`, `_alloc_buffer`, `_get_alignment`.
Optional, with ggml's defaults: `_get_max_size` (SIZE_MAX), `_get_alloc_size`
(ggml_nbytes), `_is_host` (False).

A buffer type belongs to a device (`get_device()`, None for a backend's own
type when the backend has no device). The buffers it allocates have no
backend (`buffer.backend` is None): they move their own bytes (the buffer's
`_set_tensor`/`_get_tensor` hooks), and any backend whose device
`supports_buft` this type computes with them. `Backend.alloc_buffer` gives a
buffer of the backend's default type that also belongs to that backend.

The public methods check what they are given and what the hooks answer: a
size is an int >= 0 and at most the type's max size (OutOfMemoryError naming
both), the alignment a power of 2, an alloc size at least the tensor's bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.backend.buffer import Buffer
from pyggml.core.checks import check_instance, check_size
from pyggml.core.errors import GGMLError, OutOfMemoryError
from pyggml.core.tensor import Tensor

if TYPE_CHECKING:
    from pyggml.backend.device import Device

SIZE_MAX = 2**64 - 1  # ggml's default max size: no limit


class BufferType:
    """A kind of memory: allocates buffers, and says how tensors are laid out in them."""

    def __init__(self, device: Device | None = None, context: Any = None) -> None:
        self.device = device
        self.context = context

    # --- hooks (ggml_backend_buffer_type_i) ---

    def _get_name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_name")

    def _alloc_buffer(self, size: int) -> Buffer:
        """A new buffer of `size` bytes (checked: an int in [0, max size])."""
        raise NotImplementedError(f"{type(self).__name__} must implement _alloc_buffer")

    def _get_alignment(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_alignment")

    def _get_max_size(self) -> int:
        """The largest buffer this type allocates (optional: SIZE_MAX)."""
        return SIZE_MAX

    def _get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes a tensor takes in a buffer of this type, padding included (optional: ggml_nbytes)."""
        return tensor.nbytes()

    def _is_host(self) -> bool:
        """Whether the memory is host memory with ggml's tensor layout (optional: False)."""
        return False

    # --- ggml_backend_buft_* ---

    def name(self) -> str:
        return self._get_name()

    def alloc_buffer(self, size: int) -> Buffer:
        """ggml_backend_buft_alloc_buffer: a new buffer of `size` bytes (an int, at most `get_max_size()`)."""
        size = check_size(size, f"buffer type '{self.name()}': alloc_buffer: size")
        check_max_size(self, size, "alloc_buffer")
        buffer = self._alloc_buffer(size)
        check_instance(buffer, Buffer, f"buffer type '{self.name()}': alloc_buffer's result")
        if buffer.buft is None:
            buffer.buft = self
        return buffer

    def get_alignment(self) -> int:
        """ggml_backend_buft_get_alignment: the byte alignment of tensors in this type's buffers (a power of 2)."""
        alignment = self._get_alignment()
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
                or alignment & (alignment - 1):
            raise GGMLError(f"buffer type '{self.name()}': its alignment must be a power of 2, got {alignment!r}")
        return alignment

    def get_max_size(self) -> int:
        """ggml_backend_buft_get_max_size: the largest buffer this type allocates (SIZE_MAX: no limit)."""
        return self._get_max_size()

    def get_alloc_size(self, tensor: Tensor) -> int:
        """ggml_backend_buft_get_alloc_size: bytes `tensor` takes in a buffer of this type (>= its nbytes)."""
        check_instance(tensor, Tensor, f"buffer type '{self.name()}': get_alloc_size: tensor")
        size = self._get_alloc_size(tensor)
        nbytes = tensor.nbytes()
        if size < nbytes:
            raise GGMLError(f"buffer type '{self.name()}': get_alloc_size of '{tensor.name}' is {size} bytes, "
                            f"less than its {nbytes} bytes")
        return size

    def is_host(self) -> bool:
        """ggml_backend_buft_is_host: whether tensors in this type's buffers are host memory, viewable by address."""
        return bool(self._is_host())

    def get_device(self) -> Device | None:
        """ggml_backend_buft_get_device."""
        return self.device

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"


def check_max_size(buft: BufferType, size: int, what: str) -> None:
    """OutOfMemoryError naming the buffer type when `size` bytes exceed its max size."""
    max_size = buft.get_max_size()
    if size > max_size:
        raise OutOfMemoryError(f"buffer type '{buft.name()}': {what} of {size} bytes exceeds its max size "
                               f"({max_size} bytes)")
