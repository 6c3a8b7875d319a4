"""CPU graph plans: each node's kernel prepared once, computed many times.

`plan_create` walks the graph's nodes, skips those with nothing to compute
(view ops, NONE, as ggml's compute loop does cheaply), makes numpy views of
each node's destination and sources, and asks the node's kernel for its
compute function. `plan_compute` only calls those functions in order, so the
Python cost per node is one call plus whatever the kernel does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from pyggml.backend.buffer import Buffer, tensor_buffer
from pyggml.backends.cpu import kernels
from pyggml.backends.cpu.kernels import KERNELS, Compute, ComputeParams, _common
from pyggml.core import memory
from pyggml.core.errors import BufferFreedError, GraphError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op

Supports = Callable[[Tensor], bool]

_supports_cache: dict[GGMLOp, Supports | None] = {}


def kernel_supports(node: Tensor) -> bool:
    """Whether the CPU kernels compute `node`: its op has a kernel, and the kernel's module
    (if it exposes `supports(node)`) accepts the node's types and parameters."""
    op = node.op
    if op == GGMLOp.NONE or is_view_op(op):
        return True
    kernel = KERNELS.get(op)
    if kernel is None:
        return False
    if op not in _supports_cache:
        module = sys.modules.get(getattr(kernel, "__module__", "") or "")
        _supports_cache[op] = getattr(module, "supports", None)
    supports = _supports_cache[op]
    return True if supports is None else bool(supports(node))


def _is_noop(fn: Compute) -> bool:
    """The kernels' do-nothing compute functions (views, empty tensors): not worth a call per compute."""
    return fn is kernels._noop or fn is _common.noop


class CPUPlan:
    """ggml_backend_plan_cpu: the compute functions of a graph's nodes, in order."""

    __slots__ = ("graph", "computes", "params", "buffers", "n_nodes", "freed")

    def __init__(self, graph: Graph, computes: list[Compute], params: ComputeParams, buffers: list[Buffer]) -> None:
        self.graph = graph
        self.computes = computes
        self.params = params
        self.buffers = buffers  # checked on each compute: a freed buffer must not be written
        self.n_nodes = graph.n_nodes
        self.freed = False

    def __repr__(self) -> str:
        return f"CPUPlan(n_nodes={self.n_nodes}, computes={len(self.computes)}, n_threads={self.params.n_threads})"


def plan_create(graph: Graph, params: ComputeParams) -> CPUPlan:
    """Prepare every node of `graph` (raises before anything computes if a kernel rejects a node)."""
    views: dict[int, np.ndarray] = {}
    buffers: dict[int, Buffer] = {}

    def view_of(t: Tensor) -> np.ndarray:
        v = views.get(id(t))
        if v is None:
            assert t.data is not None
            v = memory.view(t.data, t.type, t.ne, t.nb, t.name)
            views[id(t)] = v
            buffer = tensor_buffer(t)
            if buffer is not None:
                buffers[id(buffer)] = buffer
        return v

    computes: list[Compute] = []
    for i, node in enumerate(graph.nodes):
        op = node.op
        if op == GGMLOp.NONE or is_view_op(op):
            continue
        kernel = KERNELS.get(op)
        if kernel is None:
            raise UnsupportedOpError(f"CPU: no kernel for op {op.name} (node {i} '{node.name}')")
        dst = view_of(node)
        srcs = [view_of(s) if s is not None else None for s in node.src]
        fn = kernel(node, dst, srcs, params)
        if not _is_noop(fn):
            computes.append(fn)
    return CPUPlan(graph, computes, params, list(buffers.values()))


def plan_compute(plan: CPUPlan) -> None:
    """Run the plan's compute functions in order (ggml_graph_compute)."""
    if plan.freed:
        raise GraphError(f"graph_plan_compute: the plan of {plan.n_nodes} nodes was freed")
    for buffer in plan.buffers:
        if buffer.freed:
            raise BufferFreedError(
                f"graph_plan_compute: buffer '{buffer.name}' ({buffer.size} bytes) used by the plan was freed"
            )
    for fn in plan.computes:
        fn()
