"""Graphviz export of a graph (ggml_graph_dump_dot)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.tensor import GGML_MAX_SRC, Tensor

if TYPE_CHECKING:
    from pyggml.core.graph import Graph


def _label(t: Tensor) -> str:
    ne = " x ".join(str(n) for n in t.ne[: t.n_dims()])
    op = t.op.name if t.op.name != "NONE" else ""
    name = t.name.replace('"', "'")
    return f"{name} ({t.type.name})|{ne}|{op}" if op else f"{name} ({t.type.name})|{ne}"


def graph_to_dot(graph: Graph, color_of: dict[int, str]) -> str:
    lines = ["digraph G {", '  newrank = true;', '  rankdir = TB;']
    ids: dict[int, str] = {}

    def node_id(t: Tensor) -> str:
        if id(t) not in ids:
            ids[id(t)] = f"t{len(ids)}"
        return ids[id(t)]

    for t in graph.leafs:
        color = color_of.get(id(t), "pink")
        lines.append(f'  "{node_id(t)}" [ style = filled; fillcolor = {color}; shape = record; '
                     f'label = "<x>{_label(t)}"; ]')
    for t in graph.nodes:
        color = color_of.get(id(t), "green" if t.is_param else "white")
        lines.append(f'  "{node_id(t)}" [ style = filled; fillcolor = "{color}"; shape = record; '
                     f'label = "{_label(t)}"; ]')
    for t in graph.nodes:
        for j in range(GGML_MAX_SRC):
            s = t.src[j]
            if s is None:
                continue
            if id(s) not in ids:  # a source outside the graph (e.g. in a graph view)
                lines.append(f'  "{node_id(s)}" [ style = dashed; shape = record; label = "{_label(s)}"; ]')
            lines.append(f'  "{node_id(s)}" -> "{node_id(t)}" [ arrowhead = vee; style = solid; label = "src {j}"; ]')
    lines.append("}")
    return "\n".join(lines) + "\n"
