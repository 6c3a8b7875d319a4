"""Bad-input catalog of the backend layer: buffers, set/get/copy ranges, freed objects, threads, compute.

Each case asserts the error class, that the message names the thing (tensor, buffer, backend,
argument) and the numbers, and that the object still works afterwards: the same buffer keeps its
bytes and takes a valid write, the same backend (or, where the case freed it, a new one) computes a
small graph exactly. The huge buffers run in a child process: were the check missing, numpy would be
asked for a petabyte.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import pyggml.capi as capi
from pyggml.backends.cpu import CPUBackend, cpu_buffer_from_ptr, cpu_init, cpu_set_n_threads, graph_compute_with_ctx
from pyggml.core import checks
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GGMLError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    OutOfMemoryError,
    ShapeError,
    UnsupportedOpError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    Backend,
    Buffer,
    BufferInterface,
    buffer_init,
    tensor_copy,
    tensor_get,
    tensor_get_numpy,
    tensor_memset,
    tensor_set,
    tensor_set_numpy,
)
from pyggml.testing import alloc_ctx_tensors
from robustness.conftest import expect_error, run_isolated

F32, F16 = GGMLType.F32, GGMLType.F16


def _graph(out: Tensor) -> Graph:
    g = Graph(64)
    g.build_forward_expand(out)
    return g


def assert_works(backend: Backend) -> None:
    """`backend` allocates, writes, computes (x * 2 + x) and reads exactly."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, 8).set_name("ok_x")
    out = ctx.add(ctx.scale(x, 2.0), x).set_name("ok_out")
    buf = alloc_ctx_tensors(ctx, backend)
    try:
        tensor_set_numpy(x, np.arange(8, dtype=np.float32))
        backend.graph_compute(_graph(out))
        assert tensor_get_numpy(out).tolist() == [3.0 * i for i in range(8)]
    finally:
        buf.free()


class One:
    """A 4-float tensor 'a' = [0, 1, 2, 3] (16 bytes) in a buffer of its own, and 'out' = a * 2."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.ctx = Context(mem_size=1 << 20, no_alloc=True)
        self.a = self.ctx.new_tensor_1d(F32, 4).set_name("a")
        self.out = self.ctx.scale(self.a, 2.0).set_name("out")
        self.buf = alloc_ctx_tensors(self.ctx, backend)
        tensor_set(self.a, np.arange(4, dtype=np.float32))

    def values(self) -> list[float]:
        return tensor_get_numpy(self.a).tolist()

    def check_intact(self) -> None:
        """Nothing was written by the failed call, and a valid write still lands."""
        assert self.values() == [0.0, 1.0, 2.0, 3.0]
        tensor_set(self.a, np.float32([7]), offset=12)
        assert self.values() == [0.0, 1.0, 2.0, 7.0]
        self.backend.graph_compute(_graph(self.out))
        assert tensor_get_numpy(self.out).tolist() == [0.0, 2.0, 4.0, 14.0]


@pytest.fixture
def cpu() -> CPUBackend:
    return cpu_init(1)


@pytest.fixture
def one(cpu: CPUBackend) -> One:
    return One(cpu)


# --- alloc_buffer sizes ---


@pytest.mark.parametrize("size, cls, fragments", [
    (10.5, ArgumentTypeError, ("backend 'CPU'", "alloc_buffer: size must be an integer", "float 10.5")),
    (True, ArgumentTypeError, ("alloc_buffer: size", "bool True")),
    ("64", ArgumentTypeError, ("alloc_buffer: size", "str '64'")),
    (None, ArgumentTypeError, ("alloc_buffer: size", "NoneType None")),
    (-1, ArgumentError, ("backend 'CPU'", "cannot allocate a buffer of -1 bytes")),
    (-(1 << 40), ArgumentError, ("backend 'CPU'", f"{-(1 << 40)} bytes")),
], ids=["float", "bool", "str", "none", "minus-one", "minus-1TiB"])
def test_alloc_buffer_bad_size(cpu: CPUBackend, size: object, cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    expect_error(lambda: cpu.alloc_buffer(size), cls, *fragments)  # type: ignore[arg-type]
    buf = cpu.alloc_buffer(16)
    assert buf.get_size() == 16 and buf.get_base() % 64 == 0
    buf.free()
    assert_works(cpu)


def test_alloc_buffer_larger_than_the_host_memory() -> None:
    """OutOfMemoryError with the bytes asked for and available, before numpy is asked (in a child: a
    missing check would ask numpy for a petabyte)."""
    proc = run_isolated("""
        from pyggml.backends.cpu import cpu_init
        from pyggml.core.errors import OutOfMemoryError
        b = cpu_init(1)
        for size in (1 << 50, 1 << 62):
            try:
                b.alloc_buffer(size)
            except OutOfMemoryError as e:
                print(e)
        print("still works", b.alloc_buffer(1 << 20).get_size())
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    for size, line in zip((1 << 50, 1 << 62), lines[:2], strict=True):
        assert re.fullmatch(rf"backend 'CPU': buffer of {size} bytes: cannot allocate {size + 64} bytes "
                            r"\([\d.]+ GiB\) of host memory, \d+ bytes \([\d.]+ GiB\) available", line), line
    assert lines[2] == f"still works {1 << 20}"


