"""CPU kernels of the small ops: SIN, COS, FILL, ARANGE, TRI, CUMSUM, COUNT_EQUAL, L2_NORM, ROLL,
PAD_REFLECT_1D, TIMESTEP_EMBEDDING, REPEAT_BACK, SOLVE_TRI, and the direct convolutions CONV_2D, CONV_2D_DW,
CONV_TRANSPOSE_2D (F32 or F16 kernels, F32 inputs and results).

Types as ggml-cpu's ops.cpp takes them: SIN/COS F32, F16 and BF16 (ggml's unary_op pairs), FILL F32/F16,
COUNT_EQUAL I32, the convolutions' kernels F32/F16, the others F32.
"""

from __future__ import annotations

import functools

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import (
    F32,
    FLOAT_TYPES,
    all_float,
    collapse,
    is_multiple,
    noop,
    require_types,
    through_f32,
)
from pyggml.backends.cpu.kernels.conv import _padded, _windows, check_conv_shape
from pyggml.core.errors import ArgumentError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.node_check import checked_count
from pyggml.core.ops.params import (
    ArangeParams,
    Conv2dParams,
    ConvTranspose2dParams,
    FillParams,
    NormParams,
    PadReflect1dParams,
    RollParams,
    TimestepEmbeddingParams,
    TriParams,
)
from pyggml.core.tensor import GGMLOp, Tensor, TriType
from pyggml.core.types import GGMLType

_F32_ONLY = (GGMLType.F32,)


def _ne(a: np.ndarray) -> list[int]:
    return list(a.shape[::-1])


def _same_shape_src0(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                     types: tuple[GGMLType, ...]) -> np.ndarray:
    require_types(node, types, node, node.src[0])
    x = srcs[0]
    assert x is not None
    if x.shape != dst.shape:
        raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 ne {_ne(x)} and dst ne {_ne(dst)} differ")
    return x


_UNARY_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


def _unary_types_ok(node: Tensor) -> bool:
    """ggml's unary_op pairs: src0 and dst of one type, or F16/BF16 src0 into an F32 dst."""
    src = node.src[0]
    return src is not None and src.type in _UNARY_TYPES and (node.type == src.type or node.type == GGMLType.F32)


def _ufunc_kernel(ufunc: np.ufunc) -> Kernel:
    """dst = ufunc(src0) computed in f32 and rounded once to dst's type, as ggml's unary_op (BF16 as bits)."""

    def kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
        x = srcs[0]
        assert x is not None
        if not _unary_types_ok(node):
            src = node.src[0].type.name if node.src[0] is not None else "none"
            raise UnsupportedTypeError(f"CPU {node.op.name} '{node.name}': src0 {src} into dst {node.type.name}; "
                                       "this kernel takes F32, F16 or BF16, into the same type or F32")
        if x.shape != dst.shape:
            raise ShapeError(f"CPU {node.op.name} '{node.name}': src0 ne {_ne(x)} and dst ne {_ne(dst)} differ")
        if dst.size == 0:
            return noop
        d, x = collapse(dst, x)
        return through_f32(d, [x], lambda d, x: functools.partial(ufunc, x, out=d, dtype=F32, casting="unsafe"))

    return kernel


sin_kernel = _ufunc_kernel(np.sin)
cos_kernel = _ufunc_kernel(np.cos)


def fill_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = c everywhere (FillParams.c; rounded to f16 for an F16 dst)."""
    require_types(node, FLOAT_TYPES, node)
    c = FillParams.of(node).c
    return functools.partial(dst.fill, c)


def arange_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[i] = start + step * i in float32."""
    require_types(node, _F32_ONLY, node)
    p = ArangeParams.of(node)
    d = dst.reshape(-1)
    with np.errstate(all="ignore"):  # NaN, infinity and a step of 0 are refused as counts below
        span = np.float32(np.float32(p.stop) - np.float32(p.start)) / np.float32(p.step)
    steps = checked_count(float(np.ceil(span)), f"CPU ARANGE '{node.name}': the count of start={p.start}, "
                          f"stop={p.stop}, step={p.step}")
    if d.size != steps:
        raise ShapeError(f"CPU ARANGE '{node.name}': dst has {d.size} elements, the range {steps}")
    values = np.float32(p.start) + np.float32(p.step) * np.arange(steps, dtype=F32)
    return functools.partial(np.copyto, d, values)


