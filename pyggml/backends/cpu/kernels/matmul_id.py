"""CPU kernels of mixture of experts: MUL_MAT_ID through MUL_MAT's vec_dot loops, one pass for a decode step or
src1's rows grouped by expert for prompts, chosen per compute since ids are data (DESIGN.md, "MUL_MAT_ID"), and
ADD_ID, F32 only as ggml's CPU (ggml-cpu.c, ops.cpp)."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu import repack
from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner
from pyggml.backends.cpu.kernels._common import noop, reshape_view
from pyggml.backends.cpu.kernels.atomics import address
from pyggml.backends.cpu.kernels.matmul import (
    ITEMS_PER_THREAD,
    TILED_MIN_COLS,
    _carve,
    _chunk,
    _direct_work,
    _kernel_threads,
    _run_alone,
    _run_shared,
    _weight_rows,
)
from pyggml.backends.cpu.kernels.threads import SLOT_LEN
from pyggml.backends.cpu.kernels.vec_dot import half_orders, mul_mat_id_job, quantize_src1
from pyggml.backends.cpu.kernels.vec_dot import type_table as tt
from pyggml.backends.cpu.kernels.vec_dot.type_table import MUL_MAT_TYPES
from pyggml.backends.cpu.numerics import NUMERICS_CODES
from pyggml.core.errors import GGMLError, OutOfBoundsError, ShapeError, UnsupportedOpError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32

Problem = tuple[type[GGMLError], str] | None


def _raise(node: Tensor, problem: Problem) -> None:
    if problem is not None:
        cls, reason = problem
        raise cls(f"CPU {node.op.name} '{node.name}': {reason}")


def _check_ids(name: str, op: str, ids: np.ndarray, limit: int) -> None:
    """OutOfBoundsError unless every id is in [0, limit)."""
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise OutOfBoundsError(f"CPU {op} '{name}': id {bad} outside [0, {limit})")


# --- MUL_MAT_ID ---


def _mul_mat_id_problem(node: Tensor) -> Problem:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if a is None or b is None or ids is None:
        return ShapeError, "needs three sources (as, b, ids)"
    if a.type not in MUL_MAT_TYPES:
        return UnsupportedTypeError, f"as '{a.name}' has type {a.type.name}, which has no dot product here"
    if b.type != F32 or ids.type != I32 or node.type != F32:
        return UnsupportedTypeError, f"b, ids, dst must be F32, I32, F32 (are {b.type.name}, {ids.type.name}, " \
                                     f"{node.type.name})"
    if a.nb[0] != TYPE_TRAITS[a.type].type_size or b.nb[0] != 4:
        return ShapeError, f"rows must be contiguous (as nb {a.nb}, b nb {b.nb})"
    if (a.ne[3] != 1 or b.ne[3] != 1 or ids.ne[2:] != [1, 1] or a.ne[0] != b.ne[0] or ids.ne[1] != b.ne[2]
            or b.ne[1] == 0
            or ids.ne[0] % b.ne[1] or node.ne != [a.ne[1], ids.ne[0], b.ne[2], 1]):
        return ShapeError, f"as ne {a.ne}, b ne {b.ne}, ids ne {ids.ne}, dst ne {node.ne} do not fit"
    if not node.is_contiguous():
        return ShapeError, f"dst must be contiguous (nb {node.nb})"  # the direct kernels write its rows whole
    if not repack.repack_supports_op(node):
        return UnsupportedOpError, (f"as '{a.name}' is in a CPU_REPACK buffer: MUL_MAT_ID reads a repacked 3-D "
                                    f"expert tensor there whole")
    return None


def mul_mat_id_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """MUL_MAT_ID: each (token, slot) row of src1 times its expert's matrix."""
    _raise(node, _mul_mat_id_problem(node))
    a_t = node.src[0]
    assert a_t is not None
    w, x, ids = srcs[0], srcs[1], srcs[2]
    assert w is not None and x is not None and ids is not None
    if dst.size == 0:
        return noop
    if a_t.ne[0] == 0:
        return lambda: dst.fill(0)
    ids2 = ids[0, 0]  # (tokens, n_used)
    out = np.reshape(dst[0], (ids2.size, a_t.ne[1]), copy=False)
    if a_t.type == F32:
        return _f32_experts(node.name, w, x[0], ids2, out)
    return _expert_rows(node.name, a_t.type, repack.is_repacked(a_t), w, x[0], ids2, out, params)


