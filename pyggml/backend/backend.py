"""`Backend`: ggml's `ggml_backend`, something that holds memory and computes graphs.

Public methods are the seed's `ggml_backend_*` functions; the `_`-prefixed
methods are the hooks of `ggml_backend_i` that a backend overrides. Required
hooks: `_get_name`, `_alloc_buffer`, `_get_alignment`, `_set_tensor_async`,
`_get_tensor_async`, `_graph_compute`, `_supports_op`. Optional hooks keep the
seed's defaults: `_synchronize` does nothing, `_cpy_tensor_from` and
`_cpy_tensor_to` return False (not handled: the copy goes through host
memory), plans default to remembering the graph and computing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.errors import BufferFreedError
from pyggml.core.tensor import Tensor

if TYPE_CHECKING:
    from pyggml.backend.buffer import Buffer
    from pyggml.core.graph import Graph


class Backend:
    """A compute backend. Subclasses implement the hooks; users call the public methods."""

    def __init__(self) -> None:
        self.freed = False

    # --- hooks (ggml_backend_i) ---

    def _get_name(self) -> str:
        raise NotImplementedError

    def _free(self) -> None:
        """Release what the backend holds (optional)."""

    def _alloc_buffer(self, size: int) -> Buffer:
        raise NotImplementedError

    def _get_alignment(self) -> int:
        raise NotImplementedError

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        raise NotImplementedError

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        raise NotImplementedError

    def _synchronize(self) -> None:
        """Wait for queued work (optional: synchronous backends have none)."""

    def _cpy_tensor_from(self, src: Tensor, dst: Tensor) -> bool:
        """Copy `src` (another backend's) into `dst` (ours); False if not handled (optional)."""
        return False

    def _cpy_tensor_to(self, src: Tensor, dst: Tensor) -> bool:
        """Copy `src` (ours) into `dst` (another backend's); False if not handled (optional)."""
        return False

    def _graph_plan_create(self, graph: Graph) -> Any:
        """Precompute what `graph` needs (optional: the plan is the graph itself)."""
        return graph

    def _graph_plan_free(self, plan: Any) -> None:
        """Release a plan (optional)."""

    def _graph_plan_compute(self, plan: Any) -> None:
        """Run a plan (optional: computes the graph the default plan holds)."""
        self._graph_compute(plan)

    def _graph_compute(self, graph: Graph) -> None:
        raise NotImplementedError

    def _supports_op(self, op: Tensor) -> bool:
        raise NotImplementedError

    # --- ggml_backend_* ---

    def check_alive(self) -> None:
        if self.freed:
            raise BufferFreedError(f"backend '{self._get_name()}' was used after it was freed")

    def name(self) -> str:
        return self._get_name()

    def free(self) -> None:
        if self.freed:
            return
        self._free()
        self.freed = True

    def get_alignment(self) -> int:
        return self._get_alignment()

    def alloc_buffer(self, size: int) -> Buffer:
        """ggml_backend_alloc_buffer: a new buffer of `size` bytes."""
        self.check_alive()
        if size < 0:
            from pyggml.core.errors import ArgumentError

            raise ArgumentError(f"backend '{self.name()}': cannot allocate a buffer of {size} bytes")
        return self._alloc_buffer(int(size))

    def synchronize(self) -> None:
        self.check_alive()
        self._synchronize()

    def supports_op(self, op: Tensor) -> bool:
        return self._supports_op(op)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"
