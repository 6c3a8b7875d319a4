"""The scheduler's part of ggml-backend.h by its C names, each a thin call into `pyggml.sched.BackendSched`
(from the six-argument `ggml_backend_sched_new`) or, for the two-argument form of late-2023 ggml,
`pyggml.seed.Scheduler`.

`ggml_backend_sched_t` is either. `ggml_backend_sched_new` takes the
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
from typing import Any

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.checks import check_int
from pyggml.core.context import GGML_DEFAULT_GRAPH_SIZE
from pyggml.core.errors import ArgumentError, ArgumentTypeError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.sched.backend_sched import GGML_SCHED_MAX_BACKENDS, GGML_SCHED_MAX_COPIES, BackendSched, EvalCallback
from pyggml.seed import capi as seed_capi
from pyggml.seed.scheduler import GGML_MAX_BACKENDS, GGML_MAX_SPLIT_INPUTS, GGML_MAX_SPLITS, Scheduler

GGML_STATUS_SUCCESS = 0

__all__ = [
    "GGML_MAX_BACKENDS", "GGML_MAX_SPLITS", "GGML_MAX_SPLIT_INPUTS",
    "ggml_backend_sched_new", "ggml_backend_sched_free", "ggml_backend_sched_init_measure",
    "ggml_backend_sched_graph_compute", "ggml_backend_sched_get_tallocr", "ggml_backend_sched_get_buffer",
    "ggml_backend_sched_set_node_backend", "ggml_backend_sched_get_node_backend", "ggml_backend_sched_reset",
    "ggml_backend_sched_reserve", "ggml_backend_sched_set_tensor_backend", "ggml_backend_sched_get_tensor_backend",
    "GGML_SCHED_MAX_BACKENDS", "GGML_SCHED_MAX_COPIES", "GGML_STATUS_SUCCESS", "ggml_backend_sched_reserve_size",
    "ggml_backend_sched_alloc_graph", "ggml_backend_sched_graph_compute_async", "ggml_backend_sched_synchronize",
    "ggml_backend_sched_set_eval_callback", "ggml_backend_sched_get_n_splits", "ggml_backend_sched_get_n_copies",
    "ggml_backend_sched_get_n_backends", "ggml_backend_sched_get_backend", "ggml_backend_sched_get_buffer_type",
    "ggml_backend_sched_get_buffer_size",
]


def ggml_backend_sched_new(backends: Sequence[Backend], *args: Any, **kwargs: Any) -> Scheduler | BackendSched:
    """`ggml_backend_sched_new(backends, bufts, n_backends, graph_size, parallel, op_offload)` (a
    `BackendSched`: bufts None for the backends' defaults), or the two-argument form
    `ggml_backend_sched_new(backends, n_backends)` (a `pyggml.seed.Scheduler`) when called with at most the count."""
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
        raise ArgumentTypeError(f"ggml_backend_sched_new: backends must be a sequence of Backends, got "
                                f"{type(backends).__name__}")
    backends = list(backends)
    # the two-argument form: at most a count (anything but a sequence of buffer types: check_int judges it)
    seed = not kwargs and len(args) <= 1 and (not args or not isinstance(args[0], Sequence))
    if seed:
        return seed_capi.ggml_backend_sched_new(backends, _count(args[0] if args else None, len(backends)))
    names = ("bufts", "n_backends", "graph_size", "parallel", "op_offload")
    if len(args) > len(names):
        raise ArgumentError(f"ggml_backend_sched_new: {1 + len(args)} arguments, at most 6")
    given = dict(zip(names, args, strict=False))
    for key in kwargs:
        if key not in names or key in given:
            raise ArgumentError(f"ggml_backend_sched_new: unexpected or repeated argument '{key}'")
    given.update(kwargs)
    n_backends = _count(given.get("n_backends"), len(backends))
    bufts = given.get("bufts")
    return BackendSched(backends[:n_backends], None if bufts is None else list(bufts)[:n_backends],
                        graph_size=given.get("graph_size", GGML_DEFAULT_GRAPH_SIZE),
                        parallel=bool(given.get("parallel", False)), op_offload=bool(given.get("op_offload", True)))


def _count(n_backends: int | None, n_given: int) -> int:
    if n_backends is None:
        return n_given
    n = check_int(n_backends, "ggml_backend_sched_new: n_backends")
    if not 0 <= n <= n_given:
        raise ArgumentError(f"ggml_backend_sched_new: n_backends {n} but {n_given} backends given")
    return n


def _today(sched: object, what: str) -> BackendSched:
    if not isinstance(sched, BackendSched):
        raise ArgumentTypeError(f"{what}: needs a scheduler of the six-argument ggml_backend_sched_new, got "
                                f"{type(sched).__name__}")
    return sched


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


def ggml_backend_sched_reserve(sched: Scheduler | BackendSched, measure_graph: Graph) -> bool:
    """Grow the compute buffers so that `measure_graph` fits; the graph stays usable.

    Returns True as ggml's does (failures raise GGMLErrors here).
    """
    sched.reserve(measure_graph)
    return True


# --- ggml_backend_sched of llama.cpp 0c1e570 (pyggml.sched.BackendSched) ---


def ggml_backend_sched_reserve_size(sched: BackendSched, measure_graph: Graph) -> list[int]:
    """The bytes each backend's compute buffer needs for `measure_graph` (C fills a sizes array)."""
    return _today(sched, "ggml_backend_sched_reserve_size").reserve_size(measure_graph)


def ggml_backend_sched_alloc_graph(sched: BackendSched, graph: Graph) -> bool:
    _today(sched, "ggml_backend_sched_alloc_graph").alloc_graph(graph)
    return True


def ggml_backend_sched_graph_compute_async(sched: BackendSched, graph: Graph) -> int:
    _today(sched, "ggml_backend_sched_graph_compute_async").graph_compute_async(graph)
    return GGML_STATUS_SUCCESS


def ggml_backend_sched_synchronize(sched: BackendSched) -> None:
    _today(sched, "ggml_backend_sched_synchronize").synchronize()


def ggml_backend_sched_set_eval_callback(sched: BackendSched, callback: EvalCallback | None,
                                         user_data: Any = None) -> None:
    """`callback(tensor, ask, user_data)` as C calls it."""
    today = _today(sched, "ggml_backend_sched_set_eval_callback")
    if callback is None:
        today.set_eval_callback(None)
        return
    if not callable(callback):
        raise ArgumentTypeError(f"ggml_backend_sched_set_eval_callback: {type(callback).__name__} is not callable")
    today.set_eval_callback(lambda t, ask: bool(callback(t, ask, user_data)))  # type: ignore[call-arg]


def ggml_backend_sched_get_n_splits(sched: BackendSched) -> int:
    return _today(sched, "ggml_backend_sched_get_n_splits").get_n_splits()


def ggml_backend_sched_get_n_copies(sched: BackendSched) -> int:
    return _today(sched, "ggml_backend_sched_get_n_copies").get_n_copies()


def ggml_backend_sched_get_n_backends(sched: BackendSched) -> int:
    return _today(sched, "ggml_backend_sched_get_n_backends").get_n_backends()


def ggml_backend_sched_get_backend(sched: BackendSched, i: int) -> Backend:
    return _today(sched, "ggml_backend_sched_get_backend").get_backend(check_int(i, "ggml_backend_sched_get_backend"))


def ggml_backend_sched_get_buffer_type(sched: BackendSched, backend: Backend) -> BufferType:
    return _today(sched, "ggml_backend_sched_get_buffer_type").get_buffer_type(backend)


def ggml_backend_sched_get_buffer_size(sched: BackendSched, backend: Backend) -> int:
    return _today(sched, "ggml_backend_sched_get_buffer_size").get_buffer_size(backend)
