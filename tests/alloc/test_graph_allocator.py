"""GraphAllocator decisions checked offset by offset against the seed's ggml_gallocr."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import Context, GGMLType
from pyggml.alloc.graph_allocator import GraphAllocator, op_can_inplace
from pyggml.alloc.hash_set import HashSet
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import ArgumentError, GraphError, LimitExceededError, OutOfMemoryError
from pyggml.core.tensor import GGMLOp, Tensor


class RecordingAllocator(TensorAllocator):
    """A measure allocator that records which tensors the graph allocator frees, in order."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.freed: list[str] = []

    def free_tensor(self, tensor: Tensor) -> None:
        if self.is_own(tensor):
            self.freed.append(tensor.name)
        super().free_tensor(tensor)


def measure(alignment: int = 32) -> TensorAllocator:
    return TensorAllocator.new_measure(alignment)


def recording(alignment: int = 32) -> RecordingAllocator:
    from pyggml.alloc.tensor_allocator import MEASURE_BASE, SIZE_MAX, MeasureBuffer

    return RecordingAllocator(MeasureBuffer(MEASURE_BASE, SIZE_MAX // 2), buffer_owned=True, alignment=alignment,
                              measure=True)


def leaf(ctx: Context, n: int, name: str) -> Tensor:
    return ctx.new_tensor_1d(GGMLType.F32, n).set_name(name)


def graph_of(ctx: Context, out: Tensor):
    g = ctx.new_graph()
    g.build_forward_expand(out)
    return g


def off(talloc: TensorAllocator, t: Tensor) -> int:
    assert t.data is not None
    return t.data - talloc.base


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 20, no_alloc=True)


def test_hash_set_by_identity(ctx: Context) -> None:
    a, b = leaf(ctx, 4, "a"), leaf(ctx, 4, "b")
    hs = HashSet(5)
    assert hs.find(a) is None
    assert hs.find_or_insert(a) == 0
    assert hs.find_or_insert(b) == 1
    assert hs.find_or_insert(a) == 0
    assert hs.find(b) == 1
    assert hs.size == 5
    assert hs.tensors() == [a, b]
    for i in range(3):
        hs.find_or_insert(leaf(ctx, 1, f"x{i}"))
    with pytest.raises(GraphError):
        hs.find_or_insert(leaf(ctx, 1, "one too many"))


def test_op_can_inplace_list() -> None:
    seed = {"SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG",
            "UNARY", "ROPE", "RMS_NORM", "SOFT_MAX"}
    # ggml-alloc.c's ggml_op_can_inplace at llama.cpp 0c1e570: the seed's list and seven more
    today = seed | {"FILL", "ADD_ID", "ROPE_BACK", "SILU_BACK", "RMS_NORM_BACK", "CLAMP", "SOFT_MAX_BACK"}
    assert {op.name for op in GGMLOp if op_can_inplace(op)} == today


def test_free_after_last_consumer_and_reuse(ctx: Context) -> None:
    # CONT cannot run in place: each node takes a new block, a source is freed once its consumer ran
    a = leaf(ctx, 32, "a")  # 128 bytes
    b = ctx.cont(a).set_name("b")
    c = ctx.cont(b).set_name("c")
    d = ctx.cont(c).set_name("d")
    talloc = recording()
    size = GraphAllocator().alloc_graph(talloc, graph_of(ctx, d))
    # a at 0, b at 128, a freed; c best-fits a's hole; b freed merges into the tail; d at 128
    assert [off(talloc, t) for t in (a, b, c, d)] == [0, 128, 0, 128]
    assert talloc.freed == ["a", "b", "c"]
    assert size == 256 == talloc.get_max_size()
    # d (the output) is never freed: the blocks are c's hole and the tail after d
    assert [(blk.addr - talloc.base, blk.size) for blk in talloc.free_blocks[:1]] == [(0, 128)]
    assert talloc.free_blocks[1].addr - talloc.base == 256


def test_inplace_reuse_of_owned_single_child_parent(ctx: Context) -> None:
    x = leaf(ctx, 32, "x")
    y = ctx.scale(x, 2.0).set_name("y")  # SCALE can run in place; x has one child, no views
    z = ctx.cont(y).set_name("z")
    w = ctx.cont(z).set_name("w")
    talloc = recording()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, w))
    assert y.view_src is x and y.data == x.data
    assert [off(talloc, t) for t in (x, y, z, w)] == [0, 0, 128, 0]
    # x is freed once y (its in-place view) has been consumed by z, never under its own name twice
    assert talloc.freed == ["x", "z"]


