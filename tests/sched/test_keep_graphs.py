"""BackendSched.keep_graphs: reset() puts the allocated graph aside, alloc_graph takes it up again as it was
(splits, copies, places, plans), so a caller alternating between a prompt's graph and a token's pays the full
path once per graph. Where the kept state could be stale (other pins, grown buffers) the full path is taken."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.models.builtin import builtin_model_path
from pyggml.sched import BackendSched

PROMPT = "The module"


def _two_graphs(ctx: Context) -> tuple[Tensor, Tensor, Graph, Tensor, Graph, Tensor]:
    """A weight in the second backend's memory is not needed: two small graphs over one input each."""
    x = ctx.new_tensor_2d("f32", 8, 4)
    x.set_input()
    y = ctx.new_tensor_2d("f32", 8, 2)
    y.set_input()
    ga, gb = Graph(64), Graph(64)
    a = ctx.scale(ctx.add(ctx.mul(x, x), x), 0.5)
    b = ctx.sum_rows(ctx.sqr(ctx.add(y, y)))
    ga.build_forward_expand(a)
    gb.build_forward_expand(b)
    return x, a, ga, y, b, gb


def _run(sched: BackendSched, graph: Graph, inp: Tensor, values: np.ndarray, out: Tensor) -> np.ndarray:
    sched.reset()
    sched.alloc_graph(graph)
    tensor_set_numpy(inp, values)
    sched.graph_compute(graph)
    return tensor_get_numpy(out).copy()


@pytest.mark.parametrize("n_backends", [1, 2])
def test_alternating_graphs_are_taken_up_again(n_backends: int) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x, a, ga, y, b, gb = _two_graphs(ctx)
    backends = [cpu_init(1) for _ in range(n_backends)]
    sched = BackendSched(backends, graph_size=64)
    sched.keep_graphs = 2
    if n_backends == 2:  # the graph's first ops on backend 0, the rest on 1: copies between them
        sched.set_tensor_backend(ga.nodes[0], backends[0])
    rng = np.random.default_rng(0)
    kept_plans: list[object] = []
    try:
        sched.reserve(ga)
        for step in range(4):
            xv = rng.standard_normal((4, 8)).astype(np.float32)
            yv = rng.standard_normal((2, 8)).astype(np.float32)
            if n_backends == 2:
                sched.reset()
                sched.set_tensor_backend(ga.nodes[0], backends[0])
                sched.alloc_graph(ga)
                tensor_set_numpy(x, xv)
                sched.graph_compute(ga)
                got_a = tensor_get_numpy(a).copy()
            else:
                got_a = _run(sched, ga, x, xv, a)
            assert sched.restored == (step > 0)
            plans = [s.plan for s in sched.splits]
            assert np.allclose(got_a, (xv * xv + xv) * 0.5, rtol=1e-6)
            got_b = _run(sched, gb, y, yv, b)
            assert sched.restored == (step > 0) and sched.stats.restored == (step > 0)
            assert np.allclose(got_b[:, 0], ((yv + yv) ** 2).sum(axis=1), rtol=1e-5)
            if step > 0:  # the plans made at the first compute serve every later one
                assert all(p is not None for p in plans) and all(p is q for p, q in zip(plans, kept_plans, strict=True))
            kept_plans = plans
    finally:
        sched.free()
    # freeing lets every kept graph go: their nodes read their own sources again
    assert all(src is None or src in (*ga.nodes, *ga.leafs) for n in ga.nodes for src in n.src)


