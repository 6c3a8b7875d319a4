"""The RPC server's fallback: a received graph computed in steps, the nodes its backend lacks on the host CPU.

A client (llama.cpp's RPC backend claims every op) may send nodes the served backend does not compute. The
graph is cut into runs of consecutive nodes: a run the served backend computes is one graph plan of it, as
without fallback; a run it lacks is computed by the scheduler (`pyggml.sched`) over the served backend and
the host CPU. Each lacking node n gets a stand-in n' of n's type and layout in a host buffer of the run's own
(so the CPU computes it); the scheduler copies what n' reads from the served memory, and after the run each n'
is copied into n's bytes, in node order, before any later node reads them. A node that writes into existing
memory (a view: SET_ROWS, CPY, in-place ops) has its stand-in filled with n's bytes first.

A host run ends before a node that reads bytes an earlier node of the run writes other than through its own
sources (the KV cache a SET_ROWS fills, read through another view of the cache): those bytes are right only
once the run's results are copied back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.errors import LimitExceededError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, nbytes_of
from pyggml.core.work import WorkBudget
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_copy
from pyggml.sched.backend_sched import BackendSched

Span = tuple[int, int, int]  # (id of the buffer, first byte, one past the last)


def span(t: Tensor) -> Span | None:
    """The bytes `t` covers in its buffer, or None for a tensor without memory yet."""
    buffer = t.view_src.buffer if t.view_src is not None and t.buffer is None else t.buffer
    if buffer is None or t.data is None:
        return None
    return id(buffer), t.data, t.data + nbytes_of(t.type, t.ne, t.nb)


def overlaps(s: Span | None, written: list[Span]) -> bool:
    """Whether span s shares bytes with any of `written` (None: no memory, no overlap)."""
    return s is not None and any(s[0] == w[0] and s[1] < w[2] and w[1] < s[2] for w in written)


def stand_in(node: Tensor, replaced: dict[int, Tensor], leafs: dict[int, Tensor]) -> Tensor:
    """A tensor computing `node`'s op into memory of its own: n's type, shape and strides; its sources are the
    stand-ins of earlier nodes of the run (`replaced`) or leafs over the served memory (`leafs`, made here)."""
    t = Tensor(None, node.type, list(node.ne), list(node.nb))
    t.op = node.op
    t.op_params[:] = node.op_params
    t.name = node.name
    t.src = [None if s is None else replaced.get(id(s)) or _leaf(s, leafs) for s in node.src]
    return t


def _leaf(t: Tensor, leafs: dict[int, Tensor]) -> Tensor:
    """`t`'s bytes as a plain tensor (no op, no view): what the scheduler assigns by its buffer and copies."""
    leaf = leafs.get(id(t))
    if leaf is None:
        leaf = leafs[id(t)] = Tensor(None, t.type, list(t.ne), list(t.nb))
        leaf.buffer = t.buffer if t.buffer is not None or t.view_src is None else t.view_src.buffer
        leaf.data = t.data
        leaf.name = t.name
    return leaf


@dataclass
class ServedRun:
    """Nodes the served backend computes, as one graph plan of it."""

    backend: Backend
    graph: Graph
    plan: object

    def compute(self) -> None:
        self.backend.graph_plan_compute(self.plan)

    def free(self) -> None:
        self.backend.graph_plan_free(self.plan)


@dataclass
class HostRun:
    """Nodes the served backend lacks: their stand-ins on the host CPU through the scheduler."""

    sched: BackendSched
    graph: Graph
    buffer: Buffer  # the stand-ins' memory
    prefill: list[tuple[Tensor, Tensor]]  # (node, stand-in) of the nodes writing into existing memory
    results: list[tuple[Tensor, Tensor]]  # (stand-in, node) of every node, in node order

    def compute(self) -> None:
        for node, s in self.prefill:
            tensor_copy(node, s)
        self.sched.graph_compute(self.graph)
        for s, node in self.results:
            tensor_copy(s, node)

    def free(self) -> None:
        self.sched.free()
        self.buffer.free()


Step = ServedRun | HostRun


