"""Helpers for checking backends: allocating a context's tensors, the op checker (`test_ops`)."""

from __future__ import annotations

from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer
from pyggml.core.context import Context
from pyggml.core.errors import NotAllocatedError
from pyggml.core.tensor import Tensor


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer:
    """Give every tensor of a `no_alloc` context memory in one new buffer of `backend`, one after another.

    Later ggml's ggml_backend_alloc_ctx_tensors, without reuse: views get their
    source's memory (init_view), everything else its own aligned block.
    Tensors that already have memory are left alone.
    """
    tensors = [t for t in ctx.tensors if t.data is None]
    owners = [t for t in tensors if t.view_src is None]
    probe = backend.alloc_buffer(0)
    try:
        align = probe.get_alignment()
        sizes = [_pad(max(probe.get_alloc_size(t), 1), align) for t in owners]
    finally:
        probe.free()
    buffer = backend.alloc_buffer(max(sum(sizes), 1))
    base = buffer.get_base()
    offset = 0
    for t, size in zip(owners, sizes, strict=True):
        t.data = base + offset
        t.buffer = buffer
        buffer.init_tensor(t)
        offset += size
    for t in tensors:
        if t.view_src is not None:
            init_view(t)
    return buffer


def init_view(view: Tensor) -> None:
    """ggml_backend_view_init: a view's memory is its source's, `view_offs` in."""
    src = view.view_src
    if src is None or src.data is None:
        raise NotAllocatedError(f"init_view: the source of view '{view.name}' has no memory")
    view.data = src.data + view.view_offs
    view.buffer = src.buffer
    if view.buffer is not None:
        view.buffer.init_tensor(view)
