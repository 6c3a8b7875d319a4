"""Giving one tensor memory: ggml_backend_tensor_alloc and ggml_backend_view_init, where every allocator ends."""

from __future__ import annotations

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, BufferFreedError, NotAllocatedError, OutOfBoundsError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.buffer import Buffer


def tensor_alloc(buffer: Buffer, tensor: Tensor, addr: int) -> None:
    """ggml_backend_tensor_alloc: place `tensor` (no memory yet, not a view) at address `addr` of `buffer`;
    its alloc size must fit between `addr` and the buffer's end."""
    check_instance(buffer, Buffer, "tensor_alloc: buffer")
    check_instance(tensor, Tensor, "tensor_alloc: tensor")
    addr = check_int(addr, f"tensor_alloc: address of '{tensor.name}'")
    if tensor.buffer is not None or tensor.data is not None:
        raise ArgumentError(f"tensor_alloc: '{tensor.name}' has memory already (in buffer "
                            f"'{tensor.buffer.name if tensor.buffer is not None else None}')")
    if tensor.view_src is not None:
        raise ArgumentError(f"tensor_alloc: '{tensor.name}' is a view of '{tensor.view_src.name}'; views get their "
                            f"memory from view_init")
    base = buffer.get_base()  # checks the buffer is alive
    size = buffer.get_alloc_size(tensor)
    if addr < base or addr + size > base + buffer.get_size():
        raise OutOfBoundsError(f"tensor_alloc: {size} bytes of '{tensor.name}' at offset {addr - base} are outside "
                               f"the {buffer.get_size()} bytes of buffer '{buffer.name}'")
    tensor.buffer = buffer
    tensor.data = addr
    buffer.init_tensor(tensor)


def view_init(tensor: Tensor) -> None:
    """ggml_backend_view_init: a view's memory is its source's, `view_offs` in, in the source's buffer."""
    check_instance(tensor, Tensor, "view_init: tensor")
    src = tensor.view_src
    if src is None:
        raise ArgumentError(f"view_init: '{tensor.name}' is not a view")
    if tensor.buffer is not None:
        raise ArgumentError(f"view_init: view '{tensor.name}' has a buffer already ('{tensor.buffer.name}')")
    if src.buffer is None or src.data is None:
        raise NotAllocatedError(f"view_init: the source '{src.name}' of view '{tensor.name}' has no memory")
    if src.buffer.freed:
        raise BufferFreedError(f"view_init: the buffer '{src.buffer.name}' of '{src.name}' (the source of view "
                               f"'{tensor.name}') was freed")
    tensor.buffer = src.buffer
    tensor.data = src.data + tensor.view_offs
    src.buffer.init_tensor(tensor)
