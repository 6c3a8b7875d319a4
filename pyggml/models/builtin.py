"""The built-in model: a small LLaMA shipped inside the package (`pyggml run` without a MODEL).

It is trained by `tools/train_builtin_model.py` on the docstrings of Python's
standard library and written as a standard llama.cpp GGUF file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pyggml.core.errors import GGUFError

BUILTIN_MODEL = "builtin-llama.gguf"


def builtin_model_path() -> Path:
    """The path of the GGUF file shipped inside the package (pyggml/data/builtin-llama.gguf)."""
    path = Path(str(resources.files("pyggml").joinpath("data", BUILTIN_MODEL)))
    if not path.is_file():
        raise GGUFError(f"the built-in model is missing ({path}); train it with tools/train_builtin_model.py")
    return path
