"""CPU kernels of the training ops: SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK, GET_ROWS_BACK, CROSS_ENTROPY_LOSS,
CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW, OPT_STEP_SGD.

Types as ggml-cpu's ops.cpp takes them: F32 throughout, F16 too for SILU_BACK (all operands) and for
GET_ROWS_BACK's gradient rows; SOFT_MAX_BACK only without ALiBi (max_bias 0), as ggml's supports_op.
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.cpu.kernels import Compute, ComputeParams, Kernel
from pyggml.backends.cpu.kernels._common import F32, FLOAT_TYPES, noop, require_types
from pyggml.core.errors import ArgumentError, ShapeError
from pyggml.core.ops.params import NormParams, SoftMaxParams
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType

_F32_ONLY = (GGMLType.F32,)


def _ne(a: np.ndarray) -> list[int]:
    return list(a.shape[::-1])


def _same_shape(node: Tensor, dst: np.ndarray, *arrays: np.ndarray | None) -> list[np.ndarray]:
    out = []
    for a in arrays:
        assert a is not None
        if a.shape != dst.shape:
            raise ShapeError(f"CPU {node.op.name} '{node.name}': a source of ne {_ne(a)} for dst ne {_ne(dst)}")
        out.append(a)
    return out


def silu_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """dst = dy * s * (1 + x (1 - s)), s = sigmoid(x); dy = src0, x = src1."""
    require_types(node, FLOAT_TYPES, node, node.src[0], node.src[1])
    dy, x = _same_shape(node, dst, srcs[0], srcs[1])
    if dst.size == 0:
        return noop
    one = np.float32(1.0)

    def run() -> None:
        xf = x.astype(F32)
        s = one / (one + np.exp(-xf))
        np.copyto(dst, dy.astype(F32) * s * (one + xf * (one - s)), casting="unsafe")

    return run


def rms_norm_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                         params: ComputeParams) -> Compute:
    """dx = (dz - x * sum(x dz) / (sum(x x) + eps n)) / sqrt(mean(x x) + eps), per row; dz = src0, x = src1."""
    require_types(node, _F32_ONLY, node, node.src[0], node.src[1])
    dz, x = _same_shape(node, dst, srcs[0], srcs[1])
    eps = np.float32(NormParams.of(node).eps)
    if dst.size == 0:
        return noop
    n = x.shape[3]

    def run() -> None:
        # ggml sums in double (ggml_float) over float products
        sum_xx = np.sum(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=np.float64).astype(F32)
        sum_xdz = np.sum(np.multiply(x, dz, dtype=F32), axis=-1, keepdims=True, dtype=np.float64).astype(F32)
        rrms = np.float32(1.0) / np.sqrt(sum_xx / np.float32(n) + eps)
        scale_x = -sum_xdz / (sum_xx + eps * np.float32(n))
        # dz + x * scale_x rounded once, as the fused multiply-add C compiles it to (it cancels when n is small)
        fused = (dz.astype(np.float64) + x.astype(np.float64) * scale_x.astype(np.float64)).astype(F32)
        np.multiply(fused, rrms, out=dst)

    return run


def soft_max_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                         params: ComputeParams) -> Compute:
    """dx = scale * y * (dy - dot(y, dy)) per row; dy = src0, y = src1 (soft_max's output)."""
    require_types(node, _F32_ONLY, node, node.src[0], node.src[1])
    dy, y = _same_shape(node, dst, srcs[0], srcs[1])
    p = SoftMaxParams.of(node)
    if p.max_bias != 0.0:
        raise ArgumentError(f"CPU SOFT_MAX_BACK '{node.name}': max_bias={p.max_bias}: ALiBi has no backward here")
    scale = np.float32(p.scale)
    if dst.size == 0:
        return noop

    def run() -> None:
        dot = np.sum(np.multiply(y, dy, dtype=F32), axis=-1, keepdims=True, dtype=F32)
        np.multiply((dy - dot) * y, scale, out=dst)

    return run


def get_rows_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                         params: ComputeParams) -> Compute:
    """dst = 0, then dst[r_i] += src0[i] for each index r_i of src1 (repeated rows add up)."""
    require_types(node, FLOAT_TYPES, node.src[0])
    require_types(node, _F32_ONLY, node)
    require_types(node, (GGMLType.I32,), node.src[1])
    g, idx = srcs[0], srcs[1]
    assert g is not None and idx is not None
    if g.shape[:2] != (1, 1) or dst.shape[:2] != (1, 1):
        raise ShapeError(f"CPU GET_ROWS_BACK '{node.name}': rows ne {_ne(g)} and dst ne {_ne(dst)} must be matrices")
    rows = g[0, 0]
    out = dst[0, 0]
    ids = idx.reshape(-1)
    if rows.shape[1] != out.shape[1] or rows.shape[0] < ids.size:
        raise ShapeError(f"CPU GET_ROWS_BACK '{node.name}': rows ne {_ne(g)}, indices ne {_ne(idx)}, "
                         f"dst ne {_ne(dst)}")

    def run() -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= out.shape[0]):
            raise ShapeError(f"CPU GET_ROWS_BACK '{node.name}': an index is outside [0, {out.shape[0]})")
        out.fill(0.0)
        np.add.at(out, ids, rows[: ids.size].astype(F32))

    return run


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True, dtype=np.float64)).astype(F32)


