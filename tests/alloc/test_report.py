"""memory_report: offsets, peak, the liveness lower bound, and the log line after alloc_graph."""

from __future__ import annotations

import logging
from dataclasses import asdict

import pytest

from pyggml import Context, GGMLType
from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.alloc.report import memory_report
from pyggml.testing.graphs import LlamaDims, build_llama_graph, place_weights


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def test_chain_is_optimal(ctx: Context) -> None:
    a = ctx.new_tensor_1d(GGMLType.F32, 32).set_name("a")
    b = ctx.cont(a).set_name("b")
    c = ctx.cont(b).set_name("c")
    d = ctx.cont(c).set_name("d")
    g = ctx.new_graph()
    g.build_forward_expand(d)
    talloc = TensorAllocator.new_measure(32)
    GraphAllocator().alloc_graph(talloc, g)
    r = memory_report(g, talloc)
    assert [(e.name, e.offset, e.size) for e in r.entries] == [("a", 0, 128), ("b", 128, 128), ("c", 0, 128),
                                                              ("d", 128, 128)]
    assert [(e.first_step, e.last_step) for e in r.entries] == [(0, 0), (0, 1), (1, 2), (2, 2)]
    assert r.peak == 256 and r.lower_bound == 256 and r.ratio == 1.0
    assert r.bytes_no_reuse == 512
    text = r.format()
    assert "peak 256 bytes, lower bound 256 bytes" in text and " d" in text
    # the same report from the tensors in order, and from the buffer alone
    assert memory_report([b, c, d], talloc).lower_bound == 256
    assert memory_report(g).peak == 256


def test_fragmentation_shows_as_ratio_above_one(ctx: Context) -> None:
    a = ctx.new_tensor_1d(GGMLType.F32, 32).set_name("a")  # 128 bytes
    b = ctx.cont(a).set_name("b")
    c = ctx.concat(b, b, 0).set_name("c")  # 256 bytes: a's freed 128-byte hole is too small
    g = ctx.new_graph()
    g.build_forward_expand(c)
    talloc = TensorAllocator.new_measure(32)
    GraphAllocator().alloc_graph(talloc, g)
    r = memory_report(g, talloc)
    assert [(e.name, e.offset) for e in r.entries] == [("a", 0), ("b", 128), ("c", 256)]
    assert r.peak == 512
    assert r.lower_bound == 384 and r.lower_bound_step == 1  # b and c at the concat
    assert r.ratio == pytest.approx(512 / 384)


def test_inplace_counts_once_and_inputs_live_from_the_start(ctx: Context) -> None:
    x = ctx.new_tensor_1d(GGMLType.F32, 32).set_name("x").set_input()
    p = ctx.new_tensor_1d(GGMLType.F32, 32).set_name("p")
    y = ctx.cont(p).set_name("y")
    z = ctx.add(y, x).set_name("z")  # in place over y
    g = ctx.new_graph()
    g.build_forward_expand(z)
    talloc = TensorAllocator.new_measure(32)
    talloc.alloc(x)  # allocated before the graph, as inputs are
    GraphAllocator().alloc_graph(talloc, g)
    assert z.view_src is y
    r = memory_report(g, talloc)
    by_name = {e.name: e for e in r.entries}
    assert by_name["z"].view_of == "y" and by_name["z"].offset == by_name["y"].offset
    # step 0 (y = cont p): x (input), p, y alive; step 1: x, y(=z)
    assert r.lower_bound == 384 and r.lower_bound_step == 0
    assert r.bytes_no_reuse == 384


def test_report_is_logged_after_alloc_graph(ctx: Context, caplog: pytest.LogCaptureFixture) -> None:
    a = ctx.new_tensor_1d(GGMLType.F32, 8).set_name("a")
    b = ctx.cont(a).set_name("b")
    g = ctx.new_graph()
    g.build_forward_expand(b)
    with caplog.at_level(logging.DEBUG, logger="pyggml.alloc"):
        GraphAllocator().alloc_graph(TensorAllocator.new_measure(32), g)
    assert any("memory report" in r.getMessage() and "peak 64 bytes" in r.getMessage() for r in caplog.records)


def test_llama_graph_bound_below_peak() -> None:
    dims = LlamaDims(n_layers=2, n_tokens=8, n_embd=64, n_head=4, n_head_kv=4, n_ff=160, n_vocab=50, n_ctx=16)
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    g, inputs, weights = build_llama_graph(ctx, **asdict(dims))
    place_weights(weights)
    talloc = TensorAllocator.new_measure(32)
    for name in ("tokens", "pos", "kq_mask"):
        talloc.alloc(inputs[name])
    peak = GraphAllocator().alloc_graph(talloc, g)
    r = memory_report(g, talloc)
    assert r.peak == peak
    assert 0 < r.lower_bound <= r.peak < r.bytes_no_reuse
    # no weight is in the report: they live in another buffer
    assert not any(e.name.endswith(".weight") or e.name.startswith("k_cache") for e in r.entries)
