"""CPU kernel of a MUL_MAT hinted SRC0_IS_HADAMARD, as ggml_compute_forward_fwht: src0 is not read; each row of src1
is scaled by 1 / sqrtf(n), then log2(n) passes of butterflies, pairs 1 apart first (ggml's SIMD gives the same bits)."""

from __future__ import annotations

import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute
from pyggml.backends.cpu.kernels._common import reshape_view
from pyggml.core.ops.params import MulMatParams
from pyggml.core.tensor import OpHint, Tensor
from pyggml.core.types import GGMLType


def is_hadamard(node: Tensor) -> bool:
    """Whether MUL_MAT `node` is hinted SRC0_IS_HADAMARD with the types ggml's CPU transforms (F32 src0 and dst)."""
    a = node.src[0]
    return (a is not None and a.type == GGMLType.F32 and node.type == GGMLType.F32
            and MulMatParams.of(node).hint == OpHint.SRC0_IS_HADAMARD)


def hadamard_problem(node: Tensor) -> str | None:
    """Why a hinted MUL_MAT cannot be the transform (ggml asserts these), or None."""
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    n = b.ne[0]
    if n < 1 or n & (n - 1):
        return f"a SRC0_IS_HADAMARD product needs rows of a power of two, src1 '{b.name}' has {n}"
    if a.ne[:2] != [n, n]:
        return f"a SRC0_IS_HADAMARD product needs src0 of {n} x {n}, '{a.name}' is {a.ne[0]} x {a.ne[1]}"
    return None


@njit(nogil=True, cache=True)
def _fwht_rows(x: np.ndarray, out: np.ndarray, scale: np.float32) -> None:
    rows, n = out.shape
    for r in range(rows):
        for j in range(n):
            out[r, j] = x[r, j] * scale
        step = 1
        while step < n:
            for i in range(0, n, 2 * step):
                for j in range(i, i + step):
                    u = out[r, j]
                    v = out[r, j + step]
                    out[r, j] = u + v
                    out[r, j + step] = u - v
            step *= 2


def fwht_kernel(dst: np.ndarray, src1: np.ndarray) -> Compute:
    """dst's rows = the orthonormal Walsh-Hadamard transforms of src1's rows (F32 or F16, any strides)."""
    n = src1.shape[-1]
    scale = np.float32(1.0) / np.sqrt(np.float32(n))
    out = reshape_view(dst, (-1, n))
    direct = out is not None and out.flags.c_contiguous

    def run() -> None:
        x = np.ascontiguousarray(src1, dtype=np.float32).reshape(-1, n)  # one compiled signature: C-order f32
        if direct:
            _fwht_rows(x, out, scale)
            return
        tmp = np.empty((x.shape[0], n), dtype=np.float32)
        _fwht_rows(x, tmp, scale)
        np.copyto(dst, tmp.reshape(dst.shape))

    return run
