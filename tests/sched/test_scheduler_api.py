"""User assignments, buffer reuse, limits and errors of the scheduler."""

from __future__ import annotations

import numpy as np
import pytest
from sched_graphs import (
    SmallGraph,
    build_block,
    compute_on_one_backend,
    input_values,
    make_weights,
    run_block,
    small_run,
    split_table,
)

from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import (
    ArgumentError,
    BufferFreedError,
    GraphError,
    LimitExceededError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from pyggml.ggml_backend import tensor_get_numpy, tensor_set
from pyggml.seed import GGML_MAX_BACKENDS, GGML_MAX_SPLIT_INPUTS, GGML_MAX_SPLITS, Scheduler


def no_copies_in(graph) -> bool:
    return all(s is None or "#" not in s.name for n in graph.nodes for s in n.src)


# --- user assignments ---


def test_user_assignment_holds_and_ends_with_reset(cpu_a, cpu_b, small_weight, rng) -> None:
    w, W = small_weight
    sched = Scheduler([cpu_a, cpu_b])

    def graph_with_m_on_a() -> SmallGraph:
        # m would be B by pass 1 (x2's memory); the user puts it on A and pass 1 leaves it there
        g = SmallGraph(w)
        sched.set_node_backend(g.m, cpu_a)
        assert sched.get_node_backend(g.m) is cpu_a
        talloc = sched.get_tallocr(cpu_b)
        talloc.alloc(g.x)
        talloc.alloc(g.x2)
        return g

    # assigned while building the measure graph, before init_measure (the seed's usage, broken in its C)
    g = graph_with_m_on_a()
    sched.init_measure(g.graph)
    assert sched.get_node_backend(g.m) is cpu_a and sched.tensor_cause(g.m) == "usr"
    assert sched.user_assignments == {}  # init_measure ends with reset

    g = graph_with_m_on_a()
    X = rng.standard_normal((2, 4)).astype(np.float32)
    X2 = rng.standard_normal((1, 6)).astype(np.float32)
    tensor_set(g.x, X)
    tensor_set(g.x2, X2)
    sched.graph_compute(g.graph)
    assert sched.tensor_cause(g.m) == "usr" and sched.get_node_backend(g.m) is cpu_a
    assert sched.tensor_cause(g.out) == "2.src0"  # now from m, on A
    assert split_table(sched) == [(cpu_a, 0, 6, ["x", "x2"])]
    assert cpu_b.n_graph_compute == 0
    Y = X @ W.T
    expected = (np.maximum(Y, 0).reshape(1, 6) * X2 + Y.reshape(1, 6)).ravel()
    np.testing.assert_allclose(tensor_get_numpy(g.out), expected, rtol=1e-6, atol=1e-6)

    # the assignment ended with that compute (assign the nodes of every new graph)
    assert sched.user_assignments == {}
    assert sched.get_node_backend(SmallGraph(w).m) is None


def test_user_assignment_to_a_backend_that_cannot_compute_the_op(cpu_a, blas, small_weight, rng) -> None:
    w, _ = small_weight
    sched = Scheduler([cpu_a, blas])
    small_run(sched, w, cpu_a, None)
    g = SmallGraph(w)
    sched.set_node_backend(g.r, blas)  # RELU on a MUL_MAT-only backend
    talloc = sched.get_tallocr(cpu_a)
    talloc.alloc(g.x)
    talloc.alloc(g.x2)
    with pytest.raises(UnsupportedOpError, match=r"'r' is on backend 'TestBLAS' \(set by set_node_backend\)"):
        sched.graph_compute(g.graph)
    assert cpu_a.n_graph_compute == 0 and blas.n_graph_compute == 0  # nothing ran
    assert no_copies_in(g.graph)  # the graph's sources are as they were
    # the scheduler is still usable
    g, X, X2 = small_run(sched, w, cpu_a, rng)
    assert sched.n_splits == 1 and sched.get_node_backend(g.r) is cpu_a


# --- buffers are made once ---


def test_repeated_computes_reuse_the_measured_buffers(cpu_a, blas) -> None:
    weights = make_weights(lambda name: cpu_a if "norm" in name else blas)
    sched = Scheduler([blas, cpu_a])
    run_block(sched, weights, 4, cpu_a, None)
    buffers = [sched.get_buffer(blas), sched.get_buffer(cpu_a)]
    bases = [b.get_base() for b in buffers]
    tallocs = list(sched.tallocs)
    assert all(not t.is_measure() for t in tallocs)
    assert buffers[0].get_size() > 0 and buffers[1].get_size() > 0
    n_alloc = (blas.n_alloc_buffer, cpu_a.n_alloc_buffer)

    outs = []
    for seed in (1, 2, 3):
        values = input_values(4, seed)
        block = run_block(sched, weights, 4, cpu_a, values)
        got = tensor_get_numpy(block.out)
        np.testing.assert_allclose(got, compute_on_one_backend(cpu_init(1), 4, values), rtol=1e-5, atol=1e-5)
        outs.append((block.out.buffer, block.out.data))
    assert (blas.n_alloc_buffer, cpu_a.n_alloc_buffer) == n_alloc  # no new buffer
    assert [sched.get_buffer(blas), sched.get_buffer(cpu_a)] == buffers
    assert all(a is b for a, b in zip(sched.tallocs, tallocs, strict=True))
    assert [b.get_base() for b in buffers] == bases
    assert len(set(outs)) == 1 and outs[0][0] is buffers[1]  # the same place every time
    sched.free()
    assert all(b.freed for b in buffers)
    weights.free()


def test_measure_once(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 2, cpu_b, None)
    buffer = sched.get_buffer(cpu_b)
    with pytest.raises(GraphError, match="has measured already"):
        sched.init_measure(build_block(weights.tensors, 6).graph)
    assert sched.get_buffer(cpu_b) is buffer and not buffer.freed


# --- errors ---


def test_graph_larger_than_the_measure_graph(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 2, cpu_b, None)
    with pytest.raises(OutOfMemoryError, match="more memory than init_measure measured"):
        run_block(sched, weights, 4, cpu_b, input_values(4))  # the inputs fit, the intermediates do not
    big = build_block(weights.tensors, 2, graph_size=8192)
    with pytest.raises(GraphError, match=r"larger than the measure graph \(hash table 4099\)"):
        sched.graph_compute(big.graph)
    # still usable for the measured size
    values = input_values(2)
    block = run_block(sched, weights, 2, cpu_b, values)
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 2, values),
                               rtol=1e-5, atol=1e-6)


