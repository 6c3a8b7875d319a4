"""Fixtures of the command-line tests: a tiny LLaMA GGUF file made with numpy (no torch needed),
with the SentencePiece-style vocabulary of `simple_vocab` (byte tokens included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TINY_CONFIG = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, name="cli-tiny")


def tiny_state(seed: int = 0) -> dict[str, np.ndarray]:
    """HF-layout weights of TINY_CONFIG; std 0.1 so that the logits differ between tokens."""
    rng = np.random.default_rng(seed)
    e, f, v, kv = 64, 128, 320, 32

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.1, shape).astype(np.float32)

    state = {"model.embed_tokens.weight": w(v, e), "model.norm.weight": 1 + w(e), "lm_head.weight": w(v, e)}
    for i in range(2):
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": 1 + w(e), p + "post_attention_layernorm.weight": 1 + w(e),
                      p + "self_attn.q_proj.weight": w(e, e), p + "self_attn.k_proj.weight": w(kv, e),
                      p + "self_attn.v_proj.weight": w(kv, e), p + "self_attn.o_proj.weight": w(e, e),
                      p + "mlp.gate_proj.weight": w(f, e), p + "mlp.up_proj.weight": w(f, e),
                      p + "mlp.down_proj.weight": w(e, f)})
    return state


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of the tiny model's GGUF file (F16 2-D weights, F32 norms)."""
    from pyggml.models.convert import write_llama_gguf

    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_llama_gguf(path, TINY_CONFIG, tiny_state(), type="F16")
    return path
