"""Weights repacked for the CPU kernels: Q4_0 matrices as groups of 8 rows interleaved 4 bytes at a time.

ggml's CPU backend repacks some weight types at load (its "extra" buffer type CPU_REPACK, ggml-cpu/repack.cpp:
Q4_0 to block_q4_0x8 where the CPU has AVX2) so that one SIMD instruction works on several rows at once. pyggml
does the same for Q4_0 matrices whose row count is a multiple of 8 (X8_ROWS), in a layout of its own made for
vpdpbusd's 32-bit lanes (see quant_dot's "Q4_0 repacked" section), with the float order of ggml's x86 repack
kernels, so that a product gives the bits llama.cpp's repacked Q4_0 gives on an AVX2 machine.

The layout, per group of 8 rows (r = 0..7) and per block b (32 values, 18 bytes in Q4_0): the 8 rows' f16
scales d (16 bytes), then 4 times 32 bytes: byte 4r + i of the v-th holds row r's quant byte 4v + i (its
values 4v + i in the low nibble and 16 + 4v + i in the high one). A group of 8 rows takes the bytes its rows
took, so a repacked matrix has the size of the original.
"""

from __future__ import annotations

import numpy as np

from pyggml.core.errors import ShapeError

X8_ROWS = 8
Q4_0_BLOCK_BYTES = 18  # block_q4_0: f16 d, 16 bytes of nibbles


def _check(raw: np.ndarray, what: str) -> tuple[int, int]:
    """(row groups, blocks per row) of a matrix of Q4_0 rows as a 2-D uint8 array."""
    if raw.ndim != 2 or raw.dtype != np.uint8:
        raise ShapeError(f"{what}: expected a 2-D uint8 array of Q4_0 rows, got {raw.dtype} with shape {raw.shape}")
    rows, row_bytes = raw.shape
    if rows % X8_ROWS or row_bytes % Q4_0_BLOCK_BYTES:
        raise ShapeError(f"{what}: {rows} rows of {row_bytes} bytes: the rows must be a multiple of {X8_ROWS} and "
                         f"the row bytes of {Q4_0_BLOCK_BYTES}")
    return rows // X8_ROWS, row_bytes // Q4_0_BLOCK_BYTES


def repack_q4_0(raw: np.ndarray) -> np.ndarray:
    """Q4_0 rows (2-D uint8, rows a multiple of 8) in the repacked layout: an array of the same shape."""
    groups, nb = _check(raw, "repack_q4_0")
    blocks = raw.reshape(groups, X8_ROWS, nb, Q4_0_BLOCK_BYTES)
    out = np.empty((groups, nb, X8_ROWS * Q4_0_BLOCK_BYTES), np.uint8)
    out[:, :, :16] = blocks[:, :, :, :2].transpose(0, 2, 1, 3).reshape(groups, nb, 16)
    qs = blocks[:, :, :, 2:].reshape(groups, X8_ROWS, nb, 4, 4)  # (group, row, block, v, i)
    out[:, :, 16:] = qs.transpose(0, 2, 3, 1, 4).reshape(groups, nb, 128)  # (group, block, v, row, i)
    return out.reshape(raw.shape)


def unpack_q4_0(packed: np.ndarray) -> np.ndarray:
    """The Q4_0 rows of a repacked matrix (the inverse of repack_q4_0)."""
    groups, nb = _check(packed, "unpack_q4_0")
    blocks = packed.reshape(groups, nb, X8_ROWS * Q4_0_BLOCK_BYTES)
    out = np.empty((groups, X8_ROWS, nb, Q4_0_BLOCK_BYTES), np.uint8)
    out[:, :, :, :2] = blocks[:, :, :16].reshape(groups, nb, X8_ROWS, 2).transpose(0, 2, 1, 3)
    qs = blocks[:, :, 16:].reshape(groups, nb, 4, X8_ROWS, 4)  # (group, block, v, row, i)
    out[:, :, :, 2:] = qs.transpose(0, 3, 1, 2, 4).reshape(groups, X8_ROWS, nb, 16)
    return out.reshape(packed.shape)
