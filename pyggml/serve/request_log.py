"""One log line per request: client, method, path, status, tokens and seconds, an ASGI middleware outermost.

    127.0.0.1:50412 POST /v1/chat/completions 200 prompt=25 completion=12 cached=0 0.412s

The routes that use the model say how many tokens it took (`note_tokens`, into the request's state); the line is
written when the answer has gone (a streamed one at its end) or the client went away (status 499 when no answer
had started). Logged at INFO on `pyggml.serve.requests` (`pyggml serve` prints them unless --log-disable).
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOGGER_NAME = "pyggml.serve.requests"
TOKENS = "pyggml_tokens"  # the request state's key: {"prompt": n, "completion": n, "cached": n}
CLIENT_GONE = 499  # nginx's status for a client that closed before the answer

log = logging.getLogger(LOGGER_NAME)


def note_tokens(scope: Scope, **counts: int) -> None:
    """Record the request's token counts (prompt, completion, cached, ...) for its log line, in the state of
    its ASGI scope (`request.scope`)."""
    scope.setdefault("state", {}).setdefault(TOKENS, {}).update(counts)


def format_line(client: str, method: str, path: str, status: int, tokens: dict[str, int], seconds: float) -> str:
    counts = "".join(f" {k}={v}" for k, v in tokens.items())
    return f"{client} {method} {path} {status}{counts} {seconds:.3f}s"


class RequestLog:
    """The ASGI middleware writing a request's line once the app is done with it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state = scope.setdefault("state", {})
        status = CLIENT_GONE

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            if log.isEnabledFor(logging.INFO):
                client = scope.get("client") or ("-", 0)
                log.info("%s", format_line(f"{client[0]}:{client[1]}", scope.get("method", "-"),
                                           scope.get("path", "-"), status, state.get(TOKENS, {}),
                                           time.perf_counter() - t0))
