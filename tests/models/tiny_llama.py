"""The tiny HF LLaMA of the model tests (random weights, fixed seed), importable by name.

It lives outside conftest.py because several test folders have a conftest and
`from conftest import ...` would take whichever was imported first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)


@dataclass
class TinyLlama:
    hf: Any  # transformers LlamaForCausalLM, eval mode, f32
    config: dict[str, Any]
    state: dict[str, np.ndarray]

    def logits(self, ids: np.ndarray | list[int]) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.hf(torch.tensor(np.asarray(ids, dtype=np.int64))[None]).logits[0].numpy()


def make_tiny_llama(seed: int = 0, **overrides: Any) -> TinyLlama:
    """A tiny LlamaForCausalLM with GQA (4 heads, 2 KV heads), a non-default RoPE base, weights large
    enough to matter (std 0.1) and random RMSNorm weights (HF starts them at 1, which would hide a
    missing norm multiplication)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kw = dict(TINY, rope_theta=5000.0, initializer_range=0.1, tie_word_embeddings=False)
    kw.update(overrides)
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**kw, attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    state = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    if kw["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    return TinyLlama(hf, cfg.to_dict(), state)
