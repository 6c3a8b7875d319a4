"""Weights repacked for the CPU kernels (ggml's CPU_REPACK, repack.cpp): Q4_0 and Q4_K matrices as groups of 8 rows
interleaved 4 bytes at a time (DESIGN.md, "Repacked rows (x8)")."""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.buffer import TENSOR_ALIGNMENT, CPUBuffer, cpu_alloc_buffer, host_bytes
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.buffer import Buffer, tensor_buffer
from pyggml.ggml_backend.buffer_type import BufferType

X8_ROWS = 8
Q4_0_BLOCK_BYTES = 18
REPACK_BUFT_NAME = "CPU_REPACK"


class Repacked:
    """The `extra` of a tensor held repacked (ggml puts its tensor_traits there): the kernels read its layout."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<repacked {self.name}>"


REPACKED_Q4_0 = Repacked("Q4_0 8x4")
REPACKED_Q4_K = Repacked("Q4_K 8x4")


def _check(raw: np.ndarray, what: str, type: GGMLType) -> tuple[int, int]:
    block_bytes = TYPE_TRAITS[type].type_size
    if raw.ndim != 2 or raw.dtype != np.uint8:
        raise ShapeError(f"{what}: expected a 2-D uint8 array of {type.name} rows, got {raw.dtype} with shape "
                         f"{raw.shape}")
    rows, row_bytes = raw.shape
    if rows % X8_ROWS or row_bytes % block_bytes:
        raise ShapeError(f"{what}: {rows} rows of {row_bytes} bytes: the rows must be a multiple of {X8_ROWS} and "
                         f"the row bytes of {block_bytes}")
    return rows // X8_ROWS, row_bytes // block_bytes


# 32-value block types: the bytes of each field before the quants, and the block's bytes
BLOCK32_FIELDS = {GGMLType.Q4_0: ((2,), Q4_0_BLOCK_BYTES), GGMLType.Q8_0: ((2,), 34)}


def repack_block32(raw: np.ndarray, type: GGMLType) -> np.ndarray:
    """Rows of Q4_0 or Q8_0 (2-D uint8) repacked: per group of 8 rows and block, the 8 rows' d, then the quants,
    byte 4r + i of the v-th 32 holding row r's byte 4v + i."""
    fields, block_bytes = BLOCK32_FIELDS[type]
    groups, nb = _check(raw, f"repack {type.name}", type)
    blocks = raw.reshape(groups, X8_ROWS, nb, block_bytes).transpose(0, 2, 1, 3)  # (group, block, row, byte)
    out = np.empty((groups, nb, X8_ROWS * block_bytes), np.uint8)
    at = src = 0
    for size in fields:
        out[:, :, at:at + X8_ROWS * size] = blocks[:, :, :, src:src + size].reshape(groups, nb, X8_ROWS * size)
        at, src = at + X8_ROWS * size, src + size
    qs = blocks[:, :, :, src:].reshape(groups, nb, X8_ROWS, -1, 4)
    out[:, :, at:] = qs.transpose(0, 1, 3, 2, 4).reshape(groups, nb, -1)
    return out.reshape(raw.shape)


def unpack_block32(packed: np.ndarray, type: GGMLType) -> np.ndarray:
    """The inverse of repack_block32."""
    fields, block_bytes = BLOCK32_FIELDS[type]
    groups, nb = _check(packed, f"unpack {type.name}", type)
    blocks = packed.reshape(groups, nb, X8_ROWS * block_bytes)
    out = np.empty((groups, nb, X8_ROWS, block_bytes), np.uint8)
    at = src = 0
    for size in fields:
        out[:, :, :, src:src + size] = blocks[:, :, at:at + X8_ROWS * size].reshape(groups, nb, X8_ROWS, size)
        at, src = at + X8_ROWS * size, src + size
    qs = blocks[:, :, at:].reshape(groups, nb, -1, X8_ROWS, 4)
    out[:, :, :, src:] = qs.transpose(0, 1, 3, 2, 4).reshape(groups, nb, X8_ROWS, -1)
    return out.transpose(0, 2, 1, 3).reshape(packed.shape)


