"""ggml-backend.h by its C names: buffer types, buffer usage, devices, registries, events, loading,
graph copies; each a thin call into the classes.

Pointers are Python objects (`ggml_backend_dev_t` a `Device`, `ggml_backend_reg_t` a `Reg`,
`ggml_backend_buffer_type_t` a `BufferType`, `ggml_backend_event_t` an `Event`). Out-parameters become
results: `ggml_backend_dev_memory(dev)` returns (free, total), `ggml_backend_dev_get_props(dev)` the
props. Where C returns NULL for "none" (a name not found, a device without events, a load that failed)
these return None; bad arguments raise the classes' errors.
`ggml_backend_buffer_clear` and `ggml_backend_tensor_memset` are in `pyggml.capi.backend`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyggml.alloc import ctx_tensors
from pyggml.backends.cpu import device as cpu_device
from pyggml.core.context import Context
from pyggml.core.errors import GGMLError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend import registry
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, BufferUsage
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceCaps, DeviceProps, DeviceType
from pyggml.ggml_backend.event import Event
from pyggml.ggml_backend.graph_copy import GraphCopy, compare_graph_backend, graph_copy
from pyggml.ggml_backend.registry import Reg
from pyggml.ggml_backend.tensor_alloc import tensor_alloc, view_init
from pyggml.ggml_backend.tensor_io import tensor_copy

log = logging.getLogger("pyggml.capi")

__all__ = [
    "GGML_BACKEND_DEVICE_TYPE_CPU", "GGML_BACKEND_DEVICE_TYPE_GPU", "GGML_BACKEND_DEVICE_TYPE_IGPU",
    "GGML_BACKEND_DEVICE_TYPE_ACCEL", "GGML_BACKEND_DEVICE_TYPE_META", "GGML_BACKEND_BUFFER_USAGE_ANY",
    "GGML_BACKEND_BUFFER_USAGE_WEIGHTS", "GGML_BACKEND_BUFFER_USAGE_COMPUTE", "ggml_backend_dev_caps",
    "ggml_backend_dev_props", "ggml_backend_graph_copy_t",
    "ggml_backend_buft_name", "ggml_backend_buft_alloc_buffer", "ggml_backend_buft_get_alignment",
    "ggml_backend_buft_get_max_size", "ggml_backend_buft_get_alloc_size", "ggml_backend_buft_is_host",
    "ggml_backend_buft_get_device",
    "ggml_backend_buffer_name", "ggml_backend_buffer_get_max_size", "ggml_backend_buffer_is_host",
    "ggml_backend_buffer_set_usage", "ggml_backend_buffer_get_usage", "ggml_backend_buffer_get_type",
    "ggml_backend_buffer_reset",
    "ggml_backend_get_default_buffer_type", "ggml_backend_get_max_size", "ggml_backend_supports_buft",
    "ggml_backend_offload_op", "ggml_backend_get_device", "ggml_backend_tensor_copy_async",
    "ggml_backend_event_new", "ggml_backend_event_free", "ggml_backend_event_record",
    "ggml_backend_event_synchronize", "ggml_backend_event_wait",
    "ggml_backend_dev_name", "ggml_backend_dev_description", "ggml_backend_dev_memory", "ggml_backend_dev_type",
    "ggml_backend_dev_get_props", "ggml_backend_dev_backend_reg", "ggml_backend_dev_init",
    "ggml_backend_dev_buffer_type", "ggml_backend_dev_host_buffer_type", "ggml_backend_dev_buffer_from_host_ptr",
    "ggml_backend_dev_supports_op", "ggml_backend_dev_supports_buft", "ggml_backend_dev_offload_op",
    "ggml_backend_reg_name", "ggml_backend_reg_dev_count", "ggml_backend_reg_dev_get",
    "ggml_backend_reg_get_proc_address",
    "ggml_backend_register", "ggml_backend_device_register", "ggml_backend_reg_count", "ggml_backend_reg_get",
    "ggml_backend_reg_by_name", "ggml_backend_dev_count", "ggml_backend_dev_get", "ggml_backend_dev_by_name",
    "ggml_backend_dev_by_type", "ggml_backend_init_by_name", "ggml_backend_init_by_type", "ggml_backend_init_best",
    "ggml_backend_load", "ggml_backend_unload", "ggml_backend_load_all",
    "ggml_backend_graph_copy", "ggml_backend_graph_copy_free", "ggml_backend_compare_graph_backend",
    "ggml_backend_tensor_alloc", "ggml_backend_view_init",
    "ggml_backend_alloc_ctx_tensors_from_buft", "ggml_backend_alloc_ctx_tensors",
    "ggml_backend_alloc_ctx_tensors_from_buft_size",
    "ggml_backend_cpu_buffer_type", "ggml_backend_cpu_reg",
]

# enum ggml_backend_dev_type
GGML_BACKEND_DEVICE_TYPE_CPU = DeviceType.CPU
GGML_BACKEND_DEVICE_TYPE_GPU = DeviceType.GPU
GGML_BACKEND_DEVICE_TYPE_IGPU = DeviceType.IGPU
GGML_BACKEND_DEVICE_TYPE_ACCEL = DeviceType.ACCEL
GGML_BACKEND_DEVICE_TYPE_META = DeviceType.META

# enum ggml_backend_buffer_usage
GGML_BACKEND_BUFFER_USAGE_ANY = BufferUsage.ANY
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = BufferUsage.WEIGHTS
GGML_BACKEND_BUFFER_USAGE_COMPUTE = BufferUsage.COMPUTE

# the structs
ggml_backend_dev_caps = DeviceCaps
ggml_backend_dev_props = DeviceProps
ggml_backend_graph_copy_t = GraphCopy


def _or_none(what: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None where C returns NULL: a lookup that fails is logged, as ggml logs it."""
    try:
        return fn()
    except GGMLError as e:
        log.error("%s: %s", what, e)
        return None


