"""CPU kernels: reductions and sorting (SUM, SUM_ROWS, MEAN, ARGMAX, ARGSORT, TOP_K).

F32 and F16 sources; sums accumulate in f32 with numpy's pairwise summation
(SUM, one value over the whole tensor, in f64 as ggml's ggml_float).

A source is read as ggml's kernels read it (`ggml_rows`): each row's ne0
elements one after another from the row's first, whatever its nb0 (ggml's
SUM, MEAN, ARGMAX, ARGSORT and TOP_K assert nb0 = the element size only in
debug builds), so a permuted source gives ggml's result. SUM_ROWS, whose
ggml kernel refuses such a source, sums it along its strides.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    noop,
    require_types,
    scratch,
    strided_view,
)
from pyggml.core.errors import ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import ArgsortParams
from pyggml.core.tensor import GGMLOp, SortOrder, Tensor
from pyggml.core.types import GGMLType


def _src(node: Tensor, srcs: list[np.ndarray | None]) -> np.ndarray:
    require_types(node, FLOAT_TYPES, node.src[0])
    x = srcs[0]
    assert x is not None
    return x


def ggml_rows(node: Tensor, x: np.ndarray, flat: bool = False) -> np.ndarray:
    """src0 `x` as ggml's row kernels read it: row (i1, i2, i3) at i1 nb1 + i2 nb2 + i3 nb3, or with `flat` (its
    ARGSORT, TOP_K) row i = i1 + ne1 (i2 + ne2 i3) at i nb1; a row's ne0 elements at the element size apart.
    The same view for a row-contiguous source; OutOfBoundsError if rows so read leave src0's bytes."""
    s1 = x.strides[2]
    rows = (x.shape[1] * x.shape[2] * s1, x.shape[2] * s1, s1) if flat else x.strides[:3]
    strides = (*rows, x.itemsize)
    if strides == x.strides or x.size == 0:
        return x
    return strided_view(x, x.shape, strides, f"CPU {node.op.name} '{node.name}': the rows of src0 as ggml reads them")


def _require_int_dst(node: Tensor) -> None:
    if node.type != GGMLType.I32:
        raise UnsupportedTypeError(f"CPU {node.op.name} '{node.name}': dst must be I32, not {node.type.name}")


def sum_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[0] = the sum of all of src0's elements."""
    x = ggml_rows(node, _src(node, srcs))
    require_types(node, FLOAT_TYPES, node)
    if dst.size != 1:
        raise ShapeError(f"CPU SUM '{node.name}': dst must hold one element, has ne {list(dst.shape[::-1])}")
    d = dst.reshape(())

    def run() -> None:
        d[()] = np.sum(x, dtype=np.float64)

    return run


def sum_rows_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[0, i1, i2, i3] = sum over i0 of src0[i0, i1, i2, i3]."""
    x = _src(node, srcs)
    require_types(node, FLOAT_TYPES, node)
    if dst.shape != x.shape[:3] + (1,):
        raise ShapeError(f"CPU SUM_ROWS '{node.name}': dst ne {list(dst.shape[::-1])} for src ne {list(x.shape[::-1])}")
    if dst.size == 0:
        return noop
    fn = functools.partial(np.add.reduce, x, axis=-1, dtype=F32, out=dst, keepdims=True)
    if x.dtype != F32 or dst.dtype != F32 or x.strides[3] != 4 or x.shape[3] > PAIRWISE_BLOCK:
        return fn
    return graph_runner.with_split_step(fn, _sum_rows_job(), [], [x, dst])


PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: rows up to it are summed without its recursion (numba caches none)


@njit(nogil=True, cache=True)
def pairwise_sum(a, i0, n):
    """numpy's pairwise summation of float32 a[i0:i0 + n], n <= PAIRWISE_BLOCK (add.reduce's inner loop)."""
    if n < 8:
        res = np.float32(0.0)
        for i in range(n):
            res += a[i0 + i]
        return res
    r0, r1, r2, r3 = a[i0], a[i0 + 1], a[i0 + 2], a[i0 + 3]
    r4, r5, r6, r7 = a[i0 + 4], a[i0 + 5], a[i0 + 6], a[i0 + 7]
    i = 8
    while i < n - n % 8:
        r0, r1, r2, r3 = r0 + a[i0 + i], r1 + a[i0 + i + 1], r2 + a[i0 + i + 2], r3 + a[i0 + i + 3]
        r4, r5, r6, r7 = r4 + a[i0 + i + 4], r5 + a[i0 + i + 5], r6 + a[i0 + i + 6], r7 + a[i0 + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i0 + i]
        i += 1
    return res


@njit(nogil=True, cache=True)
def sum_rows_step(p, ith, nth):
    """Thread ith's rows of SUM_ROWS, each summed as numpy's add.reduce (0 plus the pairwise sum)."""
    x, dst = graph_runner.two_f32(p)
    r0, r1 = graph_runner.share_of(x, ith, nth)
    for r in range(r0, r1):
        graph_runner.row_at(dst, r)[0] = np.float32(0.0) + pairwise_sum(graph_runner.row_at(x, r), 0, x.shape[3])
    return 0


@functools.cache
def _sum_rows_job() -> int:
    return graph_runner.split_job(sum_rows_step)


def mean_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[0, i1, i2, i3] = the mean of row (i1, i2, i3) of src0."""
    x = ggml_rows(node, _src(node, srcs))
    require_types(node, FLOAT_TYPES, node)
    if dst.shape != x.shape[:3] + (1,):
        raise ShapeError(f"CPU MEAN '{node.name}': dst ne {list(dst.shape[::-1])} for src ne {list(x.shape[::-1])}")
    if dst.size == 0:
        return noop
    n = np.float32(x.shape[3])
    if dst.dtype == F32:
        acc = dst
    else:
        (acc,) = scratch(params, dst.shape)

    def run() -> None:
        np.add.reduce(x, axis=-1, dtype=F32, out=acc, keepdims=True)
        np.divide(acc, n, out=dst)

    return run


