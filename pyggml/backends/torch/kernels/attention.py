"""Torch kernel: FLASH_ATTN_EXT (ggml_compute_forward_flash_attn_ext), every head's scores as one product.

q [D, n_q, n_head, ne3] over k [D, n_kv, n_head_kv, ne3] and v [Dv, n_kv, n_head_kv, ne3] (GQA: q head h
reads kv head h / (n_head / n_head_kv)); dst [Dv, n_head, n_q, ne3] F32. As ggml-cpu (and the CPU kernel,
pyggml.backends.cpu.kernels.attention):
- q is rounded to K's vec_dot type first (F16 for F16 K, BF16 for BF16 K, Q8_0/Q8_1 for the quantized K taken:
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL); K and V are read as f32 (quantized rows dequantized on every compute:
  the cache changes between computes; see `quants` for where).
- scale is divided by logit_softcap (when not 0) and the scores become softcap * tanh(s * scale).
- the mask (F16, rows for q's rows, tiled over heads and ne3) times the head's ALiBi slope is added.
- sinks (src[4], F32 per head): one more logit per row with no value; a row of -inf only (no sinks) gives 0.
Accumulation is f32 (ggml's f16 V accumulator is not reproduced: within test-backend-ops' 5e-4).
"""

from __future__ import annotations

import torch

from pyggml.backends.torch.kernels import Compute, Kernel, PlanContext, noop
from pyggml.backends.torch.kernels._common import BF16, F16, F32, Problem, raise_problem, softmax_rows
from pyggml.backends.torch.kernels.quants import DEQUANT_TYPES, dequantize
from pyggml.backends.torch.kernels.set_rows import quantize_q8_0
from pyggml.core.errors import GGMLError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import FlashAttnExtParams
from pyggml.core.rope import alibi_slopes
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

# quantized K and V whose q goes through Q8_0 or Q8_1 (the same values): the legacy blocks and IQ4_NL
Q8_KV_TYPES = tuple(t for t in DEQUANT_TYPES if TYPE_TRAITS[t].vec_dot_type in (GGMLType.Q8_0, GGMLType.Q8_1))
KV_TYPES = (F32, F16, BF16, *Q8_KV_TYPES)


def flash_attn_problem(node: Tensor) -> Problem:
    """Why this kernel cannot compute the FLASH_ATTN_EXT node (error class and reason), or None."""
    q, k, v, mask, sinks = node.src[0], node.src[1], node.src[2], node.src[3], node.src[4]
    if q is None or k is None or v is None:
        return ShapeError, "needs q, k and v"
    try:
        p = FlashAttnExtParams.of(node)
    except GGMLError as e:
        return type(e), str(e)
    if p.prec not in (Prec.DEFAULT, Prec.F32):
        return UnsupportedTypeError, f"precision {p.prec.name}"
    if q.type != F32 or node.type != F32 or k.type not in KV_TYPES or v.type not in KV_TYPES:
        return UnsupportedTypeError, (f"q {q.type.name}, k {k.type.name}, v {v.type.name} -> {node.type.name} "
                                      f"(takes F32 q and dst, {'/'.join(t.name for t in KV_TYPES)} k and v)")
    if (mask is not None and mask.type != F16) or (sinks is not None and sinks.type != F32):
        return UnsupportedTypeError, "the mask must be F16 and the sinks F32"
    nh = q.ne[2]
    if (k.ne[0] != q.ne[0] or v.ne[1] != k.ne[1] or k.ne[2] == 0 or v.ne[2] != k.ne[2] or nh % k.ne[2]
            or q.ne[3] != k.ne[3] or v.ne[3] != k.ne[3] or node.ne != [v.ne[0], nh, q.ne[1], q.ne[3]]):
        return ShapeError, f"q ne {q.ne}, k ne {k.ne}, v ne {v.ne}, dst ne {node.ne} do not fit"
    if mask is not None and (mask.ne[0] < k.ne[1] or mask.ne[1] < q.ne[1] or mask.ne[2] == 0 or mask.ne[3] == 0
                             or nh % mask.ne[2] or q.ne[3] % mask.ne[3]):
        return ShapeError, f"mask ne {mask.ne} does not fit q ne {q.ne}, k ne {k.ne}"
    if sinks is not None and sinks.nelements() < nh:
        return ShapeError, f"{sinks.nelements()} sinks for {nh} heads"
    return None


def _rounded_q(q: torch.Tensor, ktype: GGMLType) -> torch.Tensor:
    """q as ggml's q_to_vec_dot makes it for K of `ktype`, in f32."""
    if ktype == F16:
        return q.to(torch.float16).to(torch.float32)
    if ktype == BF16:
        return q.to(torch.bfloat16).to(torch.float32)
    if ktype in Q8_KV_TYPES:
        return dequantize(GGMLType.Q8_0, quantize_q8_0(q))
    return q


def _as_f32(t: torch.Tensor, type: GGMLType) -> torch.Tensor:
    return dequantize(type, t) if type in Q8_KV_TYPES else t.to(torch.float32)


def flash_attn_ext_kernel(node: Tensor, pc: PlanContext) -> Compute:
    raise_problem(node, flash_attn_problem(node))
    q_t, k_t, v_t, mask_t, sinks_t = node.src[0], node.src[1], node.src[2], node.src[3], node.src[4]
    assert q_t is not None and k_t is not None and v_t is not None
    p = FlashAttnExtParams.of(node)
    d, q, k, v = pc.view(node), pc.view(q_t), pc.view(k_t), pc.view(v_t)
    if d.numel() == 0:
        return noop
    ne3, nh, nq, _ = q.shape
    nkv, group = k_t.ne[1], nh // k_t.ne[2]
    scale, softcap = p.scale, p.logit_softcap
    if softcap != 0.0:
        scale /= softcap
    mask = None
    tile = (1, 1, 1, 1)
    if mask_t is not None:
        m = pc.view(mask_t)
        mask = m[:, :, :nq, :nkv]  # a view: read at compute time
        tile = (ne3 // m.shape[0], nh // m.shape[1], 1, 1)
    slopes = None
    if p.max_bias > 0.0:
        slopes = torch.from_numpy(alibi_slopes(nh, p.max_bias)).to(q.device).view(1, nh, 1, 1)
    sinks = None if sinks_t is None else pc.view(sinks_t).reshape(-1)[:nh].view(1, nh, 1, 1)
    ktype, vtype = k_t.type, v_t.type

    def run() -> None:
        qf = _rounded_q(q.to(torch.float32), ktype)
        kf, vf = _as_f32(k, ktype), _as_f32(v, vtype)
        if group > 1:
            kf, vf = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
        s = torch.matmul(qf, kf.transpose(-1, -2)).mul_(scale)
        if softcap != 0.0:
            s = torch.tanh(s).mul_(softcap)
        if mask is not None:
            mf = mask.to(torch.float32)
            if tile != (1, 1, 1, 1):
                mf = mf.repeat(*tile)
            s = s + (mf * slopes if slopes is not None else mf)
        w = softmax_rows(s, sinks)
        d.copy_(torch.matmul(w, vf).transpose(1, 2))

    return run


KERNELS: dict[GGMLOp, Kernel] = {GGMLOp.FLASH_ATTN_EXT: flash_attn_ext_kernel}


def supports(node: Tensor) -> bool:
    return node.op == GGMLOp.FLASH_ATTN_EXT and flash_attn_problem(node) is None
