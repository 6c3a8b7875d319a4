"""Graphs: node and leaf order as ggml_build_forward_expand gives it, default names, views of graphs,
copies, full graphs, the Graphviz export and the printout."""

from __future__ import annotations

import logging
import re

import pytest

from pyggml.core.context import Context
from pyggml.core.errors import GraphError
from pyggml.core.graph import EvalOrder, Graph, hash_size
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

F32 = GGMLType.F32


def build_expression(ctx: Context) -> dict[str, Tensor]:
    """A graph with shared sub-expressions, a param, and views (ops VIEW, TRANSPOSE).

        a, b, k : leafs (op NONE);  w : a param (op NONE, but a node)
        s  = add(a, b)              shared by t and v
        t  = mul(s, a)              shared by m and o2; `a` is used twice
        v  = view_2d(s, rows 1-2)
        m  = mul_mat(w, t)
        tr = transpose(m)
        c  = cont(tr)
        o1 = add(c, k)
        o2 = mul_mat(v, t)
    """
    e: dict[str, Tensor] = {}
    e["a"] = ctx.new_tensor_2d(F32, 4, 3)
    e["b"] = ctx.new_tensor_2d(F32, 4, 3)
    e["w"] = ctx.new_tensor_2d(F32, 4, 4).set_param()
    e["s"] = ctx.add(e["a"], e["b"])
    e["t"] = ctx.mul(e["s"], e["a"])
    e["v"] = ctx.view_2d(e["s"], 4, 2, e["s"].nb[1], e["s"].nb[1])
    e["m"] = ctx.mul_mat(e["w"], e["t"])
    e["tr"] = ctx.transpose(e["m"])
    e["c"] = ctx.cont(e["tr"])
    e["k"] = ctx.new_tensor_1d(F32, 3)
    e["o1"] = ctx.add(e["c"], e["k"])
    e["o2"] = ctx.mul_mat(e["v"], e["t"])
    return e


def names_of(ts: list[Tensor], e: dict[str, Tensor]) -> list[str]:
    by_id = {id(t): n for n, t in e.items()}
    return [by_id[id(t)] for t in ts]


@pytest.fixture
def ctx() -> Context:
    return Context(mem_size=1 << 22, no_alloc=True)


