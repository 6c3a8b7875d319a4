"""The scheduler's part of ggml-backend.h by its C names, each a thin call into `pyggml.sched.Scheduler`.

`ggml_backend_sched_t` is a `Scheduler`. `ggml_backend_sched_new` takes the
backends as a sequence and, like C, their count (which must not exceed the
sequence's length). `ggml_backend_sched_reset` and
`ggml_backend_sched_get_node_backend` are not in the seed (its reset is the
static `sched_reset`); they are ggml's names for them from a little later.
`ggml_backend_sched_reserve` (in its own section below) is not in the seed
either: ggml added it later, with the graph allocator's "reserve"; nor are
`ggml_backend_sched_set_tensor_backend`/`get_tensor_backend`, ggml's later
names of set/get_node_backend. Bad arguments raise the Scheduler's own errors.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer
from pyggml.core.checks import check_int
from pyggml.core.errors import ArgumentError, ArgumentTypeError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.sched.scheduler import GGML_MAX_BACKENDS, GGML_MAX_SPLIT_INPUTS, GGML_MAX_SPLITS, Scheduler

__all__ = [
    "GGML_MAX_BACKENDS", "GGML_MAX_SPLITS", "GGML_MAX_SPLIT_INPUTS",
    "ggml_backend_sched_new", "ggml_backend_sched_free", "ggml_backend_sched_init_measure",
    "ggml_backend_sched_graph_compute", "ggml_backend_sched_get_tallocr", "ggml_backend_sched_get_buffer",
    "ggml_backend_sched_set_node_backend", "ggml_backend_sched_get_node_backend", "ggml_backend_sched_reset",
    "ggml_backend_sched_reserve", "ggml_backend_sched_set_tensor_backend", "ggml_backend_sched_get_tensor_backend",
]


def ggml_backend_sched_new(backends: Sequence[Backend], n_backends: int | None = None) -> Scheduler:
    """A scheduler over the first `n_backends` of `backends` (all of them if None), in priority order."""
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
        raise ArgumentTypeError(f"ggml_backend_sched_new: backends must be a sequence of Backends, got "
                                f"{type(backends).__name__}")
    backends = list(backends)
    if n_backends is None:
        n_backends = len(backends)
    n_backends = check_int(n_backends, "ggml_backend_sched_new: n_backends")
    if not 0 <= n_backends <= len(backends):
        raise ArgumentError(f"ggml_backend_sched_new: n_backends {n_backends} but {len(backends)} backends given")
    return Scheduler(backends[:n_backends])


def ggml_backend_sched_free(sched: Scheduler | None) -> None:
    if sched is None:
        return
    sched.free()


def ggml_backend_sched_init_measure(sched: Scheduler, measure_graph: Graph) -> None:
    sched.init_measure(measure_graph)


def ggml_backend_sched_graph_compute(sched: Scheduler, graph: Graph) -> None:
    sched.graph_compute(graph)


def ggml_backend_sched_get_tallocr(sched: Scheduler, backend: Backend) -> TensorAllocator:
    return sched.get_tallocr(backend)


def ggml_backend_sched_get_buffer(sched: Scheduler, backend: Backend) -> Buffer:
    return sched.get_buffer(backend)


def ggml_backend_sched_set_node_backend(sched: Scheduler, node: Tensor, backend: Backend) -> None:
    sched.set_node_backend(node, backend)


def ggml_backend_sched_get_node_backend(sched: Scheduler, node: Tensor) -> Backend | None:
    return sched.get_node_backend(node)


def ggml_backend_sched_reset(sched: Scheduler) -> None:
    sched.reset()


def ggml_backend_sched_set_tensor_backend(sched: Scheduler, node: Tensor, backend: Backend) -> None:
    sched.set_tensor_backend(node, backend)


def ggml_backend_sched_get_tensor_backend(sched: Scheduler, node: Tensor) -> Backend | None:
    return sched.get_tensor_backend(node)


# --- not in the seed: ggml's later names ---


def ggml_backend_sched_reserve(sched: Scheduler, measure_graph: Graph) -> bool:
    """Grow the compute buffers so that `measure_graph` fits (Scheduler.reserve); the graph stays usable.

    Returns True as ggml's does (failures raise GGMLErrors here).
    """
    sched.reserve(measure_graph)
    return True
