"""BPE pre-tokenizers: the regexes `tokenizer.ggml.pre` names, applied as llama.cpp's `unicode_regex_split`
(each regex cuts the previous pieces into matches and the stretches between), run by the `regex` package,
which agrees with llama.cpp's matchers and std::regex on these patterns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import regex

from pyggml.core.errors import GGUFError

log = logging.getLogger("pyggml.models.tokenizer")


class UnknownPreTokenizerError(GGUFError):
    """`tokenizer.ggml.pre` names a pre-tokenizer pyggml does not have (llama.cpp's "unknown pre-tokenizer type")."""


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")

# pre-tokenizer type -> its regexes, in llama.cpp's order (llm_tokenizer_bpe's constructor)
REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (LLAMA3,),
    "gpt2": (GPT2,),
    "starcoder": (r"\p{N}", GPT2),
    "qwen2": (QWEN2,),
    "qwen35": (QWEN35,),
    # o200k (gpt-oss, Llama 4): llama.cpp's form of the file's regex, a letter "upper" unless a-z and "lower"
    # unless A-Z (so any other letter is both, as llama.cpp's collapsed categories make it)
    "gpt4o": (r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+" + _CONTRACTIONS + "?"
              r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*" + _CONTRACTIONS + "?"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    # llama.cpp writes these classes with literal characters; escaped here so that no editor or tool
    # normalizes them (U+2126 OHM SIGN is not U+03A9, and the ranges depend on it)
    "deepseek-llm": (
        r"[\r\n]",
        r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
        r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
        r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
        r"\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
        r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
        r"\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
        r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
        r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
        r"\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
        r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
        r"\U0001e900-\U0001e943]+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z",  # std::regex's "$" is the end of the piece only
        r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    "bloom": (r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    # SentencePiece-style BPE (Gemma 4): spaces are "▁" already, only newline runs are cut apart
    "gemma4": (r"[^\n]+|\n+",),
    "viking": (r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
}


@dataclass(frozen=True)
class PreTokenizer:
    """One named pre-tokenizer: its regexes and the vocab flags llama.cpp sets with it."""

    name: str
    kind: str  # the key of REGEXES
    clean_spaces: bool = True  # detokenize drops " " before ?!., and around apostrophes
    ignore_merges: bool = False  # a word that is a token is taken whole, without merging
    add_bos: bool = False  # the vocab adds BOS unless the file says otherwise
    escape_whitespaces: bool = False  # spaces become "▁" before splitting (and back when decoding)
    byte_encode: bool = True  # words go through GPT-2's byte table; else raw text with <0xXX> fallback
    patterns: tuple[regex.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    def split(self, text: str) -> list[str]:
        """The words of `text` (unicode_regex_split without the byte encoding)."""
        pieces = [text]
        for pat in self.patterns:
            out: list[str] = []
            for piece in pieces:
                start = 0
                for m in pat.finditer(piece):
                    a, b = m.span()
                    if a > start:
                        out.append(piece[start:a])  # the stretch no match covered stays a piece
                    if b > a:
                        out.append(piece[a:b])
                    start = b
                if start < len(piece):
                    out.append(piece[start:])
            pieces = out
        return pieces


# tokenizer.ggml.pre -> (type, clean_spaces, ignore_merges, add_bos), as llama_vocab::impl::load sets them
_NAMES: dict[str, tuple[str, bool, bool, bool]] = {
    "gemma4": ("gemma4", True, False, True),
    "granite-embed-multi-311m": ("gemma4", True, False, True),
    "default": ("default", True, False, False),
    **{n: ("llama3", True, True, True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                                   "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    "dbrx": ("llama3", True, False, False),
    "smaug-bpe": ("llama3", True, False, False),
    "deepseek-llm": ("deepseek-llm", False, False, False),
    "deepseek-coder": ("deepseek-coder", False, False, False),
    "falcon": ("falcon", True, False, False),
    **{n: ("gpt2", True, False, False) for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                                                 "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "exaone4",
                                                 "mpt", "olmo", "jais")},
    "trillion": ("gpt2", False, False, False),
    "granite-docling": ("gpt2", False, False, False),
    **{n: ("starcoder", True, False, False) for n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b",
                                                      "mellum2")},
    "command-r": ("starcoder", False, False, False),
    "smollm": ("starcoder", False, False, False),
    **{n: ("qwen2", False, False, False) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan",
                                                   "solar-open")},
    "stablelm2": ("qwen2", True, False, False),
    "megrez": ("qwen2", True, False, False),
    "qwen35": ("qwen35", False, False, False),
    **{n: ("gpt4o", False, False, False) for n in ("gpt-4o", "llama4", "kanana2", "talkie")},
    "poro-chat": ("bloom", False, False, False),
    "bloom": ("bloom", True, False, False),
    "gpt3-finnish": ("bloom", True, False, False),
    "viking": ("viking", False, False, False),
}

_COMPILED: dict[str, tuple[regex.Pattern[str], ...]] = {}


def known_pre_tokenizers() -> list[str]:
    """The `tokenizer.ggml.pre` names pyggml tokenizes."""
    return sorted(_NAMES)


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer `tokenizer.ggml.pre` names; no name is llama.cpp's "default" (with its warning)."""
    if name is None or name == "":
        log.warning("tokenizer.ggml.pre is missing: using the 'default' pre-tokenizer as llama.cpp does "
                    "(generation quality may suffer; re-convert the model)")
        name = "default"
    spec = _NAMES.get(name)
    if spec is None:
        raise UnknownPreTokenizerError(
            f"unknown pre-tokenizer '{name}' (tokenizer.ggml.pre): pyggml has {', '.join(known_pre_tokenizers())}")
    kind, clean_spaces, ignore_merges, add_bos = spec
    if kind not in _COMPILED:
        _COMPILED[kind] = tuple(regex.compile(p) for p in REGEXES[kind])
    sentencepiece_like = kind == "gemma4"
    return PreTokenizer(name, kind, clean_spaces, ignore_merges, add_bos, escape_whitespaces=sentencepiece_like,
                        byte_encode=not sentencepiece_like, patterns=_COMPILED[kind])
