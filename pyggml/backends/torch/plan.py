"""Torch graph plans: each node's kernel prepared once (views, shapes, policy), computed many times.

`plan_create` walks the graph's nodes, skips those with nothing to compute
(views, NONE), notes the byte ranges the computing nodes write (per buffer,
merged), and asks each node's kernel for its compute function.
`plan_compute` calls those functions in order, then tells the weight cache
which bytes changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from pyggml.backends.torch.buffer import TorchBuffer
from pyggml.backends.torch.kernels import KERNELS, Compute, is_noop
from pyggml.core.errors import ArgumentError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op, nbytes_of
from pyggml.ggml_backend.buffer import check_plan_buffers, tensor_buffer

if TYPE_CHECKING:
    from pyggml.backends.torch.backend import TorchBackend

Intervals = list[tuple[int, int]]


class TorchPlan:
    """The compute functions of a graph's nodes, in order, and the byte ranges they write."""

    __slots__ = ("graph", "backend", "computes", "buffers", "writes", "n_nodes", "freed")

    def __init__(self, graph: Graph, backend: TorchBackend, computes: list[Compute], buffers: list[TorchBuffer],
                 writes: list[tuple[TorchBuffer, Intervals]]) -> None:
        self.graph = graph
        self.backend = backend
        self.computes = computes
        self.buffers = buffers  # checked on each compute: a freed buffer must not be written
        self.writes = writes
        self.n_nodes = graph.n_nodes
        self.freed = False

    def __repr__(self) -> str:
        return f"TorchPlan(n_nodes={self.n_nodes}, computes={len(self.computes)}, backend={self.backend.name()})"


def _merge(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _computes(node: Tensor) -> bool:
    return not (node.op == GGMLOp.NONE or is_view_op(node.op))


class _Context:
    """The PlanContext kernels get: views of tensors in this backend's memory, written ranges, cached weights."""

    def __init__(self, backend: TorchBackend, graph: Graph) -> None:
        self.backend = backend
        self.views: dict[int, torch.Tensor] = {}
        self.buffers: dict[int, TorchBuffer] = {}
        writes: dict[int, Intervals] = {}
        for node in graph.nodes:
            if _computes(node):
                buffer, start, end = self.locate(node)
                writes.setdefault(id(buffer), []).append((start, end))
        self.writes = {k: _merge(v) for k, v in writes.items()}

    def buffer_of(self, t: Tensor) -> TorchBuffer:
        if t.data is None:
            raise NotAllocatedError(f"torch backend '{self.backend.name()}': tensor '{t.name}' is not allocated")
        buffer = tensor_buffer(t)
        if not isinstance(buffer, TorchBuffer) or buffer.device != self.backend.device:
            where = f"buffer '{buffer.name}'" if buffer is not None else "no backend buffer"
            raise ArgumentError(
                f"torch backend '{self.backend.name()}': tensor '{t.name}' is in {where}, not in "
                f"{self.backend.device} memory of a torch backend; copy it there first (the scheduler does)"
            )
        self.buffers[id(buffer)] = buffer
        return buffer

    def locate(self, t: Tensor) -> tuple[TorchBuffer, int, int]:
        """t's buffer and byte range [start, end) from the buffer's base."""
        buffer = self.buffer_of(t)
        assert t.data is not None
        nbytes = t.nbytes()
        start = buffer.check_range(t.data, nbytes, t.name)
        return buffer, start, start + nbytes

    def view(self, t: Tensor) -> torch.Tensor:
        v = self.views.get(id(t))
        if v is None:
            v = self.buffer_of(t).tensor_view(t)
            self.views[id(t)] = v
        return v

    def written_by_plan(self, t: Tensor) -> bool:
        buffer, start, end = self.locate(t)
        return any(s < end and start < e for s, e in self.writes.get(id(buffer), ()))

    def derived(self, t: Tensor, dtype: torch.dtype, make: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """A function giving `make()` (a conversion of t's bytes to `dtype`), cached while those bytes stay."""
        if self.written_by_plan(t):
            return make
        buffer, start, end = self.locate(t)
        key = (id(buffer), start, int(t.type), tuple(t.ne), tuple(t.nb), dtype)
        cache = self.backend.weight_cache

        def cached() -> torch.Tensor:
            return cache.get(key, buffer, start, end, make)

        return cached

    def derived_matrices(self, t: Tensor, dtype: torch.dtype, make: Callable[[int], torch.Tensor]
                         ) -> Callable[[int], torch.Tensor]:
        """A function giving matrix i2 (along dim 2) of t converted to `dtype` (`make(i2)`), each matrix cached on its
        own while its bytes stay (MUL_MAT_ID converts the experts its ids pick, not all)."""
        if self.written_by_plan(t):
            return make
        buffer, start, _ = self.locate(t)
        ne, nb = t.ne, t.nb
        size = nbytes_of(t.type, [ne[0], ne[1], 1, 1], nb)  # the bytes of one matrix
        cache = self.backend.weight_cache

        def matrix(i2: int) -> torch.Tensor:
            first = start + i2 * nb[2]
            return cache.get((id(buffer), first, int(t.type), (ne[0], ne[1]), (nb[0], nb[1]), dtype), buffer, first,
                             first + size, functools.partial(make, i2))

        return matrix


def plan_create(backend: TorchBackend, graph: Graph) -> TorchPlan:
    """Prepare every node of `graph` (raises before anything computes if a kernel rejects a node)."""
    pc = _Context(backend, graph)
    computes: list[Compute] = []
    for i, node in enumerate(graph.nodes):
        if not _computes(node):
            continue
        kernel = KERNELS.get(node.op)
        if kernel is None:
            raise UnsupportedOpError(f"{backend.name()}: no kernel for op {node.op.name} (node {i} '{node.name}')")
        fn = kernel(node, pc)
        if not is_noop(fn):
            computes.append(fn)
    writes = [(pc.buffers[k], v) for k, v in pc.writes.items()]
    return TorchPlan(graph, backend, computes, list(pc.buffers.values()), writes)


def plan_compute(plan: TorchPlan) -> None:
    """Run the plan's compute functions in order, then forget cached conversions of the bytes written."""
    check_plan_buffers(plan.freed, plan.n_nodes, plan.buffers)
    plan.backend.apply_n_threads()
    for fn in plan.computes:
        fn()
    for buffer, intervals in plan.writes:
        buffer.note_writes(intervals)  # every torch backend's weight cache forgets what it derived from them
