"""CPU kernels: element-wise ops.

Binary arithmetic (ADD, SUB, MUL, DIV, ADD1) with ggml's broadcasting (src1
tiles over src0), ACC, the unary math ops (SQR, SQRT, LOG, SCALE, CLAMP,
LEAKY_RELU) and UNARY's functions (ggml_unary_op). F32 and F16 operands
in any mix, and BF16 where ggml-cpu's binary_op and unary_op take it (`BF16_BINARY`,
`BF16_UNARY`); values are computed in f32 and stored in dst's type, as ggml
converts (BF16 widened and rounded around the f32 arithmetic by `through_f32`).
Parameters come from `pyggml.core.ops.params`.

Each kernel does its shape work once and returns a compute function that is a
single numpy call where it can be (`functools.partial` of a ufunc with
`out=dst`), so a plan of many tiny nodes costs little Python per node.
Multi-step functions (GELU, SILU, ...) work in f32 scratch and write dst last,
so in-place nodes (dst a view of src0) are safe. GELU and GELU_QUICK go through
f16 as ggml's tables do (`_through_f16`), so pyggml's values are ggml's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, element_math, graph_runner
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    check_same_shape,
    collapse,
    ggml_broadcast,
    is_multiple,
    noop,
    require_types,
    same_memory,
    scratch,
    through_f32,
)
from pyggml.backends.cpu.kernels.simd_math import host_lanes, silu_rows
from pyggml.core.errors import (
    ArgumentError,
    GGMLError,
    LayoutError,
    OutOfBoundsError,
    ShapeError,
    UnsupportedTypeError,
)
from pyggml.core.ops.params import AccParams, ClampParams, LeakyReluParams, ScaleParams, UnaryParams
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp
from pyggml.core.types import GGMLType

BF16 = GGMLType.BF16
# the (src0, src1, dst) types with BF16 that ggml-cpu's binary_op computes (binary-ops.cpp)
BF16_BINARY = frozenset({(BF16, BF16, BF16), (BF16, GGMLType.F32, BF16), (BF16, GGMLType.F32, GGMLType.F32)})
# the (src0, dst) types with BF16 that ggml-cpu's unary_op computes (unary-ops.cpp)
BF16_UNARY = frozenset({(BF16, BF16), (BF16, GGMLType.F32)})
# the ops whose operands follow BF16_BINARY, the ones that follow BF16_UNARY; the others take F32 and F16 only
_BINARY_OPS = (GGMLOp.ADD, GGMLOp.SUB, GGMLOp.MUL, GGMLOp.DIV)
_UNARY_OPS = (GGMLOp.UNARY, GGMLOp.SQR, GGMLOp.SQRT, GGMLOp.LOG, GGMLOp.SCALE)


def types_ok(node: Tensor) -> bool:
    """Whether these kernels take the node's operand types: F32 and F16 in any mix, BF16 as ggml-cpu takes it."""
    a, b = node.src[0], node.src[1]
    if all_float(node, a, b):
        return True
    if a is None:
        return False
    if node.op in _BINARY_OPS:
        return b is not None and (a.type, b.type, node.type) in BF16_BINARY
    return node.op in _UNARY_OPS and (a.type, node.type) in BF16_UNARY


def check_types(node: Tensor) -> None:
    """UnsupportedTypeError naming the node and its types unless `types_ok`."""
    if not types_ok(node):
        types = ", ".join(t.type.name for t in (*node.src[:2], node) if t is not None)
        raise UnsupportedTypeError(f"CPU {node.op.name} '{node.name}': types {types} (src0, src1, dst); these "
                                   "kernels take F32 and F16 in any mix, BF16 as ggml-cpu's binary_op/unary_op")


# --- binary ops with broadcasting ---


def _binary(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], ufunc: np.ufunc) -> Compute:
    """dst = ufunc(src0, src1) with src1 tiled over src0 (each src0.ne[i] a multiple of src1.ne[i])."""
    check_types(node)
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    if a.shape == dst.shape and dst.size == 0:
        return noop  # before the tiling test, which would divide by an empty src1's 0
    if a.shape != dst.shape or not all(is_multiple(n, m) for n, m in zip(a.shape, b.shape, strict=True)):
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src1 {b.shape[::-1]} does not tile src0 "
                         f"{a.shape[::-1]} into dst {dst.shape[::-1]} (ne order)")
    (d, a), b = ggml_broadcast([dst, a], b)
    d, a, b = collapse(d, a, np.broadcast_to(b, d.shape))
    fn = through_f32(d, [a, b], lambda d, a, b: functools.partial(ufunc, a, b, out=d))
    step = _binary_step(ufunc, d, a, b)
    return fn if step is None else graph_runner.with_steps(fn, (step,))


