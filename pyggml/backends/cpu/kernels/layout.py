"""CPU kernels: ops that copy and rearrange data.

DUP, CPY and CONT copy src0's elements in row-major order of src0's `ne` into
dst's elements in row-major order of dst's `ne` (ggml's dup), converting
between F32, F16, BF16 and the quantized types (through f32 rows with
`pyggml.core.types.to_float`/`from_float`). GET_ROWS picks rows of any of
those types (dequantizing only the picked rows) into F32. REPEAT, DIAG, PAD,
UPSCALE and SET move F32/F16 (or any plain type) data, CONCAT any type, as
ggml does, their parameters from `pyggml.core.ops.params`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel, graph_runner
from pyggml.backends.cpu.kernels._common import (
    bf16_to_f32,
    check_same_shape,
    collapse,
    f32_to_bf16,
    ggml_broadcast,
    is_convertible,
    is_multiple,
    is_writable,
    noop,
    reshape_view,
    same_memory,
    scratch,
    strided_view,
)
from pyggml.backends.cpu.kernels.elementwise import acc_view
from pyggml.backends.cpu.kernels.vec_dot.to_float import to_f32
from pyggml.core.errors import ArgumentError, GGMLError, OutOfBoundsError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import ConcatParams, PadParams, UpscaleParams
from pyggml.core.quants import from_float_cpu
from pyggml.core.tensor import GGML_MAX_DIMS, GGMLOp, ScaleFlag, ScaleMode, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

_NUMPY_FLOATS = (GGMLType.F32, GGMLType.F16)
# the integer copies of ggml's CPU dup: F32 to I32 and back
_INT_CASTS = ((GGMLType.F32, GGMLType.I32), (GGMLType.I32, GGMLType.F32))


def _is_plain(t: GGMLType) -> bool:
    """Types whose elements numpy holds natively and converts by casting (F32, F16, ints; not BF16)."""
    return not TYPE_TRAITS[t].is_quantized and t != GGMLType.BF16


def _logical_shape(t: Tensor) -> tuple[int, int, int, int]:
    return (t.ne[3], t.ne[2], t.ne[1], t.ne[0])


def _as_blocks(raw: np.ndarray, type: GGMLType) -> np.ndarray:
    """Quantized raw rows (..., row bytes) as one opaque element per block (..., blocks), a view."""
    ts = TYPE_TRAITS[type].type_size
    return raw.view(np.dtype((np.void, ts)))


def _copy_fn(d: np.ndarray, s: np.ndarray, casting: str = "same_kind") -> Compute:
    """Copy (with numpy casting) s's elements in row-major order into d's, without a copy at prepare time."""
    if d.shape == s.shape:
        d, s = collapse(d, s)
        return _with_copy_step(functools.partial(np.copyto, d, s, casting=casting), d, s)
    dv = reshape_view(d, s.shape)
    if dv is not None:
        dv, s = collapse(dv, s)
        return _with_copy_step(functools.partial(np.copyto, dv, s, casting=casting), dv, s)
    sv = reshape_view(s, d.shape)
    if sv is not None:
        d, sv = collapse(d, sv)
        return _with_copy_step(functools.partial(np.copyto, d, sv, casting=casting), d, sv)

    def run() -> None:
        # both sides strided in incompatible ways: numpy's reshape copies src at run time
        np.copyto(d, np.reshape(s, d.shape), casting=casting)

    return run


def _with_copy_step(fn: Compute, d: np.ndarray, s: np.ndarray) -> Compute:
    """`fn` (d = s, same shapes) with its job form when both are F32 and d is apart from s."""
    if d.dtype != np.float32 or s.dtype != np.float32 or np.may_share_memory(d, s):
        return fn
    return graph_runner.with_split_step(fn, _copy_job(), [], [d, s])


@njit(nogil=True, cache=True)
def copy_step(p, ith, nth):
    """Thread ith's rows of d = s (f32, strided)."""
    d, s = graph_runner.two_f32(p)
    r0, r1 = graph_runner.share_of(d, ith, nth)
    for r in range(r0, r1):
        graph_runner.row_at(d, r)[:] = graph_runner.row_at(s, r)
    return 0


@functools.cache
def _copy_job() -> int:
    return graph_runner.split_job(copy_step)


