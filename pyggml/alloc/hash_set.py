"""`HashSet`: ggml's `ggml_hash_set`, tensors indexed by identity.

The graph allocator keys its per-tensor counts (`hash_node`) and, in
`alloc_graph_n`, the per-tensor allocator map by the slot that
`find_or_insert` gives a tensor. The scheduler builds one of these over a
graph and passes it with a list of allocators indexed by slot, as
`ggml_gallocr_alloc_graph_n` takes a `ggml_hash_set` and a `ggml_tallocr_t *`.

This is the core's graph hash set (`pyggml.core.graph.HashSet`, which keeps
its keys alive so that `id()`s stay unique) with a lookup without insertion,
`find`.
"""

from __future__ import annotations

from pyggml.core.graph import HashSet as _CoreHashSet
from pyggml.core.graph import hash_size
from pyggml.core.tensor import Tensor

__all__ = ["HashSet", "hash_size"]


class HashSet(_CoreHashSet):
    """ggml_hash_set: a stable slot in [0, size) per tensor, by identity (not by value).

    `find_or_insert(t)` returns t's slot, inserting it if needed (raises
    GraphError when `size` tensors are already there, where the seed asserts);
    `find(t)` returns the slot or None; `size` is the capacity.
    """

    @classmethod
    def for_graph(cls, n_tensors: int) -> HashSet:
        """A set sized as ggml sizes a graph's: ggml_hash_size(2 * n_tensors)."""
        return cls(hash_size(2 * n_tensors))

    def find(self, t: Tensor) -> int | None:
        """ggml_hash_find without insertion: t's slot, or None if t is not in the set."""
        return self.keys.get(id(t))

    def tensors(self) -> list[Tensor]:
        """The keys in slot order (slot i holds tensors()[i])."""
        return list(self._tensors)
