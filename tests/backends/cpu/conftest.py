"""Fixtures of the CPU backend's tests: real ggml as the reference of the op cases."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyggml.ggml_backend import Backend
from pyggml.testing import llamacpp, op_check


@pytest.fixture(scope="session")
def ggml_reference() -> Iterator[Backend]:
    """libggml's CPU backend (llama.cpp 0c1e570), built once per machine; skipped only without a C compiler."""
    if any(llamacpp.find_tool(name) is None for name in llamacpp.GGML_LIBS):
        try:
            llamacpp.require_libs(llamacpp.GGML_LIBS)
        except llamacpp.NoCompilerError as e:
            pytest.skip(str(e))  # the one reason to skip: no compiler to build ggml with
    reference, _ = op_check.reference_backend("ggml")
    yield reference
    reference.free()
