"""`Backend`: ggml's `ggml_backend`, something that holds memory and computes graphs.

Public methods are ggml's `ggml_backend_*` functions; the `_`-prefixed
methods are the hooks of `ggml_backend_i` that a backend overrides. Required
hooks: `_get_name`, `_graph_compute`, and, for a backend without a device,
`_alloc_buffer`, `_get_alignment`, `_supports_op` and
either `_set_tensor_async`/`_get_tensor_async` or its buffers' `_set_tensor`/
`_get_tensor`. A backend of a device (`Backend(device)`, see
`pyggml.backend.device`) gets those from the device and its buffer type.
Optional hooks default as ggml's NULL entries: `_synchronize` does nothing,
`_cpy_tensor_from` and `_cpy_tensor_to` return False (not handled: the copy
goes through host memory), plans default to remembering the graph and
computing it; events recorded on a synchronous backend are
complete at once (`_event_record` synchronizes, `_event_wait` waits on the
host), plans do not follow tensors that move (`_plans_follow_moves`), tensor reads and writes are
not ordered after queued work (`_io_ordered`).

Buffers: `alloc_buffer` gives a buffer of the default buffer type
(`get_default_buffer_type()`: the device's, or for a backend without a device
one made from its `_alloc_buffer` and `_get_alignment`) that belongs to this
backend (`buffer.backend`).

Computing is asynchronous where the backend is, as in ggml: `_graph_compute`
and plan computes may queue the work and return; `graph_compute_async` is the
public form of that, and `graph_compute` is `graph_compute_async` then
`synchronize`.

The public graph functions check the whole graph before anything runs (every
tensor allocated, no freed buffer, every op supported), so a backend's hooks
only see graphs they can compute; `graph_plan_compute` does no checks of its
own beyond the backend being alive, to stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyggml.backend.buffer import Buffer, tensor_buffer
from pyggml.backend.buffer_type import BufferType, check_max_size
from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, BufferFreedError, NotAllocatedError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op

if TYPE_CHECKING:
    from pyggml.backend.device import Device
    from pyggml.backend.event import Event


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

    def __init__(self, device: Device | None = None) -> None:
        self.freed = False
        self._device = device
        self._default_buft: BufferType | None = None  # made once, for a backend without a device

    # --- hooks (ggml_backend_i) ---

    def _get_name(self) -> str:
        raise NotImplementedError

    def _free(self) -> None:
        """Release what the backend holds (optional)."""

    def _alloc_buffer(self, size: int) -> Buffer:
        """A new buffer of `size` bytes (optional for a backend of a device: one of its default buffer type)."""
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _alloc_buffer")
        return self.get_default_buffer_type().alloc_buffer(size)

    def _get_alignment(self) -> int:
        """Optional for a backend of a device: its default buffer type's alignment."""
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _get_alignment")
        return self.get_default_buffer_type().get_alignment()

    def _get_default_buffer_type(self) -> BufferType:
        """The buffer type `alloc_buffer` allocates (optional: the device's; without a device, one made from
        `_alloc_buffer` and `_get_alignment`)."""
        if self._device is not None:
            return self._device.buffer_type()
        if self._default_buft is None:
            self._default_buft = BackendBufferType(self)
        return self._default_buft

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Copy `size` bytes of `data` (1-D, format 'B') to the tensor's bytes from `offset` (checked already).

        Optional when the backend's buffers implement `_set_tensor`: then it is done at once, through them.
        """
        _buffer_with_own_io(self, tensor, "_set_tensor_async", "_set_tensor")._set_tensor(tensor, data, offset, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        """Copy `size` bytes of the tensor from `offset` into `data` (1-D, writable, format 'B').

        Optional when the backend's buffers implement `_get_tensor`.
        """
        _buffer_with_own_io(self, tensor, "_get_tensor_async", "_get_tensor")._get_tensor(tensor, data, offset, size)

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
        """Compute `graph` (ggml's iface graph_compute, which is asynchronous: a backend with a queue may
        return before the work is done, and `_synchronize` waits for it)."""
        raise NotImplementedError

    def _supports_op(self, op: Tensor) -> bool:
        """Optional for a backend of a device: the device's answer."""
        if self._device is None:
            raise NotImplementedError(f"{type(self).__name__} has no device and does not implement _supports_op")
        return self._device.supports_op(op)

    def _event_record(self, event: Event) -> None:
        """Record `event` after the work queued so far (optional: a synchronous backend has done it all)."""
        self._synchronize()

    def _event_wait(self, event: Event) -> None:
        """Run the next work after `event` completes (optional: wait for it on the host)."""
        event.synchronize()

    def _plans_follow_moves(self) -> bool:
        """Whether a plan computes every tensor where its `data` is when the plan runs (optional: False, plans
        may hold on to where tensors were when they were made)."""
        return False

    def _io_ordered(self) -> bool:
        """Whether writing and reading this backend's tensors happen after the work queued on it before, and a
        write has taken its bytes when it returns (optional: False)."""
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
        """ggml_backend_free. Idempotent: the first call releases, later calls do nothing; any other
        use afterwards raises BufferFreedError naming the backend."""
        if self.freed:
            return
        self._free()
        self.freed = True

    def get_alignment(self) -> int:
        return self._get_alignment()

    def get_device(self) -> Device | None:
        """ggml_backend_get_device: the device of this backend (None for a backend made without one)."""
        return self._device

    def get_default_buffer_type(self) -> BufferType:
        """ggml_backend_get_default_buffer_type: the buffer type `alloc_buffer` allocates."""
        buft = self._get_default_buffer_type()
        check_instance(buft, BufferType, f"backend '{self.name()}': default buffer type")
        return buft

    def get_max_size(self) -> int:
        """ggml_backend_get_max_size: the largest buffer `alloc_buffer` allocates."""
        return self.get_default_buffer_type().get_max_size()

    def alloc_buffer(self, size: int) -> Buffer:
        """ggml_backend_alloc_buffer: a new buffer of `size` bytes (an int >= 0, at most `get_max_size()`) of the
        default buffer type, belonging to this backend."""
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
            buffer.backend = self  # buffer->backend: computed with and written through here
            buffer.name = self.name()
        return buffer

    def buffer_from_host_ptr(self, ptr: object, size: int, max_tensor_size: int = 0) -> Buffer:
        """A buffer of this backend over `size` bytes of host memory at `ptr`, which it never frees: the
        device's `buffer_from_host_ptr` (UnsupportedOpError where the device cannot), belonging to this
        backend as `ggml_backend_cpu_buffer_from_ptr(backend_cpu, ptr, size)` makes it."""
        self.check_alive()
        if self._device is None:
            raise UnsupportedOpError(f"backend '{self.name()}' has no device to make buffers over host memory")
        buffer = self._device.buffer_from_host_ptr(ptr, size, max_tensor_size)
        buffer.buft = self._host_ptr_buffer_type(buffer.buft)
        buffer.backend = self
        buffer.name = self.name()
        return buffer

    def supports_buft(self, buft: BufferType) -> bool:
        """ggml_backend_supports_buft: whether this backend computes with tensors in buffers of `buft` (the
        device's answer; without a device, only its own default type)."""
        check_instance(buft, BufferType, f"backend '{self.name()}': supports_buft: buft")
        return bool(self._supports_buft(buft))

    def _host_ptr_buffer_type(self, buft: BufferType | None) -> BufferType | None:
        """Hook: the buffer type of this backend's buffers over host memory (default: the device's, `buft`)."""
        return buft

    def _supports_buft(self, buft: BufferType) -> bool:
        """Hook of `supports_buft`: the device's answer (without a device, only the default type)."""
        if self._device is not None:
            return self._device.supports_buft(buft)
        return buft is self.get_default_buffer_type()

    @property
    def has_offload_op(self) -> bool:
        """Whether `offload_op` can answer True for some op (its device has the hook)."""
        return self._device is not None and self._device.has_offload_op

    def offload_op(self, op: Tensor) -> bool:
        """ggml_backend_offload_op: whether this backend wants `op` although its weights are elsewhere."""
        check_instance(op, Tensor, f"backend '{self.name()}': offload_op: op")
        return self._device.offload_op(op) if self._device is not None else False

    def plans_follow_moves(self) -> bool:
        """Whether a plan of this backend computes each tensor at its `data` of the moment it runs, so a
        tensor moved after `graph_plan_create` (a KV cache write advanced a cell) needs no new plan."""
        return bool(self._plans_follow_moves())

    def io_ordered(self) -> bool:
        """Whether tensor writes and reads of this backend are ordered after the work queued on it before (one
        in-order queue, as an RPC server serves its commands in order), and a write has taken its bytes when
        it returns: copying into or out of its tensors then needs no `synchronize` first (where that costs a
        round trip, the scheduler skips it)."""
        return bool(self._io_ordered())

    def synchronize(self) -> None:
        self.check_alive()
        self._synchronize()

    def supports_op(self, op: Tensor) -> bool:
        """ggml_backend_supports_op: whether this backend can compute node `op`."""
        if not isinstance(op, Tensor):  # (the message only then: the scheduler asks this for every node)
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
        """ggml_backend_graph_compute: check `graph`, then compute every node in order; returns when done
        (`graph_compute_async`, then `synchronize`, as ggml)."""
        self.graph_compute_async(graph)
        self._synchronize()

    def graph_compute_async(self, graph: Graph) -> None:
        """ggml_backend_graph_compute_async: check `graph` and hand it to the backend, which may return
        before it is computed (an asynchronous backend queues it; `synchronize` waits for it)."""
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


def _buffer_with_own_io(backend: Backend, tensor: Tensor, hook: str, buffer_hook: str) -> Buffer:
    """The tensor's buffer, when its class implements `buffer_hook` (the default data hooks of a backend
    use it); NotImplementedError when neither the backend nor the buffer implements the transfer."""
    buffer = tensor_buffer(tensor)
    if buffer is None or getattr(type(buffer), buffer_hook) is getattr(Buffer, buffer_hook):
        where = f"its buffer '{buffer.name}'" if buffer is not None else "no buffer"
        raise NotImplementedError(f"backend '{backend.name()}' implements neither {hook} nor, in {where}, "
                                  f"{buffer_hook} (tensor '{tensor.name}')")
    return buffer


class BackendBufferType(BufferType):
    """The buffer type of a backend without a device: allocates through the backend's
    `_alloc_buffer`, aligns as its `_get_alignment` says, and is host memory if a 1-byte buffer of
    the backend is (asked once)."""

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
