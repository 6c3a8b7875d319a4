"""BackendSched, today's ggml_backend_sched: the engine every model graph runs through.

Partial backends host layers (the ops they lack fall to another backend), graphs are reused, the eval
callback sees every intermediate or stops the compute, a graph that no longer fits is reserved again, and
bad use raises errors that name the thing before anything is computed."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends import testing_blas
from pyggml.backends.cpu import cpu_init
from pyggml.capi import sched as capi
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, ArgumentTypeError, LimitExceededError, UnsupportedOpError
from pyggml.core.tensor import GGMLOp, is_view_op
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.ggml_backend.buffer import BufferUsage
from pyggml.models.builtin import builtin_model_path
from pyggml.models.llama import build_llama
from pyggml.models.model import Batch
from pyggml.sched import GGML_SCHED_MAX_BACKENDS, BackendSched

PROMPT = "The module"


@pytest.fixture(scope="module")
def one_backend_tokens(builtin_greedy_tokens: list[int]) -> list[int]:
    return builtin_greedy_tokens


def test_a_mul_mat_only_backend_hosts_layers(one_backend_tokens: list[int]) -> None:
    """The testing BLAS backend (its own memory, MUL_MAT only) first, with two of the four layers: the ops it
    lacks go to the CPU (the cache of its layers too), and the greedy tokens are one CPU backend's."""
    blas = testing_blas.testing_blas_init("blas")
    model = pm.load(builtin_model_path(), backends=[blas, cpu_init(1)], n_layers_on=[2], n_ctx=64, progress=False)
    try:
        assert model.layer_backend[:2] == [blas, blas] and model.kv_backend[0] is model.backends[1]
        assert list(model.generate(model.tokenize(PROMPT), 8, stop_at_eos=False)) == one_backend_tokens
        sched = model.runner.sched
        on_blas = [n for s in sched.splits if s.backend is blas for n in s.graph.nodes if not is_view_op(n.op)]
        assert on_blas and {n.op for n in on_blas} == {GGMLOp.MUL_MAT}
        assert sched.n_splits > 2
    finally:
        model.free()


def test_reused_graphs_give_the_logits_of_new_ones() -> None:
    """Decoding reuses one graph (only its inputs change) and gives the logits of a graph built each time."""
    path = builtin_model_path()
    reused = pm.load(path, n_ctx=64, progress=False)
    fresh = pm.load(path, n_ctx=64, progress=False, reuse_graphs=False)
    try:
        for model in (reused, fresh):
            model.eval(model.tokenize(PROMPT))
        for t in (7, 300, 12, 1999):
            a, b = reused.eval([t]), fresh.eval([t])
            assert np.array_equal(a, b)
        assert reused.runner.sched.reused and reused.runner.sched.stats.reused
        assert not fresh.runner.sched.reused
        assert reused.n_graphs_built == 2 and fresh.n_graphs_built == 5
    finally:
        reused.free()
        fresh.free()


def _llama_graph(model: pm.Model, ctx: Context, ids: np.ndarray) -> tuple[Any, Any, list[tuple[Any, np.ndarray]]]:
    n = len(ids)
    pos = np.arange(n, dtype=np.int32)
    seqs = np.zeros(n, dtype=np.int32)
    cells = np.arange(n, dtype=np.int64)  # an empty cache's first cells, for sequence 0
    model.kv.apply(cells, pos, seqs)
    gf, inp = build_llama(ctx, model.hparams, model.w, model.kv, n, 0, n_kv=model._n_kv(n), **model._graph_kw)
    return gf, inp, model._inputs(inp, Batch(ids, pos, seqs, cells, model._n_kv(n)))


