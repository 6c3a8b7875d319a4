"""Who may talk to the server: the Host allow-list and CORS, an ASGI middleware in front of the routes.

A web page the user visits can send requests to 127.0.0.1 too. Two things keep it out: the Host header must
name this server (the bound address, localhost, 127.0.0.1, [::1], or `--allowed-hosts`), so a DNS-rebinding
page, whose requests carry its own domain, gets a 403; and a request that carries an `Origin` (browsers add
it to cross-origin requests) is refused unless `--cors-origin` allows that origin, in which case preflights
from it are answered and its responses carry `Access-Control-Allow-Origin`. Without `--cors-origin` no origin
is allowed (llama-server allows any). The body's type is the routes' business (`protocol.check_content_type`).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyggml.serve.protocol import error_body

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ANY = "*"
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"
CORS_MAX_AGE = "600"  # seconds a browser may keep a preflight's answer


def host_name(host: str) -> str:
    """A Host header's (or a bound address's) name, without the port, lower case, IPv6 in brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[:host.find("]") + 1] if "]" in host else host
    if host.count(":") > 1:  # a bare IPv6 address
        return f"[{host}]"
    name, _, port = host.rpartition(":")
    host = name if name and port.isdigit() else host
    return host[:-1] if host.endswith(".") else host


def origin_name(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


def split_list(values: Iterable[str]) -> list[str]:
    """Repeated and comma-separated values, as one list (empty items dropped)."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


class Guard:
    """The ASGI middleware: refuses foreign Host headers and origins, answers the allowed preflights."""

    def __init__(self, app: ASGIApp, bound_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
                 cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = {host_name(h) for h in (*LOCAL_HOSTS, bound_host, *allowed_hosts)}
        self.origins = {origin_name(o) for o in cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        if ANY not in self.hosts and (host is None or host_name(host) not in self.hosts):
            await _refuse(f"Host {host!r} is not this server's (give --allowed-hosts to add a name)", 403,
                          "host_not_allowed")(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if ANY not in self.origins and origin_name(origin) not in self.origins:
            await _refuse(f"requests from the origin {origin!r} are not allowed (give --cors-origin)", 403,
                          "origin_not_allowed")(scope, receive, send)
            return
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await Response(status_code=204, headers={
                "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Allow-Headers": CORS_HEADERS, "Access-Control-Max-Age": CORS_MAX_AGE,
                "Vary": "Origin"})(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _refuse(message: str, status: int, code: str) -> Response:
    return JSONResponse(error_body(message, "invalid_request_error", None, code), status_code=status)