def test_no_inplace_when_parent_has_two_children_or_another_layout(ctx: Context) -> None:
    x = leaf(ctx, 32, "x")
    y = ctx.scale(x, 2.0).set_name("y")  # x also read by `s` below: no reuse
    s = ctx.add(y, x).set_name("s")  # y has one child, same layout: s reuses y (src[0])
    talloc = measure()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, s))
    assert y.view_src is None and off(talloc, y) == 128
    assert s.view_src is y and s.data == y.data

    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    m = ctx2.new_tensor_2d(GGMLType.F32, 4, 8).set_name("m")
    mt = ctx2.cont(m).set_name("mt")
    t = ctx2.transpose(mt).set_name("t")  # a view with permuted strides
    sq = ctx2.sqr(t).set_name("sq")  # result has contiguous strides: layout differs from t
    talloc2 = measure()
    GraphAllocator().alloc_graph(talloc2, graph_of(ctx2, sq))
    assert sq.view_src is None
    assert [off(talloc2, u) for u in (m, mt, sq)] == [0, 128, 0]


def test_inplace_never_reuses_external_memory(ctx: Context) -> None:
    backend = cpu_init()
    wbuf = backend.alloc_buffer(256)
    w = leaf(ctx, 32, "w")
    TensorAllocator.new_from_buffer(wbuf).alloc(w)  # a weight in another buffer
    w_data = w.data
    y = ctx.scale(w, 2.0).set_name("y")
    z = ctx.cont(y).set_name("z")
    talloc = recording()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, z))
    assert y.view_src is None and off(talloc, y) == 0
    assert w.data == w_data and w.buffer is wbuf
    assert talloc.freed == ["y"]  # the weight is offered to free_tensor but is not the allocator's
    wbuf.free()


def test_view_parent_reused_only_at_offset_zero(ctx: Context) -> None:
    a = leaf(ctx, 64, "a")  # 256 bytes
    x = ctx.cont(a).set_name("x")
    v0 = ctx.view_1d(x, 32, 0).set_name("v0")
    s0 = ctx.scale(v0, 2.0).set_name("s0")
    talloc = measure()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, s0))
    # v0 starts at x's memory and is x's only view: s0 becomes a view of x itself
    assert s0.view_src is x and s0.data == x.data == v0.data
    assert off(talloc, x) == 256

    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    a = leaf(ctx2, 64, "a")
    x = ctx2.cont(a).set_name("x")
    v1 = ctx2.view_1d(x, 32, 128).set_name("v1")
    s1 = ctx2.scale(v1, 2.0).set_name("s1")
    talloc = measure()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx2, s1))
    # at offset 128 the memory could not be freed later: s1 gets a block of its own (a's freed hole)
    assert s1.view_src is None
    assert off(talloc, x) == 256 and v1.data == x.data + 128 and off(talloc, s1) == 0


def test_view_source_freed_after_last_view_and_child(ctx: Context) -> None:
    a = leaf(ctx, 64, "a")  # 256 bytes
    x = ctx.cont(a).set_name("x")
    v = ctx.view_1d(x, 32, 128).set_name("v")  # a node (VIEW) reading x
    c = ctx.cont(v).set_name("c")
    d = ctx.cont(c).set_name("d")
    talloc = recording()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, d))
    # x's own child (the view node) is done before c runs, but the view still needs x: x goes after c
    assert talloc.freed == ["a", "x", "c"]
    assert [off(talloc, t) for t in (a, x, c, d)] == [0, 256, 0, 128]
    assert v.data == x.data + 128 and v.buffer is talloc.buffer


def test_parse_seq_frees_only_at_barriers(ctx: Context) -> None:
    a = leaf(ctx, 32, "a")
    n0 = ctx.cont(a).set_name("n0")
    n1 = ctx.cont(n0).set_name("n1")
    n2 = ctx.cont(n1).set_name("n2")
    g = graph_of(ctx, n2)

    galloc = GraphAllocator()
    galloc.set_parse_seq([0, 1, -1, 2, -1])
    talloc = recording()
    galloc.alloc_graph(talloc, g)
    # n0 and n1 run between barriers: nothing is freed until the first -1, so n1 cannot take a's block
    assert [off(talloc, t) for t in (a, n0, n1, n2)] == [0, 128, 256, 0]
    assert talloc.freed == ["a", "n0", "n1"]
    assert talloc.get_max_size() == 384

    # the same graph without barriers reuses at once
    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    a = leaf(ctx2, 32, "a")
    n0 = ctx2.cont(a)
    n1 = ctx2.cont(n0)
    n2 = ctx2.cont(n1)
    talloc = measure()
    assert GraphAllocator().alloc_graph(talloc, graph_of(ctx2, n2)) == 256
    assert [off(talloc, t) for t in (a, n0, n1, n2)] == [0, 128, 0, 128]


