"""Tokenizers from a GGUF file's `tokenizer.ggml.*` metadata, tokenizing as llama.cpp does.

Two vocab types, chosen by `tokenizer.ggml.model`:

- ``llama``: SentencePiece-style (llama.cpp's ``llm_tokenizer_spm``). Spaces are escaped to U+2581
  and a space is put in front; the text is split into UTF-8 characters, and adjacent symbols are
  merged best-score-first (a priority queue of bigrams whose concatenation is a token); a symbol
  left without a token is re-split along the merges that built it, and a single character without
  a token becomes its UTF-8 bytes as ``<0xXX>`` byte tokens (byte fallback), or UNK when the vocab
  has no byte tokens.
- ``gpt2``: byte-level BPE (llama.cpp's ``llm_tokenizer_bpe``). The text is cut into words by
  GPT-2's pre-tokenizer regex, each word's UTF-8 bytes are mapped to printable characters
  (GPT-2's ``bytes_to_unicode``), and adjacent symbols are merged lowest-merge-rank-first.

    tok = Tokenizer.from_gguf(read_gguf("model.gguf"))
    ids = tok.encode("Hello world")          # [bos, ...]
    text = tok.decode(ids)                   # "Hello world"
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.models.metadata import ModelFileError, field_type

log = logging.getLogger("pyggml.models.tokenizer")

# llama_token_type (llama.h), the values of tokenizer.ggml.token_type
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

SPACE_ESCAPE = "\u2581"  # "▁", SentencePiece's visible space
UNKNOWN_PIECE = "\u2585".encode()  # "▅", what llama.cpp prints for an UNK token

# GPT-2's pre-tokenizer (the same pattern as HF tokenizers' ByteLevel with use_regex=True)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_PREFIX = "tokenizer.ggml."
_INTS = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
_EMPTY = "ARRAY (empty)"
# the GGUF types llama.cpp reads each key as (integers of any width, float arrays of either width), and the
# name an error gives the expected type; special token ids (*_token_id) are integers
_KEY_TYPES: dict[str, tuple[frozenset[str], str]] = {
    "model": (frozenset({"STRING"}), "STRING"),
    "pre": (frozenset({"STRING"}), "STRING"),
    "tokens": (frozenset({"ARRAY of STRING", _EMPTY}), "ARRAY of STRING"),
    "merges": (frozenset({"ARRAY of STRING", _EMPTY}), "ARRAY of STRING"),
    "scores": (frozenset({"ARRAY of FLOAT32", "ARRAY of FLOAT64", _EMPTY}), "ARRAY of FLOAT32"),
    "token_type": (frozenset({f"ARRAY of {t}" for t in _INTS} | {_EMPTY}), "ARRAY of INT32"),
    "add_bos_token": (frozenset({"BOOL"}), "BOOL"),
    "add_eos_token": (frozenset({"BOOL"}), "BOOL"),
    "add_space_prefix": (frozenset({"BOOL"}), "BOOL"),
}
_ID_TYPES = (frozenset(_INTS), "an integer type (UINT32)")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the
    other 68 bytes to U+0100 onwards, so every byte string becomes a string without spaces or
    control characters (merges are stored as "left right")."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}
_BYTE_TRANSLATE = [BYTE_ENCODER[b] for b in range(256)]


def _field_value(field: Any) -> Any:
    """The Python value of a gguf ReaderField (strings decoded, arrays as lists)."""
    if hasattr(field, "contents"):
        return field.contents()
    # older gguf packages: decode parts/data/types by hand
    import gguf

    types = list(field.types)
    if not types:
        return None
    main = types[0]

    def to_str(a: object) -> str:
        return bytes(a).decode("utf-8")  # type: ignore[call-overload]

    if main == gguf.GGUFValueType.ARRAY:
        if types[-1] == gguf.GGUFValueType.STRING:
            return [to_str(field.parts[i]) for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if main == gguf.GGUFValueType.STRING:
        return to_str(field.parts[-1])
    return field.parts[-1].tolist()[0]


class Tokenizer:
    """A llama.cpp vocab: `tokens`, `scores`, `token_types`, BPE `merges` and the special ids.

    Build it with `from_gguf(reader)` or `from_gguf_fields({key: value})`.
    """

    def __init__(self, model: str, tokens: Sequence[str], scores: Sequence[float] | None = None,
                 token_types: Sequence[int] | None = None, merges: Sequence[str] | None = None,
                 bos_id: int | None = None, eos_id: int | None = None, unk_id: int | None = None,
                 pad_id: int | None = None, add_bos_token: bool | None = None,
                 add_space_prefix: bool = True) -> None:
        if model == "llama":
            self.vocab_type = "spm"
        elif model == "gpt2":
            self.vocab_type = "bpe"
        else:
            raise GGUFError(f"unknown tokenizer model '{model}' (tokenizer.ggml.model); pyggml knows 'llama' "
                            f"(SentencePiece) and 'gpt2' (BPE)")
        self.model = model
        self.tokens: list[str] = [str(t) for t in tokens]
        n = len(self.tokens)
        if n == 0:
            raise GGUFError("tokenizer.ggml.tokens is empty")
        if scores is not None and len(scores) != n:
            raise GGUFError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        if token_types is not None and len(token_types) != n:
            raise GGUFError(f"tokenizer.ggml.token_type has {len(token_types)} entries for {n} tokens")
        # llama.cpp keeps scores as float32: merge order ties are decided on those values
        self.scores: list[float] = (np.asarray(scores, dtype=np.float32).tolist() if scores is not None
                                    else [0.0] * n)
        self.token_types: list[int] = ([int(t) for t in token_types] if token_types is not None
                                       else [TOKEN_TYPE_NORMAL] * n)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}  # duplicates: last wins

        # special ids; llama.cpp's defaults when a key is absent
        if self.vocab_type == "spm":
            defaults = {"bos": 1, "eos": 2, "unk": 0, "pad": None}
        else:
            defaults = {"bos": 11, "eos": 11, "unk": None, "pad": None}
        given = {"bos": bos_id, "eos": eos_id, "unk": unk_id, "pad": pad_id}
        ids: dict[str, int | None] = {}
        for name, value in given.items():
            if value is None or int(value) == -1:
                value = defaults[name]
            if value is not None and not 0 <= int(value) < n:
                log.warning("bad special token: tokenizer.ggml.%s_token_id = %d is out of the vocabulary "
                            "(n_vocab %d), using %s", name, int(value), n, defaults[name])
                value = defaults[name]
                if value is not None and value >= n:
                    value = None
            ids[name] = None if value is None else int(value)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = ids["bos"], ids["eos"], ids["unk"], ids["pad"]
        # llama_should_add_bos_token: the file's flag, else SentencePiece vocabs add BOS and BPE ones do not
        self.add_bos_token = bool(add_bos_token) if add_bos_token is not None else self.vocab_type == "spm"
        self.add_space_prefix = bool(add_space_prefix)

        if self.vocab_type == "spm":
            # the <0xXX> byte tokens of byte fallback; None where the vocab lacks one
            self._byte_ids: list[int | None] = [self.token_to_id.get(f"<0x{b:02X}>") for b in range(256)]
            self._spm_unk_runs = self.unk_id is not None and any(b is None for b in self._byte_ids)
            # every two characters that stand side by side in some token: text is cut elsewhere
            self._spm_pairs: set[str] = {t[k: k + 2] for t in self.token_to_id for k in range(len(t) - 1)}
            self._spm_cache: dict[str, list[int]] = {}
        else:
            if merges is None:
                raise GGUFError("tokenizer.ggml.merges is missing: a 'gpt2' (BPE) vocab needs its merges")
            self.bpe_ranks: dict[tuple[str, str], int] = {}
            for rank, m in enumerate(merges):
                m = str(m)
                pos = m.find(" ", 1)  # as llama.cpp: the first space after the first character
                if pos < 0:
                    raise GGUFError(f"tokenizer.ggml.merges[{rank}] = {m!r} is not 'left right'")
                self.bpe_ranks[(m[:pos], m[pos + 1:])] = rank
            import regex

            self._pretokenizer = regex.compile(GPT2_PATTERN)
            self._bpe_cache: dict[str, list[int]] = {}
        self._pieces: list[bytes] = [self._piece_bytes(i) for i in range(n)]

    # --- construction from GGUF ---

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """A tokenizer from GGUF metadata values keyed by name ("tokenizer.ggml.tokens", ...)."""
        def get(key: str, default: Any = None) -> Any:
            return fields.get(_PREFIX + key, default)

        model = get("model")
        if model is None:
            raise GGUFError("tokenizer.ggml.model is missing: the file has no tokenizer")
        tokens = get("tokens")
        if tokens is None:
            raise GGUFError("tokenizer.ggml.tokens is missing")
        return cls(str(model), list(tokens), scores=get("scores"), token_types=get("token_type"),
                   merges=get("merges"), bos_id=get("bos_token_id"), eos_id=get("eos_token_id"),
                   unk_id=get("unknown_token_id"), pad_id=get("padding_token_id"),
                   add_bos_token=get("add_bos_token"), add_space_prefix=bool(get("add_space_prefix", True)))

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """A tokenizer from a GGUF reader: pyggml's `GGUFFile` or a `gguf.GGUFReader` (anything with
        `fields`, a mapping of key -> ReaderField)."""
        fields = getattr(reader, "fields", None)
        if fields is None:
            raise TypeError(f"{type(reader).__name__} has no 'fields': pass a GGUFFile or a gguf.GGUFReader")
        values: dict[str, Any] = {}
        for key, field in fields.items():
            if key.startswith(_PREFIX):
                name = key[len(_PREFIX):]
                rule = _KEY_TYPES.get(name) or (_ID_TYPES if name.endswith("_token_id") else None)
                found = field_type(field)  # None from a reader without per-field types: nothing to check
                if rule is not None and found is not None and found not in rule[0]:
                    name = getattr(reader, "name", None)  # a GGUFFile's file name
                    where = f"'{name}': " if isinstance(name, str) else ""
                    raise ModelFileError(f"{where}metadata key '{key}' has GGUF type {found}, expected {rule[1]}")
                try:
                    values[key] = _field_value(field)
                except Exception as e:
                    raise GGUFError(f"metadata key '{key}' cannot be read: {e}") from None
        return cls.from_gguf_fields(values)

    # --- vocab ---

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def _check_id(self, token: int) -> int:
        t = int(token)
        if not 0 <= t < len(self.tokens):
            raise ArgumentError(f"token id {t} is out of the vocabulary (n_vocab {len(self.tokens)})")
        return t

    def _piece_bytes(self, token: int) -> bytes:
        """llama_token_to_piece: the bytes one token stands for."""
        text = self.tokens[token]
        ttype = self.token_types[token]
        if ttype == TOKEN_TYPE_NORMAL:
            if self.vocab_type == "spm":
                return text.replace(SPACE_ESCAPE, " ").encode("utf-8")
            # llama_decode_text: each character back to its byte (characters outside the table as UTF-8)
            return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode("utf-8") for c in text)
        if ttype == TOKEN_TYPE_USER_DEFINED:
            return text.encode("utf-8")
        if ttype == TOKEN_TYPE_BYTE:
            if self.vocab_type == "spm" and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                return bytes([int(text[3:5], 16)])
            return bytes([BYTE_DECODER[text]]) if text in BYTE_DECODER else text.encode("utf-8")
        if ttype == TOKEN_TYPE_UNKNOWN:
            return UNKNOWN_PIECE
        return b""  # CONTROL, UNUSED, UNDEFINED print nothing

    def token_to_bytes(self, token: int) -> bytes:
        """The bytes of one token (a byte-fallback token is one byte of a UTF-8 character: join the
        bytes of several tokens before decoding when streaming)."""
        return self._pieces[self._check_id(token)]

    def token_to_piece(self, token: int) -> str:
        """The text of one token (llama_token_to_piece); a lone byte token shows as U+FFFD."""
        return self.token_to_bytes(token).decode("utf-8", errors="replace")

    # --- encode ---

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text` (llama_tokenize with special=False).

        BOS goes first when `add_bos` and the vocab adds BOS (`add_bos_token`: the file's
        tokenizer.ggml.add_bos_token, else True for SentencePiece and False for BPE vocabs).
        """
        out: list[int] = []
        if add_bos and self.add_bos_token and self.bos_id is not None:
            out.append(self.bos_id)
        if not text:
            return out
        if self.vocab_type == "spm":
            if self.add_space_prefix:
                text = " " + text
            self._spm_tokenize(text.replace(" ", SPACE_ESCAPE), out)
        else:
            self._bpe_tokenize(text, out)
        return out

    def _spm_tokenize(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm::tokenize, run on independent pieces of `text`.

        Cut between two characters that no token has side by side, no merge can join the two
        sides: each side's merges only ever look at that side, in the same relative order
        (score, then position). The pieces (words, mostly, for SentencePiece vocabs) are encoded
        on their own and cached, which gives the ids of encoding the whole text at once.
        """
        pairs = self._spm_pairs
        cache = self._spm_cache
        segment = self._spm_segment
        collapse = self._spm_unk_runs
        unk_id = self.unk_id
        base = len(out)
        start = 0
        n = len(text)
        for i in range(1, n + 1):
            if i < n and text[i - 1: i + 1] in pairs:
                continue
            piece = text[start:i]
            start = i
            ids = cache.get(piece)
            if ids is None:
                ids = segment(piece)
                if len(cache) < 100_000:
                    cache[piece] = ids
            if collapse and ids and ids[0] == unk_id and len(out) > base and out[-1] == unk_id:
                out.extend(ids[1:])  # a run of unknown characters is one UNK
            else:
                out.extend(ids)

    def _spm_segment(self, text: str) -> list[int]:
        """llm_tokenizer_spm::tokenize of one piece. Symbol i starts at character i (a UTF-8
        character of llama.cpp's split) and covers n[i] characters; a symbol merged into its left
        neighbour has n = 0."""
        token_to_id = self.token_to_id
        scores = self.scores
        n_sym = len(text)
        n = [1] * n_sym
        prev = list(range(-1, n_sym - 1))
        nxt = list(range(1, n_sym + 1))
        nxt[-1] = -1
        # work queue of bigrams, best first: highest score, then leftmost (llm_bigram_spm::comparator)
        work: list[tuple[float, int, int, int]] = []
        push = heapq.heappush
        for left in range(n_sym - 1):
            tid = token_to_id.get(text[left: left + 2])
            if tid is not None:
                push(work, (-scores[tid], left, left + 1, 2))
        while work:
            _, left, right, size = heapq.heappop(work)
            # one of the symbols already got merged: skip
            if n[left] == 0 or n[right] == 0 or n[left] + n[right] != size:
                continue
            n[left] = size
            n[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            # try_add_bigram(prev, left) and try_add_bigram(left, next)
            before = prev[left]
            if before >= 0:
                tid = token_to_id.get(text[before: left + size])
                if tid is not None:
                    push(work, (-scores[tid], before, left, left + size - before))
            if after >= 0:
                tid = token_to_id.get(text[left: after + n[after]])
                if tid is not None:
                    push(work, (-scores[tid], left, after, size + n[after]))

        # resegment: every merged symbol is a token (merges only make tokens), so llama.cpp's
        # rev_merge split never applies here; a lone character without a token falls back to bytes
        out: list[int] = []
        byte_ids = self._byte_ids
        unk_id = self.unk_id
        i = 0
        while i != -1:
            piece = text[i: i + n[i]]
            tid = token_to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                raw = piece.encode("utf-8", errors="surrogatepass")
                ids = [byte_ids[b] for b in raw]
                if all(t is not None for t in ids):
                    out.extend(ids)  # type: ignore[arg-type]
                elif unk_id is not None:
                    # a vocab without byte tokens: UNK, one for a run of unknown characters as
                    # SentencePiece does (llama.cpp has no rule here: it throws)
                    if not out or out[-1] != unk_id:
                        out.append(unk_id)
                else:
                    raise ArgumentError(f"cannot tokenize {piece!r}: the vocab has neither its byte tokens "
                                        f"nor an unknown token")
            i = nxt[i]
        return out

    def _bpe_tokenize(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_bpe::tokenize: GPT-2 pre-tokenizer words, each merged on its own."""
        cache = self._bpe_cache
        for word in self._pretokenizer.findall(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word)
                if len(cache) < 100_000:
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        mapped = "".join([_BYTE_TRANSLATE[b] for b in word.encode("utf-8", errors="surrogatepass")])
        token_to_id = self.token_to_id
        ranks = self.bpe_ranks
        syms = list(mapped)
        n_sym = len(syms)
        if n_sym > 1:
            prev = list(range(-1, n_sym - 1))
            nxt = list(range(1, n_sym + 1))
            nxt[-1] = -1
            # bigrams, best first: lowest rank, then leftmost (llm_bigram_bpe::comparator)
            work: list[tuple[int, int, int, str]] = []
            push = heapq.heappush
            for i in range(1, n_sym):
                rank = ranks.get((syms[i - 1], syms[i]))
                if rank is not None:
                    push(work, (rank, i - 1, i, syms[i - 1] + syms[i]))
            while work:
                _, left, right, merged = heapq.heappop(work)
                if not syms[left] or not syms[right] or syms[left] + syms[right] != merged:
                    continue  # outdated bigram
                syms[left] = merged
                syms[right] = ""
                after = nxt[right]
                nxt[left] = after
                if after >= 0:
                    prev[after] = left
                # add_new_bigram(prev, left) and add_new_bigram(left, next)
                before = prev[left]
                if before >= 0:
                    rank = ranks.get((syms[before], merged))
                    if rank is not None:
                        push(work, (rank, before, left, syms[before] + merged))
                if after >= 0:
                    rank = ranks.get((merged, syms[after]))
                    if rank is not None:
                        push(work, (rank, left, after, merged + syms[after]))
        out: list[int] = []
        for s in syms:
            if not s:
                continue
            tid = token_to_id.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for c in s:  # a symbol without a token: its characters (bytes) one by one
                cid = token_to_id.get(c)
                if cid is None:
                    if self.unk_id is None:
                        raise ArgumentError(f"cannot tokenize {word!r}: byte {BYTE_DECODER[c]:#04x} ({c!r}) is not "
                                            f"in the vocab and it has no unknown token")
                    cid = self.unk_id
                out.append(cid)
        return out

    # --- decode ---

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids` joined; for SentencePiece vocabs the leading space of the first token
        after BOS (or of the first token, without BOS) is dropped, as llama_detokenize_spm does:
        it is the space the encoder put in front."""
        ids = [self._check_id(t) for t in ids]
        pieces = [self._pieces[t] for t in ids]
        if self.vocab_type == "spm" and self.add_space_prefix and ids:
            first = 1 if ids[0] == self.bos_id else 0
            if first < len(pieces) and pieces[first][:1] == b" ":
                pieces[first] = pieces[first][1:]
        return b"".join(pieces)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` (invalid UTF-8 from byte tokens becomes U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, unk_id={self.unk_id})")
