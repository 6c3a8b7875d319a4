"""Buffers of the testing BLAS backend: a private numpy store behind a fake base address.

Each buffer gets its own range of fake addresses above the user-space half of
x86-64 (0xB1A5_0000_0000_0000 and up), which no real host pointer can hold,
and is never registered in `pyggml.core.memory`: `Tensor.numpy()` and the CPU
kernels cannot reach it. Tensors are read and written through the store by
offset (`tensor.data - base`).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from pyggml.core.errors import ArgumentError, OutOfBoundsError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer

if TYPE_CHECKING:
    from pyggml.ggml_backend.backend import Backend

TESTING_BLAS_ALIGNMENT = 32
FAKE_BASE = 0xB1A5_0000_0000_0000  # not a canonical user-space address: never host memory
FAKE_RANGE = 1 << 40  # address space per buffer

_next_range = itertools.count()


class TestingBLASBuffer(Buffer):
    """`size` bytes of private memory; `store` holds them, `base` is where they appear to be."""

    __test__ = False  # not a pytest test class

    def __init__(self, backend: Backend, size: int) -> None:
        super().__init__(backend, size)
        if size >= FAKE_RANGE:
            raise ArgumentError(f"testing BLAS buffer of {size} bytes is larger than its address range")
        self.store: np.ndarray | None = np.zeros(max(size, 1), dtype=np.uint8)
        self.base = FAKE_BASE + next(_next_range) * FAKE_RANGE

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        self.store = None

    def _is_host(self) -> bool:
        return False

    def offset_of(self, tensor: Tensor, offset: int, size: int) -> int:
        """Where byte `offset` of `tensor` is in the store, after checking the range is inside the buffer."""
        self.check_alive()
        if tensor.data is None:
            raise ArgumentError(f"testing BLAS: tensor '{tensor.name}' has no memory")
        pos = tensor.data - self.base + offset
        if pos < 0 or pos + size > self.size:
            raise OutOfBoundsError(
                f"testing BLAS: bytes {offset}..{offset + size} of '{tensor.name}' are outside buffer "
                f"'{self.name}' ({self.size} bytes at {self.base:#x})"
            )
        return pos
