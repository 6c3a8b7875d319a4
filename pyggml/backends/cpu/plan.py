"""CPU graph plans: each node's kernel prepared once, computed many times; every tensor checked inside its buffer when
prepared, and nodes prepared again when their tensors move (DESIGN.md, "The backend, its plans and its memory")."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from pyggml.backends.cpu import kernels
from pyggml.backends.cpu.kernels import KERNELS, Compute, ComputeParams, _common, graph_runner, matmul
from pyggml.backends.cpu.repack import repack_supports_op
from pyggml.core import memory
from pyggml.core.errors import GGMLError, GraphError, LayoutError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.ops.node_check import check_sources
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op, nbytes_of
from pyggml.core.types import TYPE_TRAITS
from pyggml.ggml_backend.buffer import Buffer, check_plan_buffers, tensor_buffer

Supports = Callable[[Tensor], bool]

_supports_of: dict[GGMLOp, Supports | bool] = {}  # an op's `supports(node)`, or the answer for every node


def _op_supports(op: GGMLOp) -> Supports | bool:
    if op == GGMLOp.NONE or is_view_op(op):
        return True
    kernel = KERNELS.get(op)
    if kernel is None:
        return False
    module = sys.modules.get(getattr(kernel, "__module__", "") or "")
    return getattr(module, "supports", None) or True


def kernel_supports(node: Tensor) -> bool:
    """Whether a CPU kernel's `supports` accepts `node`, reading no repacked tensor but as MUL_MAT's src0."""
    if not repack_supports_op(node) or not _has_sources(node):
        return False
    supports = _supports_of.get(node.op)
    if supports is None:
        supports = _supports_of[node.op] = _op_supports(node.op)
    return supports if supports.__class__ is bool else bool(supports(node))  # type: ignore[operator]


def _has_sources(node: Tensor) -> bool:
    """Whether the node's sources are those its op takes (the plan refuses others: `check_sources`)."""
    try:
        check_sources(node)
    except GGMLError:
        return False
    return True


def check_layout(t: Tensor, what: str) -> None:
    """LayoutError unless a quantized tensor's rows are whole blocks one after another (as its bounds were checked)."""
    tr = TYPE_TRAITS[t.type]
    if tr.blck_size > 1 and t.nb[0] != tr.type_size:
        raise LayoutError(f"{what}: tensor '{t.name}' of type {t.type.name} has nb[0] = {t.nb[0]}, not its block's "
                          f"{tr.type_size} bytes")


