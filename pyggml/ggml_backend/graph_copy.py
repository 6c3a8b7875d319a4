"""Copying an allocated graph to another backend: ggml_backend_graph_copy, ggml_backend_compare_graph_backend."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyggml.core.checks import check_instance
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError, NotAllocatedError
from pyggml.core.graph import Graph, graph_overhead
from pyggml.core.tensor import Tensor, is_view_op
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_alloc import tensor_alloc, view_init
from pyggml.ggml_backend.tensor_io import tensor_copy


@dataclass
class GraphCopy:
    """ggml's `struct ggml_backend_graph_copy`."""

    buffer: Buffer
    ctx_allocated: Context
    ctx_unallocated: Context
    graph: Graph

    def free(self) -> None:
        self.buffer.free()
        self.ctx_allocated.free()
        self.ctx_unallocated.free()


def _reachable(graph: Graph) -> list[Tensor]:
    """Every tensor the nodes reach through sources and view sources, each after what it points to."""
    order: list[Tensor] = []
    done: set[int] = set()
    for node in graph.nodes:
        stack: list[tuple[Tensor, bool]] = [(node, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in done:
                continue
            if expanded:
                done.add(id(t))
                order.append(t)
                continue
            if t.data is None:
                raise NotAllocatedError(f"graph_copy: '{t.name}' is not allocated (the graph must be allocated)")
            stack.append((t, True))
            for s in (t.view_src, *t.src):
                if s is not None and id(s) not in done:
                    stack.append((s, False))
    return order


def _dup(ctx: Context, src: Tensor, copies: dict[int, Tensor]) -> Tensor:
    """graph_copy_dup_tensor: `src`'s layout, op, parameters, flags, name; its sources are their copies."""
    dst = ctx.dup_tensor(src)
    dst.nb = list(src.nb)
    if src.view_src is not None:
        dst.view_src = copies[id(src.view_src)]
        dst.view_offs = src.view_offs
    dst.op = src.op
    dst.flags = src.flags
    dst.op_params = src.op_params.copy()
    dst.set_name(src.name)
    for i, s in enumerate(src.src):
        if s is not None:
            dst.src[i] = copies[id(s)]
    return dst


def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """ggml_backend_graph_copy: `graph` and the tensors it reaches, copied to a new buffer of `backend`."""
    check_instance(backend, Backend, "graph_copy: backend")
    check_instance(graph, Graph, "graph_copy: graph")
    backend.check_alive()
    tensors = _reachable(graph)
    mem_size = tensor_overhead() * (len(tensors) + 1) + graph_overhead(graph.size)
    ctx_allocated = Context(mem_size=mem_size, no_alloc=True)
    ctx_unallocated = Context(mem_size=mem_size, no_alloc=True)
    buffer: Buffer | None = None
    try:
        copies: dict[int, Tensor] = {}
        for t in tensors:
            copies[id(t)] = _dup(ctx_unallocated if t.view_src is not None else ctx_allocated, t, copies)
        buft = backend.get_default_buffer_type()
        align = buft.get_alignment()
        owners = [copies[id(t)] for t in tensors if t.view_src is None]
        sizes = [-(-buft.get_alloc_size(t) // align) * align for t in owners]
        buffer = backend.alloc_buffer(sum(sizes))
        addr = buffer.get_base()
        for t, size in zip(owners, sizes, strict=True):
            tensor_alloc(buffer, t, addr)
            addr += size
        for t in tensors:
            if t.view_src is None:
                tensor_copy(t, copies[id(t)])
            else:
                view_init(copies[id(t)])
        copy = ctx_allocated.new_graph(graph.size)
        copy.nodes = [copies[id(n)] for n in graph.nodes]
        copy.leafs = [copies[id(t)] for t in graph.leafs if id(t) in copies]
    except BaseException:
        if buffer is not None:
            buffer.free()
        ctx_allocated.free()
        ctx_unallocated.free()
        raise
    return GraphCopy(buffer, ctx_allocated, ctx_unallocated, copy)


EvalCallback = Callable[[int, Tensor, Tensor], bool]


def compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph, callback: EvalCallback,
                          test_nodes: Sequence[Tensor] = ()) -> bool:
    """ggml_backend_compare_graph_backend: `callback(i, t1, t2)` after each computing node (False stops), or with
    `test_nodes` after both whole graphs on the nodes named; True (where ggml returns False, this raises)."""
    check_instance(backend1, Backend, "compare_graph_backend: backend1")
    if not callable(callback):
        raise ArgumentError(f"compare_graph_backend: callback must be callable, got {type(callback).__name__}")
    copy = graph_copy(backend2, graph)
    try:
        g1, g2 = graph, copy.graph
        if test_nodes:
            backend1.graph_compute(g1)
            backend2.graph_compute(g2)
            wanted = {id(t) for t in test_nodes}
            found = [i for i, node in enumerate(g1.nodes) if id(node) in wanted]
            if not found:
                raise ArgumentError("compare_graph_backend: none of test_nodes is a node of the graph")
            for i in found:
                callback(i, g1.nodes[i], g2.nodes[i])
        else:
            for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes, strict=True)):
                backend1.graph_compute(g1.view(i, i + 1))
                backend2.graph_compute(g2.view(i, i + 1))
                if is_view_op(t1.op):
                    continue
                if not callback(i, t1, t2):
                    break
    finally:
        copy.free()
    return True