def test_limits_are_the_seeds_and_configurable(cpu_a, cpu_b) -> None:
    assert (GGML_MAX_BACKENDS, GGML_MAX_SPLITS, GGML_MAX_SPLIT_INPUTS) == (4, 256, 16)
    five = [cpu_init(1) for _ in range(5)]
    with pytest.raises(LimitExceededError, match=r"5 backends .* exceed GGML_MAX_BACKENDS = 4"):
        Scheduler(five)
    assert Scheduler(five, max_backends=5).n_backends == 5

    weights = make_weights(lambda name: cpu_a)
    sched = Scheduler([cpu_a, cpu_b], max_splits=7)  # the block needs 8
    block = build_block(weights.tensors, 3)
    for t in block.inputs:
        sched.get_tallocr(cpu_b).alloc(t)
    with pytest.raises(LimitExceededError, match=r"more than GGML_MAX_SPLITS = 7 splits \(node 22 'ffn_norm-0'"):
        sched.init_measure(block.graph)
    assert no_copies_in(block.graph)
    with pytest.raises(GraphError, match="call init_measure"):
        sched.graph_compute(block.graph)

    sched = Scheduler([cpu_a, cpu_b], max_split_inputs=1)  # the last split reads norm_ffn and ffn_inp from B
    block = build_block(weights.tensors, 3)
    for t in block.inputs:
        sched.get_tallocr(cpu_b).alloc(t)
    with pytest.raises(LimitExceededError, match=r"split 7 on 'CPU' needs more than GGML_MAX_SPLIT_INPUTS = 1 "
                                                 r"inputs .*'ffn_inp', source 1 of node 28 'l_out'"):
        sched.init_measure(block.graph)
    assert no_copies_in(block.graph)

    sched = Scheduler([cpu_a, cpu_b], max_splits=8, max_split_inputs=2)  # exactly enough
    run_block(sched, weights, 3, cpu_b, None)
    values = input_values(3)
    block = run_block(sched, weights, 3, cpu_b, values)
    assert sched.n_splits == 8
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 3, values),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentError, match="max_splits must be >= 1"):
        Scheduler([cpu_a], max_splits=0)


