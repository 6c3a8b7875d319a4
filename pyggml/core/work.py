"""A graph's cost from its nodes' logical shapes (work and kernels' temporaries), checked against a budget first.

Costs count elements, never bytes: a stride of 0 makes 64 bytes a tensor of 4.5e15 elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyggml.core.errors import LimitExceededError
from pyggml.core.ops.params import Conv3dParams, Dsv4HcCombParams, Pool1dParams, Pool2dParams
from pyggml.core.tensor import GGMLOp, Tensor, shape_str

F32_BYTES = 4
MAX_NODE_ELEMENTS = 2**34  # a 70B model's largest tensor (its embedding) has 2**30
MAX_GRAPH_WORK = 2**45  # a batch's work is about parameters times tokens: a 1B model's 512 tokens pass 50 times
MAX_TEMP_BYTES = 2**30


def n_elements(t: Tensor) -> int:
    """The logical element count (Python ints: no overflow whatever ne holds)."""
    return math.prod(t.ne)


def _srcs(node: Tensor) -> list[Tensor]:
    return [s for s in node.src if s is not None]


def _src(node: Tensor, i: int) -> Tensor:
    s = node.src[i]
    return s if s is not None else node  # a missing source is check_sources' to refuse


# --- the work beyond touching each element once ---


def _mul_mat(node: Tensor) -> int:  # K multiply-adds per result (MUL_MAT, MUL_MAT_ID)
    return _src(node, 0).ne[0] * n_elements(node)


def _out_prod(node: Tensor) -> int:
    return _src(node, 0).ne[1] * n_elements(node)


def _attention(node: Tensor) -> int:  # Q.K per query and key, then the weighted sum of V
    q, k = _src(node, 0), _src(node, 1)
    return (n_elements(q) + n_elements(node)) * k.ne[1]


def _conv_2d(node: Tensor) -> int:  # kernel [KW, KH, IC, OC]: KW*KH*IC per result
    kernel = _src(node, 0)
    return n_elements(node) * (n_elements(kernel) // max(kernel.ne[3], 1))


def _conv_2d_dw(node: Tensor) -> int:
    kernel = _src(node, 0)
    return n_elements(node) * kernel.ne[0] * kernel.ne[1]


def _conv_3d(node: Tensor) -> int:  # kernel [KW, KH, KD, IC*OC]
    kernel = _src(node, 0)
    return n_elements(node) * kernel.ne[0] * kernel.ne[1] * kernel.ne[2] * max(Conv3dParams.of(node).c, 1)


def _conv_transpose_1d(node: Tensor) -> int:  # kernel [K, OC, IC]: each input adds K*OC
    kernel = _src(node, 0)
    return n_elements(_src(node, 1)) * kernel.ne[0] * kernel.ne[1]


def _conv_transpose_2d(node: Tensor) -> int:  # kernel [KW, KH, OC, IC]
    kernel = _src(node, 0)
    return n_elements(_src(node, 1)) * (n_elements(kernel) // max(kernel.ne[3], 1))


def _pool_1d(node: Tensor) -> int:
    return n_elements(node) * max(Pool1dParams.of(node).k0, 1)


def _pool_2d(node: Tensor) -> int:
    p = Pool2dParams.of(node)
    return n_elements(node) * max(p.k0, 1) * max(p.k1, 1)


def _pool_2d_back(node: Tensor) -> int:
    p = Pool2dParams.of(node)
    return n_elements(_src(node, 0)) * max(p.k0, 1) * max(p.k1, 1)


def _solve_tri(node: Tensor) -> int:  # A [n, n]: n per result
    return n_elements(node) * _src(node, 0).ne[0]


def _sort(node: Tensor) -> int:
    a = _src(node, 0)
    return n_elements(a) * max(a.ne[0], 1).bit_length()


def _ssm_conv(node: Tensor) -> int:  # d_conv taps per result
    return n_elements(node) * _src(node, 1).ne[0]


def _ssm_scan(node: Tensor) -> int:  # each input element updates d_state states
    return n_elements(_src(node, 1)) * _src(node, 0).ne[0]


def _linear_attention(node: Tensor) -> int:  # each token's [S, H] vectors update S x S states per head
    inputs = [_src(node, i) for i in range(3)]
    return max(n_elements(t) for t in inputs) * max(t.ne[0] for t in inputs)


def _lightning_indexer(node: Tensor) -> int:  # q [D, H, T, S]: D*H per score
    q = _src(node, 0)
    return n_elements(node) * q.ne[0] * q.ne[1]


def _dsv4_hc_comb(node: Tensor) -> int:  # n_iter Sinkhorn rounds over each matrix
    return n_elements(node) * max(Dsv4HcCombParams.of(node).n_iter, 1)


_EXTRA_WORK: dict[GGMLOp, Callable[[Tensor], int]] = {
    GGMLOp.MUL_MAT: _mul_mat, GGMLOp.MUL_MAT_ID: _mul_mat, GGMLOp.OUT_PROD: _out_prod,
    GGMLOp.FLASH_ATTN_EXT: _attention, GGMLOp.FLASH_ATTN_BACK: _attention,
    GGMLOp.CONV_2D: _conv_2d, GGMLOp.CONV_2D_DW: _conv_2d_dw, GGMLOp.CONV_3D: _conv_3d,
    GGMLOp.CONV_TRANSPOSE_1D: _conv_transpose_1d, GGMLOp.CONV_TRANSPOSE_2D: _conv_transpose_2d,
    GGMLOp.POOL_1D: _pool_1d, GGMLOp.POOL_2D: _pool_2d, GGMLOp.POOL_2D_BACK: _pool_2d_back,
    GGMLOp.SOLVE_TRI: _solve_tri, GGMLOp.ARGSORT: _sort, GGMLOp.TOP_K: _sort,
    GGMLOp.SSM_CONV: _ssm_conv, GGMLOp.SSM_SCAN: _ssm_scan,
    GGMLOp.RWKV_WKV6: _linear_attention, GGMLOp.GATED_LINEAR_ATTN: _linear_attention,
    GGMLOp.RWKV_WKV7: _linear_attention, GGMLOp.GATED_DELTA_NET: _linear_attention,
    GGMLOp.LIGHTNING_INDEXER: _lightning_indexer, GGMLOp.DSV4_HC_COMB: _dsv4_hc_comb,
}


def node_work(node: Tensor) -> int:
    """The elements `node` writes and reads, plus its op's products, windows or sorts."""
    work = n_elements(node) + sum(n_elements(s) for s in _srcs(node))
    extra = _EXTRA_WORK.get(node.op)
    return work + extra(node) if extra is not None else work


