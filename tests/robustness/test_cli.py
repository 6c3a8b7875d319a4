"""Bad-input catalog of the `pyggml` command: bad files and bad options for every subcommand.

Each case runs `pyggml` in a fresh process and asserts the exit code (1 for a failed command, 2 for an
option argparse refuses), that stderr is exactly one line with no traceback and no "internal error",
and that the line names the thing and the numbers. The bad files are the built-in model copied with one
thing changed (`copy_model` of the model catalog). Ctrl-C is a SIGINT sent to a `pyggml run` that is
generating: exit code 130.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as VT

from robustness.test_models import BUILTIN, _with_value, copy_model

TIMEOUT = 120.0


def pyggml(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        return subprocess.run([sys.executable, "-m", "pyggml.cli", *args], capture_output=True, text=True,
                              timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pyggml {' '.join(args)} did not finish within {TIMEOUT} s")


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """stderr, checked to be exactly one line, no traceback, no internal error (besides llama.cpp's warning of a
    context over the training context, which a huge -c rightly gets)."""
    lines = [line for line in proc.stderr.strip("\n").split("\n")
             if not line.endswith("-- possible training context overflow")]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-files")
    raw = BUILTIN.read_bytes()
    (d / "empty.gguf").write_bytes(b"")
    (d / "text.gguf").write_text("this is a text file, not a model\n" * 4)
    (d / "trunc.gguf").write_bytes(raw[:3_000_000])  # cut inside the tensor data
    (d / "head.gguf").write_bytes(raw[:100])  # cut inside the metadata
    (d / "adir").mkdir()
    return {
        "missing": d / "missing.gguf", "dir": d / "adir", "empty": d / "empty.gguf", "text": d / "text.gguf",
        "trunc": d / "trunc.gguf", "head": d / "head.gguf",
        "gpt2": copy_model(d / "gpt2.gguf", {"general.architecture": ("gpt2", VT.STRING)}),
        "eps": copy_model(d / "eps.gguf", {"llama.attention.layer_norm_rms_epsilon": (-1e-5, VT.FLOAT32)}),
        "n_layer": copy_model(d / "n_layer.gguf", {"llama.block_count": ("4", VT.STRING)}),
        "bos": copy_model(d / "bos.gguf", {"tokenizer.ggml.bos_token_id": ([1, 2], VT.ARRAY, VT.INT32)}),
        "nan": copy_model(d / "nan.gguf", tensors={"blk.2.ffn_down.weight": _with_value(
            "blk.2.ffn_down.weight", (5, 7), math.nan)}),
        "bosbig": copy_model(d / "bosbig.gguf", {"tokenizer.ggml.bos_token_id": (99999, VT.UINT32)}),
        "noeos": copy_model(d / "noeos.gguf", drop=("tokenizer.ggml.eos_token_id",)),
        "scores": copy_model(d / "scores.gguf", {"tokenizer.ggml.scores": (["x"] * 2000, VT.ARRAY, VT.STRING)}),
    }


# (id, arguments with {file} placeholders, exit code, fragments of the one stderr line)
CASES: list[tuple[str, list[str], int, tuple[str, ...]]] = [
    # run: files
    ("run-missing", ["run", "{missing}"], 1, ("pyggml run: error: no such file", "missing.gguf")),
    ("run-directory", ["run", "{dir}"], 1, ("adir", "is a directory")),
    ("run-empty", ["run", "{empty}"], 1, ("'empty.gguf'", "0 bytes")),
    ("run-not-gguf", ["run", "{text}"], 1, ("'text.gguf' is not a GGUF file",)),
    ("run-truncated", ["run", "{trunc}"], 1, ("'trunc.gguf'", "truncated")),
    ("run-truncated-header", ["run", "{head}"], 1, ("'head.gguf'",)),
    ("run-wrong-arch", ["run", "{gpt2}"], 1, ("'gpt2.gguf'", "unsupported architecture 'gpt2'")),
    ("run-negative-eps", ["run", "{eps}"], 1, ("'llama.attention.layer_norm_rms_epsilon' = -1e-05", "> 0")),
    ("run-hparam-type", ["run", "{n_layer}"], 1, ("'llama.block_count' has GGUF type STRING",
                                                 "expected an integer type")),
    ("run-bos-type", ["run", "{bos}"], 1, ("'tokenizer.ggml.bos_token_id' has GGUF type ARRAY of INT32",)),
    ("run-tokenizer-type", ["run", "{scores}"], 1, ("'scores.gguf': metadata key 'tokenizer.ggml.scores' has GGUF "
                                                    "type ARRAY of STRING, expected ARRAY of FLOAT32",)),
    ("run-nan-logits", ["run", "{nan}", "-n", "4"], 1, ("hold NaN", "'ffn_out-2'", "in layer 2",
                                                       "'blk.2.ffn_down.weight' holds 1 NaN")),
    # run: options
    ("run-n-negative", ["run", "-n", "-2"], 2, ("-n/--n-predict", "must be >= -1, got -2")),  # -1: no limit
    ("run-n-not-int", ["run", "-n", "ten"], 2, ("-n/--n-predict", "'ten'")),
    ("run-ctx-negative", ["run", "--ctx", "-5"], 2, ("-c/--ctx", "must be >= 0, got -5")),  # 0: the training context
    ("run-ctx-huge", ["run", "--ctx", "10000000"], 1, ("n_ctx 10000000", "KV cache 20480000000 bytes",
                                                      "cannot allocate", "available")),
    ("run-ctx-below-prompt", ["run", "--ctx", "2"], 1, ("the prompt has 3 tokens, the context only 2",)),
    ("run-threads-zero", ["run", "--threads", "0"], 2, ("-t/--threads", "must be >= 1, got 0")),
    ("run-threads-negative", ["run", "--threads", "-3"], 2, ("-t/--threads", "must be >= 1, got -3")),
    ("run-threads-huge", ["run", "--threads", "100000"], 2, ("-t/--threads", "<= 512", "100000")),
    ("run-temp-nan", ["run", "--temp", "nan"], 2, ("--temp", "must be a finite number", "'nan'")),
    ("run-temp-not-number", ["run", "--temp", "warm"], 2, ("--temp", "'warm'")),
    ("run-top-p-over-1", ["run", "--top-p", "1.5"], 1, ("--top-p must be in (0, 1], got 1.5",)),
    ("run-top-k-negative", ["run", "--top-k", "-1"], 1, ("--top-k must be >= 0, got -1",)),
    ("run-min-p-negative", ["run", "--min-p", "-0.5"], 1, ("--min-p must be in [0, 1], got -0.5",)),
    ("run-repeat-penalty-zero", ["run", "--repeat-penalty", "0"], 1, ("--repeat-penalty must be > 0",)),
    ("run-seed-negative", ["run", "--seed", "-5"], 2, ("-s/--seed", "must be >= 0, got -5")),
    ("run-unknown-backend", ["run", "--backend", "vulkan"], 1, ("--backend vulkan", "no backend named 'vulkan'")),
    ("run-layers-not-count", ["run", "--n-layers-on", "cpu=x"], 1, ("--n-layers-on 'cpu=x'",
                                                                    "'x' is not a layer count")),
    ("run-layers-negative", ["run", "--n-layers-on", "cpu=-1"], 1, ("--n-layers-on 'cpu=-1'", ">= 0")),
    ("run-layers-no-equals", ["run", "--n-layers-on", "cpu"], 1, ("--n-layers-on wants BACKEND=N", "'cpu'")),
    ("run-layers-other-backend", ["run", "--backend", "cpu", "--n-layers-on", "torch=2"], 1,
     ("--n-layers-on torch=2", "'torch' is not one of the backends (cpu)")),
    ("run-unknown-option", ["run", "--frobnicate"], 2, ("unrecognized arguments: --frobnicate",)),
    # info
    ("info-missing", ["info", "{missing}"], 1, ("pyggml info: error: no such file", "missing.gguf")),
    ("info-directory", ["info", "{dir}"], 1, ("is a directory",)),
    ("info-empty", ["info", "{empty}"], 1, ("'empty.gguf'", "0 bytes")),
    ("info-not-gguf", ["info", "{text}"], 1, ("'text.gguf' is not a GGUF file",)),
    ("info-truncated-header", ["info", "{head}"], 1, ("'head.gguf'",)),
    # bench
    ("bench-missing", ["bench", "{missing}"], 1, ("pyggml bench: error: no such file",)),
    ("bench-not-gguf", ["bench", "{text}"], 1, ("'text.gguf' is not a GGUF file",)),
    ("bench-hparam-type", ["bench", "{n_layer}"], 1, ("'llama.block_count' has GGUF type STRING",)),
    ("bench-nothing", ["bench", "{eps}", "-p", "0", "-n", "0"], 1, ("nothing to measure",)),
    ("bench-prompt-huge", ["bench", str(BUILTIN), "-p", "10000000", "-n", "0"], 1,
     ("n_ctx 10000000", "cannot allocate", "available")),
    ("bench-batch-zero", ["bench", str(BUILTIN), "--batch", "0"], 2, ("--batch", "must be >= 1, got 0")),
    ("bench-repetitions-zero", ["bench", str(BUILTIN), "-r", "0"], 2, ("-r/--repetitions", "must be >= 1")),
    ("bench-nan-logits", ["bench", "{nan}", "-p", "8", "-n", "0", "-r", "1"], 1, ("'ffn_out-2'", "in layer 2")),
    # test-ops
    ("test-ops-unknown-backend", ["test-ops", "-b", "vulkan"], 2, ("no backend named 'vulkan'",)),
    ("test-ops-unknown-op", ["test-ops", "--op", "NO_SUCH_OP"], 1, ("--op NO_SUCH_OP: no test case", "MUL_MAT")),
    # the command itself
    ("unknown-subcommand", ["frobnicate"], 2, ("invalid choice: 'frobnicate'",)),
]


@pytest.mark.parametrize("args, code, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_failure_is_one_line(files: dict[str, Path], args: list[str], code: int,
                             fragments: tuple[str, ...]) -> None:
    proc = pyggml(*[a.format(**files) for a in args])
    assert proc.returncode == code, proc.stderr
    line = one_error_line(proc)
    for fragment in fragments:
        assert fragment in line, f"{line!r} does not name {fragment!r}"


@pytest.mark.slow
def test_accepted_with_a_meaning(files: dict[str, Path]) -> None:
    """What is not an error: -n beyond the context stops when it is full; --no-check-finite lets NaN
    logits through (the text is then whatever the sampler draws); a BOS id out of the vocabulary is left
    unused; info shows a mistyped key as it is."""
    proc = pyggml("run", str(files["noeos"]), "-p", "The module", "-n", str(10**30), "--ctx", "16", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    # 16 cells - 3 prompt tokens = 13 evaluated, and the 14th sampled from the last logits
    assert "14 generated (context full)" in proc.stderr
    proc = pyggml("run", str(files["nan"]), "-n", "4", "--seed", "1", "--no-check-finite")
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr  # numpy's NaN warnings stay out of the report
    # a BOS id out of the vocabulary is not used (llama.cpp warns and does the same)
    proc = pyggml("run", str(files["bosbig"]), "-p", "The module", "-n", "2", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert "tokenizer.ggml.bos_token_id = 99999 is out of the vocabulary" in proc.stderr
    proc = pyggml("info", str(files["bos"]), "--no-tensors")
    assert proc.returncode == 0, proc.stderr
    assert "bos      [2 items: 1, 2]" in proc.stdout


@pytest.mark.slow
def test_the_command_still_works(files: dict[str, Path]) -> None:
    """After the failures above (each its own process; nothing is cached between them): the built-in
    model still runs, greedily, to the same text twice."""
    runs = [pyggml("run", "-n", "8", "--temp", "0") for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith("The module")


@pytest.mark.slow
def test_ctrl_c_exits_130(files: dict[str, Path]) -> None:
    """SIGINT while `pyggml run` generates (--ignore-eos, so it goes on for 4000 tokens, seconds; without it the
    model ends its text after a few dozen tokens, in milliseconds, and the signal could come after the run):
    exit code 130 and one line saying so."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "run", "-p", "The module", "--ignore-eos",
                             "--ctx", "4096", "-n", "4000", "--seed", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        assert ready, "no output within the timeout"
        first = os.read(proc.stdout.fileno(), 4096)  # the prompt, then generated text: generation has begun
        assert first.startswith(b"The module")
        assert proc.poll() is None, "finished before the interrupt"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    lines = err.decode().strip("\n").split("\n")
    # the built-in model was trained on 256 tokens: --ctx 4096 is warned of first, as llama.cpp does
    warning = "pyggml run: warning: n_ctx_seq (4096) > n_ctx_train (256) -- possible training context overflow"
    assert lines[0] == warning, err
    assert [line for line in lines[1:] if line] == ["pyggml run: interrupted"], err

