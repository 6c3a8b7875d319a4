"""Running a model's graph: memory for intermediates and inputs, then compute.

Two ways, behind one method (`run(graph, inputs)`):

- `SchedRunner`: several backends joined by `pyggml.sched.Scheduler`, as
  llama.cpp does: a worst-case graph is measured once (`init_measure`) to
  size each backend's compute buffer; each batch allocates its inputs in
  the input backend's allocator and `graph_compute` splits, allocates,
  copies and computes.
- `SingleRunner`: one backend, no scheduler: the graph's tensors placed in
  one compute buffer that is reused (grown when a graph needs more) by
  `GraphAllocator` when it is there, else one after another with a
  `TensorAllocator`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer
from pyggml.backend.tensor_io import tensor_set
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor

log = logging.getLogger("pyggml.models")

Inputs = list[tuple[Tensor, np.ndarray]]


def _graph_tensors(graph: Graph) -> list[Tensor]:
    return [*graph.leafs, *graph.nodes]


def _init_view(t: Tensor) -> None:
    """A view gets the memory of its source (ggml-alloc's init_view)."""
    src = t.view_src
    assert src is not None and src.data is not None, f"view '{t.name}' of an unallocated tensor"
    t.data = src.data + t.view_offs
    t.buffer = src.buffer
    if t.buffer is not None:
        t.buffer.init_tensor(t)


class SingleRunner:
    """Compute on one backend, intermediates in a reused compute buffer."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.buffer: Buffer | None = None
        self.max_size = 0

    def _needed(self, tensors: list[Tensor]) -> int:
        align = self.backend.get_alignment()
        return sum((t.nbytes() + align - 1) // align * align for t in tensors) + align

    def run(self, graph: Graph, inputs: Inputs) -> None:
        todo = [t for t in _graph_tensors(graph) if t.data is None and t.view_src is None]
        size = self._needed(todo)
        if self.buffer is None or self.buffer.get_size() < size:
            if self.buffer is not None:
                self.buffer.free()
            self.buffer = self.backend.alloc_buffer(size)
            self.buffer.name = f"{self.backend.name()} compute"
            self.max_size = size
        talloc = TensorAllocator.new_from_buffer(self.buffer)
        for t in todo:
            talloc.alloc(t)
        for t in _graph_tensors(graph):
            if t.data is None and t.view_src is not None:
                _init_view(t)
        for t, values in inputs:
            tensor_set(t, values)
        self.backend.graph_compute(graph)

    def buffer_sizes(self) -> dict[int, int]:
        return {id(self.backend): self.buffer.get_size() if self.buffer is not None else 0}

    def free(self) -> None:
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None


class SchedRunner:
    """Compute over several backends with the scheduler; inputs live on `input_backend`."""

    def __init__(self, backends: list[Backend], input_backend: Backend,
                 build_measure_graph: Callable[[], tuple[Graph, list[Tensor]]]) -> None:
        from pyggml.sched import Scheduler

        self.backends = backends
        self.input_backend = input_backend
        self.sched = Scheduler(backends)
        graph, inputs = build_measure_graph()
        talloc = self.sched.get_tallocr(input_backend)
        for t in inputs:
            talloc.alloc(t)
        self.sched.init_measure(graph)

    def run(self, graph: Graph, inputs: Inputs) -> None:
        talloc = self.sched.get_tallocr(self.input_backend)
        for t, _ in inputs:
            talloc.alloc(t)
        for t, values in inputs:
            tensor_set(t, values)
        self.sched.graph_compute(graph)

    def buffer_sizes(self) -> dict[int, int]:
        return {id(b): self.sched.get_buffer(b).get_size() for b in self.backends}

    def free(self) -> None:
        self.sched.free()
