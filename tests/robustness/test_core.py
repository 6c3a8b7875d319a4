"""Bad-input catalog of the core layer: views, new tensors, contexts, graphs, op builders, op params.

Each case asserts the error class and that the message names the thing and the numbers; that the
failed call touched nothing (the context's pool, its tensors, the source's bytes, the graph are as
before); and that the same objects still work: a valid view of the same source is computed by the
CPU backend and gives the right values. Cases that could hang or crash the interpreter (a cycle, a
graph deeper than Python's stack) also run in a child process with a timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import pyggml.capi as capi
from pyggml.backends.cpu import graph_compute_with_ctx
from pyggml.core import memory, ops
from pyggml.core.context import Context
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    ContextFullError,
    GGMLError,
    GraphError,
    InvalidStateError,
    OutOfBoundsError,
    OutOfMemoryError,
    ShapeError,
    UnsupportedTypeError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import OpPool, Tensor
from pyggml.core.types import GGMLType
from robustness.conftest import expect_error, run_isolated

F32, I32, Q4_0, Q4_K = GGMLType.F32, GGMLType.I32, GGMLType.Q4_0, GGMLType.Q4_K
VALUES = np.arange(32, dtype=np.float32).reshape(4, 8)  # src's values (numpy order: 4 rows of 8)


@pytest.fixture
def ctx() -> Context:
    c = Context(mem_size=1 << 20)
    src = c.new_tensor_2d(F32, 8, 4).set_name("src")  # 128 bytes, rows of 32
    src.numpy()[0, 0] = VALUES
    return c


def src_of(ctx: Context) -> Tensor:
    t = ctx.get_tensor("src")
    assert t is not None
    return t


def still_works(ctx: Context) -> None:
    """The context and its source after a failed call: src's bytes untouched, and a valid view of it,
    added to itself in a graph, is computed by the CPU backend with the right values."""
    src = src_of(ctx)
    assert np.array_equal(src.numpy()[0, 0], VALUES)
    v = ctx.view_2d(src, 4, 2, src.nb[1], src.nb[1] + 8)  # rows 1-2, columns 2-5
    out = ctx.add(v, v)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(out.numpy()[0, 0], 2 * VALUES[1:3, 2:6])


@dataclass(frozen=True)
class Case:
    call: Callable[[Context, Tensor, Any], object]  # the bad call, given the context, 'src' and prep's result
    cls: type[GGMLError]
    fragments: tuple[str, ...]
    prep: Callable[[Context, Tensor], Any] | None = None  # valid set-up made before the bad call


def _upper(ctx: Context, src: Tensor) -> Tensor:
    return ctx.view_1d(src, 16, 64).set_name("upper")  # the last 64 bytes of src


def _small(ctx: Context, src: Tensor) -> Tensor:
    return ctx.new_tensor_2d(F32, 4, 2).set_name("b")


def _rope_args(ctx: Context, src: Tensor) -> tuple[Tensor, Tensor]:
    return ctx.reshape_3d(src, 8, 1, 4), ctx.new_tensor_1d(I32, 4).set_name("pos")


def _rope(ctx: Context, x: tuple[Tensor, Tensor], n_dims: int, freq_base: float = 10000.0) -> Tensor:
    return ctx.rope_custom(*x, n_dims, 0, 0, freq_base, 1.0, 0.0, 1.0, 32.0, 1.0)


# --- bad calls on a context holding 'src' (F32 [8, 4], 128 bytes, nb1 = 32) ---

CASES: dict[str, Case] = {
    # views: offsets, strides and shapes reaching outside the source
    "view_1d-negative-offset": Case(lambda c, s, x: c.view_1d(s, 2, -4), OutOfBoundsError,
                                    ("view_1d", "offset -4", "'src'", "128 bytes")),
    "view_1d-past-the-end": Case(lambda c, s, x: c.view_1d(s, 8, 100), OutOfBoundsError,
                                 ("view_1d", "view of 32 bytes at offset 100", "'src' (128 bytes)", "byte 131")),
    "view_1d-one-element-past": Case(lambda c, s, x: c.view_1d(s, 1, 128), OutOfBoundsError,
                                     ("view_1d", "4 bytes at offset 128", "'src' (128 bytes)")),
    "view_2d-stride-past": Case(lambda c, s, x: c.view_2d(s, 8, 4, 64, 0), OutOfBoundsError,
                                ("view_2d", "view of 224 bytes at offset 0", "nb=[4, 64, 256, 256]", "'src'")),
    "view_2d-rows-past": Case(lambda c, s, x: c.view_2d(s, 8, 2, 32, 72), OutOfBoundsError,
                              ("view_2d", "64 bytes at offset 72", "byte 135", "128 bytes")),
    "view_3d-nb2-past": Case(lambda c, s, x: c.view_3d(s, 4, 2, 2, 32, 96, 0), OutOfBoundsError,
                             ("view_3d", "144 bytes", "nb=[4, 32, 96, 192]", "'src' (128 bytes)")),
    "view_4d-nb3-past": Case(lambda c, s, x: c.view_4d(s, 2, 2, 2, 2, 8, 16, 100, 0), OutOfBoundsError,
                             ("view_4d", "132 bytes at offset 0", "nb=[4, 8, 16, 100]", "'src'")),
    "view_2d-negative-nb1": Case(lambda c, s, x: c.view_2d(s, 4, 2, -32, 64), ArgumentError,
                                 ("view_2d", "nb1", "-32")),
    "view_3d-negative-nb2": Case(lambda c, s, x: c.view_3d(s, 4, 2, 2, 32, -64, 64), ArgumentError,
                                 ("view_3d", "nb2", "-64")),
    "view_1d-negative-ne": Case(lambda c, s, x: c.view_1d(s, -1, 0), ArgumentError, ("view_1d", "ne[0]", "-1")),
    "view_4d-negative-ne3": Case(lambda c, s, x: c.view_4d(s, 2, 2, 2, -2, 8, 16, 32, 0), ArgumentError,
                                 ("view_4d", "ne[3]", "-2")),
    "view_2d-float-ne1": Case(lambda c, s, x: c.view_2d(s, 4, 2.5, 32, 0), ArgumentTypeError,
                              ("view_2d", "'ne1'", "float 2.5")),
    "view_1d-float-offset": Case(lambda c, s, x: c.view_1d(s, 2, 4.0), ArgumentTypeError,
                                 ("view_1d", "'offset'", "4.0")),
    "view_2d-str-nb1": Case(lambda c, s, x: c.view_2d(s, 4, 2, "32", 0), ArgumentTypeError,
                            ("view_2d", "'nb1'", "str")),
    "view_1d-bool-ne0": Case(lambda c, s, x: c.view_1d(s, True, 0), ArgumentTypeError, ("view_1d", "'ne0'", "bool")),
    "view-of-view-past-the-root": Case(lambda c, s, x: c.view_1d(x, 16, 32), OutOfBoundsError,
                                       ("view_1d of 'upper'", "offset 64 in its root", "64 bytes at offset 96",
                                        "'src' (128 bytes)"), _upper),
    "view-of-view-negative-offset": Case(lambda c, s, x: c.view_1d(x, 4, -16), OutOfBoundsError,
                                         ("view_1d", "offset -16", "'upper'"), _upper),
    "empty-view-past-the-end": Case(lambda c, s, x: c.view_1d(s, 0, 132), OutOfBoundsError,
                                    ("view_1d", "0 bytes at offset 132", "'src' (128 bytes)")),
    # reshape and cont: element counts and shapes
    "reshape_2d-element-count": Case(lambda c, s, x: c.reshape_2d(s, 5, 7), ShapeError,
                                     ("reshape_2d", "32 elements", "[5, 7]", "'src'")),
    "reshape-to-b-element-count": Case(lambda c, s, x: c.reshape(s, x), ShapeError,
                                       ("reshape", "32 elements", "[4, 2, 1, 1]"), _small),
    "reshape_3d-two-negatives": Case(lambda c, s, x: c.reshape_3d(s, -8, -4, 1), ArgumentError,
                                     ("reshape_3d", "ne[0]", "-8")),
    "reshape_1d-float": Case(lambda c, s, x: c.reshape_1d(s, 32.0), ArgumentTypeError,
                             ("reshape_1d", "'ne0'", "32.0")),
    "cont_2d-negative": Case(lambda c, s, x: c.cont_2d(s, -4, -8), ArgumentError, ("cont_4d", "ne[0]", "-4")),
    # ACC and SET: the window they write must lie inside a
    "acc-window-past": Case(lambda c, s, x: c.acc(s, x, 32, 64, 64, 112), OutOfBoundsError,
                            ("acc of 'b' into 'src'", "window of 48 bytes at offset 112", "(128 bytes)"), _small),
    "set_1d-negative-offset": Case(lambda c, s, x: c.set_1d(s, x, -4), OutOfBoundsError,
                                   ("set of 'b' into 'src'", "offset -4"), _small),
    "set_2d-nb1-past": Case(lambda c, s, x: c.set_2d(s, x, 128, 0), OutOfBoundsError,
                            ("set of 'b' into 'src'", "window of 144 bytes at offset 0", "nb=[4, 128, 128, 128]"),
                            _small),
    "acc-negative-nb2": Case(lambda c, s, x: c.acc(s, x, 32, -1, 64, 0), ArgumentError,
                             ("acc", "nb2", "-1"), _small),
    # new tensors: dimensions and types
    "new_tensor_1d-float-dim": Case(lambda c, s, x: c.new_tensor_1d(F32, 2.5), ArgumentTypeError,
                                    ("new_tensor_1d", "ne[0]", "float 2.5")),
    "new_tensor_2d-negative-dim": Case(lambda c, s, x: c.new_tensor_2d(F32, 4, -3), ArgumentError,
                                       ("new_tensor_2d", "ne[1]", "-3")),
    "new_tensor-five-dims": Case(lambda c, s, x: c.new_tensor(F32, [2, 1, 1, 1, 1]), ArgumentError,
                                 ("new_tensor", "1 to 4 dimensions", "got 5")),
    "new_tensor-no-dims": Case(lambda c, s, x: c.new_tensor(F32, []), ArgumentError, ("new_tensor", "got 0")),
    "new_tensor-ne-not-a-sequence": Case(lambda c, s, x: c.new_tensor(F32, 7), ArgumentTypeError,
                                         ("new_tensor", "ne must be a sequence", "int 7")),
    "new_tensor_1d-bool-dim": Case(lambda c, s, x: c.new_tensor_1d(F32, True), ArgumentTypeError,
                                   ("new_tensor_1d", "ne[0]", "bool")),
    "new_tensor_1d-numpy-float-dim": Case(lambda c, s, x: c.new_tensor_1d(F32, np.float64(3.0)), ArgumentTypeError,
                                          ("new_tensor_1d", "ne[0]", "float64")),
    "new_tensor_1d-dim-past-int64": Case(lambda c, s, x: c.new_tensor_1d(F32, 2**64), ArgumentError,
                                         ("new_tensor_1d", "ne[0]", str(2**63 - 1), str(2**64))),
    "new_tensor-float-type": Case(lambda c, s, x: c.new_tensor_1d(2.5, 4), ArgumentTypeError,
                                  ("ggml type", "float 2.5")),
    "new_tensor-unknown-type": Case(lambda c, s, x: c.new_tensor_1d(99, 4), UnsupportedTypeError,
                                    ("unknown ggml type", "99")),
    "q4_0-row-not-whole-blocks": Case(lambda c, s, x: c.new_tensor_2d(Q4_0, 48, 2), ShapeError,
                                      ("new_tensor_2d", "ne[0]=48", "q4_0", "block size 32")),
    "q4_k-row-not-whole-blocks": Case(lambda c, s, x: c.new_tensor_1d(Q4_K, 100), ShapeError,
                                      ("new_tensor_1d", "ne[0]=100", "q4_K", "block size 256")),
    "context-pool-full": Case(lambda c, s, x: c.new_tensor_1d(F32, 1 << 20), ContextFullError,
                              ("memory pool", "a tensor", "needed 4194672 bytes", "of 1048576")),
    # graphs: sizes
    "new_graph-negative-size": Case(lambda c, s, x: c.new_graph(-1), ArgumentError, ("new_graph", "size", "-1")),
    "new_graph-float-size": Case(lambda c, s, x: c.new_graph(2.5), ArgumentTypeError, ("new_graph", "size", "2.5")),
    "new_graph-zero-size": Case(lambda c, s, x: c.new_graph(0), ArgumentError, ("new_graph", "size", ">= 1", "0")),
    "graph_view-float-index": Case(lambda c, s, x: c.graph_view(x, 0, 1.5), ArgumentTypeError,
                                   ("graph_view", "i1", "1.5"), lambda c, s: c.new_graph(4)),
    # op builders: a non-tensor where a Tensor is expected, ints and floats of the wrong type
    "add-int-for-tensor": Case(lambda c, s, x: c.add(s, 3), ArgumentTypeError, ("add", "argument 'b'", "int 3")),
    "mul_mat-none-for-tensor": Case(lambda c, s, x: c.mul_mat(None, s), ArgumentTypeError,
                                    ("mul_mat", "argument 'a'", "NoneType")),
    "rms_norm-ndarray-for-tensor": Case(lambda c, s, x: c.rms_norm(np.zeros(4, np.float32), 1e-5), ArgumentTypeError,
                                        ("rms_norm", "argument 'a'", "ndarray")),
    "soft_max_ext-int-mask": Case(lambda c, s, x: c.soft_max_ext(s, 5, 1.0), ArgumentTypeError,
                                  ("soft_max_ext", "argument 'mask'", "int 5")),
    "ops-int-for-context": Case(lambda c, s, x: ops.add(5, s, s), ArgumentTypeError,
                                ("add", "argument 'ctx'", "Context", "int 5")),
    "scale-str-for-float": Case(lambda c, s, x: c.scale(s, "2"), ArgumentTypeError, ("scale", "argument 's'", "str")),
    "get_rows-list-for-tensor": Case(lambda c, s, x: c.get_rows(s, [0, 1]), ArgumentTypeError,
                                     ("get_rows", "argument 'b'", "list")),
    "permute-float-axis": Case(lambda c, s, x: c.permute(s, 1, 0, 2, 3.0), ArgumentTypeError,
                               ("permute", "argument 'axis3'", "3.0")),
    # op params out of range
    "rope-negative-n_dims": Case(lambda c, s, x: _rope(c, x, -2), ArgumentError,
                                 ("rope", "n_dims=-2", "ne[0]=8"), _rope_args),
    "rope-n_dims-past-the-row": Case(lambda c, s, x: _rope(c, x, 10), ArgumentError,
                                     ("rope", "n_dims=10", "ne[0]=8"), _rope_args),
    "rope-odd-n_dims": Case(lambda c, s, x: _rope(c, x, 5), ArgumentError, ("rope", "n_dims=5", "even"), _rope_args),
    "rope-zero-freq_base": Case(lambda c, s, x: _rope(c, x, 8, 0.0), ArgumentError, ("rope", "freq_base=0.0"),
                                _rope_args),
    "rope-nan-freq_base": Case(lambda c, s, x: _rope(c, x, 8, float("nan")), ArgumentError,
                               ("rope", "freq_base", "finite", "nan"), _rope_args),
    "soft_max_ext-nan-scale": Case(lambda c, s, x: c.soft_max_ext(s, None, float("nan")), ArgumentError,
                                   ("soft_max_ext", "scale", "finite", "nan")),
    "rms_norm-negative-eps": Case(lambda c, s, x: c.rms_norm(s, -1e-5), ArgumentError, ("rms_norm", "eps", "-1e-05")),
    "norm-infinite-eps": Case(lambda c, s, x: c.norm(s, float("inf")), ArgumentError, ("norm", "eps", "finite", "inf")),
    "argsort-unknown-order": Case(lambda c, s, x: c.argsort(s, 7), ArgumentError,
                                  ("argsort", "'order' = 7", "SortOrder", "ASC=0, DESC=1")),
    "unary-unknown-op": Case(lambda c, s, x: c.unary(s, 42), ArgumentError, ("unary", "'op' = 42", "UnaryOp")),
    "pool_1d-unknown-op": Case(lambda c, s, x: c.pool_1d(s, 5, 2, 2, 0), ArgumentError,
                               ("pool_1d", "'op' = 5", "OpPool")),
    "pool_2d-infinite-padding": Case(lambda c, s, x: c.pool_2d(s, OpPool.AVG, 2, 2, 1, 1, float("inf"), 0.0),
                                     ArgumentError, ("pool_2d", "p0", "finite", "inf")),
    "diag_mask_inf-n_past-past-int32": Case(lambda c, s, x: c.diag_mask_inf(s, 2**31), ArgumentError,
                                            ("op param 0", "(DIAG_MASK_INF)", "2147483648", "int32")),
    "conv_1d-stride-zero": Case(lambda c, s, x: c.conv_1d(*x, 0, 0, 1), ArgumentError, ("im2col", "stride 0"),
                                lambda c, s: (c.reshape_3d(s, 2, 4, 4), c.new_tensor_3d(F32, 8, 4, 1))),
    "new_i32-float": Case(lambda c, s, x: c.new_i32(1.5), ArgumentTypeError, ("new_i32", "value", "1.5")),
    "new_f32-str": Case(lambda c, s, x: c.new_f32("1"), ArgumentTypeError, ("new_f32", "value", "str")),
    "group_norm-zero-groups": Case(lambda c, s, x: c.group_norm(s, 0, 1e-6), ArgumentError,
                                   ("group_norm", "n_groups", "0")),
    "map_custom1-zero-tasks": Case(lambda c, s, x: c.map_custom1(s, lambda *a: None, 0), ArgumentError,
                                   ("map_custom1", "n_tasks", "got 0")),
    # the C API's entry points refuse what C would truncate
    "capi-ggml_new_tensor-float-n_dims": Case(lambda c, s, x: capi.ggml_new_tensor(c, F32, 1.5, [4, 4]),
                                              ArgumentTypeError, ("ggml_new_tensor", "n_dims", "1.5")),
    "capi-ggml_unary-unknown-op": Case(lambda c, s, x: capi.ggml_unary(c, s, 99), ArgumentError,
                                       ("unary", "'op' = 99", "UnaryOp")),
    "capi-ggml_row_size-float": Case(lambda c, s, x: capi.ggml_row_size(F32, 2.5), ArgumentTypeError,
                                     ("ggml_row_size", "ne", "2.5")),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_call_on_a_context(ctx: Context, case: Case) -> None:
    src = src_of(ctx)
    x = case.prep(ctx, src) if case.prep else None
    used, n_tensors, n_graphs = ctx.used_mem(), len(ctx.tensors), len(ctx.graphs)
    expect_error(lambda: case.call(ctx, src, x), case.cls, *case.fragments)
    # raised before anything was made: the pool, the tensors and the graphs are as before the call
    assert (ctx.used_mem(), len(ctx.tensors), len(ctx.graphs)) == (used, n_tensors, n_graphs)
    still_works(ctx)


# --- contexts ---


@pytest.mark.parametrize(("kwargs", "cls", "fragments"), [
    ({"mem_size": 2**50}, OutOfMemoryError,
     ("Context(mem_size=1125899906842624)", "cannot allocate 1125899906842640 bytes", "available")),
    ({"mem_size": -1}, ArgumentError, ("Context", "mem_size", ">= 0", "-1")),
    ({"mem_size": 1.5}, ArgumentTypeError, ("Context", "mem_size", "float 1.5")),
    ({"mem_size": "4096"}, ArgumentTypeError, ("Context", "mem_size", "str")),
    ({"mem_size": 64, "mem_buffer": np.zeros(16, np.uint8)}, ArgumentError, ("mem_buffer holds 16 bytes", "asks 64")),
], ids=["1-PiB", "negative", "float", "str", "mem_buffer-too-small"])
def test_bad_context(kwargs: dict, cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    n_host = len(memory._bases)
    expect_error(lambda: Context(**kwargs), cls, *fragments)
    assert len(memory._bases) == n_host  # nothing registered, nothing allocated
    c = Context(mem_size=1 << 20)
    c.new_tensor_2d(F32, 8, 4).set_name("src").numpy()[0, 0] = VALUES
    still_works(c)


def test_capi_init_refuses_a_float_size() -> None:
    expect_error(lambda: capi.ggml_init(2.5), ArgumentTypeError, "mem_size", "float 2.5")
    assert capi.ggml_init(1 << 12).get_mem_size() == 1 << 12


def test_freed_context_refuses_new_tensors_and_graphs(ctx: Context) -> None:
    ctx.free()
    expect_error(lambda: ctx.new_tensor_1d(F32, 4), InvalidStateError, "freed context", "mem_size 1048576")
    expect_error(lambda: ctx.new_graph(8), InvalidStateError, "freed context")
    ctx.free()  # freeing again does nothing
    other = Context(mem_size=1 << 20)
    other.new_tensor_2d(F32, 8, 4).set_name("src").numpy()[0, 0] = VALUES
    still_works(other)


# --- graphs: overflow leaves the graph as it was; cycles are named ---


def _chain(ctx: Context, n: int) -> list[Tensor]:
    """n nodes, each the previous one scaled: n nodes and one leaf ('src')."""
    t, out = src_of(ctx), []
    for i in range(n):
        t = ctx.scale(t, 2.0)
        if i % 2:
            t.set_name(f"s{i}")  # half named, half left to the graph's automatic names
        out.append(t)
    return out


def graph_state(g: Graph) -> tuple:
    return list(g.nodes), list(g.leafs), len(g.visited_hash_table), [t.name for t in g.nodes + g.leafs]


@pytest.mark.parametrize("first", [0, 1, 2], ids=["empty-graph", "after-one-node", "after-two-nodes"])
def test_graph_overflow_rolls_back(ctx: Context, first: int) -> None:
    g = ctx.new_graph(3)
    chain = _chain(ctx, 5)
    if first:
        g.build_forward_expand(chain[first - 1])
    before = graph_state(g)
    unnamed = [t for t in chain if not t.name]
    expect_error(lambda: g.build_forward_expand(chain[-1]), GraphError, "graph full", "3 nodes", "(SCALE)")
    assert graph_state(g) == before  # nodes, leafs, visited set and names as before the call
    assert all(not t.name for t in unnamed)  # automatic names given during the failed call are taken back
    g.build_forward_expand(chain[2])  # a graph that fits still builds, on the same graph object
    assert g.nodes == chain[:3] and g.leafs == [src_of(ctx)]
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(chain[2].numpy()[0, 0], 8 * VALUES)
    still_works(ctx)


@pytest.mark.parametrize(("size", "fragments"), [
    (2, ("graph full", "2 leafs", "'o2' (NONE)")),
    (1, ("hash set full", "2 tensors", "'src'")),  # size 1: a hash table of 2 tensors, full at the first leaf
], ids=["leafs", "hash-set"])
def test_graph_leaf_overflow_rolls_back(ctx: Context, size: int, fragments: tuple[str, ...]) -> None:
    g = ctx.new_graph(size)
    o1 = ctx.new_tensor_2d(F32, 8, 4).set_name("o1")
    o2 = ctx.new_tensor_2d(F32, 8, 4).set_name("o2")
    expect_error(lambda: g.build_forward_expand(ctx.add(ctx.add(src_of(ctx), o1), o2)), GraphError, *fragments)
    assert graph_state(g) == ([], [], 0, [])
    out = ctx.scale(src_of(ctx), 3.0)
    g.build_forward_expand(out)
    assert g.n_nodes == 1 and g.n_leafs == 1
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(out.numpy()[0, 0], 3 * VALUES)


def _cycle_two(ctx: Context) -> Tensor:
    a = ctx.scale(src_of(ctx), 1.0).set_name("a")
    b = ctx.scale(a, 1.0).set_name("b")
    a.src[0] = b  # a -> b -> a
    return b


def _cycle_self(ctx: Context) -> Tensor:
    t = ctx.add(src_of(ctx), src_of(ctx)).set_name("me")
    t.src[1] = t
    return t


def _cycle_below(ctx: Context) -> Tensor:
    """The root is not on the cycle: out -> x -> y -> z -> x."""
    x = ctx.scale(src_of(ctx), 1.0).set_name("x")
    y = ctx.scale(x, 1.0).set_name("y")
    z = ctx.scale(y, 1.0).set_name("z")
    x.src[0] = z
    return ctx.add(ctx.scale(src_of(ctx), 3.0), y).set_name("out")


@pytest.mark.parametrize(("make", "fragments"), [
    (_cycle_two, ("cycle of 2 tensors", "'b' (SCALE) depends on itself", "'b' (SCALE) -> 'a' (SCALE) -> 'b'")),
    (_cycle_self, ("cycle of 1 tensors", "'me' (ADD) depends on itself", "'me' (ADD) -> 'me' (ADD)")),
    (_cycle_below, ("cycle of 3 tensors", "'y' (SCALE)", "'x' (SCALE)", "'z' (SCALE)")),
], ids=["a-b-a", "self", "below-the-root"])
def test_graph_cycle_is_named(ctx: Context, make: Callable[[Context], Tensor], fragments: tuple[str, ...]) -> None:
    g = ctx.new_graph()
    root = make(ctx)
    expect_error(lambda: g.build_forward_expand(root), InvalidStateError, "build_forward_expand", *fragments)
    assert graph_state(g) == ([], [], 0, [])
    still_works(ctx)  # builds and computes on a new graph of the same context


def test_graph_cycle_in_a_child_process_neither_hangs_nor_crashes() -> None:
    """A cycle 10,000 tensors long: an error naming it, not a hang, a RecursionError or a crash."""
    res = run_isolated("""
        from pyggml.core.context import Context
        from pyggml.core.errors import InvalidStateError
        from pyggml.core.types import GGMLType
        ctx = Context(mem_size=1 << 24, no_alloc=True)
        first = t = ctx.scale(ctx.new_tensor_1d(GGMLType.F32, 4).set_name("x"), 1.0).set_name("first")
        for i in range(9999):
            t = ctx.scale(t, 1.0)
        first.src[0] = t
        g = ctx.new_graph(20000)
        try:
            g.build_forward_expand(t)
        except InvalidStateError as e:
            assert "cycle of 10000 tensors" in str(e) and "'first' (SCALE)" in str(e), str(e)[:300]
            assert g.n_nodes == 0 and g.n_leafs == 0
            print("named")
    """, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "named"


@pytest.mark.slow
def test_deep_graph_builds_and_computes_without_recursion() -> None:
    """A chain of 30,000 nodes (far past Python's recursion limit) builds and computes."""
    res = run_isolated("""
        import numpy as np
        from pyggml.backends.cpu import graph_compute_with_ctx
        from pyggml.core.context import Context
        from pyggml.core.types import GGMLType
        ctx = Context(mem_size=1 << 26)
        x = ctx.new_tensor_1d(GGMLType.F32, 4)
        x.numpy()[...] = 1.0
        t = x
        for i in range(30000):
            t = ctx.add(t, x)
        g = ctx.new_graph(30001)
        g.build_forward_expand(t)
        graph_compute_with_ctx(ctx, g, 1)
        assert g.n_nodes == 30000 and np.all(t.numpy() == 30001), t.numpy()
        print("ok")
    """, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "ok"


@pytest.mark.parametrize(("bad", "cls", "fragments"), [
    (lambda g, c: g.build_forward_expand(3), ArgumentTypeError, ("build_forward_expand", "Tensor", "int 3")),
    (lambda g, c: g.node(5), OutOfBoundsError, ("graph_node", "node 5", "1 nodes")),
    (lambda g, c: g.node(-2), OutOfBoundsError, ("graph_node", "node -2", "1 nodes")),
    (lambda g, c: g.view(0, 2), GraphError, ("graph_view", "[0, 2)", "1 nodes")),
    (lambda g, c: g.cpy("graph"), ArgumentTypeError, ("graph_cpy", "dst", "str")),
    (lambda g, c: Graph(-4), ArgumentError, ("Graph", "size", "-4")),
], ids=["expand-int", "node-past", "node-negative-past", "view-past", "cpy-str", "Graph-negative"])
def test_bad_graph_call(ctx: Context, bad: Callable, cls: type[GGMLError], fragments: tuple[str, ...]) -> None:
    g = ctx.new_graph(4)
    out = ctx.scale(src_of(ctx), 2.0)
    g.build_forward_expand(out)
    before = graph_state(g)
    expect_error(lambda: bad(g, ctx), cls, *fragments)
    assert graph_state(g) == before
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(out.numpy()[0, 0], 2 * VALUES)


def test_src_that_is_not_a_tensor_is_named(ctx: Context) -> None:
    t = ctx.add(src_of(ctx), src_of(ctx)).set_name("sum")
    t.src[1] = 5
    g = ctx.new_graph()
    expect_error(lambda: g.build_forward_expand(t), ArgumentTypeError, "src[1] of 'sum'", "int 5")
    assert graph_state(g) == ([], [], 0, [])
    t.src[1] = src_of(ctx)
    g.build_forward_expand(t)
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(t.numpy()[0, 0], 2 * VALUES)


# --- op params and names on a tensor ---


@pytest.mark.parametrize(("bad", "cls", "fragments"), [
    (lambda t: t.set_op_params([2**40]), ArgumentError, ("op param 0 of 'p'", str(2**40), "int32")),
    (lambda t: t.set_op_params([1, "x"]), ArgumentTypeError, ("op param 1 of 'p'", "str")),
    (lambda t: t.set_op_params([1e39]), ArgumentError, ("op param 0 of 'p'", "1e+39", "float32")),
    (lambda t: t.set_op_params(list(range(17))), ArgumentError, ("17 op params for 'p'", "at most 16")),
    (lambda t: t.get_op_params_i32(16), OutOfBoundsError, ("op param index 16 of 'p'", "[0, 16)")),
    (lambda t: t.get_op_params_f32(-1), OutOfBoundsError, ("op param index -1", "[0, 16)")),
    (lambda t: t.set_op_params_i32(0, 2**31), ArgumentError, ("op param 0 of 'p'", str(2**31))),
    (lambda t: t.set_name(5), ArgumentTypeError, ("name of tensor 'p'", "int 5")),
], ids=["int-past-int32", "str", "float-past-float32", "too-many", "index-past", "index-negative",
        "i32-past", "name-int"])
def test_bad_op_params_leave_the_tensor_as_it_was(ctx: Context, bad: Callable, cls: type[GGMLError],
                                                  fragments: tuple[str, ...]) -> None:
    t = ctx.scale(src_of(ctx), 0.5).set_name("p")
    words = t.op_params.copy()
    expect_error(lambda: bad(t), cls, *fragments)
    assert np.array_equal(t.op_params, words) and t.name == "p"
    assert t.get_op_params_f32(0) == 0.5
    g = ctx.new_graph()
    g.build_forward_expand(t)
    graph_compute_with_ctx(ctx, g, 1)
    assert np.array_equal(t.numpy()[0, 0], 0.5 * VALUES)


# --- zero-size dimensions: accepted with ggml's meaning (no elements, nbytes 0, kernels do nothing) ---


@pytest.mark.parametrize("shape", [(0, 3), (4, 0), (0, 0)], ids=["ne0-0", "ne1-0", "both-0"])
def test_zero_size_tensors_are_empty_not_errors(shape: tuple[int, int]) -> None:
    ctx = Context(mem_size=1 << 20)
    a = ctx.new_tensor_2d(F32, *shape).set_name("a")
    b = ctx.new_tensor_2d(F32, *shape).set_name("b")
    assert a.nbytes() == 0 and a.nelements() == 0 and a.nrows() == shape[1]
    q = ctx.new_tensor_2d(Q4_0, 0, 2)
    assert q.nbytes() == 0 and q.row_size() == 0
    w = ctx.new_tensor_4d(F32, 4, 3, 0, 1)  # empty batch of mul_mat: no modulo by zero
    outs = [ctx.cpy(a, b), ctx.scale(a, 2.0), ctx.sum_rows(a), ctx.cont(ctx.transpose(a)), ctx.view_1d(a, 0, 0),
            ctx.mul_mat(w, ctx.new_tensor_4d(F32, 4, 2, 0, 1)), ctx.rms_norm(a, 1e-5), ctx.soft_max(a)]
    assert outs[5].ne == [3, 2, 0, 1]
    g = ctx.new_graph()
    for t in outs:
        g.build_forward_expand(t)
    graph_compute_with_ctx(ctx, g, 1)
    # as today's ggml_can_repeat: an empty tensor tiles exactly the empty ones (no ZeroDivisionError)
    full = ctx.new_tensor_2d(F32, 4, 3)
    expect_error(lambda: ctx.add(full, ctx.new_tensor_2d(F32, 0, 3)), ShapeError, "add", "F32[0, 3, 1, 1]")
    both = ctx.mul(a, b)
    g2 = ctx.new_graph()
    g2.build_forward_expand(both)
    graph_compute_with_ctx(ctx, g2, 1)
    assert both.ne[:2] == list(shape) and both.nbytes() == 0
    expect_error(lambda: ctx.mul_mat(w, ctx.new_tensor_4d(F32, 4, 2, 3, 1)), ShapeError, "mul_mat", "[4, 3, 0, 1]")


def test_op_builder_check_is_shared_by_every_builder() -> None:
    """Every builder of ops (and so every Context method and capi function over it) checks its Tensor
    arguments: the same call with an int for the first tensor raises ArgumentTypeError naming the op."""
    import inspect

    from pyggml.core.ops import _MODULES, OpBuilders

    ctx = Context(mem_size=1 << 16, no_alloc=True)
    checked = 0
    for module in _MODULES:
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn) or not hasattr(fn, "__wrapped__"):
                continue
            params = list(inspect.signature(fn).parameters.values())
            if name == "custom_4d":  # a type first, its tensors in a list (ggml_custom_4d's args)
                continue
            n_required = len([p for p in params if p.default is inspect.Parameter.empty])
            tensors = [i for i, p in enumerate(params) if p.annotation == "Tensor"]
            # the first Tensor argument gets an int; a builder of no Tensor (arange) gets a str for its first number
            i, bad, shown = (tensors[0], 7, "int 7") if tensors else (1, "x", "str 'x'")
            args = [ctx] + [None] * (max(n_required, i + 1) - 1)
            args[i] = bad
            expect_error(lambda fn=fn, args=args: fn(*args), ArgumentTypeError,
                         f"{name}: argument '{params[i].name}'", shown)
            assert getattr(ops, name) is fn  # the checked builder is the one ops exports ...
            assert getattr(OpBuilders, name, fn) is fn  # ... and the one Context's method calls
            checked += 1
    assert checked >= 100
    assert ctx.used_mem() == 0  # nothing was made


@pytest.mark.parametrize("name", ["view_1d", "view_2d", "view_3d", "view_4d"])
def test_views_never_reach_outside_the_source_for_any_offset(name: str) -> None:
    """Every offset from -8 to past the end: either a view inside src (which the CPU kernel then writes,
    leaving the guard bytes around src untouched) or OutOfBoundsError."""
    ctx = Context(mem_size=1 << 20)
    guard_lo = ctx.new_tensor_1d(F32, 16)
    src = ctx.new_tensor_2d(F32, 4, 4).set_name("src")
    guard_hi = ctx.new_tensor_1d(F32, 16)
    for t in (guard_lo, guard_hi):
        t.numpy()[...] = 7.0
    shape = {"view_1d": (4,), "view_2d": (2, 2, 16), "view_3d": (2, 2, 2, 8, 16),
             "view_4d": (2, 2, 2, 2, 8, 16, 32)}[name]
    ok = 0
    for offset in range(-8, 72, 4):
        try:
            v = getattr(ctx, name)(src, *shape, offset)
        except OutOfBoundsError as e:
            assert name in str(e) and "'src'" in str(e) and str(offset) in str(e)
            continue
        out = ctx.cpy(ctx.scale(v, 0.0), v)  # writes zeros through the view
        g = ctx.new_graph(8)
        g.build_forward_expand(out)
        graph_compute_with_ctx(ctx, g, 1)
        ok += 1
    assert ok > 0
    assert np.all(guard_lo.numpy() == 7.0) and np.all(guard_hi.numpy() == 7.0)
