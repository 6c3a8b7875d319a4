"""`Scheduler`: the seed's `ggml_backend_sched`, one graph computed over several backends.

Backends are given in priority order (the first is preferred). Until
`init_measure(graph)` every backend has a measure allocator; `init_measure`
splits and allocates the measure graph to learn each backend's compute
buffer size, then gives every backend a real buffer of that size. Each
`graph_compute(graph)` then:

1. assigns every node to a backend (`_split_graph`, the seed's four passes):
   (1) leafs and nodes whose memory is already in a backend's buffer go to
   that backend ("1.dst"), else the backend of their view source
   ("1.vsrc"), else of their sources with memory (lowest priority number,
   then size: "1.srcN"); (2) nodes still unassigned take a source's
   assignment ("2.srcN"); (3) sources still unassigned (leafs without
   memory) take their consumer's;
2. cuts the node list wherever the backend changes (view ops do not count),
   lists per split the sources that live on another backend (its inputs),
   makes one copy per (tensor, backend) named "<backend>#<name>" with the
   source's layout and points the consumers at it;
3. allocates every backend's part with the graph allocator's
   `alloc_graph_n`, the copies of a split's inputs placed at the split's start;
4. per split copies the inputs in and runs the split's nodes on its backend;
5. resets the allocators (the memory is reused by the next graph).

Where pyggml differs from the C seed (it follows the seed's comments where its code contradicts them):

- Assignments made with `set_node_backend` hold until `reset()` (which every
  `graph_compute` and `init_measure` ends with, as the seed's `sched_reset`),
  also when made before `init_measure`: the seed clears its table before pass
  1, so its "do not overwrite user assignments" never held.
- The passes give a node only a backend whose `supports_op` accepts it (the
  seed ignores op support, so a MUL_MAT-only backend such as ggml's BLAS would
  be handed every op after its matrix products). A node that no source's
  backend can compute, or that has no assigned source at all (the seed leaves
  it NULL and crashes), goes to the first backend, in priority order, that
  supports it ("2.prio"). Memory pins: "1.dst"/"1.vsrc" and user assignments
  are kept even when the backend cannot compute the op, and that is reported
  before anything runs.
- A split lists a tensor once among its inputs even when several of its
  nodes read it (the seed lists it, copies it and counts it against
  GGML_MAX_SPLIT_INPUTS once per reading source).
- The seed's fixed arrays and asserts are limits (`max_backends`,
  `max_splits`, `max_split_inputs`, defaults as the seed's) that raise
  LimitExceededError, and the other asserts raise GGMLErrors, before any
  node runs; a graph whose split or allocation fails is left as it was given
  (its sources point at its own tensors again, not at the copies).
- Every backend, and every compute buffer, is checked to be alive before
  `init_measure`, `reserve` or `graph_compute` does anything (BufferFreedError
  naming the backend and its position): a freed backend is never noticed
  halfway, after earlier splits have run.
- `graph_size` (ggml's later `ggml_backend_sched_new` argument): the largest
  graph (`Graph.size`) the scheduler takes; its tables are sized for it even
  when the measure graph is smaller. None (the default) takes the measure
  graph's size.
- `reserve(graph)` (not in the seed: ggml's later `ggml_backend_sched_reserve`)
  grows the compute buffers so that another graph fits. A graph smaller than
  the measure graph can need more memory than measured: its best-fit choices
  differ and leave other holes. `auto_reserve=True` makes `graph_compute`
  reserve and retry once when the allocation runs out of memory (or the graph
  is larger than the hash table measured); the default keeps the seed's
  behaviour, an OutOfMemoryError.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.hash_set import HashSet
from pyggml.alloc.tensor_allocator import SIZE_MAX, FreeBlock, TensorAllocator
from pyggml.core.checks import check_instance, check_positive
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GraphError,
    LimitExceededError,
    NotAllocatedError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from pyggml.core.graph import Graph
from pyggml.core.graph import hash_size as graph_hash_size
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op
from pyggml.ggml_backend.backend import Backend, op_desc
from pyggml.ggml_backend.buffer import Buffer, BufferUsage
from pyggml.ggml_backend.tensor_io import tensor_copy, tensor_get, tensor_set
from pyggml.sched.backend_sched import check_backends
from pyggml.sched.debug import DEBUG_ENV, debug_enabled
from pyggml.sched.passes import dup_tensor_layout
from pyggml.sched.stats import BackendStats, SchedStats
from pyggml.seed.split import Split

log = logging.getLogger("pyggml.sched")

GGML_MAX_BACKENDS = 4
GGML_MAX_SPLITS = 256
GGML_MAX_SPLIT_INPUTS = 16

_NO_PRIO = math.inf  # the seed's INT_MAX: "not one of the scheduler's backends"
_UNCHECKED_CAUSES = ("1.dst", "1.vsrc", "usr")  # assignments made without asking supports_op


class Scheduler:
    """ggml_backend_sched: assigns nodes to `backends` (priority order), splits, allocates, computes."""

    def __init__(self, backends: Sequence[Backend], max_backends: int = GGML_MAX_BACKENDS,
                 max_splits: int = GGML_MAX_SPLITS, max_split_inputs: int = GGML_MAX_SPLIT_INPUTS,
                 auto_reserve: bool = False, graph_size: int | None = None) -> None:
        """ggml_backend_sched_new: measure allocators for every backend, in the order given.

        `auto_reserve` (not in the seed): a `graph_compute` whose allocation runs
        out of memory calls `reserve(graph)` and tries once more instead of raising.
        `graph_size` (ggml's later argument): the largest graph size taken (None:
        the measure graph's).
        """
        if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
            raise ArgumentTypeError(f"Scheduler: backends must be a sequence of Backends, got "
                                    f"{type(backends).__name__} {backends!r:.80}")
        backends = list(backends)
        for name, value in (("max_backends", max_backends), ("max_splits", max_splits),
                            ("max_split_inputs", max_split_inputs)):
            check_positive(value, f"Scheduler: {name}")
        if graph_size is not None:
            graph_size = check_positive(graph_size, "Scheduler: graph_size")
        check_backends(backends, "Scheduler", max_backends, "GGML_MAX_BACKENDS")
        self.backends: list[Backend] = backends
        self.max_backends = max_backends
        self.max_splits = max_splits
        self.max_split_inputs = max_split_inputs
        self.auto_reserve = auto_reserve
        self.graph_size = graph_size

        self._backend_ids = {id(b): i for i, b in enumerate(backends)}  # priorities (the list keeps ids unique)
        self.galloc = GraphAllocator()
        self._own_buffers: dict[int, Buffer] = {}  # every buffer the scheduler made, by id (kept alive)
        tallocs: list[TensorAllocator] = []
        try:
            for b in backends:
                tallocs.append(self._new_tallocr(b, None))
        except BaseException:
            for talloc in tallocs:
                talloc.free()
            raise
        self._set_tallocs(tallocs)

        self.hash_set: HashSet | None = None  # made by init_measure, sized for the measure graph
        self.measure_hash_size = 0  # the measure graph's visited_hash_table.size
        self.node_talloc: list[TensorAllocator | None] = []  # [hash_set.size]: each tensor's allocator
        self.node_copies: dict[int, list[Tensor | None]] = {}  # slot -> the tensor's copy per backend
        self.causes: dict[int, str] = {}  # slot -> why the tensor got its backend (debug)
        self.user_assignments: dict[int, tuple[Tensor, int]] = {}  # id(tensor) -> (tensor, backend index)

        self.ctx: Context | None = None  # the copies of the last split
        self.graph: Graph | None = None  # the graph the allocator saw: each split's input copies, then its nodes
        self.splits: list[Split] = []
        self._rewired: list[tuple[Tensor, int, Tensor]] = []  # (node, j, its own source j) the split replaced
        self.stats = SchedStats(backends=[BackendStats(b.name()) for b in backends])
        self.freed = False

    # --- construction helpers ---

    def _new_tallocr(self, backend: Backend, size: int | None) -> TensorAllocator:
        """A measure allocator of `backend` (size None) or one over a new buffer of `size` bytes."""
        if size is None:
            talloc = TensorAllocator.new_measure_from_backend(backend)
        else:
            talloc = TensorAllocator.new_from_backend(backend, size)
            talloc.buffer.set_usage(BufferUsage.COMPUTE)
        self._own_buffers[id(talloc.buffer)] = talloc.buffer
        return talloc

    def _buffer_backend(self, t: Tensor) -> Backend | None:
        """ggml_get_backend as the seed has it: the backend of the tensor's own buffer (not its view source's).

        A buffer of no backend (made by a buffer type, today's ggml) is the first of the scheduler's backends
        that supports its type, as ggml_backend_sched_backend_from_buffer finds it (None if none does).
        """
        buffer = t.buffer
        if buffer is None:
            return None
        if buffer.backend is not None or buffer.buft is None:
            return buffer.backend
        for backend in self.backends:
            if backend.supports_buft(buffer.buft):
                return backend
        return None

    @property
    def n_backends(self) -> int:
        return len(self.backends)

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    @property
    def measured(self) -> bool:
        """True once init_measure has given every backend its real compute buffer."""
        return self.hash_set is not None

    def _check_alive(self) -> None:
        if self.freed:
            raise BufferFreedError("the scheduler was used after it was freed")

    def _check_backends(self, what: str) -> None:
        """The scheduler, every backend and every compute buffer alive, checked before anything runs:
        a freed backend found at its split would leave the earlier splits computed and the graph half done."""
        self._check_alive()
        for i, (b, talloc) in enumerate(zip(self.backends, self.tallocs, strict=True)):
            if b.freed:
                raise BufferFreedError(f"{what}: backend '{b.name()}' (backend {i} of the scheduler's "
                                       f"{len(self.backends)}) was freed; nothing was computed")
            buffer = talloc.get_buffer()
            if buffer.freed:
                raise BufferFreedError(f"{what}: the compute buffer '{buffer.name}' ({buffer.size} bytes) of backend "
                                       f"'{b.name()}' (backend {i}) was freed; nothing was computed")

    # --- priorities (the seed's sched_backend_prio / sched_allocr_prio) ---

    def backend_prio(self, backend: Backend | None) -> float:
        """The backend's index in priority order (lower is better); inf if it is not one of ours."""
        return self._backend_ids.get(id(backend), _NO_PRIO)

    def _allocr_prio(self, allocr: TensorAllocator | None) -> float:
        return self._talloc_ids.get(id(allocr), _NO_PRIO)

    def _set_tallocs(self, tallocs: list[TensorAllocator]) -> None:
        self.tallocs = tallocs
        self._talloc_ids = {id(t): i for i, t in enumerate(tallocs)}  # the list keeps the ids unique

    def _backend_index(self, backend: Backend, what: str) -> int:
        check_instance(backend, Backend, f"{what}: backend")
        prio = self.backend_prio(backend)
        if prio == _NO_PRIO:
            names = ", ".join(f"'{b.name()}'" for b in self.backends)
            raise ArgumentError(f"{what}: backend '{backend.name()}' is not one of the scheduler's backends "
                                f"({names})")
        return int(prio)

    # --- public API (ggml_backend_sched_*) ---

    def get_tallocr(self, backend: Backend) -> TensorAllocator:
        """ggml_backend_sched_get_tallocr: the allocator of `backend`'s compute buffer (inputs go here)."""
        self._check_alive()
        return self.tallocs[self._backend_index(backend, "get_tallocr")]

    def get_buffer(self, backend: Backend) -> Buffer:
        """ggml_backend_sched_get_buffer: `backend`'s compute buffer (a measure buffer before init_measure)."""
        self._check_alive()
        return self.tallocs[self._backend_index(backend, "get_buffer")].get_buffer()

    def set_node_backend(self, node: Tensor, backend: Backend) -> None:
        """ggml_backend_sched_set_node_backend: compute `node` on `backend`; the passes never change it.

        The assignment holds until `reset()`, which ends every graph_compute and
        init_measure: assign the nodes of each graph before computing it.
        """
        self._check_alive()
        check_instance(node, Tensor, "set_node_backend: node")
        index = self._backend_index(backend, f"set_node_backend('{node.name}')")
        if self.hash_set is not None:
            slot = self.hash_set.find_or_insert(node)  # may raise (a full table): before anything changes
            self.node_talloc[slot] = self.tallocs[index]
        self.user_assignments[id(node)] = (node, index)

    def get_node_backend(self, node: Tensor) -> Backend | None:
        """The backend `node` is assigned to: by the last split, else by set_node_backend, else None."""
        check_instance(node, Tensor, "get_node_backend: node")
        if self.hash_set is not None:
            slot = self.hash_set.find(node)
            if slot is not None and self.node_talloc[slot] is not None:
                return self.node_talloc[slot].get_buffer().backend
        user = self.user_assignments.get(id(node))
        if user is not None and user[0] is node:
            return self.backends[user[1]]
        return None

    # ggml's later names for the two
    set_tensor_backend = set_node_backend
    get_tensor_backend = get_node_backend

    def init_measure(self, measure_graph: Graph) -> None:
        """ggml_backend_sched_init_measure: size every backend's compute buffer for `measure_graph`.

        Use the largest graph that will be computed, with its inputs allocated
        in `get_tallocr(backend)` first, as they will be for each compute. A
        scheduler measures once (the seed would measure again with the real
        buffers): `reserve` a larger graph (or make a new scheduler).

        A failed measure leaves the scheduler as it was (unmeasured, the inputs
        placed in `get_tallocr` and the assignments kept): fix the cause and
        call it again, or `reset()`.
        """
        self._check_backends("init_measure")
        check_instance(measure_graph, Graph, "init_measure: measure_graph")
        if self.hash_set is not None:
            raise GraphError("init_measure: this scheduler has measured already; its compute buffers are allocated "
                             "(reserve(graph) grows them for a larger graph)")
        measure_hash_size = measure_graph.visited_hash_table.size
        if self.graph_size is not None:
            measure_hash_size = max(measure_hash_size, graph_hash_size(self.graph_size * 2))
        hash_size = measure_hash_size + self.max_splits * self.max_split_inputs
        self.hash_set = HashSet(hash_size)
        self.node_talloc = [None] * hash_size
        try:
            split_time, alloc_time = self._split_and_alloc(measure_graph)
        except BaseException:
            self.hash_set = None
            self.node_talloc = []
            self.node_copies = {}
            raise
        self.measure_hash_size = measure_hash_size
        self._new_stats(measure_graph, split_time, alloc_time)

        # allocate buffers and reset allocators; all buffers first, so that one that fails leaves no other behind
        sizes = [talloc.get_max_size() for talloc in self.tallocs]
        new: list[TensorAllocator] = []
        try:
            for b, size in zip(self.backends, sizes, strict=True):
                new.append(self._new_tallocr(b, size))
        except BaseException:
            for talloc in new:
                talloc.free()
                self._own_buffers.pop(id(talloc.buffer), None)
            # unmeasured again; the measure graph holds measure addresses and cannot be measured again
            self.hash_set = None
            self.node_talloc = []
            self.node_copies = {}
            self.splits = []
            self.graph = None
            self.reset()
            raise
        for talloc in self.tallocs:
            talloc.free()
        self._set_tallocs(new)
        log.debug("init_measure: compute buffer sizes %s",
                  ", ".join(f"{b.name()} {s} bytes" for b, s in zip(self.backends, sizes, strict=True)))
        self.reset()

    def graph_compute(self, graph: Graph) -> None:
        """ggml_backend_sched_graph_compute: split, allocate and compute `graph`, then reset.

        `graph` must be new (built for this call, as llama.cpp builds one per
        batch): the split points its nodes at the scheduler's copies and its
        tensors keep their memory in the compute buffers until the next call.
        With `auto_reserve`, a graph that does not fit is reserved (the
        buffers grow) and allocated once more; without it, the seed's error.

        Errors found up front (a freed backend or compute buffer, no measure yet,
        a graph too large or computed before) change nothing. Any later error
        (a split or an allocation that fails, a kernel) ends the call as a
        successful one does: the allocators are reset and the assignments
        forgotten, the graph's sources point at its own tensors again unless
        a split had started computing, and the scheduler takes the next graph.
        """
        # everything that can be checked up front is, before the scheduler's state changes
        self._check_backends("graph_compute")
        check_instance(graph, Graph, "graph_compute: graph")
        if self.hash_set is None:
            raise GraphError("graph_compute: call init_measure(measure_graph) first; it sizes the backends' "
                             "compute buffers")
        self._check_fresh(graph)
        fits = self._hash_fits(graph)
        if not fits and not self.auto_reserve:
            largest = (f"graph_size {self.graph_size}" if self.graph_size is not None
                       else f"the measure graph (hash table {self.measure_hash_size})")
            raise GraphError(
                f"graph_compute: the graph (size {graph.size}, hash table {graph.visited_hash_table.size}) "
                f"is larger than {largest}; measure with the largest graph"
            )
        try:
            if not fits:
                self.reserve(graph)
            try:
                split_time, alloc_time = self._split_and_alloc(graph)
            except OutOfMemoryError as e:
                if not self.auto_reserve:
                    raise
                log.debug("graph_compute: %s; reserving the graph and trying again", e)
                self.reserve(graph)
                split_time, alloc_time = self._split_and_alloc(graph)
            self._new_stats(graph, split_time, alloc_time)
            self._compute_splits()
        finally:
            self._reset_tallocs()
            self.user_assignments.clear()
        if debug_enabled():
            log.debug("%s", self.stats.format())

    def _hash_fits(self, graph: Graph) -> bool:
        """Whether the hash set (sized by the measure graph) holds `graph`'s tensors and its split copies."""
        assert self.hash_set is not None
        return self.hash_set.size >= graph.visited_hash_table.size + self.max_splits * self.max_split_inputs

    def _split_and_alloc(self, graph: Graph) -> tuple[float, float]:
        """Split and allocate `graph`; a failed allocation (rolled back by the graph allocator) also
        takes the split back, so the graph can be split again. Returns the two times."""
        t0 = time.perf_counter()
        self._split_graph(graph)
        t1 = time.perf_counter()
        try:
            self._alloc_splits()
        except BaseException:
            self._unsplit()
            raise
        return t1 - t0, time.perf_counter() - t1

    def _unsplit(self) -> None:
        """Point the graph's nodes at their own sources again (undo pass 4's rewiring to copies)."""
        for node, j, src in reversed(self._rewired):
            node.src[j] = src
        self._rewired = []
        self.splits = []
        self.graph = None

    def reserve(self, graph: Graph) -> None:
        """Grow each backend's compute buffer to what `graph` needs, if it needs more (not in the seed).

        ggml's later `ggml_backend_sched_reserve`: `graph` is split and allocated
        with measure allocators that start as the compute buffers are now (the
        inputs already placed with `get_tallocr` stay where they are), nothing is
        computed, and the graph is left as it was given, usable for
        `graph_compute`. A buffer that is too small is replaced by one of the
        measured size (plus one alignment, so that the buffer's tail never runs
        out when the allocation repeats the measured one); the graph's tensors
        in it move along with their bytes. Other tensors placed in that buffer
        (not in `graph`) lose their memory. Buffers with room are kept as they are.
        """
        self._check_backends("reserve")
        check_instance(graph, Graph, "reserve: graph")
        if self.hash_set is None:
            raise GraphError("reserve: call init_measure(measure_graph) first; reserve grows the compute buffers "
                             "it made")
        self._check_fresh(graph)
        if not self._hash_fits(graph):
            hash_size = graph.visited_hash_table.size + self.max_splits * self.max_split_inputs
            log.debug("reserve: hash set grown from %d to %d", self.hash_set.size, hash_size)
            self.hash_set = HashSet(hash_size)
            self.node_talloc = [None] * hash_size
            self.measure_hash_size = graph.visited_hash_table.size

        tensors = _graph_tensors(graph)
        saved = [(t, t.data, t.buffer, t.view_src, t.view_offs, list(t.src)) for t in tensors]
        real = self.tallocs
        measures: list[TensorAllocator] = []
        try:
            for backend, talloc in zip(self.backends, real, strict=True):
                measure = TensorAllocator.new_measure_from_backend(backend)
                measures.append(measure)
                _copy_allocator_state(talloc, measure, SIZE_MAX // 2)
            _move_tensors(tensors, list(zip(real, measures, strict=True)), copy_data=False)
            self._set_tallocs(measures)
            self._split_graph(graph)
            self._alloc_splits()
            needed = [measure.get_max_size() for measure in measures]
        finally:
            self._set_tallocs(real)
            for t, data, buffer, view_src, view_offs, src in saved:
                t.data, t.buffer, t.view_src, t.view_offs = data, buffer, view_src, view_offs
                t.src[:] = src
            self._rewired = []
            self.splits = []
            self.graph = None
            self.node_copies = {}
            self.hash_set.reset()
            self.node_talloc = [None] * self.hash_set.size
            for measure in measures:
                measure.free()

        for i, size in enumerate(needed):
            old = self.tallocs[i]
            old_size = old.get_buffer().get_size()
            if size <= old_size:
                continue
            backend = self.backends[i]
            new = self._new_tallocr(backend, size + backend.get_alignment())
            _copy_allocator_state(old, new, new.get_buffer().get_size())
            _move_tensors(tensors, [(old, new)], copy_data=True)
            tallocs = list(self.tallocs)
            tallocs[i] = new
            self._set_tallocs(tallocs)
            old.free()
            log.info("compute buffer of %s#%d grown from %d to %d bytes", backend.name(), i, old_size,
                     new.get_buffer().get_size())

    def reset(self) -> None:
        """Free every compute buffer's allocations and forget set_node_backend assignments.

        The seed's sched_reset (it only resets the allocators); graph_compute and
        init_measure end with it.
        """
        self._reset_tallocs()
        self.user_assignments.clear()

    def free(self) -> None:
        """ggml_backend_sched_free: the compute buffers and tables; freeing twice is harmless."""
        if self.freed:
            return
        for talloc in self.tallocs:
            talloc.free()
        self.galloc.free()
        self.hash_set = None
        self.node_talloc = []
        self.node_copies = {}
        self.user_assignments.clear()
        self.ctx = None
        self.graph = None
        self.splits = []
        self.freed = True

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def _reset_tallocs(self) -> None:
        for talloc in self.tallocs:
            talloc.reset()

    # --- observability ---

    def format_assignments(self, graph: Graph) -> str:
        """The seed's sched_print_assignments as text (splits, each node's backend and cause)."""
        from pyggml.sched.debug import format_assignments

        return format_assignments(self, graph)  # type: ignore[arg-type]

    def dump_dot(self, graph: Graph, filename: str | None = None) -> str:
        """Graphviz source of the last split graph, coloured by backend, splits as clusters."""
        from pyggml.sched.graphviz import sched_to_dot

        text = sched_to_dot(self, graph)  # type: ignore[arg-type]
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def tensor_backend(self, t: Tensor) -> Backend | None:
        """The backend `t` was assigned to by the last split (None if it has none)."""
        if self.hash_set is None:
            return None
        slot = self.hash_set.find(t)
        if slot is None:
            return None
        talloc = self.node_talloc[slot]
        return talloc.get_buffer().backend if talloc is not None else None

    def input_copy(self, t: Tensor, backend_index: int) -> Tensor | None:
        """The copy of split input `t` in backend `backend_index` made by the last split (None if none)."""
        slot = self.hash_set.find(t) if self.hash_set is not None else None
        copies = self.node_copies.get(slot, []) if slot is not None else []
        return copies[backend_index] if 0 <= backend_index < len(copies) else None

    def tensor_cause(self, t: Tensor) -> str:
        """Why the last split gave `t` its backend ("1.dst", "2.src0", "usr", ...; "" if no pass said)."""
        if self.hash_set is None:
            return ""
        slot = self.hash_set.find(t)
        return self.causes.get(slot, "") if slot is not None else ""

    def _new_stats(self, graph: Graph, split_time: float, alloc_time: float) -> None:
        self.stats = SchedStats(n_nodes=graph.n_nodes, n_splits=len(self.splits), split_time=split_time,
                                alloc_time=alloc_time, backends=[BackendStats(b.name()) for b in self.backends])

    # --- the passes (sched_split_graph) ---

    def _supports(self, index: int, node: Tensor) -> bool:
        """Whether backend `index` can compute `node` (views and leafs compute nothing: any backend)."""
        op = node.op
        if op == GGMLOp.NONE or is_view_op(op):
            return True
        return self.backends[index].supports_op(node)

    def _first_supporting(self, node: Tensor) -> int:
        for i in range(len(self.backends)):
            if self._supports(i, node):
                return i
        names = ", ".join(f"'{b.name()}'" for b in self.backends)
        types = ", ".join(f"{s.name}:{s.type.name}" for s in node.src if s is not None)
        raise UnsupportedOpError(f"none of the scheduler's backends ({names}) supports op {op_desc(node)} of node "
                                 f"'{node.name}' ({node.type.name}{list(node.ne)}; sources {types or 'none'})")

    def _backend_from_cur(self, node: Tensor, slot: int) -> int | None:
        """sched_backend_from_cur: the backend that node's memory, or its sources' memory, calls for."""
        causes = self.causes
        # if the dst tensor is already allocated in a buffer, we must assume that it is critical to keep it there
        # ie. kv cache updates
        cur_backend = self._buffer_backend(node)
        if cur_backend is not None:
            causes[slot] = "1.dst"
            return self._backend_index(cur_backend, f"node '{node.name}' (its memory)")

        # view_src
        if node.view_src is not None:
            vsrc_backend = self._buffer_backend(node.view_src)
            if vsrc_backend is not None:
                causes[slot] = "1.vsrc"
                return self._backend_index(vsrc_backend, f"node '{node.name}' (the memory of its view source "
                                                         f"'{node.view_src.name}')")

        # src: the lowest priority number, then the size (the seed's rule, as written)
        cur_prio = _NO_PRIO
        cur_size = 0
        best: int | None = None
        for j, src in enumerate(node.src):
            if src is None:
                break
            src_backend = self._buffer_backend(src)
            if src_backend is not None:
                src_prio = self.backend_prio(src_backend)
                if src_prio < cur_prio:  # (nbytes only when it matters)
                    src_size = src.nbytes()
                    if src_size >= cur_size and self._supports(int(src_prio), node):
                        cur_prio = src_prio
                        cur_size = src_size
                        best = int(src_prio)
                        causes[slot] = f"1.src{j}"
        return best

    def _split_graph(self, graph: Graph) -> None:
        """sched_split_graph: assign backends to nodes and cut the graph into splits.

        On error the graph's sources are put back as they were.
        """
        self._check_fresh(graph)
        hash_set = self.hash_set
        assert hash_set is not None
        # reset state
        hash_set.reset()
        node_talloc = self.node_talloc = [None] * hash_set.size
        self.node_copies = {}
        self.causes = {}
        causes = self.causes
        self.splits = []
        self.graph = None
        self.ctx = Context(mem_size=self.max_splits * self.max_split_inputs * tensor_overhead(), no_alloc=True)
        tallocs = self.tallocs
        find = hash_set.find_or_insert

        # user assignments first: the passes skip tensors that have a backend (the seed clears its table just
        # before pass 1, so its "do not overwrite user assignments" never held; here they hold until reset)
        for t, index in self.user_assignments.values():
            slot = find(t)
            node_talloc[slot] = tallocs[index]
            causes[slot] = "usr"

        # pass 1: assign backends to ops with allocated inputs
        for leaf in graph.leafs:
            slot = find(leaf)
            if node_talloc[slot] is not None:
                # do not overwrite user assignments
                continue
            leaf_backend = self._buffer_backend(leaf)
            if leaf_backend is None and leaf.view_src is not None:
                leaf_backend = self._buffer_backend(leaf.view_src)
            if leaf_backend is not None:
                node_talloc[slot] = tallocs[self._backend_index(leaf_backend, f"leaf '{leaf.name}' (its memory)")]

        nodes = graph.nodes
        slots = [find(node) for node in nodes]
        for node, slot in zip(nodes, slots, strict=True):
            if node_talloc[slot] is not None:
                # do not overwrite user assignments
                continue
            node_backend = self._backend_from_cur(node, slot)
            if node_backend is not None:
                node_talloc[slot] = tallocs[node_backend]

        # pass 2: assign backends to ops from current assignments
        for node, slot in zip(nodes, slots, strict=True):
            if node_talloc[slot] is not None:
                continue
            cur_prio = _NO_PRIO
            cur_size = 0
            best: int | None = None
            for j, src in enumerate(node.src):
                if src is None:
                    break
                src_allocr = node_talloc[find(src)]
                if src_allocr is not None:
                    src_prio = self._allocr_prio(src_allocr)
                    if src_prio < cur_prio:
                        src_size = src.nbytes()
                        if src_size >= cur_size and self._supports(int(src_prio), node):
                            cur_prio = src_prio
                            cur_size = src_size
                            best = int(src_prio)
                            causes[slot] = f"2.src{j}"
            if best is None:
                # no source's backend can compute it, or no source has a backend (the seed leaves the node NULL
                # and crashes, or hands it to a backend that cannot compute it): the first one that can
                best = self._first_supporting(node)
                causes[slot] = "2.prio"
            node_talloc[slot] = tallocs[best]

        # pass 3: assign backends to remaining src from dst (should only be leafs)
        for node, slot in zip(nodes, slots, strict=True):
            node_allocr = node_talloc[slot]
            for src in node.src:
                if src is None:
                    break
                src_slot = find(src)
                if node_talloc[src_slot] is None:
                    node_talloc[src_slot] = node_allocr

        rewired: list[tuple[Tensor, int, Tensor]] = []
        self._rewired = rewired
        try:
            self._split_nodes(graph, slots, rewired)
        except BaseException:
            self._unsplit()
            raise

        if debug_enabled():
            log.debug("%s", self.format_assignments(graph))

    def _split_nodes(self, graph: Graph, slots: list[int], rewired: list[tuple[Tensor, int, Tensor]]) -> None:
        """Pass 4: split the graph, find the tensors that need to be copied, build the allocation graph."""
        hash_set = self.hash_set
        assert hash_set is not None and self.ctx is not None
        find = hash_set.find_or_insert
        node_talloc = self.node_talloc
        node_copies = self.node_copies
        n_backends = len(self.backends)
        nodes = graph.nodes

        splits = self.splits
        if not nodes:
            self.graph = Graph(0)
            return
        # find first backend (a graph of views only: the first view's)
        first_allocr = node_talloc[slots[0]]
        for node, slot in zip(nodes, slots, strict=True):
            if node.view_src is None:
                first_allocr = node_talloc[slot]
                break
        split = Split(first_allocr, 0)
        splits.append(split)
        cur_allocr = first_allocr
        cur_backend_id = self._allocr_prio(cur_allocr)
        causes = self.causes
        for i, node in enumerate(nodes):
            if is_view_op(node.op):
                continue
            slot = slots[i]
            node_allocr = node_talloc[slot]
            if node_allocr is None:
                raise GraphError(f"node {i} '{node.name}' ({op_desc(node)}) has no backend")
            if node_allocr is not cur_allocr:
                split.i_end = i
                if len(splits) >= self.max_splits:
                    raise LimitExceededError(
                        f"the graph needs more than GGML_MAX_SPLITS = {self.max_splits} splits (node {i} "
                        f"'{node.name}' starts another one on '{node_allocr.get_buffer().backend.name()}')"
                    )
                split = Split(node_allocr, i)
                splits.append(split)
                cur_allocr = node_allocr
                cur_backend_id = self._allocr_prio(cur_allocr)
            backend_id = int(cur_backend_id)
            # the passes chose supporting backends; memory pins and user assignments did not look
            if causes.get(slot) in _UNCHECKED_CAUSES and not self._supports(backend_id, node):
                raise UnsupportedOpError(
                    f"node {i} '{node.name}' is on backend '{self.backends[backend_id].name()}' "
                    f"({self._why(node)}), which does not support op {op_desc(node)}"
                )

            # find inputs that are not on the same backend
            for j, src in enumerate(node.src):
                if src is None:
                    break
                src_slot = find(src)
                src_allocr = node_talloc[src_slot]
                if src_allocr is node_allocr:
                    continue
                inputs = split.inputs
                # once per split: the seed appends src for every reading source, copying it and counting it
                # against GGML_MAX_SPLIT_INPUTS once per read
                if not any(t is src for t in inputs):
                    if len(inputs) >= self.max_split_inputs:
                        raise LimitExceededError(
                            f"split {len(splits) - 1} on '{self.backends[backend_id].name()}' needs more than "
                            f"GGML_MAX_SPLIT_INPUTS = {self.max_split_inputs} inputs from other backends "
                            f"('{src.name}', source {j} of node {i} '{node.name}', would be one too many)"
                        )
                    inputs.append(src)

                # create copies
                copies = node_copies.get(src_slot)
                if copies is None:
                    copies = node_copies[src_slot] = [None] * n_backends
                tensor_copy_ = copies[backend_id]
                if tensor_copy_ is None:
                    tensor_copy_ = dup_tensor_layout(self.ctx, src)
                    copies[backend_id] = tensor_copy_
                    node_talloc[find(tensor_copy_)] = node_allocr
                    tensor_copy_.format_name("%s#%s", self.backends[backend_id].name(), src.name)
                rewired.append((node, j, src))
                node.src[j] = tensor_copy_
        split.i_end = len(nodes)

        # sanity check: all sources should have the same backend as the node (printed by the seed; here a debug
        # message, as view ops keep sources of another backend when the user assigned them elsewhere)
        for node, slot in zip(nodes, slots, strict=True) if log.isEnabledFor(logging.DEBUG) else ():
            node_allocr = node_talloc[slot]
            for j, src in enumerate(node.src):
                if src is None:
                    break
                src_allocr = node_talloc[find(src)]
                if src_allocr is not node_allocr:
                    log.debug("%s has backend %s, src %d (%s) has backend %s", node.name,
                              _allocr_name(node_allocr), j, src.name, _allocr_name(src_allocr))

        # create copies of the graph for each split
        # FIXME (seed): avoid this copy, pass split inputs to alloc_graph_n in some other way
        graph_copy = Graph(len(nodes) + len(splits) * self.max_split_inputs)
        copy_nodes = graph_copy.nodes
        for split in splits:
            split.graph = graph.view(split.i_start, split.i_end)
            split_backend_id = int(self._allocr_prio(split.tallocr))
            # add inputs to the graph copy so that they are allocated by the graph allocator at the start of the split
            for inp in split.inputs:
                input_cpy = node_copies[find(inp)][split_backend_id]
                assert input_cpy is not None
                input_cpy.src[0] = inp
                copy_nodes.append(input_cpy)
            copy_nodes.extend(nodes[split.i_start:split.i_end])
        self.graph = graph_copy

    def _why(self, node: Tensor) -> str:
        slot = self.hash_set.find(node) if self.hash_set is not None else None
        cause = self.causes.get(slot, "") if slot is not None else ""
        return {
            "usr": "set by set_node_backend",
            "1.dst": "its memory is in that backend's buffer",
            "1.vsrc": "its view source's memory is in that backend's buffer",
        }.get(cause, f"assigned by pass {cause or '?'}")

    def _check_fresh(self, graph: Graph) -> None:
        """Refuse a graph whose nodes already have memory in the scheduler's buffers.

        Splitting rewires sources to copies and allocation leaves addresses in
        the nodes: a graph computed (or measured) before would be split from
        stale copies and never recomputed correctly. Build a new graph instead.
        """
        own = self._own_buffers
        for i, node in enumerate(graph.nodes):
            buffer = node.buffer
            if buffer is not None and id(buffer) in own and own[id(buffer)] is buffer:
                raise GraphError(
                    f"node {i} '{node.name}' already has memory in the scheduler's buffer '{buffer.name}': this graph "
                    f"was measured or computed before; build a new graph for each init_measure/graph_compute"
                )

    # --- allocation and compute ---

    def _alloc_splits(self) -> None:
        """sched_alloc_splits: place every tensor of the split graph in its backend's buffer."""
        assert self.graph is not None and self.hash_set is not None
        try:
            self.galloc.alloc_graph_n(self.graph, self.hash_set, self.node_talloc)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(f"{e}; the graph needs more memory than init_measure measured (measure with the "
                                   f"largest graph, reserve(graph) first, or make the Scheduler with "
                                   f"auto_reserve=True)") from e

    def _compute_splits(self) -> None:
        """sched_compute_splits: per split, copy its inputs into its backend, then compute its nodes."""
        hash_set = self.hash_set
        assert hash_set is not None
        stats = self.stats.backends
        for split in self.splits:
            assert split.tallocr is not None and split.graph is not None
            split_backend = split.tallocr.get_buffer().backend
            assert split_backend is not None
            split_backend_id = int(self.backend_prio(split_backend))
            bstats = stats[split_backend_id]
            bstats.n_splits += 1

            # copy the input tensors to the split backend
            copy_start = time.perf_counter()
            for inp in split.inputs:
                input_cpy = self.node_copies[hash_set.find_or_insert(inp)][split_backend_id]
                assert input_cpy is not None
                if inp.buffer is None:
                    if inp.view_src is None or inp.view_src.buffer is None:
                        raise NotAllocatedError(f"split input '{inp.name}' has no buffer and no view source with "
                                                f"one")
                    view = inp
                    view.buffer = view.view_src.buffer
                    view.data = view.view_src.data + view.view_offs
                    # the seed initializes the view with the scheduler's buffer of that backend; the owning buffer
                    # is the intent (see init_view's FIXME in the seed) and works for buffers the scheduler lacks
                    view.buffer.init_tensor(view)
                if input_cpy.buffer is None:
                    raise NotAllocatedError(f"input copy '{input_cpy.name}' has no buffer")
                if self._buffer_backend(inp) is split_backend or input_cpy.buffer.backend is not split_backend:
                    raise GraphError(f"split input '{inp.name}' on '{_buffer_name(inp)}' cannot be copied to "
                                     f"'{input_cpy.name}' on '{_buffer_name(input_cpy)}' for backend "
                                     f"'{split_backend.name()}'")
                tensor_copy(inp, input_cpy)
                bstats.n_copies += 1
                bstats.bytes_copied += input_cpy.nbytes()
            copy_end = time.perf_counter()
            bstats.copy_time += copy_end - copy_start

            split_backend.graph_compute(split.graph)
            bstats.compute_time += time.perf_counter() - copy_end


def _graph_tensors(graph: Graph) -> list[Tensor]:
    """Every tensor the graph names: nodes, leafs, sources and view sources (each once)."""
    seen: dict[int, Tensor] = {}
    for t in (*graph.leafs, *graph.nodes):
        seen.setdefault(id(t), t)
    for node in graph.nodes:
        for src in node.src:
            if src is None:
                break
            seen.setdefault(id(src), src)
    for t in list(seen.values()):
        if t.view_src is not None:
            seen.setdefault(id(t.view_src), t.view_src)
    return list(seen.values())


def _copy_allocator_state(src: TensorAllocator, dst: TensorAllocator, dst_size: int) -> None:
    """Make `dst` (as large as or larger than `src`) hold what `src` holds: the same free blocks at the
    same offsets from the base, the tail (the last block) grown to the end of `dst`'s `dst_size` bytes.

    The best-fit choices of the two allocators are then the same (the tail's size decides only whether
    an allocation fits, never where it goes). The tensors `src` holds are held by `dst` at the same
    offsets (they move there with `_move_tensors`), so the graph allocator can free them in `dst`.
    """
    src_size = src.get_buffer().get_size()
    end = src.base + src_size
    dst.allocated = {key: (t, addr - src.base + dst.base, size) for key, (t, addr, size) in src.allocated.items()}
    blocks = [FreeBlock(b.addr - src.base + dst.base, b.size) for b in src.free_blocks]
    if src.free_blocks and src.free_blocks[-1].addr + src.free_blocks[-1].size >= end:
        used = src.free_blocks[-1].addr - src.base  # the end of the highest allocation
        blocks[-1].size += dst_size - src_size
    else:
        used = src_size
        if dst_size > src_size:
            blocks.append(FreeBlock(dst.base + src_size, dst_size - src_size))
    dst.free_blocks = blocks
    dst.max_size = used


def _move_tensors(tensors: list[Tensor], moves: list[tuple[TensorAllocator, TensorAllocator]], copy_data: bool) -> None:
    """Move the tensors of each pair's first buffer to the same offset in the second buffer.

    Views follow their source (also views not yet given a buffer, whose `data` is set). With
    `copy_data` the bytes come along (the old buffer must still be alive).
    """
    by_buffer: dict[int, tuple[TensorAllocator, TensorAllocator]] = {id(a.buffer): (a, b) for a, b in moves}
    plan: list[tuple[Tensor, Any, int, bool]] = []  # tensor, new buffer or None (keep None), new address, own
    for t in tensors:
        if t.data is None:
            continue
        holder = t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None else None)
        move = by_buffer.get(id(holder)) if holder is not None else None
        if move is None or move[0].buffer is not holder:
            continue
        old, new = move
        own = t.buffer is not None and t.view_src is None
        plan.append((t, new.buffer if t.buffer is not None else None, t.data - old.base + new.base, own))
    for t, buffer, addr, own in plan:
        data = None
        if copy_data and own:
            data = bytearray(t.nbytes())
            tensor_get(t, data)
        t.data = addr
        t.buffer = buffer
        if data is not None:
            buffer.init_tensor(t)
            tensor_set(t, data)


def _allocr_name(allocr: TensorAllocator | None) -> str:
    if allocr is None:
        return "NULL"
    backend = allocr.get_buffer().backend
    return backend.name() if backend is not None else "NULL"


def _buffer_name(t: Tensor) -> str:
    buffer = t.buffer
    if buffer is None or buffer.backend is None:
        return "NULL"
    return buffer.backend.name()


__all__ = ["DEBUG_ENV", "GGML_MAX_BACKENDS", "GGML_MAX_SPLITS", "GGML_MAX_SPLIT_INPUTS", "Scheduler", "debug_enabled",
           "dup_tensor_layout"]
