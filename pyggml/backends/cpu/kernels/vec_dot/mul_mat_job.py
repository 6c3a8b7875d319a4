"""MUL_MAT's rows as a job of the worker threads: the work items, the operands by address, the job per weight type."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, types
from numba.extending import overload

from pyggml.backends.cpu.jit import compiled_address
from pyggml.backends.cpu.kernels.atomics import (
    address,
    atomic_add,
    atomic_load,
    pointer_f32,
    pointer_i8,
    pointer_i32,
    pointer_i64,
    pointer_u8,
    sleep_us,
    spin_pause,
    yield_cpu,
)
from pyggml.backends.cpu.kernels.threads import (
    SLOT_LEN,
    WAIT_SLEEP_US,
    YIELD_POLLS,
    call_job,
    claim,
    finish,
    revoke,
)
from pyggml.backends.cpu.kernels.vec_dot.half_orders import ROW_BLOCK, cols_per_pass, half_cols, half_kind
from pyggml.backends.cpu.kernels.vec_dot.ir import COLS
from pyggml.backends.cpu.kernels.vec_dot.kinds import (
    BF16,
    F16,
    HALF_ORDER,
    TILED,
    X8_GEMV,
    X8_REPACKED,
    X8_TILE,
    kind_name,
)
from pyggml.backends.cpu.kernels.vec_dot.quantize_src1 import ROUND_REF, ROUND_X86
from pyggml.backends.cpu.kernels.vec_dot.tiles_x8 import TILE_ROWS, X8_GROUPS_A_PASS, tile_x8
from pyggml.backends.cpu.kernels.vec_dot.type_table import row_of_kind
from pyggml.backends.cpu.numerics import host_x86_level
from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.types import TYPE_TRAITS, GGMLType

HOST_X86_LEVEL = host_x86_level()
# the src1 columns ggml's repack gemm takes at once (forward_mul_mat_one_chunk: the rest go to its gemv)
GEMM_COLS = 4


# weight bytes of a panel of rows, which every group of src1 columns passes over before the next: it stays in L2
PANEL_BYTES = 1 << 19


@njit(inline="always", cache=True)
def panel_rows(row_bytes, multiple):
    """Rows of about PANEL_BYTES of `row_bytes` each, a multiple of `multiple` (the rows a pass of the loop takes)."""
    return max(multiple, PANEL_BYTES // max(1, row_bytes) // multiple * multiple)


def mul_mat_range(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
    """Weight rows m0..m1 of output slice s against its n_cols src1 rows, by the type table's kernel of `kind`."""
    raise NotImplementedError("mul_mat_range runs compiled only")


