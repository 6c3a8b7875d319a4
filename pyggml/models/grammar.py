"""Constrained decoding: a grammar (GBNF, a JSON schema, any JSON object) as a mask over a vocabulary's tokens.

Built on llguidance (the library llama.cpp's `LLAMA_LLGUIDANCE` build uses): a `Grammar` is compiled for one
`Tokenizer`, and each sequence that decodes under it has its own `GrammarMatcher`, which gives the tokens allowed
next (`allowed`) and follows the tokens taken (`accept`). The `Sampler` applies the mask before it samples, so a
batch may hold constrained and unconstrained sequences side by side.

    grammar = Grammar.from_gbnf(tokenizer, 'root ::= "yes" | "no"')
    sampler = Sampler(temperature=0, grammar=grammar.matcher())

The end-of-generation tokens are the grammar's end: allowed once the text is complete, the only tokens allowed
once nothing can follow (`done`). Control tokens never match grammar text. Needs the `llguidance` package
(the `serve` extra).
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import numpy as np

from pyggml.core.errors import GGMLError
from pyggml.models.tokenizer import ATTR_USER_DEFINED, Tokenizer

# JSON as json.dumps writes it: one space after ',' and ':', none elsewhere. A model may not pad its answer
# with whitespace until max_tokens (llguidance's flexible whitespace allows any amount).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
SPECIAL_PREFIX = b"\xff"  # llguidance's mark of a special token: no text matches it (never valid UTF-8)


class GrammarError(GGMLError, ValueError):
    """A grammar or JSON schema that does not compile, or a token the grammar does not allow."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarError("constrained decoding needs the llguidance package (pip install 'pyggml[serve]')") from None
    return llguidance


_vocabs: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()
_vocabs_lock = threading.Lock()


def _vocab(tokenizer: Tokenizer) -> Any:
    """llguidance's view of `tokenizer` (an LLTokenizer), built once per tokenizer (~0.3 s for 49k tokens)."""
    with _vocabs_lock:
        found = _vocabs.get(tokenizer)
        if found is None:
            found = _vocabs[tokenizer] = _build_vocab(tokenizer)
        return found


class _Encoder:
    """The tokenizer as llguidance calls it (for the text a grammar forces): bytes in, token ids out."""

    def __init__(self, tokenizer: Tokenizer, pieces: list[bytes], special: list[int]) -> None:
        self.tokenizer = weakref.ref(tokenizer)  # the vocab cache's value must not keep its key alive
        self.tokens = pieces
        self.special_token_ids = special
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: bytes | str) -> list[int]:
        tokenizer = self.tokenizer()
        if tokenizer is None:
            return []
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")  # llguidance passes whole UTF-8 characters
        return tokenizer.encode(text, add_special=False, space_prefix=False)  # the text goes on the answer's


def _build_vocab(tokenizer: Tokenizer) -> Any:
    llg = _llguidance()
    pieces, special = [], []
    for i in range(tokenizer.n_vocab):
        piece = tokenizer.token_to_bytes(i, special=True)
        if _grammar_special(tokenizer, i):
            piece = SPECIAL_PREFIX + piece
            special.append(i)
        pieces.append(piece)
    eog = sorted(tokenizer.eog_ids)
    try:
        return llg.LLTokenizer(llg.TokenizerWrapper(_Encoder(tokenizer, pieces, special)),
                               eos_token=eog or None)
    except (ValueError, RuntimeError) as e:
        raise GrammarError(f"llguidance cannot take this vocabulary ({tokenizer.n_vocab} tokens): {e}") from None


