"""The scheduler's assignment printout (ggml_backend_sched_print_assignments), as text for `logging`.

GGML_SCHED_DEBUG (anything but "0") with DEBUG logging of "pyggml.sched" prints it after every split.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pyggml.core.tensor import Tensor, is_view_op

if TYPE_CHECKING:
    from pyggml.core.graph import Graph
    from pyggml.sched.backend_sched import BackendSched

DEBUG_ENV = "GGML_SCHED_DEBUG"


def debug_enabled() -> bool:
    """Whether GGML_SCHED_DEBUG asks for the assignment printout (any value but "", "0")."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fmt_size(size: int) -> str:
    """ggml-backend.cpp's fmt_size: whole MiB above 1 MiB, else whole KiB."""
    if size >= 1024 * 1024:
        return f"{size // 1024 // 1024}M"
    return f"{size // 1024}K"


def _fit(s: str, width: int) -> str:
    """printf's %W.Ws: truncated to `width`, right-aligned in it."""
    return f"{s[:width]:>{width}}"


def format_assignments(sched: BackendSched, graph: Graph) -> str:
    """The printout of the last split of `graph` (the graph the scheduler split last)."""
    lines: list[str] = []

    def where(t: Tensor) -> tuple[str, str]:
        backend = sched.tensor_backend(t)
        return (backend.name() if backend is not None else "NULL"), sched.tensor_cause(t)

    cur_split = 0
    splits = sched.splits
    for i, node in enumerate(graph.nodes):
        if cur_split < len(splits) and i == splits[cur_split].i_start:
            split = splits[cur_split]
            backend = split.backend
            inputs = "".join(f"[{t.name} ({_fit(fmt_size(t.nbytes()), 5)})] " for t in split.inputs)
            lines.append("")
            lines.append(f"## SPLIT #{cur_split}: {backend.name() if backend else 'NULL'} # {split.n_inputs} "
                         f"inputs: {inputs}")
            cur_split += 1
        if is_view_op(node.op):
            continue
        name, cause = where(node)
        line = (f"node #{i:3d} ({_fit(node.op.name, 10)}): {_fit(node.name, 20)} ({_fit(fmt_size(node.nbytes()), 4)}) "
                f"[{_fit(name, 4)} {_fit(cause, 8)}]:")
        for src in node.src:
            if src is None:
                break
            src_name, src_cause = where(src)
            line += (f" {_fit(src.name, 20)} ({_fit(fmt_size(src.nbytes()), 4)}) "
                     f"[{_fit(src_name, 4)} {_fit(src_cause, 8)}]")
        lines.append(line)
    return "\n".join(lines)
