"""`BackendSched`: ggml_backend_sched (ggml-backend.cpp at llama.cpp 0c1e570), the engine that computes graphs.

Beyond ggml: `keep_graphs` > 1 lets `reset()` put an allocated graph aside for `alloc_graph` to take up, and a
graph laid out like a recorded one takes its addresses (DESIGN.md, "The scheduler").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core import memory
from pyggml.core.checks import check_instance, check_positive
from pyggml.core.context import GGML_DEFAULT_GRAPH_SIZE, Context, tensor_overhead
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GraphError,
    LimitExceededError,
    OutOfMemoryError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, TensorFlag
from pyggml.ggml_backend.backend import Backend, op_desc
from pyggml.ggml_backend.buffer import Buffer, BufferUsage
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.event import Event
from pyggml.ggml_backend.tensor_alloc import view_init
from pyggml.ggml_backend.tensor_io import tensor_copy
from pyggml.sched.debug import debug_enabled
from pyggml.sched.passes import Assigner, assign_backends, split_graph
from pyggml.sched.stats import BackendStats, SchedStats

log = logging.getLogger("pyggml.sched")

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = 30
GGML_SCHED_MAX_COPIES = 4

# ggml_backend_sched_eval_callback(tensor, ask): ask=True: observe this node? ask=False: it is computed; False stops
EvalCallback = Callable[[Tensor, bool], bool]
AssignPasses = Callable[["BackendSched", Graph], Assigner]


@dataclass(eq=False)
class SchedSplit:
    """ggml_backend_sched_split: nodes i_start..i_end on `backend_id`, after its `inputs` are copied in."""

    sched: BackendSched
    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)
    graph: Graph | None = None
    plan: Any = None
    # per input, the (source, copy) host arrays numpy copies (None: the backends copy); made with the plan
    host_copies: list[tuple[np.ndarray, np.ndarray] | None] | None = None

    @property
    def backend(self) -> Backend:
        return self.sched.backends[self.backend_id]

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        inputs = ", ".join(t.name for t in self.inputs)
        return f"SchedSplit({self.backend.name()}#{self.backend_id}, nodes {self.i_start}..{self.i_end}, [{inputs}])"


@dataclass(eq=False)
class _KeptGraph:
    """A graph `reset()` put aside (keep_graphs > 1); its tensors keep their places."""

    graph: Graph
    backend_ids: dict[int, int]
    causes: dict[int, str]
    copies: dict[tuple[int, int, int], Tensor]
    splits: list[SchedSplit]
    graph_copy: Graph | None
    graph_copy_backends: list[int]
    first_allocs: list[tuple[Tensor, int]]
    ctx: Context | None
    rewired: list[tuple[Tensor, int, Tensor]]
    n_reserves: int  # the compute buffers' generation its places are in


def check_backends(backends: list[Backend], what: str, limit: int, limit_name: str) -> None:
    """A scheduler's backends: at least one, at most `limit`, Backends, alive, each instance once."""
    if not backends:
        raise ArgumentError(f"{what}: at least one backend is needed")
    for i, b in enumerate(backends):
        check_instance(b, Backend, f"{what}: backends[{i}]")
    if len(backends) > limit:
        raise LimitExceededError(f"{what}: {len(backends)} backends ({', '.join(b.name() for b in backends)}) "
                                 f"exceed {limit_name} = {limit}")
    for i, b in enumerate(backends):
        if b.freed:
            raise BufferFreedError(f"{what}: backend '{b.name()}' (backends[{i}]) was freed")
        for j in range(i):
            if backends[j] is b:
                raise ArgumentError(f"{what}: backend '{b.name()}' is given twice (positions {j} and {i}); "
                                    f"two backends of one kind must be two instances")


