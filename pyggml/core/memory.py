"""Host memory: every host allocation's numpy array registered by address, so a tensor's `data` is viewed
zero-copy, as C dereferences a pointer."""

from __future__ import annotations

import bisect

import numpy as np

from pyggml.core.checks import check_host_alloc, check_size
from pyggml.core.errors import NotAllocatedError, OutOfBoundsError, OutOfMemoryError
from pyggml.core.tensor import Tensor, nbytes_of
from pyggml.core.types import TYPE_TRAITS, GGMLType

# parallel lists sorted by base address; regions may nest (a buffer made from a pointer into a mapped file)
_bases: list[int] = []
_ends: list[int] = []
_arrays: list[np.ndarray] = []
_reach: list[int] = []  # _reach[i] = max(_ends[:i + 1]): no region at or before i reaches past it


def _update_reach() -> None:
    _reach[:] = _ends
    for i in range(1, len(_reach)):
        _reach[i] = max(_reach[i], _reach[i - 1])


def allocate_host(nbytes: int, what: str) -> np.ndarray:
    """A zeroed uint8 array of `nbytes`; OutOfMemoryError (checked first, naming `what`) past the host's memory."""
    nbytes = check_size(nbytes, f"{what}: size")
    check_host_alloc(nbytes, what)
    try:
        return np.zeros(nbytes, dtype=np.uint8)
    except MemoryError as e:
        raise OutOfMemoryError(f"{what}: cannot allocate {nbytes} bytes of host memory ({e})") from None


def address_of(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def register(array: np.ndarray) -> int:
    """Make `array` (1-D uint8, C-contiguous) reachable by address; returns its base."""
    if array.dtype != np.uint8 or array.ndim != 1 or not array.flags.c_contiguous:
        array = array.reshape(-1).view(np.uint8)
    base = address_of(array)
    i = bisect.bisect_right(_bases, base)
    _bases.insert(i, base)
    _ends.insert(i, base + array.nbytes)
    _arrays.insert(i, array)
    _update_reach()
    return base


def unregister(array: np.ndarray) -> None:
    base = address_of(array.reshape(-1).view(np.uint8) if array.ndim != 1 else array)
    for i in range(bisect.bisect_left(_bases, base), len(_bases)):
        if _bases[i] != base:
            break
        if _arrays[i] is array or _ends[i] - _bases[i] == array.nbytes:
            del _bases[i], _ends[i], _arrays[i]
            _update_reach()
            return


def find(addr: int, nbytes: int = 1) -> tuple[np.ndarray, int] | None:
    """The registered array holding [addr, addr + nbytes) and the offset in it, or None."""
    # the innermost region holding it: scan down from the last base <= addr while an earlier region
    # can still reach addr (a region that ends before addr may sit inside a larger one that does not)
    i = bisect.bisect_right(_bases, addr) - 1
    while i >= 0 and _reach[i] > addr:
        if addr + nbytes <= _ends[i]:
            return _arrays[i], addr - _bases[i]
        i -= 1
    return None


def is_host_address(addr: int | None, nbytes: int = 1) -> bool:
    return addr is not None and find(addr, nbytes) is not None


def view(addr: int, type: GGMLType, ne: list[int], nb: list[int], name: str = "?") -> np.ndarray:
    """A numpy view of host memory at `addr`: reversed `ne` and `nb`, quantized as uint8 blocks, BF16 as uint16."""
    tr = TYPE_TRAITS[type]
    if tr.blck_size > 1:
        dtype = np.dtype(np.uint8)
        shape = (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size)
        strides = (nb[3], nb[2], nb[1], 1)
    else:
        dtype = tr.np_dtype
        shape = (ne[3], ne[2], ne[1], ne[0])
        strides = (nb[3], nb[2], nb[1], nb[0])
    extent = nbytes_of(type, ne, nb)
    if extent == 0:  # an empty tensor reads and writes nothing (ggml places it anywhere, a buffer's end too)
        return np.empty(shape, dtype=dtype)
    found = find(addr, extent)
    if found is None:
        raise OutOfBoundsError(
            f"tensor '{name}': {extent} bytes at address {addr:#x} are not inside any host memory"
        )
    array, offset = found
    return np.ndarray(shape, dtype=dtype, buffer=array, offset=offset, strides=strides)


def tensor_view(t: Tensor) -> np.ndarray:
    """Zero-copy numpy view of a tensor in host memory (see `view`)."""
    if t.data is None:
        raise NotAllocatedError(f"tensor '{t.name}' has no memory (data is None)")
    return view(t.data, t.type, t.ne, t.nb, t.name)
