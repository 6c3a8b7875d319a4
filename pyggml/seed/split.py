"""`Split`: the seed's `struct ggml_backend_sched_split`, a run of nodes computed on one backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor

if TYPE_CHECKING:
    from pyggml.alloc.tensor_allocator import TensorAllocator
    from pyggml.ggml_backend.backend import Backend


@dataclass(eq=False)
class Split:
    """Nodes `i_start` .. `i_end` (exclusive) of the graph, computed on the backend of `tallocr`.

    `inputs` are the tensors of other backends the split reads; each is copied
    into this backend before the split runs. `graph` is the view of the graph
    that the backend computes (set once the graph is split).
    """

    tallocr: TensorAllocator | None
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)
    graph: Graph | None = None

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    @property
    def backend(self) -> Backend | None:
        """The backend of the split's allocator (the seed's ggml_tallocr_get_buffer(tallocr)->backend)."""
        if self.tallocr is None:
            return None
        return self.tallocr.get_buffer().backend

    def __repr__(self) -> str:
        backend = self.backend
        name = backend.name() if backend is not None else "NULL"
        inputs = ", ".join(t.name for t in self.inputs)
        return f"Split({name}, nodes {self.i_start}..{self.i_end}, inputs [{inputs}])"