def timestep_embedding_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                              params: ComputeParams) -> Compute:
    """dst[j, i] = cos(t_i * f_j), dst[j + dim/2, i] = sin(t_i * f_j), f_j = exp(-log(max_period) * j / half)."""
    require_types(node, _F32_ONLY, node, node.src[0])
    x = srcs[0]
    assert x is not None
    p = TimestepEmbeddingParams.of(node)
    half = p.dim // 2
    if dst.shape != (1, 1, x.shape[3], p.dim) or 0 in x.shape:
        raise ShapeError(f"CPU TIMESTEP_EMBEDDING '{node.name}': dst ne {_ne(dst)} for src ne {_ne(x)}, dim {p.dim}")
    # float32 as ggml's expf(-logf(max_period) * j / half)
    j = np.arange(half, dtype=F32)
    freqs = np.exp((np.float32(-np.log(np.float32(p.max_period))) * j) / np.float32(max(half, 1)), dtype=F32)
    t = x[0, 0, 0]  # ggml reads the first row only (ne0 timesteps)
    d = dst[0, 0]

    def run() -> None:
        arg = np.multiply.outer(t, freqs).astype(F32, copy=False)
        np.cos(arg, out=d[:, :half])
        np.sin(arg, out=d[:, half:2 * half])
        if p.dim % 2:
            d[:, 2 * half] = 0.0

    return run


def tri_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = src0 where (column, row) is in the triangle TriParams.type, else 0."""
    x = _same_shape_src0(node, dst, srcs, _F32_ONLY)
    tt = TriParams.of(node).type
    n1, n0 = x.shape[2], x.shape[3]
    col = np.arange(n0)[None, :]
    row = np.arange(n1)[:, None]
    keeps = {TriType.LOWER: col < row, TriType.LOWER_DIAG: col <= row,
             TriType.UPPER: col > row, TriType.UPPER_DIAG: col >= row}
    if tt not in keeps:
        raise ArgumentError(f"CPU TRI '{node.name}': op param 0 = {tt} is not a TriType")
    mask = keeps[TriType(tt)]
    zero = np.float32(0.0)

    def run() -> None:
        np.copyto(dst, np.where(mask, x, zero))

    return run


def cumsum_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = the running sum along each row (float32 accumulation, in order, as ggml_vec_cumsum_f32)."""
    x = _same_shape_src0(node, dst, srcs, _F32_ONLY)
    if dst.size == 0:
        return noop
    return functools.partial(np.cumsum, x, axis=-1, dtype=F32, out=dst)


def count_equal_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst[0] = the number of positions where src0 == src1 (I32 sources, I64 dst)."""
    require_types(node, (GGMLType.I32,), node.src[0], node.src[1])
    require_types(node, (GGMLType.I64,), node)
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    if a.shape != b.shape or dst.size != 1:
        raise ShapeError(f"CPU COUNT_EQUAL '{node.name}': src0 ne {_ne(a)}, src1 ne {_ne(b)}, dst ne {_ne(dst)}")
    d = dst.reshape(())

    def run() -> None:
        d[()] = np.count_nonzero(np.equal(a, b))

    return run


def l2_norm_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = each row / max(||row||, eps) (the sum of squares in f64, as ggml's ggml_float)."""
    x = _same_shape_src0(node, dst, srcs, _F32_ONLY)
    eps = NormParams.of(node).eps
    if eps < 0:
        raise ArgumentError(f"CPU L2_NORM '{node.name}': eps={eps} must not be negative")
    if dst.size == 0:
        return noop
    eps32 = np.float32(eps)

    def run() -> None:
        sq = np.square(x, dtype=F32)
        norm = np.sqrt(np.sum(sq, axis=-1, keepdims=True, dtype=np.float64).astype(F32))
        scale = np.float32(1.0) / np.maximum(norm, eps32)
        np.multiply(x, scale, out=dst)

    return run


