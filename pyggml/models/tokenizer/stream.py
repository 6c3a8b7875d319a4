"""Streamed detokenization: text out as tokens come in, a character's bytes kept until complete; the pieces
joined equal `Tokenizer.decode` of all the ids."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyggml.models.tokenizer.core import Tokenizer


class StreamDecoder:
    """Incremental `Tokenizer.decode`: ``add(id)`` returns the text that became complete."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # SentencePiece: the leading space of the first text piece is the encoder's prefix
        self._strip_space = tokenizer.vocab_type == "spm" and tokenizer.add_space_prefix
        self._first = True

    def add(self, token: int) -> str:
        """The text completed by one more token ("" while a character is still incomplete)."""
        tok = self.tokenizer
        piece = tok.token_to_bytes(token, special=self.special)
        if self._first:
            if tok.vocab_type == "spm" and token == tok.bos_id and not piece:
                return ""  # the space to drop is the one after BOS
            self._first = False
            if self._strip_space and piece[:1] == b" ":
                piece = piece[1:]
        return self._utf8.decode(piece)

    def add_many(self, tokens: list[int]) -> str:
        return "".join(self.add(t) for t in tokens)

    def flush(self) -> str:
        """What is left at the end: an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
