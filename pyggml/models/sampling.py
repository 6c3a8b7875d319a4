"""`Sampler`: the next token from a row of logits, in llama.cpp's order (common/sampling.cpp).

1. logit bias (llama_sampler_init_logit_bias: added to the token's logit; -inf bans it),
2. repetition penalty over the last `repeat_last_n` tokens of the history
   (llama_sample_repetition_penalties: a positive logit is divided by the penalty, a negative one
   multiplied, so a penalty > 1 always makes the token less likely; then the frequency and presence
   penalties are subtracted),
3. the grammar's mask: the tokens it does not allow next are -inf (`pyggml.models.grammar`),
4. temperature <= 0: greedy, the argmax of what steps 1-3 left (`distribution`),
5. else top-k, top-p, min-p, temperature (sampler_queue's default order), then one draw from the
   softmax of what is left, with a numpy Generator (seeded: the same seed gives the same tokens).

    sampler = Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42)
    tok = sampler.sample(logits, history)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError


def _softmax(logits: np.ndarray) -> np.ndarray:
    """llama_sample_softmax's probabilities (max subtracted for range)."""
    e = np.exp(logits - logits.max())
    return e / e.sum()


HEAD_FIRST = 256  # the first head of the vocabulary sorted for top-p / min-p without top-k (then 8 times as long)
HEAD_SAMPLE = 4096  # the logits whose k-th largest bounds the vocabulary's from below (at least 16 k)


