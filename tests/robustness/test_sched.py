"""Bad-input catalog of the scheduler: construction, assignments, freed backends and buffers, failed calls.

Each case asserts the error class, that the message names the thing (backend, tensor, argument, limit)
and the numbers, and that the scheduler still works afterwards: a failed call found up front changes
nothing (the inputs stay placed, nothing is computed), a failed split or allocation is rolled back,
and the same scheduler (or, where the case freed a backend, one over live backends) then computes
a valid graph split over two backends exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pyggml.capi as capi
from pyggml.alloc import TensorAllocator
from pyggml.backends.cpu import CPUBackend, cpu_init
from pyggml.backends.testing_blas import TestingBLASBackend
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GGMLError,
    GraphError,
    InvalidStateError,
    LimitExceededError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from pyggml.core.graph import Graph
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.ggml_backend.backend import Backend
from pyggml.seed import GGML_MAX_BACKENDS, Scheduler
from robustness.conftest import expect_error

F32 = GGMLType.F32
N = 8


class CountingCPU(CPUBackend):
    """A one-thread CPU backend that counts the graphs it computes."""

    def __init__(self) -> None:
        super().__init__(1)
        self.n_graph_compute = 0

    def _graph_compute(self, graph: Graph) -> None:
        self.n_graph_compute += 1
        super()._graph_compute(graph)


class Step:
    """out = sqr(scale(x, 2) + x) = 9 x^2, with the scale assigned to the second backend (two splits).

    x is placed in the first backend's compute buffer, or by `x_talloc` (memory of its own).
    """

    def __init__(self, sched: Scheduler, n: int = N, graph_size: int = 64,
                 x_talloc: TensorAllocator | None = None) -> None:
        self.ctx = ctx = Context(mem_size=1 << 20, no_alloc=True)
        self.x = ctx.new_tensor_1d(F32, n).set_name("x")
        self.y = ctx.scale(self.x, 2.0).set_name("y")
        self.z = ctx.add(self.y, self.x).set_name("z")
        self.out = ctx.sqr(self.z).set_name("out")
        self.graph = Graph(graph_size)
        self.graph.build_forward_expand(self.out)
        self.sched = sched
        (x_talloc or sched.get_tallocr(sched.backends[0])).alloc(self.x)
        sched.set_tensor_backend(self.y, sched.backends[-1])

    def compute(self, seed: int = 0) -> np.ndarray:
        values = np.random.default_rng(seed).standard_normal(self.x.ne[0]).astype(np.float32)
        tensor_set_numpy(self.x, values)
        self.sched.graph_compute(self.graph)
        return values


def assert_computes(sched: Scheduler, n: int = N) -> None:
    """A new step computes exactly on `sched` (split over its backends)."""
    step = Step(sched, n)
    values = step.compute(seed=n)
    np.testing.assert_allclose(tensor_get_numpy(step.out), 9.0 * values * values, rtol=1e-6)


def measured(backends: list[Backend] | None = None, **kwargs: object) -> Scheduler:
    sched = Scheduler(backends if backends is not None else [CountingCPU(), CountingCPU()], **kwargs)  # type: ignore[arg-type]
    sched.init_measure(Step(sched).graph)
    return sched


# --- construction ---


@pytest.mark.parametrize("make, cls, fragments", [
    (lambda b: Scheduler([]), ArgumentError, ("Scheduler: at least one backend is needed",)),
    (lambda b: Scheduler([cpu_init(1) for _ in range(GGML_MAX_BACKENDS + 1)]), LimitExceededError,
     ("Scheduler: 5 backends (CPU, CPU, CPU, CPU, CPU) exceed GGML_MAX_BACKENDS = 4",)),
    (lambda b: Scheduler([b[0], b[1], b[0]]), ArgumentError,
     ("backend 'CPU' is given twice (positions 0 and 2)",)),
    (lambda b: Scheduler([b[0], 3]), ArgumentTypeError, ("Scheduler: backends[1] must be a Backend", "int 3")),
    (lambda b: Scheduler(b[0]), ArgumentTypeError, ("Scheduler: backends must be a sequence of Backends",
                                                    "got CountingCPU")),
    (lambda b: Scheduler(b, graph_size=0), ArgumentError, ("Scheduler: graph_size must be >= 1, got 0",)),
    (lambda b: Scheduler(b, graph_size=-5), ArgumentError, ("graph_size must be >= 1, got -5",)),
    (lambda b: Scheduler(b, graph_size=2.5), ArgumentTypeError, ("graph_size must be an integer", "float 2.5")),
    (lambda b: Scheduler(b, graph_size=True), ArgumentTypeError, ("graph_size must be an integer", "bool True")),
    (lambda b: Scheduler(b, max_splits=0), ArgumentError, ("Scheduler: max_splits must be >= 1, got 0",)),
    (lambda b: Scheduler(b, max_split_inputs=1.5), ArgumentTypeError,
     ("max_split_inputs must be an integer", "float 1.5")),
    (lambda b: Scheduler(b, max_backends=1), LimitExceededError, ("2 backends", "GGML_MAX_BACKENDS = 1")),
    (lambda b: capi.ggml_backend_sched_new(b, 3), ArgumentError, ("n_backends 3 but 2 backends given",)),
    (lambda b: capi.ggml_backend_sched_new(b, 1.0), ArgumentTypeError,
     ("ggml_backend_sched_new: n_backends must be an integer", "float 1.0")),
    (lambda b: capi.ggml_backend_sched_new(b, 0), ArgumentError, ("at least one backend",)),
], ids=["none", "too-many", "duplicate", "not-a-backend", "not-a-sequence", "graph-size-0", "graph-size-neg",
        "graph-size-float", "graph-size-bool", "max-splits-0", "max-split-inputs-float", "max-backends-1",
        "capi-n-too-many", "capi-n-float", "capi-n-zero"])
def test_bad_construction(make: Callable[[list[Backend]], object], cls: type[GGMLError],
                          fragments: tuple[str, ...]) -> None:
    backends: list[Backend] = [CountingCPU(), CountingCPU()]
    expect_error(lambda: make(backends), cls, *fragments)
    assert_computes(measured(backends))


def test_freed_backend_at_construction() -> None:
    a, b = CountingCPU(), CountingCPU()
    b.free()
    expect_error(lambda: Scheduler([a, b]), BufferFreedError, "Scheduler: backend 'CPU' (backends[1]) was freed")
    assert_computes(measured([a, CountingCPU()]))


# --- assignments ---


def test_set_tensor_backend_outside_the_scheduler() -> None:
    sched = measured()
    step = Step(sched)
    other = cpu_init(1)
    calls: list[Callable[[], object]] = [
        lambda: sched.set_tensor_backend(step.z, other),
        lambda: sched.set_node_backend(step.z, other),
        lambda: capi.ggml_backend_sched_set_tensor_backend(sched, step.z, other),
    ]
    for call in calls:
        expect_error(call, ArgumentError,
                     "set_node_backend('z'): backend 'CPU' is not one of the scheduler's backends ('CPU', 'CPU')")
    expect_error(lambda: sched.set_tensor_backend(step.z, "cpu"), ArgumentTypeError,  # type: ignore[arg-type]
                 "set_node_backend('z'): backend must be a Backend", "str 'cpu'")
    expect_error(lambda: sched.set_tensor_backend(42, sched.backends[0]), ArgumentTypeError,  # type: ignore[arg-type]
                 "set_node_backend: node must be a Tensor", "int 42")
    expect_error(lambda: sched.get_tensor_backend(None), ArgumentTypeError,  # type: ignore[arg-type]
                 "get_node_backend: node must be a Tensor")
    assert sched.get_tensor_backend(step.y) is sched.backends[1]  # the valid assignment made by Step holds
    assert sched.get_tensor_backend(step.z) is None
    values = step.compute()
    np.testing.assert_allclose(tensor_get_numpy(step.out), 9.0 * values * values, rtol=1e-6)


def test_user_assignment_to_a_backend_that_cannot_compute_the_op() -> None:
    blas, cpu = TestingBLASBackend(), CountingCPU()
    sched = Scheduler([cpu, blas])
    step = Step(sched)  # the scale to the BLAS backend, which computes MUL_MAT only
    expect_error(lambda: sched.init_measure(step.graph), UnsupportedOpError,
                 "node 0 'y' is on backend 'TestBLAS' (set by set_node_backend), which does not support op SCALE")
    assert not sched.measured and cpu.n_graph_compute == 0
    assert all(s is None or "#" not in s.name for n in step.graph.nodes for s in n.src)  # no copies left
    sched.set_tensor_backend(step.y, cpu)  # fixed, the same graph measures
    sched.init_measure(step.graph)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, N).set_name("x")
    out = ctx.sqr(ctx.add(ctx.scale(x, 2.0), x))
    g = Graph(64)
    g.build_forward_expand(out)
    sched.get_tallocr(cpu).alloc(x)
    tensor_set_numpy(x, np.arange(N, dtype=np.float32))
    sched.graph_compute(g)
    np.testing.assert_allclose(tensor_get_numpy(out), 9.0 * np.arange(N) ** 2)


# --- freed backends and compute buffers: noticed before any split runs ---


@pytest.mark.parametrize("which", [0, 1], ids=["first-backend", "second-backend"])
def test_freed_backend_is_noticed_before_any_split_runs(which: int) -> None:
    a, b = CountingCPU(), CountingCPU()
    sched = measured([a, b])
    step = Step(sched)
    tensor_set_numpy(step.x, np.ones(N, np.float32))
    talloc = sched.get_tallocr(a)
    before = talloc.snapshot()
    [a, b][which].free()
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: sched.graph_compute(step.graph), "graph_compute"),
        (lambda: sched.reserve(step.graph), "reserve"),
        (lambda: capi.ggml_backend_sched_graph_compute(sched, step.graph), "graph_compute"),
    ]
    for call, what in calls:
        expect_error(call, BufferFreedError,
                     f"{what}: backend 'CPU' (backend {which} of the scheduler's 2) was freed", "nothing was computed")
    assert (a.n_graph_compute, b.n_graph_compute) == (0, 0)  # the measure computes nothing, no split ran
    assert talloc.snapshot() == before and talloc.holds(step.x)  # the input is still placed
    assert sched.get_tensor_backend(step.y) is b  # the assignment still holds
    assert step.out.data is None
    sched.reset()  # resettable
    assert_computes(measured([a, b][1 - which: 2 - which] + [CountingCPU()]))


def test_freed_compute_buffer_is_noticed_up_front() -> None:
    a, b = CountingCPU(), CountingCPU()
    sched = measured([a, b])
    buffer = sched.get_buffer(b)
    size = buffer.get_size()
    step = Step(sched)
    buffer.free()
    expect_error(lambda: sched.graph_compute(step.graph), BufferFreedError,
                 f"graph_compute: the compute buffer 'CPU' ({size} bytes) of backend 'CPU' (backend 1) was freed")
    assert (a.n_graph_compute, b.n_graph_compute) == (0, 0)
    assert_computes(measured([a, b]))


def test_freed_backend_before_measuring() -> None:
    a, b = CountingCPU(), CountingCPU()
    sched = Scheduler([a, b])
    step = Step(sched)
    b.free()
    expect_error(lambda: sched.init_measure(step.graph), BufferFreedError,
                 "init_measure: backend 'CPU' (backend 1 of the scheduler's 2) was freed")
    assert not sched.measured and sched.get_tallocr(a).holds(step.x)
    assert_computes(measured([a, CountingCPU()]))


def test_freed_scheduler() -> None:
    sched = measured()
    step = Step(sched)
    sched.free()
    sched.free()  # twice is harmless
    for call in (lambda: sched.graph_compute(step.graph), lambda: sched.get_tallocr(sched.backends[0]),
                 lambda: sched.set_tensor_backend(step.z, sched.backends[0])):
        expect_error(call, BufferFreedError, "the scheduler was used after it was freed")
    assert_computes(measured(list(sched.backends)))  # its backends are not freed with it


# --- failed calls leave the scheduler usable ---


def test_graph_compute_before_measuring() -> None:
    sched = Scheduler([CountingCPU(), CountingCPU()])
    step = Step(sched)
    expect_error(lambda: sched.graph_compute(step.graph), GraphError, "graph_compute: call init_measure")
    expect_error(lambda: sched.reserve(step.graph), GraphError, "reserve: call init_measure")
    sched.init_measure(step.graph)  # the same graph still measures: nothing changed
    assert_computes(sched)


def test_graph_larger_than_graph_size() -> None:
    sched = measured(graph_size=64)
    step = Step(sched, graph_size=4096)
    expect_error(lambda: sched.graph_compute(step.graph), GraphError, "the graph (size 4096, hash table 8209)",
                 "is larger than graph_size 64")
    assert step.out.data is None and sched.get_tensor_backend(step.y) is sched.backends[1]
    sched.reset()  # the failed step's input leaves the compute buffer
    assert_computes(sched)


def test_graph_computed_twice() -> None:
    sched = measured()
    step = Step(sched)
    step.compute()
    expect_error(lambda: sched.graph_compute(step.graph), GraphError,
                 "node 0 'y' already has memory in the scheduler's buffer 'CPU'", "build a new graph")
    assert_computes(sched)


def test_failed_allocation_rolls_back() -> None:
    """A graph larger than measured (its input in memory of its own): the allocation fails and is undone; the
    next valid graph computes."""
    sched = measured()
    xbuf = sched.backends[0].alloc_buffer(256)
    step = Step(sched, n=64, x_talloc=TensorAllocator.new_from_buffer(xbuf))
    expect_error(lambda: sched.graph_compute(step.graph), OutOfMemoryError, "not enough space in buffer 'CPU'",
                 "(needed 256 bytes, largest free block", "more memory than init_measure measured")
    assert all(n.data is None for n in step.graph.nodes)
    assert all(s is None or "#" not in s.name for n in step.graph.nodes for s in n.src)  # unsplit
    assert sched.n_splits == 0 and all(b.n_graph_compute == 0 for b in sched.backends)  # type: ignore[attr-defined]
    assert_computes(sched)
    assert_computes(sched)
    xbuf.free()


def test_failed_measure_leaves_it_unmeasured() -> None:
    sched = Scheduler([CountingCPU(), CountingCPU()], max_splits=1)  # Step needs 2 splits
    step = Step(sched)
    expect_error(lambda: sched.init_measure(step.graph), LimitExceededError,
                 "the graph needs more than GGML_MAX_SPLITS = 1 splits (node 1 'z'")
    assert not sched.measured and sched.get_tallocr(sched.backends[0]).holds(step.x)
    assert all(s is None or "#" not in s.name for n in step.graph.nodes for s in n.src)
    sched.set_tensor_backend(step.y, sched.backends[0])  # the assignment was kept: one backend, one split
    sched.init_measure(step.graph)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, N).set_name("x")
    out = ctx.sqr(ctx.add(ctx.scale(x, 2.0), x)).set_name("out")
    g = Graph(64)
    g.build_forward_expand(out)
    sched.get_tallocr(sched.backends[0]).alloc(x)
    tensor_set_numpy(x, np.arange(N, dtype=np.float32))
    sched.graph_compute(g)
    np.testing.assert_allclose(tensor_get_numpy(out), 9.0 * np.arange(N) ** 2)


def test_weight_on_a_backend_outside_the_scheduler() -> None:
    sched = measured()
    outsider = cpu_init(1)
    wbuf = outsider.alloc_buffer(64)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_1d(F32, N).set_name("w")
    TensorAllocator.new_from_buffer(wbuf).alloc(w)
    out = ctx.scale(w, 2.0).set_name("wout")
    g = Graph(64)
    g.build_forward_expand(out)
    expect_error(lambda: sched.graph_compute(g), ArgumentError,
                 "leaf 'w' (its memory): backend 'CPU' is not one of the scheduler's backends ('CPU', 'CPU')")
    assert out.data is None
    assert_computes(sched)
    wbuf.free()


@pytest.mark.parametrize("call, fragments", [
    (lambda s: s.graph_compute("graph"), ("graph_compute: graph must be a Graph", "str 'graph'")),
    (lambda s: s.reserve(None), ("reserve: graph must be a Graph", "NoneType None")),
    (lambda s: capi.ggml_backend_sched_graph_compute(s, 1), ("graph must be a Graph", "int 1")),
    (lambda s: s.get_tallocr(0), ("get_tallocr: backend must be a Backend", "int 0")),
], ids=["compute-str", "reserve-none", "capi-compute-int", "tallocr-int"])
def test_wrong_argument_types(call: Callable[[Scheduler], object], fragments: tuple[str, ...]) -> None:
    sched = measured()
    expect_error(lambda: call(sched), ArgumentTypeError, *fragments)
    assert_computes(sched)


def test_measure_with_a_wrong_graph_changes_nothing() -> None:
    sched = Scheduler([CountingCPU(), CountingCPU()])
    expect_error(lambda: sched.init_measure([1, 2]), ArgumentTypeError,  # type: ignore[arg-type]
                 "init_measure: measure_graph must be a Graph", "list")
    assert not sched.measured
    sched.init_measure(Step(sched).graph)
    assert_computes(sched)


def test_input_freed_by_hand() -> None:
    """An input placed in a compute buffer and then freed by hand is refused, not silently overwritten."""
    sched = measured()
    step = Step(sched)
    talloc = sched.get_tallocr(sched.backends[0])
    talloc.free_tensor(step.x)
    expect_error(lambda: talloc.free_tensor(step.x), InvalidStateError, "cannot free 'x'", "(a double free")
    expect_error(lambda: sched.graph_compute(step.graph), InvalidStateError,
                 "alloc_graph_n: tensor 'x' has memory at offset 0 of buffer 'CPU'",
                 "its tensor allocator does not hold")
    assert_computes(sched)
