"""Streamed detokenization: text out as tokens come in, never a UTF-8 character cut in two.

A character can be spread over several tokens (byte-fallback ``<0xE6><0x97><0xA5>`` or a byte-level
BPE token ending mid-character): the decoder keeps the incomplete bytes until the rest arrives.
SentencePiece's prefix space is dropped from the first piece, as `Tokenizer.decode` does, so the
concatenated output equals `decode` of all the ids.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyggml.models.tokenizer.core import Tokenizer


class StreamDecoder:
    """Incremental `Tokenizer.decode`: ``add(id)`` returns the text that became complete.

        dec = tok.stream_decoder()
        for t in generated:
            print(dec.add(t), end="", flush=True)
        print(dec.flush())
    """

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
        """The text completed by several tokens."""
        return "".join(self.add(t) for t in tokens)

    def flush(self) -> str:
        """What is left at the end: an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
