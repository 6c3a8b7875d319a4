"""CPU kernels: MUL_MAT (ggml_compute_forward_mul_mat) and OUT_PROD (ggml_compute_forward_out_prod), by src0's
type: rows in ggml-cpu's float orders for F32/F16/BF16 (vec_dot.half_orders), vec_dot on raw blocks,
repacked x8 loops or dequantized tiles for the quantized types. DESIGN.md, "MUL_MAT and OUT_PROD", says which
path runs when and why its results are ggml's."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from pyggml.backends.cpu import repack
from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner, src1_steps
from pyggml.backends.cpu.kernels._common import is_multiple, noop, reshape_view, strided_view
from pyggml.backends.cpu.kernels.fwht import fwht_kernel, hadamard_problem, is_hadamard
from pyggml.backends.cpu.kernels.threads import new_pool, new_team
from pyggml.backends.cpu.kernels.vec_dot import half_orders, mul_mat_job, quantize_src1, to_float
from pyggml.backends.cpu.kernels.vec_dot.type_table import (
    COLS_KINDS,
    CPU_TYPE_TRAITS,
    MUL_MAT_TYPES,
    TILED_KINDS,
    X8_GEMV_KINDS,
    X8_GROUP_KINDS,
    X8_KINDS,
    X8_TILE_KINDS,
)
from pyggml.backends.cpu.numerics import NUMERICS_CODES
from pyggml.backends.cpu.repack import is_repacked, repack_supports_op
from pyggml.core import quants
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedOpError, UnsupportedTypeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16

OUT_PROD_SRC1_TYPES: tuple[GGMLType, ...] = (F32, F16, BF16)

# src1 columns (per matrix) from which widened weight tiles go through BLAS (bench_matmul.py --sweep)
BLAS_MIN_COLS = 16
# src1 columns from which FLASH_ATTN_EXT's F32 tile products (mul_mat_f32) go to BLAS: below, waking OpenBLAS costs more
F32_BLAS_MIN_COLS = 32
# src1 columns from which X8_TILE_KINDS matrices take the repacked tiles (fewer keep vec_dot's row order)
X8_TILE_MIN_COLS = 16
# src1 columns from which ggml-cpu takes its tiled matmul for K-quants (ggml_tiled_min_batch)
TILED_MIN_COLS = 8
# multiply-adds (mat-vec equivalents, _direct_work) below which a direct product stays on the calling thread
PARALLEL_MIN_WORK = 1 << 16
TILE_BYTES = 8 << 20
# multiply-adds from which TEAM's threads share a BLAS-path product (a hand-off costs tens of microseconds)
BLAS_PARALLEL_MIN_WORK = 1 << 22
# BLAS-path items per weight matrix, whatever the thread count: the same tiles give every count the same bits
BLAS_ITEMS = 16
BLAS_MIN_ROWS = 16
ITEMS_PER_THREAD = 2

_ALIGN = 64
POOL = new_pool(mul_mat_job.mul_mat_spin)
TEAM = new_team()


Problem = tuple[type[GGMLError], str] | None


def _src0_type_reason(a: Tensor, why: str) -> str:
    """Why src0's type is refused: a ggml type pyggml has not implemented says so, others `why`."""
    if not quants.is_implemented(a.type):
        return f"src0 '{a.name}': {quants.not_implemented_error(a.type)}"
    return f"src0 '{a.name}' has type {a.type.name}, {why}"


