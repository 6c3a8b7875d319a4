"""CPU kernels: MAP_CUSTOM1/2/3 and CUSTOM, ops computed by a user's Python callable.

The builders (`pyggml.core.ops.custom`) keep {fun, n_tasks, userdata} in a
table read by `custom_op_params(node)`. As ggml's CPU backend does, the kernel
calls `fun(dst, a, [b, [c,]] ith, nth, userdata)` (CUSTOM: `fun(dst, ith, nth,
userdata)`) once per task, with the tensors as `Tensor` objects; nth is
n_tasks, or the thread count when n_tasks is GGML_N_TASKS_MAX (-1), and at
most the thread count. The tasks run one after another, in order.
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.core.errors import GGMLError
from pyggml.core.ops.custom import GGML_N_TASKS_MAX, custom_op_params
from pyggml.core.tensor import GGMLOp, Tensor

_N_SRC = {GGMLOp.MAP_CUSTOM1: 1, GGMLOp.MAP_CUSTOM2: 2, GGMLOp.MAP_CUSTOM3: 3, GGMLOp.CUSTOM: 0}


def _task_count(n_tasks: int, n_threads: int) -> int:
    """ggml: n_tasks == GGML_N_TASKS_MAX ? n_threads : MIN(n_tasks, n_threads)."""
    n_threads = max(1, n_threads)
    return n_threads if n_tasks == GGML_N_TASKS_MAX else max(1, min(n_tasks, n_threads))


def map_custom_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """Call the node's function once per task with (dst, srcs..., ith, nth, userdata)."""
    p = custom_op_params(node)
    fun, userdata = p.fun, p.userdata
    args = tuple(node.src[: _N_SRC[node.op]])
    nth = _task_count(p.n_tasks, params.n_threads)

    def run() -> None:
        for ith in range(nth):
            fun(node, *args, ith, nth, userdata)

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.MAP_CUSTOM1: map_custom_kernel,
    GGMLOp.MAP_CUSTOM2: map_custom_kernel,
    GGMLOp.MAP_CUSTOM3: map_custom_kernel,
    GGMLOp.CUSTOM: map_custom_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether `node` is a MAP_CUSTOM or CUSTOM node with a function (any types: the function handles them)."""
    if node.op not in KERNELS:
        return False
    try:
        custom_op_params(node)
    except GGMLError:
        return False
    return True