def argmax_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[i1] = the index of the first largest element of row i1 of the matrix src0 (I32)."""
    x = _src(node, srcs)
    _require_int_dst(node)
    if x.shape[:2] != (1, 1) or dst.size != x.shape[2] or (dst.size and x.shape[3] == 0):
        raise ShapeError(f"CPU ARGMAX '{node.name}': src0 must be a matrix and dst hold one index per row "
                         f"(src ne {list(x.shape[::-1])}, dst ne {list(dst.shape[::-1])})")
    if dst.size == 0:
        return noop
    m = ggml_rows(node, x)[0, 0]
    d = dst.reshape(-1)

    def run() -> None:
        np.copyto(d, np.argmax(m, axis=-1), casting="same_kind")

    return run


def argsort_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = the indices that sort each row of src0 (I32), ascending or descending (ArgsortParams.order).

    Equal elements keep their order (a stable sort); ggml's std::sort may order ties differently.
    """
    x = _src(node, srcs)
    _require_int_dst(node)
    order = ArgsortParams.of(node).order
    if dst.shape != x.shape:
        raise ShapeError(f"CPU ARGSORT '{node.name}': dst ne {list(dst.shape[::-1])} for src ne {list(x.shape[::-1])}")
    if dst.size == 0:
        return noop
    x = ggml_rows(node, x, flat=True)

    if order == SortOrder.ASC:
        def run() -> None:
            np.copyto(dst, np.argsort(x, axis=-1, kind="stable"), casting="same_kind")
    else:
        def run() -> None:
            np.copyto(dst, np.argsort(np.negative(x), axis=-1, kind="stable"), casting="same_kind")

    if x.dtype != F32:
        return run
    return graph_runner.with_split_step(run, _argsort_job(), [int(order != SortOrder.ASC)], [x, dst])


@njit(nogil=True, cache=True)
def argsort_step(p, ith, nth):
    """Thread ith's rows of ARGSORT: numba's stable mergesort (NaNs last, as numpy's), descending on -x."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (1 + 2 * v,))
    x, dst = graph_runner.view_f32(d, 1), graph_runner.view_i32(d, 1 + v)
    r0, r1 = graph_runner.share_of(x, ith, nth)
    for r in range(r0, r1):
        row = -graph_runner.row_at(x, r) if d[0] else graph_runner.row_at(x, r).copy()
        graph_runner.row_at(dst, r)[:] = np.argsort(row, kind="mergesort")
    return 0


@functools.cache
def _argsort_job() -> int:
    return graph_runner.split_job(argsort_step)


def top_k_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = the indices of the ne0 largest elements of each row of src0 (I32), largest first.

    ggml's TOP_K promises no order (its kernel swaps the first two); this one sorts, ties in index order.
    """
    x = _src(node, srcs)
    _require_int_dst(node)
    k = dst.shape[3]
    if dst.shape[:3] != x.shape[:3] or k > x.shape[3]:
        raise ShapeError(f"CPU TOP_K '{node.name}': dst ne {list(dst.shape[::-1])} for src ne {list(x.shape[::-1])}")
    if dst.size == 0:
        return noop
    x = ggml_rows(node, x, flat=True)

    def run() -> None:
        np.copyto(dst, np.argsort(np.negative(x), axis=-1, kind="stable")[..., :k], casting="same_kind")

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.SUM: sum_kernel,
    GGMLOp.SUM_ROWS: sum_rows_kernel,
    GGMLOp.MEAN: mean_kernel,
    GGMLOp.ARGMAX: argmax_kernel,
    GGMLOp.ARGSORT: argsort_kernel,
    GGMLOp.TOP_K: top_k_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: F32/F16 sources, I32 dst for ARGMAX and ARGSORT."""
    if node.op not in KERNELS or not all_float(node.src[0]):
        return False
    if node.op in (GGMLOp.ARGMAX, GGMLOp.ARGSORT, GGMLOp.TOP_K):
        return node.type == GGMLType.I32
    return all_float(node)
