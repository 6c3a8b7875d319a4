"""The RPC server computes what its backend lacks on the host CPU: a served backend missing ops on purpose
(tests/backends/rpc/lacking.py) gives a pyggml client the same tokens and results, and the log names each op
that fell back once; `fallback=False` (`--no-fallback`) refuses such a graph; the host's temporaries count
against the server's limits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from lacking import LackingCPU, lacking_torch

from pyggml import Context
from pyggml.backends.rpc.client import rpc_init
from pyggml.backends.rpc.connection import close_all
from pyggml.backends.rpc.server import RpcServer
from pyggml.backends.rpc.wire import RpcConnectionError
from pyggml.core.types import GGMLType
from pyggml.core.work import WorkBudget
from pyggml.ggml_backend import Backend, tensor_get_numpy, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32
LOG = "pyggml.backends.rpc.server"
BUILTIN_PROMPT = "The module"  # tests/conftest.py's, which builtin_greedy_tokens continues
FELL_BACK = "does not compute op"


@contextmanager
def serving(backend: Backend, **kw: object) -> Iterator[RpcServer]:
    with RpcServer([backend], "127.0.0.1", 0, **kw).start() as server:  # type: ignore[arg-type]
        try:
            yield server
        finally:
            close_all()


def fallback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and FELL_BACK in r.getMessage()]


def greedy(endpoint: str) -> list[int]:
    import pyggml.models as pm
    from pyggml.models.builtin import builtin_model_path

    model = pm.load(builtin_model_path(), backends=[rpc_init(endpoint)], n_ctx=64, progress=False)
    try:
        return list(model.generate(model.tokenize(BUILTIN_PROMPT), 8, stop_at_eos=False))
    finally:
        model.free()


# host memory (the CPU computes next to it) and memory of its own (torch: the scheduler copies to the host and
# the results are copied back); SET_ROWS and MUL_MAT together: the attention's MUL_MAT reads the KV cache that
# the SET_ROWS before it fills, through another view, so the host run must end between them
SERVED: dict[str, tuple[Callable[[], Backend], set[str]]] = {
    "cpu": (lambda: LackingCPU(["RMS_NORM", "SOFT_MAX", "SWIGLU"]), {"RMS_NORM", "SOFT_MAX", "SWIGLU"}),
    "torch": (lambda: lacking_torch(["RMS_NORM", "SET_ROWS", "MUL_MAT"]), {"RMS_NORM", "SET_ROWS", "MUL_MAT"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SERVED))
def test_a_backend_lacking_ops_serves_the_builtin_model(kind: str, builtin_greedy_tokens: list[int],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    make, lacking = SERVED[kind]
    caplog.set_level(logging.WARNING, LOG)
    with serving(make()) as server:
        assert greedy(server.endpoint) == builtin_greedy_tokens
        assert greedy(server.endpoint) == builtin_greedy_tokens  # a second client: nothing logged again
        assert server.counts["GRAPH_RECOMPUTE"] > 0  # decode steps recompute the stored steps
    assert lacking <= server.fell_back
    lines = fallback_lines(caplog)
    assert len(lines) == len(server.fell_back)  # once per op
    for op in lacking:
        assert sum(f"op {op} " in line for line in lines) == 1, lines


def _rms_norm_graph(endpoint: str, n: int) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
    """x -> rms_norm(x) * 2 on the server: (x, a function computing it there and returning the result)."""
    backend = rpc_init(endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, n).set_name("x")
    out = ctx.scale(ctx.rms_norm(x, 1e-6), 2.0).set_name("out")
    buf = alloc_ctx_tensors(ctx, backend)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    v = np.linspace(-3, 5, n, dtype=np.float32)
    tensor_set_numpy(x, v)

    def run() -> np.ndarray:
        backend.graph_compute(g)
        return tensor_get_numpy(out)

    run.buffer = buf  # type: ignore[attr-defined]
    return v, run


def test_the_host_computes_the_lacking_node_between_served_ones(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOG)
    with serving(lacking_torch(["RMS_NORM"])) as server:
        v, run = _rms_norm_graph(server.endpoint, 1024)
        want = 2 * v / np.sqrt(np.mean(v.astype(np.float64) ** 2) + 1e-6)
        np.testing.assert_allclose(run(), want, rtol=1e-5)
        np.testing.assert_allclose(run(), want, rtol=1e-5)  # GRAPH_RECOMPUTE
    assert [line for line in fallback_lines(caplog) if "op RMS_NORM " in line]


def test_a_host_run_ends_before_a_node_reading_what_it_wrote_through_another_view() -> None:
    """SET_ROWS fills rows of a cache; a MUL_MAT reads the cache through a view of its own (as llama.cpp's
    attention reads the KV cache): both lacking, they are two host runs, and the MUL_MAT sees the new rows."""
    from pyggml.backends.cpu import cpu_init
    from pyggml.backends.rpc.fallback import plan_fallback
    from pyggml.core.ops.layout import view_2d
    from pyggml.core.ops.matmul import mul_mat
    from pyggml.core.ops.rows import set_rows

    served = LackingCPU(["SET_ROWS", "MUL_MAT"])
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    cache = ctx.new_tensor_2d(F32, 8, 6).set_name("cache")
    rows = ctx.new_tensor_2d(F32, 8, 2).set_name("rows")
    idx = ctx.new_tensor_1d(GGMLType.I32, 2).set_name("idx")
    q = ctx.new_tensor_2d(F32, 8, 3).set_name("q")
    stored = set_rows(ctx, cache, rows, idx)
    kq = mul_mat(ctx, view_2d(ctx, cache, 8, 6, cache.nb[1], 0), q).set_name("kq")
    g = ctx.new_graph()
    g.build_forward_expand(stored)
    g.build_forward_expand(kq)
    buf = alloc_ctx_tensors(ctx, served)
    rng = np.random.default_rng(1)
    c, r, qv = (rng.standard_normal(s, dtype=np.float32) for s in ((6, 8), (2, 8), (3, 8)))
    for t, val in ((cache, c), (rows, r), (q, qv), (idx, np.array([4, 1], np.int32))):
        tensor_set_numpy(t, val)
    nodes = [n for n in g.nodes if n.op.name in ("SET_ROWS", "MUL_MAT")]
    plan = plan_fallback(nodes, served, lambda: cpu_init(1), WorkBudget(), None)
    try:
        assert [type(s).__name__ for s in plan.steps] == ["HostRun", "HostRun"]
        assert {n.op.name for n in plan.lacking} == {"SET_ROWS", "MUL_MAT"}
        plan.compute()
        c[[4, 1]] = r
        np.testing.assert_array_equal(tensor_get_numpy(cache), c)
        np.testing.assert_allclose(tensor_get_numpy(kq), qv @ c.T, rtol=1e-5, atol=1e-6)
    finally:
        plan.free()
        buf.free()


@pytest.mark.parametrize("kind", ["cpu", "torch"])
def test_two_caches_filled_in_one_host_run(kind: str) -> None:
    """K and V SET_ROWS (F16 caches, I64 indices, as llama.cpp's) in one host run: each stand-in starts from its
    own cache's bytes and ends in it."""
    from pyggml.backends.cpu import cpu_init
    from pyggml.backends.rpc.fallback import plan_fallback
    from pyggml.core.ops.rows import set_rows

    served = LackingCPU(["SET_ROWS"]) if kind == "cpu" else lacking_torch(["SET_ROWS"])
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    caches = [ctx.new_tensor_2d(GGMLType.F16, 8, 6) for _ in range(2)]
    rows = [ctx.new_tensor_2d(F32, 8, 2) for _ in range(2)]
    idx = ctx.new_tensor_1d(GGMLType.I64, 2)
    g = ctx.new_graph()
    for c, r in zip(caches, rows, strict=True):
        g.build_forward_expand(set_rows(ctx, c, r, idx))
    buf = alloc_ctx_tensors(ctx, served)
    rng = np.random.default_rng(0)
    cv = [rng.standard_normal((6, 8)).astype(np.float16) for _ in range(2)]
    rv = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(2)]
    for t, v in zip([*caches, *rows], [*cv, *rv], strict=True):
        tensor_set_numpy(t, v)
    tensor_set_numpy(idx, np.array([4, 1], np.int64))
    plan = plan_fallback(list(g.nodes), served, lambda: cpu_init(1), WorkBudget(), None)
    try:
        assert [type(s).__name__ for s in plan.steps] == ["HostRun"]
        plan.compute()
        for c, want, r in zip(caches, cv, rv, strict=True):
            want[[4, 1]] = r.astype(np.float16)
            np.testing.assert_array_equal(tensor_get_numpy(c), want)
    finally:
        plan.free()
        buf.free()


def test_no_fallback_refuses_a_graph_with_a_lacking_node(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOG)
    with serving(LackingCPU(["RMS_NORM"]), fallback=False) as server:
        _, run = _rms_norm_graph(server.endpoint, 64)
        with pytest.raises(RpcConnectionError):
            run()
        assert not server.fell_back
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == LOG)
    assert "does not support op RMS_NORM" in text and not fallback_lines(caplog)


@pytest.mark.parametrize("limit", ["budget", "mem"])
def test_the_host_temporaries_count_against_the_limits(limit: str, caplog: pytest.LogCaptureFixture) -> None:
    """A host run of 2 x 16 KiB (the stand-in and the copy of its source) past 8 KiB of temporaries, or past the
    8 KiB that --mem leaves beside the client's buffers, is refused before anything is allocated for it."""
    caplog.set_level(logging.WARNING, LOG)
    n = 4096
    kw: dict[str, object] = ({"budget": WorkBudget(temp_bytes=8192)} if limit == "budget"
                             else {"mem_limit": 3 * n * 4 + 8192})  # x, its norm and out fit
    with serving(lacking_torch(["RMS_NORM"]), **kw) as server:
        _, run = _rms_norm_graph(server.endpoint, n)
        with pytest.raises(RpcConnectionError):
            run()
        assert server.mem_used == 0  # the client's buffer went with it, and nothing else was held
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == LOG)
    assert "the nodes 'Torch without RMS_NORM' lacks (node_0) need 32768 bytes on the host" in text, text
