"""Property tests: random alloc/free sequences and random graphs, checked against invariants and a reference.

TensorAllocator: live tensors never overlap, stay inside the buffer, free
blocks stay sorted and merged, every byte is either free or live, and after
freeing everything one block covers the buffer again.

GraphAllocator: for random DAGs (elementwise ops, mul_mat, views, transposes,
reshapes) allocated in a real CPU buffer of exactly the measured size, no two
tensors alive at the same step share bytes (liveness computed here, from the
graph), every tensor lies inside the buffer, and the computed outputs equal
those of the same graph with every tensor in memory of its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from pyggml import Context, GGMLType
from pyggml.alloc import MAX_FREE_BLOCKS, GraphAllocator, TensorAllocator
from pyggml.alloc.tensor_allocator import aligned_offset
from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.backend import graph_compute_with_ctx
from pyggml.core.errors import ArgumentError, LimitExceededError, OutOfMemoryError
from pyggml.core.tensor import VIEW_OPS, Tensor, TensorFlag
from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set_numpy
from pyggml.seed.allocr import Allocr

BACKEND = cpu_init(1)

# --- TensorAllocator: random alloc/free sequences ---

alloc_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 300)),  # elements (F32)
        st.tuples(st.just("free"), st.floats(0, 1, exclude_max=True)),  # which live tensor
    ),
    min_size=1,
    max_size=60,
)


def check_tallocr_invariants(talloc: TensorAllocator, live: list[Tensor], buffer_size: int) -> None:
    base = talloc.base
    start = base + aligned_offset(base, 0, talloc.alignment)
    end = base + buffer_size
    spans = sorted((t.data, t.data + talloc.alloc_size(t), t.name) for t in live)
    for lo, hi, name in spans:
        assert start <= lo and hi <= end, f"{name} [{lo - base}, {hi - base}) outside the buffer"
    for (_lo0, hi0, n0), (lo1, _hi1, n1) in zip(spans, spans[1:], strict=False):
        assert hi0 <= lo1, f"{n0} and {n1} overlap"
    blocks = [(b.addr, b.addr + b.size) for b in talloc.free_blocks]
    for (_lo0, hi0), (lo1, _) in zip(blocks, blocks[1:], strict=False):
        assert hi0 < lo1, "free blocks must be sorted, disjoint and merged"
    for lo, hi in blocks:
        assert start <= lo and hi <= end
        for tlo, thi, name in spans:
            assert hi <= tlo or thi <= lo, f"free block overlaps {name}"
    # every byte is free or live (aligned sizes tile the buffer)
    assert sum(hi - lo for lo, hi in blocks) + sum(hi - lo for lo, hi, _ in spans) == end - start


@settings(max_examples=100, deadline=None)
@given(ops=alloc_ops, max_free_blocks=st.sampled_from([3, 8, MAX_FREE_BLOCKS]))
def test_random_alloc_free_sequences(ops: list[tuple[str, float]], max_free_blocks: int) -> None:
    size = 4096
    buf = BACKEND.alloc_buffer(size)
    talloc = TensorAllocator.new_from_buffer(buf, max_free_blocks=max_free_blocks)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    live: list[Tensor] = []
    try:
        for i, (kind, arg) in enumerate(ops):
            before = talloc.snapshot()
            if kind == "alloc":
                t = ctx.new_tensor_1d(GGMLType.F32, int(arg)).set_name(f"t{i}")
                try:
                    talloc.alloc(t)
                except OutOfMemoryError as e:
                    assert f"needed {talloc.alloc_size(t)} bytes, largest free block" in str(e)
                    assert talloc.largest_free_block() < talloc.alloc_size(t)
                    assert talloc.snapshot() == before and t.data is None
                    continue
                # the bytes are real memory of the buffer
                tensor_set_numpy(t, np.full(t.ne[0], i, dtype=np.float32))
                live.append(t)
            elif live:
                t = live[int(float(arg) * len(live))]
                try:
                    talloc.free_tensor(t)
                except LimitExceededError:
                    assert talloc.snapshot() == before and talloc.n_free_blocks == max_free_blocks
                    continue
                live.remove(t)
            check_tallocr_invariants(talloc, live, size)
        # live tensors kept their values (nothing else was placed over them)
        for t in live:
            assert np.all(tensor_get_numpy(t) == float(t.name[1:]))
        # freed bytes are reusable: after freeing everything one block covers the buffer
        talloc.max_free_blocks = MAX_FREE_BLOCKS
        for t in live:
            talloc.free_tensor(t)
        assert talloc.n_free_blocks == 1
        assert talloc.free_blocks[0].addr == talloc.base and talloc.free_blocks[0].size == size
        whole = ctx.new_tensor_1d(GGMLType.F32, size // 4)
        talloc.alloc(whole)
        assert whole.data == talloc.base
    finally:
        buf.free()


# --- GraphAllocator: random graphs ---

DIMS = (4, 8)

op_recipe = st.tuples(
    st.sampled_from(["scale", "sqr", "silu", "rms_norm", "soft_max", "add", "mul", "sub", "mul_mat",
                     "transpose", "cont", "view_rows", "reshape"]),
    st.floats(0, 1, exclude_max=True),
    st.floats(0, 1, exclude_max=True),
    st.booleans(),
)
graph_recipe = st.tuples(
    st.lists(st.tuples(st.sampled_from(DIMS), st.sampled_from(DIMS)), min_size=1, max_size=3),  # leaf shapes
    st.lists(op_recipe, min_size=4, max_size=32),
)


def pick(cands: list[Tensor], frac: float) -> Tensor | None:
    return cands[int(frac * len(cands))] if cands else None


def build(ctx: Context, recipe: tuple) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """The graph of `recipe` in `ctx`: (leafs, every tensor, sinks). Deterministic in the recipe."""
    leaf_shapes, ops = recipe
    leafs = [ctx.new_tensor_2d(GGMLType.F32, ne0, ne1).set_name(f"in{i}").set_input()
             for i, (ne0, ne1) in enumerate(leaf_shapes)]
    pool: list[Tensor] = list(leafs)
    for k, (kind, f0, f1, flag) in enumerate(ops):
        cont = [t for t in pool if t.is_contiguous()]
        a = pick(cont, f0)
        out: Tensor | None = None
        if a is None:
            continue
        if kind == "scale":
            out = ctx.scale(a, 0.5 if flag else 2.0)
        elif kind == "sqr":
            out = ctx.sqr(a)
        elif kind == "silu":
            out = ctx.silu(a)
        elif kind == "rms_norm":
            out = ctx.rms_norm(a, 1e-5)
        elif kind == "soft_max":
            out = ctx.soft_max(a)
        elif kind in ("add", "mul", "sub"):
            b = pick([t for t in cont if t.ne == a.ne], f1)
            assert b is not None  # a itself qualifies
            out = getattr(ctx, kind)(a, b) if flag else getattr(ctx, kind)(b, a)
        elif kind == "mul_mat":
            b = pick([t for t in cont if t.ne[0] == a.ne[0] and t.ne[2] == a.ne[2] and t.ne[3] == a.ne[3]], f1)
            assert b is not None
            out = ctx.mul_mat(a, b)
        elif kind == "transpose":
            out = ctx.transpose(pick(pool, f0))
        elif kind == "cont":
            noncont = [t for t in pool if not t.is_contiguous()]
            out = ctx.cont(pick(noncont, f1) if noncont else a)
        elif kind == "view_rows":
            if a.ne[1] < 2:
                continue
            half = a.ne[1] // 2
            offset = (a.ne[1] - half) * a.nb[1] if flag else 0
            out = ctx.view_2d(a, a.ne[0], half, a.nb[1], offset)
        elif kind == "reshape":
            out = ctx.reshape_2d(a, a.ne[1], a.ne[0])
        assert out is not None
        out.set_name(f"{kind}{k}")
        pool.append(out)
    consumed = {id(s) for t in pool for s in t.src if s is not None}
    sinks = [t for t in pool[len(leafs):] if id(t) not in consumed]
    return leafs, pool, sinks


def leaf_values(leafs: list[Tensor], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((t.ne[1], t.ne[0])).astype(np.float32) for t in leafs]


def make_graph(ctx: Context, sinks: list[Tensor]):
    g = ctx.new_graph(256)
    for t in sinks:
        t.set_output()
        g.build_forward_expand(t)
    return g


def check_no_live_overlap(graph, buffer) -> None:
    """No two tensors alive at one step share bytes; everything inside the buffer. Liveness from the graph."""
    base, end = buffer.get_base(), buffer.get_base() + buffer.get_size()

    def root(t: Tensor) -> Tensor:
        while t.view_src is not None:
            t = t.view_src
        return t

    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots: dict[int, Tensor] = {}
    n = graph.n_nodes
    for i, node in enumerate(graph.nodes):
        for t in [node, *(s for s in node.src if s is not None)]:
            assert t.data is not None, f"{t.name} has no memory"
            if t.buffer is buffer:
                assert base <= t.data and t.data + t.nbytes() <= end, f"{t.name} outside the buffer"
            r = root(t)
            if r.buffer is not buffer:
                continue
            roots[id(r)] = r
            start = 0 if r.flags & TensorFlag.INPUT else i
            stop = n - 1 if (t.flags & TensorFlag.OUTPUT) else i
            first[id(r)] = min(first.get(id(r), start), start)
            last[id(r)] = max(last.get(id(r), stop), stop)
    items = list(roots.items())
    for x in range(len(items)):
        kx, rx = items[x]
        for y in range(x + 1, len(items)):
            ky, ry = items[y]
            if last[kx] < first[ky] or last[ky] < first[kx]:
                continue  # never alive together
            overlap = rx.data < ry.data + ry.nbytes() and ry.data < rx.data + rx.nbytes()
            assert not overlap, (f"{rx.name} (steps {first[kx]}-{last[kx]}) and {ry.name} "
                                 f"(steps {first[ky]}-{last[ky]}) share bytes")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(recipe=graph_recipe, seed=st.integers(0, 2**16))
@pytest.mark.slow
def test_random_graphs_reuse_memory_safely(recipe: tuple, seed: int) -> None:
    # reference: every tensor in memory of its own (a Context with memory), computed on the CPU
    rctx = Context(mem_size=1 << 20, no_alloc=False)
    rleafs, _, rsinks = build(rctx, recipe)
    if not rsinks:
        return
    values = leaf_values(rleafs, seed)
    for t, v in zip(rleafs, values, strict=True):
        t.numpy().reshape(v.shape)[...] = v
    rgraph = make_graph(rctx, rsinks)
    graph_compute_with_ctx(rctx, rgraph, 1)
    expected = [np.array(t.numpy(), copy=True) for t in rsinks]

    # measure pass
    mctx = Context(mem_size=1 << 20, no_alloc=True)
    mleafs, mpool, msinks = build(mctx, recipe)
    mgraph = make_graph(mctx, msinks)
    measure = TensorAllocator.new_measure_from_backend(BACKEND)
    for t in mleafs:
        measure.alloc(t)
    need = GraphAllocator().alloc_graph(measure, mgraph)
    planned = [None if t.data is None else t.data - measure.base for t in mpool]
    measure.free()

    # one alignment more than measured (as llama.cpp sizes its buffer) keeps a tail block: the plan is the
    # measured one, offset for offset
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    leafs, pool, sinks = build(ctx, recipe)
    with BACKEND.alloc_buffer(need + BACKEND.get_alignment()) as buf:
        talloc = TensorAllocator.new_from_buffer(buf)
        for t in leafs:
            talloc.alloc(t)
        assert GraphAllocator().alloc_graph(talloc, make_graph(ctx, sinks)) == need
        assert [None if t.data is None else t.data - talloc.base for t in pool] == planned

    # exactly `need` bytes: as in the seed the plan can differ, since an allocation that fills the buffer to
    # its last byte removes the tail block, and it can even fail; a failure must leave everything as it was
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    leafs, pool, sinks = build(ctx, recipe)
    graph = make_graph(ctx, sinks)
    buf = BACKEND.alloc_buffer(need)
    talloc = TensorAllocator.new_from_buffer(buf)
    for t in leafs:
        talloc.alloc(t)  # inputs before the graph: they are written before it runs
    before = talloc.snapshot()
    try:
        GraphAllocator().alloc_graph(talloc, graph)
    except OutOfMemoryError:
        event("the exact measured size was not enough")
        assert talloc.snapshot() == before
        assert all(t.data is None for t in pool[len(leafs):] if t.view_src is None or t.view_src.data is None)
        buf.free()
        # the same graph objects allocate fine with one alignment more
        buf = BACKEND.alloc_buffer(need + BACKEND.get_alignment())
        talloc = TensorAllocator.new_from_buffer(buf)
        for t in leafs:
            t.data = t.buffer = None
            talloc.alloc(t)
        GraphAllocator().alloc_graph(talloc, graph)
    event(f"nodes: {'10+' if graph.n_nodes >= 10 else '<10'}; in place: "
          f"{any(t.view_src is not None and t.op not in VIEW_OPS for t in graph.nodes)}")
    try:
        check_no_live_overlap(graph, buf)
        for t, v in zip(leafs, values, strict=True):
            tensor_set_numpy(t, v)
        BACKEND.graph_compute(graph)
        for t, exp in zip(sinks, expected, strict=True):
            got = tensor_get_numpy(t).reshape(exp.shape)
            np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6, err_msg=t.name)
    finally:
        buf.free()


# --- bad input leaves the allocators usable ---


def test_bad_input_through_allocr_leaves_it_usable() -> None:
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    al = Allocr.new_from_backend(BACKEND, 512)
    a = ctx.new_tensor_1d(GGMLType.F32, 32).set_name("a")
    al.alloc(a)
    v = ctx.view_1d(a, 8, 0).set_name("v")
    with pytest.raises(ArgumentError, match="view 'v'"):
        al.alloc(v)
    with pytest.raises(ArgumentError, match="'a'.*already has memory"):
        al.alloc(a)
    big = ctx.new_tensor_1d(GGMLType.F32, 128).set_name("big")  # 512 bytes, 384 free
    with pytest.raises(OutOfMemoryError, match="'big'.*needed 512 bytes, largest free block 384"):
        al.alloc(big)
    assert big.data is None
    # still usable: a graph over the rest of the buffer
    b = ctx.cont(a).set_name("b")
    c = ctx.sqr(b).set_name("c")
    g = ctx.new_graph(16)
    g.build_forward_expand(c)
    assert al.alloc_graph(g) == 256
    assert c.view_src is b and b.data - al.talloc.base == 128
    al.free()