Q4_K_X8_SCALES, Q4_K_X8_MINS, Q4_K_X8_QS = 32, 96, 128
Q4_K_BLOCK_BYTES = 144
Q4_K_X8_BYTES = X8_ROWS * Q4_K_BLOCK_BYTES


def _q4_K_scales_mins(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q4_K block's 12 scale bytes (last axis) as its 8 scales and 8 mins (ggml's get_scale_min_k4)."""
    lo, hi = q[..., 0:4], q[..., 4:8]
    sc = np.concatenate([lo & 63, (q[..., 8:12] & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (q[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _q4_K_scale_bytes(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of _q4_K_scales_mins."""
    return np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                           (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], axis=-1).astype(np.uint8)


def repack_q4_K(raw: np.ndarray) -> np.ndarray:
    """Rows of Q4_K (2-D uint8) repacked: per group of 8 rows and super-block, d, dmin, scales, mins, quants."""
    groups, nb = _check(raw, "repack Q4_K", GGMLType.Q4_K)
    blocks = raw.reshape(groups, X8_ROWS, nb, Q4_K_BLOCK_BYTES).transpose(0, 2, 1, 3)  # (group, block, row, byte)
    out = np.empty((groups, nb, Q4_K_X8_BYTES), np.uint8)
    out[:, :, :16] = blocks[:, :, :, 0:2].reshape(groups, nb, 16)
    out[:, :, 16:Q4_K_X8_SCALES] = blocks[:, :, :, 2:4].reshape(groups, nb, 16)
    sc, mn = (a.transpose(0, 1, 3, 2).reshape(groups, nb, 64) for a in _q4_K_scales_mins(blocks[:, :, :, 4:16]))
    out[:, :, Q4_K_X8_SCALES:Q4_K_X8_MINS] = sc | ((mn >> 4) << 6)
    out[:, :, Q4_K_X8_MINS:Q4_K_X8_QS] = (mn[:, :, :32] & 15) | ((mn[:, :, 32:] & 15) << 4)
    qs = blocks[:, :, :, 16:].reshape(groups, nb, X8_ROWS, 4, 8, 4)
    out[:, :, Q4_K_X8_QS:] = qs.transpose(0, 1, 3, 4, 2, 5).reshape(groups, nb, -1)
    return out.reshape(raw.shape)


def unpack_q4_K(packed: np.ndarray) -> np.ndarray:
    """The inverse of repack_q4_K."""
    groups, nb = _check(packed, "unpack Q4_K", GGMLType.Q4_K)
    blocks = packed.reshape(groups, nb, Q4_K_X8_BYTES)
    out = np.empty((groups, nb, X8_ROWS, Q4_K_BLOCK_BYTES), np.uint8)
    out[:, :, :, 0:2] = blocks[:, :, :16].reshape(groups, nb, X8_ROWS, 2)
    out[:, :, :, 2:4] = blocks[:, :, 16:Q4_K_X8_SCALES].reshape(groups, nb, X8_ROWS, 2)
    packed_sc = blocks[:, :, Q4_K_X8_SCALES:Q4_K_X8_MINS]
    low = blocks[:, :, Q4_K_X8_MINS:Q4_K_X8_QS]
    mn = np.concatenate([low & 15, low >> 4], axis=-1) | ((packed_sc >> 6) << 4)
    by_row = [a.reshape(groups, nb, 8, X8_ROWS).transpose(0, 1, 3, 2) for a in (packed_sc & 63, mn)]
    out[:, :, :, 4:16] = _q4_K_scale_bytes(*by_row)
    qs = blocks[:, :, Q4_K_X8_QS:].reshape(groups, nb, 4, 8, X8_ROWS, 4)
    out[:, :, :, 16:] = qs.transpose(0, 1, 4, 2, 3, 5).reshape(groups, nb, X8_ROWS, -1)
    return out.transpose(0, 2, 1, 3).reshape(packed.shape)


def repack_q4_0(raw: np.ndarray) -> np.ndarray:
    return repack_block32(raw, GGMLType.Q4_0)


