"""Bad-input catalog of the allocators: the tensor allocator, the legacy Allocr, the graph allocator.

Each case asserts the error class, that the message names the tensor (or argument, or buffer) and the
numbers, and that the allocator still works afterwards: its free list is what it was before the
failed call (`snapshot`), and a valid allocation, free or graph pass that follows places tensors
inside the buffer without overlapping any live tensor, with the values written there intact.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pyggml.capi as capi
from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.backends.cpu import CPUBackend, cpu_init
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BufferFreedError,
    GGMLError,
    GraphError,
    InvalidStateError,
    LimitExceededError,
    NotAllocatedError,
    OutOfBoundsError,
    OutOfMemoryError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.seed import Allocr
from robustness.conftest import expect_error

F32 = GGMLType.F32


@pytest.fixture
def cpu() -> CPUBackend:
    return cpu_init(1)


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def f32(ctx: Context, n: int, name: str) -> Tensor:
    return ctx.new_tensor_1d(F32, n).set_name(name)


def spans_ok(talloc: TensorAllocator, live: list[Tensor]) -> None:
    """Live tensors lie inside the buffer and do not overlap; their recorded values are intact."""
    end = talloc.base + talloc.buffer.get_size()
    spans = sorted((t.data, t.data + talloc.alloc_size(t), t.name) for t in live)
    for lo, hi, name in spans:
        assert talloc.base <= lo and hi <= end, f"{name} outside the buffer"
    for (_, hi0, n0), (lo1, _, n1) in zip(spans, spans[1:], strict=False):
        assert hi0 <= lo1, f"{n0} and {n1} overlap"


def assert_talloc_works(talloc: TensorAllocator, ctx: Context, live: list[Tensor]) -> None:
    """A new tensor fits beside the live ones, and every live tensor keeps the values written to it."""
    for i, t in enumerate(live):
        tensor_set_numpy(t, np.full(t.ne[0], i + 1, np.float32))
    extra = f32(ctx, 4, "extra")
    talloc.alloc(extra)
    tensor_set_numpy(extra, np.full(4, -1, np.float32))
    spans_ok(talloc, [*live, extra])
    for i, t in enumerate(live):
        assert np.all(tensor_get_numpy(t) == i + 1), t.name
    talloc.free_tensor(extra)


class Setup:
    """A 256-byte CPU buffer with its allocator (alignment 64): 'a' (64 bytes) at 0 and 'b' (64 bytes) at 64."""

    def __init__(self, cpu: CPUBackend, ctx: Context) -> None:
        self.ctx = ctx
        self.buf = cpu.alloc_buffer(256)
        self.talloc = TensorAllocator.new_from_buffer(self.buf)
        self.a, self.b = f32(ctx, 16, "a"), f32(ctx, 16, "b")
        self.talloc.alloc(self.a)
        self.talloc.alloc(self.b)


@pytest.fixture
def s(cpu: CPUBackend, ctx: Context) -> Setup:
    return Setup(cpu, ctx)


# --- tensor allocator: frees ---


def test_double_free_that_would_make_tensors_overlap(s: Setup) -> None:
    """The issue's case: a freed tensor's bytes go to 'c'; freeing the first tensor again would give them away
    a second time and the next tensor would overlap 'c'."""
    s.talloc.free_tensor(s.a)
    c = f32(s.ctx, 16, "c")
    s.talloc.alloc(c)
    assert c.data == s.a.data  # best fit: the hole 'a' left
    before = s.talloc.snapshot()
    expect_error(lambda: s.talloc.free_tensor(s.a), InvalidStateError, "cannot free 'a' (64 bytes at offset 0)",
                 "in buffer 'CPU'", "not allocated by this allocator (already freed?)",
                 "its bytes now belong to 'c' (64 bytes at offset 0)")
    assert s.talloc.snapshot() == before
    d = f32(s.ctx, 16, "d")
    s.talloc.alloc(d)
    assert d.data != c.data
    assert_talloc_works(s.talloc, s.ctx, [s.b, c, d])


def test_double_free_of_bytes_still_free(s: Setup) -> None:
    s.talloc.free_tensor(s.b)
    before = s.talloc.snapshot()
    expect_error(lambda: s.talloc.free_tensor(s.b), InvalidStateError,
                 "cannot free 'b' (64 bytes at offset 64) in buffer 'CPU': its bytes are free already (a double free")
    assert s.talloc.snapshot() == before
    assert s.talloc.largest_free_block() == 192  # 'b' counted once, merged with the tail
    assert_talloc_works(s.talloc, s.ctx, [s.a])


def test_double_free_in_a_measure_allocator(ctx: Context) -> None:
    talloc = TensorAllocator.new_measure(32)
    a, b = f32(ctx, 8, "ma"), f32(ctx, 8, "mb")
    talloc.alloc(a)
    talloc.alloc(b)
    talloc.free_tensor(a)
    expect_error(lambda: talloc.free_tensor(a), InvalidStateError, "cannot free 'ma' (32 bytes at offset 0)",
                 "in buffer 'measure'", "(a double free")
    c = f32(ctx, 8, "mc")
    talloc.alloc(c)
    assert c.data == a.data and talloc.get_max_size() == 64


def test_free_after_reset(s: Setup) -> None:
    s.talloc.reset()
    expect_error(lambda: s.talloc.free_tensor(s.b), InvalidStateError, "cannot free 'b' (64 bytes at offset 64)",
                 "its bytes are free already (a double free, or the allocator was reset since)")
    assert s.talloc.n_free_blocks == 1 and s.talloc.largest_free_block() == 256
    s.a.data = s.a.buffer = s.b.data = s.b.buffer = None
    s.talloc.alloc(s.a)
    assert_talloc_works(s.talloc, s.ctx, [s.a])


def test_free_a_tensor_of_another_allocator_over_the_same_buffer(s: Setup) -> None:
    other = TensorAllocator.new_from_buffer(s.buf)  # the same 256 bytes, its own free list
    x = f32(s.ctx, 16, "x")
    other.alloc(x)  # at offset 0, over 'a' (the caller's mistake, not ours to see)
    before = s.talloc.snapshot()
    expect_error(lambda: s.talloc.free_tensor(x), InvalidStateError, "cannot free 'x' (64 bytes at offset 0)",
                 "its bytes now belong to 'a'")
    assert s.talloc.snapshot() == before
    other.free_tensor(x)  # its own allocator frees it
    assert_talloc_works(s.talloc, s.ctx, [s.a, s.b])


def test_free_a_tensor_without_memory(s: Setup) -> None:
    never = f32(s.ctx, 4, "never")
    expect_error(lambda: s.talloc.free_tensor(never), NotAllocatedError,
                 "cannot free 'never' in buffer 'CPU': it has no memory (data is None)")
    expect_error(lambda: capi.ggml_tallocr_free_tensor(s.talloc, never), NotAllocatedError, "'never'")
    assert_talloc_works(s.talloc, s.ctx, [s.a, s.b])


def test_free_a_tensor_of_another_buffer_is_ignored(s: Setup, cpu: CPUBackend) -> None:
    """The seed's documented rule (the graph allocator offers it every source, weights included)."""
    wbuf = cpu.alloc_buffer(64)
    w = f32(s.ctx, 16, "w")
    TensorAllocator.new_from_buffer(wbuf).alloc(w)
    before = s.talloc.snapshot()
    s.talloc.free_tensor(w)
    assert s.talloc.snapshot() == before
    assert_talloc_works(s.talloc, s.ctx, [s.a, s.b])
    wbuf.free()


