"""The kinds the MUL_MAT kernels compile for (weight types, repacked layouts) and the 16-value tables."""

from __future__ import annotations

from pyggml.core.quants import KVALUES_IQ4NL, KVALUES_MXFP4
from pyggml.core.types import GGMLType

# kinds: the GGMLType numbers (module-level ints are compile-time constants in numba)
F32 = int(GGMLType.F32)
F16 = int(GGMLType.F16)
BF16 = int(GGMLType.BF16)
Q4_0 = int(GGMLType.Q4_0)
Q4_1 = int(GGMLType.Q4_1)
Q5_0 = int(GGMLType.Q5_0)
Q5_1 = int(GGMLType.Q5_1)
Q8_0 = int(GGMLType.Q8_0)
Q8_1 = int(GGMLType.Q8_1)
Q2_K = int(GGMLType.Q2_K)
Q3_K = int(GGMLType.Q3_K)
Q4_K = int(GGMLType.Q4_K)
Q5_K = int(GGMLType.Q5_K)
Q6_K = int(GGMLType.Q6_K)
Q8_K = int(GGMLType.Q8_K)
IQ4_NL = int(GGMLType.IQ4_NL)
IQ4_XS = int(GGMLType.IQ4_XS)
MXFP4 = int(GGMLType.MXFP4)

# the 16 values a 4-bit quant of these types indexes (ggml-common.h's kvalues_iq4nl, kvalues_mxfp4)
KVALUES: dict[int, list[int]] = {IQ4_NL: [int(v) for v in KVALUES_IQ4NL], MXFP4: [int(v) for v in KVALUES_MXFP4]}
KVALUES[IQ4_XS] = KVALUES[IQ4_NL]

# a matrix's kernel kind is its weight type's number, plus one of these for the layouts of 8 interleaved rows:
# X8_REPACKED held so by the repack buffer type, X8_TILE repacked into tiles as each work item goes (prompts),
# X8_GEMV held repacked with every column in the order of ggml's repack gemv (batch-invariant); TILED: plain rows
# in the order of ggml-cpu's tiled matmul (its K-quant prompts)
X8_REPACKED = 1024
X8_TILE = 2048
X8_GEMV = 3072
TILED = 4096
# F16/BF16 rows in one of ggml's float dot orders (half_orders.HALF_ORDERS), X8_REPACKED apart per order
HALF_ORDER = 8192


def kind_name(kind: int) -> str:
    """A kernel kind by name: the weight type's, with `_x8` or `_x8_tile` for the repacked layouts."""
    if kind >= HALF_ORDER:
        return f"{GGMLType(kind % X8_REPACKED).name}_order{(kind - HALF_ORDER) // X8_REPACKED}"
    if kind >= TILED:
        return f"{GGMLType(kind - TILED).name}_tiled"
    if kind >= X8_GEMV:
        return f"{GGMLType(kind - X8_GEMV).name}_x8_gemv"
    if kind >= X8_TILE:
        return f"{GGMLType(kind - X8_TILE).name}_x8_tile"
    if kind >= X8_REPACKED:
        return f"{GGMLType(kind - X8_REPACKED).name}_x8"
    return GGMLType(kind).name
