"""pyggml.sched: the scheduler. `BackendSched` is today's ggml_backend_sched, the engine every model graph runs
through; `Scheduler` is the seed's (late 2023: its assignment passes and init_measure API), kept as the seed mode."""

from pyggml.sched.debug import fmt_size, format_assignments
from pyggml.sched.graphviz import sched_to_dot
from pyggml.sched.sched import GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_COPIES, BackendSched, SchedSplit
from pyggml.sched.scheduler import (
    DEBUG_ENV,
    GGML_MAX_BACKENDS,
    GGML_MAX_SPLIT_INPUTS,
    GGML_MAX_SPLITS,
    Scheduler,
    debug_enabled,
    dup_tensor_layout,
)
from pyggml.sched.split import Split
from pyggml.sched.stats import BackendStats, SchedStats

__all__ = ["DEBUG_ENV", "GGML_MAX_BACKENDS", "GGML_MAX_SPLITS", "GGML_MAX_SPLIT_INPUTS", "GGML_SCHED_MAX_BACKENDS",
           "GGML_SCHED_MAX_COPIES", "BackendSched", "BackendStats", "SchedSplit", "SchedStats", "Scheduler", "Split",
           "debug_enabled", "dup_tensor_layout", "fmt_size", "format_assignments", "sched_to_dot"]