def _mul_mat_problem(node: Tensor) -> Problem:
    """Why the CPU cannot compute this MUL_MAT node (error class and reason), or None if it can."""
    a, b = node.src[0], node.src[1]
    if a is None or b is None:
        return ShapeError, "needs two sources"
    if a.type not in MUL_MAT_TYPES:
        return UnsupportedTypeError, _src0_type_reason(a, "which has no dot product (vec_dot)")
    hadamard = is_hadamard(node)  # ggml's fast transform (kernels.fwht), which takes an F16 src1 too
    vdt = GGMLType.F16 if hadamard else CPU_TYPE_TRAITS[a.type].vec_dot_type
    if b.type not in (F32, vdt) and not (b.type == BF16 and vdt == F32):
        also = " (or BF16, widened)" if vdt == F32 else ""
        return (UnsupportedTypeError, f"src1 '{b.name}' has type {b.type.name}; with {a.type.name} weights it must be "
                                      f"F32 or {vdt.name}{also}")
    if node.type != F32:
        return UnsupportedTypeError, f"dst has type {node.type.name}, must be F32"
    if a.nb[0] != TYPE_TRAITS[a.type].type_size or (TYPE_TRAITS[b.type].is_quantized
                                                    and b.nb[0] != TYPE_TRAITS[b.type].type_size):
        return ShapeError, f"rows must be contiguous (src0 nb {a.nb}, src1 nb {b.nb})"
    if a.ne[0] != b.ne[0] or not is_multiple(b.ne[2], a.ne[2]) or not is_multiple(b.ne[3], a.ne[3]):
        return ShapeError, f"src0 ne {a.ne} and src1 ne {b.ne} do not fit (ne0 equal, src1 ne2/ne3 multiples of src0's)"
    if node.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]:
        return ShapeError, f"dst ne {node.ne} is not [{a.ne[1]}, {b.ne[1]}, {b.ne[2]}, {b.ne[3]}]"
    if not repack_supports_op(node):
        return UnsupportedOpError, (f"src0 '{a.name}' is in a CPU_REPACK buffer: MUL_MAT reads a repacked Q4_0 "
                                    f"matrix there whole, with an F32 src1 (src1 '{b.name}' is {b.type.name})")
    why = hadamard_problem(node) if hadamard else None
    return None if why is None else (ShapeError, why)


