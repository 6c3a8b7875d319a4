"""Embeddings: the hidden states `decode(..., embeddings=True)` gives are transformers' last hidden state (after
the output norm, what llama.cpp's t_embd is), pooled and normalized as llama.cpp's common_embd_normalize; Model.embed
leaves the KV cache's other sequences as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_llama import TinyLlama

from pyggml.core.errors import ArgumentError
from pyggml.models import load
from pyggml.models.pooling import INT16_SCALE, normalize, pool


@pytest.fixture(scope="module")
def model(tiny_gguf: Any) -> Any:
    m = load(tiny_gguf("F32"), n_ctx=128, progress=False)
    yield m
    m.free()


def _hf_hidden(tiny: TinyLlama, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = tiny.hf.model(torch.tensor(np.asarray(ids, dtype=np.int64))[None])
    return out.last_hidden_state[0].numpy()


@pytest.mark.slow
def test_hidden_states_are_transformers_last_hidden_state(model: Any, tiny_llama: TinyLlama,
                                                          prompt32: np.ndarray) -> None:
    ids = [int(t) for t in prompt32]
    model.reset()
    hidden = model.decode(ids, 0, outputs=np.ones(len(ids), dtype=bool), embeddings=True)
    assert hidden.shape == (len(ids), tiny_llama.config["hidden_size"])
    want = _hf_hidden(tiny_llama, ids)
    np.testing.assert_allclose(hidden, want, rtol=1e-4, atol=1e-4)
    # the same batch's logits are the head applied to them: the graph's output is the head's input
    model.reset()
    logits = model.decode(ids, 0, outputs=np.ones(len(ids), dtype=bool))
    np.testing.assert_allclose(logits, hidden @ tiny_llama.state["lm_head.weight"].T, rtol=1e-4, atol=1e-4)
    model.reset()


@pytest.mark.slow
def test_embed_pools_and_normalizes(model: Any, tiny_llama: TinyLlama, prompt32: np.ndarray) -> None:
    ids = [int(t) for t in prompt32[:12]]
    want = _hf_hidden(tiny_llama, ids).astype(np.float64)
    cases = {"mean": want.mean(axis=0), "cls": want[0], "last": want[-1]}
    for pooling, vec in cases.items():
        got = model.embed(ids, pooling=pooling)
        np.testing.assert_allclose(got, vec / np.linalg.norm(vec), rtol=1e-4, atol=1e-5, err_msg=pooling)
    raw = model.embed(ids, pooling="none", embd_normalize=-1)
    np.testing.assert_allclose(raw, want, rtol=1e-4, atol=1e-4)
    # several inputs: one row each, as one at a time
    both = model.embed([ids, ids[:5]], pooling="mean")
    assert both.shape == (2, tiny_llama.config["hidden_size"])
    np.testing.assert_allclose(both[1], model.embed(ids[:5], pooling="mean"), rtol=1e-5, atol=1e-6)


def test_embed_leaves_the_cache_alone(model: Any, prompt32: np.ndarray) -> None:
    ids = [int(t) for t in prompt32]
    model.reset()
    want = model.eval(ids[:9])[8]  # the logits of ids[8] after ids[:8]
    model.reset()
    model.eval(ids[:8])
    model.embed(ids[8:20], pooling="mean")
    assert model.n_past == 8  # sequence 0 kept its 8 tokens, the embedding's sequence is gone
    assert model.kv.n_free() == model.n_ctx - 8
    np.testing.assert_allclose(model.eval(ids[8:9])[0], want, rtol=1e-5, atol=1e-5)
    model.reset()


def test_embed_refuses_what_it_cannot_do(model: Any) -> None:
    with pytest.raises(ArgumentError, match="pooling must be one of"):
        model.embed([5, 6], pooling="max")
    with pytest.raises(ArgumentError, match="'rank' needs a classifier head"):
        model.embed([5, 6], pooling="rank")
    with pytest.raises(ArgumentError, match="no inputs"):
        model.embed([], pooling="mean")
    with pytest.raises(ArgumentError, match="embd_normalize"):
        model.embed([5, 6], pooling="mean", embd_normalize=-2)
    with pytest.raises(ArgumentError, match="out of the vocabulary"):
        model.embed([5, 10**6], pooling="mean")
    assert model.pooling_type == "none"  # a decoder's file names none: llama.cpp's default


def test_normalize_is_common_embd_normalize() -> None:
    v = np.array([3.0, -4.0, 0.0, 1.0], dtype=np.float32)
    np.testing.assert_allclose(normalize(v, -1), v)
    np.testing.assert_allclose(normalize(v, 0), v * np.float32(INT16_SCALE / 4.0), rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 1), v / 8.0, rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 2), v / np.sqrt(26.0), rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 3), v / (27 + 64 + 1) ** (1 / 3), rtol=1e-6)
    assert not normalize(np.zeros(4, dtype=np.float32), 2).any()  # zero stays zero, no NaN
    rows = normalize(np.stack([v, 2 * v]), 2)
    np.testing.assert_allclose(rows[0], rows[1], rtol=1e-6)


def test_pool_checks_its_input() -> None:
    with pytest.raises(ArgumentError, match="at least one token"):
        pool(np.zeros((0, 4), dtype=np.float32), "mean")


def test_file_pooling_type_is_read(tmp_path: Path, tiny_llama: TinyLlama) -> None:
    """A file naming its pooling (`<arch>.pooling_type`, as an embedding model's does) is embedded that way."""
    from pyggml.models.convert import simple_vocab, write_llama_gguf

    path = tmp_path / "pooled.gguf"
    vocab = {**simple_vocab(tiny_llama.config["vocab_size"]), "llama.pooling_type": 3}
    write_llama_gguf(path, tiny_llama.config, tiny_llama.state, vocab=vocab)
    m = load(path, n_ctx=64, progress=False)
    try:
        assert m.pooling_type == "last"
        ids = [5, 9, 13, 2]
        np.testing.assert_allclose(m.embed(ids), m.embed(ids, pooling="last"))
        assert not np.allclose(m.embed(ids), m.embed(ids, pooling="mean"))
    finally:
        m.free()
