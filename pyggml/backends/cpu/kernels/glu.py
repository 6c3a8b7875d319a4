"""CPU kernel: GLU (ggml_compute_forward_glu and its seven functions in ggml-cpu/ops.cpp, vec.h).

dst = act(x) * g per row, x and g the two halves of src0's rows (fused form: x the first half, g the second,
or the other way with `swapped`; ne0 odd leaves the last element out) or src0 and src1 (split form).
Types as ggml's CPU: F32, F16, BF16 (SWIGLU_OAI F32 only, SWIGLU_CLAMP F32 and F16), src0, src1 and dst
of one type. Values are computed in f32 and stored once in dst's type, as ggml does; GEGLU and GEGLU_QUICK
on F32 and F16 data go through ggml's f16 tables (x rounded to f16, act rounded to f16; GEGLU on F32 with
the table's shortcuts 0 at x <= -10 and x at x >= 10), on BF16 data they are computed directly, as ggml's
ggml_vec_geglu_bf16 does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, element_math, graph_runner
from pyggml.backends.cpu.kernels._common import bf16_to_f32, f32_to_bf16, noop, reshape_view, scratch
from pyggml.backends.cpu.kernels.simd_math import host_lanes, silu_rows
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import GLUParams
from pyggml.core.tensor import GGMLOp, GLUOp, Tensor
from pyggml.core.types import GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16

# the types of ggml-cpu's kernel of each GLU function
GLU_TYPES: dict[GLUOp, tuple[GGMLType, ...]] = {
    GLUOp.REGLU: (F32, F16, BF16),
    GLUOp.GEGLU: (F32, F16, BF16),
    GLUOp.SWIGLU: (F32, F16, BF16),
    GLUOp.SWIGLU_OAI: (F32,),
    GLUOp.GEGLU_ERF: (F32, F16, BF16),
    GLUOp.GEGLU_QUICK: (F32, F16, BF16),
    GLUOp.SWIGLU_CLAMP: (F32, F16),
}

# act(x, g, params, type) -> dst values, written into x (f32 scratch); g may be changed too
Act = Callable[[np.ndarray, np.ndarray, GLUParams, GGMLType], None]


def _reglu(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    np.maximum(x, np.float32(0.0), out=x)
    x *= g


def _silu_into(x: np.ndarray) -> None:
    """x = x / (1 + exp(-x)) in place (f32)."""
    e = np.negative(x)
    element_math.ufunc("exp")(e, out=e)
    e += np.float32(1.0)
    np.divide(x, e, out=x)


def _swiglu(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType, lanes: int = 0) -> None:
    """x = silu(x) * g (f32 scratch) row by row as ggml_vec_swiglu_f32: its vector exp on blocks of `lanes`
    (glu_kernel binds the numerics' lanes; 0, its scalar code: libm's expf throughout; see simd_math)."""
    nc = x.shape[-1]
    x2 = x.reshape(-1, nc)
    silu_rows(x2, x2, g.reshape(-1, nc), lanes)


def _geglu(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    if type == BF16:
        element_math.ufunc("gelu")(x, out=x)
    else:
        element_math.take_f16_table("gelu", x, x, shortcuts=type == F32)
    x *= g


def _geglu_quick(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    if type == BF16:
        element_math.ufunc("gelu_quick")(x, out=x)
    else:
        element_math.take_f16_table("gelu_quick", x, x, shortcuts=False)
    x *= g


def _geglu_erf(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    """0.5 x (1 + erf(x / sqrt(2))) * g."""
    element_math.ufunc("gelu_erf")(x, out=x)
    x *= g


def _swiglu_oai(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    """x' = min(x, limit); x' / (1 + exp(-alpha x')) * (clamp(g, -limit, limit) + 1)."""
    limit = np.float32(p.limit)
    np.minimum(x, limit, out=x)
    np.clip(g, -limit, limit, out=g)
    e = np.multiply(x, -np.float32(p.alpha))
    element_math.ufunc("exp")(e, out=e)
    e += np.float32(1.0)
    np.divide(x, e, out=x)
    g += np.float32(1.0)
    x *= g


def _swiglu_clamp(x: np.ndarray, g: np.ndarray, p: GLUParams, type: GGMLType) -> None:
    """silu(min(x, limit)) * clamp(g, -limit, limit)."""
    limit = np.float32(p.limit)
    np.minimum(x, limit, out=x)
    np.clip(g, -limit, limit, out=g)
    _silu_into(x)
    x *= g


_ACTS: dict[GLUOp, Act] = {
    GLUOp.REGLU: _reglu,
    GLUOp.GEGLU: _geglu,
    GLUOp.SWIGLU: _swiglu,
    GLUOp.SWIGLU_OAI: _swiglu_oai,
    GLUOp.GEGLU_ERF: _geglu_erf,
    GLUOp.GEGLU_QUICK: _geglu_quick,
    GLUOp.SWIGLU_CLAMP: _swiglu_clamp,
}


def _glu_problem(node: Tensor) -> tuple[type[GGMLError], str] | None:
    """Why the CPU cannot compute this GLU node, or None."""
    a, b = node.src[0], node.src[1]
    if a is None:
        return ShapeError, "needs src0"
    try:
        op = GLUParams.of(node).op
    except GGMLError as e:
        return type(e), str(e)
    types = GLU_TYPES[op]
    for t in (a, b, node):
        if t is not None and t.type not in types:
            names = ", ".join(x.name for x in types)
            return UnsupportedTypeError, f"'{t.name}' has type {t.type.name}; {op.name} takes {names} (all alike)"
    if b is not None and (b.type != a.type or b.ne != a.ne):
        return ShapeError, f"src1 ne {b.ne} ({b.type.name}) must have src0's shape and type (ne {a.ne}, {a.type.name})"
    nc = a.ne[0] if b is not None else a.ne[0] // 2
    if node.type != a.type or node.ne != [nc, *a.ne[1:]]:
        return ShapeError, f"dst ne {node.ne} ({node.type.name}) is not [{nc}, {a.ne[1]}, {a.ne[2]}, {a.ne[3]}]"
    return None


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.GLU and _glu_problem(node) is None


def _load_f32(src: np.ndarray, out: np.ndarray) -> None:
    """out (f32) = src's values (F32, F16 or BF16 bits)."""
    if src.dtype == np.uint16:
        bf16_to_f32(src, out)
    else:
        np.copyto(out, src)


def _store(t: np.ndarray, dst: np.ndarray) -> None:
    """dst = t (f32) rounded to dst's type once."""
    if dst.dtype == np.uint16:
        f32_to_bf16(t, dst)
    else:
        np.copyto(dst, t, casting="same_kind")


def glu_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """GLU: dst = act(x) * g row by row (see the module docstring)."""
    problem = _glu_problem(node)
    if problem is not None:
        cls, reason = problem
        raise cls(f"CPU GLU '{node.name}': {reason}")
    p = GLUParams.of(node)
    a, b = srcs[0], srcs[1]
    assert a is not None
    nc = dst.shape[-1]
    if b is None:
        x, g = a[..., :nc], a[..., nc:2 * nc]
        if p.swapped:
            x, g = g, x
    else:
        x, g = a, b
    if dst.size == 0:
        return noop
    type = node.type
    if p.op == GLUOp.SWIGLU and type == F32:
        # F32 SwiGLU straight from src into dst, one numba call: the copies through scratch cost more than the
        # arithmetic of a decode step's row
        rows = [reshape_view(v, (-1, nc)) for v in (x, g, dst)]
        if all(r is not None for r in rows):
            fn = functools.partial(silu_rows, rows[0], rows[2], rows[1], host_lanes(params.numerics))
            step = _swiglu_step(*rows, host_lanes(params.numerics))  # type: ignore[arg-type]
            return fn if step is None else graph_runner.with_steps(fn, (step,))
    tx, tg = scratch(params, dst.shape, dst.shape)
    act = _ACTS[p.op]
    if p.op == GLUOp.SWIGLU:  # the one act whose arithmetic follows `numerics`
        act = functools.partial(act, lanes=host_lanes(params.numerics))

    def run() -> None:
        _load_f32(x, tx)
        _load_f32(g, tg)
        act(tx, tg, p, type)
        _store(tx, dst)

    return run


def _swiglu_step(x: np.ndarray, g: np.ndarray, dst: np.ndarray, lanes: int) -> graph_runner.Step | None:
    """The job form of F32 SwiGLU on rows (x, g and dst (rows, nc)), dst apart from x and g."""
    if any(np.may_share_memory(dst, v) for v in (x, g)):
        return None
    desc = graph_runner.descriptor([lanes, all(v.flags.c_contiguous for v in (x, g, dst))], [x, g, dst])
    return None if desc is None else graph_runner.Step(graph_runner.SPLIT, _swiglu_job(), desc, keep=(x, g, dst))


@njit(nogil=True, cache=True)
def swiglu_step(p, ith, nth):
    """Thread ith's rows of silu_rows(x, dst, g, lanes), as C-contiguous arrays where they are (they vectorize)."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (2 + 3 * v,))
    r0, r1 = graph_runner.thread_rows(d[2 + 3], ith, nth)
    if r0 >= r1:
        return 0
    if d[1]:
        x, g, dst = graph_runner.rows_f32(d, 2), graph_runner.rows_f32(d, 2 + v), graph_runner.rows_f32(d, 2 + 2 * v)
        silu_rows(x[r0:r1], dst[r0:r1], g[r0:r1], d[0])
    else:
        xs, gs, ds = graph_runner.view_f32(d, 2)[0, 0], graph_runner.view_f32(d, 2 + v)[0, 0], \
            graph_runner.view_f32(d, 2 + 2 * v)[0, 0]
        silu_rows(xs[r0:r1], ds[r0:r1], gs[r0:r1], d[0])
    return 0


@functools.cache
def _swiglu_job() -> int:
    return graph_runner.split_job(swiglu_step)


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.GLU: glu_kernel}
