"""Memory report of an allocated graph: where each tensor is, the peak, and the lower bound.

The lower bound is the largest total of tensors alive at one node step (views count as their owner, inputs
live from the start, outputs to the end): what any allocator needs for this node order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyggml.alloc.tensor_allocator import TensorAllocator, aligned_offset
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, TensorFlag

__all__ = ["MemoryReport", "ReportEntry", "memory_report"]


@dataclass
class ReportEntry:
    """One tensor in the buffer; `view_of` names the owner of its memory (a view, a node run in place)."""

    name: str
    op: str
    offset: int
    size: int
    view_of: str | None = None
    first_step: int = -1
    last_step: int = -1


@dataclass
class MemoryReport:
    """The report; `entries` in the order the steps first touch the tensors."""

    buffer_name: str
    entries: list[ReportEntry] = field(default_factory=list)
    peak: int = 0
    lower_bound: int = 0
    lower_bound_step: int = -1
    bytes_no_reuse: int = 0  # every owner its own memory
    n_steps: int = 0

    @property
    def ratio(self) -> float:
        """peak / lower_bound (1.0 is optimal for this order; 0 bytes needed gives 1.0)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0

    def format(self, max_rows: int | None = None) -> str:
        """A table: one row per tensor (offset, size, steps alive, what it is a view of), then the totals."""
        rows = [f"memory report of buffer '{self.buffer_name}' ({self.n_steps} steps)",
                f"{'offset':>12} {'size':>12} {'steps':>11}  {'op':<10} name"]
        shown = self.entries if max_rows is None else self.entries[:max_rows]
        for e in shown:
            steps = f"{e.first_step}-{e.last_step}" if e.first_step >= 0 else "-"
            view = f" (view of {e.view_of})" if e.view_of is not None else ""
            rows.append(f"{e.offset:>12} {e.size:>12} {steps:>11}  {e.op:<10} {e.name}{view}")
        if len(shown) < len(self.entries):
            rows.append(f"... {len(self.entries) - len(shown)} more tensors")
        rows.append(f"peak {self.peak} bytes, lower bound {self.lower_bound} bytes (at step "
                    f"{self.lower_bound_step}), peak/lower bound {self.ratio:.3f}, "
                    f"no reuse {self.bytes_no_reuse} bytes")
        return "\n".join(rows)

    def summary(self) -> str:
        """One line: the peak against the lower bound and against no reuse."""
        mib = 1 << 20
        return (f"buffer '{self.buffer_name}': peak {self.peak / mib:.2f} MiB, lower bound "
                f"{self.lower_bound / mib:.2f} MiB (peak/lower bound {self.ratio:.3f}), no reuse "
                f"{self.bytes_no_reuse / mib:.2f} MiB, {self.n_steps} nodes")

    def __str__(self) -> str:
        return self.format()


def _root(t: Tensor) -> Tensor:
    while t.view_src is not None:
        t = t.view_src
    return t


def _alignment(buffer: Any) -> int:
    try:
        return int(buffer.get_alignment())
    except Exception:  # a buffer with no backend (caller memory, the measure range) has no alignment to ask
        return 1


def memory_report(source: Graph | Iterable[Tensor], where: TensorAllocator | Any = None) -> MemoryReport:
    """The memory report of `source` (a Graph, or tensors in execution order) in one buffer.
    `where`: the TensorAllocator, a Buffer, or None for the buffer holding most of the nodes' bytes."""
    if isinstance(source, Graph):
        steps = list(source.nodes)
    else:
        steps = list(source)
    talloc = where if isinstance(where, TensorAllocator) else None
    buffer = talloc.buffer if talloc is not None else where
    if buffer is None:
        by_buffer: dict[int, list[Any]] = {}
        for t in steps:
            if t.view_src is None and t.buffer is not None:
                entry = by_buffer.setdefault(id(t.buffer), [t.buffer, 0])
                entry[1] += t.nbytes()
        if by_buffer:
            buffer = max(by_buffer.values(), key=lambda e: e[1])[0]
    report = MemoryReport(buffer_name=getattr(buffer, "name", "(none)"), n_steps=len(steps))
    if buffer is None:
        return report
    base = talloc.base if talloc is not None else buffer.get_base()
    alignment = talloc.alignment if talloc is not None else _alignment(buffer)

    def owner_size(t: Tensor) -> int:
        if talloc is not None:
            return talloc.alloc_size(t)
        return aligned_offset(None, buffer.get_alloc_size(t), alignment)

    # liveness of the owners (non-views) in this buffer, views counting as their owner
    entries: dict[int, ReportEntry] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    owners: dict[int, Tensor] = {}
    last_step = len(steps) - 1

    def touch(t: Tensor, step: int) -> None:
        if t.buffer is not buffer or t.data is None:
            return
        key = id(t)
        if key not in entries:
            root = _root(t)
            view_of = root.name if root is not t else None
            size = owner_size(t) if root is t else t.nbytes()
            entries[key] = ReportEntry(t.name, t.op.name, t.data - base, size, view_of)
        e = entries[key]
        if e.first_step < 0:
            e.first_step = step
        e.last_step = max(e.last_step, step)
        root = _root(t)
        if root.buffer is not buffer:
            return
        rk = id(root)
        owners[rk] = root
        start = 0 if root.flags & TensorFlag.INPUT else step
        first[rk] = min(first.get(rk, start), start)
        end = last_step if (t.flags & TensorFlag.OUTPUT or root.flags & TensorFlag.OUTPUT) else step
        last[rk] = max(last.get(rk, end), end)

    for i, node in enumerate(steps):
        for s in node.src:
            if s is None:
                break
            touch(s, i)
        touch(node, i)

    report.entries = list(entries.values())
    sizes = {rk: owner_size(t) for rk, t in owners.items()}
    report.bytes_no_reuse = sum(sizes.values())

    delta = [0] * (len(steps) + 1)
    for rk, size in sizes.items():
        delta[first[rk]] += size
        delta[last[rk] + 1] -= size
    alive = 0
    for i in range(len(steps)):
        alive += delta[i]
        if alive > report.lower_bound:
            report.lower_bound = alive
            report.lower_bound_step = i

    # the graph's own extent (a reused allocator's max_size may remember a bigger graph)
    report.peak = max((e.offset + e.size for e in report.entries if e.view_of is None), default=0)
    return report
