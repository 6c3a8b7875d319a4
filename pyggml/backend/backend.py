"""`Backend`: ggml's `ggml_backend`, something that holds memory and computes graphs.

Public methods are the seed's `ggml_backend_*` functions; the `_`-prefixed
methods are the hooks of `ggml_backend_i` that a backend overrides. Required
hooks: `_get_name`, `_alloc_buffer`, `_get_alignment`, `_set_tensor_async`,
`_get_tensor_async`, `_graph_compute`, `_supports_op`. Optional hooks keep the
seed's defaults: `_synchronize` does nothing, `_cpy_tensor_from` and
`_cpy_tensor_to` return False (not handled: the copy goes through host
memory), plans default to remembering the graph and computing it.

The public graph functions check the whole graph before anything runs (every
tensor allocated, no freed buffer, every op supported), so a backend's hooks
only see graphs they can compute; `graph_plan_compute` does no checks of its
own beyond the backend being alive, to stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, BufferFreedError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op

if TYPE_CHECKING:
    from pyggml.backend.buffer import Buffer


def op_desc(node: Tensor) -> str:
    """The op's name as ggml_op_desc gives it (UNARY shows its function)."""
    if node.op == GGMLOp.UNARY:
        from pyggml.core.tensor import UnaryOp

        code = node.get_op_params_i32(0)
        try:
            return UnaryOp(code).name
        except ValueError:
            return f"UNARY({code})"
    return node.op.name


def _who(node: Tensor, i: int, t: Tensor, j: int) -> str:
    """Names tensor `t` (j = 0: the node itself, else src[j - 1]) of node `i` for an error message."""
    if j == 0:
        return f"node {i} '{node.name}' ({op_desc(node)})"
    return f"'{t.name}', src[{j - 1}] of node {i} '{node.name}' ({op_desc(node)}),"


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
        """Copy `size` bytes of `data` (1-D, format 'B') to the tensor's bytes from `offset` (checked already)."""
        raise NotImplementedError

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Copy `size` bytes of the tensor from `offset` into `data` (1-D, writable, format 'B')."""
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

    def describe(self) -> str:
        """The choices the backend made from its options and the hardware, in words ("" when it made none)."""
        return ""

    def free(self) -> None:
        """ggml_backend_free. Idempotent: the first call releases, later calls do nothing; any other
        use afterwards raises BufferFreedError naming the backend."""
        if self.freed:
            return
        self._free()
        self.freed = True

    def get_alignment(self) -> int:
        return self._get_alignment()

    def alloc_buffer(self, size: int) -> Buffer:
        """ggml_backend_alloc_buffer: a new buffer of `size` bytes (an int >= 0)."""
        self.check_alive()
        size = check_int(size, f"backend '{self.name()}': alloc_buffer: size")
        if size < 0:
            raise ArgumentError(f"backend '{self.name()}': cannot allocate a buffer of {size} bytes")
        return self._alloc_buffer(size)

    def synchronize(self) -> None:
        self.check_alive()
        self._synchronize()

    def supports_op(self, op: Tensor) -> bool:
        """ggml_backend_supports_op: whether this backend can compute node `op`."""
        check_instance(op, Tensor, f"backend '{self.name()}': supports_op: op")
        return bool(self._supports_op(op))

    def graph_plan_create(self, graph: Graph) -> Any:
        """ggml_backend_graph_plan_create: check `graph` and precompute it for `graph_plan_compute`."""
        self.check_alive()
        check_instance(graph, Graph, f"backend '{self.name()}': graph_plan_create: graph")
        self.check_graph(graph, "graph_plan_create")
        return self._graph_plan_create(graph)

    def graph_plan_free(self, plan: Any) -> None:
        self._graph_plan_free(plan)

    def graph_plan_compute(self, plan: Any) -> None:
        """ggml_backend_graph_plan_compute: run a plan (checked when it was made)."""
        self.check_alive()
        self._graph_plan_compute(plan)

    def graph_compute(self, graph: Graph) -> None:
        """ggml_backend_graph_compute: check `graph`, then compute every node in order."""
        self.check_alive()
        check_instance(graph, Graph, f"backend '{self.name()}': graph_compute: graph")
        self.check_graph(graph, "graph_compute")
        self._graph_compute(graph)

    def check_graph(self, graph: Graph, what: str = "graph_compute") -> None:
        """Raise before anything runs unless every node can be computed here.

        Every node and source must have memory (NotAllocatedError) in a buffer
        that is not freed (BufferFreedError), and every node that computes
        (not a view, not NONE) must be supported (UnsupportedOpError).
        """
        for i, node in enumerate(graph.nodes):
            j = 0
            for t in (node, *node.src):
                if t is not None:
                    if t.data is None:
                        raise NotAllocatedError(f"{what} on '{self.name()}': {_who(node, i, t, j)} is not allocated")
                    buffer = t.buffer if t.buffer is not None or t.view_src is None else t.view_src.buffer
                    if buffer is not None and buffer.freed:
                        raise BufferFreedError(
                            f"{what} on '{self.name()}': {_who(node, i, t, j)} is in buffer '{buffer.name}' "
                            f"({buffer.size} bytes), which was freed"
                        )
                j += 1
            if node.op == GGMLOp.NONE or is_view_op(node.op):
                continue
            if not self._supports_op(node):
                types = ", ".join(f"{s.name}:{s.type.name}" for s in node.src if s is not None)
                raise UnsupportedOpError(
                    f"{what}: backend '{self.name()}' does not support op {op_desc(node)} of node {i} "
                    f"'{node.name}' ({node.type.name}{list(node.ne)}; sources {types or 'none'})"
                )

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"