def test_other_pins_or_grown_buffers_take_the_full_path() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x, a, ga, y, b, gb = _two_graphs(ctx)
    big = ctx.new_tensor_1d("f32", 1 << 16)
    big.set_input()
    gbig = Graph(16)
    out_big = ctx.scale(big, 2.0)
    gbig.build_forward_expand(out_big)
    backends = [cpu_init(1), cpu_init(1)]
    sched = BackendSched(backends, graph_size=64)
    sched.keep_graphs = 2
    xv = np.arange(32, dtype=np.float32).reshape(4, 8)
    yv = np.ones((2, 8), np.float32)
    try:
        _run(sched, ga, x, xv, a)
        _run(sched, gb, y, yv, b)
        # pinned since the reset (where the passes put it anyway, so that no buffer grows): the kept
        # assignment is not taken for granted
        sched.reset()
        sched.set_tensor_backend(ga.nodes[1], backends[1])
        sched.alloc_graph(ga)
        assert not sched.restored and sched.get_tensor_backend(ga.nodes[1]) is backends[1]
        assert sched.stats.split_time > 0
        assert sched.stats.sched_cpu_time > 0  # this thread's CPU time in the split and alloc just done
        tensor_set_numpy(x, xv)
        sched.graph_compute(ga)
        assert np.allclose(tensor_get_numpy(a), (xv * xv + xv) * 0.5)
        _run(sched, gb, y, yv, b)
        assert sched.restored
        # a graph larger than the buffers grows them: the graphs kept in the old ones are placed again
        n_reserves = sched.n_reserves
        _run(sched, gbig, big, np.ones(1 << 16, np.float32), out_big)
        assert sched.n_reserves > n_reserves
        got = _run(sched, gb, y, yv, b)
        assert not sched.restored and np.allclose(got[:, 0], 32.0)
        got = _run(sched, ga, x, xv, a)
        assert not sched.restored and np.allclose(got, (xv * xv + xv) * 0.5)
    finally:
        sched.free()


def test_forget_graph_lets_go_of_its_places() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x, a, ga, y, b, gb = _two_graphs(ctx)
    sched = BackendSched([cpu_init(1)], graph_size=64)
    sched.keep_graphs = 2
    try:
        _run(sched, ga, x, np.ones((4, 8), np.float32), a)
        sched.reset()
        assert a.data is not None  # kept aside, still placed
        sched.forget_graph(ga)
        assert a.data is None and x.data is None and not sched._kept
        got = _run(sched, ga, x, np.full((4, 8), 2.0, np.float32), a)
        assert not sched.restored and np.allclose(got, 3.0)
    finally:
        sched.free()


@pytest.mark.parametrize("n_backends", [1, 2])
@pytest.mark.slow
def test_a_model_keeps_its_prompt_and_token_graphs(n_backends: int) -> None:
    """Prompt, tokens, prompt, tokens: two graphs built, the second use of each taken up again by the
    scheduler, and the logits those of a model that builds a graph for every batch."""
    path = builtin_model_path()
    kw = {"n_layers_on": [1]} if n_backends == 2 else {}
    kept = pm.load(path, backends=[cpu_init(1) for _ in range(n_backends)], n_ctx=64, progress=False, **kw)
    fresh = pm.load(path, n_ctx=64, progress=False, reuse_graphs=False)
    try:
        sched = kept.runner.sched
        for round in range(2):
            ids = kept.tokenize(PROMPT)
            for model in (kept, fresh):
                model.reset()
            assert np.array_equal(kept.eval(ids), fresh.eval(ids))
            assert sched.stats.restored == (round == 1)
            for i, t in enumerate((7, 300, 12)):
                assert np.array_equal(kept.eval([t]), fresh.eval([t]))
                assert sched.stats.restored == (round == 1 and i == 0) and sched.stats.reused == (i > 0)
        assert kept.n_graphs_built == 2 and fresh.n_graphs_built == 8
        assert n_backends == 1 or sched.n_splits >= 2
    finally:
        kept.free()
        fresh.free()


@pytest.mark.slow
def test_a_model_keeps_as_many_graphs_as_set() -> None:
    """set_keep_graphs: with 2 kept, three batch shapes in turn build a graph every time; with 3, each shape is
    built once and taken up again after. Shrinking drops the oldest; a bad count raises."""
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False)
    try:
        for keep, built in ((2, 9), (3, 3)):
            model.reset()
            model.set_keep_graphs(keep)
            model._forget_graph()
            start = model.n_graphs_built
            for _ in range(3):
                model.reset()
                for n in (1, 2, 3):  # three shapes (n tokens each)
                    model.eval(list(range(5, 5 + n)))
            assert model.n_graphs_built - start == built, keep
        assert len(model._graphs) == 3
        model.set_keep_graphs(1)
        assert len(model._graphs) == 1 and model.runner.sched.keep_graphs == 1
        for bad in (0, -2, 2.5, True):
            with pytest.raises(ArgumentError, match="keep_graphs"):
                model.set_keep_graphs(bad)  # type: ignore[arg-type]
    finally:
        model.free()