def test_eval_callback_reads_every_intermediate() -> None:
    """Every node of a LLaMA graph, read by the callback as it is computed, equals the same node of a run where
    every tensor has memory of its own (no reuse, no scheduler)."""
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False)
    ids = np.array(model.tokenize(PROMPT), np.int32)
    sched = BackendSched(model.backends)
    ctx, ctx2 = model._new_ctx(), model._new_ctx()
    try:
        gf, inp, inputs = _llama_graph(model, ctx, ids)
        seen: dict[int, np.ndarray] = {}
        order = {id(n): i for i, n in enumerate(gf.nodes)}

        def observe(t: Any, ask: bool) -> bool:
            if ask:
                return not is_view_op(t.op)
            seen[order[id(t)]] = tensor_get_numpy(t).copy()
            return True

        sched.set_eval_callback(observe)
        sched.alloc_graph(gf)
        for t, v in inputs:
            tensor_set_numpy(t, v)
        sched.graph_compute(gf)

        gf2, _, inputs2 = _llama_graph(model, ctx2, ids)
        cpu = model.backends[0]
        todo = [t for t in (*gf2.leafs, *gf2.nodes) if t.data is None and t.view_src is None]
        talloc = TensorAllocator.new_from_backend(cpu, sum(t.nbytes() + 64 for t in todo) + 64)
        for t in todo:
            talloc.alloc(t)
        for t in (*gf2.leafs, *gf2.nodes):
            if t.data is None and t.view_src is not None:
                from pyggml.ggml_backend import view_init

                view_init(t)
        for t, v in inputs2:
            tensor_set_numpy(t, v)
        cpu.graph_compute(gf2)
        want = {i: tensor_get_numpy(n) for i, n in enumerate(gf2.nodes) if not is_view_op(n.op)}
        assert set(seen) == set(want) and len(seen) > 4 * 20  # every node of the 4 layers
        for i, values in want.items():
            assert np.array_equal(seen[i], values, equal_nan=True), gf.nodes[i].name
        talloc.free()
    finally:
        sched.free()
        ctx.free()
        ctx2.free()
        model.free()


def test_eval_callback_stops_the_compute_after_a_node() -> None:
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False)
    sched = BackendSched(model.backends)
    ctx = model._new_ctx()
    try:
        gf, inp, inputs = _llama_graph(model, ctx, np.array([1, 50, 60], np.int32))
        asked: list[str] = []

        def stop_at_kq_1(t: Any, ask: bool) -> bool:
            if ask:
                asked.append(t.name)
                return t.name == "kq-1"
            return False  # observed kq-1: stop

        sched.set_eval_callback(stop_at_kq_1)
        sched.alloc_graph(gf)
        for t, v in inputs:
            tensor_set_numpy(t, v)
        sched.graph_compute(gf)
        assert asked[-1] == "kq-1" and "result_output" not in asked
        assert asked == [n.name for n in gf.nodes[: len(asked)]]  # in graph order, nothing after kq-1
    finally:
        sched.free()
        ctx.free()
        model.free()


def _add_graph(n: int) -> tuple[Context, Any, Any, Any]:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(GGMLType.F32, n).set_name("a").set_input()
    b = ctx.new_tensor_1d(GGMLType.F32, n).set_name("b").set_input()
    out = ctx.mul(ctx.add(a, b), ctx.add(a, a)).set_name("out")
    gf = ctx.new_graph()
    gf.build_forward_expand(out)
    return ctx, gf, (a, b), out