# --- buffer type ---


def ggml_backend_buft_name(buft: BufferType) -> str:
    return buft.name()


def ggml_backend_buft_alloc_buffer(buft: BufferType, size: int) -> Buffer:
    return buft.alloc_buffer(size)


def ggml_backend_buft_get_alignment(buft: BufferType) -> int:
    return buft.get_alignment()


def ggml_backend_buft_get_max_size(buft: BufferType) -> int:
    return buft.get_max_size()


def ggml_backend_buft_get_alloc_size(buft: BufferType, tensor: Tensor) -> int:
    return buft.get_alloc_size(tensor)


def ggml_backend_buft_is_host(buft: BufferType) -> bool:
    return buft.is_host()


def ggml_backend_buft_get_device(buft: BufferType) -> Device | None:
    return buft.get_device()


# --- buffer ---


def ggml_backend_buffer_name(buffer: Buffer) -> str:
    return buffer.name


def ggml_backend_buffer_get_max_size(buffer: Buffer) -> int:
    return buffer.get_max_size()


def ggml_backend_buffer_is_host(buffer: Buffer) -> bool:
    return buffer.is_host()


def ggml_backend_buffer_set_usage(buffer: Buffer, usage: BufferUsage | int) -> None:
    buffer.set_usage(usage)


def ggml_backend_buffer_get_usage(buffer: Buffer) -> BufferUsage:
    return buffer.get_usage()


def ggml_backend_buffer_get_type(buffer: Buffer) -> BufferType | None:
    return buffer.get_type()


def ggml_backend_buffer_reset(buffer: Buffer) -> None:
    buffer.reset()


# --- backend ---


def ggml_backend_get_default_buffer_type(backend: Backend) -> BufferType:
    return backend.get_default_buffer_type()


def ggml_backend_get_max_size(backend: Backend) -> int:
    return backend.get_max_size()


def ggml_backend_supports_buft(backend: Backend, buft: BufferType) -> bool:
    return backend.supports_buft(buft)


def ggml_backend_offload_op(backend: Backend, op: Tensor) -> bool:
    return backend.offload_op(op)


def ggml_backend_get_device(backend: Backend) -> Device | None:
    return backend.get_device()


def ggml_backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """As ggml's fallback: both backends synchronized, then a blocking copy."""
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)


# --- events ---


def ggml_backend_event_new(device: Device | None) -> Event | None:
    if device is None:  # allowed for the transition to devices, as in ggml
        return None
    return device.event_new()


def ggml_backend_event_free(event: Event | None) -> None:
    if event is not None:
        event.free()


def ggml_backend_event_record(event: Event, backend: Backend) -> None:
    event.record(backend)


def ggml_backend_event_synchronize(event: Event) -> None:
    event.synchronize()


def ggml_backend_event_wait(backend: Backend, event: Event) -> None:
    event.wait(backend)


# --- device ---


def ggml_backend_dev_name(device: Device) -> str:
    return device.name()


def ggml_backend_dev_description(device: Device) -> str:
    return device.description()


def ggml_backend_dev_memory(device: Device) -> tuple[int, int]:
    """(free, total): C's two out-parameters."""
    return device.memory()


def ggml_backend_dev_type(device: Device) -> DeviceType:
    return device.type()


def ggml_backend_dev_get_props(device: Device) -> DeviceProps:
    return device.get_props()


def ggml_backend_dev_backend_reg(device: Device) -> Reg | None:
    return device.backend_reg()