def test_parse_seq_without_final_barrier_keeps_last_sources(ctx: Context) -> None:
    a = leaf(ctx, 32, "a")
    n0 = ctx.cont(a).set_name("n0")
    n1 = ctx.cont(n0).set_name("n1")
    galloc = GraphAllocator()
    galloc.set_parse_seq([0, -1, 1])
    talloc = recording()
    galloc.alloc_graph(talloc, graph_of(ctx, n1))
    assert talloc.freed == ["a"]  # as in the seed: the segment after the last barrier frees nothing
    assert [off(talloc, t) for t in (a, n0, n1)] == [0, 128, 0]


def test_parse_seq_bad_entries(ctx: Context) -> None:
    galloc = GraphAllocator()
    with pytest.raises(ArgumentError):
        galloc.set_parse_seq([0, -2])
    a = leaf(ctx, 4, "a")
    b = ctx.cont(a)
    galloc.set_parse_seq([0, 5, -1])
    talloc = measure()
    with pytest.raises(GraphError, match="node 5"):
        galloc.alloc_graph(talloc, graph_of(ctx, b))
    assert a.data is None and b.data is None
    galloc.set_parse_seq([])
    galloc.alloc_graph(talloc, graph_of(ctx, b))
    assert b.data is not None


def test_context_memory_and_views_of_it_are_left_alone() -> None:
    # tensors with memory of a Context (no buffer) are pre-allocated: used where they are, never freed
    wctx = Context(mem_size=1 << 16, no_alloc=False)
    w = wctx.new_tensor_1d(GGMLType.F32, 64).set_name("w")
    wv = wctx.view_1d(w, 32, 128).set_name("wv")  # a view made after w had memory: data, no buffer
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    y = ctx.scale(wv, 3.0).set_name("y")
    talloc = recording()
    GraphAllocator().alloc_graph(talloc, graph_of(ctx, y))
    assert wv.data == w.data + 128 and w.buffer is None
    assert y.view_src is None and off(talloc, y) == 0
    assert talloc.freed == []


def test_alloc_graph_n_with_an_allocator_per_tensor(ctx: Context) -> None:
    a = leaf(ctx, 32, "a")
    b = ctx.cont(a).set_name("b")
    c = ctx.cont(b).set_name("c")
    d = ctx.cont(c).set_name("d")
    g = graph_of(ctx, d)
    t1, t2 = measure(), measure()
    hs = HashSet.for_graph(g.n_nodes + g.n_leafs)
    allocs: list[TensorAllocator | None] = [None] * hs.size
    # a, b on t1; c, d on t2 (as the scheduler maps tensors to their backend's allocator)
    for t, ta in ((a, t1), (b, t1), (c, t2), (d, t2)):
        allocs[hs.find_or_insert(t)] = ta
    GraphAllocator().alloc_graph_n(g, hs, allocs)
    assert (a.buffer, b.buffer, c.buffer, d.buffer) == (t1.buffer, t1.buffer, t2.buffer, t2.buffer)
    assert [off(t1, a), off(t1, b), off(t2, c), off(t2, d)] == [0, 128, 0, 128]
    assert t1.get_max_size() == 256 and t2.get_max_size() == 256

    with pytest.raises(GraphError, match="hash set"):
        GraphAllocator().alloc_graph_n(g, HashSet(2), allocs)


def test_full_buffer_rolls_back_and_allocator_stays_usable(ctx: Context) -> None:
    backend = cpu_init()
    a = leaf(ctx, 32, "a")
    b = ctx.cont(a).set_name("b")
    c = ctx.scale(b, 2.0).set_name("c")  # in place over b
    d = ctx.cont(c).set_name("d")
    e = ctx.cont(d).set_name("e")
    g = graph_of(ctx, e)
    buf = backend.alloc_buffer(200)  # the graph needs 256 bytes (a 128 + b 128)
    talloc = TensorAllocator.new_from_buffer(buf)
    before = talloc.snapshot()
    galloc = GraphAllocator()
    with pytest.raises(OutOfMemoryError, match=r"needed 128 bytes, largest free block 72"):
        galloc.alloc_graph(talloc, g)
    # every tensor and the tensor allocator are as they were
    assert talloc.snapshot() == before
    for t in (a, b, c, d, e):
        assert t.data is None and t.buffer is None
    assert c.view_src is None
    buf.free()

    # the same objects allocate fine in a buffer of the measured size
    m = TensorAllocator.new_measure_from_backend(backend)
    need = galloc.alloc_graph(m, g)
    m.free()
    for t in (a, b, c, d, e):  # undo the measure pass's fake addresses
        t.data, t.buffer, t.view_src = None, None, None
    buf = backend.alloc_buffer(need)
    talloc = TensorAllocator.new_from_buffer(buf)
    assert galloc.alloc_graph(talloc, g) == need == 256
    assert c.view_src is b
    buf.free()