class Grammar:
    """A grammar compiled for `tokenizer`'s vocabulary; `matcher()` starts a sequence under it. `what` names the
    grammar in errors ("grammar", "response_format", "--json-schema")."""

    def __init__(self, tokenizer: Tokenizer, spec: str, what: str = "grammar") -> None:
        self.tokenizer = tokenizer
        self.spec = spec  # llguidance's grammar (JSON naming a Lark grammar or a JSON schema)
        self.what = what
        self.vocab = _vocab(tokenizer)
        error = _llguidance().LLMatcher.validate_grammar(spec, self.vocab)
        if error:
            raise GrammarError(f"{what}: {error}")

    @classmethod
    def from_gbnf(cls, tokenizer: Tokenizer, text: str, what: str = "grammar") -> Grammar:
        """llama.cpp's GBNF (its grammars/ folder's syntax; the start rule is `root`)."""
        if not isinstance(text, str) or not text.strip():
            raise GrammarError(f"{what}: the grammar is empty")
        try:
            spec = _llguidance().grammar_from("gbnf", text)
        except ValueError as e:
            raise GrammarError(f"{what}: {e}") from None
        return cls(tokenizer, spec, what)

    @classmethod
    def from_json_schema(cls, tokenizer: Tokenizer, schema: dict[str, Any] | bool | str,
                         what: str = "json_schema") -> Grammar:
        """JSON text valid under `schema` (a JSON Schema, as an object or its JSON text), written as json.dumps
        writes it. Keywords llguidance does not implement are errors, not ignored."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"{what}: the schema is not JSON: {e}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError(f"{what}: a JSON schema is an object (or true/false), got {type(schema).__name__}")
        try:
            spec = _llguidance().LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        except ValueError as e:
            raise GrammarError(f"{what}: {e}") from None
        return cls(tokenizer, spec, what)

    @classmethod
    def from_lark(cls, tokenizer: Tokenizer, text: str, what: str = "grammar") -> Grammar:
        """llguidance's Lark syntax (`start` the start rule; `%json {schema}` for JSON inside, `<[id]>` for a
        special token: `lark_literal` writes text with the vocab's special tokens in it)."""
        try:
            spec = _llguidance().LLMatcher.grammar_from_lark(text)
        except ValueError as e:
            raise GrammarError(f"{what}: {e}") from None
        return cls(tokenizer, spec, what)

    @classmethod
    def json_object(cls, tokenizer: Tokenizer, what: str = "response_format") -> Grammar:
        """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
        return cls.from_json_schema(tokenizer, {"type": "object"}, what)

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)

    def __repr__(self) -> str:
        return f"Grammar({self.what}, n_vocab={self.tokenizer.n_vocab})"


def _grammar_special(tokenizer: Tokenizer, token: int) -> bool:
    """Whether grammars see `token` as a special token, as llguidance's llama.cpp adapter: control tokens, and
    user-defined ones that look like them ("<tool_call>"); no text matches them."""
    if tokenizer.is_special(token):
        return True
    piece = tokenizer.token_to_bytes(token, special=True)
    return bool(tokenizer.attrs[token] & ATTR_USER_DEFINED) and piece.startswith(b"<") and piece.endswith(b">")


def lark_literal(tokenizer: Tokenizer, text: str) -> str:
    """`text` as a Lark expression for `tokenizer`'s grammars: its special tokens ("<|im_start|>", a Qwen vocab's
    "<tool_call>") as their ids (`<[151657]>`: their text would never match them), the rest as strings."""
    out: list[str] = []
    plain = b""
    for t in tokenizer.encode(text, add_special=False, parse_special=True, space_prefix=False):
        if _grammar_special(tokenizer, t):
            if plain:
                out.append(json.dumps(plain.decode("utf-8", errors="replace")))
                plain = b""
            out.append(f"<[{t}]>")
        else:
            plain += tokenizer.token_to_bytes(t, special=True)
    if plain:
        out.append(json.dumps(plain.decode("utf-8", errors="replace")))
    return " ".join(out) if out else '""'


def lark_json(schema: dict[str, Any] | bool) -> str:
    """`schema` as a Lark `%json` expression, its JSON written as json.dumps writes it (`JSON_OPTIONS`)."""
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": JSON_OPTIONS}
    elif schema is True:
        schema = {"x-guidance": JSON_OPTIONS}
    return "%json " + json.dumps(schema)


class GrammarMatcher:
    """One sequence's place in a grammar: the tokens allowed next, and the tokens taken so far."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._m = _llguidance().LLMatcher(grammar.vocab, grammar.spec, log_level=0)
        self._check()
        self._words = np.zeros((grammar.tokenizer.n_vocab + 31) // 32, dtype=np.int32)

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(f"{self.grammar.what}: {self._m.get_error()}")

    def allowed(self, n_vocab: int) -> np.ndarray:
        """Which of `n_vocab` token ids (a logits row's width; ids past the tokenizer's are never allowed) may
        come next: a bool array."""
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)  # without the GIL
        self._check()
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little").view(np.bool_)
        n = self.grammar.tokenizer.n_vocab
        if n_vocab <= n:
            return bits[:n_vocab]
        return np.concatenate([bits[:n], np.zeros(n_vocab - n, np.bool_)])

    def accept(self, token: int) -> None:
        """Follow `token` (the one sampled); GrammarError if the grammar does not allow it (the matcher stays
        where it was)."""
        t = int(token)
        if t in self.grammar.tokenizer.eog_ids and self._m.is_accepting():
            self._m.consume_token(t)  # the end, where the text may end
        elif self._m.try_consume_tokens([t]) != 1:  # no error state: a refused token leaves it usable
            raise GrammarError(f"{self.grammar.what}: token {t} ({self.grammar.tokenizer.token_to_bytes(t, True)!r}) "
                               f"is not allowed here")

    @property
    def done(self) -> bool:
        """Nothing can follow the text so far (only an end-of-generation token is allowed)."""
        return bool(self._m.is_stopped())

    @property
    def accepting(self) -> bool:
        """The text so far is a whole sentence of the grammar (it may end here)."""
        return bool(self._m.is_accepting())

    def reset(self) -> None:
        """Back to the start (a new sequence)."""
        self._m.reset()
        self._check()