def _out_prod_problem(node: Tensor) -> Problem:
    """Why the CPU cannot compute this OUT_PROD node (error class and reason), or None if it can."""
    a, b = node.src[0], node.src[1]
    if a is None or b is None:
        return ShapeError, "needs two sources"
    if a.type not in MUL_MAT_TYPES:
        return UnsupportedTypeError, _src0_type_reason(a, "which has no f32 conversion here")
    if b.type not in OUT_PROD_SRC1_TYPES:
        return UnsupportedTypeError, f"src1 '{b.name}' has type {b.type.name}; it must be F32, F16 or BF16"
    if node.type != F32:
        return UnsupportedTypeError, f"dst has type {node.type.name}, must be F32"
    if a.nb[0] != TYPE_TRAITS[a.type].type_size:
        return ShapeError, f"src0 rows must be contiguous (nb {a.nb})"
    if a.ne[1] != b.ne[1] or not is_multiple(b.ne[2], a.ne[2]) or not is_multiple(b.ne[3], a.ne[3]):
        return ShapeError, (f"src0 ne {a.ne} and src1 ne {b.ne} do not fit (ne1 equal, src1 ne2 and ne3 "
                            "multiples of src0's)")
    if node.ne != [a.ne[0], b.ne[0], b.ne[2], b.ne[3]]:
        return ShapeError, f"dst ne {node.ne} is not [{a.ne[0]}, {b.ne[0]}, {b.ne[2]}, {b.ne[3]}]"
    return None


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node` (its types and shapes), as supports_op needs."""
    if node.op == GGMLOp.MUL_MAT:
        return _mul_mat_problem(node) is None
    if node.op == GGMLOp.OUT_PROD:
        return _out_prod_problem(node) is None
    return False


def _check(node: Tensor, problem: Problem) -> None:
    """Raise the problem's error, naming the op, the node and the types."""
    if problem is None:
        return
    cls, reason = problem
    a, b = node.src[0], node.src[1]
    types = f"{a.type.name if a else None} x {b.type.name if b else None} -> {node.type.name}"
    raise cls(f"CPU {node.op.name} '{node.name}' ({types}): {reason}")


def _carve(params: ComputeParams, specs: list[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray]:
    """Arrays of the given shapes and dtypes from the backend's shared work area, each 64-byte aligned."""
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt in specs]
    padded = [(s + _ALIGN - 1) // _ALIGN * _ALIGN for s in sizes]
    raw = params.work.get(sum(padded) + _ALIGN)
    start = -raw.__array_interface__["data"][0] % _ALIGN
    out = []
    for (shape, dt), size, pad in zip(specs, sizes, padded, strict=True):
        out.append(raw[start:start + size].view(dt).reshape(shape))
        start += pad
    return out


def _row_bytes(a: np.ndarray) -> np.ndarray:
    """A view whose rows are bytes (uint8), for F16/BF16 (rows contiguous) and quantized views."""
    return a if a.dtype == np.uint8 else a.view(np.uint8)


def _weight_rows(src0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """src0's memory as one byte array, and the byte offset of every row in (i03, i02, i01) order."""
    b = _row_bytes(src0)
    ne3, ne2, ne1, row = b.shape
    s3, s2, s1, _ = b.strides
    offs = (np.arange(ne3, dtype=np.int64)[:, None, None] * s3
            + np.arange(ne2, dtype=np.int64)[None, :, None] * s2
            + np.arange(ne1, dtype=np.int64)[None, None, :] * s1).reshape(-1)
    if offs.size and offs.min() < 0:
        raise ShapeError(f"CPU MUL_MAT: weight rows at negative byte strides {list(b.strides[:3])}")
    extent = int(offs.max()) + row if offs.size else 0
    mem = strided_view(b, (extent,), (1,), "CPU MUL_MAT: the weights' bytes")
    return mem, np.ascontiguousarray(offs)


def _split_dims(a: np.ndarray, r3: int, r2: int) -> np.ndarray:
    """(n3, n2, x, y) -> (n3/r3, r3, n2/r2, r2, x, y), a view (rows i3 = i03*r3 + j, as ggml broadcasts)."""
    n3, n2 = a.shape[0], a.shape[1]
    s3, s2 = a.strides[0], a.strides[1]
    return strided_view(a, (n3 // r3, r3, n2 // r2, r2) + a.shape[2:], (s3 * r3, s3, s2 * r2, s2) + a.strides[2:],
                        f"CPU MUL_MAT: dims 2 and 3 of {list(a.shape)} split by {r2} and {r3}")


def _repeat_dims(a: np.ndarray, r3: int, r2: int) -> np.ndarray:
    """(n3, n2, x, y) -> (n3, r3, n2, r2, x, y) with stride 0 on the repeats (src0 broadcast)."""
    s3, s2 = a.strides[0], a.strides[1]
    return strided_view(a, (a.shape[0], r3, a.shape[1], r2) + a.shape[2:], (s3, 0, s2, 0) + a.strides[2:],
                        f"CPU MUL_MAT: dims 2 and 3 of {list(a.shape)} repeated {r2} and {r3} times", writeable=False)


def _kernel_threads(params: ComputeParams, work: int) -> int:
    return 1 if work < PARALLEL_MIN_WORK else max(1, int(params.n_threads))


def _direct_work(kind: int, M: int, K: int, n_slices: int, N: int) -> int:
    """A direct product's work in mat-vec multiply-adds: COLS_KINDS' N columns cost about (N + 2) / 3 mat-vecs."""
    if kind in COLS_KINDS:
        return M * K * n_slices * (N + 2) // 6
    return M * K * n_slices * N


def _chunk(M: int, n_slices: int, n_threads: int) -> int:
    """Weight rows per work item: few items per thread, so each streams long runs the prefetchers follow."""
    per_slice = max(1, math.ceil(ITEMS_PER_THREAD * n_threads / max(n_slices, 1)))
    return max(8, math.ceil(M / per_slice))


def _src1_f32_fn(src1: np.ndarray, type: GGMLType, xs: np.ndarray | None) -> Callable[[], np.ndarray]:
    """A function returning src1's values as C-contiguous float32 rows (NY, K): a view or a copy into xs."""
    nrows = src1.shape[0] * src1.shape[1] * src1.shape[2]
    if type == F32 and xs is None:
        rows = reshape_view(src1, (nrows, src1.shape[-1]))
        assert rows is not None and rows.flags.c_contiguous
        return lambda: rows
    assert xs is not None
    dst4 = xs.reshape(src1.shape)
    if type == BF16:
        def bf16() -> np.ndarray:
            np.left_shift(src1, 16, out=dst4.view(np.uint32), dtype=np.uint32)
            return xs

        return bf16

    def copy() -> np.ndarray:
        np.copyto(dst4, src1)
        return xs

    return copy


def _needs_copy(src1: np.ndarray, type: GGMLType) -> bool:
    if type != F32:
        return True
    rows = reshape_view(src1, (-1, src1.shape[-1]))
    return rows is None or not rows.flags.c_contiguous


_Q8_DTYPES = {
    GGMLType.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
    GGMLType.Q8_1: np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))]),
    GGMLType.Q8_K: np.dtype([("d", "<f4"), ("qs", "i1", (256,)), ("bsums", "<i2", (16,))]),
}


def _unpack_q8(type: GGMLType, src1: np.ndarray, yq: np.ndarray, yd: np.ndarray, ys: np.ndarray,
               yb: np.ndarray) -> None:
    """src1 already in the vec_dot_type: split its raw blocks into the arrays the vec_dot kernels read."""
    ny = yq.shape[0]
    blocks = np.ascontiguousarray(src1).reshape(ny, -1).view(_Q8_DTYPES[type])
    np.copyto(yq, blocks["qs"].reshape(ny, -1))
    np.copyto(yd, blocks["d"])
    if type == GGMLType.Q8_1:
        np.copyto(ys, blocks["s"])
    if type == GGMLType.Q8_K:
        np.copyto(yb, blocks["bsums"].reshape(ny, -1))  # ggml uses the stored sums
    else:
        np.sum(yq.reshape(ny, -1, 16), axis=-1, dtype=np.int32, out=yb)


def mul_mat_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """MUL_MAT for F32, F16, BF16 and quantized src0 (see the module docstring for the arithmetic)."""
    _check(node, _mul_mat_problem(node))
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    src0, src1 = srcs[0], srcs[1]
    assert src0 is not None and src1 is not None
    if dst.size == 0:
        return noop
    if a.ne[0] == 0:
        return lambda: dst.fill(0)
    if is_hadamard(node):
        return fwht_kernel(dst, src1)
    if a.type == F32 and b.type == BF16:  # ggml widens a BF16 src1 to F32 first (as ggml_conv_1d_dw emits it)
        widened = np.empty(src1.shape, np.float32)
        widen = _src1_f32_fn(src1, BF16, widened.reshape(-1, src1.shape[3]))
        product = _mul_mat_numba(F32, F32, a.ne[0], dst, src0, widened, params)

        def run_widened() -> None:
            widen()
            product()

        return run_widened
    return _mul_mat_numba(a.type, b.type, a.ne[0], dst, src0, src1, params, repacked=is_repacked(a))


def mul_mat_f32(dst: np.ndarray, src0: np.ndarray, src1: np.ndarray, params: ComputeParams) -> Compute:
    """dst = src1 · src0^T for F32 arrays, src0 broadcast (FLASH_ATTN_EXT's tiled products): the direct kernels
    below F32_BLAS_MIN_COLS columns or batch-invariant, else one BLAS call."""
    if (params.batch_invariant or src1.shape[2] < F32_BLAS_MIN_COLS) and src0.strides[3] == 4 \
            and src1.dtype == np.float32:
        out = reshape_view(dst, (-1, dst.shape[-1]))
        if out is not None and out.flags.c_contiguous:
            return _mul_mat_numba(F32, F32, src0.shape[3], dst, src0, src1, params)
        tmp = np.empty(dst.shape, np.float32)
        direct = _mul_mat_numba(F32, F32, src0.shape[3], tmp, src0, src1, params)

        def run_copy() -> None:
            direct()
            np.copyto(dst, tmp)

        return run_copy
    ne13, ne12 = src1.shape[0], src1.shape[1]
    r3, r2 = ne13 // src0.shape[0], ne12 // src0.shape[1]
    if r3 == 1 and r2 == 1:
        w, x, d = src0, src1, dst
    else:
        w, x, d = _repeat_dims(src0, r3, r2), _split_dims(src1, r3, r2), _split_dims(dst, r3, r2)
    wt = np.swapaxes(w, -1, -2)
    if dst.shape[0] * dst.shape[1] == 1:
        x, wt, d = x[0, 0], wt[0, 0], d[0, 0]
    M = wt.shape[-1]
    n_threads = _blas_threads(params, M * src0.shape[3] * src1.shape[2] * dst.shape[0] * dst.shape[1])
    R = _blas_rows(M, 1)  # no tiles: the rows are f32 already

    def rows(slot: int, i: int) -> None:
        np.matmul(x, wt[..., i * R:(i + 1) * R], out=d[..., i * R:(i + 1) * R])

    def run() -> None:
        TEAM.run(rows, -(-M // R), n_threads)

    return run


def _mul_mat_numba(wtype: GGMLType, xtype: GGMLType, K: int, dst: np.ndarray, src0: np.ndarray,
                   src1: np.ndarray, params: ComputeParams, repacked: bool = False) -> Compute:
    ne03, ne02, M = src0.shape[0], src0.shape[1], src0.shape[2]
    ne13, ne12, N = src1.shape[0], src1.shape[1], src1.shape[2]
    r3, r2 = ne13 // ne03, ne12 // ne02
    n_slices = ne13 * ne12
    ny = n_slices * N
    # repacked (CPU_REPACK): its own loops at every column count; batch-invariant: one order for every column
    kind = int(wtype)
    if repacked:
        kind = X8_GEMV_KINDS.get(kind, X8_KINDS[kind]) if params.batch_invariant else X8_KINDS[kind]
    # prompts of plain K-quants under "x86": ggml-cpu's tiled order (not batch-invariant: another from 8 columns)
    if (not repacked and kind in TILED_KINDS and not params.batch_invariant and N >= TILED_MIN_COLS
            and NUMERICS_CODES[params.numerics] == quantize_src1.ROUND_X86):
        kind = TILED_KINDS[kind]
    # prompts of X8_TILE_KINDS: tiles repacked per work item (not batch-invariant: another scaling order)
    tiles = not params.batch_invariant and N >= X8_TILE_MIN_COLS
    if not repacked and kind in X8_TILE_KINDS and tiles and M % repack.X8_ROWS == 0:
        kind = X8_TILE_KINDS[kind]
    half = wtype in (F32, F16, BF16)
    if half:  # tinyBLAS takes src1 converted to the weight type, or already of it and contiguous
        gemm = not params.batch_invariant and (xtype != wtype or bool(src1.flags.c_contiguous))
        kind = half_orders.half_kind(kind, NUMERICS_CODES[params.numerics] == quantize_src1.ROUND_X86,
                                     params.x86_level, N, M, K, gemm)
    wt = TYPE_TRAITS[wtype]
    quantized = wt.is_quantized
    vdt = CPU_TYPE_TRAITS[wtype].vec_dot_type
    nb = K // wt.blck_size  # blocks per row (elements for F16/BF16)

    w, w_off = _weight_rows(src0)
    # first weight row of each output slice s = i13*ne12 + i12
    i13 = np.repeat(np.arange(ne13, dtype=np.int64), ne12)
    i12 = np.tile(np.arange(ne12, dtype=np.int64), ne13)
    w_base = np.ascontiguousarray(((i13 // r3) * ne02 + i12 // r2) * M)

    out = reshape_view(dst, (ny, dst.shape[-1]))
    if out is None or not out.flags.c_contiguous:
        raise ShapeError(f"CPU MUL_MAT: dst with shape {dst.shape} and strides {dst.strides} is not contiguous")

    blas = (kind not in X8_GROUP_KINDS and int(wtype) not in TILED_KINDS and wtype != F32 and not half
            and not params.batch_invariant and N >= BLAS_MIN_COLS)
    # Q4_1/Q5_1: one more column per block carries m * (s - d * sum(q)) (DESIGN.md, MUL_MAT and OUT_PROD)
    mins = blas and vdt == GGMLType.Q8_1
    Kb = K + (nb if mins else 0)  # columns of the BLAS operands
    blas_threads = _blas_threads(params, M * Kb * ny)
    tile_rows = _blas_rows(M, Kb)

    specs: list[tuple[tuple[int, ...], np.dtype]] = []
    x_from_src1 = not TYPE_TRAITS[xtype].is_quantized
    copy_x = x_from_src1 and (_needs_copy(src1, xtype) or not quantized)  # half weights round x: never in place
    if copy_x:
        specs.append(((ny, K), np.dtype(np.float32)))
    if quantized:
        qk = TYPE_TRAITS[vdt].blck_size
        specs += [((ny, K), np.dtype(np.int8)), ((ny, K // qk), np.dtype(np.float32)),
                  ((ny, K // qk), np.dtype(np.float32)), ((ny, K // 16), np.dtype(np.int32))]
        if blas:
            specs.append(((ny, Kb), np.dtype(np.float32)))
    if blas:
        specs.append(((blas_threads, tile_rows, Kb), np.dtype(np.float32)))  # one tile per thread
    scratch = _carve(params, specs)
    xs = scratch.pop(0) if copy_x else None
    get_x = _src1_f32_fn(src1, xtype, xs) if x_from_src1 else None
    tile = scratch.pop() if blas else None

    if quantized:
        yq, yd, ys, yb = scratch[:4]
        yf = scratch[4] if blas else None
        rounding = NUMERICS_CODES[params.numerics]

        def prepare_y() -> None:
            if get_x is None:
                _unpack_q8(xtype, src1, yq, yd, ys, yb)
            else:
                quantize_src1.quantize_rows(int(vdt), get_x(), yq, yd, ys, yb, rounding)

        if not blas:
            direct = _direct(kind, w, w_off, nb, np.zeros((0, 0), np.float32), yq, yd, ys, yb, N, w_base, out,
                             params, _direct_work(kind, M, K, n_slices, N))

            def run_q() -> None:
                prepare_y()
                direct()

            x_rows = get_x() if get_x is not None and xs is None else None  # src1's own f32 rows
            if x_rows is None:
                return run_q
            return _with_src1_step(run_q, direct, src1_steps.quantize_src1_step(int(vdt), rounding, x_rows, yq, yd,
                                                                                ys, yb))

        assert yf is not None and tile is not None
        qk = TYPE_TRAITS[vdt].blck_size

        yv, yc = np.reshape(yf[:, :K], (ny, -1, qk), copy=False), yf[:, K:]

        def run_qb() -> None:
            prepare_y()
            np.multiply(yq.reshape(ny, -1, qk), yd[:, :, None], out=yv)
            if mins:  # s - d * sum(q), the weights' m multiplies it (the sums of 16 are exact in float32)
                np.add(yb[:, 0::2], yb[:, 1::2], out=yc, casting="unsafe")
                np.multiply(yc, yd, out=yc)
                np.subtract(ys, yc, out=yc)
            _tiled_blas(kind, w, w_off, nb, yf, out, N, ne03 * ne02, M, r3, r2, ne12, tile, mins)

        return run_qb

    # F32 / F16 / BF16 weights: src1 rounded to the weight type, packed as its bits where the order reads them
    assert get_x is not None
    round_x = xtype == F32 and wtype != F32
    rounding_kind = int(wtype) if round_x else quantize_src1.NO_ROUNDING
    pack_x = half_orders.src1_bits(kind) != 0

    def half_x() -> np.ndarray:
        x = get_x()
        quantize_src1.half_rows_in_place(rounding_kind, pack_x, x)
        return x

    if not blas:
        assert xs is not None  # half_x's result: src1 is always copied (and rounded) into xs
        direct = _direct(kind, w, w_off, nb, xs, np.zeros((0, 0), np.int8), np.zeros((0, 0), np.float32),
                         np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int32), N, w_base, out, params, M * K * ny)

        def run_h() -> None:
            half_x()
            direct()

        rows = reshape_view(src1, (ny, K)) if xtype == F32 else None
        if rows is None or not rows.flags.c_contiguous:
            return run_h
        step = src1_steps.half_src1_step(rounding_kind, rows, xs, pack_x)
        return _with_src1_step(run_h, direct, step)

    assert tile is not None

    def run_hb() -> None:
        x = half_x()
        _tiled_blas(kind, w, w_off, nb, x, out, N, ne03 * ne02, M, r3, r2, ne12, tile)

    return run_hb


def _with_src1_step(run: Compute, direct: Compute, convert: graph_runner.Step) -> Compute:
    """`run` with its job form: src1's conversion, then the product's step (`direct`'s)."""
    product = graph_runner.steps_of(direct)
    assert product is not None
    return graph_runner.with_steps(run, (convert, *product))


def _direct(kind: int, w: np.ndarray, w_off: np.ndarray, nb: int, xf: np.ndarray, yq: np.ndarray, yd: np.ndarray,
            ys: np.ndarray, yb: np.ndarray, N: int, w_base: np.ndarray, out: np.ndarray, params: ComputeParams,
            work: int) -> Compute:
    nt = _kernel_threads(params, work)
    rounding = NUMERICS_CODES[params.numerics]
    if nt == 1:
        desc = mul_mat_job.mul_mat_desc(kind, w, w_off, nb, xf, yq, yd, ys, yb, N, w_base, out, 0, _NO_COUNTER,
                                        rounding)
        # the operands stay referenced here: the job holds only their addresses
        operands = (w, w_off, xf, yq, yd, ys, yb, w_base, out)
        return graph_runner.with_steps(functools.partial(_run_alone, desc, operands),
                                       (graph_runner.Step(graph_runner.ALONE, int(desc[mul_mat_job._JOB_ADDRESS]),
                                                          desc, keep=operands),))
    chunk = _chunk(out.shape[1], w_base.shape[0], nt)
    if kind in X8_GROUP_KINDS:  # whole groups of repacked rows
        chunk = -(-chunk // repack.X8_ROWS) * repack.X8_ROWS
    ctr = np.zeros(2, np.int64)  # items taken, items done: reset by each call
    desc = mul_mat_job.mul_mat_desc(kind, w, w_off, nb, xf, yq, yd, ys, yb, N, w_base, out, chunk, ctr, rounding)
    operands = (w, w_off, xf, yq, yd, ys, yb, w_base, out)
    return graph_runner.with_steps(functools.partial(_run_shared, desc, ctr, nt - 1, operands),
                                   (graph_runner.Step(graph_runner.ITEMS, int(desc[mul_mat_job._JOB_ADDRESS]), desc,
                                                      ctr, operands),))


_NO_COUNTER = np.zeros(2, np.int64)


def _run_alone(desc: np.ndarray, operands: tuple[np.ndarray, ...]) -> None:
    mul_mat_job.mul_mat_job(desc, False)


def _run_shared(desc: np.ndarray, ctr: np.ndarray, n_workers: int, operands: tuple[np.ndarray, ...]) -> None:
    """A direct product on the calling thread and n_workers of POOL's (`operands` keeps its arrays alive)."""
    ctr[0] = 0
    ctr[1] = 0
    desc[mul_mat_job.WAIT_POLLS] = POOL.spins  # the caller's wait spins as long as an idle worker, then sleeps
    POOL.run(mul_mat_job.mul_mat_shared, desc, n_workers)


def _blas_threads(params: ComputeParams, work: int) -> int:
    return 1 if work < BLAS_PARALLEL_MIN_WORK else max(1, int(params.n_threads))


def _blas_rows(M: int, K: int) -> int:
    """Weight rows of one BLAS-path item: about BLAS_ITEMS items of BLAS_MIN_ROWS multiples, within TILE_BYTES."""
    per_item = -(-M // BLAS_ITEMS)
    per_item = -(-per_item // BLAS_MIN_ROWS) * BLAS_MIN_ROWS
    return max(1, min(M, per_item, TILE_BYTES // max(4 * K, 1)))


def _tiled_blas(kind: int, w: np.ndarray, w_off: np.ndarray, nb: int, x: np.ndarray, out: np.ndarray, N: int,
                n_wslices: int, M: int, r3: int, r2: int, ne12: int, tiles: np.ndarray, mins: bool = False) -> None:
    """out[s*N:(s+1)*N, m0:m1] = x[s*N:(s+1)*N] @ rows[m0:m1].T, weight rows widened a tile at a time on TEAM's
    threads; with `mins` (Q4_1, Q5_1) a tile row's last nb columns are its blocks' m."""
    R = tiles.shape[1]
    n_w2 = ne12 // r2  # src0's ne02
    n_tiles = -(-M // R)

    def item(slot: int, i: int) -> None:
        ws, c = divmod(i, n_tiles)
        i03, i02 = divmod(ws, n_w2)
        m0 = c * R
        m1 = min(M, m0 + R)
        t = tiles[slot, :m1 - m0]
        to_float.rows_to_f32(kind, w, w_off, ws * M + m0, nb, t)  # the first nb * blck_size columns of each row
        if mins:
            to_float.block_mins_to_f32(kind, w, w_off, ws * M + m0, nb, t)
        for j3 in range(r3):
            for j2 in range(r2):
                s = (i03 * r3 + j3) * ne12 + i02 * r2 + j2
                np.matmul(x[s * N:(s + 1) * N], t.T, out=out[s * N:(s + 1) * N, m0:m1])

    TEAM.run(item, n_wslices * n_tiles, tiles.shape[0])


def out_prod_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                    params: ComputeParams) -> Compute:
    """OUT_PROD: dst[i1, i0] = sum_k src0[k, i0] * src1[k, i1] per matrix (F32 BLAS; other src0 in f32 tiles)."""
    _check(node, _out_prod_problem(node))
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    src0, src1 = srcs[0], srcs[1]
    assert src0 is not None and src1 is not None
    if dst.size == 0:
        return noop
    if a.ne[1] == 0:
        return lambda: dst.fill(0)
    r3, r2 = src1.shape[0] // src0.shape[0], src1.shape[1] // src0.shape[1]
    K, ne00 = a.ne[1], a.ne[0]
    f32 = np.dtype(np.float32)
    tile_rows = max(1, min(K, TILE_BYTES // max(4 * ne00, 1)))

    # all scratch of this node in one piece: src1 widened to f32 (unless F32), a tile and a sum for src0's rows
    specs: list[tuple[tuple[int, ...], np.dtype]] = []
    if b.type != F32:
        specs.append((src1.shape, f32))
    if a.type != F32:
        specs += [((tile_rows, ne00), f32), ((dst.shape[2], ne00), f32)]
    scratch = _carve(params, specs)

    if b.type == F32:
        def get_x() -> np.ndarray:
            return src1

        x4 = src1
    else:
        x4 = scratch.pop(0)
        get_x = _src1_f32_fn(src1, b.type, x4.reshape(-1, src1.shape[3]))

    if a.type == F32:
        w6 = _repeat_dims(src0, r3, r2)
        x6 = np.swapaxes(_split_dims(x4, r3, r2), -1, -2)
        d6 = _split_dims(dst, r3, r2)

        def run_f32() -> None:
            get_x()
            np.matmul(x6, w6, out=d6)

        return run_f32

    tile, acc = scratch
    nb = ne00 // TYPE_TRAITS[a.type].blck_size
    kind = int(a.type)
    w, w_off = _weight_rows(src0)
    ne02 = src0.shape[1]

    def run_tiles() -> None:
        get_x()
        for i3 in range(dst.shape[0]):
            for i2 in range(dst.shape[1]):
                ws = (i3 // r3) * ne02 + i2 // r2
                x = x4[i3, i2]  # (K, ne10)
                d = dst[i3, i2]  # (ne10, ne00)
                for k0 in range(0, K, tile_rows):
                    k1 = min(K, k0 + tile_rows)
                    t = tile[:k1 - k0]
                    to_float.rows_to_f32(kind, w, w_off, ws * K + k0, nb, t)
                    if k0 == 0:
                        np.matmul(x[k0:k1].T, t, out=d)
                    else:
                        np.matmul(x[k0:k1].T, t, out=acc)
                        np.add(d, acc, out=d)

    return run_tiles


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.MUL_MAT: mul_mat_kernel,
    GGMLOp.OUT_PROD: out_prod_kernel,
}
