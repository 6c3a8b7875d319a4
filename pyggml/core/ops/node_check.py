"""A node made elsewhere (a graph received over RPC) checked against its op before a backend sees it.

The builders guarantee what a kernel assumes of its node; a node from outside carries whatever its sender
wrote. `check_node` checks what no kernel checks before using it: its sources against the op's arity
(`OP_SOURCES`: which sources ggml's builder sets, as llama.cpp 0c1e570's ggml.c does) and the sizes a
kernel derives from its op_params (ARANGE's count) as checked conversions. Both raise ArgumentError
naming the node, its op and the numbers.
"""

from __future__ import annotations

import math

import numpy as np

from pyggml.core.errors import ArgumentError
from pyggml.core.ops.params import ArangeParams
from pyggml.core.tensor import GGML_MAX_SRC, GGMLOp, Tensor

# ops by the number of sources ggml's builder sets, all required
_FIXED: dict[int, str] = {
    0: "NONE ARANGE",
    1: "DUP SQR SQRT LOG SIN COS SUM SUM_ROWS CUMSUM MEAN ARGMAX REPEAT REPEAT_BACK NORM RMS_NORM GROUP_NORM "
       "L2_NORM SCALE CONT RESHAPE VIEW PERMUTE TRANSPOSE DIAG DIAG_MASK_INF DIAG_MASK_ZERO CLAMP COL2IM_1D POOL_1D "
       "POOL_2D UPSCALE PAD PAD_REFLECT_1D ROLL TIMESTEP_EMBEDDING ARGSORT TOP_K LEAKY_RELU TRI FILL WIN_PART "
       "WIN_UNPART GET_REL_POS UNARY MAP_CUSTOM1",
    2: "ADD ADD1 ACC SUB MUL DIV COUNT_EQUAL CONCAT SILU_BACK RMS_NORM_BACK MUL_MAT OUT_PROD SET CPY GET_ROWS "
       "GET_ROWS_BACK SOFT_MAX_BACK CONV_TRANSPOSE_1D IM2COL IM2COL_BACK IM2COL_3D CONV_2D CONV_3D CONV_2D_DW "
       "CONV_TRANSPOSE_2D POOL_2D_BACK SSM_CONV SOLVE_TRI DSV4_HC_PRE MAP_CUSTOM2 CROSS_ENTROPY_LOSS",
    3: "ADD_ID MUL_MAT_ID SET_ROWS ADD_REL_POS DSV4_HC_COMB MAP_CUSTOM3 CROSS_ENTROPY_LOSS_BACK OPT_STEP_SGD",
    4: "FLASH_ATTN_BACK LIGHTNING_INDEXER",
    5: "GATED_LINEAR_ATTN OPT_STEP_ADAMW",
    6: "RWKV_WKV6 GATED_DELTA_NET",
    7: "SSM_SCAN RWKV_WKV7",
}
# each op's (sources that must be present, sources there may be): src[0 .. required-1] set, none from src[most] on
OP_SOURCES: dict[GGMLOp, tuple[int, int]] = {GGMLOp[name]: (n, n) for n, names in _FIXED.items()
                                             for name in names.split()}
OP_SOURCES.update({
    GGMLOp.SOFT_MAX: (1, 3),  # mask, sinks
    GGMLOp.GLU: (1, 2),  # the gate of a split GLU
    GGMLOp.ROPE: (2, 3),  # frequency factors
    GGMLOp.ROPE_BACK: (2, 3),
    GGMLOp.FLASH_ATTN_EXT: (3, 5),  # mask, sinks
    GGMLOp.DSV4_HC_POST: (3, 4),  # comb
    GGMLOp.CUSTOM: (0, GGML_MAX_SRC),  # ggml_custom_4d: the caller's arguments
})


def check_sources(node: Tensor) -> None:
    """ArgumentError unless `node` has every source its op requires and none beyond those it may have."""
    required, most = OP_SOURCES[node.op]
    for i in range(required):
        if node.src[i] is None:
            raise ArgumentError(f"node '{node.name}' ({node.op.name}) has no src[{i}]: {node.op.name} takes "
                                f"{_count_text(required, most)}")
    for i in range(most, GGML_MAX_SRC):
        if node.src[i] is not None:
            raise ArgumentError(f"node '{node.name}' ({node.op.name}) has a src[{i}] '{node.src[i].name}': "
                                f"{node.op.name} takes {_count_text(required, most)}")


def _count_text(required: int, most: int) -> str:
    if required == most:
        return f"{required} source{'s' if required != 1 else ''}"
    return f"{required} to {most} sources"


def checked_count(value: float, what: str) -> int:
    """`value` (a count derived from float op_params) as an int, or ArgumentError naming `what` when it is
    NaN or infinite."""
    if not math.isfinite(value):
        raise ArgumentError(f"{what} is {value}, not a finite count")
    return int(value)


def _check_arange(node: Tensor) -> None:
    """ARANGE: ceil((stop - start) / step) values in float32 (the kernel's count) fill the node exactly."""
    p = ArangeParams.of(node)
    with np.errstate(all="ignore"):
        span = np.float32(np.float32(p.stop) - np.float32(p.start))
        steps = float(np.ceil(span / np.float32(p.step)))
    what = f"node '{node.name}' (ARANGE): the count of start={p.start}, stop={p.stop}, step={p.step}"
    n = checked_count(steps, what)
    if n != node.nelements():
        raise ArgumentError(f"{what} is {n}, the node has {node.nelements()} elements")


# the ops whose kernels derive a size from float op_params
_PARAM_CHECKS = {GGMLOp.ARANGE: _check_arange}


def check_node(node: Tensor) -> None:
    """The checks of a node from outside before it is computed: `check_sources`, then the sizes its kernel
    derives from its op_params."""
    check_sources(node)
    check = _PARAM_CHECKS.get(node.op)
    if check is not None:
        check(node)


__all__ = ["OP_SOURCES", "check_node", "check_sources", "checked_count"]
