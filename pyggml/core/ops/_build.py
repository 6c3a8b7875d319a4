"""What every op builder shares: argument checks, result tensors and shape errors."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar

from pyggml.core.checks import check_instance, check_int, check_real
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import OpParams
from pyggml.core.tensor import GGMLOp, Tensor, shape_str

if TYPE_CHECKING:
    from pyggml.core.context import Context

E = TypeVar("E", bound=IntEnum)

# --- argument checks of every builder, from its annotations ---

_TENSOR, _OPT_TENSOR, _INT, _FLOAT, _CONTEXT = "Tensor", "Tensor | None", "int", "float", "Context"


def check_arg(op: str, name: str, kind: str, value: object) -> None:
    """Raise ArgumentTypeError naming the op and the argument unless `value` is of the annotated `kind`.

    Tensors must be `Tensor`s (an int, None or a numpy array is not), ints integral (2.5 and True are
    refused, as `check_int` does), floats real numbers (not bools or strings).
    """
    if kind == _TENSOR or kind == _OPT_TENSOR:
        if not isinstance(value, Tensor) and not (value is None and kind == _OPT_TENSOR):
            check_instance(value, Tensor, f"{op}: argument '{name}'")
    elif kind == _INT:
        check_int(value, f"{op}: argument '{name}'")
    elif kind == _FLOAT:
        check_real(value, f"{op}: argument '{name}'")
    elif kind == _CONTEXT:
        from pyggml.core.context import Context

        check_instance(value, Context, f"{op}: argument '{name}'")


# classes that pass a kind's check without calling `check_arg` (the common case costs one set lookup)
_PLAIN: dict[str, frozenset[type]] = {
    _TENSOR: frozenset({Tensor}), _OPT_TENSOR: frozenset({Tensor, type(None)}), _INT: frozenset({int}),
    _FLOAT: frozenset({float, int}), _CONTEXT: frozenset(),
}


def checked_builder(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` with its arguments checked against its annotations (`check_arg`) before it runs.

    The builders' annotations are strings (`from __future__ import annotations`): 'Tensor',
    'Tensor | None', 'int', 'float' and 'Context' are checked, anything else is left to the builder.
    If the builder itself fails, the tensors it made are taken back (`Context.rollback`).
    Every builder gets this once, in `pyggml.core.ops` (not a check per builder).
    """
    specs = tuple((i, p.name, p.annotation, _PLAIN[p.annotation], p.annotation == _CONTEXT)
                  for i, p in enumerate(inspect.signature(fn).parameters.values()) if p.annotation in _PLAIN)
    op = fn.__name__
    plain_contexts: set[type] = set()  # Context and its subclasses, learnt at the first call (no import cycle)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Tensor:
        n = len(args)
        for i, name, kind, plain, is_context in specs:
            if i < n:
                value = args[i]
            elif name in kwargs:
                value = kwargs[name]
            else:
                continue
            cls = value.__class__
            if cls in plain or (is_context and cls in plain_contexts):
                continue
            check_arg(op, name, kind, value)
            if is_context:
                plain_contexts.add(cls)
        ctx = args[0] if args else kwargs["ctx"]
        mark = ctx.mark()
        try:
            return fn(*args, **kwargs)
        except BaseException:
            # a check that fails after the result (or a part of a composite op) was made takes it back:
            # a failed builder leaves the context's pool and tensors as they were
            ctx.rollback(mark)
            raise

    return wrapper


def as_enum(cls: type[E], value: object, op: str, name: str) -> E:
    """`value` as a member of the IntEnum `cls`, or ArgumentError/ArgumentTypeError naming the op and argument."""
    if isinstance(value, cls):
        return value
    v = check_int(value, f"{op}: argument '{name}'")
    try:
        return cls(v)
    except ValueError:
        valid = ", ".join(f"{m.name}={int(m)}" for m in cls)
        raise ArgumentError(f"{op}: argument '{name}' = {v} is not a {cls.__name__} ({valid})") from None


def require(cond: bool, op: str, message: str, *tensors: Tensor) -> None:
    """Raise ShapeError naming the op, the rule and the operands' shapes unless `cond`."""
    if not cond:
        operands = ", ".join(shape_str(t) for t in tensors)
        raise ShapeError(f"{op}: {message} ({operands})" if tensors else f"{op}: {message}")


def require_arg(cond: bool, op: str, message: str, *tensors: Tensor) -> None:
    """Raise ArgumentError (an op parameter out of range) naming the op and the operands unless `cond`."""
    if not cond:
        operands = ", ".join(shape_str(t) for t in tensors)
        raise ArgumentError(f"{op}: {message} ({operands})" if tensors else f"{op}: {message}")


def set_op(result: Tensor, op: GGMLOp, *srcs: Tensor | None, params: OpParams | None = None) -> Tensor:
    """Make `result` the node of `op` over `srcs` (in order, ggml's src[0], src[1], ...), its op_params
    written by `params` (a layout of `pyggml.core.ops.params` for this op)."""
    if params is not None and op not in params.ops:
        raise TypeError(f"{type(params).__name__} is not the op_params layout of {op.name}")
    result.op = op
    for i, s in enumerate(srcs):
        result.src[i] = s
    if params is not None:
        params.store(result)
    return result


def same_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    """ggml's `inplace ? ggml_view_tensor(ctx, a) : ggml_dup_tensor(ctx, a)`."""
    return ctx.view_tensor(a) if inplace else ctx.dup_tensor(a)
