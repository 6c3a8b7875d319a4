"""Timing shared by the benchmarks: the median of repeated runs after one warm-up run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of one call of `fn`: the median of `repeats` calls after a warm-up call (JIT, page faults, plans)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
