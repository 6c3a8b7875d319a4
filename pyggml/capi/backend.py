"""ggml-backend.h by its C names and argument order, each a thin call into the classes.

Pointers are Python objects: `ggml_backend_t` a `Backend`, `ggml_backend_buffer_t`
a `Buffer`, `ggml_backend_graph_plan_t` a plan object, `void * data` any
buffer-protocol object (numpy arrays included), `void *` results ints.
NULL is None where the C functions accept NULL. Bad arguments raise the
classes' own errors (the same GGMLError subclass and message).
`ggml_backend_buffer_clear` and `ggml_backend_tensor_memset` are not in the
seed: they are ggml's later names.
"""

from __future__ import annotations

from typing import Any

from pyggml.backends import cpu
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend import tensor_io
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, BufferInterface, buffer_init

__all__ = [
    "ggml_backend_buffer_i", "ggml_backend_buffer_init", "ggml_backend_buffer_free",
    "ggml_backend_buffer_get_alignment", "ggml_backend_buffer_get_base", "ggml_backend_buffer_get_size",
    "ggml_backend_buffer_get_alloc_size", "ggml_backend_buffer_init_tensor", "ggml_backend_buffer_free_tensor",
    "ggml_get_backend", "ggml_backend_name", "ggml_backend_free", "ggml_backend_alloc_buffer",
    "ggml_backend_get_alignment", "ggml_backend_tensor_set_async", "ggml_backend_tensor_get_async",
    "ggml_backend_tensor_set", "ggml_backend_tensor_get", "ggml_backend_synchronize",
    "ggml_backend_graph_plan_create", "ggml_backend_graph_plan_free", "ggml_backend_graph_plan_compute",
    "ggml_backend_graph_compute", "ggml_backend_supports_op", "ggml_backend_tensor_copy",
    "ggml_backend_cpu_init", "ggml_backend_is_cpu", "ggml_backend_cpu_set_n_threads",
    "ggml_backend_cpu_buffer_from_ptr", "ggml_graph_compute_with_ctx",
    "ggml_backend_buffer_clear", "ggml_backend_tensor_memset",
]

# struct ggml_backend_buffer_i
ggml_backend_buffer_i = BufferInterface


# --- backend buffer ---


def ggml_backend_buffer_init(backend: Backend | None, iface: Any, context: Any, size: int) -> Buffer:
    return buffer_init(backend, iface, context, size)


def ggml_backend_buffer_free(buffer: Buffer | None) -> None:
    if buffer is None:
        return
    buffer.free()


def ggml_backend_buffer_get_alignment(buffer: Buffer) -> int:
    return buffer.get_alignment()


def ggml_backend_buffer_get_base(buffer: Buffer) -> int:
    return buffer.get_base()


def ggml_backend_buffer_get_size(buffer: Buffer) -> int:
    return buffer.get_size()


def ggml_backend_buffer_get_alloc_size(buffer: Buffer, tensor: Tensor) -> int:
    return buffer.get_alloc_size(tensor)


def ggml_backend_buffer_init_tensor(buffer: Buffer, tensor: Tensor) -> None:
    buffer.init_tensor(tensor)


def ggml_backend_buffer_free_tensor(buffer: Buffer, tensor: Tensor) -> None:
    buffer.free_tensor(tensor)


def ggml_backend_buffer_clear(buffer: Buffer, value: int) -> None:
    buffer.clear(value)


# --- backend ---


def ggml_get_backend(tensor: Tensor) -> Backend | None:
    return tensor_io.get_backend(tensor)


def ggml_backend_name(backend: Backend | None) -> str:
    if backend is None:
        return "NULL"
    return backend.name()


def ggml_backend_free(backend: Backend | None) -> None:
    if backend is None:
        return
    backend.free()


def ggml_backend_alloc_buffer(backend: Backend, size: int) -> Buffer:
    return backend.alloc_buffer(size)


def ggml_backend_get_alignment(backend: Backend) -> int:
    return backend.get_alignment()


def ggml_backend_tensor_set_async(tensor: Tensor, data: object, offset: int, size: int) -> None:
    tensor_io.tensor_set_async(tensor, data, offset, size)


def ggml_backend_tensor_get_async(tensor: Tensor, data: object, offset: int, size: int) -> None:
    tensor_io.tensor_get_async(tensor, data, offset, size)


def ggml_backend_tensor_set(tensor: Tensor, data: object, offset: int, size: int) -> None:
    tensor_io.tensor_set(tensor, data, offset, size)


def ggml_backend_tensor_get(tensor: Tensor, data: object, offset: int, size: int) -> None:
    tensor_io.tensor_get(tensor, data, offset, size)


def ggml_backend_tensor_memset(tensor: Tensor, value: int, offset: int, size: int) -> None:
    tensor_io.tensor_memset(tensor, value, offset, size)


def ggml_backend_synchronize(backend: Backend) -> None:
    backend.synchronize()


def ggml_backend_graph_plan_create(backend: Backend, cgraph: Graph) -> Any:
    return backend.graph_plan_create(cgraph)


def ggml_backend_graph_plan_free(backend: Backend, plan: Any) -> None:
    backend.graph_plan_free(plan)


def ggml_backend_graph_plan_compute(backend: Backend, plan: Any) -> None:
    backend.graph_plan_compute(plan)


def ggml_backend_graph_compute(backend: Backend, cgraph: Graph) -> None:
    backend.graph_compute(cgraph)


def ggml_backend_supports_op(backend: Backend, op: Tensor) -> bool:
    return backend.supports_op(op)


def ggml_backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    tensor_io.tensor_copy(src, dst)


# --- CPU backend ---


def ggml_backend_cpu_init() -> Backend:
    return cpu.cpu_init()


def ggml_backend_is_cpu(backend: Backend) -> bool:
    return cpu.is_cpu(backend)


def ggml_backend_cpu_set_n_threads(backend_cpu: Backend, n_threads: int) -> None:
    cpu.cpu_set_n_threads(backend_cpu, n_threads)


def ggml_backend_cpu_buffer_from_ptr(backend_cpu: Backend, ptr: object, size: int) -> Buffer:
    return cpu.cpu_buffer_from_ptr(backend_cpu, ptr, size)


def ggml_graph_compute_with_ctx(ctx: Context, cgraph: Graph, n_threads: int) -> None:
    cpu.graph_compute_with_ctx(ctx, cgraph, n_threads)
