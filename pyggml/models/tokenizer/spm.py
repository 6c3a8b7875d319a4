"""SentencePiece-style merging, best score first (llama.cpp's `llm_tokenizer_spm_session`), with byte fallback."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from pyggml.core.errors import ArgumentError


def spm_segment(text: str, token_to_id: Mapping[str, int], scores: Sequence[float],
                byte_ids: Sequence[int | None], unk_id: int | None) -> list[int]:
    """The ids of one piece of text; symbol i covers n[i] characters (0: merged into its left neighbour)."""
    n_sym = len(text)
    if n_sym == 0:
        return []
    n = [1] * n_sym
    prev = list(range(-1, n_sym - 1))
    nxt = list(range(1, n_sym + 1))
    nxt[-1] = -1
    # work queue of bigrams, best first: highest score, then leftmost (llm_bigram_spm::comparator)
    work: list[tuple[float, int, int, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    for left in range(n_sym - 1):
        tid = token_to_id.get(text[left: left + 2])
        if tid is not None:
            push(work, (-scores[tid], left, left + 1, 2))
    while work:
        _, left, right, size = pop(work)
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

    # every merged symbol is a token, so llama.cpp's rev_merge split never applies here
    out: list[int] = []
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


def spm_byte_ids(token_to_id: Mapping[str, int]) -> list[int | None]:
    """llama_vocab::byte_to_token for SentencePiece vocabs: ``<0xXX>``, else the byte itself as a
    token (ASCII only: a lone byte >= 0x80 is no text); None where the vocab has neither."""
    out: list[int | None] = []
    for b in range(256):
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = token_to_id.get(chr(b))
        out.append(tid)
    return out
