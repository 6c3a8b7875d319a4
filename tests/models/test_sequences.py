"""Several sequences in one KV cache (llama.cpp's unified cache): batches whose tokens belong to different
sequences, each token seeing only its own sequence's cells; sequences copied and removed."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core.errors import ArgumentError
from pyggml.models.builtin import builtin_model_path
from pyggml.models.sampling import Sampler

PROMPTS = ["The module", "If the file", "Return the", "  Convert the naïve café path, 2 → 3:"]


@pytest.fixture(scope="module")
def model() -> pm.Model:
    m = pm.load(builtin_model_path(), n_ctx=256, progress=False)
    yield m
    m.free()


def _alone(model: pm.Model, prompt: str, n: int, sampler: Sampler | None = None) -> list[int]:
    model.reset()
    return list(model.generate(prompt, n, sampler=sampler))


@pytest.mark.slow
def test_four_prompts_together_give_each_alone_greedy_tokens(model: pm.Model) -> None:
    alone = [_alone(model, p, 24) for p in PROMPTS]
    together = model.generate_batch(PROMPTS, 24)
    assert together == alone
    assert len({tuple(t) for t in together}) == len(PROMPTS)  # four different continuations
    # the cache holds every sequence, each at its own positions
    for s, (p, toks) in enumerate(zip(PROMPTS, together, strict=True)):
        n_eval = len(model.tokenize(p)) + len(toks) - 1  # the last token is sampled, not evaluated
        assert model.seq_pos_max(s) == n_eval - 1


def test_each_sequence_samples_with_its_own_sampler(model: pm.Model) -> None:
    samplers = [Sampler(temperature=0.8, seed=s) for s in range(3)]
    together = model.generate_batch(PROMPTS[:3], 12, samplers=samplers)
    alone = [_alone(model, p, 12, Sampler(temperature=0.8, seed=s)) for s, p in enumerate(PROMPTS[:3])]
    assert together == alone


def test_a_copied_prompt_serves_two_sequences(model: pm.Model) -> None:
    """seq_cp: a prompt evaluated once for sequence 0 is shared by sequence 1; each then goes on with its own
    tokens and gets the logits of evaluating its whole text alone."""
    ids = model.tokenize(PROMPTS[0])
    model.reset()
    model.decode(ids, 0)
    model.seq_cp(0, 1)
    assert model.seq_pos_max(1) == model.seq_pos_max(0) == len(ids) - 1
    both = model.decode([7, 300], [0, 1])
    for row, tok in enumerate((7, 300)):
        model.reset()
        want = model.eval([*ids, tok])[-1]
        assert np.array_equal(both[row], want)


def test_a_removed_sequence_frees_its_cells_and_leaves_the_others(model: pm.Model) -> None:
    a, b = model.tokenize(PROMPTS[1]), model.tokenize(PROMPTS[2])
    model.reset()
    model.decode([*a, *b], [0] * len(a) + [1] * len(b))
    free = model.kv.n_free()
    model.seq_rm(1)
    assert model.seq_pos_max(1) == -1 and model.kv.n_free() == free + len(b)
    got = model.decode([9], 0)[0]  # goes into the cells sequence 1 left
    model.reset()  # the same products as above: a prompt, then one token (ggml's F16 orders differ between them)
    model.decode(a, 0)
    want = model.decode([9], 0)[0]
    assert np.array_equal(got, want)
    model.seq_rm(0, 2)  # keep positions 0 and 1
    assert model.seq_pos_max(0) == 1


def test_bad_batches_are_refused_and_add_nothing(model: pm.Model) -> None:
    model.reset()
    model.decode([1, 2, 3], 0)
    used = model.n_ctx - model.kv.n_free()
    with pytest.raises(ArgumentError, match="sequence id 64"):
        model.decode([4], 64)
    with pytest.raises(ArgumentError, match="positions must be 2"):
        model.decode([4, 5], 0, positions=[1])
    with pytest.raises(ArgumentError, match="KV cache full"):
        model.decode(list(range(1, model.n_ctx)), 1)
    with pytest.raises(ArgumentError, match="out of the vocabulary"):
        model.decode([model.hparams.n_vocab], 0)
    assert model.n_ctx - model.kv.n_free() == used and model.seq_pos_max(0) == 2


def test_generation_stops_at_any_end_of_generation_token(model: pm.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate and generate_batch stop after a token of eog_ids (llama_vocab_is_eog), not only after EOS."""
    full = _alone(model, PROMPTS[0], 8)
    monkeypatch.setattr(model, "eog_ids", lambda: frozenset({full[2]}))
    assert _alone(model, PROMPTS[0], 8) == full[:3]
    assert model.generate_batch(PROMPTS[:1], 8) == [full[:3]]
    assert list(model.generate(PROMPTS[0], 8, stop_at_eos=False)) != full[:3]
