"""`Backend`: ggml's `ggml_backend` (ggml-backend-impl.h's ggml_backend_i, ggml-backend.cpp's wrappers).

Public methods are ggml's `ggml_backend_*`; `_`-prefixed methods are the hooks a backend overrides, and an
optional hook's body is its default (ggml's NULL entry). The public graph functions check the whole graph first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, BufferFreedError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op
from pyggml.ggml_backend.buffer import Buffer, tensor_buffer
from pyggml.ggml_backend.buffer_type import BufferType, check_max_size

if TYPE_CHECKING:
    from pyggml.ggml_backend.device import Device
    from pyggml.ggml_backend.event import Event


def op_desc(node: Tensor) -> str:
    """The op's name as ggml_op_desc gives it (UNARY and GLU show their function)."""
    if node.op in (GGMLOp.UNARY, GGMLOp.GLU):
        from pyggml.core.tensor import GLUOp, UnaryOp

        code = node.get_op_params_i32(0)
        try:
            return UnaryOp(code).name if node.op == GGMLOp.UNARY else GLUOp(code).name
        except ValueError:
            return f"{node.op.name}({code})"
    return node.op.name


def _who(node: Tensor, i: int, t: Tensor, j: int) -> str:
    """Names tensor `t` (j = 0: the node itself, else src[j - 1]) of node `i` for an error message."""
    if j == 0:
        return f"node {i} '{node.name}' ({op_desc(node)})"
    return f"'{t.name}', src[{j - 1}] of node {i} '{node.name}' ({op_desc(node)}),"


