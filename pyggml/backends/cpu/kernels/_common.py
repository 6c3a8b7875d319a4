"""Helpers the CPU kernels share at prepare time: checks, strided views, ggml broadcasting, scratch, BF16."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pyggml.backends.cpu.kernels import Compute, ComputeParams
from pyggml.backends.cpu.kernels.vec_dot.type_table import CONVERTIBLE_TYPES, WRITABLE_TYPES
from pyggml.core.checks import check_host_alloc
from pyggml.core.errors import OutOfBoundsError, OutOfMemoryError, ShapeError, UnsupportedTypeError
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

F32 = np.dtype(np.float32)
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16)
# a temporary sized by op_params is bounded: a padding or stride cannot make a few bytes take the host's memory
TEMPORARY_FLOOR = 64 << 20
TEMPORARY_RATIO = 16


def noop() -> None:
    """The compute function of a node with nothing to do."""


def require_types(node: Tensor, allowed: Sequence[GGMLType], *tensors: Tensor | None) -> None:
    """Raise UnsupportedTypeError naming the op and tensor unless every tensor's type is allowed."""
    for t in tensors:
        if t is not None and t.type not in allowed:
            names = ", ".join(a.name for a in allowed)
            raise UnsupportedTypeError(
                f"CPU {node.op.name}: tensor '{t.name}' has type {t.type.name}; this kernel takes {names}"
            )


def check_temporary(node: Tensor, what: str, shape: Sequence[int], itemsize: int = 4) -> None:
    """OutOfMemoryError naming the node unless a temporary of `shape` is within the TEMPORARY_ bounds and the host's."""
    nbytes = math.prod(max(int(n), 0) for n in shape) * itemsize
    held = sum(t.nelements() * TYPE_TRAITS[t.type].type_size // TYPE_TRAITS[t.type].blck_size
               for t in (node, *node.src) if t is not None)
    limit = max(TEMPORARY_FLOOR, TEMPORARY_RATIO * held)
    if nbytes > limit:
        raise OutOfMemoryError(f"CPU {node.op.name} '{node.name}': {what} of shape {list(shape)} would take {nbytes} "
                               f"bytes, more than {limit} (its tensors hold {held})")
    check_host_alloc(nbytes, f"CPU {node.op.name} '{node.name}': {what}")


def is_multiple(n: int, m: int) -> bool:
    """Whether n is a whole number of m's, as ggml's broadcasts and tilings ask (none of none; never of 0)."""
    return n % m == 0 if m > 0 else n == 0


def check_same_shape(node: Tensor, dst: np.ndarray, src: np.ndarray) -> None:
    if src.shape != dst.shape:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 ne {list(src.shape[::-1])} and dst ne "
                         f"{list(dst.shape[::-1])} differ")


def all_float(*tensors: Tensor | None) -> bool:
    return all(t is None or t.type in FLOAT_TYPES for t in tensors)


