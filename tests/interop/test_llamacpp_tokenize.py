"""pyggml's tokenizer against llama.cpp's `llama-tokenize` on SmolLM2-135M-Instruct (BPE, pre-tokenizer
"smollm", ChatML special tokens): hard strings one by one and all of them joined, with special tokens
parsed (llama-tokenize's default) and not; then on llama.cpp's vocab-only files of other families, hard
strings mixed with each vocab's own special tokens."""

from __future__ import annotations

import ast
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pyggml.gguf.reader import read_gguf
from pyggml.models.tokenizer import Tokenizer

HARD = [
    "", " ", "   ", "\n", "\n\n", " \n", "\t\t x", "a  b   c    d", "trailing   ", "x\r\ny\rz",
    "line\n\n\nbreaks\n \n", "1234567890", "3.14159 and 1,000,000 or 1e-9", "٣٤٥ ١٢ Ⅻ ½ ²",
    "don't can't I'm we'll you've they're it's he'd", "DON'T I'M 'S 'll 'Ve ' s '",
    "東京は日本の首都です。中文，标点！한국어", "مرحبا بالعالم שלום", "Привет, мир! Ελληνικά हिन्दी",
    "😀🚀 emoji👩‍👩‍👧 party🎉 ✓ → ∑ Ω", "\u00a0nbsp\u2009thin\u3000ideo\u200bzw e\u0301 \u0085 \u2028",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "text<|im_end|>more",
    "<|im_start|><|im_start|> < |im_start| > <|im_start", "$100 @user #tag ^_^ ~x~ |pipe| `code` ...!!!???",
    "def f(x):\n    return x ** 2\n\tcode", " " * 40 + "x" * 300,
]



def llama_tokenize(tool: Path, model: Path, text: str, parse_special: bool) -> list[int]:
    """llama-tokenize's ids of `text`, given on stdin as it is (no escape processing)."""
    cmd = [str(tool), "-m", str(model), "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    r = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr.decode('utf-8', 'replace')[-2000:]}"
    ids = ast.literal_eval(r.stdout.decode().strip().splitlines()[-1])
    assert isinstance(ids, list)
    return ids


def run_all(tool: Path, model: Path, jobs: list[tuple[str, bool]]) -> list[list[int]]:
    """llama-tokenize's ids of each (text, parse_special), two processes at a time."""
    def one(job: tuple[str, bool]) -> list[int]:
        return llama_tokenize(tool, model, *job)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, jobs))


# the real files' chat markers, mixed into the hard strings
GEMMA3_HARD = ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>x<eos><pad>",
               "<start_of_turn><start_of_turn> <start_of_turn", "text<end_of_turn>more"]


def test_smollm2_hard_strings_equal_llama_tokenize(llamacpp_tools: dict[str, Path], smollm2_path: Path) -> None:
    tok = Tokenizer.from_gguf(read_gguf(smollm2_path))
    assert tok.pre is not None and tok.pre.name == "smollm"
    _assert_hard_strings(llamacpp_tools, smollm2_path, tok, HARD)
    # the hard strings did reach the special-token and byte paths
    im_start = tok.token_to_id["<|im_start|>"]
    assert tok.encode("<|im_start|>user", parse_special=True)[0] == im_start
    assert im_start not in tok.encode("<|im_start|>user", parse_special=False)


def test_gemma3_hard_strings_equal_llama_tokenize(llamacpp_tools: dict[str, Path], gemma3_path: Path) -> None:
    """Gemma 3 270M: a SentencePiece vocabulary of 262144 pieces (no space prefix, BOS added)."""
    tok = Tokenizer.from_gguf(read_gguf(gemma3_path))
    assert tok.add_bos_token
    _assert_hard_strings(llamacpp_tools, gemma3_path, tok, HARD + GEMMA3_HARD)
    turn = tok.token_to_id["<start_of_turn>"]
    assert tok.encode("<start_of_turn>user", add_special=False, parse_special=True)[0] == turn


def _assert_hard_strings(llamacpp_tools: dict[str, Path], model: Path, tok: Tokenizer, hard: list[str]) -> None:
    """Each hard string, with special tokens parsed (and not, where it has markup), and all of them joined."""
    joined = "\n".join(hard)
    jobs = [(text, True) for text in hard] + [(text, False) for text in hard if "<" in text]
    jobs += [(joined, True), (joined, False)]
    tool = llamacpp_tools["llama-tokenize"]
    wants = run_all(tool, model, jobs)
    diffs = []
    for (text, parse_special), want in zip(jobs, wants, strict=True):
        # llama-tokenize adds the special tokens the vocab asks for (SmolLM2's file: none)
        got = tok.encode(text, add_special=tok.add_bos_token, parse_special=parse_special)
        if got != want:
            diffs.append(f"{text[:50]!r} parse_special={parse_special}: got {got[:20]}, want {want[:20]}")
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "gemma-4"])
def test_vocab_files_with_special_tokens_equal_llama_tokenize(llamacpp_tools: dict[str, Path], llamacpp_models: Path,
                                                             name: str) -> None:
    """SentencePiece (the prefix space after each special token; Phi-3's right-stripping specials),
    llama3/qwen2/gpt-2 BPE and Gemma 4: the hard strings joined with the vocab's longest special tokens
    between them, parsed and not, with the BOS/EOS the vocab adds."""
    model = llamacpp_models / f"ggml-vocab-{name}.gguf"
    tok = Tokenizer.from_gguf(read_gguf(model))
    specials = [text for _, text, _ in tok.special_tokens[:12]]
    assert specials
    mixed = "".join(f"{h} {specials[i % len(specials)]}\n" for i, h in enumerate(HARD))
    jobs = [(mixed, True), (mixed, False), (" " + "\n".join(HARD), True)]
    wants = run_all(llamacpp_tools["llama-tokenize"], model, jobs)
    for (text, parse_special), want in zip(jobs, wants, strict=True):
        got = tok.encode(text, add_special=tok.add_bos_token, parse_special=parse_special)
        assert got == want, f"parse_special={parse_special}: first difference at {_first_diff(got, want)}"
    assert wants[0] != wants[1]  # the special tokens were parsed in one and text in the other


def _first_diff(a: list[int], b: list[int]) -> str:
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"{i}: got {a[i:i + 8]}, want {b[i:i + 8]}"
