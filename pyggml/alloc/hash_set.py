"""`HashSet`: ggml's `ggml_hash_set` as the graph allocator keys it: the core's graph hash set plus `find`."""

from __future__ import annotations

from pyggml.core.graph import HashSet as _CoreHashSet
from pyggml.core.graph import hash_size
from pyggml.core.tensor import Tensor

__all__ = ["HashSet", "hash_size"]


class HashSet(_CoreHashSet):
    """ggml_hash_set: a stable slot in [0, size) per tensor, by identity; full: GraphError (ggml asserts)."""

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