# the graph runner's codes of the binary ufuncs
_BINARY_CODES = {np.add: 0, np.subtract: 1, np.multiply: 2, np.divide: 3}


def _binary_step(ufunc: np.ufunc, d: np.ndarray, a: np.ndarray, b: np.ndarray) -> graph_runner.Step | None:
    """The job form of an F32 binary op whose dst is its sources' memory element for element or none of it."""
    if any(v.dtype != F32 for v in (d, a, b)):
        return None
    if any(np.may_share_memory(d, v) and not same_memory(d, v) for v in (a, b)):
        return None
    desc = graph_runner.descriptor([_BINARY_CODES[ufunc]], [d, a, b])
    if desc is None:
        return None
    return graph_runner.Step(graph_runner.SPLIT, _binary_job(), desc, keep=(d, a, b))


@njit(nogil=True, cache=True, error_model="numpy")
def binary_step(p, ith, nth):
    """Thread ith's rows of dst = a op b (op: _BINARY_CODES), f32 as numpy's ufuncs compute it."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (1 + 3 * v,))
    op = d[0]
    dst, a, b = graph_runner.view_f32(d, 1), graph_runner.view_f32(d, 1 + v), graph_runner.view_f32(d, 1 + 2 * v)
    n0 = dst.shape[3]
    r0, r1 = graph_runner.share_of(dst, ith, nth)
    for r in range(r0, r1):
        dr, ar, br = graph_runner.row_at(dst, r), graph_runner.row_at(a, r), graph_runner.row_at(b, r)
        if op == 0:
            for i in range(n0):
                dr[i] = ar[i] + br[i]
        elif op == 1:
            for i in range(n0):
                dr[i] = ar[i] - br[i]
        elif op == 2:
            for i in range(n0):
                dr[i] = ar[i] * br[i]
        else:
            for i in range(n0):
                dr[i] = ar[i] / br[i]
    return 0


@functools.cache
def _binary_job() -> int:
    return graph_runner.split_job(binary_step)


def add_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _binary(node, dst, srcs, np.add)


def sub_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _binary(node, dst, srcs, np.subtract)


def mul_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _binary(node, dst, srcs, np.multiply)


def div_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _binary(node, dst, srcs, np.divide)


def add1_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = src0 + the single value of src1."""
    b = srcs[1]
    assert b is not None
    if b.size != 1:
        raise ShapeError(f"CPU ADD1 '{node.name}': src1 must be a scalar, got ne {list(b.shape[::-1])}")
    return _binary(node, dst, srcs, np.add)


def acc_view(node: Tensor, dst: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ACC/SET's window into dst: src1's shape at byte strides op_params[0:3], byte offset op_params[3].

    As in ggml, dst must be contiguous and element stride is the element size.
    """
    p = AccParams.of(node)
    nb1, nb2, nb3, offset = p.nb1, p.nb2, p.nb3, p.offset
    if not dst.flags.c_contiguous:
        raise LayoutError(f"CPU {node.op.name} '{node.name}': dst must be contiguous")
    strides = (nb3, nb2, nb1, dst.itemsize)
    if min(strides) < 0 or offset < 0:
        raise ArgumentError(f"CPU {node.op.name} '{node.name}': negative stride or offset "
                            f"(nb1={nb1}, nb2={nb2}, nb3={nb3}, offset={offset})")
    extent = offset + dst.itemsize + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n > 0)
    if any(n == 0 for n in shape):
        extent = 0
    if extent > dst.nbytes:
        raise OutOfBoundsError(f"CPU {node.op.name} '{node.name}': the window of {list(shape[::-1])} at offset "
                               f"{offset} with strides {[nb1, nb2, nb3]} ends at byte {extent}, "
                               f"past dst's {dst.nbytes} bytes")
    flat = dst.reshape(-1).view(np.uint8)
    return np.ndarray(shape, dtype=dst.dtype, buffer=flat, offset=offset, strides=strides)


def acc_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = src0, then dst's window (op_params: nb1, nb2, nb3, offset) += src1."""
    require_types(node, FLOAT_TYPES, node, node.src[0], node.src[1])
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    check_same_shape(node, dst, a)
    view = acc_view(node, dst, b.shape)
    copy = not same_memory(dst, a)

    def run() -> None:
        if copy:
            np.copyto(dst, a)
        np.add(view, b, out=view)

    return run


# --- unary math ---


def _unary_ufunc(node: Tensor, dst: np.ndarray, x: np.ndarray, ufunc: np.ufunc, *args: object) -> Compute:
    """dst = ufunc(x, *args) in one call (numpy computes f16 through f32 and rounds once)."""
    if dst.size == 0:
        return noop
    d, x = collapse(dst, x)
    return through_f32(d, [x], lambda d, x: functools.partial(ufunc, x, *args, out=d))


def _src0(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None]) -> np.ndarray:
    """src0, of dst's shape and of types `types_ok` takes."""
    check_types(node)
    x = srcs[0]
    assert x is not None
    if x.shape != dst.shape:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 ne {list(x.shape[::-1])} "
                         f"and dst ne {list(dst.shape[::-1])} differ")
    return x


