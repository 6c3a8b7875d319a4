"""The server the tests of pyggml serve share (the built-in model, 4 slots, an API key)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from serve_util import API_KEY, Running, start_server


@pytest.fixture(scope="package")
def server() -> Iterator[Running]:
    """4 slots of 128 tokens, with an API key."""
    yield from start_server(n_slots=4, n_ctx=512, api_key=API_KEY)


@pytest.fixture
def client(server: Running) -> Any:
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30.0)
