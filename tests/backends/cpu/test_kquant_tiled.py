"""Plain K-quant matrices (Q2_K, Q3_K, Q4_K not repacked, Q5_K, Q6_K) under numerics "x86": from 8 src1 columns ggml-cpu
multiplies them by its tiled matmul (ggml-cpu/tiled), whose float order per super-block is res = float(scaled
sums) * d, res = fma(-dmin, float(mins' sums), res) (Q2_K, Q4_K, Q5_K), total = fma(res, y.d, total); fewer columns
take its AVX2 vec_dot rows. pyggml's loops in those orders (type table `tiled`, `cols_x86`) against libggml's
product, bit for bit; batch-invariant, every column keeps the rows' order.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import new_ctx, run, tensor
from test_kernels_matmul import weight_tensor
from test_repack_q4_K import q4_K_rows, src1_f32

from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.core.types import GGMLType


def q6_K_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q6_K rows: every code and int8 scale, f16 d of far apart magnitudes."""
    raw = rng.integers(0, 256, (rows, nb, 210), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb)) * np.exp2(rng.integers(-14, -6, (rows, nb)))).astype(np.float16)
    raw[:, :, 208:] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * 210)


def q5_K_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q5_K rows: every code, fifth bit and scale, f16 d and dmin of far apart magnitudes."""
    raw = rng.integers(0, 256, (rows, nb, 176), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb, 2)) * np.exp2(rng.integers(-14, -5, (rows, nb, 2)))).astype(np.float16)
    raw[:, :, :4] = d.view(np.uint8).reshape(rows, nb, 4)
    return raw.reshape(rows, nb * 176)


def q2_K_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q2_K rows: every code, scale and min, f16 d and dmin of far apart magnitudes."""
    raw = rng.integers(0, 256, (rows, nb, 84), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb, 2)) * np.exp2(rng.integers(-14, -5, (rows, nb, 2)))).astype(np.float16)
    raw[:, :, 80:] = d.view(np.uint8).reshape(rows, nb, 4)
    return raw.reshape(rows, nb * 84)


def q3_K_rows(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q3_K rows: every code, high bit and scale, f16 d of far apart magnitudes."""
    raw = rng.integers(0, 256, (rows, nb, 110), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, nb)) * np.exp2(rng.integers(-14, -6, (rows, nb)))).astype(np.float16)
    raw[:, :, 108:] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * 110)


ROWS = {GGMLType.Q2_K: q2_K_rows, GGMLType.Q3_K: q3_K_rows, GGMLType.Q4_K: q4_K_rows, GGMLType.Q5_K: q5_K_rows,
        GGMLType.Q6_K: q6_K_rows}


@pytest.mark.parametrize("wtype", list(ROWS), ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 8, 20, 128])
def test_plain_k_quant_products_are_libggml_s_bit_for_bit(ggml_reference: object, wtype: GGMLType, n: int) -> None:
    """ggml_reference: libggml built; ggml_c.compute_like computes the node with plain (not repacked) weights."""
    from pyggml.testing import ggml_c

    rng = np.random.default_rng(n)
    M, K = 40, 768  # rows not a multiple of ggml's 16-row microtiles
    raw = ROWS[wtype](rng, M, K // 256)
    x = src1_f32(rng, n, K)
    ctx = new_ctx(64)
    try:
        node = ctx.mul_mat(weight_tensor(ctx, wtype, raw[None, None]), tensor(ctx, GGMLType.F32, x[None, None]))
        want = ggml_c.compute_like(node).reshape(n, M)
        got = run(node, ComputeParams(n_threads=2, numerics="x86")).reshape(n, M)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        if n >= 8:  # the rows' order is another: the comparison tells them apart
            rows = run(node, ComputeParams(n_threads=2, numerics="x86", batch_invariant=True)).reshape(n, M)
            assert not np.array_equal(rows, want)
            assert np.array_equal(rows[:1].view(np.uint32),
                                  run(ctx.mul_mat(node.src[0], tensor(ctx, GGMLType.F32, x[None, None, :1])),
                                      ComputeParams(numerics="x86")).reshape(1, M).view(np.uint32))
    finally:
        ctx.free()


@pytest.mark.parametrize("wtype", list(ROWS), ids=lambda t: t.name)
def test_the_portable_tiles_give_the_product_s_bits(wtype: GGMLType) -> None:
    """kquant_tiles without VNNI (portable vector IR) against the MUL_MAT kernel (the host's tiles, which the test
    above holds to libggml's bits): the integer sums are exact either way, so every bit is the same."""
    from pyggml.backends.cpu.kernels.vec_dot import kquant_tiles as kt
    from pyggml.backends.cpu.kernels.vec_dot.quantize_src1 import ROUND_X86, quantize_rows

    rng = np.random.default_rng(5)
    M, K, n = 13, 512, 21  # a ragged tile of rows and a ragged band of columns
    raw = ROWS[wtype](rng, M, K // 256)
    x = src1_f32(rng, n, K)
    ctx = new_ctx(64)
    try:
        node = ctx.mul_mat(weight_tensor(ctx, wtype, raw[None, None]), tensor(ctx, GGMLType.F32, x[None, None]))
        want = run(node, ComputeParams(n_threads=1, numerics="x86")).reshape(n, M)
    finally:
        ctx.free()
    yq, yd = np.empty((n, K), np.int8), np.empty((n, K // 256), np.float32)
    ys, yb = np.empty((n, K // 256), np.float32), np.empty((n, K // 16), np.int32)
    quantize_rows(int(GGMLType.Q8_K), x, yq, yd, ys, yb, ROUND_X86)
    w_off = np.arange(M, dtype=np.int64) * raw.shape[1]
    got = np.full((n, M), np.nan, np.float32)
    kt.make_tiled_rows(kt.TILED_SPECS[wtype.name], vnni=False)(raw.reshape(-1), w_off, 0, 0, M, K // 256, yq, yd, yb,
                                                                0, n, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
