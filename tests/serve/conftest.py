"""The server the tests of pyggml serve share (the built-in model, 4 slots, an API key).

Without the serve extra's packages (starlette, uvicorn) and the clients (openai, httpx) these tests are not
collected: the rest of the suite runs without them."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

MISSING = [m for m in ("starlette", "uvicorn", "openai", "httpx") if importlib.util.find_spec(m) is None]
collect_ignore_glob = ["test_*.py"] if MISSING else []


@pytest.fixture(scope="package")
def server() -> Iterator[Any]:
    """4 slots of 128 tokens, with an API key."""
    from serve_util import API_KEY, start_server

    yield from start_server(n_slots=4, n_ctx=512, api_key=API_KEY)


@pytest.fixture
def client(server: Any) -> Any:
    import openai
    from serve_util import API_KEY

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30.0)