def test_left_to_right_order(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    # visit o1 -> c -> tr -> m -> w (param: node 0), then m's src1 t -> s -> a (leaf 0), b (leaf 1);
    # s (node 1); t's src1 a already visited; t (node 2); m, tr, c; o1's src1 k (leaf 2); o1
    assert names_of(g.nodes, e) == ["w", "s", "t", "m", "tr", "c", "o1"]
    assert names_of(g.leafs, e) == ["a", "b", "k"]
    g.build_forward_expand(e["o2"])
    # o2: v (its source s already visited), t visited, then o2
    assert names_of(g.nodes, e) == ["w", "s", "t", "m", "tr", "c", "o1", "v", "o2"]
    assert names_of(g.leafs, e) == ["a", "b", "k"]
    assert (g.n_nodes, g.n_leafs) == (9, 3)


def test_right_to_left_order(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.order = EvalOrder.RIGHT_TO_LEFT
    g.build_forward_expand(e["o1"])
    # visit o1's src1 k (leaf 0) first; then c -> tr -> m: m's src1 t -> t's src1 a (leaf 1),
    # t's src0 s -> s's src1 b (leaf 2), src0 a visited; s, t; m's src0 w (param); m, tr, c, o1
    assert names_of(g.nodes, e) == ["s", "t", "w", "m", "tr", "c", "o1"]
    assert names_of(g.leafs, e) == ["k", "a", "b"]
    g.build_forward_expand(e["o2"])
    assert names_of(g.nodes, e) == ["s", "t", "w", "m", "tr", "c", "o1", "v", "o2"]


def test_default_names_and_kept_names(ctx: Context) -> None:
    e = build_expression(ctx)
    e["b"].set_name("input_b")
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    g.build_forward_expand(e["o2"])
    # unnamed tensors get leaf_<leaf index> / node_<node index> when appended
    assert e["a"].name == "leaf_0"
    assert e["b"].name == "input_b"
    assert e["k"].name == "leaf_2"
    assert [e[n].name for n in ["w", "s", "t", "m", "o1", "o2"]] == \
        ["node_0", "node_1", "node_2", "node_3", "node_6", "node_8"]
    # views and cont got names from their sources when built (sources were unnamed then)
    assert e["tr"].name == " (transposed)"
    assert e["c"].name == " (transposed) (cont)"
    assert e["v"].name == " (view)"


def test_expanding_again_adds_nothing(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    nodes, leafs = list(g.nodes), list(g.leafs)
    g.build_forward_expand(e["o1"])
    g.build_forward_expand(e["t"])
    assert g.nodes == nodes and g.leafs == leafs


def test_a_leaf_as_root(ctx: Context) -> None:
    x = ctx.new_tensor_1d(F32, 4)
    g = ctx.new_graph()
    g.build_forward_expand(x)
    assert g.nodes == [] and g.leafs == [x]


def test_view_src_is_not_a_dependency(ctx: Context) -> None:
    # ggml visits src[], not view_src: a view_tensor (op NONE) is a leaf and its source is not pulled in
    a = ctx.new_tensor_1d(F32, 4)
    v = ctx.view_tensor(ctx.sqr(a))
    g = ctx.new_graph()
    g.build_forward_expand(ctx.neg(v))
    assert [t.op for t in g.nodes] == [GGMLOp.UNARY]
    assert g.leafs == [v]


def test_graph_full_raises(ctx: Context) -> None:
    a = ctx.new_tensor_1d(F32, 4)
    x = ctx.sqr(ctx.sqr(ctx.sqr(a)))
    g = ctx.new_graph(2)
    with pytest.raises(GraphError, match="graph full: 2 nodes"):
        g.build_forward_expand(x)
    leafs = [ctx.new_tensor_1d(F32, 4) for _ in range(3)]
    g2 = ctx.new_graph(2)
    y = ctx.add(ctx.add(leafs[0], leafs[1]), leafs[2])
    with pytest.raises(GraphError, match="graph full: 2 leafs"):
        g2.build_forward_expand(y)


def test_graph_view(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    used = ctx.used_mem()
    gv = ctx.graph_view(g, 2, 5)
    assert names_of(gv.nodes, e) == ["t", "m", "tr"]
    assert gv.n_leafs == 0 and gv.size == 3
    assert ctx.used_mem() > used
    with pytest.raises(GraphError, match=r"nodes \[3, 9\) are not inside the graph's 7 nodes"):
        ctx.graph_view(g, 3, 9)
    with pytest.raises(GraphError):
        g.view(4, 2)


def test_graph_cpy_and_clear(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    small = ctx.new_graph(4)
    with pytest.raises(GraphError, match="size 4 cannot hold 7 nodes"):
        g.cpy(small)
    dst = ctx.new_graph(16)
    g.cpy(dst)
    assert dst.nodes == g.nodes and dst.leafs == g.leafs
    dst.build_forward_expand(e["o2"])  # the visited set came along: only v and o2 are new
    assert names_of(dst.nodes[7:], e) == ["v", "o2"]
    g.clear()
    assert g.n_nodes == 0 and g.n_leafs == 0
    g.build_forward_expand(e["s"])
    assert names_of(g.nodes, e) == ["s"]


def test_get_tensor_and_node(ctx: Context) -> None:
    e = build_expression(ctx)
    e["m"].set_name("logits")
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    assert g.get_tensor("logits") is e["m"]
    assert g.get_tensor("leaf_0") is e["a"]
    assert g.node(-1) is e["o1"]


def test_hash_size_is_ggmls() -> None:
    assert hash_size(1) == 2
    assert hash_size(4096) == 4099
    assert hash_size(4099) == 4099
    assert hash_size(4100) == 8209
    assert Graph(64).visited_hash_table.size == 131


# --- Graphviz export ---

NODE_LINE = re.compile(r'^  "(t\d+)" \[ (.*) \]$')
EDGE_LINE = re.compile(r'^  "(t\d+)" -> "(t\d+)" \[ (.*) \]$')


def parse_dot(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """Nodes (id -> attributes) and edges (from, to, attributes) of a `digraph G { ... }`; fails on anything else."""
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == "digraph G {" and lines[-1] == "}"
    nodes: dict[str, str] = {}
    edges: list[tuple[str, str, str]] = []
    for line in lines[1:-1]:
        if (m := EDGE_LINE.match(line)) is not None:
            edges.append((m.group(1), m.group(2), m.group(3)))
        elif (m := NODE_LINE.match(line)) is not None:
            assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
            nodes[m.group(1)] = m.group(2)
        else:
            assert re.match(r"^  \w+ = \w+;$", line), f"unexpected line {line!r}"
    for a, b, _ in edges:
        assert a in nodes and b in nodes, f"edge {a} -> {b} names an undeclared node"
    return nodes, edges


def test_dump_dot_has_a_line_per_node_and_per_edge(ctx: Context, tmp_path: object) -> None:
    e = build_expression(ctx)
    e["m"].set_name("logits")
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    g.build_forward_expand(e["o2"])
    path = f"{tmp_path}/g.dot"
    text = g.dump_dot(path)
    with open(path, encoding="utf-8") as f:
        assert f.read() == text
    nodes, edges = parse_dot(text)
    assert len(nodes) == g.n_nodes + g.n_leafs
    n_srcs = sum(1 for t in g.nodes for s in t.src if s is not None)
    assert len(edges) == n_srcs == 13  # s, t, m, o1, o2: 2 each; tr, c, v: 1
    assert sum('label = "src 1"' in attrs for _, _, attrs in edges) == 5
    assert any("logits (F32)|4 x 3|MUL_MAT" in attrs for attrs in nodes.values())
    assert sum("fillcolor = pink" in attrs for attrs in nodes.values()) == g.n_leafs


def test_dump_dot_of_a_view_declares_outside_sources(ctx: Context) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    nodes, edges = parse_dot(g.view(3, 5).dump_dot())  # m, tr: sources w and t are outside
    assert len(edges) == 3
    assert len(nodes) == 4
    assert sum("style = dashed" in attrs for attrs in nodes.values()) == 2


# --- printout ---


def test_graph_print(ctx: Context, caplog: pytest.LogCaptureFixture) -> None:
    e = build_expression(ctx)
    g = ctx.new_graph()
    g.build_forward_expand(e["o1"])
    text = g.format()
    lines = text.split("\n")
    assert lines[0] == "=== GRAPH ==="
    assert lines[1] == "n_nodes = 7"
    assert re.match(r"^ -   3: \[ +4, +3, +1\] +MUL_MAT   node_3$", lines[5])
    assert re.match(r"^ -   0: \[ +4, +4, +1\] +NONE x node_0$", lines[2])  # the param is marked x
    assert lines[9] == "n_leafs = 3"
    assert re.match(r"^ -   2: \[ +3, +1\] +NONE +leaf_2$", lines[12])
    assert lines[-1].startswith("=====")
    assert len(lines) == 2 + 7 + 1 + 3 + 1
    with caplog.at_level(logging.INFO, logger="pyggml.graph"):
        g.print()
    assert text in caplog.text
