"""`pyggml.core.work`: a graph's work and temporaries from logical shapes, bounded by a budget before anything
runs, with the node and the numbers named; a real model's largest batch passes the default budget widely."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyggml import Context
from pyggml.core.errors import LimitExceededError
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op
from pyggml.core.types import GGMLType
from pyggml.core.work import (
    MAX_GRAPH_WORK,
    MAX_NODE_ELEMENTS,
    MAX_TEMP_BYTES,
    WorkBudget,
    graph_cost,
    n_elements,
    node_temp_bytes,
    node_work,
)

F32 = GGMLType.F32


def test_counts_are_logical_and_never_overflow() -> None:
    t = Tensor(None, F32, [16, 65535, 65535, 65535], [4, 0, 0, 0])
    assert n_elements(t) == 16 * 65535**3
    t = Tensor(None, F32, [2**32 - 1] * 4, [4, 0, 0, 0])
    assert n_elements(t) == (2**32 - 1) ** 4  # beyond int64: Python ints


def test_the_work_of_a_product_and_of_an_elementwise_op() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(F32, 64, 32)  # K = 64, M = 32
    x = ctx.new_tensor_2d(F32, 64, 8)  # N = 8
    y = ctx.mul_mat(w, x)
    assert node_work(y) == 64 * 32 * 8 + (32 * 8 + 64 * 32 + 64 * 8)
    z = ctx.add(y, y)
    assert node_work(z) == 3 * 32 * 8


def test_temporaries_are_the_non_contiguous_tensors_as_float32() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_3d(GGMLType.F16, 64, 16, 4)
    assert node_temp_bytes(ctx.scale(a, 2.0)) == 0
    p = ctx.permute(a, 0, 2, 1, 3)
    assert node_temp_bytes(ctx.cont(p)) == 64 * 16 * 4 * 4


def _graph(n: int) -> list[Tensor]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 1024).set_name("a")
    out = [ctx.add(a, a).set_name("n0")]
    for i in range(1, n):
        out.append(ctx.add(out[-1], a).set_name(f"n{i}"))
    return out


def test_the_budget_names_the_node_and_the_numbers() -> None:
    nodes = _graph(3)
    assert graph_cost(nodes, WorkBudget(work=3 * 3072)).work == 3 * 3072
    with pytest.raises(LimitExceededError, match=r"node 2 'n2' \(ADD\) takes the graph's work to 9216 \(this node "
                                                 r"3072\), more than its budget of 9215"):
        graph_cost(nodes, WorkBudget(work=9215))
    with pytest.raises(LimitExceededError, match=r"node 0 'n0' \(ADD\): it has 1024 elements \('n0' F32\[1024, 1, 1, "
                                                 r"1\]\), more than the 1000 a node may have"):
        graph_cost(nodes, WorkBudget(node_elements=1000))
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    big = Tensor(None, F32, [16, 65535, 65535, 65535], [4, 0, 0, 0])
    big.name = "big"
    node = ctx.add(ctx.new_tensor_1d(F32, 16), ctx.new_tensor_1d(F32, 16)).set_name("x")
    node.src[1] = big
    with pytest.raises(LimitExceededError, match=rf"its src\[1\] 'big' has {16 * 65535**3} elements"):
        graph_cost([node], WorkBudget())


def test_temporaries_are_bounded_by_the_ceiling_and_the_room_left() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 256, 256)
    nodes = [ctx.cont(ctx.transpose(a)).set_name("t0"), ctx.cont(ctx.transpose(a)).set_name("t1")]
    one = 256 * 256 * 4
    assert graph_cost(nodes, WorkBudget(temp_bytes=2 * one), temp_room=2 * one).temp_bytes == 2 * one
    with pytest.raises(LimitExceededError, match=rf"node 1 't1' \(CONT\) takes the graph's temporaries to {2 * one} "
                                                 rf"bytes \(this node {one}: .*more than the {2 * one - 1} bytes a "
                                                 "graph may hold"):
        graph_cost(nodes, WorkBudget(temp_bytes=2 * one - 1))
    with pytest.raises(LimitExceededError, match=rf"more than the {one} bytes left under the memory limit"):
        graph_cost(nodes, WorkBudget(), temp_room=one)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_smollm2s_largest_batch_passes_the_default_budget_widely(smollm2_path: Path, flash_attn: bool) -> None:
    """The largest graph of SmolLM2 135M: 512 tokens at the end of a 1024-cell context, every logit."""
    import pyggml.models as pm
    from pyggml.backends.cpu import cpu_init

    model = pm.load(smollm2_path, backends=[cpu_init(1)], n_ctx=1024, n_batch=512, flash_attn=flash_attn,
                    progress=False)
    try:
        gf = model._measure_graphs()[0][0]
        nodes = [n for n in gf.nodes if n.op != GGMLOp.NONE and not is_view_op(n.op)]
        cost = graph_cost(nodes, WorkBudget())
        biggest = max(n_elements(t) for n in nodes for t in (n, *n.src) if t is not None)
    finally:
        model.free()
    assert cost.work * 300 < MAX_GRAPH_WORK and cost.temp_bytes * 10 < MAX_TEMP_BYTES, cost
    assert biggest * 100 < MAX_NODE_ELEMENTS
