"""MUL_MAT_ID's rows as one job of the worker threads: src1's rows sorted by expert, work items (expert run, weight
rows) shared by every thread as ggml's chunks, each run by MUL_MAT's loop of its kind (DESIGN.md, "MUL_MAT_ID")."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.jit import compiled_address
from pyggml.backends.cpu.kernels.atomics import (
    address,
    atomic_add,
    pointer_f32,
    pointer_i8,
    pointer_i32,
    pointer_i64,
    pointer_u8,
)
from pyggml.backends.cpu.kernels.threads import SLOT_LEN
from pyggml.backends.cpu.kernels.vec_dot.kinds import kind_name
from pyggml.backends.cpu.kernels.vec_dot.mul_mat_job import (
    _JOB_ADDRESS,
    _JOB_SIG,
    ROUNDING_NAMES,
    WAIT_POLLS,
    mul_mat_range,
    wait_for_items,
)

# a run: its expert's first weight row, its first sorted src1 row, its rows
RUN_FIELDS = 3
# the desc's fields that change with each compute (the ids are data)
N_RUNS, CHUNK = 23, 28


def runs_desc(w: np.ndarray, w_off: np.ndarray, nb: int, xf: np.ndarray, yq: np.ndarray, yd: np.ndarray,
              ys: np.ndarray, yb: np.ndarray, runs: np.ndarray, out: np.ndarray, min_cols: int, ctr: np.ndarray,
              job: int) -> np.ndarray:
    """The job's operands as a slot: each C-contiguous array by address and shape, `min_cols` (the rows from which a
    run takes the job's first kind), then `job`'s address (job_address). The caller sets N_RUNS and CHUNK (0: one
    thread) before each call; the arrays must outlive every call."""
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
    return desc


@njit(nogil=True, cache=True, inline="always")
def _run_runs(kind_many, kind_few, d, shared, rounding):
    """Items (run, rows m0..m1) from the counter until none is left; a run of d[1] rows or more by `kind_many`,
    shorter ones by `kind_few`. `shared`: the caller's share, which waits for every item."""
    min_cols, nb, chunk = d[1], d[6], d[CHUNK]
    w = numba.carray(pointer_u8(d[2]), (d[3],))
    w_off = numba.carray(pointer_i64(d[4]), (d[5],))
    xf = numba.carray(pointer_f32(d[7]), (d[8], d[9]))
    yq = numba.carray(pointer_i8(d[10]), (d[11], d[12]))
    yd = numba.carray(pointer_f32(d[13]), (d[14], d[15]))
    ys = numba.carray(pointer_f32(d[16]), (d[17], d[18]))
    yb = numba.carray(pointer_i32(d[19]), (d[20], d[21]))
    runs = numba.carray(pointer_i64(d[22]), (d[N_RUNS], RUN_FIELDS))
    out = numba.carray(pointer_f32(d[25]), (d[26], d[27]))
    M = out.shape[1]
    if chunk == 0:  # one thread: each run whole, from a counter of its own
        ctr = np.zeros(2, np.int64)
        chunk = max(M, 1)
    else:
        ctr = numba.carray(pointer_i64(d[29]), (d[30],))
    n_chunks = (M + chunk - 1) // chunk
    total = runs.shape[0] * n_chunks
    while True:
        item = atomic_add(ctr, 0, 1)
        if item >= total:
            break
        i = item // n_chunks
        m0 = (item % n_chunks) * chunk
        m1 = min(M, m0 + chunk)
        r0, n = runs[i, 1], runs[i, 2]
        r1 = r0 + n
        base = runs[i, 0:1]  # the loops' w_base of slice 0: the run's expert
        if n >= min_cols:
            mul_mat_range(kind_many, w, w_off, nb, xf[r0:r1], yq[r0:r1], yd[r0:r1], ys[r0:r1], yb[r0:r1], n, base,
                          out[r0:r1], 0, m0, m1, rounding)
        else:
            mul_mat_range(kind_few, w, w_off, nb, xf[r0:r1], yq[r0:r1], yd[r0:r1], ys[r0:r1], yb[r0:r1], n, base,
                          out[r0:r1], 0, m0, m1, rounding)
        atomic_add(ctr, 1, 1)
    if shared != 0:
        wait_for_items(ctr, total, d[WAIT_POLLS])


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
