"""Q4_K weights repacked for the CPU kernels (pyggml.backends.cpu.repack, vec_dot's kquant_x8 loops).

The layout: repack and unpack are inverse and place each byte where the layout says (bad shapes: test_repack).
The loops and MUL_MAT of a matrix in the CPU_REPACK buffer: against an independent scalar loop from the plain
Q4_K rows in the float order of ggml's x86 repack kernels (per row and column acc = fma(float(scaled sums),
f32(d) * y.d, acc) and accm likewise with the mins and dmin, the result acc - accm; ggml_gemm_q4_K_8x8_q8_K
takes an FMA per two sub-blocks, on the columns in fours, ggml_gemv_q4_K_8x8_q8_K one per super-block, on the
rest), to the bit; and against libggml's own product of the matrix in its CPU_REPACK buffer, to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import backend_mul_mat
from numba import njit
from test_repack import VARIANTS

from pyggml.backends.cpu.kernels.vec_dot import ir, kinds, kquant_x8, quantize_src1
from pyggml.backends.cpu.repack import REPACKED_Q4_K, X8_ROWS, repack_q4_K, unpack_q4_K
from pyggml.core.types import GGMLType

QK = 256
BLOCK = 144


def q4_K_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q4_K rows: every nibble and scale pattern, f16 d and dmin of far apart magnitudes."""
    raw = rng.integers(0, 256, (rows, nb, BLOCK), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb, 2)) * np.exp2(rng.integers(-14, -4, (rows, nb, 2)))).astype(np.float16)
    raw[:, :, :4] = d.view(np.uint8).reshape(rows, nb, 4)
    return raw.reshape(rows, nb * BLOCK)


def src1_f32(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """n float32 rows whose magnitudes differ row to row."""
    return (rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, 1)))).astype(np.float32)


def q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x quantized to Q8_K as the kernels take it: values, d, sums of 16."""
    n, k = x.shape
    yq, yd = np.zeros((n, k), np.int8), np.zeros((n, k // QK), np.float32)
    yb = np.zeros((n, k // 16), np.int32)
    quantize_src1.quantize_rows(kinds.Q8_K, x, yq, yd, np.zeros_like(yd), yb, quantize_src1.ROUND_X86)
    return yq, yd, yb


@njit(cache=True)
def _scale_min(q, j):
    """ggml's get_scale_min_k4 of the 12 scale bytes q."""
    if j < 4:
        return np.int32(q[j] & 63), np.int32(q[j + 4] & 63)
    return (np.int32((q[j + 4] & 15) | ((q[j - 4] >> 6) << 4)),
            np.int32((q[j + 4] >> 4) | ((q[j] >> 6) << 4)))


