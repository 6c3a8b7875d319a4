"""`pyggml run`: the streamed text is what the model API generates, the figures are printed,
options reach the model (backends, layers, context, sampling)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from cli_util import one_line

from pyggml.cli._common import fmt_bytes
from pyggml.cli.main import main
from pyggml.cli.run import TextStream

PROMPT = "the cat is on it"


def greedy_text(path: Path, prompt: str, n: int, **load_kw: object) -> str:
    """What the model API writes greedily over the command's default F16 cache: the reference its stdout must
    equal."""
    from pyggml.models import load

    model = load(path, n_ctx=128, progress=False, **{"kv_type": "f16", **load_kw})
    try:
        ids = model.tokenize(prompt)
        gen = list(model.generate(ids, n, None))
        return model.detokenize(ids + gen)
    finally:
        model.free()


def test_run_streams_the_greedy_text(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), "-p", PROMPT, "-n", "6", "--temp", "0", "--repeat-penalty", "1.0"]) == 0
    captured = capsys.readouterr()
    expected = greedy_text(tiny_model, PROMPT, 6)
    assert captured.out == expected + "\n"
    assert captured.out.startswith(PROMPT)


def test_run_prints_the_figures(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyggml.gguf.reader import read_gguf
    from pyggml.models import load

    assert main(["run", str(tiny_model), "-p", PROMPT, "-n", "5", "--temp", "0", "--seed", "7"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^seed: 7 ", err, re.M)
    assert re.search(r"^load time: +\d+\.\d ms", err, re.M)
    model = load(tiny_model, n_ctx=128, progress=False)
    try:
        n_prompt = len(model.tokenize(PROMPT))  # BOS and the prompt's pieces, as the command evaluates them
    finally:
        model.free()
    assert n_prompt > len(PROMPT.split())  # the tiny vocabulary splits words: more tokens than words
    m = re.search(r"^prompt: +([\d.]+) ms / +(\d+) tokens \( *([\d.]+) tokens/s\)", err, re.M)
    assert m, err
    ms, n, rate = float(m.group(1)), int(m.group(2)), float(m.group(3))
    assert n == n_prompt
    # the rate is the count over the time (both printed rounded: 0.05 ms and 0.005 tokens/s)
    assert abs(rate * ms / 1000 - n) <= rate * 0.05e-3 + 0.005 * ms / 1000 + 1e-9, (ms, n, rate)
    m = re.search(r"^generation: +[\d.]+ ms / +(\d+) tokens \( *([\d.]+|n/a) tokens/s\) +(\d+) generated", err, re.M)
    assert m and 1 <= int(m.group(3)) <= 5 and int(m.group(1)) == int(m.group(3)) - 1
    weights = sum(t.nbytes for t in read_gguf(tiny_model).tensors.values())
    row = re.search(r"^\| CPU#0 +\| +(.+?) \| +(.+?) \| (.+?) +\| +(.+?) \| +(.+?) \|$", err, re.M)
    assert row, err
    assert row.group(1) == fmt_bytes(weights)
    assert row.group(2) == fmt_bytes(2 * 2 * 128 * 32 * 2)  # K and V, 2 layers, n_ctx 128, n_embd_gqa 32, f16
    assert row.group(3) == "K (f16), V (f16)"  # llama.cpp's default cache types


def test_run_verbose_shows_the_plan(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), "-p", PROMPT, "-n", "2", "--temp", "0", "-v"]) == 0
    err = capsys.readouterr().err
    assert "n_layer 2, n_embd 64, n_head 4/2, n_vocab 320, n_ctx 128" in err
    assert re.search(r"^  layers 0\.\.1: CPU#0$", err, re.M)
    # the graph allocator's memory report of the compute buffer: peak at or above the lower bound
    m = re.search(r"^compute memory of the largest graph: buffer '[^']+': peak ([\d.]+) MiB, lower bound ([\d.]+) MiB "
                  r"\(peak/lower bound ([\d.]+)\), no reuse ([\d.]+) MiB", err, re.M)
    assert m is not None, err
    peak, lower, ratio, no_reuse = map(float, m.groups())
    assert 0 < lower <= peak <= no_reuse and ratio >= 1.0


def test_run_split_over_two_backends_writes_the_same(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layer 0 on one CPU backend, layer 1 on another: the text must not change."""
    argv = ["run", str(tiny_model), "-p", PROMPT, "-n", "6", "--temp", "0", "--repeat-penalty", "1.0"]
    assert main(argv + ["--backend", "cpu", "--backend", "cpu", "--n-layers-on", "CPU#0=1", "-v"]) == 0
    captured = capsys.readouterr()
    assert captured.out == greedy_text(tiny_model, PROMPT, 6) + "\n"
    assert re.search(r"^\| CPU#0 ", captured.err, re.M) and re.search(r"^\| CPU#1 ", captured.err, re.M)
    assert "backends: CPU#0, CPU#1; layers: 0:CPU#0, 1:CPU#1" in captured.err
    # the scheduler's plan of the last graph: splits on both backends, the second one reading copies
    assert re.search(r"^scheduler: \d+ split\(s\) of the last graph over 2 backend\(s\)", captured.err, re.M)
    assert re.search(r"^  split 0: CPU#0, nodes 0\.\.\d+", captured.err, re.M)
    assert re.search(r"^  split \d+: CPU#1, nodes \d+\.\.\d+, \d+ input\(s\) copied in: ", captured.err, re.M)
    assert len(re.findall(r"^compute memory of the largest graph: ", captured.err, re.M)) == 2  # one per backend