class BackendSched:
    """ggml_backend_sched: `backends` in priority order (the first is preferred, the last is the fallback)."""

    def __init__(self, backends: Sequence[Backend], bufts: Sequence[BufferType] | None = None,
                 graph_size: int = GGML_DEFAULT_GRAPH_SIZE, parallel: bool = False, op_offload: bool = True,
                 assign: AssignPasses = assign_backends) -> None:
        """ggml_backend_sched_new; `assign` gives each node its backend (default: ggml's five passes)."""
        if not callable(assign):
            raise ArgumentTypeError(f"BackendSched: assign must be a function (sched, graph) -> Assigner, got "
                                    f"{type(assign).__name__}")
        self.assign = assign
        if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
            raise ArgumentTypeError(f"BackendSched: backends must be a sequence of Backends, got "
                                    f"{type(backends).__name__}")
        backends = list(backends)
        check_backends(backends, "BackendSched", GGML_SCHED_MAX_BACKENDS, "GGML_SCHED_MAX_BACKENDS")
        if bufts is None:
            bufts = [b.get_default_buffer_type() for b in backends]
        bufts = list(bufts)
        if len(bufts) != len(backends):
            raise ArgumentError(f"BackendSched: {len(bufts)} buffer types for {len(backends)} backends")
        for i, (b, buft) in enumerate(zip(backends, bufts, strict=True)):
            check_instance(buft, BufferType, f"BackendSched: bufts[{i}]")
            if not b.supports_buft(buft):
                raise ArgumentError(f"BackendSched: backend '{b.name()}' (backends[{i}]) does not support buffer "
                                    f"type '{buft.name()}'")
        self.graph_size = check_positive(graph_size, "BackendSched: graph_size")
        self.backends: list[Backend] = backends
        self.bufts: list[BufferType] = bufts
        self.n_backends = len(backends)
        self.op_offload = bool(op_offload)
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.cur_copy = 0
        self.next_copy = 0
        self.events: list[list[Event | None]] = [
            [_event_new(b) if self.n_copies > 1 else None for _ in range(self.n_copies)] for b in backends]
        self.galloc = GraphAllocator()
        self.buffers: list[Buffer | None] = [None] * self.n_backends
        self.callback_eval: EvalCallback | None = None

        # the split graph's state, by id(tensor) (ggml's hash set; the tensors are alive while it is used)
        self.backend_ids: dict[int, int] = {}  # id(tensor) -> backend index (absent: not assigned)
        self.causes: dict[int, str] = {}  # id(tensor) -> why it got its backend (the debug printout)
        self.copies: dict[tuple[int, int, int], Tensor] = {}  # (id(tensor), backend, copy) -> the tensor's copy
        self.splits: list[SchedSplit] = []
        self.graph: Graph | None = None  # the graph copy the allocator sees: each split's input copies, its nodes
        self.graph_copy_backends: list[int] = []  # backend of each node of self.graph (prev_: the last allocated)
        self.prev_graph_copy_backends: list[int] = []
        self.first_allocs: list[tuple[Tensor, int]] = []  # placed before the graph: inputs and kept copies
        self.split_graph: Graph | None = None
        self.ctx: Context | None = None
        self._rewired: list[tuple[Tensor, int, Tensor]] = []  # (node, j, its own source j) replaced by a copy

        self.is_reset = False
        self.is_alloc = False
        self.last_tallocs: list[TensorAllocator] = []
        # recorded places by (number of places, backend of each node); False: every graph through the gallocr
        self.layout_reuse = True
        self.replayed = False
        self.layouts: dict[tuple[int, tuple[int, ...]], list[tuple[int, int, int] | int]] = {}
        self.n_reserves = 0  # buffers grown (by reserve or by a graph that no longer fit)
        # beyond ggml: graphs reset() puts aside (1: ggml's behaviour; not with n_copies > 1)
        self.keep_graphs = 1
        self._kept: list[_KeptGraph] = []  # oldest first, at most keep_graphs
        self.stats = SchedStats(backends=[BackendStats(b.name()) for b in backends])
        self.n_computes = 0
        self.freed = False
        self.reset()

    # --- state ---

    def _check_alive(self, what: str) -> None:
        if self.freed:
            raise BufferFreedError(f"{what}: the scheduler was freed")
        for i, b in enumerate(self.backends):
            if b.freed:
                raise BufferFreedError(f"{what}: backend '{b.name()}' (backend {i} of the scheduler's "
                                       f"{self.n_backends}) was freed; nothing was computed")
        for i, buffer in enumerate(self.buffers):
            if buffer is not None and buffer.freed:
                raise BufferFreedError(f"{what}: the compute buffer of backend '{self.backends[i].name()}' "
                                       f"(backend {i}) was freed; nothing was computed")

    def reset(self) -> None:
        """ggml_backend_sched_reset: forget the assignments and the allocation (before building another graph)."""
        if self.freed:
            return
        if not self.is_reset:
            if self.is_alloc and self.keep_graphs > 1 and self.n_copies == 1 and self.split_graph is not None:
                self._kept.append(self._put_aside())
                while len(self._kept) > self.keep_graphs:
                    self._release(self._kept.pop(0))
            else:
                self._unsplit()
            self.backend_ids = {}
            self.causes = {}
            self.copies = {}
            self.is_reset = True
        self._free_plans()
        self.is_alloc = False

    def _free_plans(self) -> None:
        for split in self.splits:
            if split.plan is not None:
                self.backends[split.backend_id].graph_plan_free(split.plan)
                split.plan = None
            split.host_copies = None

    def _unsplit(self) -> None:
        """Point the split graph's nodes at their own sources again (undo the rewiring to copies)."""
        for node, j, src in reversed(self._rewired):
            node.src[j] = src
        self._rewired = []
        self._free_plans()
        self.splits = []
        self.graph = None
        self.split_graph = None

    def _put_aside(self) -> _KeptGraph:
        """The allocated graph's state, taken out of the scheduler (which is left with no split graph)."""
        assert self.split_graph is not None
        kept = _KeptGraph(self.split_graph, self.backend_ids, self.causes, self.copies, self.splits, self.graph,
                          self.graph_copy_backends, self.first_allocs, self.ctx, self._rewired, self.n_reserves)
        self.splits, self.graph, self.split_graph, self.ctx, self._rewired = [], None, None, None, []
        self.first_allocs, self.graph_copy_backends = [], []
        return kept

    def _take_up(self, kept: _KeptGraph) -> None:
        self.backend_ids, self.causes, self.copies, self.splits = kept.backend_ids, kept.causes, kept.copies, \
            kept.splits
        self.graph, self.graph_copy_backends, self.first_allocs = kept.graph_copy, kept.graph_copy_backends, \
            kept.first_allocs
        self.ctx, self._rewired, self.split_graph = kept.ctx, kept.rewired, kept.graph
        self.prev_graph_copy_backends = kept.graph_copy_backends

    def _release(self, kept: _KeptGraph) -> None:
        """Let a kept graph go: sources restored, plans freed, its tensors in our buffers unplaced."""
        for node, j, src in reversed(kept.rewired):
            node.src[j] = src
        for split in kept.splits:
            if split.plan is not None and not self.backends[split.backend_id].freed:
                self.backends[split.backend_id].graph_plan_free(split.plan)
            split.plan = None
        own = {id(b) for b in self.buffers if b is not None}
        for t in [*(t for t, _ in kept.first_allocs), *kept.graph.nodes, *kept.graph.leafs]:
            if t.buffer is not None and (id(t.buffer) in own or t.buffer.freed):
                t.data = None
                t.buffer = None

    def forget_graph(self, graph: Graph | None = None) -> None:
        """Let go of `graph`'s kept state (None: of every kept graph), before the caller frees its context."""
        for kept in [k for k in self._kept if graph is None or k.graph is graph]:
            self._kept.remove(kept)
            self._release(kept)

    def _kept_graph(self, graph: Graph) -> _KeptGraph | None:
        """`graph`'s kept state if its buffers are the current ones and its pins match (else it is let go)."""
        kept = next((k for k in self._kept if k.graph is graph), None)
        if kept is None:
            return None
        self._kept.remove(kept)
        pins = self.backend_ids
        same_pins = kept.n_reserves == self.n_reserves and sum(c == "usr" for c in kept.causes.values()) == len(
            pins) and all(kept.backend_ids.get(t) == b and kept.causes.get(t) == "usr" for t, b in pins.items())
        if same_pins:
            return kept
        self._release(kept)
        return None

    def free(self) -> None:
        """ggml_backend_sched_free: the compute buffers, plans and events; freeing twice is harmless."""
        if self.freed:
            return
        self.reset()
        self._unsplit()
        self.forget_graph()
        for buffer in self.buffers:
            if buffer is not None:
                buffer.free()
        self.buffers = [None] * self.n_backends
        for row in self.events:
            for event in row:
                if event is not None:
                    event.free()
        self.galloc.free()
        self.freed = True

    def __enter__(self) -> BackendSched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # --- backends and tensors ---

    def backend_id(self, backend: Backend, what: str) -> int:
        """ggml_backend_sched_backend_id: the backend's priority (its index); ArgumentError if not ours."""
        check_instance(backend, Backend, f"{what}: backend")
        i = self._index(backend)
        if i >= 0:
            return i
        names = ", ".join(f"'{b.name()}'" for b in self.backends)
        raise ArgumentError(f"{what}: backend '{backend.name()}' is not one of the scheduler's backends ({names})")

    def get_n_backends(self) -> int:
        return self.n_backends

    def get_backend(self, i: int) -> Backend:
        if not 0 <= i < self.n_backends:
            raise ArgumentError(f"get_backend: index {i} is not in [0, {self.n_backends})")
        return self.backends[i]

    def get_n_splits(self) -> int:
        return len(self.splits)

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    @property
    def restored(self) -> bool:
        """Whether the last allocation took up a kept graph (its stats say so)."""
        return self.stats.restored

    @property
    def reused(self) -> bool:
        """Whether the last compute reused the allocated graph (its stats say so)."""
        return self.stats.reused

    def get_n_copies(self) -> int:
        return self.n_copies

    def get_buffer_type(self, backend: Backend) -> BufferType:
        return self.bufts[self.backend_id(backend, "get_buffer_type")]

    def get_buffer_size(self, backend: Backend) -> int:
        """ggml_backend_sched_get_buffer_size: the bytes of `backend`'s compute buffer (0 before reserve)."""
        buffer = self.buffers[self.backend_id(backend, "get_buffer_size")]
        return buffer.get_size() if buffer is not None else 0

    def set_tensor_backend(self, node: Tensor, backend: Backend) -> None:
        """ggml_backend_sched_set_tensor_backend: compute `node` on `backend` (until reset)."""
        check_instance(node, Tensor, "set_tensor_backend: node")
        index = self.backend_id(backend, f"set_tensor_backend('{node.name}')")
        self.backend_ids[id(node)] = index
        self.causes[id(node)] = "usr"
        self.is_reset = False

    def get_tensor_backend(self, node: Tensor) -> Backend | None:
        """ggml_backend_sched_get_tensor_backend: the backend assigned to `node` (None if none)."""
        check_instance(node, Tensor, "get_tensor_backend: node")
        index = self.backend_ids.get(id(node), -1)
        return self.backends[index] if index >= 0 else None

    tensor_backend = get_tensor_backend

    def _index(self, backend: Backend | None) -> int:
        return next((i for i, b in enumerate(self.backends) if b is backend), -1)

    def backend_prio(self, backend: Backend | None) -> float:
        """The backend's index in priority order; inf if it is not one of ours (the Graphviz colours)."""
        i = self._index(backend)
        return i if i >= 0 else float("inf")

    def input_copy(self, t: Tensor, backend_index: int) -> Tensor | None:
        """The copy of split input `t` in backend `backend_index` this graph computes with (None if none)."""
        return self.copies.get((id(t), backend_index, self.cur_copy))

    def tensor_cause(self, t: Tensor) -> str:
        return self.causes.get(id(t), "")

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """ggml_backend_sched_set_eval_callback: see `EvalCallback` (None: compute each split at once)."""
        if callback is not None and not callable(callback):
            raise ArgumentTypeError(f"set_eval_callback: {type(callback).__name__} is not callable")
        self.callback_eval = callback

    # --- reserve, alloc, compute ---

    def _check_graph(self, graph: Graph, what: str) -> None:
        check_instance(graph, Graph, f"{what}: graph")
        if graph.n_nodes + graph.n_leafs > 2 * self.graph_size:
            raise LimitExceededError(f"{what}: the graph has {graph.n_nodes} nodes and {graph.n_leafs} leafs, more "
                                     f"than the scheduler's graph_size {self.graph_size} allows")

    def _split(self, graph: Graph) -> None:
        """ggml_backend_sched_split_graph: assign, split, and build the allocation graph."""
        if self.split_graph is not None and self.split_graph is not graph or self._rewired:
            self._unsplit()  # another graph was split since the last reset: put its sources back
        self.is_reset = False
        self.ctx = Context(mem_size=(2 * (graph.n_nodes + 16) * self.n_copies + 64) * tensor_overhead(),
                           no_alloc=True)
        split_graph(self, graph, self.assign(self, graph))
        self.split_graph = graph
        if debug_enabled():
            from pyggml.sched.debug import format_assignments

            log.debug("%s", format_assignments(self, graph))

    def _tallocs(self, measure: bool) -> list[TensorAllocator]:
        out = []
        for b, buffer in zip(self.backends, self.buffers, strict=True):
            if measure or buffer is None:
                out.append(TensorAllocator.new_measure_from_backend(b))
            else:
                out.append(TensorAllocator.new_from_buffer(buffer))
        return out

    def _alloc(self, tallocs: list[TensorAllocator], order: list[Tensor] | None = None) -> None:
        """The graph copy into `tallocs`, first allocs first; the places are recorded for `_replay`."""
        assert self.graph is not None
        if order is None:
            order = self._alloc_order()
        views = {id(t) for t in order if t.view_src is not None}  # views by construction, not by the allocator
        placed: list[Tensor] = []
        try:
            for t, bid in self.first_allocs:
                if t.data is None and t.view_src is None:
                    tallocs[bid].alloc(t)
                    placed.append(t)
            talloc_of = {key: tallocs[bid] for key, bid in self.backend_ids.items() if bid >= 0}
            self.galloc.alloc_graph_n(self.graph, _ID_SET, talloc_of)
        except BaseException:
            for t in placed:
                t.data = None
                t.buffer = None
            raise
        self._record(order, tallocs, views)

    def _forget_memory(self, tallocs: Sequence[TensorAllocator]) -> None:
        """Take the memory of `tallocs` back from the graph copy's tensors (before they are allocated again)."""
        assert self.graph is not None
        own = {id(t.get_buffer()) for t in tallocs}
        for t in [*(t for t, _ in self.first_allocs), *self.graph.nodes]:
            if t.buffer is not None and id(t.buffer) in own:
                t.data = None
                t.buffer = None
            elif t.view_src is not None and t.buffer is None and t.data is not None:
                holder = t.view_src.buffer
                if holder is None or id(holder) in own:
                    t.data = None

    def _reserve_split(self) -> None:
        """ggml_gallocr_reserve_n: measure the split graph and grow each compute buffer that is too small."""
        assert self.graph is not None
        measures = self._tallocs(measure=True)
        try:
            self._alloc(measures)
            sizes = [m.get_max_size() for m in measures]
        finally:
            self._forget_memory(measures)
            for m in measures:
                m.free()
        grown = []
        for i, (b, size) in enumerate(zip(self.backends, sizes, strict=True)):
            old = self.buffers[i]
            if old is not None and old.get_size() >= size:
                continue
            new = self.bufts[i].alloc_buffer(size + b.get_alignment())
            new.set_usage(BufferUsage.COMPUTE)
            new.name = f"{b.name()}#{i} compute"
            if new.backend is None:
                new.backend = b
            if old is not None:
                old.free()
            self.buffers[i] = new
            grown.append(f"{b.name()}#{i} {old.get_size() if old is not None else 0} -> {new.get_size()} bytes")
        if grown:
            self.n_reserves += 1
            log.debug("sched: compute buffers reserved: %s", ", ".join(grown))

    def reserve(self, measure_graph: Graph) -> None:
        """ggml_backend_sched_reserve: grow the compute buffers for the worst-case `measure_graph`, then reset.
        As in ggml, nodes pinned since the last reset keep their backend."""
        self._check_alive("reserve")
        self._check_graph(measure_graph, "reserve")
        self.synchronize()
        if self.is_alloc:
            self.reset()
        try:
            self._split(measure_graph)
            self._reserve_split()
        finally:
            self.is_reset = False
            self.reset()

    def reserve_size(self, measure_graph: Graph) -> list[int]:
        """ggml_backend_sched_reserve_size: each backend's compute buffer bytes for `measure_graph`."""
        self._check_alive("reserve_size")
        self._check_graph(measure_graph, "reserve_size")
        self.reset()
        measures: list[TensorAllocator] = []
        try:
            self._split(measure_graph)
            measures = self._tallocs(measure=True)
            self._alloc(measures)
            return [m.get_max_size() for m in measures]
        finally:
            if self.graph is not None:
                self._forget_memory(measures)
            for m in measures:
                m.free()
            self.is_reset = False
            self.reset()

    def alloc_graph(self, graph: Graph) -> None:
        """ggml_backend_sched_alloc_graph: split and allocate `graph`, reserving again if it does not fit."""
        self._check_alive("alloc_graph")
        self._check_graph(graph, "alloc_graph")
        if self.is_alloc:
            raise GraphError("alloc_graph: a graph is allocated already; reset() first (or compute it again)")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        c0 = time.thread_time()
        t0 = time.perf_counter()
        kept = self._kept_graph(graph) if self._kept else None
        if kept is not None:
            self._take_up(kept)
            self.is_reset = False
            t1 = t0
        else:
            self._split(graph)
            t1 = time.perf_counter()
            self._alloc_splits()
        self.is_alloc = True
        self.n_computes = 0
        self._new_stats(graph, t1 - t0, time.perf_counter() - t1)
        self.stats.sched_cpu_time = time.thread_time() - c0
        self.stats.restored = kept is not None

    def _alloc_splits(self) -> None:
        """ggml_backend_sched_alloc_splits; reserve when a node moved to another buffer type or it does not fit.
        Beyond ggml, a graph laid out like a recorded one takes its addresses (`_replay`)."""
        order = self._alloc_order()
        missing = any(b is None for b in self.buffers)
        # a recorded layout that fits needs no reserve, even where ggml's would (it would find the same places)
        layout = self.layouts.get((len(order), tuple(self.graph_copy_backends))) \
            if self.layout_reuse and not missing else None
        self.replayed = layout is not None and self._replay(order, layout)
        if self.replayed:
            self.prev_graph_copy_backends = self.graph_copy_backends
            return
        changed = self.prev_graph_copy_backends != self.graph_copy_backends and any(
            a != b and self.bufts[a] is not self.bufts[b]
            for a, b in zip(self.graph_copy_backends, self.prev_graph_copy_backends, strict=False))
        if missing or changed:
            self._reserve_split()
        tallocs = self._tallocs(measure=False)
        try:
            self._alloc(tallocs, order)
        except OutOfMemoryError as e:
            log.debug("sched: the graph no longer fits the compute buffers (%s): reserving again", e)
            self.synchronize()
            self._reserve_split()
            tallocs = self._tallocs(measure=False)
            self._alloc(tallocs, order)
        self.last_tallocs = tallocs
        self.prev_graph_copy_backends = self.graph_copy_backends

    def _alloc_order(self) -> list[Tensor]:
        """Every tensor the allocation touches, in ggml's order: first allocs, then per node its sources, itself."""
        assert self.graph is not None
        order = [t for t, _ in self.first_allocs]
        for node in self.graph.nodes:
            order.extend(src for src in node.src if src is not None)
            order.append(node)
        return order

    def _record(self, order: list[Tensor], tallocs: list[TensorAllocator], views: set[int]) -> None:
        """ggml_gallocr's node_allocs: each place of `order` as (buffer, offset, bytes), _VIEW or _EXTERNAL; a
        tensor's later places name its first."""
        index = {id(t.get_buffer()): i for i, t in enumerate(tallocs)}
        bases = [t.base for t in tallocs]
        entries: list[tuple[int, int, int] | int] = []
        first: dict[int, int] = {}
        for k, t in enumerate(order):
            if id(t) in views:
                entries.append(_VIEW)
                continue
            i = index.get(id(t.buffer), -1) if t.buffer is not None else -1
            if i < 0 or t.data is None:
                entries.append(_EXTERNAL)
                continue
            seen = first.setdefault(id(t), k)
            entries.append(seen if seen != k else (i, t.data - bases[i], self.bufts[i].get_alloc_size(t)))
        key = (len(order), tuple(self.graph_copy_backends))
        old = self.layouts.get(key)
        if old is None or all(_fits(e, o) for e, o in zip(entries, old, strict=True)):
            self.layouts[key] = entries  # keep the larger of two layouts of one shape (the reserved worst case)

    def _replay(self, order: list[Tensor], layout: list[tuple[int, int, int] | int]) -> bool:
        """Give `order` the recorded addresses if every place fits the current buffers (else False, no change)."""
        # ggml_backend_buft_get_alloc_size: a type without the hook takes ggml_nbytes
        sizes = [None if type(b)._get_alloc_size is BufferType._get_alloc_size else b.get_alloc_size
                 for b in self.bufts]
        limits = [b.get_size() if b is not None else -1 for b in self.buffers]
        for t, e in zip(order, layout, strict=True):
            if e.__class__ is int:
                if e >= 0:
                    if order[e] is not t:
                        return False
                elif e == _VIEW:
                    if t.view_src is None:
                        return False
                elif t.data is None and t.view_src is None:
                    return False
                continue
            if t.data is not None or t.view_src is not None:
                return False
            size_of = sizes[e[0]]
            size = t.nbytes() if size_of is None else size_of(t)
            if size > e[2] or e[1] + size > limits[e[0]]:
                return False
        buffers = self.buffers
        for t, e in zip(order, layout, strict=True):
            if e.__class__ is int:
                if e < 0 and t.data is None:  # a view (of the scheduler's memory or another's)
                    view_init(t)
                continue
            buffer = buffers[e[0]]
            assert buffer is not None
            t.data = buffer.base + e[1]
            t.buffer = buffer
            if buffer.has_init_tensor:
                buffer.init_tensor(t)
        return True

    def graph_compute(self, graph: Graph) -> None:
        """ggml_backend_sched_graph_compute: `graph_compute_async`, then wait for every backend."""
        self.graph_compute_async(graph)
        self.synchronize()

    def graph_compute_async(self, graph: Graph) -> None:
        """ggml_backend_sched_graph_compute_async: allocate `graph` if needed, then compute its splits."""
        t0 = time.perf_counter()
        self._check_alive("graph_compute")
        check_instance(graph, Graph, "graph_compute: graph")
        if self.is_alloc and self.split_graph is not graph:
            raise GraphError("graph_compute: another graph is allocated; reset() before computing a new graph")
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc:
            self.alloc_graph(graph)
        elif self.n_computes > 0:
            self.stats = SchedStats(n_nodes=graph.n_nodes, n_splits=len(self.splits), reused=True,
                                    backends=[BackendStats(b.name()) for b in self.backends])
        self.n_computes += 1
        self._compute_splits()
        self.stats.total_time = time.perf_counter() - t0
        if debug_enabled():
            log.debug("%s", self.stats.format())

    def synchronize(self) -> None:
        """ggml_backend_sched_synchronize; with no allocated graph, the next one uses copy 0 (as ggml)."""
        for b in self.backends:
            if not b.freed:
                b.synchronize()
        if not self.is_alloc:
            self.next_copy = 0

    def _new_stats(self, graph: Graph, split_time: float, alloc_time: float) -> None:
        self.stats = SchedStats(n_nodes=graph.n_nodes, n_splits=len(self.splits), split_time=split_time,
                                alloc_time=alloc_time, backends=[BackendStats(b.name()) for b in self.backends])

    def _sync_split(self, backend_id: int) -> None:
        """Wait until backend `backend_id` is done with the current copy (its event), or with everything."""
        event = self.events[backend_id][self.cur_copy]
        if event is not None:
            # an event never recorded (the first use of a copy) has nothing to wait for, as in CUDA
            if event.recorded:
                event.synchronize()
        else:
            self.backends[backend_id].synchronize()

    def _compute_splits(self) -> None:
        """ggml_backend_sched_compute_splits."""
        stats = self.stats.backends
        prev_backend_id = -1
        callback = self.callback_eval
        for split in self.splits:
            bid = split.backend_id
            backend = self.backends[bid]
            bstats = stats[bid]
            bstats.n_splits += 1
            t0 = time.perf_counter()
            # the allocator may have reused the previous split's memory: let its async work finish first
            if not split.inputs and prev_backend_id >= 0 and prev_backend_id != bid:
                self._sync_split(prev_backend_id)
            if split.host_copies is None:
                split.host_copies = [_host_pair(inp, self.copies[(id(inp), bid, self.cur_copy)])
                                     for inp in split.inputs]
            for inp, host in zip(split.inputs, split.host_copies, strict=True):
                if host is not None and callback is None and self.n_copies == 1:
                    np.copyto(host[1], host[0])  # host to host, both synchronous: what tensor_copy does, sooner
                    bstats.n_copies += 1
                    bstats.bytes_copied += host[1].nbytes
                    continue
                cpy = self.copies[(id(inp), bid, self.cur_copy)]
                # io_ordered backends (an RPC server's) queue copies behind their work: a wait is a needless round trip
                ordered = backend.io_ordered()
                if inp.flags & TensorFlag.INPUT:
                    if not ordered:
                        self._sync_split(bid)  # the user may overwrite the input as soon as we return
                else:
                    # wait for the split backend to finish using the copy before overwriting it
                    event = self.events[bid][self.cur_copy]
                    if event is not None:
                        if event.recorded:
                            event.wait(backend)
                    elif not ordered:
                        backend.synchronize()
                    # no async copy: the source must be computed and the split backend done (ggml's fallback)
                    src_backend = self.get_tensor_backend(inp)
                    if src_backend is not None and not src_backend.io_ordered():
                        src_backend.synchronize()
                    if event is not None:
                        self._sync_split(bid)
                tensor_copy(inp, cpy)
                bstats.n_copies += 1
                bstats.bytes_copied += cpy.nbytes()
            t1 = time.perf_counter()
            bstats.copy_time += t1 - t0
            assert split.graph is not None
            if callback is None:
                if split.plan is None:
                    split.plan = backend.graph_plan_create(split.graph)
                backend.graph_plan_compute(split.plan)
            elif not self._compute_observed(split, backend, callback):
                bstats.compute_time += time.perf_counter() - t1
                return
            event = self.events[bid][self.cur_copy]
            if event is not None:
                event.record(backend)
            bstats.compute_time += time.perf_counter() - t1
            prev_backend_id = bid

    @staticmethod
    def _compute_observed(split: SchedSplit, backend: Backend, callback: EvalCallback) -> bool:
        """A split computed in runs ending at each node the callback asks for; False if the callback stops."""
        graph = split.graph
        assert graph is not None
        nodes = graph.nodes
        j0 = 0
        while j0 < len(nodes):
            need = bool(callback(nodes[j0], True))
            j1 = j0
            while not need and j1 < len(nodes) - 1:
                j1 += 1
                need = bool(callback(nodes[j1], True))
            backend.graph_compute(graph.view(j0, j1 + 1))
            backend.synchronize()
            if need and not callback(nodes[j1], False):
                return False
            j0 = j1 + 1
        return True

    # --- observability ---

    def format_assignments(self, graph: Graph) -> str:
        """The GGML_SCHED_DEBUG printout of the last split (splits, each node's backend and cause)."""
        from pyggml.sched.debug import format_assignments

        return format_assignments(self, graph)

    def dump_dot(self, graph: Graph, filename: str | None = None) -> str:
        """Graphviz source of the last split graph, coloured by backend, splits as clusters."""
        from pyggml.sched.graphviz import sched_to_dot

        text = sched_to_dot(self, graph)
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def describe_node(self, node: Tensor) -> str:
        """A node as the errors name it: name, op, type and shape."""
        return f"'{node.name}' ({op_desc(node)}, {node.type.name}{list(node.ne)})"


