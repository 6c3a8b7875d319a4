"""Loading a GGUF file's tensors into backend buffers.

Each tensor goes to the backend its caller chooses (per layer, as llama.cpp's
`--n-gpu-layers` does), into a buffer of the backend's default buffer type
marked WEIGHTS (`BufferUsage.WEIGHTS`: the scheduler runs what reads them
there, the graph allocator never reuses them). Where that buffer type is host
memory and the backend's device can wrap host memory (its caps say
`buffer_from_host_ptr`, as llama.cpp asks), the weights stay where they are:
one buffer is made over the mapped file (`Backend.buffer_from_host_ptr`) and
every tensor's `data` points at its bytes in the mapping, so loading costs no
copy and pages are read from disk when first touched. That needs the tensors'
addresses aligned as the kernels want them (the file's alignment, 32 by
default, on a page-aligned mapping); otherwise the tensors are placed one
after another in a new buffer of the backend (`alloc_tensors`, sizes from the
buffer type) and their bytes copied in with `tensor_set`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyggml.alloc.ctx_tensors import alloc_tensors, alloc_tensors_from_buft
from pyggml.core import memory
from pyggml.core.checks import check_instance
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError, ArgumentTypeError
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, BufferUsage
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device
from pyggml.ggml_backend.tensor_alloc import tensor_alloc
from pyggml.ggml_backend.tensor_io import tensor_set
from pyggml.gguf.reader import GGUFFile, TensorInfo

ZERO_COPY_ALIGNMENT = 32  # what the CPU kernels' numpy views need at least (AVX2 loads of whole blocks)


def maps_weights(backend: Backend) -> bool:
    """Whether `load_tensors` can leave `backend`'s weights in the mapped file: its default buffer type is
    host memory and its device wraps host memory (caps `buffer_from_host_ptr`)."""
    device = backend.get_device()
    return (device is not None and device.caps().buffer_from_host_ptr
            and backend.get_default_buffer_type().is_host())


@dataclass
class LoadedTensors:
    """The tensors of a file in backend buffers: the context that holds the tensor objects,
    the tensors by name, the buffers, and the bytes each backend holds."""

    ctx: Context
    tensors: dict[str, Tensor]
    buffers: list[Buffer] = field(default_factory=list)
    # id(backend) -> bytes of its weight buffers: the mapped range of the file (with the bytes of tensors that
    # went elsewhere, as it spans them), copies, extra buffer types' copies (as llama.cpp's load log counts)
    nbytes: dict[int, int] = field(default_factory=dict)
    zero_copy: dict[int, bool] = field(default_factory=dict)  # id(backend) -> weights left in the mapping

    def free(self) -> None:
        for buffer in self.buffers:
            if not buffer.freed:
                buffer.free()
        self.buffers = []
        self.ctx.free()


def load_tensors(gf: GGUFFile, names: list[str], backend_of: Mapping[str, Backend] | Callable[[str], Backend],
                 use_mmap: bool = True, progress: bool = True,
                 buft_of: Callable[[Tensor, Backend], BufferType | None] | None = None) -> LoadedTensors:
    """Create tensors `names` of `gf` and place each in a buffer of `backend_of[name]`.

    Raises GGUFError (from `gf.tensor`) naming a missing tensor, and
    ArgumentError/ArgumentTypeError naming a tensor without a backend (or
    whose backend is not a Backend), before any memory is taken.
    """
    for name in names:
        check_instance(name, str, "load_tensors: a tensor name")
    infos = [gf.tensor(name) for name in names]  # every missing tensor reported before anything happens
    if not callable(backend_of) and not isinstance(backend_of, Mapping):
        raise ArgumentTypeError(f"load_tensors: backend_of must be a mapping or a function of the tensor name, "
                                f"got {type(backend_of).__name__}")
    backends: list[Backend] = []
    for info in infos:  # every tensor's backend known (and a Backend) before a tensor or buffer is made
        if callable(backend_of):
            backend = backend_of(info.name)
        elif info.name in backend_of:
            backend = backend_of[info.name]
        else:
            raise ArgumentError(f"load_tensors: no backend given for tensor '{info.name}'")
        check_instance(backend, Backend, f"load_tensors: the backend of tensor '{info.name}'")
        backends.append(backend)
    ctx = Context(mem_size=(len(infos) + 1) * tensor_overhead(), no_alloc=True)
    tensors: dict[str, Tensor] = {}
    groups: dict[int, tuple[Backend, list[tuple[TensorInfo, Tensor]]]] = {}
    extra: dict[tuple[int, int], tuple[Backend, BufferType, list[tuple[TensorInfo, Tensor]]]] = {}
    for info, backend in zip(infos, backends, strict=True):
        t = ctx.new_tensor(info.type, list(info.ne) or [1])
        t.set_name(info.name)
        tensors[info.name] = t
        buft = buft_of(t, backend) if buft_of is not None else None
        if buft is None:
            groups.setdefault(id(backend), (backend, []))[1].append((info, t))
        else:
            extra.setdefault((id(backend), id(buft)), (backend, buft, []))[2].append((info, t))

    loaded = LoadedTensors(ctx, tensors)
    total = sum(info.nbytes for info in infos)
    from tqdm import tqdm

    try:
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {gf.name}", disable=not progress,
                  leave=False) as bar:
            for backend, items in groups.values():
                if use_mmap and maps_weights(backend) and _mappable(gf, items):
                    buffer = _map(gf, backend, items)
                    loaded.zero_copy[id(backend)] = True
                    bar.update(sum(info.nbytes for info, _ in items))
                else:
                    buffer = _copy_in(gf, backend, items, bar.update)
                    loaded.zero_copy[id(backend)] = False
                buffer.set_usage(BufferUsage.WEIGHTS)
                loaded.buffers.append(buffer)
                loaded.nbytes[id(backend)] = buffer.get_size()
            for backend, buft, items in extra.values():
                buffer = _copy_in(gf, backend, items, bar.update, buft)
                loaded.buffers.append(buffer)
                loaded.nbytes[id(backend)] = loaded.nbytes.get(id(backend), 0) + buffer.get_size()
    except BaseException:
        loaded.free()
        raise
    return loaded


def weight_buft_supported(device: Device, buft: BufferType, weight: Tensor) -> bool:
    """Whether `device` multiplies `weight` held in `buft` (llama.cpp's weight_buft_supported for a MUL_MAT
    weight, or a MUL_MAT_ID one where it is 3-D): the op of a copy of it, placed in an empty buffer of `buft`, by
    an F32 batch, asked of the device's supports_op."""
    if not device.supports_buft(buft):
        return False
    ctx = Context(mem_size=4 * tensor_overhead(), no_alloc=True)
    buffer = buft.alloc_buffer(0)
    try:
        w = ctx.new_tensor(weight.type, list(weight.ne))
        w.set_name(weight.name)
        w.buffer = buffer
        buffer.init_tensor(w)
        if weight.ne[2] > 1:  # experts: one routed slot per token (supports_op does not look at the count)
            ids = ctx.new_tensor_2d(GGMLType.I32, 1, 512)
            op = ctx.mul_mat_id(w, ctx.new_tensor_3d(GGMLType.F32, weight.ne[0], 1, 512), ids)
        else:
            op = ctx.mul_mat(w, ctx.new_tensor_2d(GGMLType.F32, weight.ne[0], 512))
        return device.supports_op(op)
    finally:
        buffer.free()
        ctx.free()


