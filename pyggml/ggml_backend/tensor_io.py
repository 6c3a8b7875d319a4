"""ggml-backend.h's tensor functions (set, get, copy, memset) and their numpy forms.

Everything is checked before a byte moves (tensor, buffer alive, ranges, the caller's memory); `data` and
`out` are any buffer-protocol objects, copied as they lie in memory, as ggml's memcpy.
"""

from __future__ import annotations

import logging

import numpy as np

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    ShapeError,
)
from pyggml.core.tensor import Tensor, are_same_layout
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer, tensor_buffer

log = logging.getLogger("pyggml.ggml_backend")


def get_backend(tensor: Tensor) -> Backend | None:
    """ggml_get_backend: the backend of the buffer holding `tensor` (through its view source), or None."""
    buffer = tensor_buffer(tensor)
    return buffer.backend if buffer is not None else None


def _buffer_for(tensor: Tensor, what: str) -> Buffer:
    """The tensor's live buffer (and its backend, if any), the tensor inside it, or an error naming it."""
    check_instance(tensor, Tensor, f"{what}: tensor")
    if tensor.data is None:
        raise NotAllocatedError(f"{what}: tensor '{tensor.name}' is not allocated (data is None)")
    buffer = tensor_buffer(tensor)
    if buffer is None:
        raise NotAllocatedError(
            f"{what}: tensor '{tensor.name}' is not in a backend buffer (its backend is not set); "
            f"tensors of a Context's own memory are read with Tensor.numpy()"
        )
    if buffer.freed:
        raise BufferFreedError(f"{what}: buffer '{buffer.name}' ({buffer.size} bytes) of tensor '{tensor.name}' "
                               f"was used after it was freed")
    backend = buffer.backend
    if backend is not None and backend.freed:
        raise BufferFreedError(f"{what}: backend '{backend.name()}' was used after it was freed (tensor "
                               f"'{tensor.name}')")
    # a corrupt view outside its buffer would read or write another buffer
    buffer.check_tensor(tensor, what)
    return buffer


def _check_range(tensor: Tensor, offset: int, size: int, what: str, verb: str) -> None:
    if offset < 0 or size < 0:
        raise ArgumentError(f"{what}: offset ({offset}) and size ({size}) must be >= 0 for '{tensor.name}'")
    nbytes = tensor.nbytes()
    if offset + size > nbytes:
        raise OutOfBoundsError(
            f"{what}: {verb} of {size} bytes at offset {offset} is out of bounds of '{tensor.name}' ({nbytes} bytes)"
        )


def _source_bytes(data: object, what: str) -> np.ndarray:
    """The bytes of a buffer-protocol object as a 1-D uint8 array (copied only if not contiguous)."""
    if isinstance(data, np.ndarray):
        arr = data
    else:
        try:
            mv = memoryview(data)  # type: ignore[arg-type]
        except TypeError:
            raise ArgumentError(f"{what}: {type(data).__name__} does not support the buffer protocol") from None
        if mv.c_contiguous:
            return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, dtype=np.uint8)
        arr = np.asarray(mv)
    if arr.dtype.hasobject:
        raise ArgumentError(f"{what}: a numpy array of Python objects has no raw bytes")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8)


def _dest_bytes(out: object, what: str) -> np.ndarray:
    """A writable 1-D uint8 view of the caller's memory (never a copy: the bytes must land there)."""
    if isinstance(out, np.ndarray):
        arr = out
        if not arr.flags.writeable:
            raise ArgumentError(f"{what}: the output array is read-only")
        if not arr.flags.c_contiguous:
            raise ArgumentError(f"{what}: the output array is not C-contiguous (shape {arr.shape}, strides "
                                f"{arr.strides}); bytes are written in memory order")
        if arr.dtype.hasobject:
            raise ArgumentError(f"{what}: a numpy array of Python objects has no raw bytes")
        return arr.reshape(-1).view(np.uint8)
    try:
        mv = memoryview(out)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentError(f"{what}: {type(out).__name__} does not support the buffer protocol") from None
    if mv.readonly:
        raise ArgumentError(f"{what}: the output {type(out).__name__} is read-only")
    if not mv.c_contiguous:
        raise ArgumentError(f"{what}: the output {type(out).__name__} is not contiguous")
    return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, dtype=np.uint8)


def _check_offset_size(offset: object, size: object, what: str) -> tuple[int, int | None]:
    offset = check_int(offset, f"{what}: offset")
    return offset, None if size is None else check_int(size, f"{what}: size")


