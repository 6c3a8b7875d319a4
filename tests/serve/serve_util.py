"""Starting a server of the built-in model on a free 127.0.0.1 port (uvicorn in a thread), for the tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

import pyggml.models as pm
from pyggml.models.builtin import builtin_model_path
from pyggml.serve.app import create_app
from pyggml.serve.engine import Engine
from pyggml.serve.http import server_config
from pyggml.serve.limits import HEADER_TIMEOUT, MAX_CONNECTIONS

API_KEY = "test-key"
START_TIMEOUT = 20.0


@dataclass
class Running:
    url: str
    engine: Engine
    model: Any
    api_key: str | None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(n_slots: int, n_ctx: int, api_key: str | list[str] | None = None, step_delay: float = 0.0,
                 max_body: int | None = None, model_path: Any = None, header_timeout: float = HEADER_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS, load_options: dict[str, Any] | None = None,
                 **app_options: Any) -> Iterator[Running]:
    """The server as `pyggml serve` runs it (its uvicorn protocol and limits); `load_options` go to pyggml.models.load
    (batch_invariant, ...), `app_options` to create_app."""
    # one CPU thread: the clients share the process (and 2 cores); kernel threads spinning for each other
    # while the clients want the CPU make the time swing
    model = pm.load(model_path or builtin_model_path(), n_ctx=n_ctx, progress=False, n_threads=1,
                    **(load_options or {}))
    engine = Engine(model, n_slots=n_slots, step_delay=step_delay).start()
    kwargs = {} if max_body is None else {"max_body": max_body}
    app = create_app(engine, api_key=api_key, **kwargs, **app_options)
    try:
        with serving(app, header_timeout, max_connections) as url:
            yield Running(url, engine, model, api_key)
    finally:
        engine.stop()
        model.free()


@contextlib.contextmanager
def serving(app: Any, header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> Iterator[str]:
    """`app` served by uvicorn (in a thread) on a free 127.0.0.1 port; yields its URL."""
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, header_timeout=header_timeout,
                                          max_connections=max_connections, log_level="warning",
                                          timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
