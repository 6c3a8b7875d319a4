"""Fused attention: FLASH_ATTN_EXT (ggml_flash_attn_ext) and its setters.

    q:     [n_embd_k, n_batch, n_head,    ne3 ]
    k:     [n_embd_k, n_kv,    n_head_kv, ne3 ]
    v:     [n_embd_v, n_kv,    n_head_kv, ne3 ]   (not transposed)
    mask:  [n_kv,     n_batch, ne32,      ne33]   (F16, optional)
    sinks: [n_head]                               (F32, optional, ggml_flash_attn_ext_add_sinks)
    res:   [n_embd_v, n_head,  n_batch,   ne3 ]   (F32, permuted: heads before tokens)

result = softmax(softcap(q·k * scale) + slope * mask) · v per head, GQA by n_head % n_head_kv == 0 (and the mask
by n_head % ne32 == 0, ne3 % ne33 == 0). op_params (FlashAttnExtParams): [scale, max_bias, logit_softcap] as
f32, prec (word 3), n_kv_max (word 4). srcs: q, k, v, mask, sinks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pyggml.core.checks import check_real
from pyggml.core.ops._build import as_enum, require, require_arg, set_op
from pyggml.core.ops.params import FlashAttnExtParams
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import GGMLType

if TYPE_CHECKING:
    from pyggml.core.context import Context


def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
    """ggml_flash_attn_ext: attention of q over k, v in one op (see the module doc for the shapes)."""
    fn = "flash_attn_ext"
    scale = check_real(scale, f"{fn}: scale", finite=True)
    max_bias = check_real(max_bias, f"{fn}: max_bias", finite=True)
    logit_softcap = check_real(logit_softcap, f"{fn}: logit_softcap", finite=True)
    # ggml_can_mul_mat(k, q): same head size, q's heads and dim 3 a multiple of k's
    require(k.ne[0] == q.ne[0], fn, f"k and q must have the same head size (k.ne[0]={k.ne[0]}, q.ne[0]={q.ne[0]})",
            q, k)
    require(k.ne[2] > 0 and q.ne[2] % k.ne[2] == 0, fn,
            f"q's heads ({q.ne[2]}) must be a multiple of k's ({k.ne[2]})", q, k)
    require(q.ne[3] == k.ne[3] and q.ne[3] == v.ne[3], fn, "q, k and v must have the same ne[3]", q, k, v)
    # what ggml's kernel reads without asserting it in the builder: v has k's rows, heads that q's divide
    require(v.ne[1] == k.ne[1], fn, f"v must have k's n_kv rows (v.ne[1]={v.ne[1]}, k.ne[1]={k.ne[1]})", k, v)
    require(v.ne[2] > 0 and q.ne[2] % v.ne[2] == 0, fn,
            f"q's heads ({q.ne[2]}) must be a multiple of v's ({v.ne[2]})", q, v)
    if mask is not None:
        require(mask.type == GGMLType.F16, fn, f"the mask must be F16, not {mask.type.name}", mask)
        require(mask.is_contiguous(), fn, "the mask must be contiguous", mask)
        require(mask.ne[2] > 0 and mask.ne[3] > 0 and q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0,
                fn, "the mask must broadcast over q's heads and dim 3", q, mask)
        require(mask.ne[0] >= k.ne[1] and mask.ne[1] >= q.ne[1], fn,
                f"the mask needs n_kv={k.ne[1]} columns and n_batch={q.ne[1]} rows at least", q, k, mask)
    require_arg(max_bias <= 0.0 or mask is not None, fn, f"max_bias={max_bias} > 0 (ALiBi) needs a mask", q)
    result = ctx.new_tensor(GGMLType.F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]])  # permute(0, 2, 1, 3)
    params = FlashAttnExtParams(scale=scale, max_bias=max_bias, logit_softcap=logit_softcap)
    return set_op(result, GGMLOp.FLASH_ATTN_EXT, q, k, v, mask, params=params)


def _require_fa(a: Tensor, fn: str) -> None:
    require(isinstance(a, Tensor) and a.op == GGMLOp.FLASH_ATTN_EXT, fn, "a must be a FLASH_ATTN_EXT node",
            *([a] if isinstance(a, Tensor) else []))


def flash_attn_ext_set_prec(a: Tensor, prec: Prec | int) -> None:
    """ggml_flash_attn_ext_set_prec (today ggml_prec_set_acc): the accumulator precision, op_params word 3."""
    _require_fa(a, "flash_attn_ext_set_prec")
    p = as_enum(Prec, prec, "flash_attn_ext_set_prec", "prec")
    dataclasses.replace(FlashAttnExtParams.of(a), prec=p).store(a)


def flash_attn_ext_get_prec(a: Tensor) -> Prec:
    """ggml_flash_attn_ext_get_prec: op_params word 3."""
    _require_fa(a, "flash_attn_ext_get_prec")
    return FlashAttnExtParams.of(a).prec


def flash_attn_ext_set_n_kv_max(a: Tensor, n_kv_max: int) -> None:
    """ggml_flash_attn_ext_set_n_kv_max: a bound on the finite mask entries of every row (0: dense), word 4."""
    _require_fa(a, "flash_attn_ext_set_n_kv_max")
    require_arg(isinstance(n_kv_max, int) and n_kv_max >= 0, "flash_attn_ext_set_n_kv_max",
                f"n_kv_max={n_kv_max} must be an int >= 0")
    dataclasses.replace(FlashAttnExtParams.of(a), n_kv_max=n_kv_max).store(a)


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """ggml_flash_attn_ext_add_sinks: per-head attention sinks (F32, one per q head) in src[4], as if each row
    had one more logit with no value; None removes them."""
    if sinks is None:
        a.src[4] = None
        return
    fn = "flash_attn_ext_add_sinks"
    _require_fa(a, fn)
    q = a.src[0]
    assert q is not None
    require(a.src[4] is None, fn, "a already has sinks", a)
    require(sinks.type == GGMLType.F32 and sinks.ne[0] == q.ne[2], fn,
            f"the sinks must be F32, one per head (ne[0] == q.ne[2] = {q.ne[2]})", q, sinks)
    a.src[4] = sinks


__all__ = ["flash_attn_ext", "flash_attn_ext_add_sinks", "flash_attn_ext_get_prec", "flash_attn_ext_set_n_kv_max",
           "flash_attn_ext_set_prec"]
