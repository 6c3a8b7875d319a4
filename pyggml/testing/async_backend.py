"""An asynchronous test backend: the CPU kernels behind a per-backend work queue, with events.

A test double of a GPU backend for the scheduler's parallel path (n_copies,
events). Each `AsyncTestBackend` has a device of its own (caps: async,
events) and a buffer type of its own, so the scheduler treats it as another
device. Its memory is host memory (registered numpy arrays, so the CPU
kernels compute on it), but the buffer type says it is not host memory: the
other backends reach it only through `tensor_set`/`tensor_get`/copies, as
they would a GPU's memory.

What is queued and what is not follows ggml:

- `graph_compute_async`, `graph_plan_compute`, `tensor_set_async`,
  `tensor_get_async`, event record and event wait are queued on the
  backend's worker thread and return at once. What a queued item reads and
  writes is fixed when it is queued (the plan's numpy views, the tensor's
  bytes), as a GPU launch takes its pointers: moving a tensor afterwards (a
  new allocation) does not move queued work.
- `synchronize` waits for the queue to drain; `graph_compute` is
  `graph_compute_async` then `synchronize`.
- The buffer's own `tensor_set`/`tensor_get`/copies (`ggml_backend_tensor_set`,
  `ggml_backend_tensor_get`, `ggml_backend_tensor_copy`) are synchronous for
  the bytes but do not wait for queued compute, as ggml's buffer set/get do
  not wait for a backend's stream: the caller synchronizes first.
- An event records a marker in the queue; `event.synchronize()` waits on
  the host for the marker; `event.wait(backend)` queues on `backend` a wait
  for the marker (another backend's queue waits for it).

Holding: after `hold()` the worker runs an item only when something waits
for it (a slow device, as lazy as can be): the backend's `synchronize` lets
it run what is queued, the synchronize of an event recorded on it (or
another queue's wait for one) lets it run up to the event. So work the
scheduler does not wait for stays queued, deterministically, and a test sees
what a missing wait would break; `release()` runs the queue freely again. Every wait
has a timeout (`timeout`, seconds) and raises InvalidStateError when it runs
out, so a test never hangs; an error in queued work is raised by the next
`synchronize`.

Counters: `n_queued_graphs`, `n_done_graphs` (graphs queued, and computed),
`n_event_records`, `n_event_waits` (queued on this backend),
`n_event_syncs` (on the device: events synchronized on the host),
`n_syncs` (synchronize calls).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from pyggml.backends.cpu.buffer import TENSOR_ALIGNMENT, CPUBuffer, cpu_alloc_buffer, host_bytes
from pyggml.backends.cpu.kernels import ComputeParams, WorkArea
from pyggml.backends.cpu.plan import CPUPlan, kernel_supports, plan_computes, plan_create
from pyggml.core.errors import GGMLError, InvalidStateError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceCaps, DeviceType, host_memory
from pyggml.ggml_backend.event import Event

DEFAULT_TIMEOUT = 60.0  # seconds any wait may take before it is taken for a hang

Task = Callable[[], None]


class _Marker:
    """A point in a backend's queue (after item `seq`): `done` is set when the worker reaches it."""

    def __init__(self, backend: AsyncTestBackend, seq: int) -> None:
        self.backend = backend
        self.seq = seq
        self.done = threading.Event()

    def wait(self, timeout: float, what: str) -> None:
        """Wait until the marker is reached (asking a held backend to run up to it)."""
        if not self.done.is_set():
            self.backend.run_up_to(self.seq)
            if not self.done.wait(timeout):
                raise InvalidStateError(f"{what}: backend '{self.backend.name()}' did not reach the marker in "
                                        f"{timeout} s")


class AsyncBufferType(BufferType):
    """The memory of one async test device: host numpy arrays that say they are not host memory."""

    def __init__(self, device: AsyncTestDevice) -> None:
        super().__init__(device)

    def _get_name(self) -> str:
        assert self.device is not None
        return self.device.name()

    def _alloc_buffer(self, size: int) -> Buffer:
        buffer = cpu_alloc_buffer(None, size, self)
        return AsyncBuffer(buffer, self)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _is_host(self) -> bool:
        return False  # device memory to everyone else: reached by copies, never read in place


class AsyncBuffer(CPUBuffer):
    """A buffer of an async test device; its set/get/copy move the bytes at once (not through the queue)."""

    def __init__(self, inner: CPUBuffer, buft: AsyncBufferType) -> None:
        super().__init__(None, inner.array, inner.base, inner.size, owned=True, registered=True, buft=buft)
        self.name = buft.name()

    def _is_host(self) -> bool:
        return False

    def backend_moves_bytes(self) -> bool:
        return False  # ggml_backend_tensor_set/get: the buffer's own synchronous copy, not the backend's queue


