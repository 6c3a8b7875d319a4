"""Tokenizers from a GGUF file's `tokenizer.ggml.*` metadata, tokenizing as llama.cpp's llama-vocab.cpp does."""

from pyggml.models.tokenizer.core import Tokenizer
from pyggml.models.tokenizer.pretokenize import (
    GPT2,
    PreTokenizer,
    UnknownPreTokenizerError,
    known_pre_tokenizers,
    pre_tokenizer,
)
from pyggml.models.tokenizer.stream import StreamDecoder
from pyggml.models.tokenizer.vocab import (
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    BYTE_DECODER,
    BYTE_ENCODER,
    SPACE_ESCAPE,
    TOKEN_TYPE_BYTE,
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNDEFINED,
    TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    bytes_to_unicode,
)

GPT2_PATTERN = GPT2  # an alias

__all__ = [
    "ATTR_CONTROL",
    "ATTR_NORMAL",
    "ATTR_UNKNOWN",
    "ATTR_USER_DEFINED",
    "BYTE_DECODER",
    "BYTE_ENCODER",
    "GPT2_PATTERN",
    "SPACE_ESCAPE",
    "TOKEN_TYPE_BYTE",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_UNDEFINED",
    "TOKEN_TYPE_UNKNOWN",
    "TOKEN_TYPE_UNUSED",
    "TOKEN_TYPE_USER_DEFINED",
    "PreTokenizer",
    "StreamDecoder",
    "Tokenizer",
    "UnknownPreTokenizerError",
    "bytes_to_unicode",
    "known_pre_tokenizers",
    "pre_tokenizer",
]
