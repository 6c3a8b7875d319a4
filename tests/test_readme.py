"""The README's Python examples run as written (so the README stays true)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[i], f"README.md python block {i}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out  # every example prints what it shows