def node_temp_bytes(node: Tensor) -> int:
    """The temporaries a kernel may make for `node`: each non-contiguous operand made contiguous, as float32."""
    return sum(n_elements(t) * F32_BYTES for t in (node, *_srcs(node)) if not t.is_contiguous())


@dataclass(frozen=True)
class WorkBudget:
    """What one graph may cost: per node and source, in total work, in total temporaries."""

    node_elements: int = MAX_NODE_ELEMENTS
    work: int = MAX_GRAPH_WORK
    temp_bytes: int = MAX_TEMP_BYTES


@dataclass(frozen=True)
class GraphCost:
    work: int
    temp_bytes: int


def graph_cost(nodes: Iterable[Tensor], budget: WorkBudget, temp_room: int | None = None) -> GraphCost:
    """The work and temporaries of `nodes`, or LimitExceededError naming the first node past `budget` (or past
    `temp_room` bytes of temporaries)."""
    work = temp = 0
    for i, node in enumerate(nodes):
        for j, t in enumerate((node, *node.src)):
            if t is not None and n_elements(t) > budget.node_elements:
                what = "it" if j == 0 else f"its src[{j - 1}] '{t.name}'"
                raise LimitExceededError(f"node {i} '{node.name}' ({node.op.name}): {what} has {n_elements(t)} "
                                         f"elements ({shape_str(t)}), more than the {budget.node_elements} a node "
                                         f"may have")
        work += node_work(node)
        if work > budget.work:
            raise LimitExceededError(f"node {i} '{node.name}' ({node.op.name}) takes the graph's work to {work} "
                                     f"(this node {node_work(node)}), more than its budget of {budget.work}")
        temp += node_temp_bytes(node)
        if temp > budget.temp_bytes or (temp_room is not None and temp > temp_room):
            limit = (f"the {budget.temp_bytes} bytes a graph may hold" if temp > budget.temp_bytes
                     else f"the {max(temp_room or 0, 0)} bytes left under the memory limit")
            raise LimitExceededError(f"node {i} '{node.name}' ({node.op.name}) takes the graph's temporaries to "
                                     f"{temp} bytes (this node {node_temp_bytes(node)}: its non-contiguous "
                                     f"tensors as float32), more than {limit}")
    return GraphCost(work, temp)


__all__ = ["MAX_GRAPH_WORK", "MAX_NODE_ELEMENTS", "MAX_TEMP_BYTES", "GraphCost", "WorkBudget", "graph_cost",
           "n_elements", "node_temp_bytes", "node_work"]