def ggml_backend_dev_init(device: Device, params: str | None) -> Backend:
    return device.init_backend(params)


def ggml_backend_dev_buffer_type(device: Device) -> BufferType:
    return device.buffer_type()


def ggml_backend_dev_host_buffer_type(device: Device) -> BufferType | None:
    return device.host_buffer_type()


def ggml_backend_dev_buffer_from_host_ptr(device: Device, ptr: object, size: int, max_tensor_size: int) -> Buffer:
    return device.buffer_from_host_ptr(ptr, size, max_tensor_size)


def ggml_backend_dev_supports_op(device: Device, op: Tensor) -> bool:
    return device.supports_op(op)


def ggml_backend_dev_supports_buft(device: Device, buft: BufferType) -> bool:
    return device.supports_buft(buft)


def ggml_backend_dev_offload_op(device: Device, op: Tensor) -> bool:
    return device.offload_op(op)


# --- registry of a backend ---


def ggml_backend_reg_name(reg: Reg) -> str:
    return reg.name()


def ggml_backend_reg_dev_count(reg: Reg) -> int:
    return reg.dev_count()


def ggml_backend_reg_dev_get(reg: Reg, index: int) -> Device:
    return reg.dev_get(index)


def ggml_backend_reg_get_proc_address(reg: Reg, name: str) -> Callable[..., Any] | None:
    return reg.get_proc_address(name)


# --- the registry ---


def ggml_backend_register(reg: Reg) -> None:
    registry.register(reg)


def ggml_backend_device_register(device: Device) -> None:
    registry.device_register(device)


def ggml_backend_reg_count() -> int:
    return registry.reg_count()


def ggml_backend_reg_get(index: int) -> Reg:
    return registry.reg_get(index)


def ggml_backend_reg_by_name(name: str) -> Reg | None:
    return _or_none("ggml_backend_reg_by_name", lambda: registry.reg_by_name(name))


def ggml_backend_dev_count() -> int:
    return registry.dev_count()


def ggml_backend_dev_get(index: int) -> Device:
    return registry.dev_get(index)


def ggml_backend_dev_by_name(name: str) -> Device | None:
    return registry.dev_by_name(name)


def ggml_backend_dev_by_type(type: DeviceType | int) -> Device | None:
    return registry.dev_by_type(type)


def ggml_backend_init_by_name(name: str, params: str | None) -> Backend | None:
    return _or_none("ggml_backend_init_by_name", lambda: registry.init_by_name(name, params))


def ggml_backend_init_by_type(type: DeviceType | int, params: str | None) -> Backend | None:
    return _or_none("ggml_backend_init_by_type", lambda: registry.init_by_type(type, params))


def ggml_backend_init_best() -> Backend | None:
    return _or_none("ggml_backend_init_best", registry.init_best)


def ggml_backend_load(path: str | Path) -> Reg | None:
    """A module name, or a path to a `.py` file or package directory (see `pyggml.ggml_backend.registry.load`)."""
    return _or_none("ggml_backend_load", lambda: registry.load(path))


def ggml_backend_unload(reg: Reg) -> None:
    registry.unload(reg)


def ggml_backend_load_all() -> None:
    registry.load_all()


# --- utils ---


def ggml_backend_graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    return graph_copy(backend, graph)


def ggml_backend_graph_copy_free(copy: GraphCopy) -> None:
    copy.free()


def ggml_backend_compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                                       callback: Callable[[int, Tensor, Tensor, Any], bool], user_data: Any,
                                       test_nodes: Sequence[Tensor] | None = None,
                                       num_test_nodes: int | None = None) -> bool:
    nodes = list(test_nodes or ())[:num_test_nodes]
    return compare_graph_backend(backend1, backend2, graph, lambda i, t1, t2: callback(i, t1, t2, user_data), nodes)


def ggml_backend_tensor_alloc(buffer: Buffer, tensor: Tensor, addr: int) -> None:
    tensor_alloc(buffer, tensor, addr)


def ggml_backend_view_init(tensor: Tensor) -> None:
    view_init(tensor)


# --- ggml-alloc.h ---


def ggml_backend_alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType) -> Buffer | None:
    return ctx_tensors.alloc_ctx_tensors_from_buft(ctx, buft)


def ggml_backend_alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    return ctx_tensors.alloc_ctx_tensors(ctx, backend)


def ggml_backend_alloc_ctx_tensors_from_buft_size(ctx: Context, buft: BufferType) -> int:
    return ctx_tensors.alloc_size(list(ctx), buft)


# --- ggml-cpu.h ---


def ggml_backend_cpu_buffer_type() -> BufferType:
    return cpu_device.cpu_buffer_type()


def ggml_backend_cpu_reg() -> Reg:
    return cpu_device.cpu_reg()