@njit(cache=True)
def reference(raw, yq, yd, yb, n_gemm, out):
    """out[c, m] in the order of ggml's x86 repack kernels, one scalar at a time from the plain rows: columns
    c < n_gemm as its gemm (an FMA per two sub-blocks), the others as its gemv (one per super-block)."""
    for m in range(raw.shape[0]):
        for c in range(yq.shape[0]):
            acc = np.float32(0.0)
            accm = np.float32(0.0)
            for b in range(raw.shape[1] // 144):
                o = 144 * b
                ds = ir.load_f16(raw[m], o) * yd[c, b]
                dms = ir.load_f16(raw[m], o + 2) * yd[c, b]
                isum = 0
                msum = 0
                for p in range(4):
                    ip = 0
                    mp = 0
                    for h in range(2):
                        j = 2 * p + h
                        sc, mn = _scale_min(raw[m, o + 4:o + 16], j)
                        s = 0
                        for t in range(32):
                            q = raw[m, o + 16 + 32 * p + t]
                            s += np.int32((q >> 4) if h else (q & 15)) * np.int32(yq[c, QK * b + 32 * j + t])
                        ip += sc * s
                        mp += mn * (yb[c, 16 * b + 2 * j] + yb[c, 16 * b + 2 * j + 1])
                    if c < n_gemm:
                        acc = ir.fma_f32(np.float32(ip), ds, acc)
                        accm = ir.fma_f32(np.float32(mp), dms, accm)
                    isum += ip
                    msum += mp
                if c >= n_gemm:
                    acc = ir.fma_f32(np.float32(isum), ds, acc)
                    accm = ir.fma_f32(np.float32(msum), dms, accm)
            out[c, m] = acc - accm


def test_repack_and_unpack_are_inverse_and_place_each_byte() -> None:
    rng = np.random.default_rng(0)
    nb = 3
    raw = q4_K_rows(rng, 2 * X8_ROWS, nb)
    packed = repack_q4_K(raw)
    assert packed.shape == raw.shape and packed.dtype == np.uint8
    assert np.array_equal(unpack_q4_K(packed), raw)
    flat = packed.reshape(-1)
    for g, r, b, p, v, i in ((0, 0, 0, 0, 0, 0), (1, 5, 2, 3, 6, 1), (1, 7, 1, 2, 7, 3)):
        block = flat[(g * nb + b) * X8_ROWS * BLOCK:]
        row = raw[g * X8_ROWS + r, BLOCK * b:]
        assert block[2 * r:2 * r + 2].tobytes() == row[:2].tobytes()  # d, then dmin, row by row
        assert block[16 + 2 * r:18 + 2 * r].tobytes() == row[2:4].tobytes()
        assert block[128 + 256 * p + 32 * v + 4 * r + i] == row[16 + 32 * p + 4 * v + i]
    # row 5 of group 1, super-block 2: its sub-block 6's scale and min
    row = raw[X8_ROWS + 5, BLOCK * 2:]
    block = flat[(nb + 2) * X8_ROWS * BLOCK:]
    e = 8 * 6 + 5
    sc, mn = _scale_min(row[4:16], 6)
    assert block[32 + e] & 63 == sc
    assert ((block[96 + e - 32] >> 4) | ((block[32 + e] >> 6) << 4)) == mn


@pytest.mark.parametrize("vnni", VARIANTS, ids=lambda v: "vnni" if v else "portable")
@pytest.mark.parametrize("per_pair", [True, False], ids=["gemm", "gemv"])
@pytest.mark.parametrize("groups", [1, 2], ids=lambda g: f"{g}-groups")
@pytest.mark.slow
def test_repacked_loops_are_ggml_x86_repack_orders_to_the_bit(vnni: bool, per_pair: bool, groups: int) -> None:
    rng = np.random.default_rng(1)
    M, nb = 3 * X8_ROWS, 2
    raw = q4_K_rows(rng, M, nb)
    packed = repack_q4_K(raw).reshape(-1)
    w_off = np.arange(M, dtype=np.int64) * raw.shape[1]
    dot = kquant_x8.make_dot_q4_K_x8(vnni, ir.COLS, per_pair, groups)

    @njit
    def run(w, w_off, m0, m1, yq, yd, yb, out):
        for r in range(0, yq.shape[0], 4):
            dot(w, w_off, 0, m0, m1, 2, yq, yd, yb, r, min(4, yq.shape[0] - r), out)

    for n in (1, 3, 4, 6):
        yq, yd, yb = q8_K(src1_f32(rng, n, nb * QK))
        want = np.zeros((n, M), np.float32)
        reference(raw, yq, yd, yb, n if per_pair else 0, want)
        got = np.full((n, M), np.nan, np.float32)
        run(packed, w_off, 0, M, yq, yd, yb, got)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n
        other = np.zeros((n, M), np.float32)  # the other order differs: the test tells them apart
        reference(raw, yq, yd, yb, 0 if per_pair else n, other)
        assert not np.array_equal(other, want)
        part = np.full((n, M), np.nan, np.float32)  # a range of groups writes those rows only
        run(packed, w_off, X8_ROWS, 2 * X8_ROWS, yq, yd, yb, part)
        assert np.array_equal(part[:, 8:16].view(np.uint32), want[:, 8:16].view(np.uint32))
        assert np.isnan(part[:, :8]).all() and np.isnan(part[:, 16:]).all()


def _in_repack_buffer(raw: np.ndarray, k: int):
    """A context with a Q4_K matrix of `raw`'s rows in a CPU_REPACK buffer."""
    from pyggml.alloc.ctx_tensors import alloc_ctx_tensors_from_buft
    from pyggml.backends.cpu.device import cpu_device
    from pyggml.core.context import Context
    from pyggml.ggml_backend.registry import dev_extra_bufts
    from pyggml.ggml_backend.tensor_io import tensor_set

    (buft,) = dev_extra_bufts(cpu_device())
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(GGMLType.Q4_K, k, raw.shape[0])
    buffer = alloc_ctx_tensors_from_buft(ctx, buft)
    tensor_set(w, raw.reshape(-1))
    return ctx, buffer, w


@pytest.mark.slow
@pytest.mark.parametrize("n_threads", [1, 2])
def test_mul_mat_of_a_repacked_q4_K_matrix_is_gemm_on_fours_then_gemv(n_threads: int) -> None:
    from pyggml.backends.cpu.backend import cpu_init, cpu_set_n_threads
    from pyggml.backends.cpu.buffer import host_bytes
    from pyggml.ggml_backend.tensor_io import tensor_get

    rng = np.random.default_rng(3)
    M, nb = 32 * X8_ROWS, 2
    raw = q4_K_rows(rng, M, nb)
    ctx, buffer, w = _in_repack_buffer(raw, nb * QK)
    try:
        assert w.extra is REPACKED_Q4_K
        assert np.array_equal(host_bytes(w, "test"), repack_q4_K(raw).reshape(-1))
        back = np.zeros(raw.size, np.uint8)
        tensor_get(w, back)
        assert np.array_equal(back, raw.reshape(-1))
        with cpu_init() as backend:
            cpu_set_n_threads(backend, n_threads)
            for n in (1, 6, 21):  # a token; one four then gemv; prompts with a tail
                x = src1_f32(rng, n, nb * QK)
                yq, yd, yb = q8_K(x)
                want = np.zeros((n, M), np.float32)
                reference(raw, yq, yd, yb, n - n % 4, want)
                assert np.array_equal(backend_mul_mat(backend, w, x).view(np.uint32), want.view(np.uint32)), n
    finally:
        buffer.free()
        ctx.free()


# shapes (rows, K, columns): decode, and prompts of 4, 7, 32 and 128 columns; and long rows whose work items span
# two panels of rows (mul_mat_job.PANEL_BYTES), the second short
LIBGGML_SHAPES = [(64, 512, 1), (40, 256, 4), (128, 768, 7), (64, 1024, 32), (256, 512, 128), (640, 8192, 9)]


@pytest.mark.parametrize(("M", "K", "N"), LIBGGML_SHAPES, ids=lambda v: str(v))
def test_repacked_q4_K_product_is_libggml_cpu_repack_bit_for_bit(ggml_reference: object, M: int, K: int,
                                                                   N: int) -> None:
    """ggml_reference: libggml built and loaded; its CPU_REPACK buffer is reached by ggml_c.mul_mat_repacked."""
    from pyggml.backends.cpu.backend import cpu_init
    from pyggml.testing import ggml_c

    rng = np.random.default_rng(M + K + N)
    raw = q4_K_rows(rng, M, K // QK)
    x = src1_f32(rng, N, K)
    theirs, held = ggml_c.mul_mat_repacked(GGMLType.Q4_K, raw, x)
    assert held  # libggml repacked it (block_q4_Kx8: this CPU has AVX2)
    ctx, buffer, w = _in_repack_buffer(raw, K)
    try:
        with cpu_init(n_threads=2) as backend:
            ours = backend_mul_mat(backend, w, x)
    finally:
        buffer.free()
        ctx.free()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
