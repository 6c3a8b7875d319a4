"""`BufferType`: ggml's `ggml_backend_buffer_type` (ggml_backend_buffer_type_i), a kind of memory a device allocates.

Public methods are ggml's `ggml_backend_buft_*` and check the hooks' answers; its buffers have no backend and
move their own bytes (`Backend.alloc_buffer` gives ones that belong to a backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.checks import check_instance, check_size
from pyggml.core.errors import GGMLError, OutOfMemoryError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer

if TYPE_CHECKING:
    from pyggml.ggml_backend.device import Device

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
        raise NotImplementedError(f"{type(self).__name__} must implement _alloc_buffer")

    def _get_alignment(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_alignment")

    def _get_max_size(self) -> int:
        return SIZE_MAX

    def _get_alloc_size(self, tensor: Tensor) -> int:
        return tensor.nbytes()

    def _is_host(self) -> bool:
        return False

    # --- ggml_backend_buft_* ---

    def name(self) -> str:
        return self._get_name()

    def alloc_buffer(self, size: int) -> Buffer:
        size = check_size(size, f"buffer type '{self.name()}': alloc_buffer: size")
        check_max_size(self, size, "alloc_buffer")
        buffer = self._alloc_buffer(size)
        check_instance(buffer, Buffer, f"buffer type '{self.name()}': alloc_buffer's result")
        if buffer.buft is None:
            buffer.buft = self
        return buffer

    def get_alignment(self) -> int:
        alignment = self._get_alignment()
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
                or alignment & (alignment - 1):
            raise GGMLError(f"buffer type '{self.name()}': its alignment must be a power of 2, got {alignment!r}")
        return alignment

    def get_max_size(self) -> int:
        return self._get_max_size()

    def get_alloc_size(self, tensor: Tensor) -> int:
        """ggml_backend_buft_get_alloc_size: padding included, checked to be >= ggml_nbytes."""
        check_instance(tensor, Tensor, f"buffer type '{self.name()}': get_alloc_size: tensor")
        size = self._get_alloc_size(tensor)
        nbytes = tensor.nbytes()
        if size < nbytes:
            raise GGMLError(f"buffer type '{self.name()}': get_alloc_size of '{tensor.name}' is {size} bytes, "
                            f"less than its {nbytes} bytes")
        return size

    def is_host(self) -> bool:
        return bool(self._is_host())

    def get_device(self) -> Device | None:
        return self.device

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"


def check_max_size(buft: BufferType, size: int, what: str) -> None:
    """OutOfMemoryError naming the buffer type when `size` bytes exceed its max size."""
    max_size = buft.get_max_size()
    if size > max_size:
        raise OutOfMemoryError(f"buffer type '{buft.name()}': {what} of {size} bytes exceeds its max size "
                               f"({max_size} bytes)")