def test_alloc_buffer_over_the_available_memory(cpu: CPUBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check against a machine with 1 MiB left: the numbers are exact."""
    monkeypatch.setattr(checks, "available_host_memory", lambda: 1 << 20)
    expect_error(lambda: cpu.alloc_buffer(2 << 20), OutOfMemoryError, "backend 'CPU': buffer of 2097152 bytes",
                 "cannot allocate 2097216 bytes", "1048576 bytes (0.00 GiB) available")
    assert cpu.alloc_buffer(1 << 19).get_size() == 1 << 19
    monkeypatch.undo()
    assert_works(cpu)


@pytest.mark.parametrize("size, cls, fragments", [
    (10.5, ArgumentTypeError, ("cpu_buffer_from_ptr: size must be an integer", "float 10.5")),
    (-8, ArgumentError, ("cpu_buffer_from_ptr: size must be >= 0, got -8",)),
    (65, OutOfBoundsError, ("size 65 is larger than the memory given (64 bytes)",)),
])
def test_buffer_from_ptr_bad_size(cpu: CPUBackend, size: object, cls: type[GGMLError],
                                  fragments: tuple[str, ...]) -> None:
    memory = np.zeros(64, np.uint8)
    expect_error(lambda: cpu_buffer_from_ptr(cpu, memory, size), cls, *fragments)  # type: ignore[arg-type]
    buf = cpu_buffer_from_ptr(cpu, memory, 64)
    assert buf.get_size() == 64
    buf.free()
    assert_works(cpu)


def test_buffer_init_bad_size() -> None:
    iface = BufferInterface(get_base=lambda b: 0x1000)
    expect_error(lambda: buffer_init(None, iface, None, 2.5), ArgumentTypeError, "buffer_init: size", "float 2.5")
    expect_error(lambda: buffer_init(None, iface, None, -3), ArgumentError, "buffer_init: size must be >= 0, got -3")
    assert buffer_init(None, iface, None, 16).get_base() == 0x1000


# --- set / get / memset / copy ranges: (id, call, error class, fragments) ---

RANGE_CASES: list[tuple[str, Callable[[One], object], type[GGMLError], tuple[str, ...]]] = [
    ("set-negative-offset", lambda o: tensor_set(o.a, np.zeros(1, np.float32), offset=-4), ArgumentError,
     ("tensor_set: offset (-4)", "'a'")),
    ("set-past-end", lambda o: tensor_set(o.a, np.zeros(4, np.float32), offset=4), OutOfBoundsError,
     ("write of 16 bytes at offset 4", "'a' (16 bytes)")),
    ("set-data-too-large", lambda o: tensor_set(o.a, np.zeros(5, np.float32)), OutOfBoundsError,
     ("write of 20 bytes at offset 0", "'a' (16 bytes)")),
    ("set-size-past-data", lambda o: tensor_set(o.a, np.zeros(2, np.float32), size=12), OutOfBoundsError,
     ("write of 12 bytes to 'a'", "holds only 8 bytes")),
    ("set-negative-size", lambda o: tensor_set(o.a, np.zeros(2, np.float32), size=-8), ArgumentError,
     ("size (-8) must be >= 0", "'a'")),
    ("set-float-offset", lambda o: tensor_set(o.a, np.zeros(1, np.float32), offset=1.5), ArgumentTypeError,
     ("tensor_set: offset must be an integer", "float 1.5")),
    ("set-float-size", lambda o: tensor_set(o.a, np.zeros(4, np.float32), 0, 8.0), ArgumentTypeError,
     ("tensor_set: size must be an integer", "float 8.0")),
    ("set-not-a-tensor", lambda o: tensor_set(42, np.zeros(1, np.float32)), ArgumentTypeError,  # type: ignore[arg-type]
     ("tensor_set: tensor must be a Tensor", "int 42")),
    ("set-no-buffer-protocol", lambda o: tensor_set(o.a, [1.0, 2.0]), ArgumentError,
     ("list does not support the buffer protocol",)),
    ("get-negative-offset", lambda o: tensor_get(o.a, np.zeros(4, np.float32), offset=-8), ArgumentError,
     ("tensor_get: offset (-8)", "'a'")),
    ("get-past-end", lambda o: tensor_get(o.a, np.zeros(4, np.float32), offset=8, size=16), OutOfBoundsError,
     ("read of 16 bytes at offset 8", "'a' (16 bytes)")),
    ("get-small-output", lambda o: tensor_get(o.a, np.zeros(2, np.float32)), OutOfBoundsError,
     ("read of 16 bytes from 'a'", "output of only 8 bytes")),
    ("get-read-only-output", lambda o: tensor_get(o.a, bytes(16)), ArgumentError, ("read-only",)),
    ("memset-past-end", lambda o: tensor_memset(o.a, 0, 8, 12), OutOfBoundsError,
     ("memset of 12 bytes at offset 8", "'a' (16 bytes)")),
    ("memset-value", lambda o: tensor_memset(o.a, 256), ArgumentError,
     ("tensor_memset: value must be <= 255, got 256",)),
    ("numpy-wrong-count", lambda o: tensor_set_numpy(o.a, np.zeros(5, np.float32)), ShapeError,
     ("'a' holds 4 elements", "the array has 5")),
    ("copy-other-shape", lambda o: tensor_copy(o.a, o.ctx.new_tensor_1d(F32, 5).set_name("five")), LayoutError,
     ("different layouts", "'a' F32 ne=[4, 1, 1, 1]", "'five' F32 ne=[5, 1, 1, 1]")),
    ("copy-other-type", lambda o: tensor_copy(o.a, o.ctx.new_tensor_1d(F16, 4).set_name("half")), LayoutError,
     ("'a' F32 ne=[4, 1, 1, 1]", "'half' F16 ne=[4, 1, 1, 1]")),
    ("copy-not-a-tensor", lambda o: tensor_copy(o.a, "a"), ArgumentTypeError,  # type: ignore[arg-type]
     ("tensor_copy: dst must be a Tensor", "str 'a'")),
    ("copy-unallocated", lambda o: tensor_copy(o.a, o.ctx.new_tensor_1d(F32, 4).set_name("nowhere")),
     NotAllocatedError, ("tensor 'nowhere' is not allocated",)),
]


@pytest.mark.parametrize("call, cls, fragments", [c[1:] for c in RANGE_CASES], ids=[c[0] for c in RANGE_CASES])
def test_set_get_ranges(one: One, call: Callable[[One], object], cls: type[GGMLError],
                        fragments: tuple[str, ...]) -> None:
    expect_error(lambda: call(one), cls, *fragments)
    one.check_intact()


# --- tensors outside their buffer (a corrupt view): refused before a byte moves ---


def _stray(one: One, offset: int, nb1: int | None = None) -> Tensor:
    t = one.ctx.new_tensor_2d(F32, 4, 2).set_name("stray")
    if nb1 is not None:
        t.nb = [4, nb1, nb1 * 2, nb1 * 2]
    t.data, t.buffer = one.buf.get_base() + offset, one.buf
    return t


@pytest.mark.parametrize("offset, nb1, where", [
    (112, None, "32 bytes of 'stray' at offset 112 are outside its 128 bytes of buffer 'CPU'"),
    (-64, None, "32 bytes of 'stray' at offset -64 are outside its 128 bytes"),
    (0, -16, "32 bytes of 'stray' at offset -16 are outside its 128 bytes"),  # a negative stride reaches below
], ids=["past-the-end", "before-the-base", "negative-stride"])
def test_tensor_outside_its_buffer(one: One, offset: int, nb1: int | None, where: str) -> None:
    stray = _stray(one, offset, nb1)
    expect_error(lambda: tensor_set(stray, np.ones(8, np.float32)), OutOfBoundsError, "tensor_set: " + where)
    expect_error(lambda: tensor_get(stray, np.zeros(8, np.float32)), OutOfBoundsError, "tensor_get: " + where)
    expect_error(lambda: one.buf.init_tensor(stray), OutOfBoundsError, "init_tensor: " + where)
    # a graph that writes into the stray tensor is refused before any node runs: 'a' is untouched
    stray_out = one.ctx.scale(one.a, 3.0).set_name("into_a")
    stray_out.data, stray_out.buffer = one.a.data, one.buf
    bad = one.ctx.add(stray, stray).set_name("bad")
    bad.data, bad.buffer = one.a.data, one.buf
    g = Graph(16)
    g.build_forward_expand(stray_out)
    g.build_forward_expand(bad)
    expect_error(lambda: one.backend.graph_compute(g), OutOfBoundsError, "CPU graph_compute: " + where)
    one.check_intact()


# --- freed buffers ---


FREED_BUFFER_CASES: list[tuple[str, Callable[[One], object], tuple[str, ...]]] = [
    ("set", lambda o: tensor_set(o.a, np.zeros(4, np.float32)),
     ("tensor_set: buffer 'CPU' (128 bytes) of tensor 'a' was used after it was freed",)),
    ("get", lambda o: tensor_get(o.a, np.zeros(4, np.float32)), ("tensor_get: buffer 'CPU' (128 bytes)", "'a'")),
    ("memset", lambda o: tensor_memset(o.a, 0), ("tensor_memset: buffer 'CPU' (128 bytes) of tensor 'a'",)),
    ("clear", lambda o: o.buf.clear(0), ("buffer 'CPU' (128 bytes) was used after it was freed",)),
    ("get_base", lambda o: o.buf.get_base(), ("buffer 'CPU' (128 bytes)",)),
    ("init_tensor", lambda o: o.buf.init_tensor(o.a), ("buffer 'CPU' (128 bytes)",)),
    ("compute", lambda o: o.backend.graph_compute(_graph(o.out)),
     ("graph_compute on 'CPU': node 0 'out' (SCALE) is in buffer 'CPU' (128 bytes), which was freed",)),
    ("plan", lambda o: o.backend.graph_plan_create(_graph(o.out)), ("graph_plan_create on 'CPU'", "'out'")),
]


@pytest.mark.parametrize("call, fragments", [c[1:] for c in FREED_BUFFER_CASES],
                         ids=[c[0] for c in FREED_BUFFER_CASES])
def test_use_after_free_of_a_buffer(one: One, call: Callable[[One], object], fragments: tuple[str, ...]) -> None:
    one.buf.free()
    expect_error(lambda: call(one), BufferFreedError, *fragments)
    assert one.buf.freed and one.buf.get_size() == 128  # the size stays answerable
    assert_works(one.backend)


def test_buffer_freed_twice_is_idempotent(one: One) -> None:
    """Documented behaviour: the first free releases the memory, a second does nothing (no error)."""
    one.buf.free()
    one.buf.free()
    capi.ggml_backend_buffer_free(one.buf)
    expect_error(one.buf.get_base, BufferFreedError, "buffer 'CPU' (128 bytes) was used after it was freed")
    assert_works(one.backend)


def test_plan_of_a_freed_buffer(one: One) -> None:
    plan = one.backend.graph_plan_create(_graph(one.out))
    one.buf.free()
    expect_error(lambda: one.backend.graph_plan_compute(plan), BufferFreedError,
                 "buffer 'CPU' (128 bytes) used by the plan was freed")
    assert_works(one.backend)


def test_clear_and_memset(one: One) -> None:
    expect_error(lambda: one.buf.clear(-1), ArgumentError, "buffer 'CPU': clear: value must be >= 0, got -1")
    expect_error(lambda: one.buf.clear(1.0), ArgumentTypeError, "clear: value must be an integer", "float 1.0")
    one.check_intact()
    tensor_memset(one.a, 0, 4, 8)
    assert one.values() == [0.0, 0.0, 0.0, 7.0]
    one.buf.clear(0)
    assert one.values() == [0.0] * 4


# --- freed backends ---


FREED_BACKEND_CASES: list[tuple[str, Callable[[One], object]]] = [
    ("alloc_buffer", lambda o: o.backend.alloc_buffer(16)),
    ("graph_compute", lambda o: o.backend.graph_compute(_graph(o.out))),
    ("graph_plan_create", lambda o: o.backend.graph_plan_create(_graph(o.out))),
    ("tensor_set", lambda o: tensor_set(o.a, np.zeros(4, np.float32))),
    ("synchronize", lambda o: o.backend.synchronize()),
    ("set_n_threads", lambda o: cpu_set_n_threads(o.backend, 2)),
    ("buffer_from_ptr", lambda o: cpu_buffer_from_ptr(o.backend, np.zeros(64, np.uint8), 64)),
]


@pytest.mark.parametrize("call", [c[1] for c in FREED_BACKEND_CASES], ids=[c[0] for c in FREED_BACKEND_CASES])
def test_use_after_free_of_a_backend(one: One, call: Callable[[One], object]) -> None:
    one.backend.free()
    expect_error(lambda: call(one), BufferFreedError, "backend 'CPU' was used after it was freed")
    one.backend.free()  # twice is harmless
    assert_works(cpu_init(1))


# --- threads ---


@pytest.mark.parametrize("n, cls, fragments", [
    (0, ArgumentError, ("n_threads must be >= 1, got 0",)),
    (-3, ArgumentError, ("n_threads must be >= 1, got -3",)),
    (2.5, ArgumentTypeError, ("n_threads must be an integer", "float 2.5")),
    (True, ArgumentTypeError, ("n_threads must be an integer", "bool True")),
    ("4", ArgumentTypeError, ("n_threads must be an integer", "str '4'")),
    (513, ArgumentError, ("n_threads must be <= 512, got 513",)),
], ids=["zero", "negative", "float", "bool", "str", "too-many"])
def test_bad_thread_counts(n: object, cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    expect_error(lambda: cpu_init(n), cls, "CPU backend: ", *fragments)  # type: ignore[arg-type]
    backend = cpu_init(1)
    expect_error(lambda: cpu_set_n_threads(backend, n), cls, "cpu_set_n_threads: ", *fragments)  # type: ignore[arg-type]
    expect_error(lambda: capi.ggml_backend_cpu_set_n_threads(backend, n), cls, *fragments)
    expect_error(lambda: setattr(backend, "n_threads", n), cls, *fragments)
    ctx = Context(mem_size=1 << 20)
    x = ctx.new_tensor_1d(F32, 4)
    g = _graph(ctx.scale(x, 2.0))
    expect_error(lambda: graph_compute_with_ctx(ctx, g, n), cls, "graph_compute_with_ctx: ", *fragments)  # type: ignore[arg-type]
    assert backend.n_threads == 1  # unchanged by the failed calls
    cpu_set_n_threads(backend, 2)
    assert backend.n_threads == 2
    assert_works(backend)


def test_set_n_threads_of_another_backend() -> None:
    from pyggml.backends.testing_blas import TestingBLASBackend

    expect_error(lambda: cpu_set_n_threads(TestingBLASBackend(), 2), ArgumentError,
                 "backend 'TestBLAS' is not the CPU backend")
    expect_error(lambda: cpu_set_n_threads(7, 2), ArgumentTypeError,  # type: ignore[arg-type]
                 "cpu_set_n_threads: backend_cpu must be a Backend", "int 7")
    assert_works(cpu_init(1))


# --- compute: unallocated tensors, unsupported ops, wrong arguments ---


def test_compute_with_unallocated_tensors(cpu: CPUBackend) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, 4).set_name("x")
    y = ctx.scale(x, 2.0).set_name("y")
    expect_error(lambda: cpu.graph_compute(_graph(y)), NotAllocatedError,
                 "graph_compute on 'CPU': node 0 'y' (SCALE) is not allocated")
    # the node has memory, its source has none
    buf = cpu.alloc_buffer(64)
    y.data, y.buffer = buf.get_base(), buf
    expect_error(lambda: cpu.graph_compute(_graph(y)), NotAllocatedError,
                 "'x', src[0] of node 0 'y' (SCALE), is not allocated")
    buf.free()
    assert_works(cpu)


def test_compute_of_an_unsupported_op(cpu: CPUBackend) -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x = ctx.new_tensor_1d(F32, 4).set_name("x")
    back = ctx.new_tensor_1d(F32, 4).set_name("grad")
    back.op = GGMLOp.SSM_SCAN  # no CPU kernel (yet)
    back.src[0], back.src[1] = x, x
    buf = alloc_ctx_tensors(ctx, cpu)
    assert not cpu.supports_op(back)
    fragments = ("backend 'CPU' does not support op SSM_SCAN of node 0 'grad'", "sources x:F32, x:F32")
    expect_error(lambda: cpu.graph_compute(_graph(back)), UnsupportedOpError, "graph_compute: ", *fragments)
    expect_error(lambda: cpu.graph_plan_create(_graph(back)), UnsupportedOpError, "graph_plan_create: ", *fragments)
    expect_error(lambda: capi.ggml_backend_graph_compute(cpu, _graph(back)), UnsupportedOpError, *fragments)
    buf.free()
    assert_works(cpu)


@pytest.mark.parametrize("call, fragments", [
    (lambda b: b.graph_compute(42), ("graph_compute: graph must be a Graph", "int 42")),
    (lambda b: b.graph_plan_create("g"), ("graph_plan_create: graph must be a Graph", "str 'g'")),
    (lambda b: b.supports_op(None), ("supports_op: op must be a Tensor", "NoneType None")),
], ids=["compute-int", "plan-str", "supports-none"])
def test_wrong_argument_types(cpu: CPUBackend, call: Callable[[CPUBackend], object],
                              fragments: tuple[str, ...]) -> None:
    expect_error(lambda: call(cpu), ArgumentTypeError, "backend 'CPU': ", *fragments)
    assert_works(cpu)


# --- the C API raises the same errors ---


CAPI_CASES: list[tuple[str, Callable[[One], object], type[GGMLError], tuple[str, ...]]] = [
    ("alloc_buffer-float", lambda o: capi.ggml_backend_alloc_buffer(o.backend, 10.5), ArgumentTypeError,
     ("alloc_buffer: size must be an integer", "float 10.5")),
    ("alloc_buffer-negative", lambda o: capi.ggml_backend_alloc_buffer(o.backend, -1), ArgumentError,
     ("cannot allocate a buffer of -1 bytes",)),
    ("tensor_set-negative", lambda o: capi.ggml_backend_tensor_set(o.a, np.zeros(1, np.float32), -4, 4),
     ArgumentError, ("offset (-4)", "'a'")),
    ("tensor_get-past-end", lambda o: capi.ggml_backend_tensor_get(o.a, np.zeros(4, np.float32), 4, 16),
     OutOfBoundsError, ("read of 16 bytes at offset 4", "'a' (16 bytes)")),
    ("tensor_memset-past-end", lambda o: capi.ggml_backend_tensor_memset(o.a, 1, 16, 1), OutOfBoundsError,
     ("memset of 1 bytes at offset 16",)),
    ("buffer_clear-value", lambda o: capi.ggml_backend_buffer_clear(o.buf, 999), ArgumentError,
     ("clear: value must be <= 255, got 999",)),
    ("tensor_copy-layout", lambda o: capi.ggml_backend_tensor_copy(o.a, o.ctx.new_tensor_1d(F32, 2)), LayoutError,
     ("ne=[4, 1, 1, 1]", "ne=[2, 1, 1, 1]")),
    ("graph_compute-type", lambda o: capi.ggml_backend_graph_compute(o.backend, [o.out]), ArgumentTypeError,
     ("graph must be a Graph", "list")),
]


@pytest.mark.parametrize("call, cls, fragments", [c[1:] for c in CAPI_CASES], ids=[c[0] for c in CAPI_CASES])
def test_capi_raises_the_same_errors(one: One, call: Callable[[One], object], cls: type[GGMLError],
                                     fragments: tuple[str, ...]) -> None:
    expect_error(lambda: call(one), cls, *fragments)
    one.check_intact()


def test_buffer_base_class_refuses_clear_without_host_memory() -> None:
    """A buffer whose backend has no clear and no host memory says so instead of writing somewhere."""
    buf = buffer_init(None, BufferInterface(get_base=lambda b: 0x1000), None, 64)
    assert isinstance(buf, Buffer) and not buf.is_host()
    expect_error(lambda: buf.clear(0), UnsupportedOpError, "buffer 'buffer'", "cannot be cleared")
    assert buf.get_base() == 0x1000
