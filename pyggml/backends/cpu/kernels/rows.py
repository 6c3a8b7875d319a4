"""CPU kernel of SET_ROWS (ggml_compute_forward_set_rows): src0's rows, converted by the CPU's from_float, into dst
(a view of src[2]) at the indices src1, broadcast by modulo as ggml; a repeated index keeps the last row written."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner
from pyggml.backends.cpu.kernels._common import f32_to_bf16, is_writable, noop
from pyggml.backends.cpu.kernels.vec_dot.ir import f16_bits
from pyggml.core import quants
from pyggml.core.errors import GGMLError, OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.rows import ROW_INDEX_TYPES, SET_ROWS_SRC_TYPES
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType


def _set_rows_problem(node: Tensor) -> tuple[type[GGMLError], str] | None:
    """Why the CPU cannot compute this SET_ROWS node, or None."""
    b, c = node.src[0], node.src[1]
    if b is None or c is None:
        return ShapeError, "needs src0 (rows) and src1 (indices)"
    if b.type not in SET_ROWS_SRC_TYPES:
        return UnsupportedTypeError, f"rows '{b.name}' have type {b.type.name}, not F32 or F16"
    if c.type not in ROW_INDEX_TYPES:
        return UnsupportedTypeError, f"indices '{c.name}' have type {c.type.name}, not I64 or I32"
    if not is_writable(node.type):
        return UnsupportedTypeError, f"dst type {node.type.name} has no conversion from f32 here"
    ne11, ne12 = max(c.ne[1], 1), max(c.ne[2], 1)
    if (node.ne[0] != b.ne[0] or node.ne[2] != b.ne[2] or node.ne[3] != b.ne[3] or c.ne[0] != b.ne[1]
            or b.ne[2] % ne11 or b.ne[3] % ne12 or (0 in c.ne[1:] and b.nelements() > 0)):
        return ShapeError, f"dst ne {node.ne}, rows ne {b.ne} and indices ne {c.ne} do not fit"
    tr = TYPE_TRAITS[node.type]
    if node.ne[0] % tr.blck_size or (node.ne[0] != tr.blck_size and node.nb[0] != tr.type_size):
        return ShapeError, f"dst rows must be contiguous whole {tr.name} blocks (ne {node.ne}, nb {node.nb})"
    return None


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.SET_ROWS and _set_rows_problem(node) is None


def _converter(t: GGMLType, simd: bool) -> Callable[[np.ndarray], np.ndarray]:
    """f32 rows (..., ne0) -> rows of type t as dst's view holds them (quantized: row bytes)."""
    if t == GGMLType.F32:
        return lambda v: v
    if t == GGMLType.F16:
        return lambda v: v.astype(np.float16)
    if t == GGMLType.BF16:
        def bf16(v: np.ndarray) -> np.ndarray:
            out = np.empty(v.shape, np.uint16)
            f32_to_bf16(v, out)
            return out

        return bf16
    return lambda v: quants.from_float_cpu(t, np.ascontiguousarray(v), simd)


def set_rows_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                    params: ComputeParams) -> Compute:
    """SET_ROWS: the rows of src0 into dst at the indices src1."""
    problem = _set_rows_problem(node)
    if problem is not None:
        cls, reason = problem
        raise cls(f"CPU SET_ROWS '{node.name}': {reason}")
    b, c = srcs[0], srcs[1]
    b_t = node.src[0]
    assert b is not None and c is not None and b_t is not None
    ne03, ne02, ne01 = b.shape[0], b.shape[1], b.shape[2]
    if ne03 * ne02 * ne01 == 0 or node.ne[0] == 0:
        return noop
    n_rows = node.ne[1]
    copy_f16 = b_t.type == GGMLType.F16 and node.type == GGMLType.F16  # ggml copies the halves as they are
    name = node.name
    if ne03 == ne02 == 1 and node.type in (GGMLType.F32, GGMLType.F16) and (copy_f16 or b.dtype == np.float32):
        return _set_rows_2d(c[0, 0, 0], b[0, 0], dst[0, 0], n_rows, name)
    ne12, ne11 = c.shape[1], c.shape[2]
    i3 = np.arange(ne03)[:, None, None]
    i2 = np.arange(ne02)[None, :, None]
    convert = _converter(node.type, params.numerics == "x86")

    def run() -> None:
        rows = c[0][i3 % ne12, i2 % ne11, np.arange(ne01)[None, None, :]].astype(np.int64)  # (ne03, ne02, ne01)
        if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
            raise _out_of_bounds(name, int(rows.min()) if rows.min() < 0 else int(rows.max()), n_rows)
        values = b if copy_f16 else convert(b.astype(np.float32))
        dst[i3, i2, rows] = values

    return run


