"""Run one node through its CPU kernel, without the CPU backend.

Tensors live in a `no_alloc=False` Context (host memory), so `.numpy()` and
`memory.tensor_view` see them. Arrays here are in numpy order: shape is the
reversed `ne`, (ne3, ne2, ne1, ne0), and may have fewer than 4 axes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import numpy as np

from pyggml.backends.cpu.kernels import KERNELS, ComputeParams
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16

# relative tolerance by storage type
RTOL = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}


@functools.cache
def libm_f32(name: str, n_args: int) -> Callable[..., float]:
    """The C library's float function `name` (expf, fmaf, ...) of `n_args` floats, as ggml's C calls it."""
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * n_args
    return fn  # type: ignore[no-any-return]


def new_ctx(mb: int = 16) -> Context:
    return Context(mem_size=mb * 1024 * 1024, no_alloc=False)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float -> bf16 bits, round to nearest even (written here, apart from the kernels)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored(type: GGMLType, values: np.ndarray) -> np.ndarray:
    """The float32 values a tensor of `type` holds after storing `values`."""
    values = np.asarray(values, dtype=np.float32)
    if type == F16:
        return values.astype(np.float16).astype(np.float32)
    if type == BF16:
        return bf16_values(bf16_bits(values))
    return values


def _ne(shape: tuple[int, ...]) -> list[int]:
    return list(shape[::-1])


def tensor(ctx: Context, type: GGMLType, values: np.ndarray, name: str = "") -> Tensor:
    """A contiguous tensor holding `values` (numpy order) converted to `type`."""
    values = np.asarray(values)
    t = ctx.new_tensor(type, _ne(values.shape) or [1])
    t.set_name(name)
    fill(t, values)
    return t


def fill(t: Tensor, values: np.ndarray) -> None:
    view = t.numpy()
    values = np.asarray(values).reshape(view.shape[:3] + (-1,))
    if t.type == BF16:
        view[...] = bf16_bits(values)
    elif t.type in (F32, F16, GGMLType.I32):
        view[...] = values
    else:
        from pyggml.core.types import from_float

        view[...] = from_float(t.type, values.astype(np.float32))


def transposed(ctx: Context, type: GGMLType, values: np.ndarray, name: str = "") -> Tensor:
    """A non-contiguous tensor (ggml_transpose of a contiguous one) holding `values` (numpy order, >= 2-D)."""
    values = np.asarray(values)
    base = tensor(ctx, type, np.swapaxes(values, -1, -2), name + ".base")
    t = ctx.transpose(base)
    t.set_name(name)
    assert t.ne == _ne(values.shape) + [1] * (4 - values.ndim)
    return t


def permuted(ctx: Context, type: GGMLType, values: np.ndarray, name: str = "") -> Tensor:
    """A non-contiguous tensor (dims 1 and 2 swapped by ggml_permute) holding 4-D `values` (numpy order)."""
    values = np.asarray(values)
    assert values.ndim == 4
    base = tensor(ctx, type, np.swapaxes(values, 1, 2), name + ".base")
    t = ctx.permute(base, 0, 2, 1, 3)
    t.set_name(name)
    assert t.ne == _ne(values.shape)
    return t


def values_of(t: Tensor) -> np.ndarray:
    """A tensor's values as float32 (or its ints), shape (ne3, ne2, ne1, ne0)."""
    v = t.numpy()
    if t.type == BF16:
        return bf16_values(v)
    if t.type == F16:
        return v.astype(np.float32)
    return np.array(v)


def run(node: Tensor, params: ComputeParams | None = None) -> np.ndarray:
    """Prepare and compute `node` through its CPU kernel; returns dst's values (4-D, numpy order)."""
    fn = compile_node(node, params)
    fn()
    return values_of(node)


def backend_mul_mat(backend, w: Tensor, x: np.ndarray) -> np.ndarray:
    """MUL_MAT of the matrix `w` (any buffer) with the F32 rows `x` (n, K), computed by `backend` as a graph;
    returns the (n, M) result."""
    ctx = Context(mem_size=x.nbytes + 4 * x.shape[0] * w.ne[1] + (1 << 20))
    try:
        xt = ctx.new_tensor_2d(GGMLType.F32, x.shape[1], x.shape[0])
        xt.numpy()[0, 0] = x
        out = ctx.mul_mat(w, xt)
        g = ctx.new_graph()
        g.build_forward_expand(out)
        backend.graph_compute(g)
        return out.numpy()[0, 0].copy()
    finally:
        ctx.free()


def compile_node(node: Tensor, params: ComputeParams | None = None):
    params = params if params is not None else ComputeParams()
    dst = memory.tensor_view(node)
    srcs = [memory.tensor_view(s) if s is not None else None for s in node.src]
    return KERNELS[node.op](node, dst, srcs, params)


def as4(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    return values.reshape((1,) * (4 - values.ndim) + values.shape)


def assert_close(got: np.ndarray, want: np.ndarray, type: GGMLType, atol: float | None = None) -> None:
    got = np.asarray(got, dtype=np.float64)
    want = as4(np.asarray(want, dtype=np.float64))
    assert got.shape == want.shape, (got.shape, want.shape)
    rtol = RTOL.get(type, 1e-5)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol if atol is not None else rtol)


def manual_node(ctx: Context, op: GGMLOp, srcs: list[Tensor | None], params: list[int | float] | None = None,
                type: GGMLType | None = None, ne: list[int] | None = None) -> Tensor:
    """A node made by hand the way ggml's builder would (for ops whose builder is not in the tree yet)."""
    first = srcs[0]
    assert first is not None
    out = ctx.new_tensor(type if type is not None else first.type, ne if ne is not None else list(first.ne))
    out.op = op
    for i, s in enumerate(srcs):
        out.src[i] = s
    if params:
        out.set_op_params(params)
    return out


def build(ctx: Context, name: str, *args: object, op: GGMLOp, params: list[int | float] | None = None,
          type: GGMLType | None = None, ne: list[int] | None = None, **kw: object) -> Tensor:
    """ctx.<name>(*args, **kw) if the builder exists, else `manual_node` with the tensor args and `params`."""
    builder = getattr(ctx, name, None)
    if builder is not None:
        node = builder(*args, **kw)
        assert node.op == op, (node.op, op)
        return node
    return manual_node(ctx, op, [a for a in args if isinstance(a, Tensor)], params, type, ne)