def _prepare_set(tensor: Tensor, data: object, offset: int, size: int | None, what: str) -> tuple[Buffer, np.ndarray]:
    offset, size = _check_offset_size(offset, size, what)
    buffer = _buffer_for(tensor, what)
    raw = _source_bytes(data, what)
    if size is None:
        size = raw.nbytes
    _check_range(tensor, offset, size, what, "write")
    if size > raw.nbytes:
        raise OutOfBoundsError(
            f"{what}: write of {size} bytes to '{tensor.name}' but the data holds only {raw.nbytes} bytes"
        )
    return buffer, raw[:size]


def _prepare_get(tensor: Tensor, out: object, offset: int, size: int | None, what: str) -> tuple[Buffer, np.ndarray]:
    offset, size = _check_offset_size(offset, size, what)
    buffer = _buffer_for(tensor, what)
    if offset < 0:
        raise ArgumentError(f"{what}: offset ({offset}) must be >= 0 for '{tensor.name}'")
    if size is None:
        size = max(tensor.nbytes() - offset, 0)
    _check_range(tensor, offset, size, what, "read")
    dest = _dest_bytes(out, what)
    if size > dest.nbytes:
        raise OutOfBoundsError(
            f"{what}: read of {size} bytes from '{tensor.name}' into an output of only {dest.nbytes} bytes"
        )
    return buffer, dest[:size]


def tensor_set_async(tensor: Tensor, data: object, offset: int = 0, size: int | None = None) -> None:
    """ggml_backend_tensor_set_async: may return before the copy ends (not for a buffer without a backend)."""
    buffer, raw = _prepare_set(tensor, data, offset, size, "tensor_set_async")
    if buffer.backend is None:
        buffer._set_tensor(tensor, memoryview(raw), offset, raw.nbytes)
    else:
        buffer.backend._set_tensor_async(tensor, memoryview(raw), offset, raw.nbytes)


def tensor_get_async(tensor: Tensor, out: object, offset: int = 0, size: int | None = None) -> None:
    buffer, dest = _prepare_get(tensor, out, offset, size, "tensor_get_async")
    if buffer.backend is None:
        buffer._get_tensor(tensor, memoryview(dest), offset, dest.nbytes)
    else:
        buffer.backend._get_tensor_async(tensor, memoryview(dest), offset, dest.nbytes)


def tensor_set(tensor: Tensor, data: object, offset: int = 0, size: int | None = None) -> None:
    buffer, raw = _prepare_set(tensor, data, offset, size, "tensor_set")
    buffer._set_tensor(tensor, memoryview(raw), offset, raw.nbytes)


def tensor_get(tensor: Tensor, out: object, offset: int = 0, size: int | None = None) -> None:
    buffer, dest = _prepare_get(tensor, out, offset, size, "tensor_get")
    buffer._get_tensor(tensor, memoryview(dest), offset, dest.nbytes)


def tensor_copy(src: Tensor, dst: Tensor) -> None:
    """ggml_backend_tensor_copy: `src` into `dst` of the same layout, through the backends' or dst buffer's copy
    hook, else through host memory."""
    check_instance(src, Tensor, "tensor_copy: src")
    check_instance(dst, Tensor, "tensor_copy: dst")
    if not are_same_layout(src, dst):
        raise LayoutError(
            f"tensor_copy: cannot copy tensors with different layouts: '{src.name}' {src.type.name} "
            f"ne={list(src.ne)} nb={list(src.nb)} vs '{dst.name}' {dst.type.name} ne={list(dst.ne)} nb={list(dst.nb)}"
        )
    src_buffer = _buffer_for(src, "tensor_copy")
    dst_buffer = _buffer_for(dst, "tensor_copy")
    if src is dst:
        return
    if dst_buffer.backend is not None and dst_buffer.backend._cpy_tensor_from(src, dst):
        return
    if src_buffer.backend is not None and src_buffer.backend._cpy_tensor_to(src, dst):
        return
    if dst_buffer._cpy_tensor(src, dst):
        return
    log.debug("tensor_copy: no backend or buffer hook copies %s -> %s, going through host memory",
              src_buffer.name, dst_buffer.name)
    nbytes = src.nbytes()
    staging = np.empty(nbytes, dtype=np.uint8)
    tensor_get(src, staging, 0, nbytes)
    tensor_set(dst, staging, 0, nbytes)


def tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """ggml_backend_tensor_memset: `size` bytes from `offset` to `value` (0..255)."""
    value = check_int(value, "tensor_memset: value", minimum=0, maximum=255)
    offset, size = _check_offset_size(offset, size, "tensor_memset")
    buffer = _buffer_for(tensor, "tensor_memset")
    if offset < 0:
        raise ArgumentError(f"tensor_memset: offset ({offset}) must be >= 0 for '{tensor.name}'")
    if size is None:
        size = max(tensor.nbytes() - offset, 0)
    _check_range(tensor, offset, size, "tensor_memset", "memset")
    if size:
        buffer._memset_tensor(tensor, value, offset, size)


