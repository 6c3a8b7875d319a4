"""llama.cpp's Hadamard rotation of a quantized KV cache (llama-kv-cache.cpp's attn_rot_k / attn_rot_v).

A quantized cache type rounds each block of K or V to one scale; an outlier channel then costs the whole
block its precision. llama.cpp rotates every head's K and Q (the same rotation, so K^T Q is unchanged) and
V by an orthonormal Walsh-Hadamard matrix H before they reach the cache, which spreads outliers over the
block, and rotates the attention's output back (H H = I): MUL_MAT by a constant F32 matrix, an op every
backend has.

The conditions are llama.cpp's: K is rotated when K's cache type is quantized and the heads' size is a
multiple of 64, by the largest power of two (>= 64) dividing the head size; V likewise by its type, always
by 64 (llama.cpp finds the smaller matrix better for V). LLAMA_ATTN_ROT_DISABLE, read as C's atoi when the
cache is made, turns both off when nonzero.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import numpy as np

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.ops.matmul import mul_mat_set_hint
from pyggml.core.tensor import OpHint, Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

ATTN_ROT_DISABLE_ENV = "LLAMA_ATTN_ROT_DISABLE"
ROT_MIN = 64  # the smallest rotation, and the head-size multiple a rotation needs
ROT_V = 64  # V's rotation size, whatever the head size

_ATOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")  # C's atoi: leading space, a sign, the digits up to the first other


def c_atoi(text: str) -> int:
    """C's atoi: the leading integer of `text`, 0 when there is none."""
    m = _ATOI.match(text)
    return int(m.group(1)) if m else 0


def attn_rot_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether LLAMA_ATTN_ROT_DISABLE turns the rotation off: set to a nonzero integer, as llama.cpp reads it."""
    env = os.environ if environ is None else environ
    value = env.get(ATTN_ROT_DISABLE_ENV)
    return value is not None and c_atoi(value) != 0


def rot_sizes(head_dim: int, type_k: GGMLType, type_v: GGMLType, disabled: bool) -> tuple[int, int]:
    """The sizes of K's and V's rotations (0: not rotated) for heads of `head_dim` (0: unknown, nothing
    rotated, as llama.cpp's n_embd_head_k_all 0) and the cache types."""
    if disabled or head_dim <= 0 or head_dim % ROT_MIN:
        return 0, 0
    n_rot_k = 0
    if TYPE_TRAITS[type_k].is_quantized:
        n_rot_k = ROT_MIN
        while head_dim % (2 * n_rot_k) == 0:
            n_rot_k *= 2
    return n_rot_k, ROT_V if TYPE_TRAITS[type_v].is_quantized else 0


def hadamard(n: int) -> np.ndarray:
    """llama.cpp's ggml_gen_hadamard: the orthonormal Walsh-Hadamard matrix of order `n` (a power of two),
    F32 [n, n], symmetric, its own inverse; built by doubling from 1 / sqrtf(n)."""
    if n < 1 or n & (n - 1):
        raise ArgumentError(f"hadamard: order {n} is not a power of two")
    h = np.empty((n, n), dtype=np.float32)
    h[0, 0] = np.float32(1.0) / np.sqrt(np.float32(n))
    s = 1
    while s < n:
        block = h[:s, :s]
        h[s:2 * s, :s] = block
        h[:s, s:2 * s] = block
        h[s:2 * s, s:2 * s] = -block
        s *= 2
    return h


def mul_mat_hadamard(ctx: Context, cur: Tensor, rot: Tensor) -> Tensor:
    """llama.cpp's llama_mul_mat_hadamard: every run of rot.ne[0] values of `cur` (a head, or a part of one)
    times `rot`, in `cur`'s shape; the MUL_MAT hinted SRC0_IS_HADAMARD, as llama.cpp hints it."""
    n = rot.ne[0]
    flat = (ctx.reshape_2d(cur, n, cur.nelements() // n) if cur.is_contiguous()
            else ctx.cont_2d(cur, n, cur.nelements() // n))
    res = ctx.mul_mat(rot, flat)
    mul_mat_set_hint(res, OpHint.SRC0_IS_HADAMARD)
    return ctx.reshape_4d(res, cur.ne[0], cur.ne[1], cur.ne[2], cur.ne[3])
