"""`GraphAllocator`: `ggml_gallocr` (ggml-alloc.c), a graph's tensors placed so that freed memory is reused.

Sources are freed after their last consumer (at parse_seq's -1 barriers if one is set), nodes of in-place ops
reuse a sole consumer's memory, WEIGHTS buffers are never freed into; DESIGN.md, "The graph allocator".
A failed pass raises after putting every allocator and tensor back as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyggml.alloc.hash_set import HashSet, hash_size
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, BufferFreedError, GGMLError, GraphError, InvalidStateError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGML_MAX_DIMS, GGML_MAX_SRC, GGMLOp, Tensor
from pyggml.ggml_backend.buffer import BufferUsage

log = logging.getLogger("pyggml.alloc")

# ggml_op_can_inplace's list: ops whose kernels read each element before writing it
INPLACE_OPS = frozenset({
    GGMLOp.FILL,
    GGMLOp.SCALE,
    GGMLOp.DIAG_MASK_ZERO,
    GGMLOp.DIAG_MASK_INF,
    GGMLOp.ADD,
    GGMLOp.ADD_ID,
    GGMLOp.ADD1,
    GGMLOp.SUB,
    GGMLOp.MUL,
    GGMLOp.DIV,
    GGMLOp.SQR,
    GGMLOp.SQRT,
    GGMLOp.LOG,
    GGMLOp.UNARY,
    GGMLOp.ROPE,
    GGMLOp.ROPE_BACK,
    GGMLOp.SILU_BACK,
    GGMLOp.RMS_NORM,
    GGMLOp.RMS_NORM_BACK,
    GGMLOp.CLAMP,
    GGMLOp.SOFT_MAX,
    GGMLOp.SOFT_MAX_BACK,
})


def op_can_inplace(op: GGMLOp) -> bool:
    """ggml_op_can_inplace: whether a node of `op` may write over a source's memory."""
    return op in INPLACE_OPS


