"""MUL_MAT_ID's rows as one job of the worker threads: src1's rows sorted by expert, work items (expert run, weight
rows) shared by every thread as ggml's chunks, each run by MUL_MAT's loop of its kind (DESIGN.md, "MUL_MAT_ID")."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.jit import compiled_address
from pyggml.backends.cpu.kernels.atomics import address, atomic_add, pointer_f32, pointer_i64
from pyggml.backends.cpu.kernels.threads import SLOT_LEN
from pyggml.backends.cpu.kernels.vec_dot.kinds import kind_name
from pyggml.backends.cpu.kernels.vec_dot.mul_mat_job import (
    _JOB_ADDRESS,
    _JOB_SIG,
    ROUNDING_NAMES,
    WAIT_POLLS,
    desc_counter,
    desc_operands,
    mul_mat_range,
    take_item,
    wait_for_items,
)

# a run: its expert's first weight row, its first sorted src1 row, its rows
RUN_FIELDS = 3
# the desc's fields that change with each compute (the ids are data); the others as mul_mat_desc's where shared
N_RUNS, CHUNK = 23, 28
# after the job's address and WAIT_POLLS: dst (rows of `out` in the op's order) and each sorted row's row there
DST, ORDER = WAIT_POLLS + 1, WAIT_POLLS + 2


def runs_desc(w: np.ndarray, w_off: np.ndarray, nb: int, xf: np.ndarray, yq: np.ndarray, yd: np.ndarray,
              ys: np.ndarray, yb: np.ndarray, runs: np.ndarray, out: np.ndarray, min_cols: int, ctr: np.ndarray,
              job: int, dst: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The job's operands as a slot: each C-contiguous array by address and shape, `min_cols` (the rows from which a
    run takes the job's first kind), `job`'s address (job_address), then `dst` (`out`'s shape: each item's rows
    of `out`, sorted by expert, go to row order[r] there). The caller sets N_RUNS and CHUNK (0: one thread) before
    each call; the arrays must outlive every call."""
    if dst.shape != out.shape or dst.dtype != np.float32 or not dst.flags.c_contiguous or order.dtype != np.int64 \
            or order.shape != (out.shape[0],) or not order.flags.c_contiguous:
        raise ValueError(f"runs_desc: dst {dst.dtype} {dst.shape} and order {order.dtype} {order.shape} must be "
                         f"C-contiguous float32 {out.shape} and int64 ({out.shape[0]},)")
    desc = np.zeros(SLOT_LEN, np.int64)
    fields: list[int] = [min_cols]
    for a, dtype in ((w, np.uint8), (w_off, np.int64), (nb, None), (xf, np.float32), (yq, np.int8),
                     (yd, np.float32), (ys, np.float32), (yb, np.int32), (runs, np.int64), (out, np.float32),
                     (0, None), (ctr, np.int64)):
        if dtype is None:
            fields.append(int(a))
            continue
        if a.dtype != dtype or not a.flags.c_contiguous:
            raise ValueError(f"runs_desc: an operand of dtype {a.dtype}, shape {a.shape} is not a C-contiguous "
                             f"{np.dtype(dtype)} array")
        fields += [address(a), *a.shape]
    assert len(fields) == _JOB_ADDRESS - 1
    desc[1:_JOB_ADDRESS] = fields
    desc[_JOB_ADDRESS] = job
    desc[DST], desc[ORDER] = address(dst), address(order)
    return desc