def test_a_graph_that_does_not_fit_is_reserved_again(caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = cpu_init(1)
    sched = BackendSched([cpu])
    _, small, _, _ = _add_graph(16)
    sched.reserve(small)
    size = sched.get_buffer_size(cpu)
    assert size > 0 and sched.n_reserves == 1
    _, big, (a, b), out = _add_graph(4096)
    monkeypatch.setenv("GGML_SCHED_DEBUG", "1")
    with caplog.at_level(logging.DEBUG, logger="pyggml.sched"):
        sched.alloc_graph(big)
    assert sched.n_reserves == 2 and sched.get_buffer_size(cpu) > size
    assert "no longer fits" in caplog.text and "reserved" in caplog.text
    x = np.arange(4096, dtype=np.float32)
    tensor_set_numpy(a, x)
    tensor_set_numpy(b, np.ones(4096, np.float32))
    sched.graph_compute(big)
    np.testing.assert_array_equal(tensor_get_numpy(out), (x + 1) * (2 * x))
    sched.free()


def test_the_c_api_of_today() -> None:
    a, b = cpu_init(1), cpu_init(1)
    sched = capi.ggml_backend_sched_new([a, b], None, 2, 2048, False, True)
    assert isinstance(sched, BackendSched)
    assert capi.ggml_backend_sched_get_n_backends(sched) == 2 and capi.ggml_backend_sched_get_backend(sched, 1) is b
    assert capi.ggml_backend_sched_get_n_copies(sched) == 1
    assert capi.ggml_backend_sched_get_buffer_type(sched, a) is a.get_default_buffer_type()
    _, gf, (x, y), out = _add_graph(64)
    sizes = capi.ggml_backend_sched_reserve_size(sched, gf)
    # no weights: the nodes follow their inputs, which live on the last backend (ggml's "1.inp")
    assert sizes[0] == 0 and sizes[1] >= 3 * 64 * 4
    assert capi.ggml_backend_sched_reserve(sched, gf)
    assert capi.ggml_backend_sched_get_buffer_size(sched, b) >= sizes[1]
    _, gf, (x, y), out = _add_graph(64)
    capi.ggml_backend_sched_set_tensor_backend(sched, out, a)  # a (not the last) spreads up to the adds
    assert capi.ggml_backend_sched_alloc_graph(sched, gf)
    assert capi.ggml_backend_sched_get_tensor_backend(sched, out) is a
    tensor_set_numpy(x, np.full(64, 2, np.float32))
    tensor_set_numpy(y, np.full(64, 3, np.float32))
    seen: list[str] = []
    capi.ggml_backend_sched_set_eval_callback(sched, lambda t, ask, ud: ud.append(t.name) or True, seen)
    assert capi.ggml_backend_sched_graph_compute_async(sched, gf) == capi.GGML_STATUS_SUCCESS
    capi.ggml_backend_sched_synchronize(sched)
    assert capi.ggml_backend_sched_get_n_splits(sched) == 1 and "out" in seen
    assert sched.splits[0].backend is a and sorted(t.name for t in sched.splits[0].inputs) == ["a", "b"]
    np.testing.assert_array_equal(tensor_get_numpy(out), np.full(64, 20, np.float32))
    capi.ggml_backend_sched_free(sched)
    seed = capi.ggml_backend_sched_new([a, b], 2)  # the seed's form
    assert not isinstance(seed, BackendSched)
    with pytest.raises(Exception, match="six-argument"):
        capi.ggml_backend_sched_get_n_splits(seed)
    seed.free()


def test_bad_use_is_refused_before_anything_runs() -> None:
    with pytest.raises(LimitExceededError, match=f"GGML_SCHED_MAX_BACKENDS = {GGML_SCHED_MAX_BACKENDS}"):
        BackendSched([cpu_init(1) for _ in range(GGML_SCHED_MAX_BACKENDS + 1)])
    cpu = cpu_init(1)
    with pytest.raises(ArgumentError, match="given twice"):
        BackendSched([cpu, cpu])
    blas = testing_blas.testing_blas_init("blas")
    with pytest.raises(ArgumentError, match="does not support buffer type"):
        BackendSched([cpu], bufts=[blas.get_default_buffer_type()])
    sched = BackendSched([blas, cpu])
    _, gf, _, out = _add_graph(8)
    sched.set_tensor_backend(out, blas)  # MUL on a MUL_MAT-only backend
    with pytest.raises(UnsupportedOpError, match="'out'.*'blas'"):
        sched.alloc_graph(gf)
    with pytest.raises(ArgumentError, match="not one of the scheduler's backends"):
        sched.set_tensor_backend(out, cpu_init(1))
    sched.reset()
    _, gf, (x, y), out = _add_graph(8)
    sched.alloc_graph(gf)  # usable after the error
    tensor_set_numpy(x, np.ones(8, np.float32))
    tensor_set_numpy(y, np.ones(8, np.float32))
    sched.graph_compute(gf)
    np.testing.assert_array_equal(tensor_get_numpy(out), np.full(8, 4, np.float32))
    sched.free()


def test_a_graph_shaped_like_a_reserved_one_takes_its_layout() -> None:
    """As today's graph allocator: after reserving the worst case, a smaller graph of the same shape gets the
    recorded addresses without a new allocation pass; a larger one goes through the allocator again."""
    cpu = cpu_init(1)
    sched = BackendSched([cpu])
    _, big, (a, b), out = _add_graph(4096)
    sched.reserve(big)
    _, small, (a, b), out = _add_graph(100)
    sched.alloc_graph(small)
    assert sched.replayed
    x = np.arange(100, dtype=np.float32)
    tensor_set_numpy(a, x)
    tensor_set_numpy(b, np.full(100, 3, np.float32))
    sched.graph_compute(small)
    np.testing.assert_array_equal(tensor_get_numpy(out), (x + 3) * (2 * x))
    sched.reset()
    _, larger, (a, b), out = _add_graph(5000)
    sched.alloc_graph(larger)
    assert not sched.replayed and sched.n_reserves == 2  # no layout fits: allocated, the buffer grown
    tensor_set_numpy(a, np.ones(5000, np.float32))
    tensor_set_numpy(b, np.ones(5000, np.float32))
    sched.graph_compute(larger)
    np.testing.assert_array_equal(tensor_get_numpy(out), np.full(5000, 4, np.float32))
    sched.free()


def test_the_seed_assignment_mode_assigns_as_the_seed_scheduler(cpu_a: Any, cpu_b: Any) -> None:
    """assign=assign_backends_seed: the LLaMA block of the seed-exact split tests (weights on A, inputs in B's
    memory) gets every node's backend as pyggml.seed.Scheduler gives it, and computes the same numbers."""
    from sched_graphs import build_block, compute_on_one_backend, input_values, make_weights, set_inputs
    from test_splits import LLAMA_BACKENDS_TWO_CPU

    from pyggml.seed import assign_backends_seed

    weights = make_weights(lambda name: cpu_a)
    block = build_block(weights.tensors, 3)
    inputs = TensorAllocator.new_from_backend(cpu_b, sum(t.nbytes() + 64 for t in block.inputs) + 64)
    for t in block.inputs:
        inputs.alloc(t)
    sched = BackendSched([cpu_a, cpu_b], assign=assign_backends_seed)
    sched.alloc_graph(block.graph)
    names = {"A": cpu_a, "B": cpu_b}
    got = {n.name: sched.get_tensor_backend(n) for n in block.graph.nodes}
    assert got == {name: names[b] for name, b in LLAMA_BACKENDS_TWO_CPU.items()}
    values = input_values(3)
    set_inputs(block, values)
    sched.graph_compute(block.graph)
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_a, 3, values), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ArgumentTypeError, match="assign must be a function"):
        BackendSched([cpu_a], assign="seed")  # type: ignore[arg-type]
    sched.free()
    inputs.free()
    weights.free()