def test_run_ctx_and_n(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), "-p", PROMPT, "-n", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == PROMPT + "\n"
    assert "0 generated" in captured.err
    # a context of 24 tokens: generation stops when it is full
    assert main(["run", str(tiny_model), "-p", PROMPT, "-n", "50", "--ctx", "24", "--temp", "0"]) == 0
    m = re.search(r"(\d+) generated \(context full\)", capsys.readouterr().err)
    assert m and int(m.group(1)) < 50
    assert main(["run", str(tiny_model), "-p", PROMPT * 10, "--ctx", "16"]) == 1
    assert "raise -c/--ctx-size" in one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_run_ignore_eos_goes_on_after_the_end_of_text(capsys: pytest.CaptureFixture[str]) -> None:
    """The built-in model ends this text with its EOS token after a few dozen tokens; --ignore-eos (llama.cpp's)
    generates on until -n, and the text it wrote first is the same."""
    argv = ["run", "-p", "The module", "-n", "120", "--seed", "1"]
    assert main(argv) == 0
    short = capsys.readouterr()
    m = re.search(r"(\d+) generated \(end of text\)", short.err)
    assert m and int(m.group(1)) < 120, short.err
    assert main(argv + ["--ignore-eos"]) == 0
    long = capsys.readouterr()
    assert re.search(r"\b120 generated\n", long.err), long.err
    assert long.out.startswith(short.out.rstrip("\n"))
    assert len(long.out) > len(short.out)


def test_run_sampling_is_seeded(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", str(tiny_model), "-p", PROMPT, "-n", "12", "--temp", "1.5", "--top-k", "0", "--top-p", "1",
            "--min-p", "0"]
    texts = []
    for seed in ["1", "1", "2"]:
        assert main(argv + ["--seed", seed]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]  # 12 tokens at temperature 1.5 over 320 ids: equal by chance is unlikely


@pytest.mark.parametrize("option, value, words", [("--top-p", "0", "--top-p must be in (0, 1]"),
                                                  ("--min-p", "2", "--min-p must be in [0, 1]"),
                                                  ("--top-k", "-1", "--top-k must be >= 0"),
                                                  ("--repeat-penalty", "0", "--repeat-penalty must be > 0")])
def test_run_bad_sampling_values(option: str, value: str, words: str, tiny_model: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), option, value]) == 1
    assert words in one_line(capsys.readouterr().err)


class _Fake:
    """Detokenizes with the real tokenizer of the tiny file (byte tokens included)."""

    def __init__(self, path: Path) -> None:
        from pyggml.gguf.reader import read_gguf
        from pyggml.models.tokenizer import Tokenizer

        self.tok = Tokenizer.from_gguf(read_gguf(path))

    def detokenize(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def test_text_stream_keeps_spaces_and_multibyte_characters(tiny_model: Path) -> None:
    fake = _Fake(tiny_model)
    prompt = fake.tok.encode("the")
    whole = fake.tok.encode("the café über it")
    assert whole[: len(prompt)] == prompt
    new = whole[len(prompt):]
    assert any(3 <= i < 3 + 256 for i in new)  # é and ü go through the byte tokens <0x00>..<0xFF>
    out = io.StringIO()
    stream = TextStream(fake, prompt, out)
    seen = []
    for tok in new:
        stream.add(tok)
        seen.append(out.getvalue())
    assert out.getvalue() == " café über it"
    assert all("\ufffd" not in s for s in seen)  # half a character is never printed
