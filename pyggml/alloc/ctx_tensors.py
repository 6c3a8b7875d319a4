"""Memory for a set of tensors at once: ggml_backend_alloc_ctx_tensors(_from_buft) (ggml-alloc.c).

Tensors without memory get consecutive aligned blocks of one new buffer, then views their source's; None when
no tensor needed memory. Beyond the buffer type's max size ggml splits over buffers; here it raises
OutOfMemoryError (one buffer per call), with every tensor as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyggml.core.checks import check_instance
from pyggml.core.context import Context
from pyggml.core.errors import OutOfMemoryError
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.tensor_alloc import tensor_alloc, view_init


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def alloc_size(tensors: Sequence[Tensor], buft: BufferType) -> int:
    """ggml_backend_alloc_ctx_tensors_from_buft_size: the bytes `alloc_tensors` takes in a buffer of `buft`."""
    align = buft.get_alignment()
    return sum(_pad(buft.get_alloc_size(t), align) for t in tensors if t.data is None and t.view_src is None)


def _alloc(tensors: Sequence[Tensor], buft: BufferType, new_buffer: Callable[[int], Buffer]) -> Buffer | None:
    owners = [t for t in tensors if t.data is None and t.view_src is None]
    views = [t for t in tensors if t.view_src is not None and t.buffer is None]
    if not owners and not views:
        return None
    align = buft.get_alignment()
    sizes = [_pad(buft.get_alloc_size(t), align) for t in owners]
    total = sum(sizes)
    if total > buft.get_max_size():
        raise OutOfMemoryError(f"alloc_ctx_tensors: {len(owners)} tensors need {total} bytes, more than the max size "
                               f"of buffer type '{buft.name()}' ({buft.get_max_size()} bytes)")
    buffer = new_buffer(total)
    saved = [(t, t.data, t.buffer) for t in (*owners, *views)]
    try:
        addr = buffer.get_base()
        for t, size in zip(owners, sizes, strict=True):
            tensor_alloc(buffer, t, addr)
            addr += size
        for t in views:
            view_init(t)
    except BaseException:
        for t, data, buf in saved:
            t.data, t.buffer = data, buf
        buffer.free()
        raise
    return buffer


def alloc_tensors(tensors: Sequence[Tensor], backend: Backend) -> Buffer | None:
    """Memory for `tensors` in one new buffer of `backend` (see the module doc)."""
    check_instance(backend, Backend, "alloc_tensors: backend")
    return _alloc(list(tensors), backend.get_default_buffer_type(), backend.alloc_buffer)


def alloc_tensors_from_buft(tensors: Sequence[Tensor], buft: BufferType) -> Buffer | None:
    """Memory for `tensors` in one new buffer of `buft` (see the module doc)."""
    check_instance(buft, BufferType, "alloc_tensors_from_buft: buft")
    return _alloc(list(tensors), buft, buft.alloc_buffer)


def alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    """ggml_backend_alloc_ctx_tensors: memory for the context's tensors in a new buffer of `backend`."""
    check_instance(ctx, Context, "alloc_ctx_tensors: ctx")
    return alloc_tensors(list(ctx), backend)


def alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType) -> Buffer | None:
    """ggml_backend_alloc_ctx_tensors_from_buft: memory for the context's tensors in a new buffer of `buft`."""
    check_instance(ctx, Context, "alloc_ctx_tensors_from_buft: ctx")
    return alloc_tensors_from_buft(list(ctx), buft)
