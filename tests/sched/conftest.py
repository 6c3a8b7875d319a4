"""Fixtures of the scheduler tests: CPU backends that count their buffers, the testing BLAS backend."""

from __future__ import annotations

import pytest

from pyggml.backends.cpu import CPUBackend
from pyggml.backends.testing_blas import TestingBLASBackend


class CountingCPU(CPUBackend):
    """A one-thread CPU backend that counts alloc_buffer calls and graph computes."""

    def __init__(self) -> None:
        super().__init__(1)
        self.n_alloc_buffer = 0
        self.n_graph_compute = 0

    def _alloc_buffer(self, size: int):  # noqa: ANN202
        self.n_alloc_buffer += 1
        return super()._alloc_buffer(size)

    def _graph_compute(self, graph) -> None:  # noqa: ANN001
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
