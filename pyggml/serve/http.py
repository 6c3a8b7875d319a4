"""Connections as a resource: uvicorn's h11 protocol with a header timeout and a connection cap.

uvicorn times out a connection only between requests (`timeout_keep_alive`, and any byte re-arms nothing),
so a client that connects and sends nothing, or a byte of its head now and then, holds a connection, a file
descriptor, forever: enough of them and `accept()` fails for everyone. Here a connection waiting for a
request's head gets `header_timeout` seconds in total (from the connection, or from the end of its previous
answer) before it is closed, and at most `max_connections` are open: a new one past the cap closes the
connection that has waited longest for a head (an idle one: a client served meanwhile keeps its own), or,
when every connection is in a request, is answered 503 and closed. The request's body has its own bound
(the app reads it within the same number of seconds). asyncio accepts a listen backlog's worth of connections
before the protocol sees any, so the backlog is small (`BACKLOG`) and the open-file limit is raised to hold the
cap and two such bursts (`raise_fd_limit`): accept() never fails with EMFILE, which asyncio answers by logging
once per queued connection. This subclasses uvicorn's `H11Protocol` and reads its
per-connection state (`cycle`, `conn`, `transport`, `connections`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from pyggml.serve.limits import BACKLOG, FD_RESERVE, HEADER_TIMEOUT, MAX_CONNECTIONS, MAX_HEAD
from pyggml.serve.protocol import error_body

log = logging.getLogger(__name__)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with `header_timeout` and `max_connections` (class attributes: `server_config` makes a
    subclass with the values, as uvicorn builds protocols from a class)."""

    header_timeout = HEADER_TIMEOUT
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timer: asyncio.TimerHandle | None = None
        self.waiting_since = 0.0  # when the wait for the current head began

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._make_room():
            self._refuse()
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._between_requests():
            if self.head_timer is None and not self.transport.is_closing():
                self._await_head()  # a body the answer no longer wanted ended: the next head's clock starts
        else:
            self._stop_head_timer()  # a request's head arrived

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        self._stop_head_timer()
        if self._between_requests() and not self.transport.is_closing():
            self._await_head()

    def _between_requests(self) -> bool:
        """No request of this connection is being answered (its next head is awaited)."""
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        self.waiting_since = self.loop.time()
        self.head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            log.debug("serve: closing %s: no request head within %s s", self.client, self.header_timeout)
            self.transport.close()

    def _make_room(self) -> bool:
        """True when this connection may stay: under the cap, or after closing the longest-idle connection."""
        open_ = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        if len(open_) < self.max_connections:
            return True
        idle = [c for c in open_ if isinstance(c, GuardedH11Protocol) and c.head_timer is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.waiting_since)
        log.debug("serve: %d connections open: closing %s, idle the longest", len(open_), oldest.client)
        oldest._stop_head_timer()
        oldest.transport.close()
        return True

    def _refuse(self) -> None:
        body = json.dumps(error_body(f"the server has {self.max_connections} connections open, all in requests",
                                     "server_error", code="too_many_connections")).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
                f"\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()


def server_config(app: Any, host: str, port: int, header_timeout: float = HEADER_TIMEOUT,
                  max_connections: int = MAX_CONNECTIONS, backlog: int = BACKLOG, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's Config serving `app` with GuardedH11Protocol's limits; `kwargs` go to the Config."""
    protocol = type("PyggmlH11Protocol", (GuardedH11Protocol,),
                    {"header_timeout": header_timeout, "max_connections": max_connections})
    return uvicorn.Config(app, host=host, port=port, http=protocol, h11_max_incomplete_event_size=MAX_HEAD,
                          backlog=backlog, **kwargs)


def fds_needed(max_connections: int = MAX_CONNECTIONS, backlog: int = BACKLOG) -> int:
    """The open files a server with these limits may hold: the cap, two accept bursts, the process's own."""
    return max_connections + 2 * backlog + FD_RESERVE


def raise_fd_limit(needed: int) -> int:
    """Raise the soft open-file limit to `needed` where the hard limit allows; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft
