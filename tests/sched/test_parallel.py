"""The scheduler's parallel path (n_copies, events) over asynchronous backends (issue 22, point 3).

`pyggml.testing.async_backend` is a test double of a GPU backend: CPU kernels
behind a work queue, events as markers in the queue. Held (`hold()`), it
runs queued work only when something waits for it, so work the scheduler
does not wait for stays queued, deterministically: a missing wait shows as
a wrong result, never as a flaky one.

The graph is a small LLaMA-like forward pass (`pyggml.testing.graphs`) with
its layers' weights on different backends. Each batch is computed the way
llama.cpp pipelines batches: reset, alloc_graph, set the inputs,
graph_compute_async, then read the logits with tensor_get_async (queued
behind the compute on the logits' backend); one synchronize at the end.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, TensorFlag
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import BufferUsage
from pyggml.ggml_backend.tensor_io import tensor_get_async, tensor_set_async
from pyggml.sched import BackendSched
from pyggml.sched.backend_sched import GGML_SCHED_MAX_COPIES
from pyggml.testing import alloc_ctx_tensors
from pyggml.testing.async_backend import AsyncTestBackend, async_test_init
from pyggml.testing.graphs import build_llama_graph, graph_size

N_LAYERS = 2
N_TOKENS = 4
N_CTX = 8
N_VOCAB = 100
N_BATCHES = 2 * GGML_SCHED_MAX_COPIES + 1  # every copy used twice, and once more
TIMEOUT = 30.0


def _weight_values(w: Tensor) -> np.ndarray:
    """The same values for a weight of the same name in every graph (the KV cache starts at zero)."""
    shape = tuple(reversed(w.ne[: w.n_dims()]))
    if w.name.startswith(("k_cache", "v_cache")):
        return np.zeros(shape, dtype=np.float32)
    rng = np.random.default_rng(zlib.crc32(w.name.encode()))
    if w.name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(w.ne[0])).astype(np.float32)


def _batch_inputs(k: int) -> dict[str, np.ndarray]:
    """Batch k's inputs: its own tokens and its own mask (causal, plus a bias of its own on the cells it
    sees), so that a batch computed with another batch's inputs gives other logits."""
    rng = np.random.default_rng(1000 + k)
    pos = np.arange(N_TOKENS, dtype=np.int32)
    mask = (0.5 * rng.standard_normal((N_TOKENS, N_CTX))).astype(np.float32)
    mask[np.arange(N_CTX)[None, :] > pos[:, None]] = -np.inf
    return {"tokens": rng.integers(0, N_VOCAB, N_TOKENS).astype(np.int32), "pos": pos, "kq_mask": mask}


@dataclass
class Setup:
    """Weights placed on `backends`, the scheduler over them, and the graph of the current batch."""

    backends: list[Backend]
    sched: BackendSched
    weights: dict[str, Tensor]
    graph: Graph | None = None
    inputs: dict[str, Tensor] = field(default_factory=dict)
    tallocs: list[TensorAllocator] = field(default_factory=list)
    graphs: list[Graph] = field(default_factory=list)  # every batch's, alive until the setup is freed

    def new_graph(self) -> None:
        """A new graph for the next batch, as llama.cpp builds one per batch, over the placed weights."""
        self.graph, self.inputs, _ = _graph(self.weights)
        self.graphs.append(self.graph)

    def free(self) -> None:
        self.sched.free()
        for t in self.tallocs:
            t.free()
        for b in self.backends:
            b.free()


def _graph(placed: dict[str, Tensor] | None) -> tuple[Graph, dict[str, Tensor], list[Tensor]]:
    """The batch graph; its weights share the memory of the `placed` ones of the same name."""
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    gf, inputs, weights = build_llama_graph(ctx, N_LAYERS, N_TOKENS, n_ctx=N_CTX, n_vocab=N_VOCAB)
    if placed is not None:
        for w in weights:
            p = placed[w.name]
            w.data, w.buffer = p.data, p.buffer
    return gf, inputs, weights


def _setup(backends: list[Backend], where: Callable[[str], int], parallel: bool) -> Setup:
    """Weights on `backends` (each on backends[where(name)]); the scheduler reserved for the graph."""
    gf, _, weights = _graph(None)
    tallocs = []
    for i, b in enumerate(backends):
        mine = [w for w in weights if where(w.name) == i]
        if not mine:
            continue
        size = sum(max(w.nbytes(), 1) + 64 for w in mine)
        talloc = TensorAllocator.new_from_backend(b, size)
        talloc.buffer.set_usage(BufferUsage.WEIGHTS)
        for w in mine:
            talloc.alloc(w)
            tensor_set_numpy(w, _weight_values(w))
        tallocs.append(talloc)
    sched = BackendSched(backends, graph_size=graph_size(N_LAYERS), parallel=parallel)
    sched.reserve(gf)
    s = Setup(backends, sched, {w.name: w for w in weights}, tallocs=tallocs)
    s.new_graph()
    return s


def _layer_of(name: str) -> int | None:
    for il in range(N_LAYERS):
        if name.startswith(f"blk.{il}.") or name in (f"k_cache-{il}", f"v_cache-{il}"):
            return il
    return None


def _place(embd: int, layers: list[int], out: int) -> Callable[[str], int]:
    """Token embedding on backend `embd`, layer il on `layers[il]`, the output head on `out`."""
    def where(name: str) -> int:
        il = _layer_of(name)
        if il is not None:
            return layers[il]
        return embd if name.startswith("token_embd") else out
    return where


def _asyncs(n: int) -> list[AsyncTestBackend]:
    return [async_test_init(f"Async{chr(ord('A') + i)}", timeout=TIMEOUT) for i in range(n)]


# the configurations: (name, number of async backends, CPU last?, placement)
CONFIGS = {
    # CPU holds the inputs, the embedding and the head; one layer on each async backend
    "async-async-cpu": (2, True, _place(2, [0, 1], 2)),
    # no CPU: the inputs live on the last async backend, which reads them in place
    "async-async": (2, False, _place(0, [0, 1], 1)),
    "async-cpu": (1, True, _place(1, [0, 1], 1)),
    # the CPU holds the inputs and the embedding; the head on the second async backend, so that nothing waits
    # for it between batches and its splits reuse copies of A's output that it may not have read yet
    "cpu-async-async": (2, True, _place(2, [0, 1], 1)),
}


def _make(config: str, parallel: bool) -> Setup:
    n_async, with_cpu, where = CONFIGS[config]
    backends: list[Backend] = list(_asyncs(n_async))
    if with_cpu:
        backends.append(cpu_init(1))
    return _setup(backends, where, parallel)


def _batch(s: Setup, k: int, before_compute: Callable[[], None] | None = None) -> np.ndarray:
    """Batch k as llama.cpp pipelines it; its logits are complete after the scheduler's next synchronize."""
    s.sched.reset()
    s.new_graph()
    assert s.graph is not None
    s.sched.alloc_graph(s.graph)
    for name, values in _batch_inputs(k).items():
        tensor_set_numpy(s.inputs[name], values)  # synchronous for the bytes, not for queued compute
    if before_compute is not None:
        before_compute()
    s.sched.graph_compute_async(s.graph)
    logits = s.inputs["logits"]
    out = np.full((N_TOKENS, N_VOCAB), np.nan, dtype=np.float32)
    tensor_get_async(logits, out)  # queued behind the compute on an async backend
    return out


def _run(s: Setup, n_batches: int = N_BATCHES) -> list[np.ndarray]:
    """The batches pipelined with n_copies; one after another (synchronized) without."""
    outs = []
    for k in range(n_batches):
        outs.append(_batch(s, k))
        if s.sched.get_n_copies() == 1:
            s.sched.synchronize()  # one copy: the next inputs may be written only when this batch is done
    s.sched.synchronize()
    return outs


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    """Every batch on one CPU backend, one after another."""
    s = _setup([cpu_init(1)], lambda name: 0, parallel=False)
    try:
        outs = _run(s)
    finally:
        s.free()
    assert all(np.isfinite(o).all() for o in outs)
    assert not any(np.array_equal(outs[0], o) for o in outs[1:])  # the batches differ
    return outs


@pytest.fixture
def setups() -> Iterator[list[Setup]]:
    made: list[Setup] = []
    yield made
    for s in made:
        s.free()


def _assert_same(outs: list[np.ndarray], reference: list[np.ndarray]) -> None:
    for k, (got, want) in enumerate(zip(outs, reference, strict=True)):
        assert np.array_equal(got, want), f"batch {k}: logits differ (max {np.nanmax(np.abs(got - want))})"


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
@pytest.mark.slow
def test_parallel_gives_the_results_of_serial_and_of_one_cpu(config: str, held: bool, reference: list[np.ndarray],
                                                             setups: list[Setup]) -> None:
    """Consecutive batches with parallel on give exactly the logits of parallel off and of one CPU backend,
    with the async backends running freely on their threads or held (running only what is waited for)."""
    for parallel in (False, True):
        s = _make(config, parallel)
        setups.append(s)
        assert s.sched.get_n_copies() == (GGML_SCHED_MAX_COPIES if parallel else 1)
        if held:
            for b in s.backends:
                if isinstance(b, AsyncTestBackend):
                    b.hold()
        _assert_same(_run(s), reference)
        assert len({sp.backend_id for sp in s.sched.splits}) == len(s.backends)  # every backend computed


def test_copies_rotate_and_are_distinct(setups: list[Setup]) -> None:
    """cur_copy changes with every alloc_graph; each split input has n_copies copies, distinct tensors at
    distinct, non-overlapping addresses, of which the split reads the current one; the graph inputs move to
    another of their n_copies places with each batch (ggml's pass 6)."""
    s = _make("async-async", parallel=True)
    setups.append(s)
    sched = s.sched
    seen_copies: list[int] = []
    input_addresses: dict[str, set[int]] = {"tokens": set(), "kq_mask": set()}
    for k in range(GGML_SCHED_MAX_COPIES + 2):
        def check() -> None:
            seen_copies.append(sched.cur_copy)
            inputs = [(inp, sp) for sp in sched.splits for inp in sp.inputs]
            assert inputs
            for inp, sp in inputs:
                copies = [sched.copies[(id(inp), sp.backend_id, c)] for c in range(GGML_SCHED_MAX_COPIES)]
                assert len({id(c) for c in copies}) == GGML_SCHED_MAX_COPIES
                spans = sorted((c.data, c.data + c.nbytes()) for c in copies)
                assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
                cur = copies[sched.cur_copy]
                readers = [n for n in sp.graph.nodes if any(src is cur for src in n.src)]
                assert readers, f"no node of {sp} reads the current copy of '{inp.name}'"
                assert not any(src is c for n in sp.graph.nodes for src in n.src for c in copies if c is not cur)
            for name, addrs in input_addresses.items():
                addrs.add(s.inputs[name].data)
        _batch(s, k, check)
    sched.synchronize()
    assert seen_copies == [k % GGML_SCHED_MAX_COPIES for k in range(GGML_SCHED_MAX_COPIES + 2)]
    assert all(len(a) == GGML_SCHED_MAX_COPIES for a in input_addresses.values()), input_addresses


def test_without_parallel_there_is_one_copy_and_no_event(setups: list[Setup]) -> None:
    s = _make("async-async", parallel=False)
    setups.append(s)
    _run(s, 3)
    assert s.sched.cur_copy == 0 and all(e is None for row in s.sched.events for e in row)
    assert all(isinstance(b, AsyncTestBackend) and b.n_event_records == 0 and b.n_event_waits == 0
               for b in s.backends)


@pytest.mark.parametrize("config", ["async-async", "cpu-async-async"])
def test_events_are_recorded_waited_and_synchronized(config: str, reference: list[np.ndarray],
                                                     setups: list[Setup]) -> None:
    """Each split records its backend's event of the current copy; a split reusing a copy makes its queue
    wait for the event of that copy's last use, and the host waits for it before it copies in."""
    s = _make(config, parallel=True)
    setups.append(s)
    a, b = s.backends[:2]
    assert isinstance(a, AsyncTestBackend) and isinstance(b, AsyncTestBackend)
    b.hold()
    outs = _run(s)
    _assert_same(outs, reference)
    late = N_BATCHES - GGML_SCHED_MAX_COPIES  # batches that reuse a copy whose event was recorded
    for x in (a, b):
        splits = [sp for sp in s.sched.splits if sp.backend is x]
        assert x.n_event_records == len(splits) * N_BATCHES
        # a computed input (not the caller's) is copied in after the queue waits for the copy's last use
        computed = [inp for sp in splits for inp in sp.inputs if not inp.flags & TensorFlag.INPUT]
        graph_inputs = [inp for sp in splits for inp in sp.inputs if inp.flags & TensorFlag.INPUT]
        assert x.n_event_waits == len(computed) * late
        # and the host waits for the copy's last use before it writes any input into it
        assert x.device.n_event_syncs >= (len(computed) + len(graph_inputs)) * late > 0


def test_next_inputs_are_set_while_batches_run(reference: list[np.ndarray], setups: list[Setup]) -> None:
    """ggml's reason for n_copies. B (held) holds the graph inputs and reads the position and the mask in
    place; A copies them. The caller writes batch k+1's inputs while B's part of batches k-2..k is still
    queued, the scheduler copies A's output for batch k+1 into B's next copy, and each batch still gets its
    own logits: the batches in flight read their own inputs and copies. At most n_copies - 1 batches are
    left queued when the next inputs are written (the allocation of a copy waits for its last use)."""
    s = _make("async-async", parallel=True)
    setups.append(s)
    a, b = s.backends
    assert isinstance(a, AsyncTestBackend) and isinstance(b, AsyncTestBackend)
    b.hold()
    in_flight: list[int] = []  # B's batches not computed when the next batch's inputs were written
    reads_in_place: list[bool] = []

    def note() -> None:
        in_flight.append(b.n_queued_graphs - b.n_done_graphs)
        mask = s.inputs["kq_mask"]
        reads_in_place.append(s.sched.get_tensor_backend(mask) is b and any(
            src is mask for sp in s.sched.splits if sp.backend is b for n in sp.graph.nodes for src in n.src))

    outs = [_batch(s, k, note) for k in range(N_BATCHES)]
    assert b.n_done_graphs < b.n_queued_graphs  # the last batches are still queued here
    s.sched.synchronize()
    assert all(reads_in_place)
    n = GGML_SCHED_MAX_COPIES
    assert in_flight == [min(k, n - 1) for k in range(N_BATCHES)]
    _assert_same(outs, reference)


def test_without_copies_the_batch_in_flight_sees_the_next_inputs(reference: list[np.ndarray],
                                                                 setups: list[Setup]) -> None:
    """The hazard n_copies removes, shown by the same sequence with parallel off: batch 0 is still queued on
    B when the caller writes batch 1's inputs where B will read them, and batch 0 gets other logits. (Batch
    1 is lost too: with one copy, batch 0's nodes on B reuse the inputs' memory after their last reader, so
    running late they overwrite batch 1's inputs: parallel off, the caller must synchronize between batches.)"""
    s = _make("async-async", parallel=False)
    setups.append(s)
    b = s.backends[1]
    assert isinstance(b, AsyncTestBackend)
    b.hold()
    outs = [_batch(s, k) for k in range(2)]
    s.sched.synchronize()
    assert not np.array_equal(outs[0], reference[0])


def test_graph_inputs_are_copies_in_parallel_only(setups: list[Setup]) -> None:
    """With parallel, each graph input has n_copies places (the leaf is the current one); without, one."""
    for parallel in (False, True):
        s = _make("async-async", parallel)
        setups.append(s)
        s.sched.reset()
        s.new_graph()
        assert s.graph is not None
        s.sched.alloc_graph(s.graph)
        leaf = s.inputs["tokens"]
        assert leaf.flags & TensorFlag.INPUT
        b = s.backends[1]
        assert s.sched.get_tensor_backend(leaf) is b
        placed = [t for t, _ in s.sched.first_allocs if t is leaf or t.name == f"{b.name()}#{leaf.name}#1"]
        if parallel:
            copies = [s.sched.copies[(id(leaf), s.sched.backend_ids[id(leaf)], c)] for c in range(4)]
            assert copies[s.sched.cur_copy] is leaf and len({id(c) for c in copies}) == 4
            assert len(placed) == 2
        else:
            assert placed == [leaf]
        s.sched.synchronize()


def test_the_async_backend_queues_compute_and_events() -> None:
    """The test double itself: graph_compute_async, tensor_set_async and event records are queued (a held
    backend leaves them queued); the buffer's tensor_get does not wait for them; synchronize and event
    synchronize run what they wait for; another backend's queue waits for an event before its next work."""
    a, b = _asyncs(2)
    try:
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        x = ctx.new_tensor_1d(GGMLType.F32, 4)
        y = ctx.scale(x, 2.0)
        g = ctx.new_graph(8)
        g.build_forward_expand(y)
        ctx_b = Context(mem_size=1 << 20, no_alloc=True)
        u = ctx_b.new_tensor_1d(GGMLType.F32, 4)
        v = ctx_b.scale(u, 3.0)
        g_b = ctx_b.new_graph(8)
        g_b.build_forward_expand(v)
        bufs = [alloc_ctx_tensors(ctx, a), alloc_ctx_tensors(ctx_b, b)]
        tensor_set_numpy(y, np.zeros(4, np.float32))
        a.hold()
        tensor_set_async(x, np.arange(4, dtype=np.float32))
        a.graph_compute_async(g)
        ev = a.device.event_new()
        assert ev is not None
        ev.record(a)
        assert a.n_pending == 3 and a.n_done_graphs == 0
        assert np.array_equal(tensor_get_numpy(y), np.zeros(4))  # not waiting for the queued compute
        b.hold()
        ev.wait(b)  # b's next work runs after a's marker
        tensor_set_numpy(u, np.ones(4, np.float32))
        b.graph_compute_async(g_b)
        assert a.n_done_graphs == 0 and b.n_done_graphs == 0
        b.synchronize()  # b's wait makes a run up to the marker
        assert a.n_done_graphs == 1 and np.array_equal(tensor_get_numpy(y), [0, 2, 4, 6])
        assert np.array_equal(tensor_get_numpy(v), [3, 3, 3, 3])
        ev.synchronize()
        assert a.device.n_event_syncs == 1 and b.n_event_waits == 1 and a.n_event_records == 1
        a.graph_compute(g)  # the synchronous form returns when done, held or not
        assert a.n_done_graphs == 2 and a.n_pending == 0
        ev.free()
        for buf in bufs:
            buf.free()
    finally:
        a.free()
        b.free()
