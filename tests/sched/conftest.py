"""Fixtures of the scheduler tests: CPU backends that count their buffers, the testing BLAS backend."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends.cpu import CPUBackend
from pyggml.backends.testing_blas import TestingBLASBackend
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_set


class CountingCPU(CPUBackend):
    """A one-thread CPU backend that counts alloc_buffer calls and graph computes."""

    def __init__(self) -> None:
        super().__init__(1)
        self.n_alloc_buffer = 0
        self.n_graph_compute = 0

    def _alloc_buffer(self, size: int):
        self.n_alloc_buffer += 1
        return super()._alloc_buffer(size)

    def _graph_compute(self, graph) -> None:
        self.n_graph_compute += 1
        super()._graph_compute(graph)


@pytest.fixture
def cpu_a() -> CountingCPU:
    return CountingCPU()


@pytest.fixture
def cpu_b() -> CountingCPU:
    return CountingCPU()


@pytest.fixture
def blas() -> TestingBLASBackend:
    return TestingBLASBackend()


@pytest.fixture
def small_weight(cpu_a):
    ctx = Context(mem_size=1 << 16, no_alloc=True)
    w = ctx.new_tensor_2d(GGMLType.F32, 4, 3).set_name("w")
    buffer = cpu_a.alloc_buffer(256)
    TensorAllocator.new_from_buffer(buffer).alloc(w)
    values = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    tensor_set(w, values)
    yield w, values
    buffer.free()
