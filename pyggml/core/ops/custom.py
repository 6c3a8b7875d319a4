"""MAP_CUSTOM1/2/3: ops whose function is a Python callable.

The function is called by the backend as ggml calls a `ggml_custom*_op_t`:
`fun(dst, a, ith, nth, userdata)` (custom1), `fun(dst, a, b, ith, nth, userdata)`
(custom2), `fun(dst, a, b, c, ith, nth, userdata)` (custom3), with the tensors
as `Tensor` objects (read and write them through `.numpy()`), once per task
`ith` in [0, nth).

Where the function lives: ggml stores a struct {fun, n_tasks, userdata} in the
node's op_params. Python objects do not fit in int32 words, so pyggml keeps a
`MapCustomParams` in a table keyed weakly by the node (`custom_op_params(node)`
reads it back; the entry goes away with the node) and stores n_tasks in
op_params[0] so that planners can read it like any other parameter.
`tensor.extra` is left alone: it belongs to the backends.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyggml.core.errors import ArgumentError
from pyggml.core.ops._build import require_arg, same_or_view, set_op
from pyggml.core.tensor import GGMLOp, Tensor

if TYPE_CHECKING:
    from pyggml.core.context import Context

GGML_N_TASKS_MAX = -1  # n_tasks: as many tasks as the backend has threads


@dataclass(frozen=True)
class MapCustomParams:
    """ggml's `ggml_map_custom{1,2,3}_op_params`."""

    fun: Callable[..., None]
    n_tasks: int
    userdata: Any


_PARAMS: weakref.WeakKeyDictionary[Tensor, MapCustomParams] = weakref.WeakKeyDictionary()


def custom_op_params(node: Tensor) -> MapCustomParams:
    """The function, task count and userdata of a MAP_CUSTOM1/2/3 node."""
    params = _PARAMS.get(node)
    if params is None:
        raise ArgumentError(f"'{node.name}' ({node.op.name}) is not a map_custom node with a function")
    return params


def _map_custom(ctx: Context, op: GGMLOp, srcs: list[Tensor], fun: Callable[..., None], n_tasks: int,
                userdata: Any, inplace: bool) -> Tensor:
    fn = f"map_custom{len(srcs)}" + ("_inplace" if inplace else "")
    require_arg(callable(fun), fn, f"fun must be callable, got {type(fun).__name__}", *srcs)
    require_arg(n_tasks == GGML_N_TASKS_MAX or n_tasks > 0, fn,
                f"n_tasks must be > 0 or GGML_N_TASKS_MAX (-1), got {n_tasks}", *srcs)
    result = same_or_view(ctx, srcs[0], inplace)
    set_op(result, op, *srcs, params=[n_tasks])
    _PARAMS[result] = MapCustomParams(fun, n_tasks, userdata)
    return result


def map_custom1(ctx: Context, a: Tensor, fun: Callable[..., None], n_tasks: int = GGML_N_TASKS_MAX,
                userdata: Any = None) -> Tensor:
    """A new tensor of a's shape computed by fun(dst, a, ith, nth, userdata)."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM1, [a], fun, n_tasks, userdata, False)


def map_custom1_inplace(ctx: Context, a: Tensor, fun: Callable[..., None], n_tasks: int = GGML_N_TASKS_MAX,
                        userdata: Any = None) -> Tensor:
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM1, [a], fun, n_tasks, userdata, True)


def map_custom2(ctx: Context, a: Tensor, b: Tensor, fun: Callable[..., None], n_tasks: int = GGML_N_TASKS_MAX,
                userdata: Any = None) -> Tensor:
    """A new tensor of a's shape computed by fun(dst, a, b, ith, nth, userdata)."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM2, [a, b], fun, n_tasks, userdata, False)


def map_custom2_inplace(ctx: Context, a: Tensor, b: Tensor, fun: Callable[..., None],
                        n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM2, [a, b], fun, n_tasks, userdata, True)


def map_custom3(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable[..., None],
                n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    """A new tensor of a's shape computed by fun(dst, a, b, c, ith, nth, userdata)."""
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM3, [a, b, c], fun, n_tasks, userdata, False)


def map_custom3_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: Callable[..., None],
                        n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    return _map_custom(ctx, GGMLOp.MAP_CUSTOM3, [a, b, c], fun, n_tasks, userdata, True)


__all__ = [
    "GGML_N_TASKS_MAX", "MapCustomParams", "custom_op_params",
    "map_custom1", "map_custom1_inplace", "map_custom2", "map_custom2_inplace", "map_custom3", "map_custom3_inplace",
]