def check_distinct_elements(t: Tensor, what: str) -> None:
    """LayoutError unless a node's elements (or blocks) lie at distinct bytes: kernels and BLAS write each once."""
    tr = TYPE_TRAITS[t.type]
    counts = [t.ne[0] // tr.blck_size, *t.ne[1:]]
    if min(counts) <= 0:
        return
    strides = [tr.type_size if tr.blck_size > 1 else t.nb[0], *t.nb[1:]]
    reach = tr.type_size  # bytes the dims so far span, from the innermost
    for nb, n in sorted((nb, n) for n, nb in zip(counts, strides, strict=True) if n > 1):
        if nb < reach:
            raise LayoutError(f"{what}: the elements of '{t.name}' overlap (ne {t.ne}, nb {t.nb}): a stride of {nb} "
                              f"bytes under {reach} bytes of elements")
        reach = nb * (n - 1) + reach


def _is_noop(fn: Compute) -> bool:
    """The kernels' do-nothing compute functions (views, empty tensors): not worth a call per compute."""
    return fn is kernels._noop or fn is _common.noop


class _Seen:
    """A tensor a plan reads or writes, as it was when the plan prepared it."""

    __slots__ = ("tensor", "data", "view", "type", "ne", "nb", "users", "base", "base_addr", "extent", "buffer")

    def __init__(self, tensor: Tensor, view: np.ndarray) -> None:
        self.tensor = tensor
        self.users: list[int] = []  # indices of the computes whose node reads or writes it
        self.buffer = tensor_buffer(tensor)
        self.set_view(view)

    def set_view(self, view: np.ndarray) -> None:
        t = self.tensor
        self.view = view
        self.data = t.data
        self.type = t.type
        self.ne = tuple(t.ne)
        self.nb = tuple(t.nb)
        self.extent = nbytes_of(t.type, t.ne, t.nb)
        base = view.base  # memory.view's views are made on a registered 1-D host array
        if base is not getattr(self, "base", None):
            self.base = base if isinstance(base, np.ndarray) and base.ndim == 1 else None
            self.base_addr = memory.address_of(base) if self.base is not None else 0

    def follow(self) -> None:
        """View the tensor where it is now (same layout in the same host array: without a lookup)."""
        t = self.tensor
        assert t.data is not None
        if self.base is not None and t.type == self.type and tuple(t.ne) == self.ne and tuple(t.nb) == self.nb:
            offset = t.data - self.base_addr
            if 0 <= offset and offset + self.extent <= self.base.nbytes:
                v = self.view
                self.view = np.ndarray(v.shape, v.dtype, buffer=self.base, offset=offset, strides=v.strides)
                self.data = t.data
                return
        self.set_view(memory.view(t.data, t.type, t.ne, t.nb, t.name))


class CPUPlan:
    """ggml_backend_plan_cpu: the compute functions of a graph's nodes, in order, following moved tensors."""

    __slots__ = ("graph", "computes", "params", "buffers", "n_nodes", "freed", "nodes", "seen", "watch", "datas",
                 "by_id", "runs", "run_nodes")

    def __init__(self, graph: Graph, computes: list[Compute], params: ComputeParams, buffers: list[Buffer],
                 nodes: list[Tensor] | None = None, seen: list[_Seen] | None = None) -> None:
        self.graph = graph
        self.computes = computes
        self.params = params
        self.buffers = buffers  # checked on each compute: a freed buffer must not be written
        self.n_nodes = graph.n_nodes
        self.freed = False
        self.nodes = nodes if nodes is not None else []  # the node of each compute
        self.seen = seen if seen is not None else []
        self.watch = [r.tensor for r in self.seen]
        self.datas = [r.data for r in self.seen]
        self.by_id = {id(r.tensor): r for r in self.seen}
        self.runs, self.run_nodes = group_runs(self.computes, self.nodes, params)

    def __repr__(self) -> str:
        return f"CPUPlan(n_nodes={self.n_nodes}, computes={len(self.computes)}, n_threads={self.params.n_threads})"


def group_runs(computes: list[Compute], nodes: list[Tensor],
               params: ComputeParams) -> tuple[list[Compute], list[list[Tensor]]]:
    """What plan_compute calls, and their nodes: runs of computes with job forms as GraphRuns (DESIGN.md)."""
    runs: list[Compute] = []
    run_nodes: list[list[Tensor]] = []
    steps: list[graph_runner.Step] = []
    written: list[tuple[int, int]] = []
    counts: list[int] = []
    for fn, node in zip(computes, nodes, strict=True):
        form = graph_runner.steps_of(fn) if _joins_runs(node, params) else None
        if steps and (form is None or _reads_written(form, written)):
            runs.append(graph_runner.GraphRun(steps, matmul.POOL, params.n_threads, params.graph_runner, counts))
            steps, written, counts = [], [], []
        if form is None:
            runs.append(fn)
            run_nodes.append([node])
            continue
        if not steps:
            run_nodes.append([])
        steps += form
        counts.append(len(form))
        run_nodes[-1].append(node)
        assert node.data is not None
        written.append((node.data, node.data + nbytes_of(node.type, node.ne, node.nb)))
    if steps:
        runs.append(graph_runner.GraphRun(steps, matmul.POOL, params.n_threads, params.graph_runner, counts))
    return runs, run_nodes


# LEAD's caller computes the other steps alone while the workers spin for their next product: a node of more
# elements (a prompt's) runs from Python, so the workers do not fall asleep inside a run (DESIGN.md)
LEAD_MAX_ELEMENTS = 1 << 16
_PRODUCTS = (GGMLOp.MUL_MAT, GGMLOp.MUL_MAT_ID)


def _joins_runs(node: Tensor, params: ComputeParams) -> bool:
    """Whether the node's job form (if it has one) goes into the graph runner's runs."""
    if params.graph_runner == "off":
        return False
    return (params.graph_runner != graph_runner.LEAD or node.op in _PRODUCTS
            or _elements_written(node) <= LEAD_MAX_ELEMENTS)


def _elements_written(node: Tensor) -> int:
    """The elements a node computes (SET_ROWS: its source's rows, not the KV cache it writes into)."""
    return node.src[0].nelements() if node.op == GGMLOp.SET_ROWS else node.nelements()


def _reads_written(form: tuple[graph_runner.Step, ...], written: list[tuple[int, int]]) -> bool:
    """Whether a step's `reads` (read before the run) overlap bytes the run writes before it."""
    for step in form:
        for a in step.reads:
            lo, hi = np.lib.array_utils.byte_bounds(a)
            if any(lo < end and start < hi for start, end in written):
                return True
    return False


def _prepare(node: Tensor, index: int, view_of: Callable[[Tensor], np.ndarray], params: ComputeParams) -> Compute:
    kernel = KERNELS.get(node.op)
    if kernel is None:
        raise UnsupportedOpError(f"CPU: no kernel for op {node.op.name} (node {index} '{node.name}')")
    try:
        check_sources(node)
        dst = view_of(node)
        srcs = [view_of(s) if s is not None else None for s in node.src]
        return kernel(node, dst, srcs, params)
    except GGMLError as e:
        if f"'{node.name}'" in str(e):
            raise
        raise type(e)(f"CPU {node.op.name} node {index} '{node.name}': {e}") from None


def plan_create(graph: Graph, params: ComputeParams) -> CPUPlan:
    """Prepare every node of `graph` (raises before anything computes if a kernel rejects a node)."""
    seen: dict[int, _Seen] = {}
    buffers: dict[int, Buffer] = {}

    def view_of(t: Tensor) -> np.ndarray:
        r = seen.get(id(t))
        if r is None:
            assert t.data is not None
            buffer = tensor_buffer(t)
            if buffer is not None:
                buffer.check_tensor(t, "CPU graph_compute")
            check_layout(t, "CPU graph_compute")
            r = seen[id(t)] = _Seen(t, memory.view(t.data, t.type, t.ne, t.nb, t.name))
            if buffer is not None:
                buffers[id(buffer)] = buffer
        return r.view

    computes: list[Compute] = []
    nodes: list[Tensor] = []
    for i, node in enumerate(graph.nodes):
        op = node.op
        if op == GGMLOp.NONE or is_view_op(op):
            continue
        check_distinct_elements(node, f"CPU {op.name} node {i}")
        fn = _prepare(node, i, view_of, params)
        if not _is_noop(fn):
            for t in (node, *node.src):
                if t is not None and id(t) in seen:
                    users = seen[id(t)].users
                    if not users or users[-1] != len(computes):
                        users.append(len(computes))
            computes.append(fn)
            nodes.append(node)
    return CPUPlan(graph, computes, params, list(buffers.values()), nodes, list(seen.values()))


def _follow(plan: CPUPlan, datas: list[int | None]) -> None:
    """Prepare again the computes whose tensors moved since the plan prepared them."""
    moved = [plan.seen[i] for i, (now, then) in enumerate(zip(datas, plan.datas, strict=True)) if now != then]
    redo: set[int] = set()
    for r in moved:
        redo.update(r.users)
    # every moved tensor is checked before any is followed: a failed check leaves the plan as it was
    for r in moved:
        t = r.tensor
        if t.data is None:
            raise GraphError(f"graph_plan_compute: tensor '{t.name}' of the plan has no memory any more")
        buffer = tensor_buffer(t)
        if buffer is not None:
            buffer.check_tensor(t, "CPU graph_plan_compute")
        check_layout(t, "CPU graph_plan_compute")
    new_buffers = False
    for r in moved:
        t = r.tensor
        r.follow()
        buffer = tensor_buffer(t)
        if buffer is not r.buffer:
            r.buffer = buffer
            new_buffers = True
    if new_buffers:  # the buffers the plan uses now, for the freed-buffer check
        plan.buffers = list({id(r.buffer): r.buffer for r in plan.seen if r.buffer is not None}.values())
    by_id = plan.by_id
    for i in sorted(redo):
        plan.computes[i] = _prepare(plan.nodes[i], i, lambda t: by_id[id(t)].view, plan.params)
    if redo:
        plan.runs, plan.run_nodes = group_runs(plan.computes, plan.nodes, plan.params)
    plan.datas = datas


def plan_computes(plan: CPUPlan) -> list[Compute]:
    """The computes (group_runs') prepared for the tensors where they are now (an asynchronous backend queues them)."""
    check_plan_buffers(plan.freed, plan.n_nodes, [])  # a freed plan first: its tensors may be gone
    datas = [t.data for t in plan.watch]
    if datas != plan.datas:
        _follow(plan, datas)
    check_plan_buffers(False, plan.n_nodes, plan.buffers)
    return plan.runs


def plan_compute(plan: CPUPlan) -> None:
    """Run the plan's compute functions in order (ggml_graph_compute)."""
    for fn in plan_computes(plan):
        fn()
