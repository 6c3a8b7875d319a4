"""Fixtures of the LLaMA tests: tiny HF models (random weights, fixed seed) and their GGUF files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
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


@pytest.fixture(scope="session")
def tiny_llama() -> TinyLlama:
    return make_tiny_llama()


@pytest.fixture(scope="session")
def tiny_gguf(tiny_llama: TinyLlama, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`tiny_gguf(type)`: the path of the tiny model's GGUF file with 2-D weights in `type` (made once)."""
    from pyggml.models.convert import write_llama_gguf

    made: dict[str, Path] = {}

    def get(type: str = "F32") -> Path:
        if type not in made:
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{type.lower()}.gguf"
            write_llama_gguf(path, tiny_llama.config, tiny_llama.state, type=type)
            made[type] = path
        return made[type]

    return get


@pytest.fixture
def prompt32() -> np.ndarray:
    return np.random.default_rng(7).integers(3, TINY["vocab_size"], 32)
