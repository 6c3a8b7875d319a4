"""`BackendSched.stats`: the scheduler's own time per compute, and per backend its copies and compute time."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BackendStats:
    """One backend's share of the last compute."""

    name: str
    n_splits: int = 0
    n_copies: int = 0  # split inputs copied into this backend
    bytes_copied: int = 0
    copy_time: float = 0.0  # seconds
    compute_time: float = 0.0  # seconds


@dataclass
class SchedStats:
    """The last `graph_compute` (or `init_measure`, which has no copy or compute)."""

    n_nodes: int = 0
    n_splits: int = 0
    split_time: float = 0.0  # seconds in the assignment passes and the split
    alloc_time: float = 0.0  # seconds in the graph allocator
    # CPU seconds: the wall times also count what preempts the thread (other processes, a late pool worker)
    sched_cpu_time: float = 0.0
    reused: bool = False  # the graph was allocated before: no split, no allocation
    restored: bool = False  # the graph was kept aside since its last allocation (BackendSched.keep_graphs)
    total_time: float = 0.0  # seconds of the whole graph_compute call (its own time: minus copies and kernels)
    backends: list[BackendStats] = field(default_factory=list)

    @property
    def sched_time(self) -> float:
        """The scheduler's own time: split + alloc."""
        return self.split_time + self.alloc_time

    @property
    def copy_time(self) -> float:
        return sum(b.copy_time for b in self.backends)

    @property
    def compute_time(self) -> float:
        return sum(b.compute_time for b in self.backends)

    @property
    def bytes_copied(self) -> int:
        return sum(b.bytes_copied for b in self.backends)

    def format(self) -> str:
        """A few lines for logs: the totals, then one line per backend (as ggml's timing printout)."""
        how = "reused" if self.reused else "taken up again (kept since its last allocation)" if self.restored else (
            f"split {self.split_time * 1e3:.3f} ms, alloc {self.alloc_time * 1e3:.3f} ms")
        lines = [f"sched: {self.n_nodes} nodes in {self.n_splits} splits; {how}"]
        for i, b in enumerate(self.backends):
            lines.append(f"  #{i} {b.name}: {b.n_splits} splits, copy {b.copy_time * 1e3:.3f} ms "
                         f"({b.n_copies} inputs, {format_bytes(b.bytes_copied)}), "
                         f"compute {b.compute_time * 1e3:.3f} ms")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def format_bytes(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.2f} KiB"
    return f"{n} B"
