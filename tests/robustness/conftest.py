"""Helpers of the bad-input catalog: one error shape for every case.

Every case asserts three things: the error class, that the message names the
thing and the numbers (`fragments`, each a substring of the message), and that
the object still works afterwards (the case's own follow-up). Cases that could
crash the interpreter or hang run in a child process with a timeout
(`run_isolated`).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from pyggml.core.errors import GGMLError

# the torch backend's cases need PyTorch (optional; CI installs it): without it they are not collected
collect_ignore = [] if importlib.util.find_spec("torch") else ["test_torch.py"]


def expect_error(fn: Callable[[], object], cls: type[GGMLError], *fragments: str) -> GGMLError:
    """Call `fn`, assert it raises `cls` (a GGMLError subclass) whose message contains every fragment."""
    assert issubclass(cls, GGMLError), f"{cls.__name__} is not a GGMLError"
    with pytest.raises(cls) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"message {message!r} does not name {fragment!r}"
    return info.value


def run_isolated(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter; a crash shows as a negative return code, a hang as a test failure."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"child process did not finish within {timeout} s (hang):\n{textwrap.dedent(code)}")
