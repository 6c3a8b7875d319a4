"""Fixtures of the LLaMA tests: tiny HF models (random weights, fixed seed) and their GGUF files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_llama import TINY, TinyLlama, make_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama() -> TinyLlama:
    return make_tiny_llama()


@pytest.fixture(scope="session")
def tiny_gguf(tiny_llama: TinyLlama, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`tiny_gguf(type)`: the path of the tiny model's GGUF file with 2-D weights in `type` (made once)."""
    from pyggml.models.convert import write_llama_gguf

    made: dict[str, Path] = {}

    def get(type: str = "F32") -> Path:
        if type not in made:
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{type.lower()}.gguf"
            write_llama_gguf(path, tiny_llama.config, tiny_llama.state, type=type)
            made[type] = path
        return made[type]

    return get


@pytest.fixture
def prompt32() -> np.ndarray:
    return np.random.default_rng(7).integers(3, TINY["vocab_size"], 32)