class Backend:
    """A compute backend. Subclasses implement the hooks; users call the public methods."""

    def __init__(self, device: Device | None = None) -> None:
        self.freed = False
        self._device = device
        self._default_buft: BufferType | None = None

    # --- hooks (ggml_backend_i) ---

    def _get_name(self) -> str:
        raise NotImplementedError

    def _free(self) -> None:
        ...

    def _alloc_buffer(self, size: int) -> Buffer:
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _alloc_buffer")
        return self.get_default_buffer_type().alloc_buffer(size)

    def _get_alignment(self) -> int:
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _get_alignment")
        return self.get_default_buffer_type().get_alignment()

    def _get_default_buffer_type(self) -> BufferType:
        if self._device is not None:
            return self._device.buffer_type()
        if self._default_buft is None:
            self._default_buft = BackendBufferType(self)
        return self._default_buft

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """`data` (1-D bytes) into the tensor from `offset`, checked already; default: the buffer's `_set_tensor`."""
        _buffer_with_own_io(self, tensor, "_set_tensor_async", "_set_tensor")._set_tensor(tensor, data, offset, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        _buffer_with_own_io(self, tensor, "_get_tensor_async", "_get_tensor")._get_tensor(tensor, data, offset, size)

    def _synchronize(self) -> None:
        ...

    def _cpy_tensor_from(self, src: Tensor, dst: Tensor) -> bool:
        """Copy another backend's `src` into our `dst`; False: not handled, the copy goes through the host."""
        return False

    def _cpy_tensor_to(self, src: Tensor, dst: Tensor) -> bool:
        return False

    def _graph_plan_create(self, graph: Graph) -> Any:
        return graph

    def _graph_plan_free(self, plan: Any) -> None:
        ...

    def _graph_plan_compute(self, plan: Any) -> None:
        self._graph_compute(plan)

    def _graph_compute(self, graph: Graph) -> None:
        """Required; may return before the work is done (`_synchronize` waits for it)."""
        raise NotImplementedError

    def _supports_op(self, op: Tensor) -> bool:
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _supports_op")
        return self._device.supports_op(op)

    def _event_record(self, event: Event) -> None:
        """Default: a synchronous backend has done all its work."""
        self._synchronize()

    def _event_wait(self, event: Event) -> None:
        event.synchronize()

    def _plans_follow_moves(self) -> bool:
        return False

    def _io_ordered(self) -> bool:
        return False

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
        """ggml_backend_free; freeing twice is harmless, any other use after it raises BufferFreedError."""
        if self.freed:
            return
        self._free()
        self.freed = True

    def get_alignment(self) -> int:
        return self._get_alignment()

    def get_device(self) -> Device | None:
        return self._device

    def get_default_buffer_type(self) -> BufferType:
        buft = self._get_default_buffer_type()
        check_instance(buft, BufferType, f"backend '{self.name()}': default buffer type")
        return buft

    def get_max_size(self) -> int:
        return self.get_default_buffer_type().get_max_size()

    def alloc_buffer(self, size: int) -> Buffer:
        self.check_alive()
        size = check_int(size, f"backend '{self.name()}': alloc_buffer: size")
        if size < 0:
            raise ArgumentError(f"backend '{self.name()}': cannot allocate a buffer of {size} bytes")
        buft = self.get_default_buffer_type()
        check_max_size(buft, size, f"backend '{self.name()}': alloc_buffer")
        buffer = self._alloc_buffer(size)
        check_instance(buffer, Buffer, f"backend '{self.name()}': alloc_buffer's result")
        if buffer.buft is None:
            buffer.buft = buft
        if buffer.backend is None:
            buffer.backend = self
            buffer.name = self.name()
        return buffer

    def buffer_from_host_ptr(self, ptr: object, size: int, max_tensor_size: int = 0) -> Buffer:
        """The device's buffer over host memory at `ptr` (never freed by it), as ggml_backend_cpu_buffer_from_ptr."""
        self.check_alive()
        if self._device is None:
            raise UnsupportedOpError(f"backend '{self.name()}' has no device to make buffers over host memory")
        buffer = self._device.buffer_from_host_ptr(ptr, size, max_tensor_size)
        buffer.buft = self._host_ptr_buffer_type(buffer.buft)
        buffer.backend = self
        buffer.name = self.name()
        return buffer

    def supports_buft(self, buft: BufferType) -> bool:
        check_instance(buft, BufferType, f"backend '{self.name()}': supports_buft: buft")
        return bool(self._supports_buft(buft))

    def _host_ptr_buffer_type(self, buft: BufferType | None) -> BufferType | None:
        return buft

    def _supports_buft(self, buft: BufferType) -> bool:
        if self._device is not None:
            return self._device.supports_buft(buft)
        return buft is self.get_default_buffer_type()

    @property
    def has_offload_op(self) -> bool:
        return self._device is not None and self._device.has_offload_op

    def offload_op(self, op: Tensor) -> bool:
        """ggml_backend_offload_op: whether this backend wants `op` although its weights are elsewhere."""
        check_instance(op, Tensor, f"backend '{self.name()}': offload_op: op")
        return self._device.offload_op(op) if self._device is not None else False

    def plans_follow_moves(self) -> bool:
        """Whether a plan reads each tensor's `data` when it runs (a moved tensor needs no new plan)."""
        return bool(self._plans_follow_moves())

    def io_ordered(self) -> bool:
        """Whether tensor reads and writes queue behind earlier work (an RPC server's), so copies need no
        `synchronize` first."""
        return bool(self._io_ordered())

    def synchronize(self) -> None:
        self.check_alive()
        self._synchronize()

    def supports_op(self, op: Tensor) -> bool:
        if not isinstance(op, Tensor):  # hot: the scheduler asks for every node
            check_instance(op, Tensor, f"backend '{self.name()}': supports_op: op")
        return bool(self._supports_op(op))

    def graph_plan_create(self, graph: Graph) -> Any:
        self.check_alive()
        check_instance(graph, Graph, f"backend '{self.name()}': graph_plan_create: graph")
        self.check_graph(graph, "graph_plan_create")
        return self._graph_plan_create(graph)

    def graph_plan_free(self, plan: Any) -> None:
        self._graph_plan_free(plan)

    def graph_plan_compute(self, plan: Any) -> None:
        """ggml_backend_graph_plan_compute: unchecked (the plan was checked when made)."""
        self.check_alive()
        self._graph_plan_compute(plan)

    def graph_compute(self, graph: Graph) -> None:
        self.graph_compute_async(graph)
        self._synchronize()

    def graph_compute_async(self, graph: Graph) -> None:
        self.check_alive()
        check_instance(graph, Graph, f"backend '{self.name()}': graph_compute: graph")
        self.check_graph(graph, "graph_compute")
        self._graph_compute(graph)

    def check_graph(self, graph: Graph, what: str = "graph_compute") -> None:
        """Raise before anything runs unless every node and source is allocated in a live buffer, and supported."""
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


def _buffer_with_own_io(backend: Backend, tensor: Tensor, hook: str, buffer_hook: str) -> Buffer:
    """The tensor's buffer if it implements `buffer_hook`, else NotImplementedError."""
    buffer = tensor_buffer(tensor)
    if buffer is None or getattr(type(buffer), buffer_hook) is getattr(Buffer, buffer_hook):
        where = f"its buffer '{buffer.name}'" if buffer is not None else "no buffer"
        raise NotImplementedError(f"backend '{backend.name()}' implements neither {hook} nor, in {where}, "
                                  f"{buffer_hook} (tensor '{tensor.name}')")
    return buffer


class BackendBufferType(BufferType):
    """The buffer type of a backend without a device, from its `_alloc_buffer` and `_get_alignment`."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(None)
        self.backend = backend
        self._host: bool | None = None

    def _get_name(self) -> str:
        return self.backend.name()

    def _alloc_buffer(self, size: int) -> Buffer:
        self.backend.check_alive()
        return self.backend._alloc_buffer(size)

    def _get_alignment(self) -> int:
        return self.backend._get_alignment()

    def _is_host(self) -> bool:
        if self._host is None:
            probe = self.backend._alloc_buffer(1)
            try:
                self._host = bool(probe.is_host())
            finally:
                probe.free()
        return self._host
