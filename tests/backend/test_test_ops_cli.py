"""`pyggml test-ops`: the table, its verdicts and its exit code; and the CPU backend's results
against an oracle that shares no code with it: `NumpyBackend` computes every op of the table
from ggml's definition in numpy (float64, rounded to the node's type once), reading and writing
quantized data with the gguf package's reference quantizers. Comparing the CPU with itself would
pass whatever its kernels compute; comparing it with numpy fails when a kernel is wrong, which
`test_a_wrong_cpu_kernel_fails_against_numpy` shows kernel by kernel."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import gguf
import numpy as np
import pytest
from numpy_conv_back import CONV_BACK_FORMULAS
from ssm_formulas import SSM_FORMULAS

from pyggml.backends.cpu import CPUBackend
from pyggml.backends.cpu.kernels import KERNELS
from pyggml.cli.main import main
from pyggml.core import memory
from pyggml.core.graph import Graph
from pyggml.core.ops.custom import custom_op_params
from pyggml.core.tensor import GGMLOp, OpPool, ScaleFlag, ScaleMode, SortOrder, Tensor, UnaryOp, is_view_op
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend import register_backend, tensor_get_numpy, tensor_set_numpy, unregister_backend
from pyggml.testing import op_check
from pyggml.testing.op_check import MAX_NMSE, OpCase, compare, new, op, run_case

# the ops of the core, by the label test-ops shows (ggml's op desc: UNARY shows its function)
CORE_OPS = [
    "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SUM", "SUM_ROWS", "MEAN", "ARGMAX",
    "REPEAT", "CONCAT", "NORM", "RMS_NORM", "GROUP_NORM", "MUL_MAT", "OUT_PROD", "SCALE", "SET", "CPY", "CONT",
    "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "DIAG", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "ROPE", "CLAMP", "IM2COL", "CONV_TRANSPOSE_1D", "POOL_1D", "POOL_2D", "UPSCALE", "PAD",
    "ARGSORT", "TOP_K", "LEAKY_RELU", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM",
] + [u.name for u in UnaryOp]


class WrongBackend(CPUBackend):
    """Computes like the CPU, then nudges every graph's last node: its results must be caught."""

    def _get_name(self) -> str:
        return "Wrong"

    def _graph_compute(self, graph: Graph) -> None:
        super()._graph_compute(graph)
        out = graph.nodes[-1]
        tensor_set_numpy(out, tensor_get_numpy(out).astype(np.float32) * 1.01)


class NothingBackend(CPUBackend):
    def _get_name(self) -> str:
        return "Nothing"

    def _supports_op(self, op: Tensor) -> bool:
        return False


# --- the numpy oracle ---

F32, BF16, I32 = GGMLType.F32, GGMLType.BF16, GGMLType.I32
# gguf's numpy quantizers (llama.cpp's own reference code, ported): the quantized types it can write
GGUF_QUANTIZE = {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0}


def _gguf_reads(t: GGMLType) -> bool:
    """Whether gguf's numpy dequantizers read type `t` (the gguf package lags ggml's newest types)."""
    try:
        gguf.quants.dequantize(np.zeros((1, TYPE_TRAITS[t].type_size), np.uint8), gguf.GGMLQuantizationType(int(t)))
    except (ValueError, NotImplementedError):
        return False
    return True


# the quantized types the oracle cannot read
GGUF_UNREADABLE = {t for t in GGMLType if TYPE_TRAITS[t].is_quantized and not _gguf_reads(t)}


def read(t: Tensor) -> np.ndarray:
    """A tensor's values as float64 in numpy order (ne3, ne2, ne1, ne0), whatever its layout and type."""
    v = memory.tensor_view(t)  # strided: permuted and transposed views read in logical order
    if t.type == BF16:
        return (v.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if TYPE_TRAITS[t.type].is_quantized:
        rows = np.ascontiguousarray(v).reshape(-1, v.shape[-1])
        values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(int(t.type)))
        return values.astype(np.float64).reshape(v.shape[:3] + (t.ne[0],))
    return v.astype(np.float64)


def ggml_rows(t: Tensor) -> np.ndarray:
    """A float tensor's values as ggml's SUM, MEAN and ARGMAX kernels read them, as float64: each row's ne0
    elements one after another from the row's first, whatever its nb0 (their assert on it is compiled out)."""
    v = memory.tensor_view(t)
    return np.lib.stride_tricks.as_strided(v, v.shape, v.strides[:3] + (v.itemsize,)).astype(np.float64)


