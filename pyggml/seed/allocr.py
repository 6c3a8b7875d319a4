"""`Allocr`: the seed's legacy `ggml_allocr`, one tensor allocator and one graph allocator together.

Older ggml code (and llama.cpp of the seed's time) uses this pair: tensors
allocated one by one with `alloc` (inputs, before the graph) and the graph
with `alloc_graph`, both in the same buffer. Every method is a direct call
into `TensorAllocator` or `GraphAllocator`, as in the seed, so bad input raises
their errors (a tensor allocated twice, a full buffer, a graph reading freed
memory); `free` is idempotent and any use after it raises BufferFreedError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.checks import check_instance
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer

if TYPE_CHECKING:
    from pyggml.ggml_backend.backend import Backend


class Allocr:
    """ggml_allocr: a TensorAllocator (`talloc`) and a GraphAllocator (`galloc`) over one buffer."""

    def __init__(self, talloc: TensorAllocator) -> None:
        """ggml_allocr_new_impl: wrap `talloc`, which the Allocr then owns (`free` frees it)."""
        check_instance(talloc, TensorAllocator, "Allocr: talloc")
        self.talloc = talloc
        self.galloc = GraphAllocator()

    # --- constructors ---

    @classmethod
    def new(cls, data: object, size: int, alignment: int) -> Allocr:
        """ggml_allocr_new: over `size` bytes of caller memory (an array or a registered host address)."""
        return cls(TensorAllocator.new(data, size, alignment))

    @classmethod
    def new_measure(cls, alignment: int) -> Allocr:
        """ggml_allocr_new_measure: no memory; `alloc_graph` returns the size a buffer needs."""
        return cls(TensorAllocator.new_measure(alignment))

    @classmethod
    def new_from_buffer(cls, buffer: Buffer) -> Allocr:
        """ggml_allocr_new_from_buffer: over `buffer`, which the caller keeps owning."""
        return cls(TensorAllocator.new_from_buffer(buffer))

    @classmethod
    def new_from_backend(cls, backend: Backend, size: int) -> Allocr:
        """ggml_allocr_new_from_backend: over a new buffer of `backend`, freed with the Allocr."""
        return cls(TensorAllocator.new_from_backend(backend, size))

    @classmethod
    def new_measure_from_backend(cls, backend: Backend) -> Allocr:
        """ggml_allocr_new_measure_from_backend: measures with `backend`'s tensor sizes and alignment."""
        return cls(TensorAllocator.new_measure_from_backend(backend))

    # --- the seed's functions ---

    def get_buffer(self) -> Buffer:
        return self.talloc.get_buffer()

    def set_parse_seq(self, parse_seq: Sequence[int]) -> None:
        self.galloc.set_parse_seq(parse_seq)

    def free(self) -> None:
        """ggml_allocr_free: the graph allocator, and the tensor allocator (with its buffer if it made it)."""
        self.galloc.free()
        self.talloc.free()

    def is_measure(self) -> bool:
        return self.talloc.is_measure()

    def reset(self) -> None:
        """ggml_allocr_reset: every byte free again (before allocating the next graph)."""
        self.talloc.reset()

    def alloc(self, tensor: Tensor) -> None:
        self.talloc.alloc(tensor)

    def max_size(self) -> int:
        return self.talloc.get_max_size()

    def alloc_graph(self, graph: Graph) -> int:
        """ggml_allocr_alloc_graph: returns the tensor allocator's max size (the buffer size when measuring)."""
        return self.galloc.alloc_graph(self.talloc, graph)

    def __repr__(self) -> str:
        return f"Allocr({self.talloc!r})"
