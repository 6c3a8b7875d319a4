"""One TCP connection per RPC endpoint, as the C client's `rpc_dispatcher`: HELLO, then requests under a lock.

Small commands without an answer may be deferred and cross with the next one sent at once (as the dispatcher's
queue). A socket timeout (`PYGGML_RPC_TIMEOUT`, 120 s) or a closed peer breaks the connection for good:
`RpcConnectionError` naming the endpoint, never an abort as in C.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from pyggml.backends.rpc.wire import (
    CMD_HEADER,
    GET_ALIGNMENT_REQ,
    GET_ALIGNMENT_RSP,
    HELLO_REQ,
    HELLO_RSP,
    RPC_CONN_CAPS_SIZE,
    SIZE_HEADER,
    RpcCmd,
    RpcConnectionError,
    RpcError,
    check_version,
    send_parts,
)
from pyggml.core.errors import ArgumentError

log = logging.getLogger("pyggml.backends.rpc")

Payload = bytes | bytearray | memoryview

ENV_TIMEOUT = "PYGGML_RPC_TIMEOUT"
DEFER_MAX = 64 * 1024  # larger deferred commands go at once, uncopied
MAX_QUEUED = 256  # sendmsg takes at most IOV_MAX = 1024 parts
DEFAULT_TIMEOUT = 120.0
CONNECT_TIMEOUT = 10.0


def default_timeout() -> float:
    text = os.environ.get(ENV_TIMEOUT)
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ArgumentError(f"{ENV_TIMEOUT}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ArgumentError(f"{ENV_TIMEOUT}={text!r} must be > 0 seconds")
    return value


def parse_endpoint(text: str) -> tuple[str, int, int | None]:
    """(host, port, device or None) of "HOST:PORT[/DEVICE]", with an optional "rpc://" or "//" in front."""
    if not isinstance(text, str):
        raise ArgumentError(f"RPC endpoint must be a str \"HOST:PORT\", got {type(text).__name__} {text!r:.80}")
    rest = text
    for prefix in ("rpc://", "//"):
        if rest.lower().startswith(prefix):
            rest = rest[len(prefix):]
            break
    rest, slash, dev_text = rest.partition("/")
    host, colon, port_text = rest.rpartition(":")
    if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ArgumentError(f"RPC endpoint {text!r} is not \"HOST:PORT[/DEVICE]\" (a port in 1..65535)")
    device = None
    if slash:
        if not dev_text.isdigit():
            raise ArgumentError(f"RPC endpoint {text!r}: the device after '/' must be a number, got {dev_text!r}")
        device = int(dev_text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text), device


class Connection:
    """A connection to the RPC server at `endpoint` ("HOST:PORT"), after a successful HELLO."""

    def __init__(self, endpoint: str, timeout: float | None = None) -> None:
        host, port, _ = parse_endpoint(endpoint)
        self.endpoint = f"{host}:{port}"
        self.timeout = default_timeout() if timeout is None else timeout
        self.lock = threading.RLock()
        self.broken: str | None = None  # why the connection is unusable, once it is
        self.pending = False  # a command without an answer was sent since the last answer
        self._out: list[Payload] = []
        self.last_graph: dict[int, bytes] = {}  # device -> the graph the server holds for GRAPH_RECOMPUTE
        self.n_buffers_freed = 0  # plans serialized before a FREE_BUFFER are made again
        self.bytes_sent = 0
        self.bytes_received = 0
        self.version: tuple[int, int, int] = (0, 0, 0)
        try:
            self.sock = socket.create_connection((host, port), timeout=min(CONNECT_TIMEOUT, self.timeout))
        except OSError as e:
            raise RpcConnectionError(f"cannot connect to RPC server {self.endpoint}: {e}") from None
        self.sock.settimeout(self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._hello()
        except BaseException:
            self.close()
            raise
        log.debug("connected to RPC server %s (protocol %d.%d.%d)", self.endpoint, *self.version)

    def set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        self.sock.settimeout(seconds)

    def _hello(self) -> None:
        # pyggml has no RDMA: its caps are all zero, and it ignores the server's (no transport upgrade)
        rsp = self.request(RpcCmd.HELLO, HELLO_REQ.pack(bytes(RPC_CONN_CAPS_SIZE)), HELLO_RSP.size)
        major, minor, patch, _, _caps = HELLO_RSP.unpack(rsp)
        self.version = (major, minor, patch)
        check_version(major, minor, patch, self.endpoint)

    def _fail(self, cmd: RpcCmd, why: str) -> RpcConnectionError:
        if self.broken is None:
            self.broken = f"{why} (during {cmd.name})"
            log.warning("RPC server %s: %s", self.endpoint, self.broken)
            self._close_socket()
        return RpcConnectionError(f"RPC server {self.endpoint} went away: {self.broken}")

    def _check(self, cmd: RpcCmd) -> None:
        if self.broken is not None:
            raise RpcConnectionError(f"RPC server {self.endpoint} is unusable: {self.broken}; cannot send "
                                     f"{cmd.name}")

    def _recv_exact(self, cmd: RpcCmd, n: int) -> bytearray:
        out = bytearray(n)
        self._recv_into(cmd, memoryview(out), n)
        return out

    def _queue(self, cmd: RpcCmd, parts: tuple[Payload, ...], copy: bool) -> None:
        """Frame a command into the outgoing queue (`copy`: of bytes the caller may change once we return)."""
        size = sum(len(p) for p in parts)
        self._out.append(CMD_HEADER.pack(int(cmd), size))
        self._out.extend(bytes(p) if copy and not isinstance(p, bytes) else p for p in parts if len(p))
        self.bytes_sent += CMD_HEADER.size + size

    def _flush(self, cmd: RpcCmd) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        try:
            send_parts(self.sock, out)
        except TimeoutError:
            raise self._fail(cmd, f"send blocked for {self.timeout:g} s") from None
        except OSError as e:
            raise self._fail(cmd, f"send failed: {e}") from None

    def send(self, cmd: RpcCmd, *parts: Payload, defer: bool = False) -> None:
        """A command without a response; `defer`: queued (its bytes copied) for the next command sent at once,
        so a step's small commands wake the server once."""
        with self.lock:
            self._check(cmd)
            size = sum(len(p) for p in parts)
            defer = defer and size <= DEFER_MAX and len(self._out) < MAX_QUEUED
            self._queue(cmd, parts, copy=defer)
            self.pending = True
            if not defer:
                self._flush(cmd)

    def flush(self) -> None:
        with self.lock:
            if self._out and self.broken is None:
                self._flush(RpcCmd.NONE)

    def request(self, cmd: RpcCmd, payload: bytes | bytearray | memoryview, response_size: int,
                out: memoryview | None = None) -> bytearray:
        """A command and its response of exactly `response_size` bytes (into `out` when given)."""
        with self.lock:
            self._check(cmd)
            self._queue(cmd, (payload,), copy=False)
            self._flush(cmd)
            (size,) = SIZE_HEADER.unpack(self._recv_exact(cmd, SIZE_HEADER.size))
            if size != response_size:
                self._fail(cmd, f"answer of {size} bytes, expected {response_size}")
                raise RpcError(f"RPC server {self.endpoint}: {cmd.name} answered {size} bytes, expected "
                               f"{response_size}")
            if out is not None:
                self._recv_into(cmd, out, size)
                data = bytearray()
            else:
                data = self._recv_exact(cmd, size)
            self.pending = False
            return data

    def _recv_into(self, cmd: RpcCmd, out: memoryview, n: int) -> None:
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(out[got:], n - got)
            except TimeoutError:
                raise self._fail(cmd, f"no answer within {self.timeout:g} s") from None
            except OSError as e:
                raise self._fail(cmd, f"receive failed: {e}") from None
            if k == 0:
                raise self._fail(cmd, f"connection closed by the server after {got} of {n} bytes")
            got += k
        self.bytes_received += n

    def synchronize(self) -> None:
        """Wait for every command sent (one cheap request if any is unanswered); a failed graph shows here."""
        with self.lock:
            if self.pending and self.broken is None:
                self.request(RpcCmd.GET_ALIGNMENT, GET_ALIGNMENT_REQ.pack(0), GET_ALIGNMENT_RSP.size)

    def _close_socket(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        with self.lock:
            if self.broken is None:
                try:
                    self._flush(RpcCmd.NONE)
                except RpcConnectionError:
                    pass
            if self.broken is None:
                self.broken = "closed by this client"
            self._close_socket()
        with _lock:
            if _connections.get(self.endpoint) is self:
                del _connections[self.endpoint]

    def __repr__(self) -> str:
        state = f"broken: {self.broken}" if self.broken else "open"
        return f"Connection('{self.endpoint}', {state})"


_connections: dict[str, Connection] = {}
_lock = threading.Lock()
_connect_lock = threading.Lock()


def connect(endpoint: str, timeout: float | None = None) -> Connection:
    """The open connection to `endpoint`, or a new one (a broken one is replaced)."""
    host, port, _ = parse_endpoint(endpoint)
    key = f"{host}:{port}"
    # held while connecting: ggml-rpc-server serves one client at a time, a second would wait for the first
    with _connect_lock:
        with _lock:
            conn = _connections.get(key)
            if conn is not None and conn.broken is None:
                return conn
        conn = Connection(key, timeout)
        with _lock:
            _connections[key] = conn
        return conn


def close_all() -> None:
    """Close every connection (tests; a process that wants its servers to see it go)."""
    with _lock:
        conns = list(_connections.values())
    for conn in conns:
        conn.close()