def write(t: Tensor, values: np.ndarray) -> None:
    """Round `values` to t's type once (BF16 to nearest even, Q8_0 as ggml-cpu, other quantized by gguf) and
    store them."""
    dst = memory.tensor_view(t)
    values = np.broadcast_to(np.asarray(values, np.float64), tuple(t.ne[::-1]))
    if t.type == BF16:
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        dst[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    elif t.type == GGMLType.Q8_0:
        # ggml-cpu's SIMD quantize_row_q8_0 (what its CPY writes): d = amax/127, q = rint(x * 127/amax)
        blocks = values.reshape(-1, 32).astype(np.float32)
        amax = np.abs(blocks).max(axis=1)
        inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
        raw = dst.reshape(-1, 34)
        raw[:, :2] = (amax / np.float32(127)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, 2:] = np.rint(blocks * inv[:, None]).astype(np.int8).view(np.uint8)
    elif TYPE_TRAITS[t.type].is_quantized:
        rows = values.reshape(-1, t.ne[0]).astype(np.float32)
        dst[...] = gguf.quants.quantize(rows, gguf.GGMLQuantizationType(int(t.type))).reshape(dst.shape)
    elif t.type == I32:
        dst[...] = values.astype(np.int64)
    else:
        dst[...] = values.astype(dst.dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs, UnaryOp.SGN: np.sign, UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float64), UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(x)), UnaryOp.RELU: lambda x: np.maximum(x, 0.0),
    UnaryOp.SIGMOID: sigmoid,
    UnaryOp.GELU: lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    UnaryOp.GELU_QUICK: lambda x: x * sigmoid(1.702 * x), UnaryOp.SILU: lambda x: x * sigmoid(x),
    UnaryOp.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    UnaryOp.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1),
    UnaryOp.EXP: np.exp, UnaryOp.EXPM1: np.expm1, UnaryOp.SOFTPLUS: lambda x: np.logaddexp(0.0, x),
    UnaryOp.GELU_ERF: lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    UnaryOp.FLOOR: np.floor, UnaryOp.CEIL: np.ceil, UnaryOp.TRUNC: np.trunc,
    UnaryOp.ROUND: lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),  # C's roundf: halves away from zero
}


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def _unary(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    op = UnaryOp(node.get_op_params_i32(0))
    if op in (UnaryOp.GELU, UnaryOp.GELU_QUICK) and node.type == F32:
        # ggml's CPU reads these from f16 tables: f16 in, f16 out; GELU is 0 below -10 and x above 10
        y = _f16(UNARY[op](_f16(a)))
        return np.where(a <= -10, 0.0, np.where(a >= 10, a, y)) if op == UnaryOp.GELU else y
    if op != UnaryOp.XIELU:
        return UNARY[op](a)
    # ggml_xielu's words: [XIELU, alpha_n (beta + softplus already), alpha_p (softplus'd), beta, eps]
    alpha_n, alpha_p, beta, eps = (node.get_op_params_f32(i) for i in range(1, 5))
    return np.where(a > 0, alpha_p * a * a + beta * a, (np.expm1(np.minimum(a, eps)) - a) * alpha_n + beta * a)
# the MAP_CUSTOM functions of the table, restated
CUSTOM: dict[Callable[..., None], Callable[..., np.ndarray]] = {
    op_check._custom1: lambda a: 2 * a + 1,
    op_check._custom2: lambda a, b: a * b - 1,
    op_check._custom3: lambda a, b, c: a + b * c,
    op_check._custom: lambda a, b: a - 2 * b,
}


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.tile(b, [n // m for n, m in zip(shape, b.shape, strict=True)])


def normalize(x: np.ndarray, eps: float, axis: int | tuple[int, ...] = -1, center: bool = True) -> np.ndarray:
    if center:
        x = x - x.mean(axis, keepdims=True)
    return x / np.sqrt((x * x).mean(axis, keepdims=True) + eps)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda node, a, b, shape: fn(a, tile_to(b, a.shape))  # ggml broadcasts b by repeating it


def _rope(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # ggml_rope_impl's words: [0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
    # beta_fast, beta_slow, sections[4], n_offs]; frequency factors (optional) in src[2]
    w = node.get_op_params_i32
    n_dims, mode, n_ctx_orig, n_offs = w(1), w(2), w(4), w(15)
    base, fscale, ext, attn, beta_fast, beta_slow = (node.get_op_params_f32(i) for i in range(5, 11))
    sections = [w(i) for i in range(11, 15)]
    vision = mode == 24
    n_pairs = n_dims if vision else n_dims // 2
    k = np.arange(n_pairs)
    power = k.astype(np.float64)
    n_tok = shape[1]
    pos = b.reshape(-1).astype(np.float64)
    if mode & 8:  # multi-rope: pair k takes the position of its section (t, h, w, e)
        sector = k % sum(sections)
        begin = np.cumsum([0] + sections[:3])
        if mode == 40:  # IMROPE: the sections interleaved
            stream = np.where((sector % 3 == 1) & (sector < 3 * sections[1]), 1,
                              np.where((sector % 3 == 2) & (sector < 3 * sections[2]), 2,
                                       np.where((sector % 3 == 0) & (sector < 3 * sections[0]), 0, 3)))
        else:
            stream = np.searchsorted(begin, sector, side="right") - 1
        if vision:  # each section's angles start again at its first dimension
            power = (sector - begin[stream]).astype(np.float64)
        p = pos.reshape(4, n_tok)[stream].T  # (tokens, pairs)
    else:
        p = np.repeat(pos[:n_tok, None], n_pairs, axis=1)
    theta = p * base ** (-2.0 * power / n_dims)
    ff = node.src[2]
    if ff is not None:
        theta = theta / read(ff).reshape(-1)[:n_pairs]
    angle, mscale = fscale * theta, attn
    if ext != 0.0:  # YaRN: between interpolation and extrapolation over the dims from low to high
        def corr_dim(n_rot: float) -> float:  # n_ctx_orig = 0 (test-backend-ops'): log(0) = -inf, as in C
            with np.errstate(divide="ignore"):
                return float(n_dims * np.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base)))

        low, high = max(0, np.floor(corr_dim(beta_fast))), min(n_dims - 1, np.ceil(corr_dim(beta_slow)))
        ramp = (1 - np.clip((k - low) / max(0.001, high - low), 0, 1)) * ext
        angle = angle * (1 - ramp) + theta * ramp
        mscale = attn * (1 + 0.1 * math.log(1 / fscale))
    sign = -1.0 if node.op == GGMLOp.ROPE_BACK else 1.0  # the backward turns by -angle
    cos, sin = (np.cos(angle) * mscale)[None, :, None, :], (sign * np.sin(angle) * mscale)[None, :, None, :]
    if mode == 0:
        i0, i1 = n_offs + 2 * k, n_offs + 2 * k + 1
    elif vision:
        i0, i1 = k, k + n_dims
    else:
        i0, i1 = n_offs + k, n_offs + k + n_dims // 2
    out = a.copy()
    x0, x1 = a[..., i0], a[..., i1]
    out[..., i0], out[..., i1] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def _acc_set(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    nb1, nb2, nb3, offset = (node.get_op_params_i32(i) for i in range(4))
    esz = TYPE_TRAITS[node.src[0].type].type_size  # a is contiguous: byte strides / esz index its elements
    flat = a.reshape(-1).copy()
    view = np.lib.stride_tricks.as_strided(flat[offset // esz:], b.shape,
                                           tuple(n // esz * flat.itemsize for n in (nb3, nb2, nb1, esz)))
    if node.op == GGMLOp.ACC:
        view += b
    else:
        view[...] = b
    return flat.reshape(a.shape)


def _get_rows(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    idx = b.astype(np.int64)[0]  # (ne12, ne11, ne10): row numbers into a's planes (i11, i12)
    out = np.empty(shape)
    for i2 in range(idx.shape[0]):
        for i1 in range(idx.shape[1]):
            out[i2, i1] = a[i2, i1][idx[i2, i1]]
    return out


def _soft_max(node: Tensor, a: np.ndarray, mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    # softmax(a * scale + slope * mask), mask row i1 for row i1, its dims 2 and 3 repeating; ALiBi's slope of
    # head i2 when max_bias > 0; the sinks (src[2]) one more logit per head
    scale, max_bias = node.get_op_params_f32(0), node.get_op_params_f32(1)
    x = a * scale
    n_head = a.shape[1]
    if mask is not None:
        m = tile_to(mask[:, :, : a.shape[2]], a.shape)
        if max_bias > 0:
            floor = 1 << int(math.floor(math.log2(n_head)))
            h = np.arange(n_head)
            slope = np.where(h < floor, 2.0 ** (-max_bias / floor * (h + 1)),
                             2.0 ** (-max_bias / 2 / floor * (2 * (h - floor) + 1)))
            m = m * slope[None, :, None, None]
        x = x + m
    sinks = node.src[2]
    extra = read(sinks).reshape(-1)[:n_head][None, :, None, None] if sinks is not None else None
    top = x.max(-1, keepdims=True) if extra is None else np.maximum(x.max(-1, keepdims=True), extra)
    e = np.exp(x - top)
    total = e.sum(-1, keepdims=True) + (np.exp(extra - top) if extra is not None else 0.0)
    return e / total


def _diag_mask(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    row, col = np.indices(a.shape[2:])
    value = -np.inf if node.op == GGMLOp.DIAG_MASK_INF else 0.0
    return np.where(col > node.get_op_params_i32(0) + row, value, a)


def _mul_mat(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    w = np.repeat(np.repeat(a, b.shape[0] // a.shape[0], axis=0), b.shape[1] // a.shape[1], axis=1)
    return b @ np.swapaxes(w, -1, -2)  # out[n, m] = sum_k a[m, k] b[n, k]


def _group_norm(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    n_groups, eps, ne2 = node.get_op_params_i32(0), node.get_op_params_f32(1), a.shape[1]
    per = (ne2 + n_groups - 1) // n_groups
    out = np.empty_like(a)
    for c in range(0, ne2, per):  # channels (ne2) in groups, each normalized over all its values
        out[:, c: c + per] = normalize(a[:, c: c + per], eps, axis=(1, 2, 3))
    return out


def _pool(a: np.ndarray, shape: tuple[int, ...], kind: int, k: tuple[int, int], s: tuple[int, int],
          p: tuple[int, int], count_valid: bool) -> np.ndarray:
    """Max or mean over windows (k, s, p in (y, x)) of the planes of a: the max over the elements in the
    window; the mean over the elements in it (count_valid, POOL_1D) or over the whole window, padding zeros."""
    out = np.empty(shape)
    for oy in range(shape[2]):
        y0 = oy * s[0] - p[0]
        for ox in range(shape[3]):
            x0 = ox * s[1] - p[1]
            win = a[:, :, max(y0, 0): max(y0 + k[0], 0), max(x0, 0): max(x0 + k[1], 0)]
            if kind == OpPool.MAX:
                out[:, :, oy, ox] = win.max((-1, -2))
            else:
                n = win.shape[-1] * win.shape[-2] if count_valid else k[0] * k[1]
                out[:, :, oy, ox] = win.sum((-1, -2)) / n if n else 0.0
    return out


def _pool_1d(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    kind, k0, s0, p0 = (node.get_op_params_i32(i) for i in range(4))
    rows = a.reshape(-1, 1, 1, a.shape[-1])
    return _pool(rows, (rows.shape[0], 1, 1, shape[-1]), kind, (1, k0), (1, s0), (0, p0), True).reshape(shape)


def _pool_2d(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    kind, k0, k1, s0, s1, p0, p1 = (node.get_op_params_i32(i) for i in range(7))
    return _pool(a, shape, kind, (k1, k0), (s1, s0), (p1, p0), False)


def _im2col(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # row (n, oy, ox) holds input[n, c, oy*s1 + ky*d1 - p1, ox*s0 + kx*d0 - p0] at column (c, ky, kx), 0 outside
    s0, s1, p0, p1, d0, d1, is_2d = (node.get_op_params_i32(i) for i in range(7))
    kw, kh = node.src[0].ne[0], node.src[0].ne[1] if is_2d else 1
    x = b if is_2d else b[0][:, :, None, :]  # (N, IC, H, W)
    oh, ow = (shape[1], shape[2]) if is_2d else (1, shape[2])
    out = np.zeros((x.shape[0], oh, ow, x.shape[1], kh, kw))
    for ky in range(kh):
        ys = np.arange(oh) * s1 + ky * d1 - p1
        for kx in range(kw):
            xs = np.arange(ow) * s0 + kx * d0 - p0
            inside = ((ys >= 0) & (ys < x.shape[2]))[:, None] & ((xs >= 0) & (xs < x.shape[3]))[None, :]
            vals = x[:, :, np.clip(ys, 0, x.shape[2] - 1)][:, :, :, np.clip(xs, 0, x.shape[3] - 1)]
            out[..., ky, kx] = np.where(inside, vals, 0.0).transpose(0, 2, 3, 1)
    return out.reshape(shape)


def _conv_transpose_1d(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    s0 = node.get_op_params_i32(0)
    kernel, x = a[0], b[0, 0]  # (IC, OC, K), (IC, L)
    out = np.zeros(shape[2:])  # (OC, OL): input position l spreads over outputs l*s0 .. l*s0 + K - 1
    for pos in range(x.shape[1]):
        out[:, pos * s0: pos * s0 + kernel.shape[2]] += np.einsum("c,cok->ok", x[:, pos], kernel)
    return out.reshape(shape)


def _custom(node: Tensor, *args: np.ndarray | tuple[int, ...]) -> np.ndarray:
    srcs = [read(s) for s in node.src if s is not None]
    return CUSTOM[custom_op_params(node).fun](*srcs)


def _pad(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    # words [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular]
    left = [node.get_op_params_i32(2 * d) for d in range(4)][::-1]  # numpy order
    if node.get_op_params_i32(8):  # circular: a wrapped around, as on a torus
        return a[np.ix_(*[(np.arange(n) - lp) % m for n, m, lp in zip(shape, a.shape, left, strict=True)])]
    out = np.zeros(shape)
    out[tuple(slice(lp, lp + n) for lp, n in zip(left, a.shape, strict=True))] = a
    return out


def _diag(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    i = np.arange(shape[-1])
    out[:, :, i, i] = a[:, :, 0, :]
    return out


def _resample_1d(n_out: int, n_in: int, mode: int, align_corners: bool, antialias: bool = False) -> np.ndarray:
    """The (n_out, n_in) matrix of weights giving each output position from the inputs (nearest, linear or cubic
    with a = -0.75, edges clamped), pixel centres at +0.5 unless align_corners; linear with antialias: a
    triangle filter widened to 1/sf when shrinking, over the inputs within reach, normalized (PyTorch's)."""
    sf = n_out / n_in
    offset = 0.5
    if align_corners:
        offset = 0.0
        if n_out > 1 and n_in > 1:
            sf = (n_out - 1) / (n_in - 1)
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        if mode == ScaleMode.NEAREST:
            w[i, int(i / sf)] = 1.0
            continue
        if mode == ScaleMode.BILINEAR and antialias:
            support = max(1.0, 1.0 / sf)
            centre = (i + offset) / sf
            lo, hi = max(int(centre - support + offset), 0), min(int(centre + support + offset), n_in)
            for j in range(lo, hi):
                w[i, j] = max(0.0, 1.0 - abs((j - centre + offset) / support))
            w[i] /= max(w[i].sum(), np.finfo(float).tiny)
            continue
        x = (i + offset) / sf - offset
        x0 = math.floor(x)
        if mode == ScaleMode.BILINEAR:
            lo, hi = min(max(x0, 0), n_in - 1), min(max(x0 + 1, 0), n_in - 1)
            dx = min(max(x - lo, 0.0), 1.0)
            w[i, lo] += 1 - dx
            w[i, hi] += dx
            continue
        t = x - x0
        a = -0.75
        for tap, d in zip(range(-1, 3), (t + 1, t, 1 - t, 2 - t), strict=True):
            d = abs(d)
            weight = ((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1 else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
            w[i, min(max(x0 + tap, 0), n_in - 1)] += weight
    return w


def _upscale(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    # word 0: the scale mode in the low byte, ALIGN_CORNERS (0x100) above it; dims 2 and 3 nearest
    mode_flags = node.get_op_params_i32(0)
    mode, align = mode_flags & 0xFF, bool(mode_flags & ScaleFlag.ALIGN_CORNERS)
    aa = bool(mode_flags & ScaleFlag.ANTIALIAS)
    a = a[[int(i * a.shape[0] / shape[0]) for i in range(shape[0])]]
    a = a[:, [int(i * a.shape[1] / shape[1]) for i in range(shape[1])]]
    wy, wx = (_resample_1d(shape[2], a.shape[2], mode, align, aa),
              _resample_1d(shape[3], a.shape[3], mode, align, aa))
    return wy @ a @ wx.T  # rows by wy, columns by wx: out[n, c, y, x] = sum_h,w wy[y, h] a[n, c, h, w] wx[x, w]


def _argsort(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    order = a.argsort(-1, kind="stable")
    return order[..., ::-1] if node.get_op_params_i32(0) == SortOrder.DESC else order


def _flash_attn_ext(node: Tensor, q: np.ndarray, k: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # softmax(softcap * tanh(q.k * scale / softcap) + slope * mask, a sink logit per head) . v; q head h reads
    # KV head h // (n_head / n_head_kv); an all -inf row gives 0; dst is permuted: [dv, n_head, n_batch, ne3]
    assert node.src[2] is not None
    v = read(node.src[2])
    scale, max_bias, softcap = (node.get_op_params_f32(i) for i in range(3))
    n_head, n_batch, n_kv = q.shape[1], q.shape[2], k.shape[2]
    x = q @ np.repeat(k, n_head // k.shape[1], axis=1).swapaxes(-1, -2) * scale
    if softcap != 0:
        x = softcap * np.tanh(x / softcap)
    if node.src[3] is not None:
        m = tile_to(read(node.src[3])[:, :, :n_batch, :n_kv], x.shape)
        if max_bias > 0:
            floor = 1 << int(math.floor(math.log2(n_head)))
            h = np.arange(n_head)
            m = m * np.where(h < floor, 2.0 ** (-max_bias / floor * (h + 1)),
                             2.0 ** (-max_bias / 2 / floor * (2 * (h - floor) + 1)))[None, :, None, None]
        x = x + m
    sinks = node.src[4]
    extra = read(sinks).reshape(-1)[:n_head][None, :, None, None] if sinks is not None else None
    top = x.max(-1, keepdims=True) if extra is None else np.maximum(x.max(-1, keepdims=True), extra)
    top = np.where(np.isneginf(top), 0.0, top)
    e = np.exp(x - top)
    total = e.sum(-1, keepdims=True) + (np.exp(extra - top) if extra is not None else 0.0)
    out = (e @ np.repeat(v, n_head // v.shape[1], axis=1)) / np.where(total == 0, np.inf, total)
    return out.swapaxes(1, 2)


def _timestep_embedding(node: Tensor, t: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    # [cos(t f_j) for j < half, sin(t f_j) for j < half, 0 if dim is odd], f_j = max_period^(-j / half)
    dim, max_period = node.get_op_params_i32(0), node.get_op_params_i32(1)
    half = dim // 2
    arg = t.reshape(-1)[:, None] * float(max_period) ** (-np.arange(half) / max(half, 1))
    return np.concatenate([np.cos(arg), np.sin(arg), np.zeros((arg.shape[0], dim % 2))], axis=1).reshape(shape)


def _tri(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    # TriType: 0 upper with the diagonal, 1 upper, 2 lower with the diagonal, 3 lower
    col, row = np.arange(shape[3])[None, :], np.arange(shape[2])[:, None]
    keep = [col >= row, col > row, col <= row, col < row][node.get_op_params_i32(0)]
    return np.where(keep, a, 0.0)


def _repeat_back(node: Tensor, a: np.ndarray, b: None, shape: tuple[int, ...]) -> np.ndarray:
    split = [s for n, m in zip(a.shape, shape, strict=True) for s in (n // m, m)]
    return a.reshape(split).sum(axis=(0, 2, 4, 6))


def _solve_tri(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.linalg.solve(np.tril(a), b)  # a X = b, a lower triangular [n, n], b [n, k]


def _conv_2d_direct(node: Tensor, k: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[n, o, y, x] = sum k[o, c, i, j] x[n, c, y s1 + i d1 - p1, x s0 + j d0 - p0], zero outside; depthwise
    # (CONV_2D_DW: k [C, 1, KH, KW]) pairs channel c with kernel c only
    s0, s1, p0, p1, d0, d1 = (node.get_op_params_i32(i) for i in range(6))
    depthwise = node.op == GGMLOp.CONV_2D_DW
    if node.src[0] is not None and node.src[0].type == GGMLType.F16 and not depthwise:
        x = x.astype(np.float16).astype(np.float64)  # ggml rounds the input to the kernel's f16
    # ggml's output size rounds toward zero: the last window's taps may reach past the padding (zeros there)
    reach = [(o - 1) * s + (kk - 1) * d + 1 for o, kk, s, d in ((shape[2], k.shape[2], s1, d1),
                                                                (shape[3], k.shape[3], s0, d0))]
    after = [max(p, r - n - p) for p, r, n in ((p1, reach[0], x.shape[2]), (p0, reach[1], x.shape[3]))]
    xp = np.pad(x, ((0, 0), (0, 0), (p1, after[0]), (p0, after[1])))
    out = np.zeros(shape)
    for i in range(k.shape[2]):
        for j in range(k.shape[3]):
            win = xp[:, :, i * d1: i * d1 + (shape[2] - 1) * s1 + 1: s1,
                     j * d0: j * d0 + (shape[3] - 1) * s0 + 1: s0]
            if depthwise:
                out += win * k[None, :, 0, i, j, None, None]
            else:
                out += np.einsum("ncyx,oc->noyx", win, k[:, :, i, j])
    return out


def _conv_transpose_2d(node: Tensor, k: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[n, o, y s + i, x s + j] += sum_c x[n, c, y, x] k[c, o, i, j]
    s = node.get_op_params_i32(0)
    if node.src[0] is not None and node.src[0].type == GGMLType.F16:
        x = x.astype(np.float16).astype(np.float64)
    out = np.zeros(shape)
    h, w = x.shape[2:]
    for i in range(k.shape[2]):
        for j in range(k.shape[3]):
            out[:, :, i: i + (h - 1) * s + 1: s, j: j + (w - 1) * s + 1: s] += np.einsum(
                "nchw,co->nohw", x, k[:, :, i, j])
    return out

def _glu(node: Tensor, a: np.ndarray, b: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    # act(x) * g; fused: x, g the halves of a's rows (swapped: g first); SWIGLU_OAI, SWIGLU_CLAMP clamp with limit
    op, swapped = node.get_op_params_i32(0), node.get_op_params_i32(1)
    alpha, limit = node.get_op_params_f32(2), node.get_op_params_f32(3)
    nc = shape[3]
    x, g = (a, b) if b is not None else (a[..., :nc], a[..., nc: 2 * nc])
    if b is None and swapped:
        x, g = g, x
    if x.size == 0:
        return np.zeros(shape)
    if op in (3, 6):  # SWIGLU_OAI, SWIGLU_CLAMP
        x, g = np.minimum(x, limit), np.clip(g, -limit, limit)
    if op in (1, 5) and node.type != BF16:  # ggml's CPU reads GEGLU, GEGLU_QUICK of f16(x) from f16 tables
        act = UNARY[UnaryOp.GELU] if op == 1 else (lambda v: v * sigmoid(1.702 * v))
        return act(x.astype(np.float16).astype(np.float64)).astype(np.float16) * g
    acts = [lambda v: np.maximum(v, 0.0), UNARY[UnaryOp.GELU], lambda v: v * sigmoid(v),
            lambda v: v * sigmoid(alpha * v), UNARY[UnaryOp.GELU_ERF], lambda v: v * sigmoid(1.702 * v),
            lambda v: v * sigmoid(v)]
    return acts[op](x) * (g + 1.0 if op == 3 else g)


def _set_rows(node: Tensor, b: np.ndarray, c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # a (src[2]) with row c[i, i2 % ne11, i3 % ne12] of plane (i2, i3) replaced by b's row i
    assert node.src[2] is not None
    out = read(node.src[2]).copy()
    idx = c.astype(np.int64)[0]
    for i3 in range(b.shape[0]):
        for i2 in range(b.shape[1]):
            out[i3, i2, idx[i3 % idx.shape[0], i2 % idx.shape[1]]] = b[i3, i2]
    return out


def _mul_mat_id(node: Tensor, w: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # out[t, e] = w[ids[t, e]] . b[t, e % ne11]
    assert node.src[2] is not None
    ids = read(node.src[2]).astype(np.int64)[0, 0]
    out = np.empty(shape)
    for t in range(ids.shape[0]):
        for e in range(ids.shape[1]):
            out[0, t, e] = w[0, ids[t, e]] @ b[0, t, e % b.shape[2]]
    return out


def _add_id(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    assert node.src[2] is not None
    return a + b[0, 0][read(node.src[2]).astype(np.int64)[0, 0]]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _rms_norm_back(node: Tensor, dz: np.ndarray, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    # d/dx of x / sqrt(mean(x^2) + eps), applied to dz
    eps, n = node.get_op_params_f32(0), x.shape[-1]
    ms = (x * x).mean(-1, keepdims=True) + eps
    return (dz - x * (x * dz).sum(-1, keepdims=True) / (n * ms)) / np.sqrt(ms)


def _get_rows_back(node: Tensor, g: np.ndarray, idx: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    np.add.at(out[0, 0], idx.reshape(-1).astype(np.int64), g[0, 0])
    return out


def _cross_entropy_loss_back(node: Tensor, grad: np.ndarray, logits: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    assert node.src[2] is not None
    rows = logits.size // logits.shape[-1]
    return (np.exp(_log_softmax(logits)) - read(node.src[2])) * grad.reshape(-1)[0] / rows


def _opt_step_adamw(node: Tensor, w: np.ndarray, g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    assert node.src[2] is not None and node.src[3] is not None and node.src[4] is not None
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = read(node.src[4]).reshape(-1)
    m = read(node.src[2]) * beta1 + g * (1 - beta1)
    v = read(node.src[3]) * beta2 + g * g * (1 - beta2)
    return w * (1 - alpha * wd) - alpha * m * beta1h / (np.sqrt(v * beta2h) + eps)


def _opt_step_sgd(node: Tensor, w: np.ndarray, g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    assert node.src[2] is not None
    alpha, wd = read(node.src[2]).reshape(-1)
    return w * (1 - alpha * wd) - alpha * g

Formula = Callable[[Tensor, np.ndarray, np.ndarray | None, tuple[int, ...]], np.ndarray]
# each op from its definition: node, src0's and src1's values (float64, numpy order), dst's shape
def _win_part(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    npx, w = node.get_op_params_i32(0), node.get_op_params_i32(2)
    out = np.zeros(shape)
    for i3, i2, i1 in np.ndindex(*shape[:3]):  # window i3 = py*npx + px, its row i2 and column i1
        y, x = (i3 // npx) * w + i2, (i3 % npx) * w + i1
        if y < a.shape[1] and x < a.shape[2]:
            out[i3, i2, i1] = a[0, y, x]
    return out


def _win_unpart(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    w = node.get_op_params_i32(0)
    npx = -(-shape[2] // w)
    out = np.zeros(shape)
    for i2, i1 in np.ndindex(*shape[1:3]):
        out[0, i2, i1] = a[(i2 // w) * npx + i1 // w, i2 % w, i1 % w]
    return out


def _get_rel_pos(node: Tensor, a: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    src = node.src[0]
    assert src is not None
    if src.type == BF16:  # ggml copies the 16-bit words: BF16's bits read as F16
        a = memory.tensor_view(src).view(np.float16).astype(np.float64)
    rows = a.reshape(-1, shape[3])
    kh = shape[2]
    out = np.zeros(shape)
    for i2, i1 in np.ndindex(*shape[1:3]):  # query i2, key i1: relative position (kh - 1 - i1) + i2
        out[0, i2, i1] = rows[kh - 1 - i1 + i2]
    return out


def _add_rel_pos(node: Tensor, a: np.ndarray, pw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    ph_t = node.src[2]
    assert ph_t is not None
    ph = read(ph_t)
    k, rows = pw.shape[3], pw.size // pw.shape[3]
    out = a.copy().reshape(-1)
    cells = out[: rows * k * k].reshape(rows, k, k)  # a view: (query, key row, key column)
    cells += ph.reshape(rows, k, 1) + pw.reshape(rows, 1, k)
    return out.reshape(shape)


def _lightning_indexer(node: Tensor, q: np.ndarray, k: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    w_t, m_t = node.src[2], node.src[3]
    assert w_t is not None and m_t is not None
    w, m = read(w_t), read(m_t)  # (S, 1, T, H), (nm, 1, T, KV)
    qk = np.maximum(np.einsum("sthd,skd->sthk", q, k[:, :, 0]), 0.0)  # ReLU of each head's q . k
    score = np.einsum("sthk,sth->stk", qk, w[:, 0])
    return (score + m[np.arange(q.shape[0]) % m.shape[0], 0]).reshape(shape)


def _dsv4_hc_comb(node: Tensor, mixes: np.ndarray, scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    base_t = node.src[2]
    assert base_t is not None
    eps, n_iter = node.get_op_params_f32(0), node.get_op_params_i32(1)
    n_t = mixes.shape[2]
    logits = mixes[0, 0, :, 8:].reshape(n_t, 4, 4) * scale.reshape(-1)[2] + read(base_t).reshape(-1)[8:].reshape(4, 4)
    e = np.exp(logits - logits.max(axis=2, keepdims=True))  # (t, src, dst): a softmax over dst
    c = e / e.sum(axis=2, keepdims=True) + eps
    c = c / (eps + c.sum(axis=1, keepdims=True))  # each dst's column over the srcs
    for _ in range(1, n_iter):  # Sinkhorn: rows, then columns
        c = c / (eps + c.sum(axis=2, keepdims=True))
        c = c / (eps + c.sum(axis=1, keepdims=True))
    return c.reshape(shape)


def _dsv4_hc_pre(node: Tensor, x: np.ndarray, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    scale, gated = node.get_op_params_f32(0), node.get_op_params_i32(1)
    weights = 1 / (1 + np.exp(-w[0])) if gated else w[0, 0, :, :, None]  # (t, h, i) or (t, h, 1)
    return (scale * (x[0] * weights).sum(axis=1)).reshape(shape)


def _dsv4_hc_post(node: Tensor, x: np.ndarray, res: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    post_t, comb_t = node.src[2], node.src[3]
    assert post_t is not None
    out = x[0, 0, :, None, :] * read(post_t)[0, 0, :, :, None]  # (t, dst, i)
    mixed = res[0] if comb_t is None else np.einsum("tsi,tsd->tdi", res[0], read(comb_t)[0])
    return (out + mixed).reshape(shape)


FORMULAS: dict[GGMLOp, Formula] = {
    GGMLOp.GLU: _glu, GGMLOp.SET_ROWS: _set_rows, GGMLOp.MUL_MAT_ID: _mul_mat_id, GGMLOp.ADD_ID: _add_id,
    GGMLOp.DUP: lambda n, a, b, shape: a.reshape(shape),  # element order kept, dst's layout and type
    GGMLOp.CONT: lambda n, a, b, shape: a.reshape(shape),
    GGMLOp.CPY: lambda n, a, b, shape: a.reshape(shape),
    GGMLOp.ADD: _binary(np.add), GGMLOp.SUB: _binary(np.subtract), GGMLOp.MUL: _binary(np.multiply),
    GGMLOp.DIV: _binary(np.divide),
    GGMLOp.ADD1: lambda n, a, b, shape: a + b.reshape(-1)[0],
    GGMLOp.ACC: _acc_set, GGMLOp.SET: _acc_set,
    GGMLOp.SQR: lambda n, a, b, shape: a * a, GGMLOp.SQRT: lambda n, a, b, shape: np.sqrt(a),
    GGMLOp.LOG: lambda n, a, b, shape: np.log(a),
    GGMLOp.SCALE: lambda n, a, b, shape: a * n.get_op_params_f32(0) + n.get_op_params_f32(1),
    GGMLOp.CLAMP: lambda n, a, b, shape: np.clip(a, n.get_op_params_f32(0), n.get_op_params_f32(1)),
    GGMLOp.LEAKY_RELU: lambda n, a, b, shape: np.where(a > 0, a, n.get_op_params_f32(0) * a),
    GGMLOp.UNARY: _unary,
    GGMLOp.SUM: lambda n, a, b, shape: np.full(shape, ggml_rows(n.src[0]).sum()),
    GGMLOp.SUM_ROWS: lambda n, a, b, shape: a.sum(-1, keepdims=True),
    GGMLOp.MEAN: lambda n, a, b, shape: ggml_rows(n.src[0]).mean(-1, keepdims=True),
    GGMLOp.ARGMAX: lambda n, a, b, shape: ggml_rows(n.src[0]).argmax(-1).reshape(shape),
    GGMLOp.ARGSORT: _argsort,
    GGMLOp.TOP_K: lambda n, a, b, shape: a.argsort(-1, kind="stable")[..., ::-1][..., : shape[-1]],
    GGMLOp.REPEAT: lambda n, a, b, shape: tile_to(a, shape),
    GGMLOp.CONCAT: lambda n, a, b, shape: np.concatenate([a, b], axis=3 - n.get_op_params_i32(0)),
    GGMLOp.PAD: _pad, GGMLOp.DIAG: _diag, GGMLOp.UPSCALE: _upscale,
    GGMLOp.NORM: lambda n, a, b, shape: normalize(a, n.get_op_params_f32(0)),
    GGMLOp.RMS_NORM: lambda n, a, b, shape: normalize(a, n.get_op_params_f32(0), center=False),
    GGMLOp.GROUP_NORM: _group_norm,
    GGMLOp.SOFT_MAX: _soft_max, GGMLOp.DIAG_MASK_INF: _diag_mask, GGMLOp.DIAG_MASK_ZERO: _diag_mask,
    GGMLOp.ROPE: _rope, GGMLOp.ROPE_BACK: _rope,
    GGMLOp.WIN_PART: _win_part, GGMLOp.WIN_UNPART: _win_unpart, GGMLOp.GET_REL_POS: _get_rel_pos,
    GGMLOp.ADD_REL_POS: _add_rel_pos, GGMLOp.LIGHTNING_INDEXER: _lightning_indexer,
    GGMLOp.DSV4_HC_COMB: _dsv4_hc_comb, GGMLOp.DSV4_HC_PRE: _dsv4_hc_pre, GGMLOp.DSV4_HC_POST: _dsv4_hc_post,
    GGMLOp.MUL_MAT: _mul_mat,
    # out[n, m] = sum_k b[k, n] a[k, m]; a's matrix i2 // (ne12 / ne02), i3 // (ne13 / ne03) for b's (i2, i3)
    GGMLOp.OUT_PROD: lambda n, a, b, shape: np.swapaxes(b, -1, -2) @ np.repeat(
        np.repeat(a, b.shape[0] // a.shape[0], axis=0), b.shape[1] // a.shape[1], axis=1),
    GGMLOp.GET_ROWS: _get_rows,
    GGMLOp.IM2COL: _im2col, GGMLOp.CONV_TRANSPOSE_1D: _conv_transpose_1d,
    GGMLOp.POOL_1D: _pool_1d, GGMLOp.POOL_2D: _pool_2d,
    GGMLOp.MAP_CUSTOM1: _custom, GGMLOp.MAP_CUSTOM2: _custom, GGMLOp.MAP_CUSTOM3: _custom, GGMLOp.CUSTOM: _custom,
    GGMLOp.FLASH_ATTN_EXT: _flash_attn_ext,
    GGMLOp.SIN: lambda n, a, b, shape: np.sin(a), GGMLOp.COS: lambda n, a, b, shape: np.cos(a),
    GGMLOp.FILL: lambda n, a, b, shape: np.full(shape, n.get_op_params_f32(0)),
    GGMLOp.ARANGE: lambda n, a, b, shape: n.get_op_params_f32(0) + n.get_op_params_f32(2) * np.arange(shape[3]),
    GGMLOp.TIMESTEP_EMBEDDING: _timestep_embedding, GGMLOp.TRI: _tri,
    GGMLOp.CUMSUM: lambda n, a, b, shape: np.cumsum(a, axis=-1),
    GGMLOp.COUNT_EQUAL: lambda n, a, b, shape: np.full(shape, np.count_nonzero(a == b)),
    GGMLOp.L2_NORM: lambda n, a, b, shape: a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True),
                                                          n.get_op_params_f32(0)),
    GGMLOp.ROLL: lambda n, a, b, shape: np.roll(a, [n.get_op_params_i32(3 - i) for i in range(4)], (0, 1, 2, 3)),
    GGMLOp.PAD_REFLECT_1D: lambda n, a, b, shape: np.pad(
        a, [(0, 0)] * 3 + [(n.get_op_params_i32(0), n.get_op_params_i32(1))], mode="reflect"),
    GGMLOp.REPEAT_BACK: _repeat_back, GGMLOp.SOLVE_TRI: _solve_tri,
    GGMLOp.CONV_2D: _conv_2d_direct, GGMLOp.CONV_2D_DW: _conv_2d_direct,
    GGMLOp.CONV_TRANSPOSE_2D: _conv_transpose_2d,
    GGMLOp.SILU_BACK: lambda n, dy, x, shape: dy * (1 + x * (1 - 1 / (1 + np.exp(-x)))) / (1 + np.exp(-x)),
    GGMLOp.RMS_NORM_BACK: _rms_norm_back,
    GGMLOp.SOFT_MAX_BACK: lambda n, dy, y, shape: n.get_op_params_f32(0) * y * (dy - (y * dy).sum(-1, keepdims=True)),
    GGMLOp.GET_ROWS_BACK: _get_rows_back,
    GGMLOp.CROSS_ENTROPY_LOSS: lambda n, a, b, shape: np.full(shape, -(_log_softmax(a) * b).sum()
                                                              / (a.size // a.shape[-1])),
    GGMLOp.CROSS_ENTROPY_LOSS_BACK: _cross_entropy_loss_back,
    GGMLOp.OPT_STEP_ADAMW: _opt_step_adamw, GGMLOp.OPT_STEP_SGD: _opt_step_sgd,
}
FORMULAS.update(CONV_BACK_FORMULAS)

FORMULAS.update(SSM_FORMULAS)  # tests/backend/ssm_formulas.py


class NumpyBackend(CPUBackend):
    """CPU memory, numpy compute: each node from FORMULAS, none of the CPU backend's kernels."""

    def _get_name(self) -> str:
        return "numpy"

    def _supports_op(self, op: Tensor) -> bool:
        if op.op == GGMLOp.NONE or is_view_op(op.op):
            return True
        if TYPE_TRAITS[op.type].is_quantized and op.type not in GGUF_QUANTIZE:
            return False  # gguf has no quantizer for the K-quants
        if any(s is not None and s.type in GGUF_UNREADABLE for s in op.src):
            return False
        return op.op in FORMULAS

    def _graph_compute(self, graph: Graph) -> None:
        for node in graph.nodes:
            if node.op == GGMLOp.NONE or is_view_op(node.op):
                continue
            a, b = (read(s) if s is not None else None for s in node.src[:2])
            write(node, FORMULAS[node.op](node, a, b, tuple(node.ne[::-1])))


@pytest.fixture
def fake_backends() -> object:
    register_backend("wrong", lambda: WrongBackend())
    register_backend("nothing", lambda: NothingBackend())
    register_backend("numpy", lambda: NumpyBackend())
    yield
    unregister_backend("wrong")
    unregister_backend("nothing")
    unregister_backend("numpy")


def table_lines(text: str, label: str) -> list[str]:
    """The table's lines of the op `label` (not its line in the summary by op, which follows the table)."""
    table = text.split("PASSED  FAILED")[0]
    return [line for line in table.splitlines() if line.strip().startswith(label + " ")]


def summary_line(text: str, label: str) -> list[int]:
    """The summary's counts for the op `label`: cases, passed, failed, not supported."""
    summary = text.split("PASSED  FAILED")[1]
    (line,) = [line for line in summary.splitlines() if line.strip().startswith(label + " ")]
    return [int(n) for n in line.split()[1:]]


def test_cases_cover_every_op_of_the_core() -> None:
    labels = {c.label for c in op_check.all_cases()}
    assert set(CORE_OPS) <= labels, sorted(set(CORE_OPS) - labels)
    descs = [c.desc for c in op_check.all_cases()]
    assert any("permuted" in d for d in descs) and any("transposed" in d for d in descs)
    assert any("nr=[2,2,2,2]" in d for d in descs)  # broadcast


def test_add_on_cpu_matches_numpy(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "numpy", "-o", "ADD"]) == 0
    out = capsys.readouterr().out
    assert "Testing backend numpy against CPU" in out
    lines = table_lines(out, "ADD")
    assert len(lines) >= 20
    assert all(line.endswith("OK") for line in lines), [x for x in lines if not x.endswith("OK")]
    assert "0 failed, 0 not supported" in out
    assert summary_line(out, "ADD") == [len(lines), len(lines), 0, 0]


def test_wrong_results_fail_and_exit_non_zero(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "wrong", "-o", "MUL"]) == 1
    out = capsys.readouterr().out
    lines = table_lines(out, "MUL")
    assert lines and all("FAIL" in line and "NMSE" in line for line in lines)
    assert "Testing backend Wrong against CPU" in out


def test_unsupported_ops_are_listed_not_failed(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "nothing", "-o", "SCALE"]) == 0
    lines = table_lines(capsys.readouterr().out, "SCALE")
    assert lines and all(line.endswith("not supported") for line in lines)


def test_against_ggml_without_a_compiler_or_a_build(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`--against ggml` needs libggml: no compiler is exit 3 with a clear line, a failed build exit 1."""
    from pyggml.testing.llamacpp import BuildError, NoCompilerError

    def no_compiler(against: str) -> object:
        raise NoCompilerError("no C compiler (cc, gcc, clang) found")

    monkeypatch.setattr(op_check, "reference_backend", no_compiler)
    assert main(["test-ops", "--against", "ggml", "-o", "ADD"]) == 3
    err = capsys.readouterr().err
    assert "--against ggml needs real ggml" in err and "no C compiler" in err

    def build_fails(against: str) -> object:
        raise BuildError("cmake failed")

    monkeypatch.setattr(op_check, "reference_backend", build_fails)
    assert main(["test-ops", "--against", "ggml", "-o", "ADD"]) == 1
    assert "real ggml is not available: cmake failed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["test-ops", "--against", "cuda"])
    assert e.value.code == 2


def test_reference_cases_of_ggml_limits_are_not_supported() -> None:
    """The cases ggml cannot be trusted with are few, each has a reason, and each is a case of the table."""
    keys = {(c.label, c.desc) for c in op_check.all_cases()}
    assert set(op_check.GGML_LIMITS) <= keys
    assert 0 < len(op_check.GGML_LIMITS) <= 10 and all(op_check.GGML_LIMITS.values())
    from pyggml.backends.cpu import cpu_init

    case = next(c for c in op_check.all_cases() if (c.label, c.desc) in op_check.GGML_LIMITS)
    r = run_case(case, cpu_init(), cpu_init(), op_check.GGML_LIMITS)
    assert r.status == "not supported" and op_check.GGML_LIMITS[case.label, case.desc] in r.detail


def test_unknown_backend_and_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test-ops", "-b", "vulkan"]) == 2
    assert "no backend named 'vulkan'" in capsys.readouterr().err
    assert main(["test-ops", "-o", "NO_SUCH_OP"]) == 1
    assert "no test case for op 'NO_SUCH_OP'" in capsys.readouterr().out


def test_a_missing_builder_is_not_supported_and_a_broken_one_fails() -> None:
    from pyggml.backends.cpu import cpu_init

    missing = OpCase("X", "missing", lambda ctx: op(ctx, "no_such_builder")(new(ctx, "a", GGMLType.F32, [4])))
    r = run_case(missing, cpu_init(), cpu_init())
    assert r.status == "not supported" and "no_such_builder" in r.detail

    def broken(ctx: object) -> Tensor:
        raise ValueError("bad shape rule")

    r = run_case(OpCase("X", "broken", broken), cpu_init(), cpu_init())  # type: ignore[arg-type]
    assert r.status == "FAIL" and "bad shape rule" in r.detail


def test_compare_follows_ggml() -> None:
    a = np.array([1.0, 2.0, -3.0])
    assert compare(a, a) == (0.0, "")
    nmse, why = compare(a, np.array([1.0, 2.0, -3.3]))
    assert why == "" and nmse == pytest.approx(0.09 / 14)
    assert compare(a, np.array([1.0, np.nan, 0.0]))[1].startswith("NaN at index 1")
    inf = np.array([1.0, -np.inf, 2.0])
    assert compare(inf, inf.copy()) == (0.0, "")  # same infinities: left out
    assert "inf mismatch at index 1" in compare(inf, np.array([1.0, np.inf, 2.0]))[1]
    assert "inf mismatch" in compare(inf, np.array([1.0, 5.0, 2.0]))[1]
    assert compare(np.zeros(3), np.zeros(3)) == (0.0, "")
    assert MAX_NMSE == 1e-7 and op_check.MAX_NMSE_MUL_MAT == 5e-4 and op_check.MAX_NMSE_ROPE == 1e-3


@pytest.mark.slow
def test_the_whole_table_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """Against itself the CPU can only fail by raising, by NaN or by differing run to run: every case
    builds and computes (its values are checked against numpy below)."""
    assert main(["test-ops", "-b", "cpu"]) == 0
    out = capsys.readouterr().out
    n = len(op_check.all_cases())
    assert f"{n}/{n} passed, 0 failed, 0 not supported" in out


# how close the CPU comes to numpy's float64 (seen: 3e-5 for products with quantized operands, whose
# activations ggml rounds to 8 bits; below 5e-9 for every other op): tighter than ggml's verdicts
# of 5e-4 (MUL_MAT) and 1e-3 (ROPE), which a wrong rotation or a missing term can pass
# FLASH_ATTN_EXT: q rounded to K's vec_dot_type (as MUL_MAT_ID rounds src1)
ORACLE_NMSE = {"MUL_MAT": 1e-4, "MUL_MAT_ID": 1e-4, "FLASH_ATTN_EXT": 1e-4}


@pytest.mark.slow
def test_the_whole_table_matches_numpy(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "numpy"]) == 0
    out = capsys.readouterr().out
    cases = op_check.all_cases()
    width = max(len(c.desc) for c in cases)  # the table's CASE column
    lines = out.splitlines()
    results = {}
    for c in cases:
        head = f"  {c.label:<18} {c.desc:<{width}}  "
        found = [line for line in lines if line.startswith(head)]
        assert len(found) == 1, (c.label, c.desc, found)
        results[c.label, c.desc] = found[0]
    ok = {k: line for k, line in results.items() if line.endswith("OK")}
    skipped = sorted(k for k, line in results.items() if line.endswith("not supported"))
    # numpy computes every case but the copies and SET_ROWS into the quantized types gguf cannot write, and the
    # cases reading the types gguf cannot read
    def unwritable(desc: str) -> bool:
        dst = desc.lower().split("type_dst=" if "type_dst=" in desc else "type=")[1].split(",")[0]  # SET_ROWS: type=
        t = GGMLType[dst.upper()]
        return TYPE_TRAITS[t].is_quantized and t not in GGUF_QUANTIZE

    def unreadable(desc: str) -> bool:
        fields = dict(f.split("=", 1) for f in desc.split(",") if "=" in f)
        names = {t.name for t in GGUF_UNREADABLE}
        return any(fields.get(k, "").upper() in names for k in ("type", "type_a", "type_src"))

    assert skipped == sorted(k for k in results if (k[0] in ("CPY", "SET_ROWS") and unwritable(k[1]))
                             or unreadable(k[1]))
    assert len(ok) + len(skipped) == len(results)
    for (label, desc), line in ok.items():
        nmse = float(line.split()[-2])
        assert nmse <= ORACLE_NMSE.get(label, 1e-7), (label, desc, nmse)


def corrupt(dst: np.ndarray) -> None:
    """What a wrong kernel leaves: values 5% off (a wrong scale), indices or quantized bytes one off."""
    if np.issubdtype(dst.dtype, np.floating):
        dst[...] = dst * 1.05 + 0.01
    else:
        dst[...] += 1  # I32 indices; the bytes of quantized blocks (scales and quants)


@pytest.mark.parametrize("ggml_op, label", [
    (GGMLOp.ADD, "ADD"), (GGMLOp.MUL_MAT, "MUL_MAT"), (GGMLOp.SOFT_MAX, "SOFT_MAX"), (GGMLOp.RMS_NORM, "RMS_NORM"),
    (GGMLOp.ROPE, "ROPE"), (GGMLOp.GET_ROWS, "GET_ROWS"), (GGMLOp.UNARY, "GELU"), (GGMLOp.CPY, "CPY"),
    (GGMLOp.ARGSORT, "ARGSORT"), (GGMLOp.IM2COL, "IM2COL"), (GGMLOp.CONCAT, "CONCAT"), (GGMLOp.PAD, "PAD"),
    (GGMLOp.UPSCALE, "UPSCALE"), (GGMLOp.TOP_K, "TOP_K"),
])
@pytest.mark.slow
def test_a_wrong_cpu_kernel_fails_against_numpy(ggml_op: GGMLOp, label: str, capsys: pytest.CaptureFixture[str],
                                                 fake_backends: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Break one CPU kernel: every case of its op that numpy computes fails, and the command exits 1."""
    kernel = KERNELS[ggml_op]

    @functools.wraps(kernel)  # keeps __module__: the CPU still asks the kernel's module what it supports
    def wrong(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: object) -> Callable[[], None]:
        compute = kernel(node, dst, srcs, params)

        def run() -> None:
            compute()
            corrupt(dst)

        return run

    monkeypatch.setitem(KERNELS, ggml_op, wrong)
    assert main(["test-ops", "-b", "numpy", "-o", label]) == 1
    lines = table_lines(capsys.readouterr().out, label)
    compared = [line for line in lines if not line.endswith("not supported")]
    assert len(compared) >= 1 and all(" FAIL " in line for line in compared), lines



def test_parameters_get_the_case_values_too() -> None:
    """A PARAM tensor is one of the graph's nodes (op NONE), as in ggml, not a leaf: the optimizer steps update it
    in place, so the case's values must go into it as into the leafs (else it holds the buffer's old bytes, which
    only zeroed host memory made look right)."""
    from pyggml.core.context import Context

    case = next(c for c in op_check.all_cases() if c.label == "OPT_STEP_ADAMW")
    g, _ = op_check._graph_of(case, Context(mem_size=1 << 22, no_alloc=True))
    params = [n for n in g.nodes if n.op == GGMLOp.NONE]
    assert params and all(p not in g.leafs for p in params)
    inputs = op_check._inputs(g)
    assert all(p in inputs for p in params) and all(leaf in inputs for leaf in g.leafs)
