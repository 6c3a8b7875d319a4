"""A vocab's data as llama.cpp reads it: token types, per-token attributes, GPT-2's byte table and
the `tokenizer.ggml.*` GGUF keys with the types llama.cpp accepts for them."""

from __future__ import annotations

from typing import Any

# llama_token_type (llama.h), the values of tokenizer.ggml.token_type
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# llama_token_attr (llama.h): what llama.cpp works with once the file is read
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

TYPE_TO_ATTR = {
    TOKEN_TYPE_UNDEFINED: ATTR_UNDEFINED,
    TOKEN_TYPE_NORMAL: ATTR_NORMAL,
    TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
    TOKEN_TYPE_CONTROL: ATTR_CONTROL,
    TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TOKEN_TYPE_UNUSED: ATTR_UNUSED,
    TOKEN_TYPE_BYTE: ATTR_BYTE,
}

SPACE_ESCAPE = "\u2581"  # "▁", SentencePiece's visible space

# Token texts llama.cpp marks CONTROL whatever the file says (llama_vocab::impl::load): the end-of-generation
# tokens, each of them, and the first EOT/EOM/FIM token found when the file names none.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# key suffix of the id in the file -> the texts llama.cpp looks for when the key is absent
AUTO_SPECIAL_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# gpt-oss: llama.cpp always renders these
ALWAYS_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


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
BYTE_TRANSLATE = [BYTE_ENCODER[b] for b in range(256)]

PREFIX = "tokenizer.ggml."
_INTS = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
_EMPTY = "ARRAY (empty)"
# the GGUF types llama.cpp reads each key as (integers of any width, float arrays of either width), and the
# name an error gives the expected type; special token ids (*_token_id) are integers
KEY_TYPES: dict[str, tuple[frozenset[str], str]] = {
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
ID_TYPES = (frozenset(_INTS), "an integer type (UINT32)")


def field_value(field: Any) -> Any:
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
