"""Prompts of plain Q4_0, Q8_0 and Q5_0 matrices: the repacked loops on tiles (type_table.X8_TILE_KINDS).

The Q8_0 and Q5_0 (widened to Q8_0's blocks) repacked loops against an independent scalar loop in the
repacked order (acc = fma(float(block sum of value * y), d_w * d_y, acc), block after block), to the bit, with
the portable sums and with VNNI's where the host has it; tile_x8 against repack_block32 (of the widened rows
for Q5_0); then MUL_MAT of a plain matrix with a prompt's columns (the tiles, 1 and 2 threads) against the
same reference, and with fewer columns against the row loops (which keep ggml's vec_dot order).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import backend_mul_mat
from numba import njit

from pyggml.backends.cpu.kernels import matmul
from pyggml.backends.cpu.kernels.vec_dot import block_sums, ir, kinds, quantize_src1, tiles_x8
from pyggml.backends.cpu.repack import X8_ROWS, repack_block32, unpack_block32
from pyggml.core.types import GGMLType

K = 224  # 7 blocks
NB = K // 32
TYPES = [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q5_0]


BLOCK_BYTES = {GGMLType.Q4_0: 18, GGMLType.Q8_0: 34, GGMLType.Q5_0: 22}


def _rows(rng: np.random.Generator, type: GGMLType, rows: int) -> np.ndarray:
    """Random rows of `type`: every quant pattern, f16 scales of far apart magnitudes."""
    size = BLOCK_BYTES[type]
    raw = rng.integers(0, 256, (rows, NB, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (rows, NB)) * np.exp2(rng.integers(-12, 4, (rows, NB)))).astype(np.float16)
    raw[:, :, :2] = d.view(np.uint8).reshape(rows, NB, 2)
    return raw.reshape(rows, NB * size)


def _values(raw: np.ndarray, type: GGMLType) -> np.ndarray:
    """The int32 values (rows, K) of the rows (ggml's dequantize_row_* without the scale)."""
    size = BLOCK_BYTES[type]
    blocks = raw.reshape(raw.shape[0], NB, size)
    if type == GGMLType.Q8_0:
        v = blocks[:, :, 2:].view(np.int8).astype(np.int32)
    elif type == GGMLType.Q4_0:
        qs = blocks[:, :, 2:].astype(np.int32)
        v = np.concatenate([qs & 15, qs >> 4], axis=-1) - 8
    else:
        qh = blocks[:, :, 2:6].copy().view(np.uint32)[:, :, 0].astype(np.int64)
        qs = blocks[:, :, 6:].astype(np.int32)
        bits = ((qh[:, :, None] >> np.arange(32)) & 1).astype(np.int32)
        v = np.concatenate([qs & 15, qs >> 4], axis=-1) | (bits << 4)
        v = v - 16
    return np.ascontiguousarray(v.reshape(raw.shape[0], K))


def _src1(rng: np.random.Generator, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """src1 rows quantized to Q8_0 as the kernels take them (yq, yd, yb: sums of 16)."""
    n = x.shape[0]
    yq, yd = np.zeros((n, K), np.int8), np.zeros((n, NB), np.float32)
    yb = np.zeros((n, K // 16), np.int32)
    quantize_src1.quantize_rows(kinds.Q8_0, x, yq, yd, np.zeros_like(yd), yb, quantize_src1.ROUND_X86)
    return yq, yd, yb


@njit(cache=True)
def _reference(values, d, yq, yd, out):
    """out[c, m]: the repacked order, one scalar at a time (d: the rows' f16 scales as float32)."""
    for m in range(values.shape[0]):
        for c in range(yq.shape[0]):
            acc = np.float32(0.0)
            for b in range(values.shape[1] // 32):
                isum = 0
                for j in range(32):
                    isum += values[m, 32 * b + j] * np.int32(yq[c, 32 * b + j])
                acc = ir.fma_f32(np.float32(isum), d[m, b] * yd[c, b], acc)
            out[c, m] = acc


def _want(raw: np.ndarray, type: GGMLType, yq: np.ndarray, yd: np.ndarray) -> np.ndarray:
    size = BLOCK_BYTES[type]
    d = raw.reshape(raw.shape[0], NB, size)[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    out = np.zeros((yq.shape[0], raw.shape[0]), np.float32)
    _reference(_values(raw, type), np.ascontiguousarray(d), yq, yd, out)
    return out


def _widened(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows as the Q8_0-shaped blocks the tiles widen them to: d, then each value + 16 as a byte."""
    blocks = np.zeros((raw.shape[0], NB, 34), np.uint8)
    blocks[:, :, :2] = raw.reshape(raw.shape[0], NB, 22)[:, :, :2]
    blocks[:, :, 2:] = (_values(raw, GGMLType.Q5_0) + 16).reshape(raw.shape[0], NB, 32)
    return blocks.reshape(raw.shape[0], -1)


@pytest.mark.parametrize("type", TYPES, ids=lambda t: t.name)
def test_the_tiles_are_the_repacked_layout(type: GGMLType) -> None:
    rng = np.random.default_rng(0)
    raw = _rows(rng, type, 3 * X8_ROWS)
    plain = _widened(raw) if type == GGMLType.Q5_0 else raw
    layout = GGMLType.Q8_0 if type == GGMLType.Q5_0 else type
    packed = repack_block32(plain, layout)
    assert np.array_equal(unpack_block32(packed, layout), plain)
    w_off = np.arange(raw.shape[0], dtype=np.int64) * raw.shape[1]
    tile, offs = tiles_x8.tile_x8(raw.reshape(-1), w_off, 0, X8_ROWS, 3 * X8_ROWS, NB, int(type))
    assert np.array_equal(tile, packed[X8_ROWS:].reshape(-1))  # rows 8..23: groups 1 and 2
    assert list(offs[::X8_ROWS]) == [0, X8_ROWS * plain.shape[1]]


VARIANTS = [False] + ([True] if block_sums.HAS_VNNI else [])


@pytest.mark.parametrize("groups", [1, 2], ids=lambda g: f"{g}-groups")
@pytest.mark.parametrize("vnni", VARIANTS, ids=lambda v: "vnni" if v else "portable")
@pytest.mark.parametrize("type", [GGMLType.Q8_0, GGMLType.Q5_0], ids=lambda t: t.name)
@pytest.mark.slow
def test_repacked_loop_is_the_repacked_order_to_the_bit(type: GGMLType, vnni: bool, groups: int) -> None:
    rng = np.random.default_rng(1)
    M = 3 * X8_ROWS
    raw = _rows(rng, type, M)
    plain = _widened(raw) if type == GGMLType.Q5_0 else raw
    packed = repack_block32(plain, GGMLType.Q8_0).reshape(-1)
    w_off = np.arange(M, dtype=np.int64) * plain.shape[1]
    dot = tiles_x8.make_dot_x8(vnni, ir.COLS, *tiles_x8.X8_BLOCK_QUANTS[int(type)], groups=groups)

    @njit
    def run(w, w_off, yq, yd, yb, out):
        for r in range(0, yq.shape[0], 4):
            dot(w, w_off, 0, 0, w_off.shape[0], NB, yq, yd, yb, r, min(4, yq.shape[0] - r), out)

    for n in (1, 3, 6):
        x = (rng.standard_normal((n, K)) * np.exp(2 * rng.standard_normal((n, 1)))).astype(np.float32)
        yq, yd, yb = _src1(rng, x)
        got = np.full((n, M), np.nan, np.float32)
        run(packed, w_off, yq, yd, yb, got)
        assert np.array_equal(got.view(np.uint32), _want(raw, type, yq, yd).view(np.uint32)), n


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("type", TYPES, ids=lambda t: t.name)
def test_mul_mat_of_a_prompt_takes_the_tiles(type: GGMLType, n_threads: int) -> None:
    from pyggml.backends.cpu.backend import cpu_init, cpu_set_n_threads
    from pyggml.core.context import Context

    rng = np.random.default_rng(2)
    M = 64 * X8_ROWS  # enough work for the threads (matmul.PARALLEL_MIN_WORK)
    raw = _rows(rng, type, M)
    with cpu_init() as backend:
        cpu_set_n_threads(backend, n_threads)
        for n in (matmul.X8_TILE_MIN_COLS, matmul.X8_TILE_MIN_COLS + 5, matmul.X8_TILE_MIN_COLS - 1):
            ctx = Context(mem_size=1 << 22)
            w = ctx.new_tensor_2d(type, K, M)
            w.numpy()[0, 0] = raw
            x = (rng.standard_normal((n, K)) * 3).astype(np.float32)
            got = backend_mul_mat(backend, w, x)
            yq, yd, _ = _src1(rng, x)
            want = _want(raw, type, yq, yd)
            if n >= matmul.X8_TILE_MIN_COLS:
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), n
            else:  # the row loops: ggml's vec_dot order, a float rounding away from the repacked one
                assert not np.isnan(got).any()
                assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), n
            ctx.free()