def test_observability(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The GGML_SCHED_DEBUG printout (splits, each node's backend and cause), Graphviz with one cluster per
    split, the per-backend timings and bytes copied, and whether a graph was reused."""
    model = pm.load(builtin_model_path(), backends=[cpu_init(1), cpu_init(1)], n_layers_on=[2], n_ctx=64,
                    progress=False)
    try:
        monkeypatch.setenv("GGML_SCHED_DEBUG", "1")
        with caplog.at_level(logging.DEBUG, logger="pyggml.sched"):
            model.eval([1, 50, 60])
        assert "## SPLIT #1: CPU # 1 inputs: [l_out-1" in caplog.text
        assert "1.wgt0" in caplog.text and "1.inp" in caplog.text  # causes, as ggml's SET_CAUSE
        sched = model.runner.sched
        assert not sched.stats.reused and sched.stats.n_splits == 3
        copied = sum(b.bytes_copied for b in sched.stats.backends)
        assert copied > 0 and all(b.compute_time > 0 for b in sched.stats.backends)
        assert f"sched: {sched.stats.n_nodes} nodes in 3 splits" in caplog.text
        model.eval([70])
        model.eval([71])
        assert sched.stats.reused and "reused" in sched.stats.format()
        dot = sched.dump_dot(model.runner.graph)
        assert dot.count("subgraph cluster_") == 1 + 3  # the legend and one per split
        assert 'label = "copy"' in dot and "CPU#l_out-1#0" in dot
    finally:
        model.free()


def test_op_offload_asks_only_devices_with_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml's op offload: a node reading a weight in the last backend's host memory goes to a higher-priority
    backend whose device wants it (cause 1.off); a device without the offload_op hook is not asked (it would
    say no), and with op_offload off nobody is."""
    from pyggml.alloc.ctx_tensors import alloc_ctx_tensors
    from pyggml.ggml_backend.device import Device

    first, last = cpu_init(1), cpu_init(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_2d(GGMLType.F32, 8, 4).set_name("w")
    alloc_ctx_tensors(ctx, last)
    w.buffer.set_usage(BufferUsage.WEIGHTS)
    asked: list[str] = []

    def wants_mul_mat(self: Device, op: Any) -> bool:
        asked.append(op.name)
        return op.op == GGMLOp.MUL_MAT

    def assigned(op_offload: bool) -> tuple[Any, str]:
        graph_ctx = Context(mem_size=1 << 20, no_alloc=True)  # a new graph each time: the last one's memory is gone
        x = graph_ctx.new_tensor_2d(GGMLType.F32, 8, 2).set_name("x").set_input()
        y = graph_ctx.mul_mat(w, x).set_name("y")
        g = graph_ctx.new_graph()
        g.build_forward_expand(y)
        sched = BackendSched([first, last], op_offload=op_offload)
        sched.alloc_graph(g)
        where = sched.get_tensor_backend(y), sched.tensor_cause(y)
        sched.free()
        return where

    assert assigned(True) == (last, "1.wgt0") and asked == []  # the CPU device has no hook: not asked
    device = first.get_device()
    assert device is not None and not device.has_offload_op
    monkeypatch.setattr(type(device), "_offload_op", wants_mul_mat)  # (both backends' device type)
    assert device.has_offload_op and first.has_offload_op
    assert assigned(True) == (first, "1.off") and asked == ["y"]
    assert assigned(False) == (last, "1.wgt0") and asked == ["y"]
