"""The Tokenizer: a GGUF file's `tokenizer.ggml.*` vocab as llama.cpp's llama-vocab.cpp reads and applies it.

`tokenizer.ggml.model` chooses SentencePiece-style ("llama", `spm`) or byte-level BPE ("gpt2", `bpe`, after the
pre-tokenizer `pretokenize`); special tokens are cut out first (`special.partition`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.models.metadata import ModelFileError, field_type
from pyggml.models.tokenizer.bpe import bpe_merge
from pyggml.models.tokenizer.pretokenize import PreTokenizer, pre_tokenizer
from pyggml.models.tokenizer.special import Fragment, partition
from pyggml.models.tokenizer.spm import spm_byte_ids, spm_segment
from pyggml.models.tokenizer.stream import StreamDecoder
from pyggml.models.tokenizer.vocab import (
    ALWAYS_USER_DEFINED,
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    AUTO_SPECIAL_TEXTS,
    BYTE_DECODER,
    BYTE_TRANSLATE,
    EOG_TEXTS,
    ID_TYPES,
    KEY_TYPES,
    PREFIX,
    SPACE_ESCAPE,
    TOKEN_TYPE_NORMAL,
    TYPE_TO_ATTR,
    field_value,
)

log = logging.getLogger("pyggml.models.tokenizer")

_NOT_IN_UTF8 = frozenset((0xC0, 0xC1, *range(0xF5, 0x100)))
_CACHE_LIMIT = 100_000  # words (BPE) or pieces (SPM) remembered with their ids


class Tokenizer:
    """A llama.cpp vocab (llama_vocab), built by `from_gguf` or `from_gguf_fields`."""

    def __init__(self, model: str, tokens: Sequence[str], scores: Sequence[float] | None = None,
                 token_types: Sequence[int] | None = None, merges: Sequence[str] | None = None,
                 bos_id: int | None = None, eos_id: int | None = None, unk_id: int | None = None,
                 pad_id: int | None = None, add_bos_token: bool | None = None,
                 add_space_prefix: bool | None = None, *, add_eos_token: bool | None = None,
                 pre: str | None = None, name: str | None = None,
                 special_ids: Mapping[str, int] | None = None) -> None:
        if model == "llama":
            self.vocab_type = "spm"
        elif model in ("gpt2", "gemma4"):
            self.vocab_type = "bpe"
            if model == "gemma4":
                pre = "gemma4"  # llama.cpp: the model implies its pre-tokenizer
        else:
            raise GGUFError(f"unknown tokenizer model '{model}' (tokenizer.ggml.model); pyggml knows 'llama' "
                            f"(SentencePiece), 'gpt2' (BPE) and 'gemma4' (SentencePiece-style BPE)")
        self.model = model
        # llama.cpp names an empty token "[EMPTY_<id>]" so that every text maps back to one id
        self.tokens: list[str] = [str(t) or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
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
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}

        self.pre: PreTokenizer | None = None
        if self.vocab_type == "bpe":
            self.pre = pre_tokenizer(pre)
            default_add_bos, self.clean_spaces, self.add_space_prefix = self.pre.add_bos, self.pre.clean_spaces, False
        else:
            default_add_bos, self.clean_spaces, self.add_space_prefix = True, False, True
        if add_space_prefix is not None:
            self.add_space_prefix = bool(add_space_prefix)
        # llama_vocab::get_add_bos/get_add_eos: the file's flags, else the vocab type's defaults
        self.add_bos_token = bool(add_bos_token) if add_bos_token is not None else default_add_bos
        if self.pre is not None and self.pre.kind == "gemma4":
            self.add_bos_token = True  # llama.cpp's Gemma 4 workaround: BOS whatever the file says
        self.add_eos_token = bool(add_eos_token) if add_eos_token is not None else False

        if self.vocab_type == "spm":
            defaults = {"bos": 1, "eos": 2, "unk": 0, "pad": None}
        elif model == "gemma4":
            defaults = {"bos": None, "eos": None, "unk": None, "pad": None}
        else:
            defaults = {"bos": 11, "eos": 11, "unk": None, "pad": None}
        given = {"bos": bos_id, "eos": eos_id, "unk": unk_id, "pad": pad_id}
        ids: dict[str, int | None] = {}
        for key, value in given.items():
            if value is None or int(value) == -1:
                value = defaults[key]
            if value is not None and not 0 <= int(value) < n:
                log.warning("bad special token: tokenizer.ggml.%s_token_id = %d is out of the vocabulary "
                            "(n_vocab %d), using %s", key, int(value), n, defaults[key])
                value = defaults[key]
                if value is not None and value >= n:
                    value = None
            ids[key] = None if value is None else int(value)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = ids["bos"], ids["eos"], ids["unk"], ids["pad"]

        self.special_ids: dict[str, int] = dict(special_ids or {})
        self.attrs: list[int] = self._attributes(name, self.special_ids)
        self._eog: frozenset[int] | None = None
        # longest text first, as tokenizer_st_partition
        self.special_tokens: list[tuple[int, str, int]] = sorted(
            ((i, self.tokens[i], self.attrs[i]) for i in range(n)
             if self.attrs[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)),
            key=lambda s: (-len(s[1].encode("utf-8")), s[0]))

        if self.vocab_type == "spm":
            self._byte_ids: list[int | None] = spm_byte_ids(self.token_to_id)
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
                self.bpe_ranks.setdefault((m[:pos], m[pos + 1:]), rank)  # std::map::emplace keeps the first
            self._bpe_cache: dict[str, list[int]] = {}
        # made on first use: a 256k vocab takes seconds to decode in full
        self._pieces: list[bytes | None] = [None] * n
        self._max_token_bytes: int | None = None
        self._dropped: re.Pattern[str] | None = None

    def _attributes(self, name: str | None, special_ids: dict[str, int]) -> list[int]:
        """Token attributes as llama_vocab::impl::load leaves them: the file's types, then its by-text fixes."""
        attrs = [TYPE_TO_ATTR.get(t, 0) for t in self.token_types]
        tid = self.token_to_id
        for key, texts in AUTO_SPECIAL_TEXTS.items():
            if key in special_ids:
                continue
            for i in sorted(tid[t] for t in texts if t in tid)[:1]:  # the first one llama.cpp meets
                attrs[i] |= ATTR_CONTROL
        for text in EOG_TEXTS:
            if text in tid:
                attrs[tid[text]] |= ATTR_CONTROL
        for text, i in tid.items():
            if attrs[i] & ATTR_CONTROL and "unused" in text:
                attrs[i] |= ATTR_UNUSED
            if text in ALWAYS_USER_DEFINED:
                attrs[i] = ATTR_USER_DEFINED
        lname = (name or "").lower()
        if "phi-3" in lname or "phi3" in lname:
            for i, a in enumerate(attrs):
                if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                    attrs[i] |= ATTR_RSTRIP
            if "</s>" in tid:
                attrs[tid["</s>"]] |= ATTR_RSTRIP
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                if text in tid:
                    attrs[tid[text]] &= ~ATTR_RSTRIP
        return attrs

    def _auto_special(self, key: str) -> int | None:
        """Special token `key` ("eot", ...): the file's id, else the first found by text as llama.cpp, else None."""
        if key in self.special_ids:
            return self.special_ids[key]
        tid = self.token_to_id
        found = sorted(tid[t] for t in AUTO_SPECIAL_TEXTS.get(key, ()) if t in tid)
        return found[0] if found else None

    @property
    def eog_ids(self) -> frozenset[int]:
        """The end-of-generation ids, as llama_vocab::impl::load builds special_eog_ids."""
        if self._eog is None:
            eog = {i for i in (self._auto_special(k) for k in ("fim_pad", "fim_rep", "fim_sep")) if i is not None}
            eog |= {self.token_to_id[t] for t in EOG_TEXTS if t in self.token_to_id}
            eog |= {i for i in (self.eos_id, self._auto_special("eot"), self._auto_special("eom")) if i is not None}
            texts = {self.tokens[i]: i for i in sorted(eog) if 0 <= i < self.n_vocab}
            has_call = "<|call|>" in texts or "<|calls|>" in texts
            if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
                eog.discard(texts["<|end|>"])
            if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
                eog.discard(texts["</s>"])
            self._eog = frozenset(eog)
        return self._eog

    def is_eog(self, token: int) -> bool:
        """llama_vocab_is_eog."""
        return int(token) in self.eog_ids

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """A tokenizer from GGUF metadata values keyed by name ("tokenizer.ggml.tokens", ...)."""
        def get(key: str, default: Any = None) -> Any:
            return fields.get(PREFIX + key, default)

        model = get("model")
        if model is None:
            raise GGUFError("tokenizer.ggml.model is missing: the file has no tokenizer")
        tokens = get("tokens")
        if tokens is None:
            raise GGUFError("tokenizer.ggml.tokens is missing")
        # an out-of-range id counts as absent, as in llama.cpp; prefix/suffix/middle are the FIM keys
        aliases = {"prefix": "fim_pre", "suffix": "fim_suf", "middle": "fim_mid"}
        special_ids: dict[str, int] = {}
        for k, v in fields.items():
            if k.startswith(PREFIX) and k.endswith("_token_id") and v is not None and 0 <= int(v) < len(tokens):
                key = k[len(PREFIX):-len("_token_id")]
                special_ids[aliases.get(key, key)] = int(v)
        add_prefix = get("add_space_prefix")
        return cls(str(model), list(tokens), scores=get("scores"), token_types=get("token_type"),
                   merges=get("merges"), bos_id=get("bos_token_id"), eos_id=get("eos_token_id"),
                   unk_id=get("unknown_token_id"), pad_id=get("padding_token_id"),
                   add_bos_token=get("add_bos_token"),
                   add_space_prefix=None if add_prefix is None else bool(add_prefix),
                   add_eos_token=get("add_eos_token"), pre=get("pre"), name=fields.get("general.name"),
                   special_ids=special_ids)

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """A tokenizer from pyggml's `GGUFFile` or a `gguf.GGUFReader`."""
        fields = getattr(reader, "fields", None)
        if fields is None:
            raise TypeError(f"{type(reader).__name__} has no 'fields': pass a GGUFFile or a gguf.GGUFReader")
        values: dict[str, Any] = {}
        for key, field in fields.items():
            if key.startswith(PREFIX) or key == "general.name":
                name = key[len(PREFIX):]
                rule = KEY_TYPES.get(name) or (ID_TYPES if name.endswith("_token_id") else None)
                found = field_type(field)
                if key.startswith(PREFIX) and rule is not None and found is not None and found not in rule[0]:
                    fname = getattr(reader, "name", None)
                    where = f"'{fname}': " if isinstance(fname, str) else ""
                    raise ModelFileError(f"{where}metadata key '{key}' has GGUF type {found}, expected {rule[1]}")
                try:
                    values[key] = field_value(field)
                except Exception as e:
                    raise GGUFError(f"metadata key '{key}' cannot be read: {e}") from None
        return cls.from_gguf_fields(values)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def _check_id(self, token: int) -> int:
        t = int(token)
        if not 0 <= t < len(self.tokens):
            raise ArgumentError(f"token id {t} is out of the vocabulary (n_vocab {len(self.tokens)})")
        return t

    def _piece_bytes(self, token: int) -> bytes:
        """llama_token_to_piece with special=True: the bytes one token stands for."""
        text = self.tokens[token]
        attr = self.attrs[token]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.vocab_type == "spm" or (self.pre is not None and self.pre.escape_whitespaces):
                return text.replace(SPACE_ESCAPE, " ").encode("utf-8")
            # llama_decode_text: each character back to its byte (characters outside the table as UTF-8)
            return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode("utf-8") for c in text)
        if attr & ATTR_BYTE:
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                return bytes([int(text[3:5], 16)])
            return bytes([BYTE_DECODER[text]]) if text in BYTE_DECODER else text.encode("utf-8")
        return b""  # UNUSED, UNDEFINED print nothing

    def is_special(self, token: int) -> bool:
        return bool(self.attrs[self._check_id(token)] & (ATTR_CONTROL | ATTR_UNKNOWN))

    def token_to_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (control and unknown tokens b"" unless `special`)."""
        t = self._check_id(token)
        if not special and self.attrs[t] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        piece = self._pieces[t]
        if piece is None:
            piece = self._pieces[t] = self._piece_bytes(t)
        return piece

    def token_to_piece(self, token: int, special: bool = False) -> str:
        """The text of one token (llama_token_to_piece); a lone byte token shows as U+FFFD."""
        return self.token_to_bytes(token, special).decode("utf-8", errors="replace")

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False, *,
               add_bos: bool | None = None, space_prefix: bool = True) -> list[int]:
        """llama_tokenize; `parse_special`: control tokens in the text become their ids (user-defined ones always)."""
        if add_bos is not None:
            add_special = add_bos
        return self.encode_parts([(text, parse_special)], add_special, space_prefix=space_prefix)

    def encode_parts(self, parts: Sequence[tuple[str, bool]], add_special: bool = True, *,
                     space_prefix: bool = True) -> list[int]:
        """`encode` of the parts' texts joined, each (text, parse_special) part parsing special tokens or not."""
        out: list[int] = []
        add_bos_now = add_special and self.add_bos_token and self.bos_id is not None
        if add_bos_now:
            out.append(self.bos_id)  # type: ignore[arg-type]
        fragments = _joined(partition(text, self.special_tokens, parse) for text, parse in parts if text)
        if self.vocab_type == "spm":
            prev_special = space_prefix  # the prefix space goes first and after each special token
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._spm_tokenize(frag.replace(" ", SPACE_ESCAPE), out)
                prev_special = False
        else:
            escape = self.pre is not None and self.pre.escape_whitespaces
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._bpe_tokenize(frag.replace(" ", SPACE_ESCAPE) if escape else frag, out)
        if add_bos_now and len(out) >= 2 and out[1] == self.bos_id:
            log.warning("the text starts with BOS and the vocab adds one too: the prompt now starts with 2 BOS")
        if add_special and self.add_eos_token and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def special_text_in(self, text: str) -> str | None:
        """The text of the first control or unknown token (longest first) in `text`, or None."""
        for _, tok_text, attr in self.special_tokens:
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN) and tok_text in text:
                return tok_text
        return None

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of `text` from its UTF-8 size, to refuse a prompt before tokenizing it."""
        limit = self.max_token_bytes
        if not limit:
            return 0
        n = len(text.encode("utf-8", errors="surrogatepass"))
        if self._dropped is not None:
            n -= self._dropped.subn("", text)[1]
        return -(-n // limit)

    @property
    def max_token_bytes(self) -> int:
        """The most text bytes one token stands for (0: see `min_tokens`)."""
        if self._max_token_bytes is None:
            self._dropped, self._max_token_bytes = self._text_bytes_per_token()
        return self._max_token_bytes

    def _text_bytes_per_token(self) -> tuple[re.Pattern[str] | None, int]:
        if any(attr & (ATTR_LSTRIP | ATTR_RSTRIP) for _, _, attr in self.special_tokens):
            return None, 0  # the whitespace they eat becomes no token
        byte_table = self.pre is not None and self.pre.byte_encode
        dropped = None
        if self.vocab_type == "spm":
            covered = all(b is not None for b in self._byte_ids)
        elif byte_table:
            # a GPT-2 table character with no token is dropped; a merge must give a token
            missing = [b for b, c in enumerate(BYTE_TRANSLATE) if c not in self.token_to_id]
            ranges = [_utf8_lead_range(b) for b in missing if b not in _NOT_IN_UTF8]
            covered = (all(r is not None for r in ranges)
                       and all(a + b in self.token_to_id for a, b in self.bpe_ranks))
            if covered and ranges:
                dropped = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges) + "]")
        else:
            covered = all(f"<0x{b:02X}>" in self.token_to_id for b in range(256))
        if not covered:
            return None, 0
        most = 1
        for text, attr in zip(self.tokens, self.attrs, strict=True):
            if attr & ATTR_BYTE:
                continue
            if byte_table and attr & ATTR_NORMAL:
                n = sum(1 if c in BYTE_DECODER else len(c.encode("utf-8")) for c in text)
            else:  # "▁" counts its 3 bytes: it stands for a space or for itself
                n = len(text.encode("utf-8"))
            most = max(most, n)
        return dropped, most

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.encode(text, add_special, parse_special)

    def _spm_tokenize(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm::tokenize on pieces cut where no token spans the cut (no merge can cross it), each
        cached: the same ids as the whole text at once."""
        pairs = self._spm_pairs
        cache = self._spm_cache
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
                ids = self._spm_segment(piece)
                if len(cache) < _CACHE_LIMIT:
                    cache[piece] = ids
            if collapse and ids and ids[0] == unk_id and len(out) > base and out[-1] == unk_id:
                out.extend(ids[1:])  # a run of unknown characters is one UNK
            else:
                out.extend(ids)

    def _spm_segment(self, text: str) -> list[int]:
        return spm_segment(text, self.token_to_id, self.scores, self._byte_ids, self.unk_id)

    def _bpe_tokenize(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_bpe::tokenize: pre-tokenizer words, each merged on its own (and cached)."""
        cache = self._bpe_cache
        assert self.pre is not None
        for word in self.pre.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word)
                if len(cache) < _CACHE_LIMIT:
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        pre = self.pre
        assert pre is not None
        token_to_id = self.token_to_id
        if pre.byte_encode:
            mapped = "".join([BYTE_TRANSLATE[b] for b in word.encode("utf-8", errors="surrogatepass")])
        else:
            mapped = word
        if (pre.ignore_merges or (pre.kind == "gemma4" and not mapped.strip("\n"))) and mapped in token_to_id:
            return [token_to_id[mapped]]  # Gemma 4: a newline run that is a token is taken whole
        out: list[int] = []
        for s in bpe_merge(mapped, self.bpe_ranks):
            tid = token_to_id.get(s)
            if tid is not None:
                out.append(tid)
                continue
            # a symbol without a token: its UTF-8 bytes looked up one by one, those without a token dropped
            for b in s.encode("utf-8", errors="surrogatepass"):
                if pre.byte_encode:
                    bid = token_to_id.get(chr(b)) if b < 0x80 else None
                else:
                    bid = token_to_id.get(f"<0x{b:02X}>")
                if bid is not None:
                    out.append(bid)
        return out

    def decode_bytes(self, ids: Iterable[int], special: bool = False, clean_spaces: bool | None = None) -> bytes:
        """The bytes of `ids` as llama_detokenize joins them (SentencePiece's prefix space dropped)."""
        ids = [self._check_id(t) for t in ids]
        pieces = [self.token_to_bytes(t, special) for t in ids]
        if self.vocab_type == "spm" and self.add_space_prefix and ids:
            first = 1 if ids[0] == self.bos_id else 0
            if first < len(pieces) and pieces[first][:1] == b" ":
                pieces[first] = pieces[first][1:]
        text = b"".join(pieces)
        if self.clean_spaces if clean_spaces is None else clean_spaces:
            text = _clean_spaces(text)
        return text

    def decode(self, ids: Iterable[int], special: bool = False, clean_spaces: bool | None = None) -> str:
        """The text of `ids` (llama_detokenize; invalid UTF-8 from byte tokens becomes U+FFFD)."""
        return self.decode_bytes(ids, special, clean_spaces).decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        """An incremental decoder whose text never splits a character."""
        return StreamDecoder(self, special)

    def __repr__(self) -> str:
        pre = f", pre={self.pre.name!r}" if self.pre is not None else ""
        return (f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, unk_id={self.unk_id})")


def _utf8_lead_range(b: int) -> tuple[int, int] | None:
    """The code points whose UTF-8 form starts with byte `b` (None for a continuation byte)."""
    if b < 0x80:
        return b, b
    if 0xC2 <= b <= 0xDF:
        return (b & 0x1F) << 6, ((b & 0x1F) << 6) | 0x3F
    if 0xE0 <= b <= 0xEF:  # E0 starts U+0800 and up only (shorter forms are overlong)
        return max((b & 0x0F) << 12, 0x800), ((b & 0x0F) << 12) | 0xFFF
    if 0xF0 <= b <= 0xF4:
        return max((b & 0x07) << 18, 0x10000), min(((b & 0x07) << 18) | 0x3FFFF, 0x10FFFF)
    return None


def _joined(partitions: Iterable[list[Fragment]]) -> list[Fragment]:
    """Consecutive partitions' fragments with neighbouring raw texts joined."""
    out: list[Fragment] = []
    for fragments in partitions:
        for frag in fragments:
            if isinstance(frag, str) and out and isinstance(out[-1], str):
                out[-1] += frag
            else:
                out.append(frag)
    return out


def _clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's clean_spaces passes."""
    if not text:
        return text
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    t = bytearray(out)
    out = bytearray(t[:1])
    i = 1
    while i < len(t):  # a lone apostrophe between spaces: " ' " -> "'"
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            out.append(x)
            t[i + 1] = 0  # llama.cpp blanks the skipped space in place: the next test sees NUL, not " "
            i += 2
            continue
        out.append(x)
        i += 1
    t = bytes(out)
    out = bytearray(t[:1])
    for i in range(1, len(t)):  # contractions: " 's", " 'm", " 're", " 've" lose the space
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < len(t) and t[i + 1: i + 3] in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return bytes(out)