class AsyncTestDevice(Device):
    """One async test device: its backend, buffer type and events."""

    def __init__(self, name: str) -> None:
        super().__init__(None)
        self._name = name
        self.buft = AsyncBufferType(self)
        self.n_event_syncs = 0
        self.timeout = DEFAULT_TIMEOUT

    def _get_name(self) -> str:
        return self._name

    def _get_description(self) -> str:
        return f"asynchronous test device {self._name} (CPU kernels on a worker thread)"

    def _get_memory(self) -> tuple[int, int]:
        return host_memory()

    def _get_type(self) -> DeviceType:
        return DeviceType.GPU

    def _get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, events=True)

    def _init_backend(self, params: str | None) -> Backend:
        return AsyncTestBackend(device=self)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _supports_op(self, op: Tensor) -> bool:
        return kernel_supports(op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft

    def _event_new(self) -> Event:
        return Event(self, None)  # context: the _Marker of the last record

    def _event_synchronize(self, event: Event) -> None:
        self.n_event_syncs += 1
        marker = event.context
        assert isinstance(marker, _Marker)
        marker.wait(self.timeout, f"event synchronize of device '{self._name}'")


class AsyncTestBackend(Backend):
    """A backend whose work runs, in order, on a worker thread of its own (see the module docstring)."""

    __test__ = False  # not a pytest test class
    _names = itertools.count()

    def __init__(self, name: str | None = None, device: AsyncTestDevice | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if device is None:
            device = AsyncTestDevice(name if name is not None else f"Async{next(self._names)}")
        super().__init__(device)
        self.device = device
        self.timeout = timeout
        device.timeout = timeout
        self._cond = threading.Condition()
        self._queue: deque[Task] = deque()
        self._n_submitted = 0
        self._n_finished = 0
        self._error: BaseException | None = None
        self._held = False
        self._demand = 0  # while held: items up to this number may run
        self._stop = False
        self.n_queued_graphs = 0
        self.n_done_graphs = 0
        self.n_event_records = 0
        self.n_event_waits = 0
        self.n_syncs = 0
        self._thread = threading.Thread(target=self._run, name=f"{device.name()} worker", daemon=True)
        self._thread.start()

    # --- the queue ---

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not (self._queue and (not self._held or self._n_finished < self._demand)):
                    self._cond.wait()
                if self._stop:
                    return
                task = self._queue.popleft()
            try:
                if self._error is None:  # after an error the queue only drains (a failed stream)
                    task()
            except BaseException as e:  # raised again by the next synchronize
                self._error = e
            with self._cond:
                self._n_finished += 1
                self._cond.notify_all()

    def submit(self, task: Task) -> int:
        """Queue `task` after the work queued so far; its sequence number (1, 2, ...)."""
        self.check_alive()
        with self._cond:
            self._queue.append(task)
            self._n_submitted += 1
            self._cond.notify_all()
            return self._n_submitted

    def hold(self) -> None:
        """From now on run queued work only when something waits for it (a slow device: see the module doc)."""
        with self._cond:
            self._held = True

    def release(self) -> None:
        """Run the queue freely again."""
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def run_up_to(self, seq: int) -> None:
        """Let a held backend run its items up to number `seq` (what a waiter needs)."""
        with self._cond:
            self._demand = max(self._demand, seq)
            self._cond.notify_all()

    @property
    def held(self) -> bool:
        return self._held

    @property
    def n_pending(self) -> int:
        """Queued items not finished yet."""
        with self._cond:
            return self._n_submitted - self._n_finished

    # --- hooks ---

    def _get_name(self) -> str:
        return self.device.name()

    def _free(self) -> None:
        try:
            self._synchronize()
        finally:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._thread.join(self.timeout)

    def _synchronize(self) -> None:
        self.n_syncs += 1
        with self._cond:
            target = self._n_submitted
            if self._n_finished < target:
                self._demand = max(self._demand, target)
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: self._n_finished >= target, self.timeout):
                    raise InvalidStateError(f"backend '{self.name()}': synchronize timed out after {self.timeout} s "
                                            f"({target - self._n_finished} items queued)")
            error, self._error = self._error, None
        if error is not None:
            raise GGMLError(f"backend '{self.name()}': queued work failed: {error}") from error

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        dst = host_bytes(tensor, "tensor_set_async")[offset:offset + size]
        src = np.frombuffer(data, dtype=np.uint8, count=size)  # the caller keeps it alive until synchronize

        def copy() -> None:
            dst[:] = src
        self.submit(copy)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        src = host_bytes(tensor, "tensor_get_async")[offset:offset + size]
        dst = np.frombuffer(data, dtype=np.uint8, count=size)

        def copy() -> None:
            dst[:] = src
        self.submit(copy)

    def _graph_plan_create(self, graph: Graph) -> CPUPlan:
        return plan_create(graph, ComputeParams(n_threads=1, work=WorkArea()))

    def _graph_plan_free(self, plan: CPUPlan) -> None:
        plan.freed = True
        plan.computes = []
        plan.buffers = []

    def _graph_plan_compute(self, plan: CPUPlan) -> None:
        self._queue_computes(list(plan_computes(plan)))

    def _graph_compute(self, graph: Graph) -> None:
        self._queue_computes(list(plan_computes(self._graph_plan_create(graph))))

    def _queue_computes(self, computes: list[Callable[[], None]]) -> None:
        self.n_queued_graphs += 1

        def run() -> None:
            for fn in computes:
                fn()
            self.n_done_graphs += 1
        self.submit(run)

    def _supports_op(self, op: Tensor) -> bool:
        return kernel_supports(op)

    def _event_record(self, event: Event) -> None:
        with self._cond:  # (the marker's number is the next item's)
            marker = _Marker(self, self._n_submitted + 1)
            self.n_event_records += 1
            event.context = marker  # a new record replaces the last one, as cudaEventRecord does
            self.submit(marker.done.set)

    def _event_wait(self, event: Event) -> None:
        marker = event.context
        self.n_event_waits += 1
        if not isinstance(marker, _Marker):  # an event of another kind of device: wait for it on the host
            event.synchronize()
            return
        timeout = self.timeout

        def wait() -> None:
            marker.wait(timeout, f"event wait on backend '{self.name()}'")
        self.submit(wait)


def async_test_init(name: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> AsyncTestBackend:
    """A new async test backend on a device of its own."""
    return AsyncTestBackend(name, timeout=timeout)


__all__ = ["AsyncBuffer", "AsyncBufferType", "AsyncTestBackend", "AsyncTestDevice", "async_test_init"]