def _out_of_bounds(name: str, row: int, n_rows: int) -> OutOfBoundsError:
    return OutOfBoundsError(f"CPU SET_ROWS '{name}': row index {row} outside [0, {n_rows})")


def _set_rows_2d(idx: np.ndarray, values: np.ndarray, dst: np.ndarray, n_rows: int, name: str) -> Compute:
    """One matrix into F32 or F16 rows in one numba call (a decode step's small KV-cache writes, where the general
    path's index grids cost more than the write), every index checked before any row is written."""
    to_f16 = dst.dtype == np.float16 and values.dtype != np.float16
    into = dst.view(np.uint16) if dst.dtype == np.float16 else dst
    src = values.view(np.uint16) if values.dtype == np.float16 else values

    def run() -> None:
        bad = _write_rows(idx, src, into, n_rows, to_f16)
        if bad >= 0:
            raise _out_of_bounds(name, int(idx[bad]), n_rows)

    if src.dtype != np.float32 or np.may_share_memory(into, src) or np.may_share_memory(into, idx):
        return run
    desc = graph_runner.descriptor([int(to_f16), n_rows, idx.dtype == np.int64, -1], [idx, src, into])
    if desc is None:
        return run

    def check() -> None:
        if desc[_BAD] >= 0:
            raise _out_of_bounds(name, int(idx[desc[_BAD]]), n_rows)

    step = graph_runner.Step(graph_runner.ALONE, _set_rows_job(), desc, keep=(idx, src, into), after=check)
    return graph_runner.with_steps(run, (step,))


_BAD = 3  # the set-rows step's field for the first bad index's position (-1: none)


@njit(nogil=True, cache=True, inline="always")
def _write_into(d, into, to_f16):
    """_write_rows into `into` with the step's indices (I64 or I32) and values; the first bad position in d[_BAD]."""
    v = graph_runner.VIEW_FIELDS
    src = graph_runner.view_f32(d, 4 + v)[0, 0]
    if d[2]:
        d[_BAD] = _write_rows(graph_runner.view_i64(d, 4)[0, 0, 0], src, into, d[1], to_f16)
    else:
        d[_BAD] = _write_rows(graph_runner.view_i32(d, 4)[0, 0, 0], src, into, d[1], to_f16)


@njit(nogil=True, cache=True)
def set_rows_step(p, shared):
    """_write_rows on the step's operands (thread 0 alone), the first bad position in d[_BAD] (rows left unwritten)."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (4 + 3 * v,))
    if d[0]:
        _write_into(d, graph_runner.view_u16(d, 4 + 2 * v)[0, 0], True)
    else:
        _write_into(d, graph_runner.view_f32(d, 4 + 2 * v)[0, 0], False)
    return 0


@functools.cache
def _set_rows_job() -> int:
    return graph_runner.alone_job(set_rows_step)


@njit(nogil=True, cache=True)
def _write_rows(idx, values, dst, n_rows, to_f16):
    """dst[idx[i]] = values[i] (`to_f16`: f32 values into f16 bits, uint16), after checking every index;
    returns the first bad position, or -1."""
    for i in range(idx.shape[0]):
        if idx[i] < 0 or idx[i] >= n_rows:
            return i
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(values.shape[1]):
            dst[r, j] = f16_bits(values[i, j]) if to_f16 else values[i, j]
    return -1


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.SET_ROWS: set_rows_kernel}