@dataclass
class FallbackPlan:
    """A received graph as steps; `lacking` are the nodes computed on the host, `temp_bytes` the most the host
    runs hold (stand-ins and the scheduler's copies, counted against the server's limits)."""

    steps: list[Step] = field(default_factory=list)
    lacking: list[Tensor] = field(default_factory=list)
    temp_bytes: int = 0

    def compute(self) -> None:
        for step in self.steps:
            step.compute()

    def free(self) -> None:
        for step in self.steps:
            step.free()
        self.steps = []


def aligned_bytes(tensors: list[Tensor], alignment: int) -> int:
    """The bytes of `tensors`, each rounded up to `alignment`."""
    return sum(-(-nbytes_of(t.type, t.ne, t.nb) // alignment) * alignment for t in tensors)


def plan_fallback(nodes: list[Tensor], served: Backend, host: Callable[[], Backend], budget: WorkBudget,
                  room: int | None) -> FallbackPlan:
    """`nodes` (allocated in the served backend's memory) as steps; `host()` gives the CPU backend when a node
    needs it. LimitExceededError when the host runs' memory passes the budget's temporaries or `room`."""
    plan = FallbackPlan()
    runs: list[tuple[bool, list[Tensor]]] = []
    written: list[Span] = []
    for node in nodes:
        lacking = not served.supports_op(node)
        if lacking:
            reads = [span(s) for s in node.src if s is not None]
            if node.view_src is not None:
                reads.append(span(node))
            if not runs or not runs[-1][0] or any(overlaps(s, written) for s in reads):
                runs.append((True, []))
                written = []
            s = span(node)
            if s is not None:
                written.append(s)
            plan.lacking.append(node)
        elif not runs or runs[-1][0]:
            runs.append((False, []))
        runs[-1][1].append(node)
    try:
        for on_host, run in runs:
            if on_host:
                plan.steps.append(_host_run(run, served, host(), budget, room, plan))
            else:
                graph = _graph(run)
                plan.steps.append(ServedRun(served, graph, served.graph_plan_create(graph)))
    except BaseException:
        plan.free()
        raise
    return plan


def _graph(nodes: list[Tensor]) -> Graph:
    graph = Graph(max(len(nodes), 1))
    graph.nodes = nodes
    return graph


def _host_run(run: list[Tensor], served: Backend, cpu: Backend, budget: WorkBudget, room: int | None,
              plan: FallbackPlan) -> HostRun:
    replaced: dict[int, Tensor] = {}
    leafs: dict[int, Tensor] = {}
    prefill: list[tuple[Tensor, Tensor]] = []
    results: list[tuple[Tensor, Tensor]] = []
    for node in run:
        s = replaced[id(node)] = stand_in(node, replaced, leafs)
        if node.view_src is not None:
            prefill.append((node, s))
        results.append((s, node))
    stand_ins = [s for s, _ in results]
    own = aligned_bytes(stand_ins, cpu.get_alignment())
    need = own + aligned_bytes(list(leafs.values()), cpu.get_alignment())  # and the scheduler's copies at most
    plan.temp_bytes = max(plan.temp_bytes, need)
    limit = budget.temp_bytes if room is None else min(budget.temp_bytes, room)
    if plan.temp_bytes > limit:
        raise LimitExceededError(f"the nodes '{served.name()}' lacks ({', '.join(n.name for n in run[:4])}"
                                 f"{', ...' if len(run) > 4 else ''}) need {need} bytes on the host, more than the "
                                 f"{limit} bytes a graph's temporaries may hold")
    buffer = cpu.alloc_buffer(max(own, 1))
    sched = BackendSched([served, cpu])
    try:
        talloc = TensorAllocator.new_from_buffer(buffer)
        for s in stand_ins:
            talloc.alloc(s)
        graph = _graph(stand_ins)
        graph.leafs = list(leafs.values())
        sched.alloc_graph(graph)
    except BaseException:
        sched.free()
        buffer.free()
        raise
    return HostRun(sched, graph, buffer, prefill, results)


__all__ = ["FallbackPlan", "HostRun", "ServedRun", "aligned_bytes", "plan_fallback", "span", "stand_in"]