def test_free_in_a_freed_buffer(s: Setup) -> None:
    s.buf.free()
    expect_error(lambda: s.talloc.free_tensor(s.a), BufferFreedError,
                 "cannot free 'a': buffer 'CPU' (256 bytes) of this allocator was freed")


def test_too_many_free_blocks_changes_nothing(cpu: CPUBackend, ctx: Context) -> None:
    buf = cpu.alloc_buffer(512)
    talloc = TensorAllocator.new_from_buffer(buf, max_free_blocks=2)
    ts = [f32(ctx, 16, f"t{i}") for i in range(6)]
    for t in ts:
        talloc.alloc(t)
    talloc.free_tensor(ts[0])  # a hole at 0, and the tail: 2 blocks
    before = talloc.snapshot()
    expect_error(lambda: talloc.free_tensor(ts[2]), LimitExceededError,
                 "cannot free 't2' (64 bytes at offset 128) in buffer 'CPU'", "MAX_FREE_BLOCKS = 2")
    assert talloc.snapshot() == before and talloc.holds(ts[2])
    talloc.free_tensor(ts[1])  # merges with the hole: no new block
    assert_talloc_works(talloc, ctx, ts[2:])


# --- tensor allocator: allocs ---


ALLOC_CASES: list[tuple[str, Callable[[Setup], object], type[GGMLError], tuple[str, ...]]] = [
    ("twice", lambda s: s.talloc.alloc(s.a), ArgumentError,
     ("cannot allocate 'a': it already has memory", "allocated by this allocator at offset 0", "free it first")),
    ("full", lambda s: s.talloc.alloc(f32(s.ctx, 64, "big")), OutOfMemoryError,
     ("not enough space in buffer 'CPU' for 'big' (needed 256 bytes, largest free block 128)",)),
    ("view", lambda s: s.talloc.alloc(s.ctx.view_1d(s.a, 4, 0).set_name("va")), ArgumentError,
     ("cannot allocate view 'va'", "view_src 'a'")),
    ("not-a-tensor", lambda s: s.talloc.alloc(3), ArgumentTypeError,  # type: ignore[arg-type]
     ("tallocr alloc: tensor must be a Tensor", "int 3")),
    ("capi-twice", lambda s: capi.ggml_tallocr_alloc(s.talloc, s.b), ArgumentError,
     ("cannot allocate 'b'", "offset 64")),
    ("capi-full", lambda s: capi.ggml_tallocr_alloc(s.talloc, f32(s.ctx, 40, "wide")), OutOfMemoryError,
     ("'wide' (needed 192 bytes, largest free block 128)",)),
]