def test_too_many_free_blocks_rolls_back(ctx: Context) -> None:
    # many sources freed at one barrier while later blocks stay in use fragment the buffer
    srcs = [leaf(ctx, 8, f"l{i}") for i in range(6)]
    outs = [ctx.cont(s).set_name(f"o{i}") for i, s in enumerate(srcs)]
    total = outs[0]
    for o in outs[1:]:
        total = ctx.add(total, o)
    g = graph_of(ctx, total)
    # every cont first (l_i, o_i alternate in memory), then one barrier frees all the l_i: 6 holes
    conts = [i for i, n in enumerate(g.nodes) if n.op == GGMLOp.CONT]
    adds = [i for i, n in enumerate(g.nodes) if n.op == GGMLOp.ADD]
    talloc = TensorAllocator.new_measure(32, max_free_blocks=2)
    galloc = GraphAllocator()
    galloc.set_parse_seq([*conts, -1, *adds, -1])
    with pytest.raises(LimitExceededError, match="MAX_FREE_BLOCKS = 2"):
        galloc.alloc_graph(talloc, g)
    assert all(t.data is None and t.view_src is None for t in srcs + outs + [total])
    assert talloc.n_free_blocks == 1 and talloc.max_size == 0
    ok = TensorAllocator.new_measure(32)
    assert galloc.alloc_graph(ok, g) > 0


def test_view_of_unallocated_source_is_an_error(ctx: Context) -> None:
    a = leaf(ctx, 8, "a")
    v = ctx.view_1d(a, 4, 0).set_name("v")
    # a graph view holding only the consumer of v: v's source a is never allocated before v
    c = ctx.cont(v).set_name("c")
    g = graph_of(ctx, c).view(1, 2)
    with pytest.raises(GraphError, match="'v'.*'a' has no memory"):
        GraphAllocator().alloc_graph(measure(), g)
    assert v.data is None and c.data is None


@pytest.mark.slow
def test_measure_then_exact_real_buffer_computes(ctx: Context, rng: np.random.Generator) -> None:
    """A small attention block: measured, allocated in exactly that many bytes, computed right."""
    from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set

    backend = cpu_init()
    n_embd, n_tok = 16, 4

    def build(c: Context):
        x = c.new_tensor_2d(GGMLType.F32, n_embd, n_tok).set_name("x")
        wq = c.new_tensor_2d(GGMLType.F32, n_embd, n_embd).set_name("wq")
        wk = c.new_tensor_2d(GGMLType.F32, n_embd, n_embd).set_name("wk")
        h = c.rms_norm(x, 1e-5)
        q = c.mul_mat(wq, h)
        k = c.mul_mat(wk, h)
        kq = c.mul_mat(k, q)
        kq = c.soft_max(c.scale(kq, 0.25))
        out = c.add(c.mul_mat(c.cont(c.transpose(h)), kq), x)
        g = c.new_graph()
        g.build_forward_expand(out)
        return g, (x, wq, wk), out

    g, inputs, _ = build(ctx)
    m = TensorAllocator.new_measure_from_backend(backend)
    for t in inputs:  # inputs allocated first in both passes, as llama.cpp does, so the plans are equal
        m.alloc(t)
    need = GraphAllocator().alloc_graph(m, g)
    m.free()

    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    g2, (x, wq, wk), out = build(ctx2)
    buf = backend.alloc_buffer(need)
    talloc = TensorAllocator.new_from_buffer(buf)
    galloc = GraphAllocator()
    for t in (x, wq, wk):
        talloc.alloc(t)
    xs = rng.standard_normal((n_tok, n_embd)).astype(np.float32)
    wqs = rng.standard_normal((n_embd, n_embd)).astype(np.float32)
    wks = rng.standard_normal((n_embd, n_embd)).astype(np.float32)
    for t, v in ((x, xs), (wq, wqs), (wk, wks)):
        tensor_set(t, v)
    galloc.alloc_graph(talloc, g2)
    assert talloc.get_max_size() == need
    backend.graph_compute(g2)
    got = tensor_get_numpy(out).reshape(n_tok, n_embd)

    h = xs / np.sqrt((xs * xs).mean(axis=1, keepdims=True) + 1e-5)
    q = h @ wqs.T
    k = h @ wks.T
    kq = (q @ k.T) * 0.25  # kq[t, s] over keys s, rows t
    kq = np.exp(kq - kq.max(axis=1, keepdims=True))
    kq /= kq.sum(axis=1, keepdims=True)
    ref = kq @ h + xs
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    buf.free()