def _mappable(gf: GGUFFile, items: list[tuple[TensorInfo, Tensor]]) -> bool:
    """Whether every tensor's bytes in the mapping are aligned for zero-copy use."""
    if not gf.data.flags.writeable or not items:
        return False
    base = memory.address_of(gf.data)
    return all((base + info.offset) % ZERO_COPY_ALIGNMENT == 0 for info, _ in items)


def _map(gf: GGUFFile, backend: Backend, items: list[tuple[TensorInfo, Tensor]]) -> Buffer:
    """One buffer of `backend` over the part of the mapping that holds `items`; tensors point into it."""
    lo = min(info.offset for info, _ in items)
    hi = max(info.offset + info.nbytes for info, _ in items)
    max_tensor = max(info.nbytes for info, _ in items)
    buffer = backend.buffer_from_host_ptr(gf.data[lo:hi], hi - lo, max_tensor)
    buffer.name = f"{backend.name()} mmap {gf.name}"
    base = buffer.get_base()
    try:
        for info, t in items:
            tensor_alloc(buffer, t, base + (info.offset - lo))
    except BaseException:
        buffer.free()
        raise
    return buffer


def _copy_in(gf: GGUFFile, backend: Backend, items: list[tuple[TensorInfo, Tensor]],
             progress: Callable[[int], object], buft: BufferType | None = None) -> Buffer:
    """A new buffer of `backend` (of `buft` if given) with the tensors placed one after another, and their
    bytes copied in."""
    tensors = [t for _, t in items]
    buffer = alloc_tensors(tensors, backend) if buft is None else alloc_tensors_from_buft(tensors, buft)
    assert buffer is not None  # every tensor is new
    # marked before the bytes go in, as llama.cpp does: a buffer may send weights its own way (an RPC
    # buffer tries the server's hash cache for WEIGHTS)
    buffer.set_usage(BufferUsage.WEIGHTS)
    try:
        for info, t in items:
            tensor_set(t, gf.tensor_bytes(info.name))
            gf.release_pages(info.name)
            progress(info.nbytes)
    except BaseException:
        buffer.free()
        raise
    return buffer
