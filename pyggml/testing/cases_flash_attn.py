"""FLASH_ATTN_EXT cases of the op checker, built as test-backend-ops' test_flash_attn_ext builds them.

q [hsk, nb, nh*nr2, nr3] F32; k [hsk, kv, nh, nr3], v [hsv, kv, nh, nr3] of the KV type, by default views of a
buffer twice as long (as a KV cache); the mask F16 [kv, nb, 1, nr3] with random values, -inf and 0 blocks;
sinks F32 in [-10, 10]; scale 1/sqrt(hsk). Across: F32, F16, BF16 and quantized K/V, GQA (nr2), dim-3
broadcast (nr3), no mask, ALiBi, logit softcap, sinks, permuted q/k/v, odd and unequal head sizes, a single
token (decode, ggml's split-KV path for kv >= 512), 64 tokens and more (ggml's tiled path), both precisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyggml.core.context import Context
from pyggml.core.tensor import Prec, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.testing.op_check import F16, F32, OpCase, op

BF16 = GGMLType.BF16
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                                        GGMLType.Q5_1, GGMLType.IQ4_NL)
MAX_NMSE_FLASH_ATTN_EXT = 5e-4  # test_flash_attn_ext::max_nmse_err


@dataclass(frozen=True)
class FA:
    """One test_flash_attn_ext case (its constructor's arguments)."""

    hsk: int = 64
    hsv: int = 64
    nh: int = 4
    nr2: int = 1
    nr3: int = 1
    kv: int = 113
    nb: int = 3
    mask: bool = True
    sinks: bool = False
    max_bias: float = 0.0
    logit_softcap: float = 0.0
    prec: Prec = Prec.F32
    type_kv: GGMLType = F16
    permute: tuple[int, int, int, int] = (0, 1, 2, 3)
    kv_view: bool = True
    mask_heads: bool = False  # a mask per q head ([kv, nb, nh*nr2, nr3]) instead of one for all
    mask_pad: int = 0  # rows of the mask past nb (as llama.cpp once padded them to GGML_KQ_MASK_PAD)

    def desc(self) -> str:
        t = TYPE_TRAITS[self.type_kv].name
        return (f"hsk={self.hsk},hsv={self.hsv},nh={self.nh},nr23=[{self.nr2},{self.nr3}],kv={self.kv},nb={self.nb},"
                f"mask={int(self.mask)},sinks={int(self.sinks)},max_bias={self.max_bias:g},"
                f"logit_softcap={self.logit_softcap:g},prec={self.prec.name.lower()},type_KV={t},"
                f"permute=[{','.join(map(str, self.permute))}],kv_view={int(self.kv_view)}"
                + (",mask_heads=1" if self.mask_heads else "")
                + (f",mask_pad={self.mask_pad}" if self.mask_pad else ""))


def _permuted_input(ctx: Context, c: FA, name: str, type: GGMLType, ne: list[int], is_view: bool) -> Tensor:
    """create_permuted of test_flash_attn_ext: a tensor (or a view of one twice as long in dim 1), permuted."""
    ne_perm = [0, 0, 0, 0]
    for i in range(4):
        ne_perm[c.permute[i]] = ne[i]
    if is_view:
        base = ctx.new_tensor(type, [ne_perm[0], 2 * ne_perm[1], ne_perm[2], ne_perm[3]]).set_name(name)
        t = op(ctx, "view_4d")(base, *ne_perm, base.nb[1], base.nb[2], base.nb[3], 0).set_name(f"{name}_view")
    else:
        t = ctx.new_tensor(type, ne_perm).set_name(name)
    if c.permute != (0, 1, 2, 3):
        t = op(ctx, "permute")(t, *c.permute)
    return t


def build(ctx: Context, c: FA) -> Tensor:
    from pyggml.core import ops

    blck = TYPE_TRAITS[c.type_kv].blck_size
    hsk = -(-c.hsk // blck) * blck  # GGML_PAD to the KV type's block
    hsv = -(-c.hsv // blck) * blck
    q = _permuted_input(ctx, c, "q", F32, [hsk, c.nb, c.nh * c.nr2, c.nr3], False)
    k = _permuted_input(ctx, c, "k", c.type_kv, [hsk, c.kv, c.nh, c.nr3], c.kv_view)
    v = _permuted_input(ctx, c, "v", c.type_kv, [hsv, c.kv, c.nh, c.nr3], c.kv_view)
    m_heads = c.nh * c.nr2 if c.mask_heads else 1
    m = ctx.new_tensor(F16, [c.kv, c.nb + c.mask_pad, m_heads, c.nr3]).set_name("m") if c.mask else None
    out = op(ctx, "flash_attn_ext")(q, k, v, m, 1.0 / math.sqrt(hsk), c.max_bias, c.logit_softcap)
    if c.sinks:
        ops.flash_attn_ext_add_sinks(out, ctx.new_tensor(F32, [q.ne[2]]).set_name("s"))
    ops.flash_attn_ext_set_prec(out, c.prec)
    return out.set_name("out")


def kq_mask(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """init_tensor_kq_mask: uniform [-1, 1) with 20% of the area in 128x64 blocks of -inf or 0 (f32 values)."""
    ne0, ne1, ne2, ne3 = t.ne
    x = rng.uniform(-1.0, 1.0, (ne3, ne2, ne1, ne0)).astype(np.float32)
    for _ in range(int(0.2 * x.size / (128 * 64))):
        p3, p2, p1, p0 = (int(rng.integers(0, n)) for n in (ne3, ne2, ne1, ne0))
        x[p3, p2, p1: p1 + 64, p0: p0 + 128] = -np.inf if rng.integers(0, 2) else 0.0
    if ne1 > 1:
        x[0, 0, ne1 - 1, :] = -np.inf  # a row that attends to nothing: 0 (or the sink's share of nothing)
    return x.ravel()


def _sinks(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    return rng.uniform(-10.0, 10.0, t.nelements()).astype(np.float32)


def _cases() -> list[FA]:
    out = []
    for t in (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL):
        for nb in (1, 3, 75):
            out.append(FA(type_kv=t, nb=nb))
        out.append(FA(type_kv=t, nr2=4, kv=512, nb=3, sinks=True))
    for t in (F32, F16):
        out += [FA(type_kv=t, nb=64), FA(type_kv=t, nb=1, kv=512), FA(type_kv=t, nr2=4, nb=1, kv=1024)]
    out += [
        FA(mask=False), FA(mask=False, sinks=True), FA(sinks=True), FA(sinks=True, nb=75),
        FA(max_bias=8.0), FA(max_bias=8.0, nh=5, sinks=True), FA(hsk=128, hsv=128, logit_softcap=10.0),
        FA(hsk=128, hsv=128, logit_softcap=10.0, max_bias=8.0, prec=Prec.DEFAULT),
        FA(nr3=3), FA(nr2=4, nr3=3, type_kv=Q8_0), FA(nh=1), FA(kv=1, nb=1), FA(kv=17, nb=5, nh=3),
        FA(hsk=72, hsv=64, kv=256, nb=2), FA(hsk=64, hsv=72, kv=256, nb=2),
        FA(hsk=65, hsv=67, kv=113, nb=75, sinks=True, max_bias=8.0),
        FA(hsk=65, hsv=67, kv=17, nb=75, mask=False, logit_softcap=1.0),
        FA(permute=(0, 2, 1, 3), kv=512), FA(permute=(0, 2, 1, 3), kv=512, type_kv=Q4_0, nr2=4),
        FA(permute=(0, 2, 1, 3), kv=512, nb=75, type_kv=F32), FA(kv_view=False), FA(kv_view=False, type_kv=BF16),
        FA(hsk=64, hsv=64, nh=3, nr2=3, kv=256, nb=1, type_kv=F16),  # SmolLM2-135M's decode step
        FA(mask_heads=True, nr2=2, max_bias=8.0), FA(mask_heads=True, nr3=3, type_kv=Q8_0),
        FA(mask_pad=61, nb=3), FA(mask_pad=1, nb=64, type_kv=F32, sinks=True),
    ]
    return out


def flash_attn_ext_cases() -> list[OpCase]:
    inits = {"m": kq_mask, "s": _sinks}
    return [OpCase("FLASH_ATTN_EXT", c.desc(), lambda ctx, c=c: build(ctx, c), dict(inits),
                   max_nmse=MAX_NMSE_FLASH_ATTN_EXT) for c in _cases()]
