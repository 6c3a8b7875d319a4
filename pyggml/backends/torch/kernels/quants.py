"""Quantized rows to floats: Q8_0 and Q4_0 on the device with ggml's dequantize_row arithmetic, every other
quantized type pyggml converts through ggml's to_float on the host (`pyggml.core.quants`), then moved to the
device (MUL_MAT's weights are converted once, through the weight cache; GET_ROWS converts the rows it picks).

Both are exact in f32: a block's value is an int (|q| <= 127 for Q8_0, -8..7
for Q4_0) times the block's f16 scale `d`, at most 7 + 11 significant bits.
Rows arrive as raw uint8 (..., row bytes) views; the result is (..., ne0).
"""

from __future__ import annotations

import torch

from pyggml.core.errors import UnsupportedTypeError
from pyggml.core.quants import IMPLEMENTED_TYPES, to_float
from pyggml.core.types import QUANT_WEIGHT_TYPES, TYPE_TRAITS, GGMLType

QK8_0 = 32
QK4_0 = 32
DEVICE_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0)  # dequantized on the device
DEQUANT_TYPES = tuple(t for t in QUANT_WEIGHT_TYPES if t in IMPLEMENTED_TYPES)


def _scales(blocks: torch.Tensor) -> torch.Tensor:
    """The f16 scale of each block (its first two bytes, little-endian) as f32, shape (..., n_blocks, 1)."""
    return blocks[..., :2].contiguous().view(torch.float16).to(torch.float32)


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """block_q8_0 {f16 d; int8 qs[32]}: x[j] = qs[j] * d."""
    blocks = raw.unflatten(-1, (raw.shape[-1] // TYPE_TRAITS[GGMLType.Q8_0].type_size,
                                TYPE_TRAITS[GGMLType.Q8_0].type_size))
    q = blocks[..., 2:].view(torch.int8).to(torch.float32)
    return (q * _scales(blocks)).flatten(-2)


def dequantize_q4_0(raw: torch.Tensor) -> torch.Tensor:
    """block_q4_0 {f16 d; uint8 qs[16]}: x[j] = ((qs[j] & 0xF) - 8) * d, x[j + 16] = ((qs[j] >> 4) - 8) * d."""
    blocks = raw.unflatten(-1, (raw.shape[-1] // TYPE_TRAITS[GGMLType.Q4_0].type_size,
                                TYPE_TRAITS[GGMLType.Q4_0].type_size))
    qs = blocks[..., 2:]
    q = torch.cat((qs & 0x0F, qs >> 4), dim=-1).to(torch.float32) - 8.0
    return (q * _scales(blocks)).flatten(-2)


def dequantize(type: GGMLType, raw: torch.Tensor) -> torch.Tensor:
    """Raw rows (..., row bytes) of `type` as f32 (..., ne0)."""
    if type == GGMLType.Q8_0:
        return dequantize_q8_0(raw)
    if type == GGMLType.Q4_0:
        return dequantize_q4_0(raw)
    if type in DEQUANT_TYPES:
        rows = raw.reshape(-1, raw.shape[-1]).cpu().numpy()
        out = torch.from_numpy(to_float(type, rows)).to(raw.device)
        return out.view(*raw.shape[:-1], out.shape[-1])
    raise UnsupportedTypeError(f"torch backend: no dequantization for type {type.name} "
                               f"(takes {', '.join(t.name for t in DEQUANT_TYPES)})")
