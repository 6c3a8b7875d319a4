"""Running a model's graphs: one path, `BackendSched`, for one backend or many (as llama.cpp runs every model
through ggml_backend_sched).

`Runner` reserves the scheduler once with the worst-case graphs (a full batch at the end of the context),
which size each backend's compute buffer and lay out every smaller graph of their shapes. Each batch then
either reuses the graph computed last, when the
model says its shapes are the same (`run_again`: only the inputs are written, as llama.cpp's `can_reuse`),
or `run`s another graph (reset, alloc_graph, inputs, compute): the full path for a new graph, or, with
`keep_graphs` > 1, the scheduler takes up a graph it kept aside (a decode step's after a prompt).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from pyggml.alloc.report import MemoryReport, memory_report
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.checks import check_host_alloc
from pyggml.core.errors import UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_set
from pyggml.sched.backend_sched import BackendSched, EvalCallback

log = logging.getLogger("pyggml.models")

Inputs = list[tuple[Tensor, np.ndarray]]
Pins = Sequence[tuple[Tensor, Backend]]  # nodes to compute on a backend (where it supports them)


def is_host_backend(backend: Backend) -> bool:
    """Whether `backend`'s buffers are host memory (its default buffer type's `is_host`)."""
    return backend.get_default_buffer_type().is_host()


def alloc_checked(backend: Backend, size: int, what: str) -> Buffer:
    """`backend.alloc_buffer(size)`, refused first with OutOfMemoryError naming `what`, the bytes requested
    and the bytes available when the backend's memory is the host's and `size` exceeds what is left."""
    if is_host_backend(backend):
        check_host_alloc(size, what)
    return backend.alloc_buffer(size)


def alloc_zeroed(backend: Backend, tensors: Sequence[Tensor], what: str) -> tuple[Buffer, int]:
    """One buffer of `backend` holding `tensors` (each at the backend's alignment), zeroed as llama.cpp clears its
    caches' (a KV cache's padded cells are read through the mask: NaN there would spread); (buffer, size)."""
    align = backend.get_alignment()
    size = sum((t.nbytes() + align - 1) // align * align for t in tensors)
    buffer = alloc_checked(backend, size, what)
    try:
        buffer.clear(0)
    except UnsupportedOpError:
        pass  # a buffer that cannot clear itself is host memory, which starts zeroed
    talloc = TensorAllocator.new_from_buffer(buffer)
    for t in tensors:
        talloc.alloc(t)
    return buffer, size


class Runner:
    """A model's graphs computed by one BackendSched over `backends` (priority order, the fallback last)."""

    def __init__(self, backends: Sequence[Backend], measure_graphs: Sequence[tuple[Graph, Pins]],
                 graph_size: int, keep_graphs: int = 1) -> None:
        unique = list({id(b): b for b in backends}.values())
        self.backends = unique
        self.sched = BackendSched(unique, graph_size=graph_size)
        self.sched.keep_graphs = keep_graphs
        try:
            # the worst cases, pinned as the batches will be: the buffers fit the largest, each shape is laid out
            for graph, pins in measure_graphs:
                self.sched.reset()
                self._pin(pins)
                self.sched.reserve(graph)
        except BaseException:
            self.sched.free()
            raise
        self.graph: Graph | None = None  # the graph allocated last (what run_again computes)
        # the memory report of the largest graph allocated, per backend, when asked (pyggml run --verbose)
        self.report_memory = False
        self.memory_reports: list[MemoryReport] = []

    def run(self, graph: Graph, inputs: Inputs, pins: Pins = ()) -> None:
        """The full path: a new graph is split, allocated (reserved again if it does not fit) and computed.
        `pins`: nodes to compute on a given backend, where it supports them (ggml_backend_sched_set_tensor_backend)."""
        sched = self.sched
        sched.reset()  # (the graph allocated last is kept aside with keep_graphs > 1)
        self.graph = None
        self._pin(pins)
        sched.layout_reuse = not self.report_memory  # the report reads the graph allocator's work
        sched.alloc_graph(graph)
        self.graph = graph
        if self.report_memory and not sched.restored:
            reports = [memory_report(graph, t) for t in sched.last_tallocs]
            if sum(r.peak for r in reports) >= sum(r.peak for r in self.memory_reports):
                self.memory_reports = reports  # the largest graph's (a prompt's, not the last token's)
        self.run_again(inputs)

    def _pin(self, pins: Pins) -> None:
        for node, backend in pins:
            if backend.supports_op(node):
                self.sched.set_tensor_backend(node, backend)

    def run_again(self, inputs: Inputs) -> None:
        """The graph of the last `run` again, with new input values (the same shapes)."""
        assert self.graph is not None, "run_again before run"
        for t, values in inputs:
            tensor_set(t, values)
        self.sched.graph_compute(self.graph)

    def forget(self, graph: Graph | None = None) -> None:
        """Drop `graph` (None: every graph) before its context is freed; the next batch with it would go the
        full path."""
        if graph is None or graph is self.graph:
            self.sched.reset()
            self.graph = None
        self.sched.forget_graph(graph)

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        self.sched.set_eval_callback(callback)

    def buffer_sizes(self) -> dict[int, int]:
        return {id(b): self.sched.get_buffer_size(b) for b in self.backends}

    def free(self) -> None:
        self.graph = None
        self.sched.free()


__all__ = ["Inputs", "Runner", "alloc_checked", "is_host_backend"]
