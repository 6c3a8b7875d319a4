"""Rope and ALiBi arithmetic every backend shares, from ggml-cpu's ops.cpp: rotate pairs, YaRN dims, ALiBi slopes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pyggml.core.errors import ArgumentError, ShapeError, UnsupportedTypeError
from pyggml.core.ops.params import RopeParams
from pyggml.core.tensor import (
    GGML_ROPE_TYPE_IMROPE,
    GGML_ROPE_TYPE_MROPE,
    GGML_ROPE_TYPE_NEOX,
    GGML_ROPE_TYPE_NORMAL,
    GGML_ROPE_TYPE_VISION,
    Tensor,
)
from pyggml.core.types import GGMLType

F32 = np.float32


@functools.cache
def _libm_powf() -> Callable[[float, float], float] | None:
    """The C library's powf, as ggml (numpy's float32 power rounds 0.8408964^3 the other way); None if not found."""
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).powf
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return fn  # type: ignore[no-any-return]


def powf(x: np.float32, y: np.float32) -> np.float32:
    """x^y as ggml computes it, by the C library's powf (numpy's where none is found)."""
    fn = _libm_powf()
    if fn is None:
        return np.power(x, y, dtype=F32)
    return F32(fn(float(x), float(y)))


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi's slope of each head h < n_head (f32, as ggml's SOFT_MAX computes them: powf of the C library);
    all 1 when max_bias <= 0."""
    if max_bias <= 0.0:
        return np.ones(n_head, F32)
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = powf(F32(2.0), F32(-max_bias) / F32(n_log2))
    m1 = powf(F32(2.0), F32(-max_bias / 2.0) / F32(n_log2))
    return np.array([powf(m0, F32(h + 1)) if h < n_log2 else powf(m1, F32(2 * (h - n_log2) + 1))
                     for h in range(n_head)], F32)