def sqr_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _unary_ufunc(node, dst, _src0(node, dst, srcs), np.square)


def sqrt_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _unary_ufunc(node, dst, _src0(node, dst, srcs), np.sqrt)


def log_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    return _unary_ufunc(node, dst, _src0(node, dst, srcs), element_math.ufunc("log"))


def scale_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = src0 * s + b (ScaleParams)."""
    p = ScaleParams.of(node)
    s, b = np.float32(p.s), np.float32(p.b)
    x = _src0(node, dst, srcs)
    if p.b == 0.0:
        return _unary_ufunc(node, dst, x, np.multiply, s)
    if dst.size == 0:
        return noop
    d, x = collapse(dst, x)

    def prepare(d: np.ndarray, x: np.ndarray) -> Compute:
        (t,) = scratch(params, x.shape)

        def run() -> None:
            np.multiply(x, s, out=t, dtype=F32)
            np.add(t, b, out=d)

        return run

    return through_f32(d, [x], prepare)


def clamp_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = max(min(x, max), min) (ClampParams), as ggml orders them."""
    x = _src0(node, dst, srcs)
    p = ClampParams.of(node)
    lo, hi = np.float32(p.min), np.float32(p.max)
    if dst.size == 0:
        return noop
    d, x = collapse(dst, x)

    def run() -> None:
        np.minimum(x, hi, out=d)
        np.maximum(d, lo, out=d)

    if d.dtype != F32 or x.dtype != F32 or (np.may_share_memory(d, x) and not same_memory(d, x)):
        return run
    return graph_runner.with_split_step(run, _clamp_job(), [], [d, x, np.array([lo, hi], F32)])


@njit(nogil=True, cache=True)
def clamp_step(p, ith, nth):
    """Thread ith's rows of dst = maximum(minimum(x, hi), lo) as numpy's (a NaN stays NaN)."""
    v = graph_runner.VIEW_FIELDS
    d = numba.carray(p, (3 * v,))
    dst, x, consts = graph_runner.view_f32(d, 0), graph_runner.view_f32(d, v), graph_runner.view_f32(d, 2 * v)
    lo, hi = consts[0, 0, 0, 0], consts[0, 0, 0, 1]
    r0, r1 = graph_runner.share_of(dst, ith, nth)
    for r in range(r0, r1):
        dr, xr = graph_runner.row_at(dst, r), graph_runner.row_at(x, r)
        for i in range(dr.shape[0]):  # numpy's: the first operand if below (above) or NaN (v != v), else the second
            v = xr[i]
            m = v if v < hi or v != v else hi
            dr[i] = m if m > lo or m != m else lo
    return 0


@functools.cache
def _clamp_job() -> int:
    return graph_runner.split_job(clamp_step)


def _leaky(d: np.ndarray, x: np.ndarray, slope: float, params: ComputeParams) -> Compute:
    """dst = max(x, 0) + slope * min(x, 0)."""
    t, u = scratch(params, x.shape, x.shape)
    s = np.float32(slope)

    def run() -> None:
        np.minimum(x, 0.0, out=t, dtype=F32)
        np.multiply(t, s, out=t)
        np.maximum(x, 0.0, out=u, dtype=F32)
        np.add(t, u, out=d)

    return run