def unpack_q4_0(packed: np.ndarray) -> np.ndarray:
    return unpack_block32(packed, GGMLType.Q4_0)


# a type's marker (the tensor's `extra`), repack and unpack; the type table's `repack` column says which are held so
LAYOUTS = {
    GGMLType.Q4_0: (REPACKED_Q4_0, repack_q4_0, unpack_q4_0),
    GGMLType.Q4_K: (REPACKED_Q4_K, repack_q4_K, unpack_q4_K),
}


def repackable(tensor: Tensor) -> bool:
    """Whether the repack buffer holds `tensor` repacked, as ggml_repack_get_optimal_repack_type asks on x86."""
    from pyggml.backends.cpu.kernels.vec_dot.type_table import CPU_TYPE_TRAITS  # its kernels import this module

    row = CPU_TYPE_TRAITS.get(tensor.type)
    return (row is not None and row.repack and tensor.ne[1] % X8_ROWS == 0 and tensor.ne[3] == 1
            and tensor.is_contiguous())



def is_repacked(tensor: Tensor | None) -> bool:
    if tensor is None:
        return False
    base = tensor.view_src if tensor.view_src is not None else tensor
    return isinstance(base.extra, Repacked)


def repack_supports_op(op: Tensor) -> bool:
    """ggml's repack extra_buffer_type::supports_op: a whole repackable src0 of MUL_MAT (2-D) or MUL_MAT_ID (3-D)."""
    for i, src in enumerate(op.src):
        buffer = tensor_buffer(src) if src is not None else None
        if src is None or buffer is None or not isinstance(buffer.buft, CPURepackBufferType):
            continue
        b = op.src[1]
        dims_fit = (op.op == GGMLOp.MUL_MAT and src.ne[2] == 1) or (op.op == GGMLOp.MUL_MAT_ID and src.ne[2] > 1)
        if not (dims_fit and i == 0 and src.view_src is None and repackable(src)
                and b is not None and b.type == GGMLType.F32):
            return False
    return True


class CPURepackBuffer(CPUBuffer):
    """Host memory whose repackable matrices are held repacked, written and read whole as plain rows."""

    def _init_tensor(self, tensor: Tensor) -> None:
        if tensor.view_src is None and repackable(tensor):
            tensor.extra = LAYOUTS[tensor.type][0]

    def _whole(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        if offset != 0 or size != tensor.nbytes():
            raise ArgumentError(f"buffer '{self.name}': {what} of '{tensor.name}' (held repacked) at offset {offset} "
                                f"of {size} bytes: a repacked tensor is read and written whole ({tensor.nbytes()} "
                                f"bytes from offset 0)")

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if not is_repacked(tensor):
            super()._set_tensor(tensor, data, offset, size)
            return
        self._whole(tensor, offset, size, "tensor_set")
        rows = np.frombuffer(data, np.uint8, count=size).reshape(tensor.ne[1] * tensor.ne[2], -1)
        host_bytes(tensor, "tensor_set")[:] = LAYOUTS[tensor.type][1](rows).reshape(-1)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        if not is_repacked(tensor):
            super()._get_tensor(tensor, data, offset, size)
            return
        self._whole(tensor, offset, size, "tensor_get")
        packed = host_bytes(tensor, "tensor_get").reshape(tensor.ne[1] * tensor.ne[2], -1)
        np.frombuffer(data, np.uint8, count=size)[:] = LAYOUTS[tensor.type][2](packed).reshape(-1)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        # a raw copy would skip the repacking: the caller's get and set do it
        return False if is_repacked(dst) else super()._cpy_tensor(src, dst)


class CPURepackBufferType(BufferType):
    """ggml's CPU_REPACK, the CPU device's extra buffer type; not host memory, as in ggml."""

    def _get_name(self) -> str:
        return REPACK_BUFT_NAME

    def _alloc_buffer(self, size: int) -> Buffer:
        return cpu_alloc_buffer(None, size, self, CPURepackBuffer)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _is_host(self) -> bool:
        return False
