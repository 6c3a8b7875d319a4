"""The LLaMA-like test graph: measured, then allocated in exactly the measured bytes, and computed right."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from pyggml import Context
from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.tensor import GGMLOp
from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors
from pyggml.testing.graphs import LlamaDims, build_llama_graph, llama_input_values, place_weights

DIMS = LlamaDims(n_layers=2, n_tokens=5, n_embd=32, n_head=4, n_head_kv=2, n_ff=48, n_vocab=40, n_ctx=8)


def build(dims: LlamaDims = DIMS):
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    return (ctx, *build_llama_graph(ctx, **asdict(dims)))


def alloc_inputs(talloc: TensorAllocator, inputs: dict) -> None:
    """Inputs get memory before the graph, as llama.cpp allocates them: leafs the graph allocator places
    lazily can share memory (tokens are freed after GET_ROWS, before the positions are placed), so the
    values set after alloc_graph would overwrite each other."""
    for name in ("tokens", "pos", "kq_mask"):
        talloc.alloc(inputs[name])


def test_graph_has_the_llama_ops() -> None:
    _, g, inputs, weights = build()
    ops = {n.op for n in g.nodes}
    for op in (GGMLOp.GET_ROWS, GGMLOp.RMS_NORM, GGMLOp.MUL_MAT, GGMLOp.ROPE, GGMLOp.CPY, GGMLOp.SOFT_MAX,
               GGMLOp.UNARY, GGMLOp.MUL, GGMLOp.ADD, GGMLOp.PERMUTE, GGMLOp.CONT, GGMLOp.VIEW):
        assert op in ops, op
    assert g.nodes[-1] is inputs["logits"]
    assert inputs["logits"].ne[:2] == [DIMS.n_vocab, DIMS.n_tokens]
    assert inputs["kq_mask"].ne[:2] == [DIMS.n_ctx, DIMS.n_tokens]
    assert len(weights) == 2 + DIMS.n_layers * 11 + 1
    assert all(w.data is None for w in weights)


def test_measure_then_exact_buffer_matches_separate_memory() -> None:
    backend = cpu_init()

    # measure: weights at fake addresses outside the compute buffer
    _, g, inputs, weights = build()
    wm = place_weights(weights)
    measure = TensorAllocator.new_measure_from_backend(backend)
    alloc_inputs(measure, inputs)
    need = GraphAllocator().alloc_graph(measure, g)
    measure.free()
    wm.free()
    sum_nodes = sum(n.nbytes() for n in g.nodes if n.view_src is None)
    assert 0 < need < sum_nodes  # memory was reused

    # real pass in a buffer of exactly `need` bytes
    _, g, inputs, weights = build()
    wt = place_weights(weights, backend, seed=7)
    buf = backend.alloc_buffer(need)
    talloc = TensorAllocator.new_from_buffer(buf)
    alloc_inputs(talloc, inputs)
    assert GraphAllocator().alloc_graph(talloc, g) == need
    values = llama_input_values(inputs, n_vocab=DIMS.n_vocab, seed=3)
    for name, v in values.items():
        tensor_set_numpy(inputs[name], v)
    backend.graph_compute(g)
    got = tensor_get_numpy(inputs["logits"])
    n_inplace = sum(1 for n in g.nodes if n.view_src is not None and n.op not in
                    (GGMLOp.VIEW, GGMLOp.RESHAPE, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE, GGMLOp.CPY))
    assert n_inplace > 0  # the in-place paths ran (rope over reshaped views, norms, adds)
    buf.free()
    wt.free()

    # reference: every tensor in memory of its own
    ctx, g, inputs, weights = build()
    wt = place_weights(weights, backend, seed=7)
    own = alloc_ctx_tensors(ctx, backend)
    for name, v in values.items():
        tensor_set_numpy(inputs[name], v)
    backend.graph_compute(g)
    ref = tensor_get_numpy(inputs["logits"])
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    own.free()
    wt.free()


def test_one_byte_less_fails_cleanly() -> None:
    backend = cpu_init()
    _, g, _, weights = build()
    wm = place_weights(weights)
    measure = TensorAllocator.new_measure_from_backend(backend)
    need = GraphAllocator().alloc_graph(measure, g)
    _, g, _, weights = build()
    wm = place_weights(weights)
    buf = backend.alloc_buffer(need - 1)
    talloc = TensorAllocator.new_from_buffer(buf)
    galloc = GraphAllocator()
    from pyggml.core.errors import OutOfMemoryError

    with pytest.raises(OutOfMemoryError, match="needed"):
        galloc.alloc_graph(talloc, g)
    assert all(n.data is None for n in g.nodes if n.view_src is None)
    assert talloc.n_free_blocks == 1 and talloc.max_size == 0
    buf.free()
    wm.free()


def test_bench_alloc_runs_on_small_dims() -> None:
    """benchmarks/bench_alloc.py's figures on a tiny graph: reuse beats no reuse, the bound holds."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_alloc.py"
    spec = importlib.util.spec_from_file_location("bench_alloc", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.bench_one(LlamaDims(2, 4, 32, 4, 2, 48, 40, 8), repeats=1)
    assert r["nodes"] > 0
    assert 0 < r["lower_bound"] <= r["peak"] < r["no_reuse"]
