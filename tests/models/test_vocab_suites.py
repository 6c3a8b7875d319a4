"""llama.cpp's own tokenizer test suites: each models/ggml-vocab-<name>.gguf of the llama.cpp source
(commit 0c1e570, from the llama-cpp-python sdist) with its .inp texts and the .out ids HF tokenizers
gave (tests/test-tokenizer-0.cpp: no BOS/EOS, special tokens not parsed). Every case must match."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyggml.gguf.reader import read_gguf
from pyggml.models.tokenizer import Tokenizer

SEPARATOR = "\n__ggml_vocab_test__\n"
# name -> number of cases; SentencePiece (llama-spm, phi-3), byte-level BPE with each pre-tokenizer
# family, and Gemma 4's SentencePiece-style BPE. bert-bge (WordPiece) is not supported.
SUITES = {
    "llama-spm": 46, "phi-3": 46, "llama-bpe": 46, "qwen2": 46, "qwen35": 50, "gpt-2": 46, "mpt": 46,
    "starcoder": 46, "refact": 46, "command-r": 46, "falcon": 46, "deepseek-llm": 46, "deepseek-coder": 46,
    "gemma-4": 46,
}


@pytest.fixture(scope="module")
def models_dir(llamacpp_models: Path) -> Path:
    return llamacpp_models


def read_cases(vocab: Path) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0.cpp's reading: inputs split at the marker line (the file ends with one), one
    line of ids per input. Bytes are decoded as they are: "\\r\\n" in an input is part of it."""
    raw = Path(f"{vocab}.inp").read_bytes().decode("utf-8")
    inputs = raw.split(SEPARATOR)
    if inputs and inputs[-1] == "":
        inputs.pop()
    lines = Path(f"{vocab}.out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, lines, strict=True)]


@pytest.mark.parametrize("name", sorted(SUITES))
def test_vocab_suite(models_dir: Path, name: str) -> None:
    vocab = models_dir / f"ggml-vocab-{name}.gguf"
    tok = Tokenizer.from_gguf(read_gguf(vocab))
    cases = read_cases(vocab)
    assert len(cases) == SUITES[name]
    failed = [(text, tok.encode(text, add_special=False, parse_special=False), want) for text, want in cases
              if tok.encode(text, add_special=False, parse_special=False) != want]
    report = "\n".join(f"{text!r}: got {got}, want {want}" for text, got, want in failed[:5])
    assert not failed, f"{len(failed)} of {len(cases)} cases differ:\n{report}"
