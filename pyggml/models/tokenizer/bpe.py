"""Byte-level BPE merging of one word (llama.cpp's `llm_tokenizer_bpe_session`).

A word's UTF-8 bytes, mapped to GPT-2's printable characters, are split into characters and
adjacent symbols merged lowest-merge-rank-first (then leftmost).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping


def bpe_merge(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """The symbols `word` merges into."""
    syms = list(word)
    n_sym = len(syms)
    if n_sym < 2:
        return syms
    prev = list(range(-1, n_sym - 1))
    nxt = list(range(1, n_sym + 1))
    nxt[-1] = -1
    # bigrams, best first: lowest rank, then leftmost (llm_bigram_bpe::comparator)
    work: list[tuple[int, int, int, str]] = []
    push = heapq.heappush
    pop = heapq.heappop
    for i in range(1, n_sym):
        rank = ranks.get((syms[i - 1], syms[i]))
        if rank is not None:
            push(work, (rank, i - 1, i, syms[i - 1] + syms[i]))
    while work:
        _, left, right, merged = pop(work)
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
    return [s for s in syms if s]
