"""Running a model's graph: memory for intermediates and inputs, then compute.

Behind one method (`run(graph, inputs)`):

- `SchedRunner`: several backends joined by `pyggml.sched.Scheduler`, as
  llama.cpp does: a worst-case graph is measured once (`init_measure`) to
  size each backend's compute buffer; each batch allocates its inputs in
  the input backend's allocator and `graph_compute` splits, allocates,
  copies and computes.
- `SingleRunner`: one backend, no scheduler: the graph's tensors placed in
  one compute buffer that is reused, by `GraphAllocator` when it is there,
  else one after another with a `TensorAllocator`.
- `SplitRunner`: several host backends without the scheduler (a stand-in
  while `pyggml.sched` is missing): runs of nodes on the backend of their
  weights.

`PlannedGraph` is a graph allocated and planned once and computed many times
(the one-token decoding graphs), its KV writes computed apart because their
destination moves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pyggml.alloc.report import MemoryReport, memory_report
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer, BufferUsage
from pyggml.backend.tensor_alloc import view_init
from pyggml.backend.tensor_io import tensor_set
from pyggml.core.checks import check_host_alloc
from pyggml.core.errors import UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor

log = logging.getLogger("pyggml.models")

Inputs = list[tuple[Tensor, np.ndarray]]
NodeBackends = Sequence[tuple[Sequence[Tensor], Backend]]  # groups of nodes and the backend that computes them
# a measure graph and its inputs, for SchedRunner also its node_backends
MeasureGraph = tuple[Graph, list[Tensor]] | tuple[Graph, list[Tensor], NodeBackends]


def _graph_tensors(graph: Graph) -> list[Tensor]:
    return [*graph.leafs, *graph.nodes]


def allocate_graph(backend: Backend, graph: Graph, buffer: Buffer | None = None) -> Buffer:
    """Place every tensor of `graph` that has no memory (inputs, results) in `buffer`, or in a new
    compute buffer of `backend` just large enough (the buffer type's alloc sizes); views get their
    source's memory."""
    todo = [t for t in _graph_tensors(graph) if t.data is None and t.view_src is None]
    buft = backend.get_default_buffer_type()
    align = buft.get_alignment()
    size = sum((buft.get_alloc_size(t) + align - 1) // align * align for t in todo) + align
    if buffer is None or buffer.get_size() < size:
        buffer = alloc_compute_buffer(backend, size)
    talloc = TensorAllocator.new_from_buffer(buffer)
    for t in todo:
        talloc.alloc(t)
    for t in _graph_tensors(graph):
        if t.data is None and t.view_src is not None:
            view_init(t)
    return buffer


def alloc_compute_buffer(backend: Backend, size: int, what: str | None = None) -> Buffer:
    """A buffer of `size` bytes of `backend` for intermediates: marked COMPUTE, named "<backend> compute";
    checked against the host memory left first when it is host memory (`alloc_checked`)."""
    buffer = alloc_checked(backend, size, what or f"compute buffer on '{backend.name()}'")
    buffer.name = f"{backend.name()} compute"
    buffer.set_usage(BufferUsage.COMPUTE)
    return buffer


class PlannedGraph:
    """A graph allocated once in its own buffer and planned once, then computed many times.

    Nodes in `recompute` (the KV writes, whose destination moves from one
    token to the next) are left out of the plans and computed on their own
    each time, so they see where their memory is now; the plans cover the
    runs of nodes between them. Where the backend's plans follow moved tensors
    themselves (`plans_follow_moves`, the CPU's), the whole graph is one plan.
    Decoding a token then costs the kernels and one call per run, not a graph
    build, an allocation and a plan.
    """

    def __init__(self, backend: Backend, graph: Graph, recompute: list[Tensor], owner: object = None) -> None:
        self.backend = backend
        self.graph = graph
        self.owner = owner  # what must live as long as the graph (its context)
        self.buffer = allocate_graph(backend, graph)
        index = {id(n): i for i, n in enumerate(graph.nodes)}
        # plans that follow tensors whose memory moved (the CPU's: ggml's kernels read `data` when they run):
        # one plan for the whole graph. Other plans may hold on to where a tensor was: cut around the nodes.
        cuts = [] if backend.plans_follow_moves() else sorted(index[id(t)] for t in recompute)
        self.steps: list[tuple[bool, Any]] = []  # (is a plan, the plan or the one-node graph)
        start = 0
        try:
            for i in [*cuts, graph.n_nodes]:
                if i > start:
                    self.steps.append((True, backend.graph_plan_create(graph.view(start, i))))
                if i < graph.n_nodes:
                    self.steps.append((False, graph.view(i, i + 1)))
                start = i + 1
        except BaseException:
            self.free()
            raise

    def compute(self) -> None:
        backend = self.backend
        for is_plan, step in self.steps:
            if is_plan:
                backend.graph_plan_compute(step)
            else:
                backend.graph_compute(step)

    def free(self) -> None:
        for is_plan, step in self.steps:
            if is_plan:
                self.backend.graph_plan_free(step)
        self.steps = []
        self.buffer.free()
        free = getattr(self.owner, "free", None)
        if free is not None:
            free()


def _graph_allocator_class() -> type | None:
    """pyggml.alloc's GraphAllocator, or None where it is not available."""
    try:
        from pyggml.alloc.graph_allocator import GraphAllocator
    except ImportError:
        return None
    return GraphAllocator


class SingleRunner:
    """Compute on one backend, intermediates in a reused compute buffer.

    With `GraphAllocator` (and a measure graph to size the buffer, as
    llama.cpp measures its worst-case graph), intermediates share memory once
    their consumers have run; without it every tensor of a graph gets its own
    bytes in the buffer, which grows to the largest graph seen.
    """

    def __init__(self, backend: Backend,
                 build_measure_graph: Callable[[], tuple[Graph, list[Tensor]]] | None = None) -> None:
        self.backend = backend
        # the memory report of the last graph allocated, per backend, when asked (pyggml run --verbose)
        self.report_memory = False
        self.memory_reports: list[MemoryReport] = []
        self.buffer: Buffer | None = None
        self.talloc: TensorAllocator | None = None
        self.galloc: Any = None
        galloc_class = _graph_allocator_class()
        if galloc_class is not None and build_measure_graph is not None:
            graph, inputs = build_measure_graph()
            measure = TensorAllocator.new_measure_from_backend(backend)
            try:
                # inputs first, as `run` places them (see there)
                for t in inputs:
                    measure.alloc(t)
                galloc_class().alloc_graph(measure, graph)
                size = measure.get_max_size() + backend.get_alignment()
            finally:
                measure.free()
            self.buffer = alloc_compute_buffer(backend, size)
            self.talloc = TensorAllocator.new_from_buffer(self.buffer)
            self.galloc = galloc_class()
            log.debug("compute buffer of %d bytes (measured)", size)

    def run(self, graph: Graph, inputs: Inputs) -> None:
        if self.galloc is not None and self.talloc is not None:
            self.talloc.reset()
            # The inputs are written before the graph runs, so they get memory of their own first, as
            # llama.cpp allocates its inputs before ggml_allocr_alloc_graph: the graph allocator would
            # otherwise hand a consumed input's bytes to an input that is read later.
            for t, _ in inputs:
                if t.data is None:
                    self.talloc.alloc(t)
            self.galloc.alloc_graph(self.talloc, graph)
            if self.report_memory:
                self.memory_reports = [memory_report(graph, self.talloc)]
        else:
            buffer = allocate_graph(self.backend, graph, self.buffer)
            if buffer is not self.buffer:
                if self.buffer is not None:
                    self.buffer.free()
                self.buffer = buffer
        for t, values in inputs:
            tensor_set(t, values)
        self.backend.graph_compute(graph)

    def buffer_sizes(self) -> dict[int, int]:
        return {id(self.backend): self.buffer.get_size() if self.buffer is not None else 0}

    def free(self) -> None:
        if self.galloc is not None:
            self.galloc.free()
            self.galloc = None
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None


def scheduler_class() -> type | None:
    """pyggml.sched's Scheduler, or None where it is not available."""
    try:
        from pyggml.sched import Scheduler
    except ImportError:
        return None
    return Scheduler


def is_host_backend(backend: Backend) -> bool:
    """Whether `backend`'s buffers are host memory (its default buffer type's `is_host`: what SplitRunner
    needs)."""
    return backend.get_default_buffer_type().is_host()


def alloc_checked(backend: Backend, size: int, what: str) -> Buffer:
    """`backend.alloc_buffer(size)`, refused first with OutOfMemoryError naming `what`, the bytes requested
    and the bytes available when the backend's memory is the host's and `size` exceeds what is left."""
    if is_host_backend(backend):
        check_host_alloc(size, what)
    return backend.alloc_buffer(size)


class SplitRunner:
    """A stand-in for the scheduler where `pyggml.sched` is not there, for host backends only.

    Each node is computed on the backend of the weight or cache it uses (the
    scheduler's first pass), else on the backend of its first source (a
    leaf input: on `input_backend`); runs of consecutive nodes of one
    backend are computed there, intermediates in that backend's compute
    buffer. With host memory on every side a run reads its sources where they
    are, so no copies are needed; other backends need the scheduler.
    """

    def __init__(self, backends: list[Backend], input_backend: Backend) -> None:
        for b in backends:
            if not is_host_backend(b):
                raise UnsupportedOpError(f"backend '{b.name()}' is not host memory: splitting a model over it needs "
                                         f"pyggml.sched.Scheduler")
        self.backends = backends
        self.input_backend = input_backend
        self.buffers: dict[int, Buffer] = {}

    def _assign(self, graph: Graph) -> dict[int, Backend]:
        where: dict[int, Backend] = {}
        for leaf in graph.leafs:
            buffer = leaf.buffer if leaf.buffer is not None or leaf.view_src is None else leaf.view_src.buffer
            where[id(leaf)] = buffer.backend if buffer is not None and buffer.backend else self.input_backend
        for node in graph.nodes:
            backend = None
            src_buffer = node.view_src.buffer if node.view_src is not None else None
            if src_buffer is not None and src_buffer.backend is not None:
                backend = src_buffer.backend  # a view of the KV cache
            for s in node.src:
                if backend is None and s is not None and s.op == GGMLOp.NONE and s.buffer is not None \
                        and s.buffer.backend is not None:
                    backend = s.buffer.backend  # a weight
            for s in node.src:
                if backend is None and s is not None and id(s) in where:
                    backend = where[id(s)]
            where[id(node)] = backend or self.input_backend
        return where

    def run(self, graph: Graph, inputs: Inputs) -> None:
        where = self._assign(graph)
        groups: dict[int, tuple[Backend, Graph]] = {}
        for t in _graph_tensors(graph):
            if t.data is None and t.view_src is None:
                b = where[id(t)]
                groups.setdefault(id(b), (b, Graph(graph.size)))[1].nodes.append(t)
        for key, (backend, part) in groups.items():
            buffer = allocate_graph(backend, part, self.buffers.get(key))
            if buffer is not self.buffers.get(key):
                old = self.buffers.get(key)
                if old is not None:
                    old.free()
                self.buffers[key] = buffer
        for t in _graph_tensors(graph):
            if t.data is None and t.view_src is not None:
                view_init(t)
        for t, values in inputs:
            tensor_set(t, values)
        start = 0
        nodes = graph.nodes
        for i in range(1, len(nodes) + 1):
            if i == len(nodes) or where[id(nodes[i])] is not where[id(nodes[start])]:
                where[id(nodes[start])].graph_compute(graph.view(start, i))
                start = i

    def buffer_sizes(self) -> dict[int, int]:
        return {key: buffer.get_size() for key, buffer in self.buffers.items()}

    def free(self) -> None:
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers = {}


class SchedRunner:
    """Compute over several backends with the scheduler; inputs live on `input_backend`.

    `node_backends` (given with each graph, and by `build_measure_graph` as a
    third element for the measure graph) lists groups of nodes and the backend
    that computes them, as llama.cpp puts each layer's nodes on the layer's
    backend with ggml_backend_sched_set_node_backend: left to the scheduler's
    passes, nodes without a weight among their sources (RoPE reads the
    positions, the softmax the mask) would follow the inputs to the first
    backend and bounce back, a split each time. The scheduler reserves a graph
    that does not fit the measured buffers (`auto_reserve`) instead of failing:
    a smaller graph than the measure graph can need more memory.
    """

    def __init__(self, backends: list[Backend], input_backend: Backend,
                 build_measure_graph: Callable[[], MeasureGraph],
                 auto_reserve: bool = True) -> None:
        Scheduler = scheduler_class()
        assert Scheduler is not None, "SchedRunner needs pyggml.sched.Scheduler"
        self.backends = backends
        # the memory report of the last graph allocated, per backend, when asked (pyggml run --verbose)
        self.report_memory = False
        self.memory_reports: list[MemoryReport] = []
        self.input_backend = input_backend
        self.sched = Scheduler(backends, auto_reserve=auto_reserve)
        graph, inputs, *rest = build_measure_graph()
        talloc = self.sched.get_tallocr(input_backend)
        for t in inputs:
            talloc.alloc(t)
        self._set_node_backends(rest[0] if rest else ())
        self.sched.init_measure(graph)

    def _set_node_backends(self, node_backends: NodeBackends) -> None:
        for nodes, backend in node_backends:
            for node in nodes:
                self.sched.set_node_backend(node, backend)

    def run(self, graph: Graph, inputs: Inputs, node_backends: NodeBackends = ()) -> None:
        talloc = self.sched.get_tallocr(self.input_backend)
        for t, _ in inputs:
            talloc.alloc(t)
        for t, values in inputs:
            tensor_set(t, values)
        self._set_node_backends(node_backends)
        self.sched.graph_compute(graph)
        if self.report_memory:
            self.memory_reports = [memory_report(graph, self.sched.get_tallocr(b)) for b in self.backends]

    def buffer_sizes(self) -> dict[int, int]:
        return {id(b): self.sched.get_buffer(b).get_size() for b in self.backends}

    def free(self) -> None:
        self.sched.free()
