"""Threads of the CPU kernels: Python threads that run `nogil` numba kernels beside the caller.

Why not numba's `parallel=True`: its OpenMP runtime (libgomp) makes the
calling thread spin at the end of each parallel region until every worker has
checked in. On a loaded machine a worker is often not scheduled for a whole
time slice, and the region then takes milliseconds whatever its size
(measured on 2 shared cores: 7.5 ms for a 256x256 mat-vec that takes 20 us on
one thread, 7.5 ms for a 4096x4096 one that takes 4 ms). OMP_WAIT_POLICY=passive
cures it only if set before a libgomp is loaded, and `import torch` loads its
own copy (same soname, which numba's OpenMP layer then uses).

Here the caller queues the job for `n - 1` pool threads and runs it itself;
the kernel takes its work items from an atomic counter (ggml's chunked
scheduling), so a worker that wakes late finds fewer items, or none, and the
caller never waits for a worker that has not started, only for items in
flight. A late worker running a job whose call has returned finds the counter
exhausted and returns, or, if the same prepared kernel has started its next
call meanwhile, helps with that one (same operands), which is as correct.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("pyggml.backends.cpu")


class WorkerPool:
    """Daemon threads taking jobs (functions of no arguments) from one queue."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job()
            except BaseException:  # a worker must survive; the caller's own share raises for it
                log.exception("CPU worker thread: job failed")

    def ensure(self, n_workers: int) -> None:
        """Start threads until there are at least `n_workers`."""
        if len(self.workers) >= n_workers:
            return
        with self.lock:
            while len(self.workers) < n_workers:
                t = threading.Thread(target=self._loop, name=f"pyggml-cpu-{len(self.workers)}", daemon=True)
                t.start()
                self.workers.append(t)

    def submit(self, job: Callable[[], None], n_workers: int) -> None:
        """Queue `job` for `n_workers` threads (each that picks it up runs it once)."""
        self.ensure(n_workers)
        for _ in range(n_workers):
            self.jobs.put(job)


POOL = WorkerPool()
