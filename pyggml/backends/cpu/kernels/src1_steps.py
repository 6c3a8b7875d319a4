"""MUL_MAT's src1 conversion as a graph-runner step: each thread converts its share of src1's rows to the vec_dot
type (ggml's wdata pass before the barrier), the same functions the Python compute calls."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels.atomics import address, pointer_f32, pointer_i8, pointer_i32
from pyggml.backends.cpu.kernels.graph_runner import SPLIT, Step, split_job, thread_rows
from pyggml.backends.cpu.kernels.vec_dot import quantize_src1

# a step's descriptor: kind, rounding, rows, K, then addresses: src1's f32 rows, and yq, yd, ys, yb or the rounded x
KIND, ROUNDING, ROWS, K, X, YQ, YD, YS, YB, BLOCKS = range(10)
PACK = YD  # the half step's: 1 to pack bf16 pairs (quantize_src1.pack_bf16_pairs), 0 to copy and round
DESC_LEN = 10
NO_ROUNDING = quantize_src1.NO_ROUNDING


@njit(nogil=True, cache=True)
def quantize_step(p, ith, nth):
    """Thread ith's rows of src1 quantized to the vec_dot type (quantize_src1.quantize_rows)."""
    d = numba.carray(p, (DESC_LEN,))
    r0, r1 = thread_rows(d[ROWS], ith, nth)
    if r0 < r1:
        ny, k, nb = d[ROWS], d[K], d[BLOCKS]
        x = numba.carray(pointer_f32(d[X]), (ny, k))
        yq = numba.carray(pointer_i8(d[YQ]), (ny, k))
        yd = numba.carray(pointer_f32(d[YD]), (ny, nb))
        ys = numba.carray(pointer_f32(d[YS]), (ny, nb))
        yb = numba.carray(pointer_i32(d[YB]), (ny, k // 16))
        quantize_src1.quantize_rows(d[KIND], x[r0:r1], yq[r0:r1], yd[r0:r1], ys[r0:r1], yb[r0:r1], d[ROUNDING])
    return 0


@njit(nogil=True, cache=True)
def half_step(p, ith, nth):
    """Thread ith's rows of src1 copied into x and rounded to the weights' type (quantize_src1.round_rows), or
    packed as bf16 pairs (d[PACK], quantize_src1.pack_bf16_pairs)."""
    d = numba.carray(p, (DESC_LEN,))
    r0, r1 = thread_rows(d[ROWS], ith, nth)
    if r0 < r1:
        ny, k = d[ROWS], d[K]
        src = numba.carray(pointer_f32(d[X]), (ny, k))
        x = numba.carray(pointer_f32(d[YQ]), (ny, k))
        if d[PACK] != 0:
            quantize_src1.pack_bf16_pairs(src[r0:r1], x[r0:r1])
            return 0
        x[r0:r1] = src[r0:r1]
        if d[KIND] != NO_ROUNDING:
            quantize_src1.round_rows(d[KIND], x[r0:r1])
    return 0


@functools.cache
def _quantize_address() -> int:
    return split_job(quantize_step)


@functools.cache
def _half_address() -> int:
    return split_job(half_step)


def quantize_src1_step(kind: int, rounding: int, x: np.ndarray, yq: np.ndarray, yd: np.ndarray, ys: np.ndarray,
                       yb: np.ndarray) -> Step:
    """The step quantizing C-contiguous f32 rows x (ny, K) into yq, yd, ys, yb (as quantize_rows)."""
    desc = np.zeros(DESC_LEN, np.int64)
    desc[:] = (kind, rounding, x.shape[0], x.shape[1], address(x), address(yq), address(yd), address(ys),
               address(yb), yd.shape[1])
    return Step(SPLIT, _quantize_address(), desc, keep=(x, yq, yd, ys, yb))


def half_src1_step(kind: int, src: np.ndarray, x: np.ndarray, pack: bool = False) -> Step:
    """The step copying C-contiguous f32 rows `src` (ny, K) into x, rounded to `kind` (F16, BF16 or NO_ROUNDING);
    `pack`: packed as bf16 pairs instead (quantize_src1.pack_bf16_pairs)."""
    desc = np.zeros(DESC_LEN, np.int64)
    desc[:] = (kind, 0, src.shape[0], src.shape[1], address(src), address(x), int(pack), 0, 0, 0)
    return Step(SPLIT, _half_address(), desc, keep=(src, x))
