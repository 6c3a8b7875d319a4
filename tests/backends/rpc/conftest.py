"""Fixtures of the RPC tests: real ggml-rpc-server processes on free 127.0.0.1 ports, the rpc registry."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyggml.backend import registry
from pyggml.backends.rpc.client import rpc_reg
from pyggml.backends.rpc.connection import close_all


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Wait until something accepts on 127.0.0.1:port (the C server answers a probe by closing it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"RPC server exited with {proc.returncode} before listening:\n{out}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return
        time.sleep(0.05)
    raise RuntimeError(f"RPC server on port {port} did not listen within {timeout} s")


@pytest.fixture(scope="session")
def rpc_server_binary(pytestconfig: pytest.Config) -> Path:
    """ggml-rpc-server of llama.cpp 0c1e570, built if missing (skip only without a C compiler)."""
    from pyggml.testing import llamacpp

    found = llamacpp.find_tool("ggml-rpc-server")
    if found is not None:
        return found
    try:
        return llamacpp.require_tool("ggml-rpc-server")
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def c_server(binary: Path, threads: int = 1) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ggml-rpc-server on a free port: ("127.0.0.1:PORT", process); killed on exit."""
    port = free_port()
    proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_listening(port, proc)
        yield f"127.0.0.1:{port}", proc
    finally:
        close_all()
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture(scope="module")
def c_endpoint(rpc_server_binary: Path) -> Iterator[str]:
    """A real ggml-rpc-server for the module's tests."""
    with c_server(rpc_server_binary) as (endpoint, _):
        yield endpoint


@pytest.fixture(autouse=True, scope="session")
def _rpc_registered() -> None:
    """The rpc registry by name even where the installed metadata predates its entry point."""
    if registry.reg_by_name("rpc") is None:
        registry.register(rpc_reg())
