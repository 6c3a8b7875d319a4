"""Fixtures of the RPC tests: the real ggml-rpc-server (built if missing), the rpc registry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rpc_util import c_server

from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc.client import rpc_reg
from pyggml.backends.rpc.connection import close_all
from pyggml.backends.rpc.server import RpcServer
from pyggml.ggml_backend import registry


def _llamacpp_tool(name: str) -> Path:
    """A tool of llama.cpp 0c1e570, built if missing (skip only without a C compiler)."""
    from pyggml.testing import llamacpp

    found = llamacpp.find_tool(name)
    if found is not None:
        return found
    try:
        return llamacpp.require_tool(name)
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def rpc_server_binary(pytestconfig: pytest.Config) -> Path:
    """ggml-rpc-server (built if missing)."""
    return _llamacpp_tool("ggml-rpc-server")


@pytest.fixture(scope="module")
def completion_tool(pytestconfig: pytest.Config) -> Path:
    """llama-completion (built if missing)."""
    return _llamacpp_tool("llama-completion")


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


def start_cpu_server() -> Iterator[RpcServer]:
    """`pyggml rpc-server` serving a CPU backend, in this process (a thread per client), closed after."""
    server = RpcServer([cpu_init(1)], "127.0.0.1", 0).start()
    try:
        yield server
    finally:
        close_all()
        server.close()


@pytest.fixture(scope="module")
def py_endpoint() -> Iterator[str]:
    for server in start_cpu_server():
        yield server.endpoint


@pytest.fixture
def server() -> Iterator[RpcServer]:
    """A server of one test's own."""
    yield from start_cpu_server()


@pytest.fixture(scope="module", params=["ggml-rpc-server", "pyggml-rpc-server"])
def endpoint(request: pytest.FixtureRequest) -> str:
    """Each server in turn: the real ggml-rpc-server, then pyggml's."""
    return str(request.getfixturevalue("c_endpoint" if request.param == "ggml-rpc-server" else "py_endpoint"))
