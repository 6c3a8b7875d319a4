"""`pyggml bench`: a llama-bench table with pp and tg rows, mean ± std over the repetitions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_util import one_line

from pyggml.cli.main import main


def _rows(out: str) -> dict[str, tuple[str, float, float]]:
    """test name -> (backend, mean, std)"""
    rows = {}
    # model, size, params, backend, then any columns (layers, threads, ot), test, t/s
    row = r"^\| tiny\.gguf +\| [^|]+\| [^|]+\| (\S+) .*\| (\w+) +\| +([\d.]+) ± ([\d.]+) \|$"
    for m in re.finditer(row, out, re.M):
        rows[m.group(2)] = (m.group(1), float(m.group(3)), float(m.group(4)))
    return rows


def test_bench_table(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(tiny_model), "-p", "16", "-n", "4", "-r", "2", "-t", "1"]) == 0
    out = capsys.readouterr().out
    header = [c.strip() for c in out.splitlines()[0].split("|")[1:-1]]
    assert header == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    rows = _rows(out)
    assert set(rows) == {"pp16", "tg4"}
    for backend, mean, std in rows.values():
        assert backend == "CPU" and mean > 0 and std >= 0
    assert re.search(r"\| +1 \| pp16 ", out)  # the thread count reached the CPU backend


def test_bench_only_one_test(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(tiny_model), "-p", "0", "-n", "3", "-r", "1"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {"tg3"} and rows["tg3"][2] == 0.0  # one repetition: no spread
    assert main(["bench", str(tiny_model), "-p", "0", "-n", "0"]) == 1
    assert "nothing to measure" in one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_bench_two_backends(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two CPU backends (one layer each, by position): the backend column says so, a layers column too."""
    assert main(["bench", str(tiny_model), "-p", "8", "-n", "2", "-r", "1", "--backend", "cpu", "--backend", "cpu",
                 "--n-layers-on", "1"]) == 0
    out = capsys.readouterr().out
    header = [c.strip() for c in out.splitlines()[0].split("|")[1:-1]]
    assert header == ["model", "size", "params", "backend", "layers", "threads", "test", "t/s"]
    rows = _rows(out)
    assert rows["pp8"][0] == "CPU×2"
    assert re.search(r"\| CPU×2 +\| +1/1 \| ", out)