def _sorted_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k highest logits, highest first, ties by id: np.argsort(-logits, kind="stable")[:k],
    without sorting the rest; fewer than k where fewer are above -inf (banned or masked)."""
    n = logits.shape[0]
    if k >= n:
        return np.argsort(-logits, kind="stable")
    if k <= 0:
        return np.zeros(0, np.int64)
    ids = _ids_above_a_bound(logits, k)
    if ids is None:
        kth = np.partition(logits, n - k)[n - k]  # the k-th largest
        if kth == -np.inf:  # fewer than k tokens left by a mask or a ban: those, never the banned ones
            ids = np.flatnonzero(logits > -np.inf)
        else:
            ids = np.flatnonzero(logits >= kth)  # ties with it included, in id order for the stable sort
            if len(ids) < k:  # NaN logits (never >=): the full sort puts them last
                return np.argsort(-logits, kind="stable")[:k]
    return ids[np.argsort(-logits[ids], kind="stable")][:k]


def _ids_above_a_bound(logits: np.ndarray, k: int) -> np.ndarray | None:
    """The ids (in id order) of the logits at or above the k-th largest of the first HEAD_SAMPLE (at least 16 k):
    a bound on the k-th largest of all from below, found without partitioning the whole vocabulary; None when the
    head is the vocabulary, its bound is -inf or NaN, or too many logits pass it."""
    n = logits.shape[0]
    m = max(HEAD_SAMPLE, 16 * k)
    if m >= n:
        return None
    bound = np.partition(logits[:m], m - k)[m - k]
    if not bound > -np.inf:
        return None
    ids = np.flatnonzero(logits >= bound)
    return ids if k <= len(ids) <= n // 4 else None


class Sampler:
    """Sampling parameters with llama.cpp's names and defaults, and the random generator they draw with.

    temperature: <= 0 means greedy; top_k: 0 keeps every token; top_p: 1.0 disables;
    min_p: 0.0 disables; repeat_penalty: 1.0 disables; repeat_last_n: 0 disables, -1 uses the
    whole history; frequency_penalty/presence_penalty: 0.0 disables; min_keep: the candidates
    top-k/top-p/min-p always keep; logit_bias: {token id: bias} added to the logits (-inf bans a token);
    grammar: a sequence's `GrammarMatcher` (pyggml.models.grammar), or anything with its `allowed(n_vocab)`,
    `accept(token)` and `reset()`: only the tokens it allows are sampled, and `sample` tells it each one.
    """

    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 repeat_penalty: float = 1.1, repeat_last_n: int = 64, seed: int | None = None, *,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, min_keep: int = 1,
                 logit_bias: Mapping[int, float] | None = None, grammar: Any = None) -> None:
        self.temperature = _float_arg("temperature", temperature)
        self.top_k = _int_arg("top_k", top_k, 0)
        self.top_p = _float_arg("top_p", top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ArgumentError(f"top_p must be in (0, 1], got {top_p}")
        self.min_p = _float_arg("min_p", min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ArgumentError(f"min_p must be in [0, 1], got {min_p}")
        self.repeat_penalty = _float_arg("repeat_penalty", repeat_penalty)
        if self.repeat_penalty <= 0.0:
            raise ArgumentError(f"repeat_penalty must be > 0, got {repeat_penalty}")
        self.repeat_last_n = _int_arg("repeat_last_n", repeat_last_n, -1)
        self.frequency_penalty = _float_arg("frequency_penalty", frequency_penalty)
        self.presence_penalty = _float_arg("presence_penalty", presence_penalty)
        self.min_keep = _int_arg("min_keep", min_keep, 1)
        if seed is not None:
            seed = _int_arg("seed", seed, 0)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.bias_ids, self.bias_values = _bias_arrays(logit_bias or {})
        self.grammar = grammar

    def reset(self, seed: int | None = None) -> None:
        """Restart the random generator (from `seed`, else from the sampler's own seed)."""
        if seed is not None:
            self.seed = _int_arg("seed", seed, 0)
        self.rng = np.random.default_rng(self.seed)

    # --- steps ---

    def apply_penalties(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """llama_sample_repetition_penalties over the last `repeat_last_n` tokens (a new array)."""
        logits = np.array(logits, dtype=np.float32, copy=True)
        last_n = len(history) if self.repeat_last_n == -1 else min(self.repeat_last_n, len(history))
        if last_n == 0 or (self.repeat_penalty == 1.0 and self.frequency_penalty == 0.0
                           and self.presence_penalty == 0.0):
            return logits
        recent = np.asarray(history[len(history) - last_n:], dtype=np.int64)
        n_vocab = logits.shape[0]
        if recent.min() < 0 or recent.max() >= n_vocab:
            bad = int(recent[(recent < 0) | (recent >= n_vocab)][0])
            raise ArgumentError(f"history token id {bad} is out of the vocabulary (n_vocab {n_vocab})")
        ids, counts = np.unique(recent, return_counts=True)
        sel = logits[ids]
        sel = np.where(sel <= 0, sel * np.float32(self.repeat_penalty), sel / np.float32(self.repeat_penalty))
        sel = sel - (counts.astype(np.float32) * np.float32(self.frequency_penalty)
                     + np.float32(self.presence_penalty))
        logits[ids] = sel.astype(np.float32)
        return logits

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token ids left after top-k, top-p and min-p, and their probabilities after temperature
        (sorted by logit, highest first, ties by id), from penalized logits; the distribution `sample` draws
        from."""
        n_vocab = logits.shape[0]
        min_keep = self.min_keep
        # llama_sample_top_k: sort descending and keep k (0: all); at least min_keep
        k = n_vocab if self.top_k <= 0 else self.top_k
        k = min(max(k, min_keep), n_vocab)
        if k < n_vocab or (self.top_p >= 1.0 and self.min_p <= 0.0):
            ids = _sorted_ids(logits, k)
            cur = logits[ids].astype(np.float64)
            total = np.exp(cur - cur[0]).sum() if len(cur) else 1.0
        else:
            # every token is a candidate, but top-p or min-p keeps a head of them: sort a head long enough for
            # both to cut inside it (sorting the whole vocabulary is a sizeable share of a decode step)
            ids, cur, total = self._head(logits)
        # llama_sample_top_p: the smallest head whose probability sum reaches p
        if self.top_p < 1.0:
            cum = np.cumsum(np.exp(cur - cur[0]) / total)
            reach = np.nonzero((cum >= self.top_p) & (np.arange(1, len(cum) + 1) >= min_keep))[0]
            last = int(reach[0]) + 1 if reach.size else len(cum)
            ids, cur = ids[:last], cur[:last]
        # llama_sample_min_p: drop tokens less likely than min_p times the most likely one
        if self.min_p > 0.0 and len(cur):
            drop = np.nonzero(~self._min_p_keeps(cur))[0]
            last = int(drop[0]) if drop.size else len(cur)  # the candidates are sorted: cut at the first drop
            ids, cur = ids[:last], cur[:last]
        # llama_sample_temp
        cur = cur / self.temperature
        return ids, _softmax(cur)

    def _min_p_keeps(self, cur: np.ndarray) -> np.ndarray:
        """Which of the sorted logits `cur` min-p keeps (at least min_keep, and the first)."""
        probs = _softmax(cur)
        keep = (probs >= self.min_p * probs[0]) | (np.arange(len(probs)) < self.min_keep)
        keep[0] = True
        return keep

    def _head(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """The sorted head of all the logits that top-p and min-p cut inside (the whole vocabulary if they do
        not), its float64 logits and the softmax's sum over the whole vocabulary (relative to the head's
        first), so that top-p sees every token's probability."""
        n_vocab = logits.shape[0]
        wide = logits.astype(np.float64)
        top = wide.max()
        total = float(np.exp(wide - top).sum())
        m = max(HEAD_FIRST, self.min_keep)
        while True:
            ids = _sorted_ids(logits, min(m, n_vocab))
            cur = wide[ids]
            if len(ids) == n_vocab or len(ids) < m:
                return ids, cur, total  # the whole vocabulary, or every token a mask or a ban left
            if self.top_p < 1.0 and len(ids) >= self.min_keep and np.exp(cur - top).sum() / total >= self.top_p:
                return ids, cur, total  # top-p cuts inside
            if self.min_p > 0.0 and not self._min_p_keeps(cur)[-1]:
                return ids, cur, total  # min-p cuts inside: it drops the head's last token and all after it
            m *= 8

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The logits the next token is drawn from (a new float32 array): `logits` (n_vocab,) with the logit
        bias, the penalties of `history` and the grammar's mask (-inf) applied, before top-k, top-p, min-p
        and temperature. Their log-softmax is what llama-server reports as the token's probabilities."""
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.shape[0] == 0:
            raise ArgumentError(f"logits must be one row (n_vocab,), got shape {tuple(logits.shape)}")
        if self.bias_ids.size:
            if int(self.bias_ids[-1]) >= logits.shape[0]:
                raise ArgumentError(f"logit_bias names token id {int(self.bias_ids[-1])}, out of the vocabulary "
                                    f"(n_vocab {logits.shape[0]})")
            logits = logits.astype(np.float32, copy=True)
            logits[self.bias_ids] += self.bias_values
        cur = self.apply_penalties(logits, history)
        if self.grammar is not None:
            cur[~self.grammar.allowed(cur.shape[0])] = -np.inf
        return cur

    def pick(self, cur: np.ndarray) -> int:
        """The token drawn from `distribution`'s logits: their argmax when greedy, else one draw from what
        top-k, top-p and min-p keep, after temperature."""
        if self.temperature <= 0.0:
            return int(np.argmax(cur))  # llama_sample_token_greedy
        ids, probs = self.candidates(cur)
        # llama_sample_token: one draw from the distribution (inverse CDF of a uniform)
        cum = np.cumsum(probs)
        u = self.rng.random() * cum[-1]
        i = min(int(np.searchsorted(cum, u, side="right")), len(ids) - 1)
        return int(ids[i])

    def accept(self, token: int) -> None:
        """Tell the grammar (if any) the token taken."""
        if self.grammar is not None:
            self.grammar.accept(token)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id from `logits` (n_vocab,) given the tokens so far (`history`); the grammar
        follows it."""
        tok = self.pick(self.distribution(logits, history))
        self.accept(tok)
        return tok

    def __repr__(self) -> str:
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"min_p={self.min_p}, repeat_penalty={self.repeat_penalty}, repeat_last_n={self.repeat_last_n}, "
                f"seed={self.seed})")


def _bias_arrays(bias: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """The logit bias as sorted ids and their float32 biases (finite, or -inf: banned)."""
    ids = []
    for token, value in bias.items():
        ids.append(_int_arg("logit_bias token id", token, 0))
        v = float(value)
        if math.isnan(v) or v == math.inf:
            raise ArgumentError(f"logit_bias of token {token} must be a number or -inf, got {value!r}")
    order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
    values = np.asarray([float(v) for v in bias.values()], dtype=np.float32)
    return np.asarray(ids, dtype=np.int64)[order], values[order]


def _float_arg(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ArgumentError(f"{name} must be finite, got {value}")
    return v


def _int_arg(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentError(f"{name} must be an integer, got {value!r}")
    if int(value) < minimum:
        raise ArgumentError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
