"""The CPU backend (ggml-cpu.cpp's backend part): host memory, kernels, plans, threads, and its settings
`n_threads`, `numerics` and `batch_invariant` (DESIGN.md, "The backend, its plans and its memory")."""

from __future__ import annotations

import logging
import os
from typing import Any

from pyggml.backends.cpu.buffer import (
    TENSOR_ALIGNMENT,
    CPUBuffer,
    cpu_alloc_buffer,
    cpu_buffer_from_ptr,
    host_bytes,
    host_read,
    host_write,
)
from pyggml.backends.cpu.device import CPUBufferType, cpu_device
from pyggml.backends.cpu.kernels import ComputeParams, WorkArea
from pyggml.backends.cpu.numerics import Numerics, resolve_numerics
from pyggml.backends.cpu.plan import CPUPlan, kernel_supports, plan_compute, plan_create
from pyggml.backends.cpu.repack import CPURepackBufferType
from pyggml.core.checks import check_instance, check_int
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, ArgumentTypeError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set

log = logging.getLogger("pyggml.backends.cpu")

GGML_MAX_N_THREADS = 512


def check_n_threads(n_threads: object, what: str) -> int:
    """`n_threads` as an int in [1, GGML_MAX_N_THREADS]: C would truncate 2.5 and spin up 0 or -3 threads."""
    return check_int(n_threads, f"{what}: n_threads", minimum=1, maximum=GGML_MAX_N_THREADS)

# threadpoolctl's BLAS controllers as of the first compute; [] without threadpoolctl
_blas_libs: list[Any] | None = None


def _blas_controllers() -> list[Any]:
    global _blas_libs
    if _blas_libs is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional at run time: BLAS keeps its own default
            log.debug("threadpoolctl is not installed; BLAS thread count left as is")
            _blas_libs = []
        else:
            _blas_libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _blas_libs


