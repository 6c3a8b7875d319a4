"""Random-weight qwen3moe GGUF files at real-ish shapes: mixtures of experts for speed and memory measurements.

The file is llama.cpp's qwen3moe layout (its converter's tensor names and keys; matrices F16 or F32, norms and
the router F32) with the tokenizer of llama.cpp's `ggml-vocab-llama-spm.gguf` unless one is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.core.types import GGMLType
from pyggml.gguf.writer import write_gguf
from pyggml.testing.random_llama import vocab_metadata


@dataclass(frozen=True)
class MoeShape:
    n_embd: int = 1024
    n_layer: int = 8
    n_head: int = 16
    n_head_kv: int = 4
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 512
    n_vocab: int = 32000
    n_ctx_train: int = 4096


def write_random_qwen3moe(path: Path, shape: MoeShape, seed: int = 0, type: GGMLType = GGMLType.F16,
                          vocab: Mapping[str, Any] | None = None) -> Path:
    """qwen3moe's tensors and keys as llama.cpp's converter writes them; matrices in `type` (F16 or F32), norms
    F32; `vocab` the tokenizer keys (default: llama.cpp's SPM vocabulary, which needs shape.n_vocab 32000).
    Weights are N(0, 1/fan_in) (the router's too, so tokens spread over the experts), embeddings N(0, 1) and
    norms 1 + N(0, 0.1), so activations keep their scale through the layers."""
    rng = np.random.default_rng(seed)
    s, a = shape, "qwen3moe"
    n_q, n_kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim

    def matrix(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * np.float32(dims[-1] ** -0.5)).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)

    tensors: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((s.n_vocab, s.n_embd),
                                                                                dtype=np.float32).astype(np.float16)}
    for il in range(s.n_layer):
        b = f"blk.{il}."
        tensors |= {b + "attn_norm.weight": norm(s.n_embd), b + "attn_q.weight": matrix(n_q, s.n_embd),
                    b + "attn_k.weight": matrix(n_kv, s.n_embd), b + "attn_v.weight": matrix(n_kv, s.n_embd),
                    b + "attn_output.weight": matrix(s.n_embd, n_q), b + "attn_q_norm.weight": norm(s.head_dim),
                    b + "attn_k_norm.weight": norm(s.head_dim), b + "ffn_norm.weight": norm(s.n_embd),
                    b + "ffn_gate_inp.weight": rng.standard_normal((s.n_expert, s.n_embd), dtype=np.float32)
                    * np.float32(s.n_embd ** -0.5),
                    b + "ffn_gate_exps.weight": matrix(s.n_expert, s.n_ff_exp, s.n_embd),
                    b + "ffn_up_exps.weight": matrix(s.n_expert, s.n_ff_exp, s.n_embd),
                    b + "ffn_down_exps.weight": matrix(s.n_expert, s.n_embd, s.n_ff_exp)}
    tensors |= {"output_norm.weight": norm(s.n_embd), "output.weight": matrix(s.n_vocab, s.n_embd)}
    meta = {"general.name": f"random qwen3moe {s.n_embd}x{s.n_layer} {s.n_expert}x{s.n_expert_used}",
            "general.file_type": 1 if type == GGMLType.F16 else 0, f"{a}.context_length": s.n_ctx_train,
            f"{a}.embedding_length": s.n_embd,
            f"{a}.block_count": s.n_layer, f"{a}.feed_forward_length": 4 * s.n_ff_exp,
            f"{a}.expert_feed_forward_length": s.n_ff_exp, f"{a}.expert_count": s.n_expert,
            f"{a}.expert_used_count": s.n_expert_used, f"{a}.attention.head_count": s.n_head,
            f"{a}.attention.head_count_kv": s.n_head_kv, f"{a}.attention.key_length": s.head_dim,
            f"{a}.attention.value_length": s.head_dim, f"{a}.rope.freq_base": 1000000.0,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
            **(vocab if vocab is not None else vocab_metadata(s.n_vocab))}
    types = {name: type for name, t in tensors.items() if t.dtype == np.float16}
    write_gguf(path, a, meta, tensors, types=types)
    return path
