"""pyggml.ggml_backend: buffer types, buffers, backends, devices, registries, events, and the functions of
ggml-backend.h."""

from pyggml.ggml_backend.backend import Backend, BackendBufferType, op_desc
from pyggml.ggml_backend.buffer import Buffer, BufferInterface, BufferUsage, IfaceBuffer, buffer_init, tensor_buffer
from pyggml.ggml_backend.buffer_type import SIZE_MAX, BufferType
from pyggml.ggml_backend.device import Device, DeviceCaps, DeviceProps, DeviceType, host_cpu_name, host_memory
from pyggml.ggml_backend.event import Event
from pyggml.ggml_backend.graph_copy import GraphCopy, compare_graph_backend, graph_copy
from pyggml.ggml_backend.registry import (
    ENTRY_POINT_GROUP,
    Reg,
    dev_by_name,
    dev_by_type,
    dev_count,
    dev_get,
    devices,
    init_backend,
    init_best,
    init_by_name,
    init_by_type,
    list_backends,
    load,
    load_all,
    reg_by_name,
    reg_count,
    reg_get,
    register,
    register_backend,
    regs,
    set_n_threads,
    unregister_backend,
)
from pyggml.ggml_backend.tensor_alloc import tensor_alloc, view_init
from pyggml.ggml_backend.tensor_io import (
    get_backend,
    numpy_shape,
    tensor_copy,
    tensor_get,
    tensor_get_async,
    tensor_get_numpy,
    tensor_memset,
    tensor_set,
    tensor_set_async,
    tensor_set_numpy,
)

__all__ = [
    "ENTRY_POINT_GROUP", "SIZE_MAX", "Backend", "BackendBufferType", "Buffer", "BufferInterface", "BufferType",
    "BufferUsage", "Device", "DeviceCaps", "DeviceProps", "DeviceType", "Event", "GraphCopy", "IfaceBuffer", "Reg",
    "buffer_init", "compare_graph_backend", "dev_by_name", "dev_by_type", "dev_count", "dev_get", "devices",
    "get_backend", "graph_copy", "host_cpu_name", "host_memory", "init_backend", "init_best", "init_by_name",
    "init_by_type", "list_backends", "load", "load_all", "numpy_shape", "op_desc", "reg_by_name", "reg_count",
    "reg_get", "register", "register_backend", "regs", "set_n_threads", "tensor_alloc", "tensor_buffer",
    "tensor_copy", "tensor_get", "tensor_get_async", "tensor_get_numpy", "tensor_memset", "tensor_set",
    "tensor_set_async", "tensor_set_numpy", "unregister_backend", "view_init",
]
