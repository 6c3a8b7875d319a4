"""The seed's C API form of the scheduler's constructor: `ggml_backend_sched_new(backends, n_backends)`.

`pyggml.capi.sched.ggml_backend_sched_new` calls it when given at most a count (the six-argument form
makes a `pyggml.sched.BackendSched`); the other `ggml_backend_sched_*` functions take either scheduler.
"""

from __future__ import annotations

from pyggml.ggml_backend.backend import Backend
from pyggml.seed.scheduler import Scheduler


def ggml_backend_sched_new(backends: list[Backend], n_backends: int) -> Scheduler:
    """The seed's `ggml_backend_sched_new`: a `Scheduler` over the first `n_backends` of `backends` (the count
    checked by the caller)."""
    return Scheduler(backends[:n_backends])
