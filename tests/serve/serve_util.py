"""Starting a server of the built-in model on a free 127.0.0.1 port (uvicorn in a thread), for the tests."""

from __future__ import annotations

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


def start_server(n_slots: int, n_ctx: int, api_key: str | None = None, step_delay: float = 0.0,
                 max_body: int | None = None) -> Iterator[Running]:
    # one CPU thread: the clients share the process (and 2 cores); kernel threads spinning for each other
    # while the clients want the CPU make the time swing
    model = pm.load(builtin_model_path(), n_ctx=n_ctx, progress=False, n_threads=1)
    engine = Engine(model, n_slots=n_slots, step_delay=step_delay).start()
    kwargs = {} if max_body is None else {"max_body": max_body}
    app = create_app(engine, api_key=api_key, **kwargs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                          timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", engine, model, api_key)
    finally:
        server.should_exit = True
        thread.join(10)
        engine.stop()
        model.free()