@njit(nogil=True, cache=True)
def take_step(p, shared):
    """d[j] = a[ids[j]] (f32 rows) once every id is in [0, n_rows); else d[1] = 1 and nothing is written."""
    v = graph_runner.VIEW_FIELDS
    desc = numba.carray(p, (2 + 3 * v,))
    a, ids, d = graph_runner.view_f32(desc, 2)[0, 0], graph_runner.view_i32(desc, 2 + v)[0, 0, 0], \
        graph_runner.view_f32(desc, 2 + 2 * v)[0, 0]
    desc[1] = 0
    for j in range(ids.shape[0]):
        if ids[j] < 0 or ids[j] >= desc[0]:
            desc[1] = 1
            return 0
    for j in range(ids.shape[0]):
        d[j] = a[ids[j]]
    return 0


@functools.cache
def _take_job() -> int:
    return graph_runner.alone_job(take_step)


def _int_cast_fn(d: np.ndarray, s: np.ndarray) -> Compute:
    """ggml's dup_flt<float, int32_t> and <int32_t, float>: C's conversions (toward zero; NaN and values out of
    range are x86's INT32_MIN, as numpy's cast on x86 gives them)."""
    copy = _copy_fn(d, s, casting="unsafe")

    def run() -> None:
        with np.errstate(invalid="ignore"):
            copy()

    return run


def _to_f32_fn(type: GGMLType, src: np.ndarray, shape: tuple[int, ...],
               params: ComputeParams) -> Callable[[], np.ndarray]:
    """A function returning src's values as float32 in logical `shape` (ne3, ne2, ne1, ne0)."""
    if type == GGMLType.F32:
        return lambda: src
    if type == GGMLType.F16:
        (t,) = scratch(params, shape)

        def f16() -> np.ndarray:
            np.copyto(t, src)
            return t

        return f16
    if type == GGMLType.BF16:
        (t,) = scratch(params, shape)

        def bf16() -> np.ndarray:
            bf16_to_f32(src, t)
            return t

        return bf16

    def quantized() -> np.ndarray:
        return to_f32(type, src).reshape(shape)

    return quantized


def _from_f32_fn(type: GGMLType, dst: np.ndarray, shape: tuple[int, ...],
                 simd: bool) -> Callable[[np.ndarray], None]:
    """A function storing float32 values of logical `shape` (dst's) into dst's type (Q8_0/Q8_1 by ggml-cpu's
    SIMD rows with `simd`, the "x86" numerics; its reference rows without)."""
    if type in _NUMPY_FLOATS:
        return lambda v: np.copyto(dst, v)
    if type == GGMLType.BF16:
        return lambda v: f32_to_bf16(v, dst)

    def quantized(v: np.ndarray) -> None:
        dst[...] = from_float_cpu(type, np.ascontiguousarray(v, dtype=np.float32), simd).reshape(dst.shape)

    return quantized


