"""Embeddings from a model's hidden states, as llama.cpp computes them: the output norm's result per token
(`result_norm`, llama.cpp's `t_embd`), pooled over a sequence and normalized.

    hidden = model.decode(ids, outputs=[True] * len(ids), embeddings=True)   # (n_tokens, n_embd)
    vec = normalize(pool(hidden, "mean"), EMBD_NORMALIZE)

The pooling types are llama.cpp's (`llama_pooling_type`): "none" (every token's vector), "mean", "cls" (the
first token's), "last" (the last token's) and "rank" (a classifier head, which no family here has). A file
names its own in `<arch>.pooling_type` (a decoder's is "none", llama.cpp's default); llama.cpp's `--pooling`
overrides it. `normalize` is llama.cpp's `common_embd_normalize`: -1 none, 0 max absolute scaled to int16,
1 taxicab, 2 euclidean (the default of llama-embedding and llama-server), p > 2 the p-norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError

POOLING_TYPES = ("none", "mean", "cls", "last", "rank")  # llama_pooling_type's values 0..4, by name
EMBD_NORMALIZE = 2  # llama.cpp's default: euclidean
INT16_SCALE = 32760.0  # normalize 0: the largest magnitude becomes this (common_embd_normalize)


def check_pooling(name: Any, what: str = "pooling") -> str:
    """`name` if it is one of POOLING_TYPES (ArgumentError otherwise); "rank" is refused: it needs a
    classifier head."""
    if not isinstance(name, str) or name not in POOLING_TYPES:
        raise ArgumentError(f"{what} must be one of {', '.join(POOLING_TYPES[:4])}, got {name!r}")
    if name == "rank":
        raise ArgumentError(f"{what} 'rank' needs a classifier head (a reranker model): not supported")
    return name


def file_pooling(gf: Any, arch_name: str) -> str:
    """The pooling the file names (`<arch>.pooling_type`), "none" without one (llama.cpp's default)."""
    from pyggml.models.metadata import read_int

    return POOLING_TYPES[read_int(gf, f"{arch_name}.pooling_type", 0, minimum=0, maximum=len(POOLING_TYPES) - 1)]


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One sequence's hidden states (n_tokens, n_embd) pooled: (n_embd,), or (n_tokens, n_embd) for "none"."""
    check_pooling(pooling)
    if hidden.ndim != 2 or hidden.shape[0] == 0:
        raise ArgumentError(f"pool: expected the hidden states of at least one token (n_tokens, n_embd), got shape "
                            f"{hidden.shape}")
    if pooling == "none":
        return hidden
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)
    return hidden[0] if pooling == "cls" else hidden[-1]


def normalize(vec: np.ndarray, embd_normalize: int = EMBD_NORMALIZE) -> np.ndarray:
    """`vec` (float32) scaled as llama.cpp's common_embd_normalize: its sums in float64, a zero vector stays
    zero. Of a (n, n_embd) array each row is normalized."""
    if isinstance(embd_normalize, bool) or not isinstance(embd_normalize, int | np.integer) or embd_normalize < -1:
        raise ArgumentError(f"embd_normalize must be an integer >= -1 (-1 none, 0 max absolute, 1 taxicab, "
                            f"2 euclidean, >2 p-norm), got {embd_normalize!r}")
    x = np.asarray(vec, dtype=np.float32)
    if x.ndim == 2:
        return np.stack([normalize(row, embd_normalize) for row in x]) if len(x) else x
    v = x.astype(np.float64)
    if embd_normalize == -1:
        total = 1.0
    elif embd_normalize == 0:
        total = float(np.abs(v).max(initial=0.0)) / INT16_SCALE
    elif embd_normalize == 2:
        total = float(np.sqrt(np.dot(v, v)))
    else:
        total = float(np.sum(np.abs(v) ** embd_normalize) ** (1.0 / embd_normalize))
    scale = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return x * scale
