"""Graphviz export of a split graph: nodes coloured by backend (by priority index), each split a cluster
holding its input copies (dashed edges) and nodes; leafs outside the clusters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.tensor import Tensor

if TYPE_CHECKING:
    from pyggml.core.graph import Graph
    from pyggml.sched.backend_sched import BackendSched

BACKEND_COLORS = ["lightskyblue", "palegreen", "lightsalmon", "plum", "khaki", "lightpink", "aquamarine", "wheat"]


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', "'").replace("{", "\\{").replace("}", "\\}").replace("|", "\\|") \
        .replace("<", "\\<").replace(">", "\\>")


def _label(t: Tensor, backend_name: str, cause: str) -> str:
    ne = " x ".join(str(n) for n in t.ne[: t.n_dims()])
    op = t.op.name if t.op.name != "NONE" else "leaf"
    where = f"{backend_name} {cause}".strip()
    return f"{_escape(t.name)} ({t.type.name})|{ne}|{op}|{_escape(where)}"


def sched_to_dot(sched: BackendSched, graph: Graph) -> str:
    """Graphviz source of `graph` as the scheduler split it last."""
    ids: dict[int, str] = {}

    def node_id(t: Tensor) -> str:
        key = id(t)
        if key not in ids:
            ids[key] = f"t{len(ids)}"
        return ids[key]

    def color(t: Tensor) -> str:
        prio = sched.backend_prio(sched.tensor_backend(t))
        return BACKEND_COLORS[int(prio) % len(BACKEND_COLORS)] if prio != float("inf") else "white"

    def decl(t: Tensor, extra: str = "") -> str:
        backend = sched.tensor_backend(t)
        name = backend.name() if backend is not None else "NULL"
        return (f'"{node_id(t)}" [ style = "filled{extra}"; fillcolor = "{color(t)}"; shape = record; '
                f'label = "{_label(t, name, sched.tensor_cause(t))}"; ];')

    lines = ["digraph G {", "  newrank = true;", "  rankdir = TB;", "  compound = true;"]
    # legend
    lines.append('  subgraph cluster_legend { label = "backends"; style = dashed;')
    for i, b in enumerate(sched.backends):
        lines.append(f'    "legend{i}" [ style = filled; fillcolor = "{BACKEND_COLORS[i % len(BACKEND_COLORS)]}"; '
                     f'shape = box; label = "#{i} {_escape(b.name())}"; ];')
    lines.append("  }")

    for leaf in graph.leafs:
        lines.append("  " + decl(leaf))

    copies_of: dict[int, list[Tensor]] = {}
    for split_index, split in enumerate(sched.splits):
        backend = split.backend
        prio = int(sched.backend_prio(backend)) if backend is not None else -1
        inputs = ", ".join(_escape(t.name) for t in split.inputs)
        lines.append(f"  subgraph cluster_{split_index} {{")
        lines.append(f'    label = "split {split_index}: #{prio} {_escape(backend.name() if backend else "NULL")}'
                     f' (nodes {split.i_start}..{split.i_end}){"; inputs: " + inputs if inputs else ""}";')
        lines.append("    style = rounded;")
        for inp in split.inputs:
            cpy = sched.input_copy(inp, prio)
            if cpy is not None:
                lines.append("    " + decl(cpy, ",dashed"))
                copies_of.setdefault(id(cpy), []).append(inp)
        for node in graph.nodes[split.i_start:split.i_end]:
            lines.append("    " + decl(node))
        lines.append("  }")

    for node in graph.nodes:
        for j, src in enumerate(node.src):
            if src is None:
                continue
            if id(src) not in ids:  # a source outside the graph and the copies
                lines.append("  " + decl(src, ",dotted"))
            lines.append(f'  "{node_id(src)}" -> "{node_id(node)}" [ arrowhead = vee; label = "src {j}"; ];')
    for cpy_id, inputs in copies_of.items():
        for inp in inputs:
            if id(inp) not in ids:
                lines.append("  " + decl(inp, ",dotted"))
            lines.append(f'  "{node_id(inp)}" -> "{ids[cpy_id]}" [ arrowhead = vee; style = dashed; label = "copy"; ];')
    lines.append("}")
    return "\n".join(lines) + "\n"
