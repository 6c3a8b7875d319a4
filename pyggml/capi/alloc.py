"""ggml-alloc.h by its C names and argument order, each a thin call into the allocator classes.

`ggml_tallocr_t` is a `TensorAllocator`, `ggml_gallocr_t` a `GraphAllocator`,
`ggml_allocr_t` an `Allocr`, `struct ggml_hash_set` a `HashSet`, and
`ggml_tallocr_t * hash_node_alloct` a list indexed by hash-set slot.
`(const int * list, int n)` is any sequence of ints (the first n are used).
Freeing NULL (None) does nothing, as in C. Bad arguments raise the classes'
own errors (the same GGMLError subclass and message). The seed's static
helpers are here too (`ggml_tallocr_is_own`, `ggml_tallocr_free_tensor`, the
`_impl`s), so C code ported line by line finds every name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import InvalidStateError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.seed.allocr import Allocr

__all__ = [
    "ggml_tallocr_new", "ggml_tallocr_new_measure", "ggml_tallocr_new_from_buffer", "ggml_tallocr_new_from_backend",
    "ggml_tallocr_new_measure_from_backend", "ggml_tallocr_get_buffer", "ggml_tallocr_free",
    "ggml_tallocr_is_measure", "ggml_tallocr_reset", "ggml_tallocr_alloc", "ggml_tallocr_max_size",
    "ggml_tallocr_is_own", "ggml_tallocr_free_tensor", "ggml_tallocr_alloc_graph_impl",
    "ggml_gallocr_new", "ggml_gallocr_free", "ggml_gallocr_set_parse_seq", "ggml_gallocr_alloc_graph",
    "ggml_gallocr_alloc_graph_n",
    "ggml_allocr_new", "ggml_allocr_new_measure", "ggml_allocr_new_from_buffer", "ggml_allocr_new_from_backend",
    "ggml_allocr_new_measure_from_backend", "ggml_allocr_new_impl", "ggml_allocr_get_buffer",
    "ggml_allocr_set_parse_seq", "ggml_allocr_free", "ggml_allocr_is_measure", "ggml_allocr_reset",
    "ggml_allocr_alloc", "ggml_allocr_max_size", "ggml_allocr_alloc_graph",
]


def _seq(list_: Sequence[int], n: int | None) -> list[int]:
    """The first `n` entries of `list_` (all if None), which must hold at least n."""
    if n is None:
        return list(list_)
    n = check_int(n, "parse_seq: n", minimum=0, maximum=len(list_))
    return list(list_[:n])


# --- tensor allocator ---


def ggml_tallocr_new(data: object, size: int, alignment: int) -> TensorAllocator:
    return TensorAllocator.new(data, size, alignment)


def ggml_tallocr_new_measure(alignment: int) -> TensorAllocator:
    return TensorAllocator.new_measure(alignment)


def ggml_tallocr_new_from_buffer(buffer: Buffer) -> TensorAllocator:
    return TensorAllocator.new_from_buffer(buffer)


def ggml_tallocr_new_from_backend(backend: Backend, size: int) -> TensorAllocator:
    return TensorAllocator.new_from_backend(backend, size)


def ggml_tallocr_new_measure_from_backend(backend: Backend) -> TensorAllocator:
    return TensorAllocator.new_measure_from_backend(backend)


def ggml_tallocr_get_buffer(alloc: TensorAllocator) -> Buffer:
    return alloc.get_buffer()


def ggml_tallocr_free(alloc: TensorAllocator | None) -> None:
    if alloc is None:
        return
    alloc.free()


def ggml_tallocr_is_measure(alloc: TensorAllocator) -> bool:
    return alloc.is_measure()


def ggml_tallocr_reset(alloc: TensorAllocator) -> None:
    alloc.reset()


def ggml_tallocr_alloc(alloc: TensorAllocator, tensor: Tensor) -> None:
    alloc.alloc(tensor)


def ggml_tallocr_max_size(alloc: TensorAllocator) -> int:
    return alloc.get_max_size()


def ggml_tallocr_is_own(alloc: TensorAllocator, tensor: Tensor) -> bool:
    return alloc.is_own(tensor)


def ggml_tallocr_free_tensor(alloc: TensorAllocator, tensor: Tensor) -> None:
    alloc.free_tensor(tensor)


def ggml_tallocr_alloc_graph_impl(galloc: GraphAllocator, gf: Graph) -> None:
    """The static pass over a graph; the allocator(s) must be set on `galloc` (talloc or hash_allocs)."""
    check_instance(galloc, GraphAllocator, "ggml_tallocr_alloc_graph_impl: galloc")
    check_instance(gf, Graph, "ggml_tallocr_alloc_graph_impl: graph")
    if galloc.hash_set is None or (galloc.talloc is None and galloc.hash_allocs is None):
        raise InvalidStateError("ggml_tallocr_alloc_graph_impl: the graph allocator has no pass in progress (no "
                                "tensor allocator or hash set set); call ggml_gallocr_alloc_graph")
    galloc._alloc_graph_impl(gf)


# --- graph allocator ---


def ggml_gallocr_new() -> GraphAllocator:
    return GraphAllocator()


def ggml_gallocr_free(galloc: GraphAllocator | None) -> None:
    if galloc is None:
        return
    galloc.free()


def ggml_gallocr_set_parse_seq(galloc: GraphAllocator, list_: Sequence[int], n: int | None = None) -> None:
    galloc.set_parse_seq(_seq(list_, n))


def ggml_gallocr_alloc_graph(galloc: GraphAllocator, talloc: TensorAllocator, graph: Graph) -> int:
    return galloc.alloc_graph(talloc, graph)


def ggml_gallocr_alloc_graph_n(galloc: GraphAllocator, graph: Graph, hash_set: Any, hash_node_alloct: Any) -> None:
    galloc.alloc_graph_n(graph, hash_set, hash_node_alloct)


# --- legacy API wrapper ---


def ggml_allocr_new_impl(talloc: TensorAllocator) -> Allocr:
    return Allocr(talloc)


def ggml_allocr_new(data: object, size: int, alignment: int) -> Allocr:
    return Allocr.new(data, size, alignment)


def ggml_allocr_new_measure(alignment: int) -> Allocr:
    return Allocr.new_measure(alignment)


def ggml_allocr_new_from_buffer(buffer: Buffer) -> Allocr:
    return Allocr.new_from_buffer(buffer)


def ggml_allocr_new_from_backend(backend: Backend, size: int) -> Allocr:
    return Allocr.new_from_backend(backend, size)


def ggml_allocr_new_measure_from_backend(backend: Backend) -> Allocr:
    return Allocr.new_measure_from_backend(backend)


def ggml_allocr_get_buffer(alloc: Allocr) -> Buffer:
    return alloc.get_buffer()


def ggml_allocr_set_parse_seq(alloc: Allocr, list_: Sequence[int], n: int | None = None) -> None:
    alloc.set_parse_seq(_seq(list_, n))


def ggml_allocr_free(alloc: Allocr | None) -> None:
    if alloc is None:
        return
    alloc.free()


def ggml_allocr_is_measure(alloc: Allocr) -> bool:
    return alloc.is_measure()


def ggml_allocr_reset(alloc: Allocr) -> None:
    alloc.reset()


def ggml_allocr_alloc(alloc: Allocr, tensor: Tensor) -> None:
    alloc.alloc(tensor)


def ggml_allocr_max_size(alloc: Allocr) -> int:
    return alloc.max_size()


def ggml_allocr_alloc_graph(alloc: Allocr, graph: Graph) -> int:
    return alloc.alloc_graph(graph)