ROPE_MODES = (GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_IMROPE,
              GGML_ROPE_TYPE_VISION)  # the modes ggml's CPU kernel computes


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims; as in C, n_ctx_orig = 0 gives -inf and MAX/MIN let a NaN through."""
    def corr_dim(n_rot: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.float64(n_ctx_orig) / np.float64(n_rot * 2 * math.pi)
            return float(n_dims * np.log(ratio) / (2 * np.log(np.float64(freq_base))))

    start = float(np.floor(corr_dim(beta_fast)))
    end = float(np.ceil(corr_dim(beta_slow)))
    return (0.0 if 0.0 > start else start), (n_dims - 1.0 if n_dims - 1.0 < end else end)


@dataclass(frozen=True)
class RopePairs:
    """Which elements of a row ROPE turns: pair k is (first[k], second[k]) of the slices, the `kept` slices
    are copied unchanged."""

    first: slice
    second: slice
    n_pairs: int
    kept: tuple[slice, ...]


def rope_pairs(p: RopeParams, ne0: int) -> RopePairs:
    """ggml's rotate_pairs for the mode: NORMAL turns (2k, 2k+1), NEOX and the multi-rope modes (k, k + n_dims/2)
    within [n_offs, n_offs + n_dims); VISION turns (k, k + n_dims) over the whole row (n_dims = ne0/2)."""
    n, o = p.n_dims, p.n_offs
    if p.mode == GGML_ROPE_TYPE_VISION:
        return RopePairs(slice(0, n), slice(n, 2 * n), n, ())
    kept = tuple(sl for sl in (slice(0, o), slice(o + n, ne0)) if sl.stop > sl.start)
    if p.mode == GGML_ROPE_TYPE_NORMAL:
        return RopePairs(slice(o, o + n, 2), slice(o + 1, o + n, 2), n // 2, kept)
    return RopePairs(slice(o, o + n // 2), slice(o + n // 2, o + n), n // 2, kept)


def rope_theta_sources(p: RopeParams, n_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """For each pair k: which position stream turns it (0 for plain rope; multi-rope's t, h, w, e) and the
    power of theta_scale it has (k, or k since its section began for VISION, whose thetas restart)."""
    k = np.arange(n_pairs)
    if not p.mode & GGML_ROPE_TYPE_MROPE:
        return np.zeros(n_pairs, np.int64), k
    s0, s1, s2, s3 = p.sections
    sect_dims = s0 + s1 + s2 + s3
    sector = k % sect_dims
    if p.mode == GGML_ROPE_TYPE_IMROPE:
        stream = np.full(n_pairs, 3)
        stream = np.where((sector % 3 == 0) & (sector < 3 * s0), 0, stream)
        stream = np.where((sector % 3 == 2) & (sector < 3 * s2), 2, stream)
        stream = np.where((sector % 3 == 1) & (sector < 3 * s1), 1, stream)
    else:
        stream = np.select([sector < s0, sector < s0 + s1, sector < s0 + s1 + s2], [0, 1, 2], 3)
    power = k
    if p.mode == GGML_ROPE_TYPE_VISION:  # thetas restart where their section begins (every sect_dims pairs)
        begin = np.array([0, s0, s0 + s1, s0 + s1 + s2])
        last_reset = np.zeros(n_pairs, np.int64)
        for j in range(4):
            resets = (k - k % sect_dims) + begin[j]  # this cycle's reset of stream j
            resets = np.where(resets > k, resets - sect_dims, resets)
            last_reset = np.where(stream == j, np.maximum(resets, 0), last_reset)
        power = k - last_reset
    return stream, power


def rope_check(node: Tensor, p: RopeParams, ne0: int, ne2: int, backend: str) -> None:
    """ggml's asserts of the ROPE kernel, as errors naming the node."""
    who = f"{backend} {node.op.name} '{node.name}'"  # ROPE or ROPE_BACK
    if p.mode not in ROPE_MODES:
        raise UnsupportedTypeError(f"{who}: mode {p.mode} is not one of {ROPE_MODES}")
    vision = p.mode == GGML_ROPE_TYPE_VISION
    if p.n_dims <= 0 or p.n_dims % 2 or p.n_dims > ne0 or (vision and 2 * p.n_dims != ne0):
        raise ArgumentError(f"{who}: n_dims={p.n_dims} must be even, > 0 and <= ne0={ne0} "
                            "(ne0/2 in VISION mode)")
    if p.n_offs < 0 or p.n_offs % 2 or p.n_offs + p.n_dims > ne0 or (vision and p.n_offs):
        raise ArgumentError(f"{who}: n_offs={p.n_offs} must be even, >= 0 and n_offs + "
                            f"n_dims <= ne0={ne0} (0 in VISION mode)")
    if p.mode & GGML_ROPE_TYPE_MROPE and not any(x > 0 for x in p.sections[:3]):
        raise ArgumentError(f"{who}: multi-rope needs sections, got {list(p.sections)}")
    pos_t = node.src[1]
    per_token = 4 if p.mode & GGML_ROPE_TYPE_MROPE else 1
    if pos_t is None or pos_t.type != GGMLType.I32:
        raise UnsupportedTypeError(f"{who}: positions (src[1]) must be an I32 tensor")
    if not pos_t.is_vector() or pos_t.ne[0] < per_token * ne2:
        raise ShapeError(f"{who}: positions must be a vector of at least {per_token} x "
                         f"ne2={ne2}, got ne {pos_t.ne}")
    ff = node.src[2]
    n_pairs = rope_pairs(p, ne0).n_pairs  # one factor a pair: VISION turns n_dims pairs, the others n_dims/2
    if ff is not None and (ff.type != GGMLType.F32 or ff.ne[0] < n_pairs):
        raise ShapeError(f"{who}: frequency factors (src[2]) must be F32 with one per turned pair, at least "
                         f"{n_pairs}, got {ff.type.name} {ff.ne}")