_VIEW, _EXTERNAL = -1, -2  # a layout's places that take no memory of the scheduler's


def _fits(new: tuple[int, int, int] | int, old: tuple[int, int, int] | int) -> bool:
    """Whether layout place `new` covers `old` (the same kind; as many bytes or more)."""
    if isinstance(new, int) or isinstance(old, int):
        return new == old
    return new[0] == old[0] and new[2] >= old[2]


class _IdSet:
    """The hash set the graph allocator is given: a tensor's slot is its id (see BackendSched.backend_ids)."""

    size = 1 << 62

    @staticmethod
    def find(t: Tensor) -> int:
        return id(t)

    @staticmethod
    def find_or_insert(t: Tensor) -> int:
        return id(t)


_ID_SET = _IdSet()


def _host_pair(src: Tensor, dst: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """The host arrays of `src` and its copy `dst` when both are on synchronous host backends, else None."""
    arrays = []
    for t in (src, dst):
        buffer = t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None else None)
        if buffer is None or t.data is None or not buffer.is_host():
            return None
        device = buffer.backend.get_device() if buffer.backend is not None else None
        if device is None or device.caps().async_:
            return None
        found = memory.find(t.data, t.nbytes())
        if found is None:
            return None
        array, offset = found
        arrays.append(array[offset:offset + t.nbytes()])
    return arrays[0], arrays[1]


def _event_new(backend: Backend) -> Event | None:
    device = backend.get_device()
    return device.event_new() if device is not None else None


__all__ = ["GGML_SCHED_MAX_BACKENDS", "GGML_SCHED_MAX_COPIES", "GGML_SCHED_MAX_SPLIT_INPUTS", "BackendSched",
           "EvalCallback", "SchedSplit"]
