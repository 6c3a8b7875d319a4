"""Helpers of the command-line tests."""

from __future__ import annotations


def one_line(text: str) -> str:
    """The text, checked to be exactly one line and no traceback."""
    lines = text.strip("\n").split("\n")
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    assert "Traceback" not in text
    return lines[0]