@njit(nogil=True, cache=True, inline="always")
def _run_runs(kind_many, kind_few, d, shared, rounding):
    """Items (run, rows m0..m1) from the counter until none is left; a run of d[1] rows or more by `kind_many`,
    shorter ones by `kind_few`, each item's results then copied to dst. `shared`: the caller's share, which waits
    for every item."""
    w, w_off, nb, xf, yq, yd, ys, yb, out = desc_operands(d)
    runs = numba.carray(pointer_i64(d[22]), (d[N_RUNS], RUN_FIELDS))
    dst = numba.carray(pointer_f32(d[DST]), (d[26], d[27]))
    order = numba.carray(pointer_i64(d[ORDER]), (d[26],))
    ctr, chunk = desc_counter(d)
    min_cols, M = d[1], out.shape[1]
    n_chunks = (M + chunk - 1) // chunk
    total = runs.shape[0] * n_chunks
    while True:
        i, m0, m1 = take_item(ctr, total, n_chunks, chunk, M)
        if i < 0:
            break
        r0, n = runs[i, 1], runs[i, 2]
        r1 = r0 + n
        base = runs[i, 0:1]  # the loops' w_base of slice 0: the run's expert
        if n >= min_cols:
            mul_mat_range(kind_many, w, w_off, nb, xf[r0:r1], yq[r0:r1], yd[r0:r1], ys[r0:r1], yb[r0:r1], n, base,
                          out[r0:r1], 0, m0, m1, rounding)
        else:
            mul_mat_range(kind_few, w, w_off, nb, xf[r0:r1], yq[r0:r1], yd[r0:r1], ys[r0:r1], yb[r0:r1], n, base,
                          out[r0:r1], 0, m0, m1, rounding)
        for r in range(r0, r1):  # while the rows are in cache
            dst[order[r], m0:m1] = out[r, m0:m1]
        atomic_add(ctr, 1, 1)
    if shared != 0:
        wait_for_items(ctr, total, d[WAIT_POLLS])


@njit(nogil=True, cache=True)
def route(ids, n_as, M, n_used, ne11, order, src_of, runs):
    """ggml's grouping of rows by expert (matrix_row_counts, matrix_rows), as a counting sort: order[i] the (token,
    slot) row of sorted row i, src_of[i] the src1 row it reads, runs[:n] (expert's first weight row, first sorted
    row, rows) of the n used experts in expert order; returns n, or -1 - i for the first id i outside [0, n_as)."""
    counts = np.zeros(n_as + 1, np.int64)
    for i in range(ids.shape[0]):
        e = ids[i]
        if e < 0 or e >= n_as:
            return -1 - i
        counts[e + 1] += 1
    n = 0
    for e in range(n_as):
        if counts[e + 1]:
            runs[n, 0], runs[n, 1], runs[n, 2] = e * M, counts[e], counts[e + 1]
            n += 1
        counts[e + 1] += counts[e]  # now the first sorted row of expert e + 1
    for i in range(ids.shape[0]):
        j = counts[ids[i]]
        counts[ids[i]] = j + 1
        order[j] = i
        src_of[j] = i // n_used * ne11 + i % n_used % ne11
    return n


@njit(nogil=True, cache=True)
def gather_rows(rows, yq, yd, ys, yb, gq, gd, gs, gb):
    """The quantized src1 rows `rows` names, in that order: (yq, yd, ys, yb)[rows] into (gq, gd, gs, gb)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        gq[i] = yq[r]
        gd[i] = yd[r]
        if gs.size:
            gs[i] = ys[r]
        gb[i] = yb[r]


def _make_runs_job(kind_many: int, kind_few: int, rounding: int):
    """The job of two kinds and a rounding, all constants: numba compiles those loops alone."""

    def job(p, shared):
        _run_runs(kind_many, kind_few, numba.carray(p, (SLOT_LEN,)), shared, rounding)
        return 0

    job.__name__ = job.__qualname__ = (f"mul_mat_id_{kind_name(kind_many)}_{kind_name(kind_few)}_"
                                       f"{ROUNDING_NAMES[rounding]}")
    return njit(nogil=True, cache=True)(job)


@functools.cache
def job_address(kind_many: int, kind_few: int, rounding: int) -> int:
    """The address of the compiled MUL_MAT_ID job of these kinds and rounding (compiled on the first call)."""
    if rounding not in ROUNDING_NAMES:
        raise ValueError(f"job_address: rounding {rounding} is not ROUND_REF or ROUND_X86")
    return compiled_address(_make_runs_job(kind_many, kind_few, rounding), _JOB_SIG)