def _row_major(v: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """v's elements in row-major order, as `shape` (a view where numpy can)."""
    return v if v.shape == shape else np.reshape(v, shape)


def copy_prepare(node: Tensor, src_t: Tensor, dst: np.ndarray, src: np.ndarray, params: ComputeParams) -> Compute:
    """ggml's dup: src's elements in row-major order of its ne go to dst's in row-major order of dst's ne."""
    st, dt = src_t.type, node.type
    if src_t.nelements() != node.nelements():
        raise ShapeError(f"CPU {node.op.name} '{node.name}': {src_t.nelements()} elements in "
                         f"'{src_t.name}' but {node.nelements()} in dst")
    if node.nelements() == 0:
        return noop
    if st == dt and TYPE_TRAITS[st].is_quantized:
        # same quantized type: blocks are copied as they are (ggml's dup_bytes)
        return _copy_fn(_as_blocks(dst, dt), _as_blocks(src, st))
    if st == dt or (_is_plain(st) and _is_plain(dt) and st in _NUMPY_FLOATS and dt in _NUMPY_FLOATS):
        return _copy_fn(dst, src)
    if (st, dt) in _INT_CASTS:
        return _int_cast_fn(dst, src)
    if not (is_convertible(st) and is_writable(dt)):
        raise UnsupportedTypeError(f"CPU {node.op.name} '{node.name}': cannot convert {st.name} "
                                   f"('{src_t.name}') to {dt.name}")
    src_shape, dst_shape = _logical_shape(src_t), _logical_shape(node)
    read = _to_f32_fn(st, src, src_shape, params)
    write = _from_f32_fn(dt, dst, dst_shape, params.numerics == "x86")

    def run() -> None:
        write(_row_major(read(), dst_shape))

    return run


def dup_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """DUP and CONT: dst gets src0's elements (row-major), converted to dst's type."""
    src = srcs[0]
    assert src is not None and node.src[0] is not None
    return copy_prepare(node, node.src[0], dst, src, params)


def cpy_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """CPY: src0 into dst (a view of src1), converting to src1's type."""
    return dup_kernel(node, dst, srcs, params)


# --- GET_ROWS ---


def get_rows_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                    params: ComputeParams) -> Compute:
    """dst[:, i10, i11, i12] = src0[:, src1[i10, i11, i12], i11, i12] (ggml's ne order), as F32 (or I32).

    Quantized and BF16 rows are converted after picking, so only the picked rows are dequantized.
    """
    a_t, i_t = node.src[0], node.src[1]
    a, idx = srcs[0], srcs[1]
    assert a_t is not None and i_t is not None and a is not None and idx is not None
    st = a_t.type
    if i_t.type != GGMLType.I32:
        raise UnsupportedTypeError(f"CPU GET_ROWS '{node.name}': indices '{i_t.name}' must be I32, not {i_t.type.name}")
    if not (is_convertible(st) or st == GGMLType.I32):
        raise UnsupportedTypeError(f"CPU GET_ROWS '{node.name}': rows of type {st.name} ('{a_t.name}')")
    want_int = st == GGMLType.I32
    if node.type not in (GGMLType.F32, GGMLType.F16, GGMLType.I32) or (node.type == GGMLType.I32) != want_int:
        raise UnsupportedTypeError(f"CPU GET_ROWS '{node.name}': dst type {node.type.name} for rows of {st.name}")
    ne10, ne11, ne12 = i_t.ne[0], i_t.ne[1], i_t.ne[2]
    if a_t.ne[2] != ne11 or a_t.ne[3] != ne12 or i_t.ne[3] != 1 or node.ne != [a_t.ne[0], ne10, ne11, ne12]:
        raise ShapeError(f"CPU GET_ROWS '{node.name}': rows {a_t.ne}, indices {i_t.ne}, dst {node.ne} do not fit "
                         "(need rows.ne[2] == idx.ne[1], rows.ne[3] == idx.ne[2], dst [rows.ne0, idx.ne0..2])")
    if node.nelements() == 0:
        return noop
    n_rows = a_t.ne[1]
    ids = idx[0]  # (ne12, ne11, ne10)
    name = node.name

    def check() -> None:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_rows:
            raise OutOfBoundsError(f"CPU GET_ROWS '{name}': row index {lo if lo < 0 else hi} outside [0, {n_rows})")

    if ne11 == 1 and ne12 == 1 and a.dtype == dst.dtype and ids.size > 0:
        # the common case (embeddings): one np.take straight into dst
        a2, i1, d2 = a[0, 0], ids[0, 0], dst[0, 0]

        def take() -> None:
            check()
            np.take(a2, i1, axis=0, out=d2, mode="clip")  # indices are checked, so 'clip' never clips

        desc = graph_runner.descriptor([n_rows, 0], [a2, i1, d2]) if a2.dtype == np.float32 else None
        if desc is None or np.may_share_memory(d2, a2) or np.may_share_memory(d2, i1):
            return take

        def check_step() -> None:
            if desc[1]:
                check()

        step = graph_runner.Step(graph_runner.ALONE, _take_job(), desc, keep=(a2, i1, d2), after=check_step)
        return graph_runner.with_steps(take, (step,))

    i3 = np.arange(ne12).reshape(ne12, 1, 1)
    i2 = np.arange(ne11).reshape(1, ne11, 1)
    if st == GGMLType.BF16:
        def convert(rows: np.ndarray) -> None:
            np.copyto(dst, (rows.astype(np.uint32) << 16).view(np.float32))
    elif TYPE_TRAITS[st].is_quantized:
        def convert(rows: np.ndarray) -> None:
            np.copyto(dst, to_f32(st, rows).reshape(dst.shape))
    else:
        def convert(rows: np.ndarray) -> None:
            np.copyto(dst, rows)

    def gather() -> None:
        check()
        convert(a[i3, i2, ids])

    return gather


# --- REPEAT, CONCAT, DIAG, PAD, UPSCALE, SET ---