def leaky_relu_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """LEAKY_RELU with the negative slope of LeakyReluParams."""
    x = _src0(node, dst, srcs)
    slope = LeakyReluParams.of(node).negative_slope
    if dst.size == 0:
        return noop
    d, x = collapse(dst, x)
    return _leaky(d, x, slope, params)


# --- UNARY: one prepare function per ggml_unary_op ---


def _element(name: str) -> Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]:
    """d = ggml-cpu's per-element function `name` of x, in one call (element_math)."""

    def prepare(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
        return functools.partial(element_math.ufunc(name), x, out=d)

    return prepare


def _through_f16(d: np.ndarray, x: np.ndarray, params: ComputeParams, table: str, clamp: bool) -> Compute:
    """d = ggml's f16 table `table` at x rounded to f16 (F16 data is f16 already; for f32 data this is ggml's
    GGML_GELU_FP16 / GGML_GELU_QUICK_FP16 path). With `clamp`, GELU's shortcuts: 0 at x <= -10, x itself at
    x >= 10."""
    (t,) = scratch(params, x.shape)
    h = np.empty(x.shape, np.float16)

    shortcuts = clamp and x.dtype == F32

    def run() -> None:
        element_math.take_f16_table(table, x, t, shortcuts, h)
        np.copyto(d, t)

    return run


def _gelu(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
    """ggml's GELU (tanh approximation) through its f16 table, as ggml's CPU computes it."""
    return _through_f16(d, x, params, "gelu", clamp=True)


def _gelu_quick(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
    """ggml's GELU_QUICK through its f16 table, as ggml's CPU computes it."""
    return _through_f16(d, x, params, "gelu_quick", clamp=False)


def _silu(d: np.ndarray, x: np.ndarray, params: ComputeParams, vector_exp: bool = True) -> Compute:
    """x / (1 + exp(-x)) in f32 row by row, as ggml_vec_silu_f32 (its vector exp on blocks, libm's expf on
    the rest: see simd_math); without `vector_exp` libm's expf throughout, as ggml's F16 and BF16 rows."""
    (t,) = scratch(params, x.shape)
    t2 = t.reshape(-1, x.shape[-1]) if x.ndim else t.reshape(1, 1)
    lanes = host_lanes(params.numerics) if vector_exp else 0
    no_gate = np.zeros((0, 0), F32)

    def run() -> None:
        np.copyto(t, x, casting="same_kind")
        silu_rows(t2, t2, no_gate, lanes)
        np.copyto(d, t, casting="same_kind")

    return run


def _round(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
    """roundf: halves away from zero (numpy's round goes to even), exactly: trunc(x), plus sign(x) where the
    dropped fraction is at least a half."""
    t, u = scratch(params, x.shape, x.shape)
    half_or_more = np.empty(x.shape, dtype=bool)

    def run() -> None:
        np.copyto(u, x)
        np.trunc(u, out=t)
        np.subtract(u, t, out=u)  # the fraction, exact
        np.absolute(u, out=u)
        np.greater_equal(u, 0.5, out=half_or_more)
        np.copysign(half_or_more, x, out=u, dtype=F32)
        np.add(t, u, out=d)

    return run


def _xielu(node: Tensor) -> Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]:
    """x > 0: alpha_p x^2 + beta x; else (expm1(min(x, eps)) - x) alpha_n + beta x (UnaryParams' floats)."""
    p = UnaryParams.of(node)
    alpha_n, alpha_p, beta, eps = (np.float32(v) for v in (p.alpha_n, p.alpha_p, p.beta, p.eps))

    def prepare(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
        t, u, v = scratch(params, x.shape, x.shape, x.shape)

        def run() -> None:
            np.copyto(v, x)
            np.multiply(v, v, out=t)
            np.multiply(t, alpha_p, out=t)  # positive branch, without beta x
            np.minimum(v, eps, out=u)
            np.expm1(u, out=u)
            np.subtract(u, v, out=u)
            np.multiply(u, alpha_n, out=u)  # negative branch, without beta x
            np.copyto(u, t, where=v > 0)
            np.multiply(v, beta, out=v)
            np.add(u, v, out=d)

        return run

    return prepare


def _one_call(ufunc: np.ufunc, *args: object) -> Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]:
    def prepare(d: np.ndarray, x: np.ndarray, params: ComputeParams) -> Compute:
        return functools.partial(ufunc, x, *args, out=d)

    return prepare


_UNARY: dict[UnaryOp, Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]] = {
    UnaryOp.ABS: _one_call(np.absolute),
    UnaryOp.SGN: _element("sgn"),
    UnaryOp.NEG: _one_call(np.negative),
    UnaryOp.STEP: _one_call(np.greater, 0.0),
    UnaryOp.TANH: _element("tanh"),
    UnaryOp.ELU: _element("elu"),
    UnaryOp.RELU: _element("relu"),
    UnaryOp.SIGMOID: _element("sigmoid"),
    UnaryOp.GELU: _gelu,
    UnaryOp.GELU_QUICK: _gelu_quick,
    UnaryOp.SILU: _silu,
    UnaryOp.HARDSWISH: _element("hardswish"),
    UnaryOp.HARDSIGMOID: _element("hardsigmoid"),
    UnaryOp.EXP: _element("exp"),
    UnaryOp.EXPM1: _element("expm1"),
    UnaryOp.SOFTPLUS: _element("softplus"),
    UnaryOp.GELU_ERF: _element("gelu_erf"),
    UnaryOp.FLOOR: _one_call(np.floor),
    UnaryOp.CEIL: _one_call(np.ceil),
    UnaryOp.ROUND: _round,
    UnaryOp.TRUNC: _one_call(np.trunc),
}


# where ggml's F16 and BF16 rows compute differently from its F32 rows (ops.cpp, vec.h): SILU with libm's expf
# only; GELU and GELU_QUICK of BF16 directly in f32 (F16 data goes through the tables as F32 data does)
_UNARY_F16: dict[UnaryOp, Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]] = {
    UnaryOp.SILU: functools.partial(_silu, vector_exp=False),
}
_UNARY_BF16: dict[UnaryOp, Callable[[np.ndarray, np.ndarray, ComputeParams], Compute]] = {
    **_UNARY_F16,
    UnaryOp.GELU: _element("gelu"),
    UnaryOp.GELU_QUICK: _element("gelu_quick"),
}
_UNARY_OF_TYPE = {GGMLType.F16: _UNARY_F16, BF16: _UNARY_BF16}


def unary_op_of(node: Tensor) -> UnaryOp | None:
    """The node's ggml_unary_op, or None if op_params[0] is none."""
    try:
        return UnaryParams.of(node).op
    except GGMLError:
        return None


def unary_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """UNARY: the function named by UnaryParams.op (a ggml_unary_op)."""
    x = _src0(node, dst, srcs)
    op = UnaryParams.of(node).op
    if dst.size == 0:
        return noop
    # SILU keeps ggml's rows: its vector exp stops where a row's last block of lanes ends
    d, x = (dst, x) if op == UnaryOp.SILU else collapse(dst, x)
    assert node.src[0] is not None
    by_type = _UNARY_OF_TYPE.get(node.src[0].type, {})
    prepare = _xielu(node) if op == UnaryOp.XIELU else by_type.get(op, _UNARY[op])
    return through_f32(d, [x], lambda d, x: prepare(d, x, params))


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.ADD: add_kernel,
    GGMLOp.SUB: sub_kernel,
    GGMLOp.MUL: mul_kernel,
    GGMLOp.DIV: div_kernel,
    GGMLOp.ADD1: add1_kernel,
    GGMLOp.ACC: acc_kernel,
    GGMLOp.SQR: sqr_kernel,
    GGMLOp.SQRT: sqrt_kernel,
    GGMLOp.LOG: log_kernel,
    GGMLOp.SCALE: scale_kernel,
    GGMLOp.CLAMP: clamp_kernel,
    GGMLOp.LEAKY_RELU: leaky_relu_kernel,
    GGMLOp.UNARY: unary_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: operand types `types_ok` takes and a known unary function."""
    if node.op not in KERNELS:
        return False
    if not types_ok(node):
        return False
    if node.op == GGMLOp.UNARY:
        return unary_op_of(node) is not None
    return True