def are_same_layout(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_layout: same type, `ne` and `nb` (so element i is at the same byte in both)."""
    if a.type != b.type:
        return False
    for i in range(GGML_MAX_DIMS):
        if a.ne[i] != b.ne[i] or a.nb[i] != b.nb[i]:
            return False
    return True


class HashNode:
    """ggml's `struct hash_node` (consumers and views still to come), plus whether this pass allocated it."""

    __slots__ = ("allocated", "n_children", "n_views")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.allocated = False

    def __repr__(self) -> str:
        return f"HashNode(n_children={self.n_children}, n_views={self.n_views}, allocated={self.allocated})"


_TensorState = tuple[Tensor, Any, Any, Any, int]


class GraphAllocator:
    """ggml_gallocr: allocate a graph's tensors through tensor allocators, reusing freed memory."""

    def __init__(self) -> None:
        self.talloc: TensorAllocator | None = None
        self.hash_set: Any = None  # HashSet (or any set with find_or_insert/size) of the current pass
        self.hash_values: dict[int, HashNode] = {}
        self.hash_allocs: Any = None  # slot -> TensorAllocator | None (alloc_graph_n)
        self.parse_seq: list[int] = []
        # rollback state of the pass in progress
        self._saved_tensors: dict[int, _TensorState] = {}
        self._saved_tallocs: dict[int, tuple[TensorAllocator, Any]] = {}
        self._debug = False

    def free(self) -> None:
        """ggml_gallocr_free: drop the tables; the allocator can still be used (they are remade per pass)."""
        self.talloc = None
        self.hash_set = None
        self.hash_values = {}
        self.hash_allocs = None
        self.parse_seq = []

    def set_parse_seq(self, parse_seq: Sequence[int]) -> None:
        """ggml_gallocr_set_parse_seq: node indices in allocation order, -1 marking barriers (frees happen there)."""
        seq = [check_int(i, "parse_seq entry") for i in parse_seq]
        for i in seq:
            if i < -1:
                raise ArgumentError(f"parse_seq entries are node indices or -1 (a barrier), got {i}")
        self.parse_seq = seq

    def alloc_graph(self, talloc: TensorAllocator, graph: Graph) -> int:
        """ggml_gallocr_alloc_graph: allocate `graph` with `talloc`; returns talloc's max size."""
        check_instance(talloc, TensorAllocator, "alloc_graph: talloc")
        check_instance(graph, Graph, "alloc_graph: graph")
        if talloc.buffer.freed:
            raise BufferFreedError(f"alloc_graph: buffer '{talloc.buffer.name}' ({talloc.buffer.size} bytes) of the "
                                   f"tensor allocator was freed")
        self._check_graph(graph, "alloc_graph", lambda t: talloc)
        # a graph view has no visited hash table, and views of outside tensors add keys: cover every nameable one
        n_tensors = graph.n_nodes * (2 + 2 * GGML_MAX_SRC) + graph.n_leafs
        size = max(graph.visited_hash_table.size, hash_size(n_tensors))
        self.hash_set = HashSet(size)
        self.hash_values = {}
        self.hash_allocs = None
        self.talloc = talloc
        self._begin()
        self._touch_talloc(talloc)
        try:
            self._alloc_graph_impl(graph)
        except GGMLError:
            self._rollback()
            raise
        finally:
            self.talloc = None
            self._end()
        max_size = talloc.get_max_size()
        self._log_report(graph, talloc)
        return max_size

    def alloc_graph_n(self, graph: Graph, hash_set: Any, hash_node_talloc: Any) -> None:
        """ggml_gallocr_alloc_graph_n: `hash_node_talloc[hash_set.find_or_insert(t)]` is t's allocator (or None)."""
        check_instance(graph, Graph, "alloc_graph_n: graph")
        if hash_set.size < graph.n_nodes + graph.n_leafs:
            raise GraphError(f"alloc_graph_n: hash set of size {hash_set.size} is smaller than the graph's "
                             f"{graph.n_nodes} nodes + {graph.n_leafs} leafs")
        find = getattr(hash_set, "find", None)

        def talloc_of(t: Tensor) -> TensorAllocator | None:
            slot = find(t) if find is not None else None
            if slot is None:
                return None
            if isinstance(hash_node_talloc, dict):
                return hash_node_talloc.get(slot)
            return hash_node_talloc[slot] if slot < len(hash_node_talloc) else None

        self._check_graph(graph, "alloc_graph_n", talloc_of)
        self.talloc = None
        self.hash_values = {}
        self.hash_set = hash_set
        self.hash_allocs = hash_node_talloc
        self._begin()
        try:
            self._alloc_graph_impl(graph)
        except GGMLError:
            self._rollback()
            raise
        finally:
            self.hash_set = None
            self.hash_allocs = None
            self._end()

    def hash_node(self, t: Tensor) -> HashNode | None:
        """The counts of `t` left by the last pass (None if the pass never looked at t)."""
        if self.hash_set is None:
            return None
        find = getattr(self.hash_set, "find", None)
        slot = find(t) if find is not None else self.hash_set.keys.get(id(t))
        return None if slot is None else self.hash_values.get(slot)

    @staticmethod
    def _check_graph(graph: Graph, what: str, talloc_of: Any) -> None:
        """Refuse a graph that reads a freed buffer, or memory its allocator does not hold, before any change."""
        seen: set[int] = set()
        for t in (*graph.leafs, *graph.nodes, *(s for n in graph.nodes for s in n.src if s is not None)):
            if t.data is None or id(t) in seen:
                continue
            seen.add(id(t))
            buffer = t.buffer if t.buffer is not None or t.view_src is None else t.view_src.buffer
            if buffer is None:
                continue
            if buffer.freed:
                raise BufferFreedError(f"{what}: tensor '{t.name}' is in buffer '{buffer.name}' ({buffer.size} "
                                       f"bytes), which was freed")
            if t.view_src is None:
                talloc = talloc_of(t)
                if talloc is not None and talloc.is_own(t) and not talloc.holds(t):
                    raise InvalidStateError(
                        f"{what}: tensor '{t.name}' has memory at offset {t.data - talloc.base} of buffer "
                        f"'{buffer.name}' that its tensor allocator does not hold (freed, or allocated before "
                        f"reset()): other tensors would be given its bytes; allocate it again"
                    )

    def _begin(self) -> None:
        self._saved_tensors = {}
        self._saved_tallocs = {}
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._slot_of = self.hash_set.find_or_insert
        allocs = self.hash_allocs
        if isinstance(allocs, dict):
            self._talloc_at = allocs.get
        elif allocs is not None:
            n = len(allocs)
            self._talloc_at = lambda slot: allocs[slot] if slot < n else None
        else:
            self._talloc_at = lambda slot: None

    def _end(self) -> None:
        self._saved_tensors = {}
        self._saved_tallocs = {}

    def _touch_talloc(self, talloc: TensorAllocator) -> None:
        key = id(talloc)
        if key not in self._saved_tallocs:
            self._saved_tallocs[key] = (talloc, talloc.snapshot())

    def _save(self, t: Tensor) -> None:
        key = id(t)
        if key not in self._saved_tensors:
            self._saved_tensors[key] = (t, t.data, t.buffer, t.view_src, t.view_offs)

    def _rollback(self) -> None:
        for t, data, buffer, view_src, view_offs in self._saved_tensors.values():
            t.data = data
            t.buffer = buffer
            t.view_src = view_src
            t.view_offs = view_offs
        for talloc, state in self._saved_tallocs.values():
            talloc.restore(state)
        log.debug("alloc_graph failed: %d tensors and %d allocators restored",
                  len(self._saved_tensors), len(self._saved_tallocs))

    def _hash_get(self, t: Tensor) -> HashNode:
        """hash_get: t's counts, made on first use."""
        slot = self._slot_of(t)
        hn = self.hash_values.get(slot)
        if hn is None:
            hn = HashNode()
            self.hash_values[slot] = hn
        return hn

    def _node_tallocr(self, node: Tensor) -> TensorAllocator | None:
        """node_tallocr: the one allocator of alloc_graph, else the node's entry of the allocator map."""
        if self.talloc is not None:
            return self.talloc
        talloc = self._talloc_at(self._slot_of(node))
        if talloc is not None and id(talloc) not in self._saved_tallocs:
            self._touch_talloc(talloc)
        return talloc

    def _init_view(self, view: Tensor) -> None:
        """init_view: a view's memory is its view_src's, at view_offs."""
        alloc = self._node_tallocr(view)
        view_src = view.view_src
        if view_src is None or view_src.data is None:
            src_name = view_src.name if view_src is not None else "(none)"
            raise GraphError(f"cannot place view '{view.name}': its view_src '{src_name}' has no memory "
                             f"(allocate the source first, or give it memory)")
        self._save(view)
        view.buffer = view_src.buffer
        view.data = view_src.data + view.view_offs
        # the owning buffer, not the node's allocator's (ggml's FIXME): a KV cache view is outside the compute buffer
        if alloc is not None and not alloc.measure and view.buffer is not None:
            view.buffer.init_tensor(view)

    def _allocate_node(self, node: Tensor) -> None:
        """allocate_node: give `node` memory (a view, a source's memory in place, or a new block)."""
        alloc = self._node_tallocr(node)
        if node.data is not None:
            return
        if node.view_src is not None:
            self._init_view(node)
            return
        if node.op in INPLACE_OPS:
            for parent in node.src:
                if parent is None:
                    break
                if alloc is None or not alloc.is_own(parent):
                    continue
                # nor if it is a weight
                if alloc.buffer.get_usage() == BufferUsage.WEIGHTS:
                    continue
                p_hn = self._hash_get(parent)
                if (parent.data is not None and p_hn.n_children == 1 and p_hn.n_views == 0
                        and are_same_layout(node, parent)):
                    if parent.view_src is not None:
                        view_src = parent.view_src
                        view_src_hn = self._hash_get(view_src)
                        if (view_src_hn.n_views == 1 and view_src_hn.n_children == 0
                                and view_src.data == parent.data):
                            # only at offset 0: with an offset the memory could not be freed later
                            if self._debug:
                                log.debug("reusing view parent %s (%s) for %s", parent.name, view_src.name, node.name)
                            self._save(node)
                            node.view_src = view_src
                            view_src_hn.n_views += 1
                            self._init_view(node)
                            return
                    else:
                        if self._debug:
                            log.debug("reusing parent %s for %s", parent.name, node.name)
                        self._save(node)
                        node.view_src = parent
                        p_hn.n_views += 1
                        self._init_view(node)
                        return
        if alloc is None:
            raise GraphError(f"cannot allocate '{node.name}': no tensor allocator is given for it "
                             f"(its hash_node_talloc entry is None)")
        self._save(node)
        alloc.alloc(node)
        self._hash_get(node).allocated = True

    def _free_node(self, node: Tensor) -> None:
        """free_node: node's memory back to its allocator, unless the allocator's buffer holds weights."""
        alloc = self._node_tallocr(node)
        if alloc is not None and alloc.buffer.get_usage() != BufferUsage.WEIGHTS:
            alloc.free_tensor(node)

    def _alloc_graph_impl(self, graph: Graph) -> None:
        """ggml_tallocr_alloc_graph_impl."""
        parse_seq = self.parse_seq
        parse_seq_len = len(parse_seq)
        nodes = graph.nodes
        for i in parse_seq:
            if i >= len(nodes):
                raise GraphError(f"parse_seq names node {i}, but the graph has {len(nodes)} nodes")
        debug = self._debug

        for node in nodes:
            view_src = node.view_src
            if view_src is not None:
                self._hash_get(view_src).n_views += 1
                if node.buffer is None and node.data is not None:
                    # view of a pre-allocated tensor, didn't call init_view() yet
                    self._init_view(node)
            for parent in node.src:
                if parent is None:
                    break
                self._hash_get(parent).n_children += 1
                if parent.view_src is not None and parent.buffer is None and parent.data is not None:
                    self._init_view(parent)

        last_barrier_pos = 0
        n_nodes = parse_seq_len if parse_seq_len else len(nodes)

        for ind in range(n_nodes):
            if parse_seq_len == 0 or parse_seq[ind] != -1:
                i = parse_seq[ind] if parse_seq_len else ind
                node = nodes[i]

                for parent in node.src:
                    if parent is None:
                        break
                    self._allocate_node(parent)

                self._allocate_node(node)

                if debug:
                    names = []
                    for parent in node.src:
                        if parent is None:
                            break
                        names.append(parent.name)
                    log.debug("exec: %s (%s) <= %s", node.op.name, node.name, ", ".join(names))

            # update parents: at once without a parse_seq, else at its barriers
            if parse_seq_len == 0 or parse_seq[ind] == -1:
                update_start = last_barrier_pos if parse_seq_len else ind
                update_end = ind if parse_seq_len else ind + 1
                for i in range(update_start, update_end):
                    node_i = parse_seq[i] if parse_seq_len else i
                    node = nodes[node_i]
                    for parent in node.src:
                        if parent is None:
                            break
                        p_hn = self._hash_get(parent)
                        p_hn.n_children -= 1
                        if p_hn.n_children == 0 and p_hn.n_views == 0:
                            view_src = parent.view_src
                            if view_src is not None:
                                view_src_hn = self._hash_get(view_src)
                                view_src_hn.n_views -= 1
                                if debug:
                                    log.debug("view_src %s: %d children, %d views", view_src.name,
                                              view_src_hn.n_children, view_src_hn.n_views)
                                if view_src_hn.n_views == 0 and view_src_hn.n_children == 0:
                                    self._free_node(view_src)
                            else:
                                self._free_node(parent)
                if parse_seq_len:
                    last_barrier_pos = ind + 1

    def _log_report(self, graph: Graph, talloc: TensorAllocator) -> None:
        """Log the memory report of the pass (pyggml.alloc at DEBUG); costs nothing when not logged."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        try:
            from pyggml.alloc.report import memory_report
        except ImportError:
            return
        log.debug("%s", memory_report(graph, talloc).format())

    def __repr__(self) -> str:
        return f"GraphAllocator(parse_seq_len={len(self.parse_seq)})"
