"""End to end: the installed `pyggml` console script runs the built-in model (what the README's
first command does), in a fresh process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyggml.cli._common import builtin_model_path


def pyggml_command() -> str:
    """The console script `pip install` made (next to this Python first, then on PATH)."""
    here = Path(sys.executable).parent / "pyggml"
    found = str(here) if here.exists() else shutil.which("pyggml")
    if found is None:
        pytest.fail("the `pyggml` console script is not installed: pip install -e .")
    return found


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([pyggml_command(), *args], capture_output=True, text=True, timeout=300, env=env)


def test_builtin_model_is_shipped() -> None:
    path = builtin_model_path()
    assert path.name == "builtin-llama.gguf"
    assert 1 << 20 < path.stat().st_size < 20 << 20  # a few MB


@pytest.mark.slow
def test_installed_pyggml_runs_the_builtin_model() -> None:
    proc = _run(["run", "-n", "8", "--seed", "1"])
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    text = proc.stdout.rstrip("\n")
    assert text.startswith("The module")  # the default prompt, then the generated text
    assert len(text) > len("The module") + 8  # 8 tokens of at least a character each... mostly
    assert re.search(r"[a-z]{3,}", text[len("The module"):])  # words, not bytes
    m = re.search(r"^generation: +[\d.]+ ms / +(\d+) tokens \( *([\d.]+) tokens/s\) +(\d+) generated", proc.stderr,
                  re.M)
    assert m and 1 <= int(m.group(3)) <= 8 and float(m.group(2)) > 0, proc.stderr
    assert re.search(r"^prompt: .* tokens/s\)", proc.stderr, re.M)
    assert re.search(r"^\| CPU#0 +\| +[\d.]+ MiB \|", proc.stderr, re.M)  # the weights, a few MiB


@pytest.mark.slow
def test_installed_pyggml_fails_in_one_line(tmp_path: Path) -> None:
    proc = _run(["info", str(tmp_path / "missing.gguf")])
    assert proc.returncode == 1
    assert proc.stderr == f"pyggml info: error: no such file: '{tmp_path / 'missing.gguf'}'\n"
    assert proc.stdout == ""