def test_misuse_raises_clear_errors(cpu_a, cpu_b, small_weight, rng) -> None:
    w, _ = small_weight
    with pytest.raises(ArgumentError, match="at least one backend"):
        Scheduler([])
    with pytest.raises(ArgumentError, match="given twice"):
        Scheduler([cpu_a, cpu_a])
    other = cpu_init(1)
    sched = Scheduler([cpu_b])
    with pytest.raises(ArgumentError, match=r"backend 'CPU' is not one of the scheduler's backends \('CPU'\)"):
        sched.get_tallocr(other)
    with pytest.raises(ArgumentError, match="not one of the scheduler's backends"):
        sched.set_node_backend(SmallGraph(w).out, other)
    # w lives in cpu_a's buffer, and cpu_a is not in this scheduler
    with pytest.raises(ArgumentError, match=r"leaf 'w' \(its memory\): backend 'CPU' is not one of"):
        small_run(sched, w, cpu_b, None)

    sched = Scheduler([cpu_a, cpu_b])
    g = SmallGraph(w)
    with pytest.raises(GraphError, match="call init_measure"):
        sched.graph_compute(g.graph)
    g, _, _ = small_run(sched, w, cpu_b, None)
    with pytest.raises(GraphError, match="node 0 'y' already has memory in the scheduler's buffer"):
        sched.graph_compute(g.graph)  # the measure graph again
    g, _, _ = small_run(sched, w, cpu_b, rng)
    with pytest.raises(GraphError, match="was measured or computed before"):
        sched.graph_compute(g.graph)  # a computed graph again
    sched.free()
    sched.free()
    with pytest.raises(BufferFreedError):
        sched.graph_compute(SmallGraph(w).graph)


def test_no_backend_supports_the_op(blas) -> None:
    from pyggml.core.context import Context
    from pyggml.core.types import GGMLType

    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(GGMLType.F32, 4).set_name("a")
    b = ctx.add(a, a).set_name("b")
    g = ctx.new_graph()
    g.build_forward_expand(b)
    sched = Scheduler([blas])
    with pytest.raises(UnsupportedOpError, match=r"none of the scheduler's backends \('TestBLAS'\) supports op ADD "
                                                 r"of node 'b'"):
        sched.init_measure(g)


def test_inputs_left_to_the_scheduler_are_allocated_on_their_consumers_backend(cpu_a, cpu_b, small_weight) -> None:
    """Pass 3: a leaf without memory takes its consumer's backend (and the graph allocator gives it memory)."""
    w, _ = small_weight
    sched = Scheduler([cpu_a, cpu_b])
    g = SmallGraph(w)
    sched.init_measure(g.graph)
    g = SmallGraph(w)
    sched.graph_compute(g.graph)
    assert sched.get_node_backend(g.x) is cpu_a and sched.get_node_backend(g.x2) is cpu_a
    assert g.x.buffer is sched.get_buffer(cpu_a) and sched.n_splits == 1