def cross_entropy_loss_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                              params: ComputeParams) -> Compute:
    """dst[0] = -sum over rows of sum(labels * log_softmax(logits)) / rows; logits = src0, labels = src1."""
    require_types(node, _F32_ONLY, node, node.src[0], node.src[1])
    a, b = srcs[0], srcs[1]
    assert a is not None and b is not None
    if a.shape != b.shape or dst.size != 1 or (a.shape[3] == 0 and 0 not in a.shape[:3]):
        raise ShapeError(f"CPU CROSS_ENTROPY_LOSS '{node.name}': src0 ne {_ne(a)}, src1 ne {_ne(b)}, "
                         f"dst ne {_ne(dst)} (rows of at least one logit)")
    nr = a.size // a.shape[3] if a.size else 0
    d = dst.reshape(())

    def run() -> None:
        total = np.sum(_log_softmax(a.astype(F32)) * b, dtype=np.float64)
        d[()] = np.float32(total) * (np.float32(-1.0) / np.float32(nr))

    return run


def cross_entropy_loss_back_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                                   params: ComputeParams) -> Compute:
    """dst = (softmax(logits) - labels) * grad / rows; grad = src0 (a scalar), logits = src1, labels = src2."""
    require_types(node, _F32_ONLY, node, node.src[0], node.src[1], node.src[2])
    grad = srcs[0]
    assert grad is not None
    logits, labels = _same_shape(node, dst, srcs[1], srcs[2])
    if grad.size != 1:
        raise ShapeError(f"CPU CROSS_ENTROPY_LOSS_BACK '{node.name}': the gradient must be a scalar, has ne "
                         f"{_ne(grad)}")
    if dst.size == 0:
        return noop
    nr = dst.size // dst.shape[3]
    g = grad.reshape(-1)

    def run() -> None:
        e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
        sm = e * (np.float32(1.0) / np.sum(e, axis=-1, keepdims=True, dtype=np.float64)).astype(F32)
        np.multiply(sm - labels, g[0] / np.float32(nr), out=dst)

    return run


def opt_step_adamw_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                          params: ComputeParams) -> Compute:
    """AdamW in place: m = m b1 + g (1 - b1), v = v b2 + g^2 (1 - b2), w = w (1 - alpha wd) - alpha (m b1h) /
    (sqrt(v b2h) + eps); the 7 params alpha, b1, b2, eps, wd, b1h, b2h from src4."""
    require_types(node, _F32_ONLY, node, *node.src[:5])
    w, g, m, v = _same_shape(node, dst, *srcs[:4])
    hp = srcs[4]
    assert hp is not None
    if hp.size != 7:
        raise ShapeError(f"CPU OPT_STEP_ADAMW '{node.name}': adamw_params has {hp.size} values, not 7")
    h = hp.reshape(-1)
    one = np.float32(1.0)

    def run() -> None:
        alpha, beta1, beta2, eps, wd, beta1h, beta2h = (np.float32(x) for x in h)
        m[...] = m * beta1 + g * (one - beta1)
        v[...] = v * beta2 + g * g * (one - beta2)
        mh = m * beta1h
        vh = np.sqrt(v * beta2h) + eps
        np.copyto(dst, w * (one - alpha * wd) - alpha * mh / vh)

    return run


def opt_step_sgd_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None],
                        params: ComputeParams) -> Compute:
    """SGD in place: w = w (1 - alpha wd) - alpha g; alpha and wd from src2."""
    require_types(node, _F32_ONLY, node, *node.src[:3])
    w, g = _same_shape(node, dst, *srcs[:2])
    hp = srcs[2]
    assert hp is not None
    if hp.size != 2:
        raise ShapeError(f"CPU OPT_STEP_SGD '{node.name}': params has {hp.size} values, not 2")
    h = hp.reshape(-1)
    one = np.float32(1.0)

    def run() -> None:
        alpha, wd = np.float32(h[0]), np.float32(h[1])
        np.copyto(dst, w * (one - alpha * wd) - alpha * g)

    return run


KERNELS: dict[GGMLOp, Kernel] = {
    GGMLOp.SILU_BACK: silu_back_kernel,
    GGMLOp.RMS_NORM_BACK: rms_norm_back_kernel,
    GGMLOp.SOFT_MAX_BACK: soft_max_back_kernel,
    GGMLOp.GET_ROWS_BACK: get_rows_back_kernel,
    GGMLOp.CROSS_ENTROPY_LOSS: cross_entropy_loss_kernel,
    GGMLOp.CROSS_ENTROPY_LOSS_BACK: cross_entropy_loss_back_kernel,
    GGMLOp.OPT_STEP_ADAMW: opt_step_adamw_kernel,
    GGMLOp.OPT_STEP_SGD: opt_step_sgd_kernel,
}


def supports(node: Tensor) -> bool:
    """Whether these kernels compute `node`: its operands' types as ggml's CPU takes them."""
    if node.op not in KERNELS:
        return False
    srcs = [s for s in node.src if s is not None]
    if node.op == GGMLOp.SILU_BACK:
        types = {node.type, *(s.type for s in srcs)}
        return types <= {GGMLType.F32} or types <= {GGMLType.F16}
    if node.op == GGMLOp.GET_ROWS_BACK:
        return srcs[0].type in FLOAT_TYPES and srcs[1].type == GGMLType.I32 and node.type == GGMLType.F32
    if node.op == GGMLOp.SOFT_MAX_BACK and SoftMaxParams.of(node).max_bias != 0.0:
        return False
    return node.type == GGMLType.F32 and all(s.type == GGMLType.F32 for s in srcs)
