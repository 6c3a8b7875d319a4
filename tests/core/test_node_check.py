"""`node_check`: the sources each op takes (OP_SOURCES, ggml.c's builders) and the sizes a kernel derives from
op_params, checked on nodes from outside; every node pyggml's own builders make passes."""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
import pytest

from pyggml import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.ops.node_check import OP_SOURCES, check_node, check_sources
from pyggml.core.tensor import GGML_MAX_SRC, GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.testing import op_check


def test_every_op_has_its_sources() -> None:
    assert set(OP_SOURCES) == set(GGMLOp)
    assert all(0 <= required <= most <= GGML_MAX_SRC for required, most in OP_SOURCES.values())


def _present(node: Tensor) -> list[int]:
    return [i for i, s in enumerate(node.src) if s is not None]


def test_every_node_the_op_cases_build_passes_and_the_table_is_tight() -> None:
    """Every node of every op case (1300+ graphs, every op pyggml builds) passes check_node; each op's required
    count is the fewest sources a case gives it and its most the highest source a case sets (CUSTOM takes any)."""
    fewest: dict[GGMLOp, int] = {}
    highest: dict[GGMLOp, int] = defaultdict(int)
    for case in op_check.all_cases():
        ctx = Context(mem_size=64 << 20, no_alloc=True)
        g = ctx.new_graph()
        g.build_forward_expand(case.build(ctx))
        for node in g.nodes:
            check_node(node)
            present = _present(node)
            fewest[node.op] = min(fewest.get(node.op, GGML_MAX_SRC), len(present))
            highest[node.op] = max(highest[node.op], present[-1] + 1 if present else 0)
    assert len(fewest) > 90
    for op, n in fewest.items():
        if op != GGMLOp.CUSTOM:
            assert OP_SOURCES[op] == (n, highest[op]), op.name


def _add(n_src: int) -> Tensor:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(GGMLType.F32, 4).set_name("a")
    out = ctx.add(a, a).set_name("out")
    out.src = [a] * n_src + [None] * (GGML_MAX_SRC - n_src)
    return out


def test_sources_missing_or_beyond_the_op_are_refused() -> None:
    check_sources(_add(2))
    with pytest.raises(ArgumentError, match=r"node 'out' \(ADD\) has no src\[1\]: ADD takes 2 sources"):
        check_sources(_add(1))
    with pytest.raises(ArgumentError, match=r"node 'out' \(ADD\) has a src\[2\] 'a': ADD takes 2 sources"):
        check_sources(_add(3))
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_2d(GGMLType.F32, 8, 4)
    sm = ctx.soft_max(x).set_name("sm")
    check_sources(sm)  # mask and sinks optional
    sm.src[0] = None
    with pytest.raises(ArgumentError, match=r"'sm' \(SOFT_MAX\) has no src\[0\]: SOFT_MAX takes 1 to 3 sources"):
        check_sources(sm)


@pytest.mark.parametrize(("stop", "message"), [
    (float("nan"), "the count of start=0.0, stop=nan, step=1.0 is nan, not a finite count"),
    (float("inf"), "the count of start=0.0, stop=inf, step=1.0 is inf, not a finite count"),
    (-float("inf"), "the count of start=0.0, stop=-inf, step=1.0 is -inf, not a finite count"),
    (9.0, "the count of start=0.0, stop=9.0, step=1.0 is 9, the node has 8 elements"),
])
def test_arange_counts_are_checked_conversions(stop: float, message: str) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    r = ctx.arange(0.0, 8.0, 1.0).set_name("r")
    check_node(r)
    r.set_op_params_f32(1, stop)
    with pytest.raises(ArgumentError, match=re.escape(f"node 'r' (ARANGE): {message}")):
        check_node(r)
    r.set_op_params_f32(1, 8.0)
    r.set_op_params_f32(2, float(np.float32(0.0)))  # a zero step: an infinite count
    with pytest.raises(ArgumentError, match="is inf, not a finite count"):
        check_node(r)
