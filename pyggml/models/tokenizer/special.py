"""Special tokens cut out of text before pre-tokenizing (llama.cpp's `tokenizer_st_partition`); without
``parse_special`` only USER_DEFINED ones are, as HF tokenizers treat added tokens."""

from __future__ import annotations

from collections.abc import Sequence

from pyggml.models.tokenizer.vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN

Fragment = str | int  # raw text, or a token id already decided
_C_SPACE = " \t\n\v\f\r"  # C isspace(), what llama.cpp strips next to an LSTRIP/RSTRIP token


def partition(text: str, specials: Sequence[tuple[int, str, int]], parse_special: bool) -> list[Fragment]:
    """`text` cut into raw-text pieces and special-token ids; `specials` longest text first, ties by id."""
    fragments: list[Fragment] = [text] if text else []
    skip = ATTR_CONTROL | ATTR_UNKNOWN
    for tid, tok_text, attr in specials:
        if not parse_special and attr & skip:
            continue
        # a quick whole-text test first: most special tokens occur nowhere
        if not any(isinstance(f, str) and tok_text in f for f in fragments):
            continue
        out: list[Fragment] = []
        for frag in fragments:
            if not isinstance(frag, str) or tok_text not in frag:
                out.append(frag)
                continue
            rest = frag
            while True:
                pos = rest.find(tok_text)
                if pos < 0:
                    if rest:
                        out.append(rest)
                    break
                left = rest[:pos]
                if attr & ATTR_LSTRIP:
                    left = left.rstrip(_C_SPACE)
                if left:
                    out.append(left)
                out.append(tid)
                rest = rest[pos + len(tok_text):]
                if attr & ATTR_RSTRIP:
                    rest = rest.lstrip(_C_SPACE)
        fragments = out
    return fragments
