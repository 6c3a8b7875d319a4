"""The `pyggml` command."""

from pyggml.cli.main import main

__all__ = ["main"]