def physical_cores(sys_cpu: str = "/sys/devices/system/cpu") -> int:
    """llama.cpp's cpu_get_num_physical_cores: distinct thread-sibling sets, else the logical CPUs halved above 4."""
    siblings: set[bytes] = set()
    cpu = 0
    while True:
        try:
            with open(f"{sys_cpu}/cpu{cpu}/topology/thread_siblings", "rb") as f:
                siblings.add(f.readline().strip())
        except OSError:
            break
        cpu += 1
    if siblings:
        return len(siblings)
    n = os.cpu_count() or 0
    return (n if n <= 4 else n // 2) if n > 0 else 4


def default_n_threads() -> int:
    """The physical cores, as llama.cpp's cpu_get_num_math on machines whose cores are all alike."""
    return max(1, min(physical_cores(), GGML_MAX_N_THREADS))


def set_blas_threads(n_threads: int) -> None:
    """Limit BLAS to `n_threads`, read each time: another package may have changed it, and OpenBLAS's sums follow it."""
    for lib in _blas_controllers():
        if lib.num_threads != n_threads:
            lib.set_num_threads(n_threads)


class CPUBackend(Backend):
    """ggml_backend_cpu: computes with the kernels of `pyggml.backends.cpu.kernels`."""

    def __init__(self, n_threads: int | None = None, numerics: str | None = None,
                 batch_invariant: bool = False) -> None:
        super().__init__(cpu_device())
        device = cpu_device()
        self.buft = CPUBufferType(device, "CPU", owner=self)
        self.mapped_buft = CPUBufferType(device, "CPU_Mapped", owner=self)
        self._n_threads = 1
        self.n_threads = n_threads if n_threads is not None else default_n_threads()
        self.work = WorkArea()  # ggml_backend_cpu_context's work_data, reused by graph_compute
        self._numerics = resolve_numerics(numerics)
        self._batch_invariant = False
        self.batch_invariant = batch_invariant

    @property
    def batch_invariant(self) -> bool:
        """Whether each output element is reduced in one order whatever the batch (see ComputeParams)."""
        return self._batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise ArgumentTypeError(f"CPU backend: batch_invariant must be a bool, got {type(on).__name__}")
        self._batch_invariant = on

    @property
    def numerics(self) -> Numerics:
        """Which of ggml's CPU code paths the kernels follow (see `pyggml.backends.cpu.numerics`)."""
        return self._numerics

    @numerics.setter
    def numerics(self, value: str) -> None:
        self._numerics = resolve_numerics(value)

    def _params(self, work: WorkArea) -> ComputeParams:
        return ComputeParams(n_threads=self.n_threads, work=work, numerics=self._numerics,
                             batch_invariant=self._batch_invariant)

    @property
    def n_threads(self) -> int:
        return self._n_threads

    @n_threads.setter
    def n_threads(self, n_threads: int) -> None:
        self._n_threads = check_n_threads(n_threads, "CPU backend")

    def _get_name(self) -> str:
        return "CPU"

    def _free(self) -> None:
        self.work = WorkArea()

    def _alloc_buffer(self, size: int) -> CPUBuffer:
        return cpu_alloc_buffer(self, size, self.get_default_buffer_type())

    def _get_default_buffer_type(self) -> BufferType:
        return self.buft

    def _host_ptr_buffer_type(self, buft: BufferType | None) -> BufferType | None:
        return self.mapped_buft

    def _supports_buft(self, buft: BufferType) -> bool:
        # its own types, the device's host types and its repack type; not another CPU backend's own
        if isinstance(buft, CPUBufferType) and buft.owner is not None:
            return buft.owner is self
        return buft.is_host() or isinstance(buft, CPURepackBufferType)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        host_write(tensor, data, offset, size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        host_read(tensor, data, offset, size)

    def _cpy_tensor_from(self, src: Tensor, dst: Tensor) -> bool:
        tensor_get(src, host_bytes(dst, "cpy_tensor_from"), 0, src.nbytes())
        return True

    def _cpy_tensor_to(self, src: Tensor, dst: Tensor) -> bool:
        tensor_set(dst, host_bytes(src, "cpy_tensor_to"), 0, src.nbytes())
        return True

    def _graph_plan_create(self, graph: Graph) -> CPUPlan:
        # each plan owns its work area, as ggml_backend_cpu_graph_plan_create allocates cplan.work_data
        return plan_create(graph, self._params(WorkArea()))

    def _graph_plan_free(self, plan: CPUPlan) -> None:
        plan.freed = True
        plan.computes = []
        plan.runs = []
        plan.buffers = []

    def _graph_plan_compute(self, plan: CPUPlan) -> None:
        set_blas_threads(1)  # the kernels' threads share BLAS's work (kernels.matmul)
        plan_compute(plan)

    def _graph_compute(self, graph: Graph) -> None:
        plan = plan_create(graph, self._params(self.work))
        set_blas_threads(1)
        plan_compute(plan)

    def _supports_op(self, op: Tensor) -> bool:
        return kernel_supports(op)

    def _plans_follow_moves(self) -> bool:
        return True  # each compute reads tensors at their `data` of the moment (see plan.py)


def cpu_init(n_threads: int | None = None, numerics: str | None = None, batch_invariant: bool = False) -> CPUBackend:
    """ggml_backend_cpu_init."""
    return CPUBackend(n_threads, numerics, batch_invariant)


def is_cpu(backend: Backend | None) -> bool:
    """ggml_backend_is_cpu."""
    return isinstance(backend, CPUBackend)


def cpu_set_n_threads(backend_cpu: Backend, n_threads: int) -> None:
    """ggml_backend_cpu_set_n_threads: plans made after this use `n_threads` (an int in [1, GGML_MAX_N_THREADS])."""
    check_instance(backend_cpu, Backend, "cpu_set_n_threads: backend_cpu")
    if not is_cpu(backend_cpu):
        raise ArgumentError(f"cpu_set_n_threads: backend '{backend_cpu.name()}' is not the CPU backend")
    n = check_n_threads(n_threads, "cpu_set_n_threads")
    assert isinstance(backend_cpu, CPUBackend)
    backend_cpu.check_alive()
    backend_cpu.n_threads = n


def cpu_set_batch_invariant(backend_cpu: Backend, on: bool) -> None:
    """The registry's "pyggml_backend_set_batch_invariant", for plans made after this (see ComputeParams)."""
    check_instance(backend_cpu, Backend, "cpu_set_batch_invariant: backend_cpu")
    if not is_cpu(backend_cpu):
        raise ArgumentError(f"cpu_set_batch_invariant: backend '{backend_cpu.name()}' is not the CPU backend")
    assert isinstance(backend_cpu, CPUBackend)
    backend_cpu.check_alive()
    backend_cpu.batch_invariant = on


def cpu_backend_buffer_from_ptr(backend_cpu: Backend, ptr: object, size: int) -> CPUBuffer:
    """ggml_backend_cpu_buffer_from_ptr."""
    check_instance(backend_cpu, Backend, "cpu_buffer_from_ptr: backend_cpu")
    if not is_cpu(backend_cpu):
        raise ArgumentError(f"cpu_buffer_from_ptr: backend '{backend_cpu.name()}' is not the CPU backend")
    backend_cpu.check_alive()
    return cpu_buffer_from_ptr(backend_cpu, ptr, size, backend_cpu.mapped_buft)


def graph_compute_with_ctx(ctx: Context, graph: Graph, n_threads: int | None = None) -> None:
    """ggml_graph_compute_with_ctx: a graph whose tensors live in a Context's memory, on a CPU backend."""
    if n_threads is not None:
        n_threads = check_n_threads(n_threads, "graph_compute_with_ctx")
    backend = CPUBackend(n_threads)
    try:
        backend.graph_compute(graph)
    finally:
        backend.free()
