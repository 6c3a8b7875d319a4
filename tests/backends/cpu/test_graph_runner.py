"""The graph runner (kernels.graph_runner): runs of nodes with job forms computed by the kernel threads in one native
call, a barrier between steps, give the bits of the node-by-node computes; a failing node leaves the pool usable;
moved tensors are followed; a decode step of a model is the same with the runner on and off."""

from __future__ import annotations

import functools
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu import plan as plan_module
from pyggml.backends.cpu.kernels import ENV_GRAPH_RUNNER, ComputeParams, graph_runner, graph_runner_default, matmul
from pyggml.backends.cpu.plan import CPUPlan, group_runs
from pyggml.core import quants
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, OutOfBoundsError
from pyggml.core.tensor import GGMLOp, SortOrder, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set
from pyggml.models.convert import simple_vocab
from pyggml.testing import alloc_ctx_tensors
from pyggml.testing.random_moe import MoeShape, write_random_qwen3moe

F32 = GGMLType.F32
K, N, CACHE_ROWS = 256, 3, 8


@njit(nogil=True, cache=True)
def _stamp_step(p, ith, nth):
    """Step d[1] of a barrier test: thread ith writes 1 + the sum of the previous step's row into its cell."""
    d = numba.carray(p, (2,))
    k = d[1]
    out = numba.carray(graph_runner.pointer_i64(d[0]), (8, 4))
    total = 0
    if k > 0:
        for j in range(nth):
            total += out[k - 1, j]
    out[k, ith] = 1 + total
    return 0


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_barrier_between_steps(n_threads: int) -> None:
    """Each step reads every thread's cell of the step before: wrong sums unless a barrier separates them."""
    out = np.zeros((8, 4), np.int64)
    job = graph_runner.split_job(_stamp_step)
    steps = [graph_runner.Step(graph_runner.SPLIT, job, np.array([graph_runner.address(out), k], np.int64),
                               keep=(out,)) for k in range(8)]
    run = graph_runner.GraphRun(steps, matmul.POOL, n_threads, graph_runner.BARRIER)
    for _ in range(3):  # the run's state is ready for the next run
        out[:] = 0
        run()
        want = 1
        for k in range(8):
            assert list(out[k, :n_threads]) == [want] * n_threads, (k, out)
            want = 1 + n_threads * want


def _chain(ctx: Context, w: Tensor, x: Tensor, g: Tensor, rows: Tensor, cache: Tensor) -> Tensor:
    """Products and the small ops of a decode layer, each on the last's result."""
    y = ctx.mul_mat(w, x)  # (K, N)
    h = ctx.mul(ctx.rms_norm(y, 1e-6), g)
    z = ctx.add(ctx.mul_mat(w, h), y)
    s = ctx.soft_max_ext(ctx.cont(ctx.transpose(ctx.cont(ctx.transpose(z)))), None, 0.125)
    return ctx.set_rows(cache, ctx.swiglu(s), rows)


def _weights(type: GGMLType, rng: np.random.Generator) -> np.ndarray:
    values = rng.standard_normal((K, K)).astype(np.float32)
    if type == F32:
        return values
    if type == GGMLType.F16:
        return values.astype(np.float16)
    return quants.from_float_cpu(type, values, True)


