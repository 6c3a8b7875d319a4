"""MAP_CUSTOM1/2/3 and CUSTOM: ops whose function is a Python callable.

The function is called by the backend as ggml calls a `ggml_custom*_op_t`:
`fun(dst, a, ith, nth, userdata)` (custom1), `fun(dst, a, b, ith, nth, userdata)`
(custom2), `fun(dst, a, b, c, ith, nth, userdata)` (custom3), `fun(dst, ith,
nth, userdata)` (CUSTOM: the arguments are dst.src), with the tensors as
`Tensor` objects (read and write them through `.numpy()`), once per task `ith`
in [0, nth).

Where the function lives: ggml stores a struct {fun, n_tasks, userdata} in the
node's op_params. Python objects do not fit in int32 words, so pyggml keeps a
`MapCustomParams` in a table keyed weakly by the node (`custom_op_params(node)`
reads it back; the entry goes away with the node) and writes the struct's words
with the pointers 0 and n_tasks where C has it (`CustomParams`), so planners
read it like any other parameter. `tensor.extra` is left alone: it belongs to
the backends.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyggml.core.errors import ArgumentError
from pyggml.core.ops._build import require_arg, same_or_view, set_op
from pyggml.core.ops.params import CustomParams
from pyggml.core.tensor import GGML_MAX_SRC, GGMLOp, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context

GGML_N_TASKS_MAX = -1  # n_tasks: as many tasks as the backend has threads


@dataclass(frozen=True)
class MapCustomParams:
    """ggml's `ggml_map_custom{1,2,3}_op_params` and `ggml_custom_op_params`."""

    fun: Callable[..., None]
    n_tasks: int
    userdata: Any


_PARAMS: weakref.WeakKeyDictionary[Tensor, MapCustomParams] = weakref.WeakKeyDictionary()


def custom_op_params(node: Tensor) -> MapCustomParams:
    """The function, task count and userdata of a MAP_CUSTOM1/2/3 node."""
    params = _PARAMS.get(node)
    if params is None:
        raise ArgumentError(f"'{node.name}' ({node.op.name}) is not a custom node with a function")
    return params


def _check_fun(fn: str, fun: Callable[..., None], n_tasks: int, srcs: list[Tensor]) -> None:
    require_arg(callable(fun), fn, f"fun must be callable, got {type(fun).__name__}", *srcs)
    require_arg(n_tasks == GGML_N_TASKS_MAX or n_tasks > 0, fn,
                f"n_tasks must be > 0 or GGML_N_TASKS_MAX (-1), got {n_tasks}", *srcs)


def _set_custom(result: Tensor, op: GGMLOp, srcs: list[Tensor], fun: Callable[..., None], n_tasks: int,
                userdata: Any) -> Tensor:
    set_op(result, op, *srcs, params=CustomParams(n_tasks=n_tasks))
    _PARAMS[result] = MapCustomParams(fun, n_tasks, userdata)
    return result


def _map_custom(ctx: Context, op: GGMLOp, srcs: list[Tensor], fun: Callable[..., None], n_tasks: int,
                userdata: Any, inplace: bool) -> Tensor:
    _check_fun(f"map_custom{len(srcs)}" + ("_inplace" if inplace else ""), fun, n_tasks, srcs)
    return _set_custom(same_or_view(ctx, srcs[0], inplace), op, srcs, fun, n_tasks, userdata)


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


def custom_4d(ctx: Context, type: GGMLType, ne0: int, ne1: int, ne2: int, ne3: int, args: list[Tensor],
              fun: Callable[..., None], n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    """CUSTOM: a new [ne0, ne1, ne2, ne3] tensor of `type` computed by fun(dst, ith, nth, userdata), the
    arguments in dst.src (ggml_custom_4d)."""
    require_arg(len(args) < GGML_MAX_SRC, "custom_4d", f"{len(args)} args, at most {GGML_MAX_SRC - 1}", *args)
    _check_fun("custom_4d", fun, n_tasks, args)
    return _set_custom(ctx.new_tensor_4d(type, ne0, ne1, ne2, ne3), GGMLOp.CUSTOM, args, fun, n_tasks, userdata)


def custom_inplace(ctx: Context, a: Tensor, args: list[Tensor], fun: Callable[..., None],
                   n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    """CUSTOM computed in place: a view of `a` (src[0]), the arguments after it (ggml_custom_inplace)."""
    require_arg(len(args) < GGML_MAX_SRC - 1, "custom_inplace", f"{len(args)} args, at most {GGML_MAX_SRC - 2}",
                a, *args)
    _check_fun("custom_inplace", fun, n_tasks, [a, *args])
    return _set_custom(ctx.view_tensor(a), GGMLOp.CUSTOM, [a, *args], fun, n_tasks, userdata)


__all__ = [
    "GGML_N_TASKS_MAX", "MapCustomParams", "custom_4d", "custom_inplace", "custom_op_params",
    "map_custom1", "map_custom1_inplace", "map_custom2", "map_custom2_inplace", "map_custom3", "map_custom3_inplace",
]