@overload(mul_mat_range, prefer_literal=True, inline="always")
def _mul_mat_range(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
    """The loop of one constant kind, chosen at typing (DESIGN.md, "The MUL_MAT job"); inlined: no refcounts."""
    if not (isinstance(kind, types.IntegerLiteral) and isinstance(rounding, types.IntegerLiteral)):
        raise numba.errors.TypingError(f"mul_mat_range: kind and rounding must be constants, not {kind}, {rounding}")
    k, x86 = kind.literal_value, rounding.literal_value == ROUND_X86
    row = row_of_kind(k)
    if row.vec_dot_type is None:
        raise UnsupportedTypeError(f"mul_mat_range: {row.type.name} has no vec_dot")
    if X8_TILE <= k < X8_GEMV:  # this item's rows repacked into a tile, whose row m0 is at offs[0]
        t, loop = int(row.type), row.x8

        def tiles(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
            base, r0 = w_base[s], s * n_cols
            r1 = r0 + n_cols
            for t0 in range(m0, m1, TILE_ROWS):
                t1 = min(m1, t0 + TILE_ROWS)
                tile, offs = tile_x8(w, w_off, base, t0, t1, nb, t)
                for r in range(r0, r1, COLS):
                    loop(tile, offs, -t0, t0, t1, nb, yq, yd, yb, r, min(COLS, r1 - r), out)

        return tiles
    if X8_REPACKED <= k < X8_TILE and row.x8_gemv is not None:  # as ggml's repack: gemm on columns in fours, gemv after
        gemm, gemv = row.x8, row.x8_gemv

        block_bytes, pass_rows = TYPE_TRAITS[row.type].type_size, TILE_ROWS * X8_GROUPS_A_PASS

        def gemm_then_gemv(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
            base, r0, sums = w_base[s], s * n_cols, column_sums(kind, ys, yb)
            r1 = r0 + n_cols
            r4 = r1 - n_cols % GEMM_COLS
            panel = panel_rows(nb * block_bytes, pass_rows)
            for p0 in range(m0, m1, panel):
                p1 = min(m1, p0 + panel)
                for r in range(r0, r4, COLS):
                    gemm(w, w_off, base, p0, p1, nb, yq, yd, sums, r, min(COLS, r4 - r), out)
                for r in range(r4, r1, COLS):
                    gemv(w, w_off, base, p0, p1, nb, yq, yd, sums, r, min(COLS, r1 - r), out)

        return gemm_then_gemv
    if TILED <= k < HALF_ORDER:  # ggml-cpu's tiled matmul: the item's rows against all its columns at once
        tiled = row.tiled

        def tiled_rows(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
            tiled(w, w_off, w_base[s], m0, m1, nb, yq, yd, yb, s * n_cols, n_cols, out)

        return tiled_rows
    step = COLS
    if k >= HALF_ORDER:  # MUL_MAT and MUL_MAT_ID pack src1 as half_orders.src1_bits says
        loop, step = half_cols(k, True), cols_per_pass(k)
    elif k in (F16, BF16):  # a plain half kind (the products take HALF_ORDER kinds): the host's vec_dot rows
        loop = half_cols(half_kind(k, x86, HOST_X86_LEVEL, 1, 0, 0, False), False)
    else:
        loop = row.x8_gemv if k >= X8_GEMV else row.x8 if k >= X8_REPACKED else row.cols_for(x86)
    if loop is not None and row.float_src1:
        elem_bytes = TYPE_TRAITS[row.type].type_size

        def float_cols(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
            base, r0 = w_base[s], s * n_cols
            r1 = r0 + n_cols
            panel = panel_rows(xf.shape[1] * elem_bytes, ROW_BLOCK)
            for p0 in range(m0, m1, panel):
                p1 = min(m1, p0 + panel)
                for r in range(r0, r1, step):
                    loop(w, w_off, base, p0, p1, xf, r, min(step, r1 - r), out)

        return float_cols
    if loop is not None:
        def cols(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
            base, r0, sums = w_base[s], s * n_cols, column_sums(kind, ys, yb)
            r1 = r0 + n_cols
            for r in range(r0, r1, COLS):
                loop(w, w_off, base, m0, m1, nb, yq, yd, sums, r, min(COLS, r1 - r), out)

        return cols
    dot = row.dot_for(x86)

    def dots(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding):
        base, r0, sums = w_base[s], s * n_cols, column_sums(kind, ys, yb)
        for m in range(m0, m1):
            o = w_off[base + m]
            for r in range(r0, r0 + n_cols):
                out[r, m] = dot(w, o, nb, yq, yd, sums, r)

    return dots


def column_sums(kind, ys, yb):
    """The src1 block sums the kernels of `kind` read: Q8_1's s (`ys`) for the mins, else the 16-value sums."""
    raise NotImplementedError("column_sums runs compiled only")


@overload(column_sums, prefer_literal=True, inline="always")
def _column_sums(kind, ys, yb):
    if row_of_kind(kind.literal_value).vec_dot_type == GGMLType.Q8_1:
        return lambda kind, ys, yb: ys
    return lambda kind, ys, yb: yb


@njit(nogil=True, cache=True, inline="always")
def mul_mat_rows(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, chunk, ctr, wait, wait_polls,
                 rounding):
    """out[s*n_cols + c, m] = vec_dot(weight row w_off[w_base[s] + m], src1 row s*n_cols + c), `w` the weights'
    bytes, src1 as `xf` (float weights) or the quantized arrays. Threads take work items from `ctr`; the caller
    (`wait`) returns when all are done (DESIGN.md, "The MUL_MAT job")."""
    n_slices = w_base.shape[0]
    M = out.shape[1]
    n_chunks = (M + chunk - 1) // chunk
    total = n_slices * n_chunks
    while True:
        s, m0, m1 = take_item(ctr, total, n_chunks, chunk, M)
        if s < 0:
            break
        mul_mat_range(kind, w, w_off, nb, xf, yq, yd, ys, yb, n_cols, w_base, out, s, m0, m1, rounding)
        atomic_add(ctr, 1, 1)
    if wait:
        wait_for_items(ctr, total, wait_polls)


@njit(nogil=True, cache=True, inline="always")
def take_item(ctr, total, n_chunks, chunk, M):
    """The next of `total` work items from the counter ctr[0]: (slice, first row, end row) of n_chunks per slice,
    or slice -1 when none is left."""
    item = atomic_add(ctr, 0, 1)
    if item >= total:
        return -1, 0, 0
    m0 = (item % n_chunks) * chunk
    return item // n_chunks, m0, min(M, m0 + chunk)


@njit(nogil=True, cache=True, inline="always")
def wait_for_items(ctr, total, wait_polls):
    """Until `total` items are done (ctr[1]): spinning `wait_polls` polls, then sleeping between polls."""
    polls = 0
    while atomic_load(ctr, 1) < total:
        if polls < wait_polls:
            spin_pause()
            polls += 1
        else:
            sleep_us(WAIT_SLEEP_US)


# the fields of a job (mul_mat_desc) from element 1 of a slot (element 0: its state); the last, the job's address
_JOB_FIELDS = 32
assert 1 + _JOB_FIELDS <= SLOT_LEN
_JOB_ADDRESS = 31
WAIT_POLLS = 32
_JOB_SIG = types.int64(types.CPointer(types.int64), types.int64)
ROUNDING_NAMES = {ROUND_REF: "ref", ROUND_X86: "x86"}





def mul_mat_desc(kind: int, w: np.ndarray, w_off: np.ndarray, nb: int, xf: np.ndarray, yq: np.ndarray,
                 yd: np.ndarray, ys: np.ndarray, yb: np.ndarray, n_cols: int, w_base: np.ndarray, out: np.ndarray,
                 chunk: int, ctr: np.ndarray, rounding: int) -> np.ndarray:
    """`mul_mat_rows`' arguments as a slot: each C-contiguous array by address and shape, then the compiled job's
    address. `chunk` 0: the whole product on one thread. The arrays must outlive every call of the job."""
    desc = np.zeros(SLOT_LEN, np.int64)
    fields: list[int] = [kind]
    for a, dims, dtype in ((w, 1, np.uint8), (w_off, 1, np.int64), (nb, 0, None), (xf, 2, np.float32),
                           (yq, 2, np.int8), (yd, 2, np.float32), (ys, 2, np.float32), (yb, 2, np.int32),
                           (n_cols, 0, None), (w_base, 1, np.int64), (out, 2, np.float32), (chunk, 0, None),
                           (ctr, 1, np.int64)):
        if dims == 0:
            fields.append(int(a))
            continue
        if a.dtype != dtype or a.ndim != dims or not a.flags.c_contiguous:
            raise ValueError(f"mul_mat_desc: an operand of dtype {a.dtype}, shape {a.shape} is not a C-contiguous "
                             f"{dims}-D {np.dtype(dtype)} array")
        fields += [address(a), *a.shape]
    fields += [job_address(kind, rounding), 0]  # WAIT_POLLS: the caller sets it (matmul._run_shared)
    assert len(fields) == _JOB_FIELDS
    desc[1:1 + len(fields)] = fields
    return desc


@njit(nogil=True, cache=True, inline="always")
def desc_operands(d):
    """The operands a MUL_MAT job's slot holds at fields shared with MUL_MAT_ID's (mul_mat_id_job): w, w_off, nb,
    xf, yq, yd, ys, yb and out."""
    w = numba.carray(pointer_u8(d[2]), (d[3],))
    w_off = numba.carray(pointer_i64(d[4]), (d[5],))
    xf = numba.carray(pointer_f32(d[7]), (d[8], d[9]))
    yq = numba.carray(pointer_i8(d[10]), (d[11], d[12]))
    yd = numba.carray(pointer_f32(d[13]), (d[14], d[15]))
    ys = numba.carray(pointer_f32(d[16]), (d[17], d[18]))
    yb = numba.carray(pointer_i32(d[19]), (d[20], d[21]))
    out = numba.carray(pointer_f32(d[25]), (d[26], d[27]))
    return w, w_off, d[6], xf, yq, yd, ys, yb, out


@njit(nogil=True, cache=True, inline="always")
def desc_counter(d):
    """The job's item counter and weight rows per item; chunk 0 (one thread): a counter of its own and every row
    of out in one item (one copy of the inlined loops)."""
    chunk = d[28]
    if chunk == 0:
        return np.zeros(2, np.int64), max(d[27], 1)
    return numba.carray(pointer_i64(d[29]), (d[30],)), chunk


@njit(nogil=True, cache=True, inline="always")
def _run_desc(kind, d, shared, rounding):
    """`mul_mat_rows` on the operands of job `d` (`shared`: the caller's share, which waits for every item)."""
    w, w_off, nb, xf, yq, yd, ys, yb, out = desc_operands(d)
    w_base = numba.carray(pointer_i64(d[23]), (d[24],))
    ctr, chunk = desc_counter(d)
    mul_mat_rows(kind, w, w_off, nb, xf, yq, yd, ys, yb, d[22], w_base, out, chunk, ctr, shared != 0,
                 d[WAIT_POLLS], rounding)


def _make_mul_mat_job(kind: int, rounding: int):
    """The job of one weight type and rounding, both constants: numba compiles that type's loop alone."""

    def job(p, shared):
        _run_desc(kind, numba.carray(p, (SLOT_LEN,)), shared, rounding)
        return 0

    job.__name__ = job.__qualname__ = f"mul_mat_{kind_name(kind)}_{ROUNDING_NAMES[rounding]}"
    return njit(nogil=True, cache=True)(job)


@functools.cache
def job_address(kind: int, rounding: int) -> int:
    """The address of the compiled MUL_MAT job of `kind` and `rounding` (compiled on the first call)."""
    if rounding not in ROUNDING_NAMES:
        raise ValueError(f"job_address: rounding {rounding} is not ROUND_REF or ROUND_X86")
    return compiled_address(_make_mul_mat_job(kind, rounding), _JOB_SIG)


@njit(nogil=True, cache=True)
def mul_mat_job(d, shared):
    """Run the MUL_MAT job `d` (see mul_mat_desc) by its compiled function; `shared` (0 or 1) as in `_run_desc`."""
    call_job(d[_JOB_ADDRESS], d, shared)


@njit(nogil=True, cache=True)
def mul_mat_spin(slot, spins):
    """A worker's loop: runs the MUL_MAT jobs posted to `slot` until `spins` polls pass without one."""
    idle = 0
    while idle < spins:
        if claim(slot):
            call_job(slot[_JOB_ADDRESS], slot, 0)
            finish(slot)
            idle = 0
        else:
            spin_pause()
            idle += 1
            if idle % YIELD_POLLS == 0:
                yield_cpu()


@njit(nogil=True, cache=True)
def mul_mat_shared(d, slots, n):
    """The caller's share of the job `d` posted to n workers' slots, then the slots revoked."""
    call_job(d[_JOB_ADDRESS], d, 1)
    revoke(slots, n)


