"""The seed's assignment passes over the engine's state: `BackendSched(backends, assign=assign_backends_seed)`
assigns as `Scheduler` does and splits, allocates and computes as the engine does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import UnsupportedOpError
from pyggml.core.tensor import Tensor
from pyggml.sched.passes import Assigner

if TYPE_CHECKING:
    from pyggml.core.graph import Graph
    from pyggml.sched.backend_sched import BackendSched


def assign_backends_seed(sched: BackendSched, graph: Graph) -> Assigner:
    """The seed's passes (ggml-backend.c of late 2023, as `Scheduler` runs them), over today's
    state: (1) leafs and nodes whose memory, or whose view source's memory, is in a backend's buffer go
    there, else nodes to the backend of their sources with memory (the lowest priority number, then the
    largest); (2) nodes still unassigned take a source's assignment the same way, else the first backend
    that computes them; (3) sources still unassigned take their consumer's. Where it differs from today's:
    no expansion to neighbours, no upgrade to a backend sharing the buffer type, graph inputs are not put on
    the last backend, and weights do not decide before other sources."""
    a = Assigner(sched)
    ids, get = a.ids, a.ids.get

    def buffer_backend(t: Tensor) -> int:
        buffer = t.buffer
        if buffer is None:
            return -1
        for b in range(sched.n_backends):
            if a.supports_buffer(b, buffer):
                return b
        return -1

    def from_sources(node: Tensor, assigned: bool, cause: str) -> int:
        best, best_size = -1, 0
        for j, src in enumerate(node.src):
            if src is None:
                break
            b = get(id(src), -1) if assigned else buffer_backend(src)
            if b != -1 and (best == -1 or b < best):
                size = src.nbytes()
                if size >= best_size and a.supports_op(b, node):
                    best, best_size = b, size
                    a.causes[id(node)] = f"{cause}{j}"
        return best

    for leaf in graph.leafs:
        if get(id(leaf), -1) == -1:
            b = buffer_backend(leaf)
            if b == -1 and leaf.view_src is not None:
                b = buffer_backend(leaf.view_src)
            if b != -1:
                ids[id(leaf)] = b
    nodes = graph.nodes
    for node in nodes:
        if get(id(node), -1) != -1:
            continue
        b = buffer_backend(node)
        if b != -1:
            a.set(node, b, "1.dst")
            continue
        if node.view_src is not None:
            b = buffer_backend(node.view_src)
            if b != -1:
                a.set(node, b, "1.vsrc")
                continue
        b = from_sources(node, False, "1.src")
        if b != -1:
            ids[id(node)] = b
    for node in nodes:
        if get(id(node), -1) != -1:
            continue
        b = from_sources(node, True, "2.src")
        if b == -1:
            b = next((c for c in range(sched.n_backends) if a.supports_op(c, node)), -1)
            if b == -1:
                names = ", ".join(f"'{x.name()}'" for x in sched.backends)
                raise UnsupportedOpError(f"none of the scheduler's backends ({names}) supports node "
                                         f"{sched.describe_node(node)}")
            a.causes[id(node)] = "2.prio"
        ids[id(node)] = b
    for node in nodes:
        cur = get(id(node), -1)
        for src in node.src:
            if src is None:
                break
            if get(id(src), -1) == -1:
                ids[id(src)] = cur
    return a