def _same_type(node: Tensor, *srcs: Tensor | None, quantized: bool = False) -> None:
    """UnsupportedTypeError unless every src has dst's type (a quantized one only if `quantized`: a kernel that
    moves whole rows of blocks)."""
    for s in srcs:
        if s is not None and (s.type != node.type or (TYPE_TRAITS[s.type].is_quantized and not quantized)):
            raise UnsupportedTypeError(f"CPU {node.op.name} '{node.name}': '{s.name}' is {s.type.name}, "
                                       f"dst is {node.type.name}; this kernel copies one "
                                       f"{'' if quantized else 'non-quantized '}type")


def repeat_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst tiles src0: element i of each dim comes from i % src0.ne."""
    _same_type(node, node.src[0])
    src = srcs[0]
    assert src is not None
    if not all(is_multiple(n, m) for n, m in zip(dst.shape, src.shape, strict=True)):
        raise ShapeError(f"CPU REPEAT '{node.name}': src ne {list(src.shape[::-1])} does not tile "
                         f"dst ne {list(dst.shape[::-1])}")
    if dst.size == 0:
        return noop
    (d,), s = ggml_broadcast([dst], src)
    d, s = collapse(d, np.broadcast_to(s, d.shape))
    return functools.partial(np.copyto, d, s)


def concat_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """src0 then src1 along dimension ConcatParams.dim, any one type: quantized rows are their bytes (dst's last
    axis), so along dim 0 their blocks are joined as ggml's concat_any copies them."""
    _same_type(node, node.src[0], node.src[1], quantized=True)
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    dim = ConcatParams.of(node).dim
    if not 0 <= dim < GGML_MAX_DIMS:
        raise ArgumentError(f"CPU CONCAT '{node.name}': dim={dim} is outside [0, {GGML_MAX_DIMS})")
    axis = GGML_MAX_DIMS - 1 - dim
    want = list(a.shape)
    want[axis] += b.shape[axis]
    others = [i for i in range(GGML_MAX_DIMS) if i != axis]
    if dst.shape != tuple(want) or any(a.shape[i] != b.shape[i] for i in others):
        raise ShapeError(f"CPU CONCAT '{node.name}': ne {list(a.shape[::-1])} and {list(b.shape[::-1])} "
                         f"do not join into {list(dst.shape[::-1])} along dim {dim}")
    n = a.shape[axis]
    da = dst[(slice(None),) * axis + (slice(0, n),)]
    db = dst[(slice(None),) * axis + (slice(n, None),)]

    def run() -> None:
        np.copyto(da, a)
        np.copyto(db, b)

    return run


def diag_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """A row [ne0, 1, ne2, ne3] to diagonal matrices [ne0, ne0, ne2, ne3]."""
    _same_type(node, node.src[0])
    src = srcs[0]
    assert src is not None
    n = src.shape[3]
    if src.shape[2] != 1 or dst.shape != (src.shape[0], src.shape[1], n, n):
        raise ShapeError(f"CPU DIAG '{node.name}': src ne {list(src.shape[::-1])}, dst ne {list(dst.shape[::-1])}")
    s3, s2, s1, s0 = dst.strides
    diagonal = strided_view(dst, (dst.shape[0], dst.shape[1], n), (s3, s2, s1 + s0), f"CPU DIAG '{node.name}'")
    row = src[:, :, 0, :]

    def run() -> None:
        dst.fill(0)
        np.copyto(diagonal, row)

    return run


def pad_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """src0 with PadParams' left and right padding in each dimension: zeros, or src0 wrapped around
    (circular)."""
    _same_type(node, node.src[0])
    src = srcs[0]
    assert src is not None
    p = PadParams.of(node)
    left, right = p.left()[::-1], p.right()[::-1]  # numpy axis order
    if min(left + right) < 0 or any(d != s + lp + rp for d, s, lp, rp in zip(dst.shape, src.shape, left, right,
                                                                             strict=True)):
        raise ShapeError(f"CPU PAD '{node.name}': src ne {list(src.shape[::-1])} padded by {list(p.left())} "
                         f"(left) and {list(p.right())} (right) is not dst ne {list(dst.shape[::-1])}")
    if dst.size == 0:
        return noop
    if p.circular:
        if src.size == 0:
            raise ShapeError(f"CPU PAD '{node.name}': an empty tensor cannot wrap around")
        index = np.ix_(*[(np.arange(d) - lp) % s for d, s, lp in zip(dst.shape, src.shape, left, strict=True)])

        def wrap() -> None:
            np.copyto(dst, src[index])

        return wrap
    inner = dst[tuple(slice(lp, lp + s) for lp, s in zip(left, src.shape, strict=True))]

    def run() -> None:
        dst.fill(0)
        np.copyto(inner, src)

    return run