def _expert_runs(counts: np.ndarray) -> list[tuple[int, int, int]]:
    """(expert, first sorted row, rows) of each used expert, in expert order."""
    starts = np.cumsum(counts) - counts
    return [(int(e), int(starts[e]), int(counts[e])) for e in np.flatnonzero(counts)]


def _f32_experts(name: str, w: np.ndarray, xs: np.ndarray, ids2: np.ndarray, out: np.ndarray) -> Compute:
    """F32 experts: per used expert, its matrix times its rows by BLAS (as MUL_MAT's F32 weights).
    w (1, n_as, M, K), xs (tokens, ne11, K), ids2 (tokens, n_used), out (tokens * n_used, M)."""
    n_used, ne11, n_as = ids2.shape[1], xs.shape[1], w.shape[1]

    def run() -> None:
        _check_ids(name, "MUL_MAT_ID", ids2, n_as)
        flat = ids2.reshape(-1)
        order = np.argsort(flat, kind="stable")
        for e, start, count in _expert_runs(np.bincount(flat, minlength=n_as)):
            rows = order[start:start + count]
            t, j = np.divmod(rows, n_used)
            out[rows] = xs[t, j % ne11] @ w[0, e].T

    return run


def _expert_kinds(type: GGMLType, repacked: bool, params: ComputeParams) -> tuple[int, int, int]:
    """The kernel kinds of an expert's rows: (kind from `min_cols` rows, kind below, min_cols). Repacked experts
    take the gemv order for every row (repack.cpp's forward_mul_mat_id); plain K-quants under "x86" take ggml-cpu's
    tiled order from TILED_MIN_COLS rows (ggml_compute_forward_mul_mat_id_tiled), vec_dot's below."""
    kind = int(type)
    if repacked:
        gemv = tt.X8_GEMV_KINDS.get(kind, tt.X8_KINDS[kind])
        return gemv, gemv, 0
    x86 = NUMERICS_CODES[params.numerics] == quantize_src1.ROUND_X86
    if kind in tt.TILED_KINDS and not params.batch_invariant and x86:
        return tt.TILED_KINDS[kind], kind, TILED_MIN_COLS
    if type in (F16, BF16):  # ggml_vec_dot_f16/bf16 at the params' x86 level (MUL_MAT_ID takes no llamafile)
        kind = half_orders.half_kind(kind, x86, params.x86_level, 1, 0, 0, False)
    return kind, kind, 0