def _compute(type: GGMLType, n_threads: int, runner: str, monkeypatch: pytest.MonkeyPatch,
             rows: np.ndarray | None = None) -> tuple[np.ndarray, CPUPlan]:
    monkeypatch.setenv(ENV_GRAPH_RUNNER, runner)
    rng = np.random.default_rng(3)
    backend = cpu_init(n_threads)
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    w = ctx.new_tensor_2d(type, K, K)
    x = ctx.new_tensor_2d(F32, K, N)
    g = ctx.new_tensor_1d(F32, K)
    idx = ctx.new_tensor_1d(GGMLType.I64, N)
    cache = ctx.new_tensor_2d(F32, K // 2, CACHE_ROWS)
    out = _chain(ctx, w, x, g, idx, cache)
    graph = ctx.new_graph()
    graph.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    tensor_set(w, _weights(type, rng))
    tensor_set(x, rng.standard_normal((N, K)).astype(np.float32))
    tensor_set(g, rng.standard_normal(K).astype(np.float32))
    tensor_set(idx, np.array([5, 0, 2], np.int64) if rows is None else rows)
    tensor_set(cache, np.zeros((CACHE_ROWS, K // 2), np.float32))
    plan = backend.graph_plan_create(graph)
    backend.graph_plan_compute(plan)
    return tensor_get_numpy(cache).copy(), plan


@pytest.mark.parametrize("type", [F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_K])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("mode", ["lead", "barrier"])
def test_runner_gives_the_node_by_node_bits(type: GGMLType, n_threads: int, mode: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    want, plain = _compute(type, n_threads, "off", monkeypatch)
    got, plan = _compute(type, n_threads, mode, monkeypatch)
    assert not any(isinstance(r, graph_runner.GraphRun) for r in plain.runs)
    assert any(isinstance(r, graph_runner.GraphRun) for r in plan.runs)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.any(want != 0)


def test_long_runs_cover_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node of the chain has a job form: one native run."""
    _, plan = _compute(GGMLType.Q8_0, 2, "lead", monkeypatch)
    assert len(plan.runs) == 1 and isinstance(plan.runs[0], graph_runner.GraphRun)
    assert len(plan.run_nodes[0]) == len(plan.nodes)


@pytest.mark.parametrize("mode", ["lead", "barrier"])
def test_lead_runs_take_small_nodes_and_every_product(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under LEAD a node of more than LEAD_MAX_ELEMENTS elements (a prompt's) runs from Python between runs, a product
    of any size joins them; BARRIER takes every node; the bits are the same."""
    want, _ = _compute(GGMLType.Q8_0, 2, "off", monkeypatch)
    monkeypatch.setattr(plan_module, "LEAD_MAX_ELEMENTS", K * N - 1)  # the chain's (K, N) results are too big
    got, plan = _compute(GGMLType.Q8_0, 2, mode, monkeypatch)
    in_runs = {id(n) for nodes, r in zip(plan.run_nodes, plan.runs, strict=True)
               if isinstance(r, graph_runner.GraphRun) for n in nodes}
    for node in plan.nodes:
        written = node.src[0] if node.op == GGMLOp.SET_ROWS else node
        small = node.op in plan_module._PRODUCTS or written.nelements() < K * N
        assert (id(node) in in_runs) == (mode == "barrier" or small), (node.op, node.ne)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_a_set_rows_into_a_big_cache_joins_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """SET_ROWS' work is the rows it writes: a KV cache larger than LEAD_MAX_ELEMENTS does not break a decode step's
    run in two around each cache write."""
    want, _ = _compute(GGMLType.Q8_0, 2, "off", monkeypatch)
    monkeypatch.setattr(plan_module, "LEAD_MAX_ELEMENTS", CACHE_ROWS * K // 2 - 1)  # the cache, not its rows
    got, plan = _compute(GGMLType.Q8_0, 2, "lead", monkeypatch)
    assert [len(nodes) for nodes in plan.run_nodes] == [len(plan.nodes)]
    assert plan.nodes[-1].op == GGMLOp.SET_ROWS
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("mode", ["lead", "barrier"])
def test_a_failing_node_leaves_the_pool_usable(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SET_ROWS' bad index inside a run raises after the run; the next runs compute the right bits."""
    with pytest.raises(OutOfBoundsError, match="row index 9"):
        _compute(GGMLType.Q8_0, 2, mode, monkeypatch, rows=np.array([1, 9, 2], np.int64))
    want, _ = _compute(GGMLType.Q8_0, 2, "off", monkeypatch)
    got, _ = _compute(GGMLType.Q8_0, 2, mode, monkeypatch)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_moved_tensors_are_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Intermediates given new memory after planning: the runs are made again on the new addresses."""
    monkeypatch.setenv(ENV_GRAPH_RUNNER, "1")
    backend = cpu_init(2)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 64, 4)
    b = ctx.add(ctx.mul(a, a), a)
    graph = ctx.new_graph()
    graph.build_forward_expand(b)
    first = alloc_ctx_tensors(ctx, backend)
    values = np.arange(256, dtype=np.float32).reshape(4, 64)
    tensor_set(a, values)
    plan = backend.graph_plan_create(graph)
    backend.graph_plan_compute(plan)
    assert isinstance(plan.runs[0], graph_runner.GraphRun)
    old = plan.runs[0]
    for t in ctx.tensors:
        t.data = None
        t.buffer = None
    alloc_ctx_tensors(ctx, backend)
    tensor_set(a, -values)
    backend.graph_plan_compute(plan)
    assert plan.runs[0] is not old
    np.testing.assert_array_equal(tensor_get_numpy(b).reshape(4, 64), values * values - values)
    first.free()


def test_switch_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, setting in (("0", "off"), ("1", "lead"), ("barrier", "barrier"), ("", "lead")):
        monkeypatch.setenv(ENV_GRAPH_RUNNER, raw)
        assert ComputeParams().graph_runner == setting
    monkeypatch.setenv(ENV_GRAPH_RUNNER, "yes")
    with pytest.raises(ArgumentError, match=ENV_GRAPH_RUNNER):
        graph_runner_default()


@functools.cache
def _moe_file(tmp: Path, type: GGMLType) -> Path:
    shape = MoeShape(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2,
                     n_ff_exp=256, n_vocab=300, n_ctx_train=64)
    return write_random_qwen3moe(tmp / f"moe-{type.name}.gguf", shape, type=type, vocab=simple_vocab(300))


@pytest.mark.slow
@pytest.mark.parametrize("type", [F32, GGMLType.F16])
def test_model_decode_same_bits_either_way(type: GGMLType, tmp_path_factory: pytest.TempPathFactory,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixture of experts' prompt and decode steps, 2 threads: the runner changes no bit of the logits."""
    path = _moe_file(tmp_path_factory.getbasetemp(), type)
    logits = {}
    for runner in ("off", "lead", "barrier"):
        monkeypatch.setenv(ENV_GRAPH_RUNNER, runner)
        model = pm.load(path, backends=["cpu"], n_ctx=32, n_threads=2, progress=False)
        try:
            steps = [np.array(model.eval_last([5, 9, 17]), copy=True)]
            for token in (3, 11, 7):
                steps.append(np.array(model.eval_last([token]), copy=True))
        finally:
            model.free()
        logits[runner] = np.stack(steps)
    assert np.array_equal(logits["off"].view(np.uint32), logits["lead"].view(np.uint32))
    assert np.array_equal(logits["off"].view(np.uint32), logits["barrier"].view(np.uint32))


def test_one_plan_regrouped_between_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan computed in each setting in turn (its runs made again each time): the same bits every time, whatever
    state the last setting left the products' item counters in."""
    want, _ = _compute(GGMLType.Q4_0, 2, "off", monkeypatch)
    _, plan = _compute(GGMLType.Q4_0, 2, "lead", monkeypatch)
    backend = cpu_init(2)
    out = plan.nodes[-1]
    for setting in ("barrier", "lead", "barrier", "off", "barrier"):
        plan.params.graph_runner = setting
        plan.runs, plan.run_nodes = group_runs(plan.computes, plan.nodes, plan.params)
        tensor_set(out, np.zeros((CACHE_ROWS, K // 2), np.float32))
        backend.graph_plan_compute(plan)
        assert np.array_equal(tensor_get_numpy(out).view(np.uint32), want.view(np.uint32)), setting


def _routing(setting: str, n_expert: int, logits: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> tuple[
        np.ndarray, np.ndarray, CPUPlan]:
    """A mixture of experts' routing (build_moe_ffn's): argsort of the probabilities, the chosen ones' weights by
    GET_ROWS, normalized by their SUM_ROWS, CLAMPed; per token, 4 experts of n_expert."""
    monkeypatch.setenv(ENV_GRAPH_RUNNER, setting)
    backend = cpu_init(2)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    n_tok = logits.shape[0]
    x = ctx.new_tensor_2d(F32, n_expert, n_tok)
    probs = ctx.soft_max(x)
    order = ctx.argsort(probs, SortOrder.DESC)
    chosen = ctx.view_2d(order, 4, n_tok, order.nb[1], 0)
    weights = ctx.get_rows(ctx.reshape_3d(probs, 1, n_expert, n_tok), chosen)  # (1, 4, n_tok)
    total = ctx.clamp(ctx.sum_rows(ctx.reshape_2d(weights, 4, n_tok)), 6.103515625e-5, np.inf)
    out = ctx.div(ctx.reshape_2d(weights, 4, n_tok), total)
    graph = ctx.new_graph()
    graph.build_forward_expand(out)
    graph.build_forward_expand(order)
    alloc_ctx_tensors(ctx, backend)
    tensor_set(x, logits)
    plan = backend.graph_plan_create(graph)
    backend.graph_plan_compute(plan)
    return tensor_get_numpy(out).copy(), tensor_get_numpy(order).copy(), plan


@pytest.mark.parametrize("n_expert", [4, 8, 37, 200])
@pytest.mark.parametrize("row", [0, 1, 2, 3])
def test_routing_ops_give_the_node_by_node_bits(n_expert: int, row: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """ARGSORT (ties and a NaN too), GET_ROWS, SUM_ROWS (numpy's pairwise order), CLAMP and DIV of one token: one
    run; of four tokens: GET_ROWS of several tokens in Python between two runs."""
    rng = np.random.default_rng(n_expert)
    logits = (rng.standard_normal((4, n_expert)) * 4).astype(np.float32)
    logits[1] = np.round(logits[1])  # ties: the stable order
    logits[2, 1] = np.nan
    logits[3, ::2] = -0.0
    for tokens in (logits[row:row + 1], logits):
        want_w, want_ids, _ = _routing("off", n_expert, tokens, monkeypatch)
        got_w, got_ids, plan = _routing("lead", n_expert, tokens, monkeypatch)
        assert np.array_equal(want_ids, got_ids)
        assert np.array_equal(want_w.view(np.uint32), got_w.view(np.uint32), equal_nan=False)
    assert len(plan.runs) == 3
    _, _, plan = _routing("lead", n_expert, logits[row:row + 1], monkeypatch)
    assert len(plan.runs) == 1 and isinstance(plan.runs[0], graph_runner.GraphRun)


def test_get_rows_bad_index_raises_after_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_GRAPH_RUNNER, "lead")
    backend = cpu_init(2)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 8, 4)
    ids = ctx.new_tensor_1d(GGMLType.I32, 2)
    out = ctx.add(ctx.get_rows(ctx.mul(a, a), ids), ctx.get_rows(a, ids))
    graph = ctx.new_graph()
    graph.build_forward_expand(out)
    alloc_ctx_tensors(ctx, backend)
    tensor_set(a, np.arange(32, dtype=np.float32).reshape(4, 8))
    tensor_set(ids, np.array([3, 4], np.int32))
    plan = backend.graph_plan_create(graph)
    assert isinstance(plan.runs[0], graph_runner.GraphRun)
    with pytest.raises(OutOfBoundsError, match="row index 4"):
        backend.graph_plan_compute(plan)
    tensor_set(ids, np.array([3, 0], np.int32))
    backend.graph_plan_compute(plan)
    rows = np.arange(32, dtype=np.float32).reshape(4, 8)[[3, 0]]
    np.testing.assert_array_equal(tensor_get_numpy(out).reshape(2, 8), rows * rows + rows)


@pytest.mark.parametrize("n", [3, 8, 37, 128, 129])
def test_sum_rows_in_numpys_order(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """SUM_ROWS' step sums as numpy's add.reduce (pairwise in 8 lanes from 8 values); rows over 128 stay numpy's."""
    rng = np.random.default_rng(n)
    values = (rng.standard_normal((6, n)) * rng.uniform(1, 1e4, (6, 1))).astype(np.float32)
    values[0] = -0.0
    got = {}
    for setting in ("off", "lead"):
        monkeypatch.setenv(ENV_GRAPH_RUNNER, setting)
        backend = cpu_init(2)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        x = ctx.new_tensor_2d(F32, n, 6)
        out = ctx.sum_rows(ctx.add(x, x))
        graph = ctx.new_graph()
        graph.build_forward_expand(out)
        alloc_ctx_tensors(ctx, backend)
        tensor_set(x, values)
        plan = backend.graph_plan_create(graph)
        backend.graph_plan_compute(plan)
        got[setting] = tensor_get_numpy(out).copy()
        if setting == "lead":
            assert (len(plan.runs) == 1) == (n <= 128)
    assert np.array_equal(got["off"].view(np.uint32), got["lead"].view(np.uint32))


def test_ropes_of_the_same_positions_share_one_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's ROPE steps read angles filled before it, once per positions tensor and parameters: four ropes (two
    alike, one of another base, one of other positions) fill three times, and give the node-by-node bits."""
    out: dict[str, np.ndarray] = {}
    for runner in ("off", "lead"):
        monkeypatch.setenv(ENV_GRAPH_RUNNER, runner)
        rng = np.random.default_rng(5)
        backend = cpu_init(2)
        ctx = Context(mem_size=1 << 22, no_alloc=True)
        x = ctx.new_tensor_3d(F32, 64, 4, 3)
        pos_a, pos_b = ctx.new_tensor_1d(GGMLType.I32, 3), ctx.new_tensor_1d(GGMLType.I32, 3)
        ropes = [ctx.rope_ext(x, pos, None, 64, 2, 4096, base, 1.0, 0.0, 1.0, 0.0, 0.0)
                 for pos, base in ((pos_a, 10000.0), (pos_a, 10000.0), (pos_a, 500000.0), (pos_b, 10000.0))]
        total = ropes[0]
        for r in ropes[1:]:
            total = ctx.add(total, r)
        graph = ctx.new_graph()
        graph.build_forward_expand(total)
        alloc_ctx_tensors(ctx, backend)
        tensor_set(x, rng.standard_normal((3, 4, 64)).astype(np.float32))
        tensor_set(pos_a, np.array([3, 17, 250], np.int32))
        tensor_set(pos_b, np.array([0, 1, 2], np.int32))
        plan = backend.graph_plan_create(graph)
        backend.graph_plan_compute(plan)
        out[runner] = tensor_get_numpy(total).copy()
        if runner == "lead":
            (run,) = plan.runs
            assert isinstance(run, graph_runner.GraphRun) and len(run.befores) == 3
    assert np.array_equal(out["off"].view(np.uint32), out["lead"].view(np.uint32))
    assert np.any(out["off"] != 0)