def _upscale_taps(mode: int, n_dst: int, n_src: int, sf: np.float32, pixel_offset: np.float32
                  ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(source index, weight) pairs giving each of n_dst positions along one axis, as ggml's upscale kernel
    computes them in f32 (weight None: 1)."""
    i = np.arange(n_dst, dtype=np.float32)
    last = n_src - 1
    if mode == ScaleMode.NEAREST:
        return [(np.minimum((i / sf).astype(np.int64), last), None)]
    x = (i + pixel_offset) / sf - pixel_offset
    x0 = np.floor(x).astype(np.int64)
    if mode == ScaleMode.BILINEAR:
        lo, hi = np.clip(x0, 0, last), np.clip(x0 + 1, 0, last)
        dx = np.clip(x - lo.astype(np.float32), 0, 1).astype(np.float32)
        return [(lo, (1 - dx).astype(np.float32)), (hi, dx)]
    a = np.float32(-0.75)  # BICUBIC, alpha as PyTorch's

    def weight1(t: np.ndarray) -> np.ndarray:
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def weight2(t: np.ndarray) -> np.ndarray:
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    dx = (x - x0.astype(np.float32)).astype(np.float32)
    one, two = np.float32(1), np.float32(2)
    weights = [weight2(dx + one), weight1(dx), weight1(one - dx), weight2(two - dx)]
    return [(np.clip(x0 + k - 1, 0, last), w.astype(np.float32)) for k, w in enumerate(weights)]


def _antialias_taps(n_dst: int, n_src: int, sf: np.float32, pixel_offset: np.float32
                    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(source index, weight) pairs of BILINEAR with ANTIALIAS along one axis, as ggml's upscale kernel weighs
    them (PyTorch's antialiased bilinear): a triangle filter over the sources within `support` of each
    position, its weights normalized to sum 1. ggml divides the 2-D weighted sum by the product of the two
    axes' weight sums, which is this per-axis normalization (the weights of one position are products)."""
    f32 = np.float32
    support = max(f32(1.0), f32(1.0) / sf)
    invscale = f32(1.0) / support
    x = (np.arange(n_dst, dtype=f32) + pixel_offset) / sf
    lo = np.maximum((x - support + pixel_offset).astype(np.int64), 0)  # C's casts truncate toward zero
    hi = np.minimum((x + support + pixel_offset).astype(np.int64), n_src)
    count = int((hi - lo).max(initial=0))
    index = lo[None, :] + np.arange(count, dtype=np.int64)[:, None]  # (tap, position)
    weight = np.maximum(f32(1.0) - np.abs((index.astype(f32) - x + pixel_offset) * invscale), f32(0.0))
    weight[index >= hi] = 0
    total = weight.sum(axis=0, dtype=f32)
    weight = np.divide(weight, total, out=np.zeros_like(weight), where=total > 0).astype(f32)
    index = np.minimum(index, n_src - 1)
    return [(index[t], weight[t]) for t in range(count)]


def _resample(x: np.ndarray, axis: int, taps: list[tuple[np.ndarray, np.ndarray | None]]) -> np.ndarray:
    """x resampled along `axis`: the sum over taps of weight * x[index] (f32)."""
    out: np.ndarray | None = None
    shape = [1] * x.ndim
    shape[axis] = -1
    for index, weight in taps:
        term = np.take(x, index, axis=axis)
        if weight is not None:
            term = term * weight.reshape(shape)
        out = term if out is None else out + term
    assert out is not None
    return out


def upscale_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Resize src0 to dst's shape (UpscaleParams' mode: NEAREST, BILINEAR or BICUBIC over dims 0 and 1, the
    nearest element over dims 2 and 3; ALIGN_CORNERS; ANTIALIAS, which only BILINEAR heeds), as ggml's upscale
    kernel, in f32."""
    _same_type(node, node.src[0])
    src = srcs[0]
    assert src is not None
    p = UpscaleParams.of(node)
    mode = p.scale_mode
    if not p.known:
        raise UnsupportedTypeError(f"CPU UPSCALE '{node.name}': mode {p.mode:#x} is not supported (NEAREST, "
                                   "BILINEAR, BICUBIC with ALIGN_CORNERS and ANTIALIAS flags)")
    if dst.size == 0:
        return noop
    if src.size == 0:
        raise ShapeError(f"CPU UPSCALE '{node.name}': an empty src ne {list(src.shape[::-1])} cannot fill "
                         f"dst ne {list(dst.shape[::-1])}")
    n3, n2, n1, n0 = dst.shape
    s3, s2, s1, s0 = src.shape
    f32 = np.float32
    sf = [f32(n) / f32(m) for n, m in ((n0, s0), (n1, s1), (n2, s2), (n3, s3))]
    pixel_offset = f32(0.5)
    if p.flags & ScaleFlag.ALIGN_CORNERS:
        pixel_offset = f32(0.0)
        if n0 > 1 and s0 > 1:
            sf[0] = f32(n0 - 1) / f32(s0 - 1)
        if n1 > 1 and s1 > 1:
            sf[1] = f32(n1 - 1) / f32(s1 - 1)
    # (the last source index at most: a float quotient may round up to ne itself)
    i3 = np.minimum((np.arange(n3, dtype=f32) / sf[3]).astype(np.int64), s3 - 1)
    i2 = np.minimum((np.arange(n2, dtype=f32) / sf[2]).astype(np.int64), s2 - 1)
    if mode == ScaleMode.BILINEAR and p.flags & ScaleFlag.ANTIALIAS:
        taps1 = _antialias_taps(n1, s1, sf[1], pixel_offset)
        taps0 = _antialias_taps(n0, s0, sf[0], pixel_offset)
    else:
        taps1 = _upscale_taps(mode, n1, s1, sf[1], pixel_offset)
        taps0 = _upscale_taps(mode, n0, s0, sf[0], pixel_offset)
    if mode == ScaleMode.NEAREST:
        index = np.ix_(i3, i2, taps1[0][0], taps0[0][0])

        def nearest() -> None:
            np.copyto(dst, src[index])

        return nearest
    outer = np.ix_(i3, i2)

    def run() -> None:
        x = src[outer].astype(np.float32)
        np.copyto(dst, _resample(_resample(x, 3, taps0), 2, taps1))

    return run


def set_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = src0, then dst's window (op_params: nb1, nb2, nb3, offset in bytes) = src1."""
    a_t, b_t = node.src[0], node.src[1]
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None and a_t is not None and b_t is not None
    _same_type(node, a_t)
    if b_t.type != node.type and not (b_t.type in _NUMPY_FLOATS and node.type in _NUMPY_FLOATS):
        raise UnsupportedTypeError(f"CPU SET '{node.name}': cannot store {b_t.type.name} into {node.type.name}")
    check_same_shape(node, dst, a)
    view = acc_view(node, dst, b.shape)
    copy = not same_memory(dst, a)

    def run() -> None:
        if copy:
            np.copyto(dst, a)
        np.copyto(view, b)

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.DUP: dup_kernel,
    GGMLOp.CONT: dup_kernel,
    GGMLOp.CPY: cpy_kernel,
    GGMLOp.GET_ROWS: get_rows_kernel,
    GGMLOp.REPEAT: repeat_kernel,
    GGMLOp.CONCAT: concat_kernel,
    GGMLOp.DIAG: diag_kernel,
    GGMLOp.PAD: pad_kernel,
    GGMLOp.UPSCALE: upscale_kernel,
    GGMLOp.SET: set_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node` (types as the kernels above take them)."""
    op = node.op
    if op not in KERNELS:
        return False
    src0 = node.src[0]
    if src0 is None:
        return False
    if op in (GGMLOp.DUP, GGMLOp.CONT, GGMLOp.CPY):
        st, dt = src0.type, node.type
        return st == dt or (st, dt) in _INT_CASTS or (is_convertible(st) and is_writable(dt))
    if op == GGMLOp.GET_ROWS:
        idx = node.src[1]
        if idx is None or idx.type != GGMLType.I32:
            return False
        if src0.type == GGMLType.I32:
            return node.type == GGMLType.I32
        return is_convertible(src0.type) and node.type in _NUMPY_FLOATS
    if op == GGMLOp.UPSCALE:
        try:
            p = UpscaleParams.of(node)
        except GGMLError:
            return False
        if not p.known:
            return False
    srcs = [s for s in node.src[:2] if s is not None]
    if op == GGMLOp.SET:
        srcs = srcs[:1]
    quantized_ok = op == GGMLOp.CONCAT
    return all(s.type == node.type and (quantized_ok or not TYPE_TRAITS[s.type].is_quantized) for s in srcs)
