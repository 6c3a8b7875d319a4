"""Fixtures of the tests against real llama.cpp: its tools, built on demand (pyggml.testing.llamacpp).

The first build takes 6-10 minutes on 2 cores; its progress is shown on the
terminal even under pytest's output capture. Tests skip only when the machine
has no C/C++ compiler; any other build failure is an error.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pyggml.testing import llamacpp

if TYPE_CHECKING:
    from pyggml.testing.ggml_c import GGMLLib

# What these tests run: the text peers, the token peer, the logits peer.
TOOLS = ("llama-simple", "llama-completion", "llama-tokenize", "llama-debug")


@contextmanager
def _progress_on_terminal(config: pytest.Config) -> Iterator[None]:
    """Let the build's log messages reach the terminal while pytest captures output (a silent 10-minute
    pause looks like a hang)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    suspended = capman.global_and_fixture_disabled() if capman is not None else nullcontext()
    logger = logging.getLogger(llamacpp.__name__)
    with suspended:
        sys.stderr.write("\n")  # off the line of pytest's progress dots
        handler = logging.StreamHandler(sys.stderr)  # made here: sys.stderr is the terminal now
        handler.setFormatter(logging.Formatter("llama.cpp: %(message)s"))
        old_level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)


@pytest.fixture(scope="session")
def llamacpp_tools(pytestconfig: pytest.Config) -> dict[str, Path]:
    """The paths of TOOLS, building them if this machine's cache lacks them."""
    found = {name: llamacpp.find_tool(name) for name in TOOLS}
    if all(path is not None for path in found.values()):
        return {name: path for name, path in found.items() if path is not None}
    with _progress_on_terminal(pytestconfig):
        try:
            return llamacpp.require_tools(TOOLS)
        except llamacpp.NoCompilerError as e:
            pytest.skip(str(e))  # the one reason to skip: no compiler to build llama.cpp with


@pytest.fixture(scope="session")
def ggml_c_lib(pytestconfig: pytest.Config) -> GGMLLib:
    """Real ggml's libggml-base and libggml-cpu loaded by pyggml.testing.ggml_c (a GGMLLib), built if this
    machine's cache lacks them."""
    from pyggml.testing import ggml_c

    if any(llamacpp.find_tool(name) is None for name in llamacpp.GGML_LIBS):
        with _progress_on_terminal(pytestconfig):
            try:
                llamacpp.require_libs(llamacpp.GGML_LIBS)
            except llamacpp.NoCompilerError as e:
                pytest.skip(str(e))  # the one reason to skip: no compiler to build ggml with
    return ggml_c.load()
