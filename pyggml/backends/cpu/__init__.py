"""The CPU backend: host memory in aligned numpy arrays, one kernel per op, plans, threads; its registry,
device and buffer types (found by the entry point `pyggml.backends: cpu`)."""

from pyggml.backends.cpu.backend import (
    CPUBackend,
    cpu_init,
    cpu_set_n_threads,
    graph_compute_with_ctx,
    is_cpu,
    set_blas_threads,
)
from pyggml.backends.cpu.backend import cpu_backend_buffer_from_ptr as cpu_buffer_from_ptr
from pyggml.backends.cpu.buffer import TENSOR_ALIGNMENT, CPUBuffer
from pyggml.backends.cpu.device import CPUBufferType, CPUDevice, CPUReg, cpu_buffer_type, cpu_device, cpu_reg
from pyggml.backends.cpu.plan import CPUPlan, kernel_supports

__all__ = ["TENSOR_ALIGNMENT", "CPUBackend", "CPUBuffer", "CPUBufferType", "CPUDevice", "CPUPlan", "CPUReg",
           "cpu_buffer_from_ptr", "cpu_buffer_type", "cpu_device", "cpu_init", "cpu_reg", "cpu_set_n_threads",
           "graph_compute_with_ctx", "is_cpu", "kernel_supports", "set_blas_threads"]
