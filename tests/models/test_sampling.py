"""Sampler: llama.cpp's penalty, top-k, top-p, min-p, temperature chain and seeded draws."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.core.errors import ArgumentError
from pyggml.models.sampling import Sampler, _sorted_ids


def draws(s: Sampler, logits: np.ndarray, n: int = 400, history: list[int] | None = None) -> list[int]:
    return [s.sample(logits, history or []) for _ in range(n)]


def test_greedy_is_argmax() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=64).astype(np.float32)
        assert Sampler(temperature=0.0).sample(logits, []) == int(np.argmax(logits))
        assert Sampler(temperature=-1.0, seed=3).sample(logits, []) == int(np.argmax(logits))


def test_top_k_1_equals_greedy() -> None:
    rng = np.random.default_rng(1)
    for i in range(20):
        logits = rng.normal(size=100).astype(np.float32) * 3
        s = Sampler(temperature=1.5, top_k=1, top_p=1.0, min_p=0.0, seed=i)
        assert s.sample(logits, []) == int(np.argmax(logits))


def test_seed_determinism() -> None:
    logits = np.random.default_rng(2).normal(size=50).astype(np.float32)
    kw = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    a = draws(Sampler(**kw, seed=42), logits, 100)
    b = draws(Sampler(**kw, seed=42), logits, 100)
    c = draws(Sampler(**kw, seed=43), logits, 100)
    assert a == b
    assert a != c
    assert len(set(a)) > 10  # it does sample, not pick one token
    s = Sampler(**kw, seed=42)
    s.sample(logits, [])
    s.reset()
    assert draws(s, logits, 100) == a


def test_draws_follow_the_softmax() -> None:
    """With no truncation, draw frequencies follow softmax(logits / temperature)."""
    logits = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    s = Sampler(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=0)
    got = np.bincount(draws(s, logits, 4000), minlength=4) / 4000
    want = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    assert np.abs(got - want).max() < 0.03


def test_top_p_and_min_p_restrict_the_set() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.0625, ... (logits log2 steps)
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125], np.float64)).astype(np.float32)
    # top-p 0.8: 0.5+0.25 = 0.75 < 0.8, +0.125 = 0.875 reaches it -> the first three
    s = Sampler(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, repeat_penalty=1.0, seed=0)
    ids, probs = s.candidates(s.apply_penalties(logits, []))
    assert ids.tolist() == [0, 1, 2]
    np.testing.assert_allclose(probs, np.array([4, 2, 1]) / 7, rtol=1e-5)
    assert set(draws(s, logits)) == {0, 1, 2}
    # min-p 0.2: keep p >= 0.2 * 0.5 = 0.1 -> the first three
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, repeat_penalty=1.0, seed=0)
    assert set(draws(s, logits)) == {0, 1, 2}
    # top-k 2 first, then top-p over the renormalized pair (0.667, 0.333): p=0.6 keeps one
    s = Sampler(temperature=1.0, top_k=2, top_p=0.6, min_p=0.0, repeat_penalty=1.0, seed=0)
    assert set(draws(s, logits, 50)) == {0}
    # temperature comes last: a low temperature sharpens but never re-admits a dropped token
    s = Sampler(temperature=10.0, top_k=0, top_p=0.8, min_p=0.0, repeat_penalty=1.0, seed=0)
    assert set(draws(s, logits)) == {0, 1, 2}
    ids, probs = s.candidates(logits)
    assert probs.max() - probs.min() < 0.1  # nearly flat after temperature 10


def test_repetition_penalty_changes_the_argmax() -> None:
    logits = np.array([3.0, 2.9, -1.0, -1.05], np.float32)
    s = Sampler(temperature=0.0, repeat_penalty=1.1, repeat_last_n=64)
    assert s.sample(logits, []) == 0
    assert s.sample(logits, [0]) == 1  # 3.0 / 1.1 = 2.73 < 2.9
    assert s.sample(logits, [0, 1]) == 0  # both divided: order kept
    pen = s.apply_penalties(logits, [2, 2, 2])
    np.testing.assert_allclose(pen, [3.0, 2.9, -1.1, -1.05], rtol=1e-6)  # negative: multiplied, once
    only = np.array([-1.0, -1.05], np.float32)
    assert s.sample(only, [0]) == 1  # -1.1 < -1.05: the penalty never favours a negative logit
    # repeat_last_n: only the last n history tokens count; 0 disables
    assert Sampler(temperature=0.0, repeat_penalty=1.1, repeat_last_n=1).sample(logits, [0, 3]) == 0
    assert Sampler(temperature=0.0, repeat_penalty=1.1, repeat_last_n=2).sample(logits, [0, 3]) == 1
    assert Sampler(temperature=0.0, repeat_penalty=1.1, repeat_last_n=0).sample(logits, [0]) == 0
    assert Sampler(temperature=0.0, repeat_penalty=1.1, repeat_last_n=-1).sample(logits, [0] + [3] * 100) == 1
    # frequency and presence penalties subtract count * f + p
    s = Sampler(temperature=0.0, repeat_penalty=1.0, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(s.apply_penalties(logits, [1, 1]), [3.0, 2.9 - 1.25, -1.0, -1.05], rtol=1e-6)
    assert logits[0] == 3.0  # the caller's logits are not modified


def test_sampled_with_penalty_avoids_repeats() -> None:
    logits = np.array([1.0, 1.0, -5.0], np.float32)
    s = Sampler(temperature=0.02, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=2.0, seed=0)
    assert set(draws(s, logits, 100, history=[0])) == {1}  # 0.5 vs 1.0 at temperature 0.02: p(0) = e^-25
    assert set(draws(s, logits, 100, history=[])) == {0, 1}  # without history both are drawn


def test_bad_arguments_raise() -> None:
    bad = [dict(temperature=float("nan")), dict(temperature="hot"), dict(top_k=-1), dict(top_k=2.5),
           dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1), dict(min_p=2.0), dict(repeat_penalty=0.0),
           dict(repeat_last_n=-2), dict(seed=-1), dict(seed=1.5), dict(min_keep=0), dict(top_k=True)]
    for kw in bad:
        with pytest.raises(ArgumentError):
            Sampler(**kw)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="top_p must be in"):
        Sampler(top_p=1.5)
    s = Sampler(seed=0)
    with pytest.raises(ArgumentError, match=r"logits must be one row \(n_vocab,\), got shape \(2, 3\)"):
        s.sample(np.zeros((2, 3), np.float32), [])
    with pytest.raises(ArgumentError, match=r"history token id 7 is out of the vocabulary \(n_vocab 4\)"):
        s.sample(np.zeros(4, np.float32), [1, 7])
    assert isinstance(ArgumentError("x"), ValueError)


def test_defaults_are_llama_cpps() -> None:
    s = Sampler()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty, s.repeat_last_n) == \
        (0.8, 40, 0.95, 0.05, 1.1, 64)
    logits = np.random.default_rng(5).normal(size=1000).astype(np.float32) * 2
    ids, _ = s.candidates(logits)
    assert len(ids) <= 40
    assert set(ids.tolist()) <= set(np.argsort(-logits)[:40].tolist())
    tok = Sampler(seed=1).sample(logits, list(range(10)))
    assert 0 <= tok < 1000


def _reference_candidates(s: Sampler, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates as llama.cpp's samplers define them: the whole vocabulary sorted (stable: ties by id),
    top-k, top-p over the softmax of the top-k, min-p, temperature."""
    n = len(logits)
    k = n if s.top_k <= 0 else s.top_k
    k = min(max(k, s.min_keep), n)
    ids = np.argsort(-logits, kind="stable")[:k]
    cur = logits[ids].astype(np.float64)
    if s.top_p < 1.0:
        p = np.exp(cur - cur.max())
        cum = np.cumsum(p / p.sum())
        reach = np.nonzero((cum >= s.top_p) & (np.arange(1, len(cum) + 1) >= s.min_keep))[0]
        last = int(reach[0]) + 1 if reach.size else len(cum)
        ids, cur = ids[:last], cur[:last]
    if s.min_p > 0.0:
        p = np.exp(cur - cur.max())
        keep = (p / p.sum() >= s.min_p * p[0] / p.sum()) | (np.arange(len(p)) < s.min_keep)
        keep[0] = True
        drop = np.nonzero(~keep)[0]
        last = int(drop[0]) if drop.size else len(cur)
        ids, cur = ids[:last], cur[:last]
    e = np.exp(cur / s.temperature - (cur / s.temperature).max())
    return ids, e / e.sum()


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])  # flat to peaked: heads of every length
def test_candidates_equal_the_whole_vocabulary_sorted(scale: float) -> None:
    """Sorting only a head (top-k, or top-p / min-p without top-k) keeps exactly the tokens, order and
    probabilities of sorting the whole vocabulary; ties are ordered by id."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=5000) * scale).astype(np.float32)
    logits[rng.integers(0, 5000, 400)] = logits[7]  # many ties, some at the boundaries
    for top_k in (0, 1, 40, 4999):
        for top_p in (1.0, 0.95, 0.5, 0.01):
            for min_p in (0.0, 0.05, 0.5):
                for min_keep in (1, 300):
                    s = Sampler(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p, min_keep=min_keep)
                    ids, probs = s.candidates(logits)
                    want_ids, want_probs = _reference_candidates(s, logits)
                    assert np.array_equal(ids, want_ids), (top_k, top_p, min_p, min_keep)
                    assert np.allclose(probs, want_probs, rtol=1e-12, atol=0)


def _vocabularies(n: int) -> dict[str, np.ndarray]:
    """Logits whose top is anywhere: random, sorted either way, few distinct values (ties at every boundary),
    masks leaving fewer than k tokens, NaNs."""
    rng = np.random.default_rng(7)
    x = (rng.normal(size=n) * 3).astype(np.float32)
    masked = np.full(n, -np.inf, np.float32)
    masked[rng.integers(0, n, 30)] = x[:30]
    nans = x.copy()
    nans[rng.integers(0, n, 50)] = np.nan
    nans[:5] = np.nan
    return {"random": x, "ascending": np.sort(x), "descending": np.sort(x)[::-1].copy(),
            "ties": np.round(x).astype(np.float32), "masked": masked, "nans": nans,
            "top at the end": np.concatenate([x[: n - 100] - 50, x[n - 100:]]).astype(np.float32)}


@pytest.mark.parametrize("n", [49152, 5000, 300])
def test_sorted_ids_equal_a_stable_sort_of_the_whole_vocabulary(n: int) -> None:
    """The k highest logits' ids, highest first, ties by id, NaNs last, as np.argsort(-logits, kind="stable")
    gives them; never a token at -inf where fewer than k are above it (k below the vocabulary: the whole
    vocabulary is all of it)."""
    for name, logits in _vocabularies(n).items():
        full = np.argsort(-logits, kind="stable")
        for k in (1, 40, 300, 4000):
            want = full[:k]
            if k < n and np.count_nonzero(logits > -np.inf) < k:
                want = full[logits[full] > -np.inf][:k]
            got = _sorted_ids(logits, k)
            assert np.array_equal(got, want), (name, n, k)