def roll_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[i] = src0[(i - shift) mod ne] along every dimension."""
    x = _same_shape_src0(node, dst, srcs, _F32_ONLY)
    p = RollParams.of(node)
    shifts = (p.shift3, p.shift2, p.shift1, p.shift0)  # numpy axis order
    if dst.size == 0:
        return noop
    return lambda: np.copyto(dst, np.roll(x, shifts, axis=(0, 1, 2, 3)))


def pad_reflect_1d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                          params: ComputeParams) -> Compute:
    """Each row of src0 between its reflections: p0 elements on the left, p1 on the right."""
    require_types(node, _F32_ONLY, node, node.src[0])
    x = srcs[0]
    assert x is not None
    p = PadReflect1dParams.of(node)
    n0 = x.shape[3]
    if dst.shape != x.shape[:3] + (n0 + p.p0 + p.p1,) or not (0 <= p.p0 < n0 and 0 <= p.p1 < n0):
        raise ShapeError(f"CPU PAD_REFLECT_1D '{node.name}': dst ne {_ne(dst)} for src ne {_ne(x)}, "
                         f"p0={p.p0}, p1={p.p1}")
    if dst.size == 0:
        return noop
    return lambda: np.copyto(dst, np.pad(x, ((0, 0), (0, 0), (0, 0), (p.p0, p.p1)), mode="reflect"))


def repeat_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                       params: ComputeParams) -> Compute:
    """dst = src0 summed over its tiles of dst's shape (src0.ne[i] a multiple of dst.ne[i])."""
    require_types(node, _F32_ONLY, node, node.src[0])
    x = srcs[0]
    assert x is not None
    if 0 in dst.shape or not all(is_multiple(n, m) for n, m in zip(x.shape, dst.shape, strict=True)):
        raise ShapeError(f"CPU REPEAT_BACK '{node.name}': src0 ne {_ne(x)} is no tiling of dst ne {_ne(dst)}")
    # (n/m, m) per axis, then sum the tile axes
    shape = tuple(s for n, m in zip(x.shape, dst.shape, strict=True) for s in (n // m, m))
    tile_axes = (0, 2, 4, 6)

    def run() -> None:
        np.sum(np.reshape(x, shape), axis=tile_axes, dtype=F32, out=dst)

    return run


def solve_tri_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """Forward substitution: row r of X = (B[r] - A[r, :r] @ X[:r]) / A[r, r], for every batch and column."""
    require_types(node, _F32_ONLY, node, node.src[0], node.src[1])
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    n = a.shape[3]
    if a.shape[2] != n or b.shape[2] != n or dst.shape != b.shape or a.shape[:2] != b.shape[:2]:
        raise ShapeError(f"CPU SOLVE_TRI '{node.name}': a ne {_ne(a)}, b ne {_ne(b)}, dst ne {_ne(dst)}")
    if dst.size == 0:
        return noop

    def run() -> None:
        for r in range(n):
            # sum over t < r of A[r, t] * X[t, :], in float32 (ggml sums in order; NMSE absorbs the order)
            acc = np.einsum("...t,...tk->...k", a[:, :, r, :r], dst[:, :, :r, :], dtype=F32) if r else 0.0
            dst[:, :, r, :] = (b[:, :, r, :] - acc) / a[:, :, r, r:r + 1]

    return run


# --- direct convolutions ---


def _conv_windows(node: Tensor, x: np.ndarray, k_hw: tuple[int, int], out_hw: tuple[int, int],
                  f16: bool) -> tuple[np.ndarray, Compute]:
    """(N, C, OH, OW, KH, KW): the zero-padded input under each kernel tap of each output position (a strided
    view of a padded copy made once), and the function that refreshes the copy from x each run (rounding it to
    f16 first for an F16 kernel, as ggml). The op_params are checked against ggml's shape rule first
    (`check_conv_shape`: dst's OW, OH those ggml_conv_2d_direct computes)."""
    p = Conv2dParams.of(node)
    s, pad, d = (p.s1, p.s0), (p.p1, p.p0), (p.d1, p.d0)
    check_conv_shape(node, x.shape[2:], k_hw, s, pad, d, out_hw)
    # the last window's taps may reach past the padded input (ggml's output sizes round toward zero): zeros there
    reach = [(o - 1) * si + (kk - 1) * di + 1 for o, kk, si, di in zip(out_hw, k_hw, s, d, strict=True)]
    after = tuple(max(q, r - n - q) for q, r, n in zip(pad, reach, x.shape[2:], strict=True))
    padded, refresh = _padded(x, pad, 0.0, True, node, after)
    assert refresh is not None

    def refresh_f16() -> None:
        refresh()
        np.copyto(padded, padded.astype(np.float16))

    return _windows(padded, out_hw, k_hw, s, d, node), refresh_f16 if f16 else refresh


def _conv_operands(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    require_types(node, FLOAT_TYPES, node.src[0])
    require_types(node, _F32_ONLY, node.src[1], node)
    k, x = srcs[0], srcs[1]
    assert k is not None and x is not None
    return k, x


def conv_2d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst[n, oc, y, x] = sum over ic, ky, kx of kernel[oc, ic, ky, kx] * input[n, ic, y s1 + ky d1 - p1,
    x s0 + kx d0 - p0] (zero outside); with an F16 kernel the input is rounded to f16 first, as ggml."""
    k, x = _conv_operands(node, dst, srcs)
    oc, ic, kh, kw = k.shape
    n, _, oh, ow = dst.shape
    if x.shape[1] != ic or dst.shape[:2] != (x.shape[0], oc):
        raise ShapeError(f"CPU CONV_2D '{node.name}': kernel ne {_ne(k)}, input ne {_ne(x)}, dst ne {_ne(dst)}")
    if dst.size == 0:
        return noop
    f16 = node.src[0] is not None and node.src[0].type == GGMLType.F16
    win, refresh = _conv_windows(node, x, (kh, kw), (oh, ow), f16)

    def run() -> None:
        refresh()
        out = np.tensordot(win, k.astype(F32), axes=((1, 4, 5), (1, 2, 3)))  # (N, OH, OW, OC)
        np.copyto(dst, out.transpose(0, 3, 1, 2))

    return run


def conv_2d_dw_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                      params: ComputeParams) -> Compute:
    """Depthwise: dst[n, c, y, x] = sum over ky, kx of kernel[c, 0, ky, kx] * input[n, c, ...] (zero outside);
    WHCN and CWHN layouts alike (numpy strides)."""
    k, x = _conv_operands(node, dst, srcs)
    c, one, kh, kw = k.shape
    _, _, oh, ow = dst.shape
    if one != 1 or x.shape[1] != c or dst.shape[:2] != x.shape[:2]:
        raise ShapeError(f"CPU CONV_2D_DW '{node.name}': kernel ne {_ne(k)}, input ne {_ne(x)}, dst ne {_ne(dst)}")
    if dst.size == 0:
        return noop
    win, refresh = _conv_windows(node, x, (kh, kw), (oh, ow), False)

    def run() -> None:
        refresh()
        np.copyto(dst, np.einsum("ncyxhw,chw->ncyx", win, k[:, 0].astype(F32), dtype=F32))

    return run


def conv_transpose_2d_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                             params: ComputeParams) -> Compute:
    """dst[n, oc, y s + ky, x s + kx] += sum over ic of input[n, ic, y, x] * kernel[ic, oc, ky, kx]; with an F16
    kernel the input is rounded to f16 first, as ggml."""
    k, x = _conv_operands(node, dst, srcs)
    s = ConvTranspose2dParams.of(node).stride
    ic, oc, kh, kw = k.shape
    n, _, h, w = x.shape
    if s < 1 or x.shape[1] != ic or dst.shape != (n, oc, (h - 1) * s + kh, (w - 1) * s + kw):
        raise ShapeError(f"CPU CONV_TRANSPOSE_2D '{node.name}': kernel ne {_ne(k)}, input ne {_ne(x)}, "
                         f"dst ne {_ne(dst)}, stride {s}")
    if dst.size == 0:
        return noop
    f16 = node.src[0] is not None and node.src[0].type == GGMLType.F16

    def run() -> None:
        xs = x.astype(np.float16).astype(F32) if f16 else x.astype(F32, copy=False)
        kf = k.astype(F32)
        dst.fill(0.0)
        for ky in range(kh):
            for kx in range(kw):
                contrib = np.einsum("nchw,co->nohw", xs, kf[:, :, ky, kx], dtype=F32)
                dst[:, :, ky:ky + (h - 1) * s + 1:s, kx:kx + (w - 1) * s + 1:s] += contrib

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.SIN: sin_kernel,
    GGMLOp.COS: cos_kernel,
    GGMLOp.FILL: fill_kernel,
    GGMLOp.ARANGE: arange_kernel,
    GGMLOp.TIMESTEP_EMBEDDING: timestep_embedding_kernel,
    GGMLOp.TRI: tri_kernel,
    GGMLOp.CUMSUM: cumsum_kernel,
    GGMLOp.COUNT_EQUAL: count_equal_kernel,
    GGMLOp.L2_NORM: l2_norm_kernel,
    GGMLOp.ROLL: roll_kernel,
    GGMLOp.PAD_REFLECT_1D: pad_reflect_1d_kernel,
    GGMLOp.REPEAT_BACK: repeat_back_kernel,
    GGMLOp.SOLVE_TRI: solve_tri_kernel,
    GGMLOp.CONV_2D: conv_2d_kernel,
    GGMLOp.CONV_2D_DW: conv_2d_dw_kernel,
    GGMLOp.CONV_TRANSPOSE_2D: conv_transpose_2d_kernel,
}

_TYPES: dict[GGMLOp, tuple[GGMLType, ...]] = {GGMLOp.FILL: FLOAT_TYPES, GGMLOp.COUNT_EQUAL: (GGMLType.I32,)}


_CONVS = (GGMLOp.CONV_2D, GGMLOp.CONV_2D_DW, GGMLOp.CONV_TRANSPOSE_2D)


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: the sources' (and dst's) types as ggml's CPU takes them."""
    if node.op not in KERNELS:
        return False
    if node.op in _CONVS:
        return all_float(node.src[0]) and node.src[1] is not None and node.src[1].type == GGMLType.F32 \
            and node.type == GGMLType.F32
    if node.op in (GGMLOp.SIN, GGMLOp.COS):
        return _unary_types_ok(node)
    types = _TYPES.get(node.op, _F32_ONLY)
    if any(s is not None and s.type not in types for s in node.src[:2]):
        return False
    if node.op == GGMLOp.COUNT_EQUAL:
        return node.type == GGMLType.I64
    if node.op == GGMLOp.TRI:
        return TriParams.of(node).type in tuple(int(t) for t in TriType)
    return node.type in types
