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


# Each family's tokenizer and its suite above: qwen3moe uses qwen2's; smollm3 llama-bpe's (Llama 3's);
# Mixtral, granite, granitemoe (their published files: refact, as Granite Code's) and the tiny checkpoints of
# llama-spm's; gpt-oss (o200k, pre "gpt-4o"), olmo2 (dolma2, pre "dbrx") and gemma2 (Gemma's SentencePiece)
# have no vocab file in llama.cpp: gpt-4o's pre-tokenizer is checked below against llama-tokenize instead.
GPT4O_EXTRA = ("getElementById XMLHttpRequest iPhone McDonald's", "DON'T you're ÉCOLE école\n/path/to/\n\n")


def test_gpt4o_pre_tokenizer_follows_llamacpp(models_dir: Path, tmp_path: Path) -> None:
    """Llama 3's vocabulary under pre "gpt-4o" (gpt-oss's o200k split: cased words cut apart, digits in threes,
    "/" kept with newlines): every suite input and a few cased ones tokenize as llama-tokenize does."""
    import subprocess

    from pyggml.gguf.writer import write_gguf
    from pyggml.testing import llamacpp

    tool = llamacpp.require_tools(["llama-tokenize"])["llama-tokenize"]
    src = models_dir / "ggml-vocab-llama-bpe.gguf"
    gf = read_gguf(src)
    meta = {k: gf.get(k) for k in gf.keys() if not k.startswith("GGUF.") and k != "general.architecture"}
    write_gguf(tmp_path / "gpt4o.gguf", str(gf.get("general.architecture")), {**meta, "tokenizer.ggml.pre": "gpt-4o"},
               {})
    tok, llama3 = Tokenizer.from_gguf(read_gguf(tmp_path / "gpt4o.gguf")), Tokenizer.from_gguf(gf)
    texts = [text for text, _ in read_cases(src) if text] + list(GPT4O_EXTRA)
    for text in texts:
        r = subprocess.run([str(tool), "-m", str(tmp_path / "gpt4o.gguf"), "-p", text, "--ids", "--log-disable",
                            "--no-bos", "--no-parse-special"], capture_output=True, text=True, check=True)
        want = [int(t) for t in r.stdout.strip().splitlines()[-1].strip("[]").split(",")]
        assert tok.encode(text, add_special=False, parse_special=False) == want, text
    # the split is in effect: Llama 3's own pre-tokenizer gives other tokens for some of these texts
    assert any(tok.encode(t, add_special=False, parse_special=False)
               != llama3.encode(t, add_special=False, parse_special=False) for t in texts)
