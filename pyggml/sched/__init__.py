"""pyggml.sched: the scheduler. `BackendSched` is ggml_backend_sched (ggml-backend.cpp), the engine every model
graph runs through."""

from pyggml.sched.backend_sched import GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_COPIES, BackendSched, SchedSplit
from pyggml.sched.debug import DEBUG_ENV, debug_enabled, fmt_size, format_assignments
from pyggml.sched.graphviz import sched_to_dot
from pyggml.sched.passes import dup_tensor_layout
from pyggml.sched.stats import BackendStats, SchedStats

__all__ = ["DEBUG_ENV", "GGML_SCHED_MAX_BACKENDS", "GGML_SCHED_MAX_COPIES", "BackendSched", "BackendStats",
           "SchedSplit", "SchedStats", "debug_enabled", "dup_tensor_layout", "fmt_size", "format_assignments",
           "sched_to_dot"]
