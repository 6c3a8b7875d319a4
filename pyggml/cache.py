"""pyggml's user cache directory: what it builds or compiles once and keeps (llama.cpp's tools for the
tests, numba's compiled kernels when the package's own folder is read-only)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "PYGGML_CACHE"


def cache_dir() -> Path:
    """`$PYGGML_CACHE`, or ~/.cache/pyggml."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pyggml"