def numpy_shape(tensor: Tensor) -> tuple[int, ...]:
    """The numpy shape `tensor_get_numpy` returns: reversed `ne` of ggml_n_dims dimensions ([4, 1, 2]: (2, 1, 4));
    quantized types as raw blocks, the last axis the row's bytes."""
    tr = TYPE_TRAITS[tensor.type]
    n = tensor.n_dims()
    n = max([n, *(i + 1 for i, d in enumerate(tensor.ne) if d == 0)])  # keeps an empty dim: (0, 4), not (4,)
    ne = list(tensor.ne[:n])
    if tr.blck_size > 1:
        ne[0] = ne[0] // tr.blck_size * tr.type_size
    return tuple(reversed(ne))


def _element_layout(tensor: Tensor) -> tuple[np.dtype, tuple[int, ...], tuple[int, ...]]:
    """dtype, 4-D shape and strides of the tensor's elements (raw blocks for quantized types)."""
    tr = TYPE_TRAITS[tensor.type]
    ne, nb = tensor.ne, tensor.nb
    if tr.blck_size > 1 or tr.np_dtype is None:
        return (np.dtype(np.uint8), (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size),
                (nb[3], nb[2], nb[1], 1))
    return tr.np_dtype, (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], nb[0])


def tensor_get_numpy(tensor: Tensor) -> np.ndarray:
    """A contiguous numpy copy of the tensor's elements from any backend (BF16 as uint16 bits, quantized as
    raw blocks), shaped as `numpy_shape`."""
    _buffer_for(tensor, "tensor_get_numpy")  # check before allocating the staging copy
    dtype, shape4, strides4 = _element_layout(tensor)
    nbytes = tensor.nbytes()
    if nbytes == 0:
        return np.zeros(numpy_shape(tensor), dtype=dtype)
    raw = np.empty(nbytes, dtype=np.uint8)
    tensor_get(tensor, raw, 0, nbytes)
    elements = np.ndarray(shape4, dtype=dtype, buffer=raw, strides=strides4)
    return np.ascontiguousarray(elements).reshape(numpy_shape(tensor))


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even, NaN kept a quiet NaN (ggml_compute_fp32_to_bf16)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(64)).astype(np.uint16)
    return rounded


def _elements_from(tensor: Tensor, values: np.ndarray, shape4: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`values` converted to what the tensor stores, shaped `shape4` (see tensor_set_numpy)."""
    t = tensor.type
    tr = TYPE_TRAITS[t]
    n_elem = tensor.nelements()
    if tr.blck_size > 1:
        if values.dtype == np.uint8 and values.size == int(np.prod(shape4)):
            return values.reshape(shape4)
        if values.size != n_elem:
            raise ShapeError(f"tensor_set_numpy: '{tensor.name}' holds {n_elem} elements "
                             f"(ne={list(tensor.ne)}), the array has {values.size} (shape {values.shape})")
        from pyggml.core.types import from_float

        rows = np.asarray(values, dtype=np.float32).reshape(tensor.ne[3], tensor.ne[2], tensor.ne[1], tensor.ne[0])
        return np.asarray(from_float(t, rows), dtype=np.uint8).reshape(shape4)
    if values.size != n_elem:
        raise ShapeError(f"tensor_set_numpy: '{tensor.name}' holds {n_elem} elements (ne={list(tensor.ne)}), "
                         f"the array has {values.size} (shape {values.shape})")
    if t == GGMLType.BF16 and values.dtype != np.uint16:
        return _bf16_bits(values).reshape(shape4)
    return np.asarray(values, dtype=dtype).reshape(shape4)


def tensor_set_numpy(tensor: Tensor, values: object) -> None:
    """Write array-like `values` (reversed `ne`) converted to the tensor's type (uint16 / uint8 arrays taken as
    raw BF16 bits / quantized blocks); strided tensors keep the bytes between elements."""
    _buffer_for(tensor, "tensor_set_numpy")  # check before converting
    arr = np.asarray(values)
    dtype, shape4, strides4 = _element_layout(tensor)
    elements = _elements_from(tensor, arr, shape4, dtype)
    nbytes = tensor.nbytes()
    if nbytes == 0:
        return
    if tensor.is_contiguous():
        tensor_set(tensor, np.ascontiguousarray(elements), 0, nbytes)
        return
    # read-modify-write of the tensor's byte extent, so the gaps between strided elements stay as they are
    raw = np.empty(nbytes, dtype=np.uint8)
    tensor_get(tensor, raw, 0, nbytes)
    np.ndarray(shape4, dtype=dtype, buffer=raw, strides=strides4)[...] = elements
    tensor_set(tensor, raw, 0, nbytes)