@pytest.mark.parametrize("call, cls, fragments", [c[1:] for c in ALLOC_CASES], ids=[c[0] for c in ALLOC_CASES])
def test_bad_alloc(s: Setup, call: Callable[[Setup], object], cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    before = s.talloc.snapshot()
    expect_error(lambda: call(s), cls, *fragments)
    assert s.talloc.snapshot() == before
    assert_talloc_works(s.talloc, s.ctx, [s.a, s.b])


def test_alloc_in_a_freed_buffer(s: Setup) -> None:
    s.buf.free()
    c = f32(s.ctx, 4, "c")
    expect_error(lambda: s.talloc.alloc(c), BufferFreedError,
                 "cannot allocate 'c': buffer 'CPU' (256 bytes) of this allocator was freed")
    assert c.data is None


@pytest.mark.parametrize("kwargs, cls, fragments", [
    ({"alignment": 2.5}, ArgumentTypeError, ("alignment must be an integer", "float 2.5")),
    ({"alignment": 24}, ArgumentError, ("alignment must be a power of 2, got 24",)),
    ({"alignment": 0}, ArgumentError, ("alignment must be a power of 2, got 0",)),
    ({"max_free_blocks": 0}, ArgumentError, ("max_free_blocks must be >= 1, got 0",)),
    ({"max_free_blocks": 1.5}, ArgumentTypeError, ("max_free_blocks must be an integer", "float 1.5")),
], ids=["alignment-float", "alignment-24", "alignment-0", "max-free-blocks-0", "max-free-blocks-float"])
def test_bad_allocator_arguments(cpu: CPUBackend, ctx: Context, kwargs: dict[str, object], cls: type[GGMLError],
                                 fragments: tuple[str, ...]) -> None:
    buf = cpu.alloc_buffer(128)
    expect_error(lambda: TensorAllocator(buf, **kwargs), cls, *fragments)  # type: ignore[arg-type]
    talloc = TensorAllocator(buf, alignment=32)
    assert_talloc_works(talloc, ctx, [])


def test_allocator_over_something_else(cpu: CPUBackend) -> None:
    expect_error(lambda: TensorAllocator(np.zeros(64, np.uint8)), ArgumentTypeError,  # type: ignore[arg-type]
                 "TensorAllocator: buffer must be a Buffer", "ndarray")
    expect_error(lambda: TensorAllocator.new(np.zeros(64, np.uint8), 64.5, 32), ArgumentTypeError,
                 "cpu_buffer_from_ptr: size must be an integer", "float 64.5")
    expect_error(lambda: TensorAllocator.new_from_backend(cpu, -64), ArgumentError,
                 "cannot allocate a buffer of -64 bytes")
    expect_error(lambda: Allocr(object()), ArgumentTypeError, "Allocr: talloc must be a TensorAllocator")  # type: ignore[arg-type]
    assert TensorAllocator.new(np.zeros(64, np.uint8), 64, 1).largest_free_block() == 64


# --- the legacy Allocr ---


def test_allocr_bad_input_leaves_it_usable(cpu: CPUBackend, ctx: Context) -> None:
    al = Allocr.new_from_backend(cpu, 256)
    x = f32(ctx, 16, "x")
    al.alloc(x)
    expect_error(lambda: al.alloc(x), ArgumentError, "cannot allocate 'x'", "already has memory")
    expect_error(lambda: capi.ggml_allocr_alloc(al, f32(ctx, 64, "huge")), OutOfMemoryError,
                 "'huge' (needed 256 bytes, largest free block 192)")
    expect_error(lambda: capi.ggml_allocr_set_parse_seq(al, [0, 1.5]), ArgumentTypeError,
                 "parse_seq entry must be an integer", "float 1.5")
    expect_error(lambda: capi.ggml_allocr_set_parse_seq(al, [0, -1], 3), ArgumentError,
                 "parse_seq: n must be <= 2, got 3")
    # still usable: a graph over the rest of the buffer, x an input placed first
    y = ctx.cont(ctx.scale(x, 2.0)).set_name("y")  # the scale in place over x, the cont at 64
    g = Graph(16)
    g.build_forward_expand(y)
    assert al.alloc_graph(g) == 128
    tensor_set_numpy(x, np.arange(16, dtype=np.float32))
    cpu.graph_compute(g)
    assert tensor_get_numpy(y).tolist() == [2.0 * i for i in range(16)]
    al.free()
    al.free()  # idempotent
    expect_error(lambda: al.alloc(f32(ctx, 4, "late")), BufferFreedError, "cannot allocate 'late'",
                 "buffer 'CPU' (256 bytes) of this allocator was freed")


# --- the graph allocator ---


def chain(ctx: Context, n: int = 16) -> tuple[Tensor, Tensor, Graph]:
    """e = cont(scale(cont(x), 2)) + x = 3 x, with x an input placed first: x (64 bytes) at 0, gb at 64, gc
    in place over gb, gd at 128, ge in place over gd: 192 bytes."""
    x = f32(ctx, n, "gx")
    b = ctx.cont(x).set_name("gb")
    c = ctx.scale(b, 2.0).set_name("gc")
    d = ctx.cont(c).set_name("gd")
    e = ctx.add(d, x).set_name("ge")
    g = Graph(32)
    g.build_forward_expand(e)
    return x, e, g


def run_chain(cpu: CPUBackend, galloc: GraphAllocator, size: int = 512) -> None:
    """A fresh chain allocated by `galloc` in a new buffer and computed: e = 3 x."""
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    x, e, g = chain(ctx)
    buf = cpu.alloc_buffer(size)
    talloc = TensorAllocator.new_from_buffer(buf)
    talloc.alloc(x)
    assert galloc.alloc_graph(talloc, g) == 192
    tensor_set_numpy(x, np.arange(16, dtype=np.float32))
    cpu.graph_compute(g)
    assert tensor_get_numpy(e).tolist() == [3.0 * i for i in range(16)]
    buf.free()


def test_graph_reading_a_freed_buffer(cpu: CPUBackend, ctx: Context) -> None:
    wbuf = cpu.alloc_buffer(128)
    w = f32(ctx, 16, "weight")
    TensorAllocator.new_from_buffer(wbuf).alloc(w)
    y = ctx.scale(w, 2.0).set_name("y")
    g = Graph(16)
    g.build_forward_expand(y)
    wbuf.free()
    talloc = TensorAllocator.new_measure(64)
    before = talloc.snapshot()
    galloc = GraphAllocator()
    expect_error(lambda: galloc.alloc_graph(talloc, g), BufferFreedError,
                 "alloc_graph: tensor 'weight' is in buffer 'CPU' (128 bytes), which was freed")
    assert talloc.snapshot() == before and y.data is None
    run_chain(cpu, galloc)


def test_graph_allocator_of_a_freed_buffer(cpu: CPUBackend, ctx: Context) -> None:
    _, _, g = chain(ctx)
    buf = cpu.alloc_buffer(512)
    talloc = TensorAllocator.new_from_buffer(buf)
    buf.free()
    galloc = GraphAllocator()
    expect_error(lambda: galloc.alloc_graph(talloc, g), BufferFreedError,
                 "alloc_graph: buffer 'CPU' (512 bytes) of the tensor allocator was freed")
    assert all(n.data is None for n in g.nodes)
    run_chain(cpu, galloc)


def test_graph_with_an_input_freed_or_reset(cpu: CPUBackend, ctx: Context) -> None:
    """An input whose bytes its allocator gave back: the pass would hand them to the graph's nodes."""
    x, _, g = chain(ctx)
    buf = cpu.alloc_buffer(512)
    talloc = TensorAllocator.new_from_buffer(buf)
    talloc.alloc(x)
    talloc.reset()
    galloc = GraphAllocator()
    expect_error(lambda: galloc.alloc_graph(talloc, g), InvalidStateError,
                 "alloc_graph: tensor 'gx' has memory at offset 0 of buffer 'CPU'",
                 "its tensor allocator does not hold (freed, or allocated before reset())")
    assert all(n.data is None for n in g.nodes) and talloc.largest_free_block() == 512
    x.data = x.buffer = None  # placed again, the same graph allocates
    talloc.alloc(x)
    galloc.alloc_graph(talloc, g)
    buf.free()
    run_chain(cpu, galloc)


@pytest.mark.parametrize("size, fragments", [
    (64, ("not enough space in buffer 'CPU' for 'gb' (needed 64 bytes, largest free block 0)",)),
    (128, ("for 'gd' (needed 64 bytes, largest free block 0)",)),
], ids=["fails-at-the-first-node", "fails-halfway"])
def test_graph_pass_failing_halfway_rolls_back(cpu: CPUBackend, ctx: Context, size: int,
                                               fragments: tuple[str, ...]) -> None:
    x, _, g = chain(ctx)
    buf = cpu.alloc_buffer(size)
    talloc = TensorAllocator.new_from_buffer(buf)
    talloc.alloc(x)
    before = talloc.snapshot()
    galloc = GraphAllocator()
    expect_error(lambda: galloc.alloc_graph(talloc, g), OutOfMemoryError, *fragments)
    # the allocator and every tensor are as they were: no node has memory, 'gc' is no view of 'gb'
    assert talloc.snapshot() == before and talloc.holds(x)
    assert all(n.data is None and n.buffer is None for n in g.nodes)
    assert g.nodes[1].view_src is None
    # the same allocators take a valid pass afterwards: the same graph in a buffer of the right size
    buf.free()
    x.data = x.buffer = None
    buf = cpu.alloc_buffer(256)
    talloc = TensorAllocator.new_from_buffer(buf)
    talloc.alloc(x)
    assert galloc.alloc_graph(talloc, g) == 192
    tensor_set_numpy(x, np.arange(16, dtype=np.float32))
    cpu.graph_compute(g)
    assert tensor_get_numpy(g.nodes[-1]).tolist() == [3.0 * i for i in range(16)]
    buf.free()


def test_graph_pass_out_of_free_blocks_rolls_back(cpu: CPUBackend, ctx: Context) -> None:
    srcs = [f32(ctx, 16, f"l{i}") for i in range(4)]
    outs = [ctx.cont(t).set_name(f"o{i}") for i, t in enumerate(srcs)]
    total = outs[0]
    for o in outs[1:]:
        total = ctx.add(total, o)
    g = Graph(64)
    g.build_forward_expand(total)
    conts = [i for i, n in enumerate(g.nodes) if n.op == GGMLOp.CONT]
    adds = [i for i, n in enumerate(g.nodes) if n.op == GGMLOp.ADD]
    talloc = TensorAllocator.new_measure(64, max_free_blocks=2)
    galloc = GraphAllocator()
    galloc.set_parse_seq([*conts, -1, *adds, -1])  # every leaf freed at one barrier: holes
    expect_error(lambda: galloc.alloc_graph(talloc, g), LimitExceededError, "cannot free 'l1' (64 bytes at offset",
                 "in buffer 'measure'", "MAX_FREE_BLOCKS = 2")
    assert all(t.data is None for t in [*srcs, *g.nodes]) and talloc.n_free_blocks == 1
    assert talloc.allocated == {}
    galloc.set_parse_seq([])
    run_chain(cpu, galloc)


GALLOC_ARG_CASES: list[tuple[str, Callable[[GraphAllocator, Graph], object], type[GGMLError], tuple[str, ...]]] = [
    ("talloc-int", lambda ga, g: ga.alloc_graph(7, g), ArgumentTypeError,  # type: ignore[arg-type]
     ("alloc_graph: talloc must be a TensorAllocator", "int 7")),
    ("graph-list", lambda ga, g: ga.alloc_graph(TensorAllocator.new_measure(32), list(g.nodes)), ArgumentTypeError,
     ("alloc_graph: graph must be a Graph", "list")),
    ("parse-seq-float", lambda ga, g: ga.set_parse_seq([0, 1.0]), ArgumentTypeError,
     ("parse_seq entry must be an integer", "float 1.0")),
    ("parse-seq-minus-two", lambda ga, g: ga.set_parse_seq([0, -2]), ArgumentError,
     ("parse_seq entries are node indices or -1 (a barrier), got -2",)),
    ("parse-seq-past-end",
     lambda ga, g: (ga.set_parse_seq([0, 9, -1]), ga.alloc_graph(TensorAllocator.new_measure(32), g)), GraphError,
     ("parse_seq names node 9, but the graph has 4 nodes",)),
    ("impl-without-pass", lambda ga, g: capi.ggml_tallocr_alloc_graph_impl(ga, g), InvalidStateError,
     ("ggml_tallocr_alloc_graph_impl: the graph allocator has no pass in progress",)),
    ("capi-talloc-str", lambda ga, g: capi.ggml_gallocr_alloc_graph(ga, "t", g), ArgumentTypeError,  # type: ignore[arg-type]
     ("talloc must be a TensorAllocator", "str 't'")),
]


@pytest.mark.parametrize("call, cls, fragments", [c[1:] for c in GALLOC_ARG_CASES],
                         ids=[c[0] for c in GALLOC_ARG_CASES])
def test_graph_allocator_bad_arguments(cpu: CPUBackend, ctx: Context, call: Callable[[GraphAllocator, Graph], object],
                                       cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    _, _, g = chain(ctx)
    galloc = GraphAllocator()
    expect_error(lambda: call(galloc, g), cls, *fragments)
    assert all(n.data is None for n in g.nodes)
    galloc.set_parse_seq([])
    run_chain(cpu, galloc)


def test_view_outside_its_source_buffer_rolls_back(cpu: CPUBackend, ctx: Context) -> None:
    """A pre-placed view whose address lies past its source's buffer: init_tensor refuses it and the pass
    is undone."""
    x, _, g = chain(ctx)
    wbuf = cpu.alloc_buffer(64)
    w = f32(ctx, 16, "w")
    TensorAllocator.new_from_buffer(wbuf).alloc(w)
    v = ctx.view_1d(w, 16, 0).set_name("wv")
    v.view_offs = 32  # corrupt: 64 bytes from offset 32 of a 64-byte buffer
    v_data = v.data  # set when the view was made (its source had memory); init_view recomputes it
    y = ctx.add(v, ctx.scale(x, 1.0)).set_name("wy")
    g2 = Graph(32)
    g2.build_forward_expand(y)
    buf = cpu.alloc_buffer(512)
    talloc = TensorAllocator.new_from_buffer(buf)
    talloc.alloc(x)
    before = talloc.snapshot()
    galloc = GraphAllocator()
    expect_error(lambda: galloc.alloc_graph(talloc, g2), OutOfBoundsError,
                 "init_tensor: 64 bytes of 'wv' at offset 32 are outside its 64 bytes of buffer 'CPU'")
    assert talloc.snapshot() == before and v.data == v_data and v.buffer is None
    galloc.alloc_graph(talloc, g)
    tensor_set_numpy(x, np.ones(16, np.float32))
    cpu.graph_compute(g)
    assert tensor_get_numpy(g.nodes[-1]).tolist() == [3.0] * 16
    buf.free()
    wbuf.free()