def byte_span(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """The bytes [lo, hi) from an array's first element that its elements occupy ((0, 0) when it has none)."""
    if 0 in shape:
        return 0, 0
    lo, hi = 0, itemsize
    for n, s in zip(shape, strides, strict=True):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi


def strided_view(a: np.ndarray, shape: Sequence[int], strides: Sequence[int], what: str,
                 writeable: bool | None = None) -> np.ndarray:
    """`a`'s memory with `shape` and byte `strides`: the kernels' one strided view (as_strided checks nothing),
    OutOfBoundsError naming `what` unless every byte it reaches is one `a` reaches."""
    shape, strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
    if len(shape) != len(strides) or min(shape, default=0) < 0:
        raise ShapeError(f"{what}: a view of shape {shape} with strides {strides}")
    lo, hi = byte_span(shape, strides, a.itemsize)
    a_lo, a_hi = byte_span(a.shape, a.strides, a.itemsize)
    if hi > lo and (lo < a_lo or hi > a_hi):
        raise OutOfBoundsError(f"{what}: a view of shape {list(shape)} with byte strides {list(strides)} reaches "
                               f"bytes [{lo}, {hi}) of an array of bytes [{a_lo}, {a_hi}) (shape {list(a.shape)}, "
                               f"strides {list(a.strides)})")
    return as_strided(a, shape, strides, writeable=a.flags.writeable if writeable is None else writeable)


def split_axis(a: np.ndarray, axis: int, outer: int, inner: int) -> np.ndarray:
    if outer * inner != a.shape[axis] or min(outer, inner) < 0:
        raise ShapeError(f"axis {axis} of shape {list(a.shape)} does not split into {outer} x {inner}")
    s = a.strides[axis]
    shape = a.shape[:axis] + (outer, inner) + a.shape[axis + 1:]
    strides = a.strides[:axis] + (s * inner, s) + a.strides[axis + 1:]
    return strided_view(a, shape, strides, f"axis {axis} of {list(a.shape)} split into {outer} x {inner}")


def ggml_broadcast(big: Sequence[np.ndarray], small: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Views that make `small` repeat over the same-shape arrays in `big` as ggml tiles (element i at i % m): an
    axis n against m (1 < m < n) becomes (n/m, m) and (1, m), numpy broadcasting only size-1 axes."""
    big = list(big)
    shape = big[0].shape
    axis = len(shape) - 1
    while axis >= 0:
        n, m = shape[axis], small.shape[axis]
        if m != n and m != 1:
            big = [split_axis(b, axis, n // m, m) for b in big]
            small = split_axis(small, axis, 1, m)
        axis -= 1
    return big, small


def collapse(*arrays: np.ndarray) -> list[np.ndarray]:
    """Same-shape views, size-1 axes dropped and adjacent axes merged: longer numpy inner loops."""
    shape = arrays[0].shape
    axes = [i for i, n in enumerate(shape) if n != 1]
    if not axes:
        return [np.reshape(a, (1,)) for a in arrays]
    sizes = [shape[axes[-1]]]
    strides = [[a.strides[axes[-1]]] for a in arrays]
    for i in reversed(axes[:-1]):
        n = shape[i]
        if all(a.strides[i] == st[-1] * sizes[-1] for a, st in zip(arrays, strides, strict=True)):
            sizes[-1] *= n
            continue
        sizes.append(n)
        for a, st in zip(arrays, strides, strict=True):
            st.append(a.strides[i])
    sizes.reverse()
    new_shape = tuple(sizes)
    out = []
    for a, st in zip(arrays, strides, strict=True):
        st.reverse()
        # numpy's reshape makes this very view (the merged axes' strides fit) in a fraction of as_strided's time
        v = reshape_view(a, new_shape)
        if v is None or v.strides != tuple(st):
            v = strided_view(a, new_shape, st, f"{list(a.shape)} merged into {list(new_shape)}")
        out.append(v)
    return out


def reshape_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        return None


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True if `a` and `b` view the very same elements (in-place ops)."""
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


def scratch(params: ComputeParams, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    """Float32 scratch arrays from the backend's work area, valid while this node computes (nodes run in turn)."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    # 16 floats: every array starts 64-byte aligned
    padded = [(n + 15) // 16 * 16 for n in sizes]
    raw = params.work.get(4 * sum(padded)).view(np.float32)
    out = []
    pos = 0
    for shape, n, p in zip(shapes, sizes, padded, strict=True):
        out.append(raw[pos:pos + n].reshape(shape))
        pos += p
    return out


# numpy has no bfloat16: the elements are uint16


def bf16_to_f32(src: np.ndarray, out: np.ndarray) -> None:
    np.left_shift(src, 16, out=out.view(np.uint32), dtype=np.uint32)


def f32_to_bf16(src: np.ndarray, out: np.ndarray) -> None:
    """Round float32 to bf16 bits into `out` (uint16), nearest-even, NaN kept quiet (as ggml does)."""
    u = np.ascontiguousarray(src, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), rounded)
    np.copyto(out, rounded, casting="unsafe")


def through_f32(dst: np.ndarray, srcs: Sequence[np.ndarray],
                prepare: Callable[..., Compute]) -> Compute:
    """The compute of `prepare(dst, *srcs)` with every BF16 array (uint16 bits) among them replaced by an f32
    copy: BF16 sources widened before it runs, a BF16 dst rounded once after, as ggml's BF16 kernels convert
    around f32 arithmetic. Without BF16 it is `prepare`'s own compute, untouched."""
    if dst.dtype != np.uint16 and all(s.dtype != np.uint16 for s in srcs):
        return prepare(dst, *srcs)
    wide = [np.empty(s.shape, F32) if s.dtype == np.uint16 else s for s in srcs]
    d = np.empty(dst.shape, F32) if dst.dtype == np.uint16 else dst
    inner = prepare(d, *wide)
    loads = [(s, w) for s, w in zip(srcs, wide, strict=True) if w is not s]

    def run() -> None:
        for s, w in loads:
            bf16_to_f32(s, w)
        inner()
        if d is not dst:
            f32_to_bf16(d, dst)

    return run


def is_plain_float(t: GGMLType) -> bool:
    return t in FLOAT_TYPES


def is_convertible(t: GGMLType) -> bool:
    return t in CONVERTIBLE_TYPES


def is_writable(t: GGMLType) -> bool:
    return t in WRITABLE_TYPES
