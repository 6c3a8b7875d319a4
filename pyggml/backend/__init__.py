"""pyggml.backend: backend buffers, backends, and the functions of ggml-backend.h."""

from pyggml.backend.backend import Backend, op_desc
from pyggml.backend.buffer import Buffer, BufferInterface, IfaceBuffer, buffer_init, tensor_buffer
from pyggml.backend.registry import init_backend, list_backends, register_backend, unregister_backend
from pyggml.backend.tensor_io import (
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
    "Backend", "Buffer", "BufferInterface", "IfaceBuffer", "buffer_init", "get_backend", "init_backend",
    "list_backends", "numpy_shape", "op_desc", "register_backend", "tensor_buffer", "tensor_copy", "tensor_get",
    "tensor_get_async", "tensor_get_numpy", "tensor_memset", "tensor_set", "tensor_set_async", "tensor_set_numpy",
    "unregister_backend",
]