def _expert_rows(name: str, type: GGMLType, repacked: bool, w: np.ndarray, xs: np.ndarray, ids2: np.ndarray,
                 out: np.ndarray, params: ComputeParams) -> Compute:
    """As ggml_compute_forward_mul_mat_id: src1's rows converted to the vec_dot type once and grouped by expert,
    then one job whose items (expert, weight rows) every thread takes, each expert's rows by MUL_MAT's loops over
    that many columns; only the chosen experts' weights are read (DESIGN.md, "MUL_MAT_ID")."""
    n_tok, n_used = ids2.shape
    ne11, K = xs.shape[1], xs.shape[2]
    M = out.shape[1]
    ny, n_src = n_tok * n_used, n_tok * ne11
    n_as = w.shape[1]
    tr = TYPE_TRAITS[type]
    vdt = tt.CPU_TYPE_TRAITS[type].vec_dot_type
    nb = K // tr.blck_size
    quantized = tr.is_quantized
    wb, w_off = _weight_rows(w)
    f32, i8, i32 = np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.int32)
    src_rows = reshape_view(xs, (n_src, K))
    copy_src = src_rows is None or not src_rows.flags.c_contiguous
    specs: list[tuple[tuple[int, ...], np.dtype]] = [((ny, M), f32)]
    if quantized:
        qk = TYPE_TRAITS[vdt].blck_size
        shapes = [((K,), i8), ((K // qk,), f32), ((K // qk,), f32), ((K // 16,), i32)]
        specs += [((n, *shape), dt) for n in (n_src, ny) for shape, dt in shapes]  # src1's rows, then routed
    if copy_src or not quantized:
        specs.append(((n_src if quantized else ny, K), f32))
    scratch = _carve(params, specs)
    sorted_out = scratch.pop(0)
    x_rows = scratch.pop() if copy_src or not quantized else src_rows
    assert x_rows is not None
    empty_f = np.zeros((0, 0), np.float32)
    if quantized:
        y_src, y_routed = scratch[:4], scratch[4:]
        xf = empty_f
    else:
        y_src, y_routed = [], [np.zeros((0, 0), np.int8), empty_f, empty_f, np.zeros((0, 0), np.int32)]
        xf = x_rows
    kind = int(type)
    kind_many, kind_few, min_cols = _expert_kinds(type, repacked, params)
    # F16/BF16 experts (the only float ones here): src1 rounded to their type, packed where the order reads bits
    pack_x = not quantized and half_orders.src1_bits(kind_many) != 0
    group = repack.X8_ROWS if kind_many in tt.X8_GROUP_KINDS or kind_few in tt.X8_GROUP_KINDS else 1
    rounding = NUMERICS_CODES[params.numerics]
    runs = np.zeros((n_as, mul_mat_id_job.RUN_FIELDS), np.int64)
    order, src_of = np.zeros(ny, np.int64), np.zeros(ny, np.int64)
    nt = _kernel_threads(params, _direct_work(kind, M, K, 1, ny))
    ctr = np.zeros(2, np.int64)
    desc = mul_mat_id_job.runs_desc(wb, w_off, nb, xf, *y_routed, runs, sorted_out, min_cols, ctr,
                                    mul_mat_id_job.job_address(kind_many, kind_few, rounding), out, order)
    operands = (wb, w_off, xf, *y_routed, runs, sorted_out, out, order)  # the job holds only their addresses

    def convert() -> None:
        """src1's rows to the vec_dot type once each (as ggml's wdata), then gathered in the sorted order."""
        if not quantized:
            np.take(xs.reshape(n_src, K), src_of, axis=0, out=xf)
            quantize_src1.half_rows_in_place(kind, pack_x, xf)
            return
        if copy_src:
            np.copyto(x_rows.reshape(xs.shape), xs)
        quantize_src1.quantize_rows(int(vdt), x_rows, *y_src, rounding)
        mul_mat_id_job.gather_rows(src_of, *y_src, *y_routed)

    def run() -> None:
        n_runs = mul_mat_id_job.route(ids2.reshape(-1), n_as, M, n_used, ne11, order, src_of, runs)
        if n_runs < 0:
            raise _bad_id(name, ids2, n_runs, n_as)
        convert()
        desc[mul_mat_id_job.N_RUNS] = n_runs
        if nt == 1:
            desc[mul_mat_id_job.CHUNK] = 0
            _run_alone(desc, operands)
        else:
            desc[mul_mat_id_job.CHUNK] = -(-_chunk(M, n_runs, nt) // group) * group
            _run_shared(desc, ctr, nt - 1, operands)

    flat_ids = reshape_view(ids2, (-1,))
    if copy_src or flat_ids is None:
        return run
    head = [n_as, M, n_used, ne11, int(quantized), int(vdt), rounding, kind, nt, group, address(desc), 0,
            int(pack_x)]
    assert src_rows is not None  # src1's own rows: not copied
    views = [flat_ids, order, src_of, runs, src_rows, *(y_src if quantized else y_routed), *y_routed, xf]
    route_desc = graph_runner.descriptor(head, views)
    if route_desc is None or not all(a.flags.c_contiguous for a in views):
        return run

    def check() -> None:
        if route_desc[_BAD] < 0:
            raise _bad_id(name, ids2, int(route_desc[_BAD]), n_as)

    route_step = graph_runner.Step(graph_runner.ALONE, _route_job(), route_desc, keep=tuple(views) + (desc,),
                                   after=check)
    product = graph_runner.Step(graph_runner.ALONE if nt == 1 else graph_runner.ITEMS,
                                int(desc[mul_mat_id_job._JOB_ADDRESS]), desc, None if nt == 1 else ctr, operands)
    return graph_runner.with_steps(run, (route_step, product))


_BAD = 11  # the route step's field for route's result when an id is outside [0, n_as) (else 0)
_HEAD = 13  # the route step's fields before its views


def _bad_id(name: str, ids2: np.ndarray, n_runs: int, n_as: int) -> OutOfBoundsError:
    bad = int(ids2.reshape(-1)[-1 - n_runs])
    return OutOfBoundsError(f"CPU MUL_MAT_ID '{name}': id {bad} outside [0, {n_as})")


@njit(nogil=True, cache=True)
def route_step(p, shared):
    """`run`'s routing and conversion on thread 0: route, src1 to the vec_dot type and gathered (or rounded), the
    product's runs and chunk set; a bad id leaves the product nothing to do."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (_HEAD + 14 * v,))
    n_as, M, n_used, ne11, quantized, vdt, rounding, kind, nt, group = d[0], d[1], d[2], d[3], d[4], d[5], d[6], \
        d[7], d[8], d[9]
    job = numba.carray(graph_runner.pointer_i64(d[10]), (SLOT_LEN,))
    at = _HEAD
    ids = graph_runner.rows_i32(d, at)[0]
    order, src_of = graph_runner.rows_i64(d, at + v)[0], graph_runner.rows_i64(d, at + 2 * v)[0]
    runs, x_rows = graph_runner.rows_i64(d, at + 3 * v), graph_runner.rows_f32(d, at + 4 * v)
    n_runs = mul_mat_id_job.route(ids, n_as, M, n_used, ne11, order, src_of, runs)
    d[_BAD] = min(n_runs, 0)
    job[mul_mat_id_job.N_RUNS] = max(n_runs, 0)
    job[mul_mat_id_job.CHUNK] = 0
    if n_runs <= 0:
        return 0
    if nt > 1:
        per_slice = max(1, (ITEMS_PER_THREAD * nt + n_runs - 1) // n_runs)  # matmul._chunk's
        chunk = max(8, (M + per_slice - 1) // per_slice)
        job[mul_mat_id_job.CHUNK] = (chunk + group - 1) // group * group
    yq, yd = graph_runner.rows_i8(d, at + 5 * v), graph_runner.rows_f32(d, at + 6 * v)
    ys, yb = graph_runner.rows_f32(d, at + 7 * v), graph_runner.rows_i32(d, at + 8 * v)
    gq, gd = graph_runner.rows_i8(d, at + 9 * v), graph_runner.rows_f32(d, at + 10 * v)
    gs, gb = graph_runner.rows_f32(d, at + 11 * v), graph_runner.rows_i32(d, at + 12 * v)
    xf = graph_runner.rows_f32(d, at + 13 * v)
    if quantized:
        quantize_src1.quantize_rows(vdt, x_rows, yq, yd, ys, yb, rounding)
        mul_mat_id_job.gather_rows(src_of, yq, yd, ys, yb, gq, gd, gs, gb)
        return 0
    for i in range(src_of.shape[0]):
        xf[i] = x_rows[src_of[i]]
    quantize_src1.half_rows_in_place(kind, d[12] != 0, xf)
    return 0


@functools.cache
def _route_job() -> int:
    return graph_runner.alone_job(route_step)


# --- ADD_ID ---


def _add_id_problem(node: Tensor) -> Problem:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if a is None or b is None or ids is None:
        return ShapeError, "needs three sources (a, b, ids)"
    if any(t.type != F32 for t in (a, b, node)) or ids.type != I32:
        return UnsupportedTypeError, "a, b and dst must be F32, ids I32"
    if (a.ne[0] != b.ne[0] or a.ne[1] != ids.ne[0] or a.ne[2] != ids.ne[1] or node.ne != a.ne
            or ids.ne[2:] != [1, 1] or 0 in b.ne[2:]):
        return ShapeError, f"a ne {a.ne}, b ne {b.ne}, ids ne {ids.ne}, dst ne {node.ne} do not fit"
    return None


def add_id_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """ADD_ID: each row of src0 plus the row of src1 its id names."""
    _raise(node, _add_id_problem(node))
    a, b, ids = srcs[0], srcs[1], srcs[2]
    b_t = node.src[1]
    assert a is not None and b is not None and ids is not None and b_t is not None
    if dst.size == 0:
        return noop
    ids2 = ids[0, 0]  # (ne2, ne1) of src0
    bias = b[0, 0]  # (ne11, ne10): ggml reads src1's first plane only
    name, n_b = node.name, b_t.ne[1]

    def run() -> None:
        _check_ids(name, "ADD_ID", ids2, n_b)
        np.add(a, bias[ids2], out=dst)

    return run


def supports(node: Tensor) -> bool:
    if node.op == GGMLOp.MUL_MAT_ID:
        return _mul_mat_id_problem(node) is None
    if node.op == GGMLOp.ADD_ID:
        return _add_id_problem(node) is None
    return False


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.MUL_MAT_ID: mul_mat_id_kernel,
    GGMLOp.ADD_ID: add_id_kernel,
}
