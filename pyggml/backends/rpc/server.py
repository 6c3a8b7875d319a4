"""`pyggml rpc-server`: any pyggml backend served with ggml's RPC protocol 7.0.0, as ggml-rpc-server on the wire.

Beyond the C server, on the side of safety: a thread per client, every message checked before anything is
done (a failed check closes that connection, not the server), graphs' cost and memory bounded, connections
and timeouts bounded, 127.0.0.1 by default (the protocol has no authentication). DESIGN.md, "The RPC backend".
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.backends.rpc import wire
from pyggml.backends.rpc.fallback import FallbackPlan, plan_fallback
from pyggml.backends.rpc.wire import RpcCmd, RpcError, RpcTensor
from pyggml.core.errors import ArgumentError, GGMLError
from pyggml.core.graph import Graph
from pyggml.core.ops.node_check import check_node
from pyggml.core.tensor import VIEW_OPS, GGMLOp, Tensor, TensorFlag, nbytes_of
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.core.work import WorkBudget, graph_cost
from pyggml.ggml_backend.backend import Backend, op_desc
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_memset, tensor_set

log = logging.getLogger("pyggml.backends.rpc.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50052  # ggml-rpc-server's
# a GRAPH_COMPUTE payload: ~220k tensors, several times the largest graph llama.cpp makes (its graph_max_nodes)
MAX_GRAPH_BYTES = 64 * 1024 * 1024
FAST_RANGE_MAX = 64 * 1024  # SET_TENSOR and GET_TENSOR of at most this many bytes keep their checked range
MAX_FAST_RANGES = 1024  # per client
DEFAULT_MAX_CONNECTIONS = 32  # clients at once; more are closed as they come
DEFAULT_HELLO_TIMEOUT = 5.0  # seconds from connecting to a whole HELLO
DEFAULT_IDLE_TIMEOUT = 600.0  # seconds between messages of a client without buffers (llama-server's --timeout)
KEEPALIVE = (60, 10, 6)  # TCP keepalive: idle seconds before the first probe, seconds between probes, probes
DEFAULT_MESSAGE_TIMEOUT = 60.0  # seconds for a whole message, plus a second per MESSAGE_RATE bytes it announces
MESSAGE_RATE = 1 << 20  # bytes a second a large message may take beyond message_timeout
REFUSAL_LOG_INTERVAL = 1.0  # seconds between the log lines of refused connections
ACCEPT_BACKOFF = (0.05, 1.0)  # seconds accept() waits after running out of descriptors, doubling up to the last
# accept() failing for want of descriptors or kernel memory: retried once some are freed
_ACCEPT_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# a connection that failed before accept() returned it: the next one is accepted
_ACCEPT_LOST = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR, errno.ETIMEDOUT})
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_RAW = GGMLType.I8  # the type of the byte ranges the server reads and writes


class Malformed(RpcError):
    """A message the server refuses: the connection is closed and the reason logged."""


class _Idle(Exception):
    """A client that sent nothing for the idle timeout: its connection is closed (not the client's error)."""


@dataclass
class StoredGraph:
    backend: Backend
    graph: Graph
    plan: Any  # the backend's graph plan, or a FallbackPlan when the backend lacks some of the nodes
    temp_bytes: int = 0  # what its kernels may hold while it is stored (counted in mem_used)

    def compute(self) -> None:
        if isinstance(self.plan, FallbackPlan):
            self.plan.compute()
        else:
            self.backend.graph_plan_compute(self.plan)

    def free(self) -> None:
        if isinstance(self.plan, FallbackPlan):
            self.plan.free()
        else:
            self.backend.graph_plan_free(self.plan)


@dataclass
class Session:
    """One client: its buffers by id and its last graph per device."""

    peer: str
    buffers: dict[int, Buffer] = field(default_factory=dict)
    graphs: dict[int, StoredGraph] = field(default_factory=dict)
    # the checked byte range of a small SET_TENSOR or GET_TENSOR by its request's fixed part: a decode step sends
    # the same few each time, and their checks (tensor, buffer, bounds) hold while no buffer is freed
    ranges: dict[bytes, Tensor] = field(default_factory=dict)


class RpcServer:
    """Serves `backends` (device i = backends[i]) on host:port; `idle_timeout` applies to clients without buffers.

    With `fallback`, a graph node a served backend lacks is computed on the host CPU (`host_cpu`, else the registry's
    "cpu" with `host_threads`, made when first needed; see `fallback`), each op named once in the log; without
    it such a graph is refused.
    """

    def __init__(self, backends: list[Backend], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 cache_dir: str | os.PathLike[str] | None = None, mem_limit: int | None = None,
                 budget: WorkBudget | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 hello_timeout: float = DEFAULT_HELLO_TIMEOUT, idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
                 message_timeout: float = DEFAULT_MESSAGE_TIMEOUT, fallback: bool = True,
                 host_cpu: Backend | None = None, host_threads: int | None = None) -> None:
        if not backends:
            raise GGMLError("rpc-server: no backend to serve")
        if max_connections < 1:
            raise ArgumentError(f"rpc-server: max_connections = {max_connections}, must be >= 1")
        for name, value in (("hello_timeout", hello_timeout), ("idle_timeout", idle_timeout),
                            ("message_timeout", message_timeout)):
            if value is not None and not value > 0:
                raise ArgumentError(f"rpc-server: {name} = {value} seconds, must be > 0")
        self.budget = budget if budget is not None else WorkBudget()
        self.fallback = fallback
        self._host_cpu = host_cpu
        self.host_threads = host_threads
        self.fell_back: set[str] = set()  # the ops computed on the host so far (each logged once)
        self.max_connections = max_connections
        self.hello_timeout = hello_timeout
        self.idle_timeout = idle_timeout
        self.message_timeout = message_timeout
        self.n_refused = 0  # connections closed at once: max_connections were open
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
        self.backends = list(backends)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.mem_limit = mem_limit
        self.mem_used = 0
        self.lock = threading.RLock()  # one command at a time on the backends
        self._ids = itertools.count(1)
        self.sessions: set[int] = set()
        self.n_connections = 0
        self.counts: Counter[str] = Counter()  # commands served, by name (GRAPH_COMPUTE, ...), all clients
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._clients: set[socket.socket] = set()
        if host not in LOOPBACK:
            log.warning("rpc-server: listening on %s, not only this machine: anyone who can reach it can read and "
                        "write its memory (the RPC protocol has no authentication)", host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise GGMLError(f"rpc-server: cannot listen on {host}:{port}: {e}") from None
        self.sock.listen(128)
        self.host, self.port = self.sock.getsockname()[:2]
        self._accept_thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def version(self) -> str:
        return f"{wire.RPC_PROTO_MAJOR_VERSION}.{wire.RPC_PROTO_MINOR_VERSION}.{wire.RPC_PROTO_PATCH_VERSION}"

    def start(self) -> RpcServer:
        self._accept_thread = threading.Thread(target=self.serve_forever, name=f"rpc-server {self.endpoint}",
                                               daemon=True)
        self._accept_thread.start()
        return self

    def serve_forever(self) -> None:
        """Accept clients until `close()`; GGMLError when accept() fails for a reason that is not retried."""
        log.info("rpc-server: protocol %d.%d.%d on %s, devices: %s", wire.RPC_PROTO_MAJOR_VERSION,
                 wire.RPC_PROTO_MINOR_VERSION, wire.RPC_PROTO_PATCH_VERSION, self.endpoint,
                 ", ".join(f"{i}: {b.name()}" for i, b in enumerate(self.backends)))
        backoff = ACCEPT_BACKOFF[0]
        while not self._closing:
            try:
                conn, addr = self.sock.accept()
            except OSError as e:
                if self._closing:
                    break
                if e.errno in _ACCEPT_EXHAUSTED:
                    log.warning("rpc-server: cannot accept a connection: %s (%d open); trying again in %g s",
                                e, len(self._clients), backoff)
                    time.sleep(backoff)
                    backoff = min(2 * backoff, ACCEPT_BACKOFF[1])
                    continue
                if e.errno in _ACCEPT_LOST:
                    continue
                raise GGMLError(f"rpc-server: accepting on {self.endpoint} failed: {e}") from e
            backoff = ACCEPT_BACKOFF[0]
            self._start_client(conn, f"{addr[0]}:{addr[1]}")

    def _start_client(self, conn: socket.socket, peer: str) -> None:
        if len(self._clients) >= self.max_connections:
            self._refuse(conn, peer, f"{len(self._clients)} connections are open (the most allowed)")
            return
        self.n_connections += 1
        self._clients.add(conn)
        t = threading.Thread(target=self._serve_client, args=(conn, peer), daemon=True, name=f"rpc client {peer}")
        self._threads = [x for x in self._threads if x.is_alive()]
        try:
            t.start()
        except RuntimeError as e:  # no thread for it (the process's limit): refused as above
            self._clients.discard(conn)
            self._refuse(conn, peer, f"no thread for it: {e}")
            return
        self._threads.append(t)

    def _refuse(self, conn: socket.socket, peer: str, why: str) -> None:
        """Close a connection as it comes; logged at most once per REFUSAL_LOG_INTERVAL."""
        conn.close()
        self.n_refused += 1
        now = time.monotonic()
        if now >= self._refusal_logged + REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            log.warning("rpc-server: client %s refused: %s (%d refused since the server started)", peer, why,
                        self.n_refused)

    def close(self) -> None:
        self._closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in list(self._clients):  # the clients see the server go, as when its process ends
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve_client(self, conn: socket.socket, peer: str) -> None:
        session = Session(peer)
        log.info("rpc-server: client %s connected", peer)
        why = "disconnected"
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keepalive(conn)
            reader = _Reader(conn)
            reader.start(self.hello_timeout)
            self._hello(conn, reader)
            while True:
                cmd = reader.next_command(None if session.buffers else self.idle_timeout)
                if cmd is None:
                    break
                reader.start(self.message_timeout)
                self._one_message(conn, reader, session, cmd)
        except _Idle as e:
            why = f"closed: {e}"
            log.info("rpc-server: client %s: %s; closing the connection", peer, e)
        except Malformed as e:
            why = f"closed: {e}"
            log.warning("rpc-server: client %s: %s; closing the connection", peer, e)
        except (OSError, EOFError) as e:
            why = f"connection lost: {e}"
        except Exception as e:  # a bug or a backend failure: this client goes, the server stays
            why = f"closed after an error: {type(e).__name__}: {e}"
            log.error("rpc-server: client %s: %s: %s; closing the connection", peer, type(e).__name__, e)
        finally:
            n = self._free_session(session)
            self._clients.discard(conn)
            try:
                conn.close()
            except OSError:
                pass
            log.info("rpc-server: client %s %s (%d buffer(s) freed)", peer, why, n)

    def _free_session(self, session: Session) -> int:
        with self.lock:
            self._drop_graphs(session)
            n = len(session.buffers)
            for buffer in session.buffers.values():
                self.mem_used -= buffer.size
                buffer.free()
            session.buffers.clear()
        return n

    def _send(self, conn: socket.socket, payload: bytes | bytearray | memoryview) -> None:
        """| size | payload | in one uncopied send, taken within the message deadline or Malformed."""
        seconds = self.message_timeout + len(payload) / MESSAGE_RATE
        conn.settimeout(seconds)
        try:
            wire.send_parts(conn, [wire.SIZE_HEADER.pack(len(payload)), payload])
        except TimeoutError:
            raise Malformed(f"an answer of {len(payload)} bytes was not taken within {seconds:g} s") from None

    def _hello(self, conn: socket.socket, reader: _Reader) -> None:
        head = reader.read(9, "HELLO")
        cmd, size = wire.CMD_HEADER.unpack(head)
        if cmd != RpcCmd.HELLO:
            raise Malformed(f"the first command is {cmd}, not HELLO ({int(RpcCmd.HELLO)}): a client of an older "
                            f"protocol?")
        if size != wire.HELLO_REQ.size:
            raise Malformed(f"HELLO of {size} bytes, expected {wire.HELLO_REQ.size} (protocol "
                            f"{wire.RPC_PROTO_MAJOR_VERSION}.x)")
        reader.read(size, "HELLO")  # the client's conn_caps: pyggml has no RDMA, so none are answered
        self._send(conn, wire.pack_hello_rsp())

    def _one_message(self, conn: socket.socket, reader: _Reader, session: Session, cmd_byte: int) -> None:
        if cmd_byte >= wire.RPC_CMD_COUNT or cmd_byte == RpcCmd.NONE:
            raise Malformed(f"unknown command {cmd_byte}")
        cmd = RpcCmd(cmd_byte)
        (size,) = wire.SIZE_HEADER.unpack(reader.read(8, cmd.name))
        if cmd == RpcCmd.HELLO:
            raise Malformed("HELLO after the handshake")
        expected = wire.REQUEST_SIZE[cmd]
        if expected is not None and size != expected:
            raise Malformed(f"{cmd.name} of {size} bytes, expected {expected}")
        if cmd == RpcCmd.SET_TENSOR:
            largest = max((b.size for b in session.buffers.values()), default=0)
            if not wire.SET_TENSOR_HEADER_SIZE <= size <= wire.SET_TENSOR_HEADER_SIZE + largest:
                raise Malformed(f"SET_TENSOR of {size} bytes: not between its {wire.SET_TENSOR_HEADER_SIZE}-byte "
                                f"header and the header plus the client's largest buffer ({largest} bytes)")
        elif cmd == RpcCmd.GRAPH_COMPUTE and size > MAX_GRAPH_BYTES:
            raise Malformed(f"GRAPH_COMPUTE of {size} bytes exceeds MAX_GRAPH_BYTES ({MAX_GRAPH_BYTES})")
        reader.extend(size / MESSAGE_RATE)
        payload = reader.read(size, cmd.name)
        with self.lock:
            try:
                response = self._handle(session, cmd, payload)
            except Malformed:
                raise
            except GGMLError as e:  # a check of pyggml's own refused it: the client's fault, said as such
                raise Malformed(f"{cmd.name}: {type(e).__name__}: {e}") from None
            self.counts[cmd.name] += 1
        if response is not None:
            self._send(conn, response)

    def _handle(self, s: Session, cmd: RpcCmd, p: bytearray) -> bytes | None:
        if cmd == RpcCmd.DEVICE_COUNT:
            return wire.DEVICE_COUNT_RSP.pack(len(self.backends))
        if cmd == RpcCmd.ALLOC_BUFFER:
            device, size = wire.ALLOC_BUFFER_REQ.unpack(p)
            return self._alloc_buffer(s, self._backend(device, cmd), size)
        if cmd == RpcCmd.GET_ALIGNMENT:
            (device,) = wire.GET_ALIGNMENT_REQ.unpack(p)
            return wire.GET_ALIGNMENT_RSP.pack(self._backend(device, cmd).get_default_buffer_type().get_alignment())
        if cmd == RpcCmd.GET_MAX_SIZE:
            (device,) = wire.GET_MAX_SIZE_REQ.unpack(p)
            max_size = self._backend(device, cmd).get_default_buffer_type().get_max_size()
            if self.mem_limit is not None:
                max_size = min(max_size, self.mem_limit)
            return wire.GET_MAX_SIZE_RSP.pack(min(max_size, 2**64 - 1))
        if cmd == RpcCmd.BUFFER_GET_BASE:
            (remote,) = wire.BUFFER_GET_BASE_REQ.unpack(p)
            return wire.BUFFER_GET_BASE_RSP.pack(self._buffer(s, remote, cmd).get_base())
        if cmd == RpcCmd.FREE_BUFFER:
            (remote,) = wire.FREE_BUFFER_REQ.unpack(p)
            buffer = self._buffer(s, remote, cmd)
            self._drop_graphs(s)  # as the C server: stored graphs may point into the buffer
            s.ranges.clear()
            del s.buffers[remote]
            self.mem_used -= buffer.size
            buffer.free()
            return None
        if cmd == RpcCmd.BUFFER_CLEAR:
            remote, value = wire.BUFFER_CLEAR_REQ.unpack(p)
            self._buffer(s, remote, cmd).clear(value)
            return None
        if cmd == RpcCmd.SET_TENSOR:
            return self._set_tensor(s, p)
        if cmd == RpcCmd.SET_TENSOR_HASH:
            return self._set_tensor_hash(s, p)
        if cmd == RpcCmd.GET_TENSOR:
            offset, size = wire.GET_TENSOR_REQ_TAIL.unpack_from(p, wire.RPC_TENSOR_SIZE)
            key = bytes(p) if size <= FAST_RANGE_MAX else None
            raw = s.ranges.get(key) if key is not None else None
            if raw is None:
                t = self._tensor(s, RpcTensor.unpack(p), cmd, need_buffer=True)
                raw = self._raw(t, offset, size, cmd)
                if key is not None:
                    self._keep_range(s, key, raw)
            out = np.empty(size, dtype=np.uint8)
            if size:
                tensor_get(raw, out)
            return memoryview(out)
        if cmd == RpcCmd.MEMSET_TENSOR:
            t = self._tensor(s, RpcTensor.unpack(p), cmd, need_buffer=True)
            offset, size, value = wire.MEMSET_TENSOR_REQ_TAIL.unpack_from(p, wire.RPC_TENSOR_SIZE)
            if offset > t.nbytes() or size > t.nbytes() - offset:
                raise Malformed(f"MEMSET_TENSOR: {size} bytes at offset {offset} are outside '{t.name}' "
                                f"({t.nbytes()} bytes)")
            if size:
                tensor_memset(self._raw(t, offset, size, cmd), value)
            return None
        if cmd == RpcCmd.COPY_TENSOR:
            src = self._tensor(s, RpcTensor.unpack(p, 0), cmd, need_buffer=True)
            dst = self._tensor(s, RpcTensor.unpack(p, wire.RPC_TENSOR_SIZE), cmd, need_buffer=True)
            n = src.nbytes()
            # as ggml's CPU buffer: the source's bytes, raw, at the destination's address
            dst_raw = self._raw(dst, 0, n, cmd)
            if n:
                tmp = np.empty(n, dtype=np.uint8)
                tensor_get(self._raw(src, 0, n, cmd), tmp)
                tensor_set(dst_raw, tmp)
            return wire.COPY_TENSOR_RSP.pack(1)
        if cmd == RpcCmd.INIT_TENSOR:
            t = self._tensor(s, RpcTensor.unpack(p), cmd)
            if t.buffer is not None:
                t.buffer.init_tensor(t)
            return None
        if cmd == RpcCmd.GET_ALLOC_SIZE:
            (device,) = wire.GET_ALLOC_SIZE_REQ_HEAD.unpack_from(p)
            backend = self._backend(device, cmd)
            t = self._tensor(s, RpcTensor.unpack(p, 4), cmd)
            for i in range(wire.GGML_MAX_SRC):
                rs = RpcTensor.unpack(p, 4 + wire.RPC_TENSOR_SIZE * (1 + i))
                if rs.id:
                    t.src[i] = self._tensor(s, rs, cmd)
            buft = t.buffer.buft if t.buffer is not None and t.buffer.buft is not None \
                else backend.get_default_buffer_type()
            size = buft.get_alloc_size(t)
            if size >= 2**64:  # (u32 ne and nb make sizes far beyond size_t)
                raise Malformed(f"GET_ALLOC_SIZE: tensor '{t.name}' ({list(t.ne)}, nb {list(t.nb)}) needs {size} "
                                f"bytes, more than 64 bits hold")
            return wire.GET_ALLOC_SIZE_RSP.pack(size)
        if cmd == RpcCmd.GET_DEVICE_MEMORY:
            (device,) = wire.GET_DEVICE_MEMORY_REQ.unpack(p)
            free, total = self._device_memory(self._backend(device, cmd))
            return wire.GET_DEVICE_MEMORY_RSP.pack(free, total)
        if cmd == RpcCmd.GRAPH_COMPUTE:
            self._graph_compute(s, p)
            return None
        if cmd == RpcCmd.GRAPH_RECOMPUTE:
            (device,) = wire.GRAPH_RECOMPUTE_REQ.unpack(p)
            backend = self._backend(device, cmd)
            sg = s.graphs.get(device)
            if sg is None:
                raise Malformed(f"GRAPH_RECOMPUTE on device {device}, which holds no graph of this client")
            self._compute(backend, sg)
            return None
        raise Malformed(f"command {cmd.name} is not served")  # pragma: no cover - every command is above

    def _backend(self, device: int, cmd: RpcCmd) -> Backend:
        if device >= len(self.backends):
            raise Malformed(f"{cmd.name}: device {device} does not exist ({len(self.backends)} device(s))")
        return self.backends[device]

    def _buffer(self, s: Session, remote: int, cmd: RpcCmd) -> Buffer:
        buffer = s.buffers.get(remote)
        if buffer is None:
            raise Malformed(f"{cmd.name}: buffer {remote:#x} is not one of this client's "
                            f"({len(s.buffers)} buffer(s))")
        return buffer

    def _device_memory(self, backend: Backend) -> tuple[int, int]:
        dev = backend.get_device()
        free, total = dev.memory() if dev is not None else (0, 0)
        if self.mem_limit is not None:
            total = self.mem_limit if total == 0 else min(total, self.mem_limit)
            free = min(free if free else total, max(self.mem_limit - self.mem_used, 0))
        return free, total

    def _alloc_buffer(self, s: Session, backend: Backend, size: int) -> bytes:
        if self.mem_limit is not None and self.mem_used + size > self.mem_limit:
            log.warning("rpc-server: client %s: a buffer of %d bytes would exceed the memory limit (%d of %d "
                        "bytes in use)", s.peer, size, self.mem_used, self.mem_limit)
            return wire.ALLOC_BUFFER_RSP.pack(0, 0)
        try:
            buffer = backend.alloc_buffer(size)
        except Exception as e:  # any failure to allocate is the client's out-of-memory, as in the C server
            log.warning("rpc-server: client %s: no buffer of %d bytes on '%s': %s: %s", s.peer, size,
                        backend.name(), type(e).__name__, e)
            return wire.ALLOC_BUFFER_RSP.pack(0, 0)
        remote = next(self._ids) << 4  # ids look like addresses, never 0
        s.buffers[remote] = buffer
        self.mem_used += buffer.size
        return wire.ALLOC_BUFFER_RSP.pack(remote, buffer.size)

    def _tensor(self, s: Session, rt: RpcTensor, cmd: RpcCmd, need_buffer: bool = False) -> Tensor:
        """deserialize_tensor, checked: type and op known, buffer the client's, bytes inside it."""
        name = rt.name_str
        if rt.type not in GGMLType._value2member_map_ or TYPE_TRAITS[rt.type].blck_size == 0:
            raise Malformed(f"{cmd.name}: tensor '{name}' has type {rt.type}, not a ggml type")
        if rt.op not in GGMLOp._value2member_map_:
            raise Malformed(f"{cmd.name}: tensor '{name}' has op {rt.op}, not a ggml op of 0c1e570")
        type_ = GGMLType(rt.type)
        tr = TYPE_TRAITS[type_]
        ne, nb = list(rt.ne), list(rt.nb)
        if ne[0] % tr.blck_size:
            raise Malformed(f"{cmd.name}: tensor '{name}' of type {type_.name} has ne[0] = {ne[0]}, not a multiple "
                            f"of its block size {tr.blck_size}")
        t = Tensor(None, type_, ne, nb)
        t.op = GGMLOp(rt.op)
        t.op_params[:] = rt.op_params
        t.flags = TensorFlag(rt.flags & 0x1F)
        t.name = name
        t.view_offs = rt.view_offs
        if rt.buffer:
            buffer = self._buffer(s, rt.buffer, cmd)
            base, n = buffer.get_base(), nbytes_of(type_, ne, nb)
            if rt.data < base or rt.data + n > base + buffer.size:
                raise Malformed(f"{cmd.name}: tensor '{name}' ({n} bytes at {rt.data:#x}) is outside its buffer "
                                f"{rt.buffer:#x} ({buffer.size} bytes at {base:#x})")
            t.buffer, t.data = buffer, rt.data
        elif rt.data:
            raise Malformed(f"{cmd.name}: tensor '{name}' has data {rt.data:#x} but no buffer")
        elif need_buffer:
            raise Malformed(f"{cmd.name}: tensor '{name}' has no buffer")
        return t

    @staticmethod
    def _raw(t: Tensor, offset: int, size: int, cmd: RpcCmd) -> Tensor:
        """`size` bytes from t.data + offset as a tensor of bytes, checked inside t's buffer (the C server's
        bounds: the buffer's, not the tensor's)."""
        buffer = t.buffer
        assert buffer is not None and t.data is not None
        base = buffer.get_base()
        start = t.data + offset
        if start < base or start + size > base + buffer.size or (size and start >= base + buffer.size):
            raise Malformed(f"{cmd.name}: {size} bytes at offset {offset} of '{t.name}' are outside its buffer "
                            f"({buffer.size} bytes)")
        raw = Tensor(None, _RAW, [max(size, 1)])
        raw.ne = [size, 1, 1, 1]
        raw.buffer, raw.data, raw.name = buffer, start, t.name
        return raw

    @staticmethod
    def _keep_range(s: Session, key: bytes, raw: Tensor) -> None:
        if len(s.ranges) >= MAX_FAST_RANGES:  # a client that sends many different ones: start again
            s.ranges.clear()
        s.ranges[key] = raw

    def _set_tensor(self, s: Session, p: bytearray) -> None:
        size = len(p) - wire.SET_TENSOR_HEADER_SIZE
        if 0 <= size <= FAST_RANGE_MAX and (self.cache_dir is None or not p[wire.RPC_TENSOR_SIZE]):
            key = bytes(memoryview(p)[:wire.SET_TENSOR_HEADER_SIZE]) + size.to_bytes(8, "little")
            raw = s.ranges.get(key)
            if raw is None:
                raw = self._set_range(s, p)
                self._keep_range(s, key, raw)
            if size:
                tensor_set(raw, np.frombuffer(p, dtype=np.uint8, offset=wire.SET_TENSOR_HEADER_SIZE))
            return None
        raw = self._set_range(s, p)
        _, cache_flag, _, data = wire.unpack_set_tensor(p)
        if self.cache_dir is not None and cache_flag and size:
            path = self.cache_dir / f"{wire.fnv_hash(data):016x}"
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(path)  # whole files only: another client may read it at any time
            log.info("rpc-server: client %s: cached %d bytes of '%s' as %s", s.peer, size, raw.name, path.name)
        if size:
            tensor_set(raw, np.frombuffer(data, dtype=np.uint8))
        return None

    def _set_range(self, s: Session, p: bytearray) -> Tensor:
        rt, _, offset, data = wire.unpack_set_tensor(p)
        t = self._tensor(s, rt, RpcCmd.SET_TENSOR, need_buffer=True)
        return self._raw(t, offset, len(data), RpcCmd.SET_TENSOR)

    def _set_tensor_hash(self, s: Session, p: bytearray) -> bytes:
        rt = RpcTensor.unpack(p)
        offset, h = wire.SET_TENSOR_HASH_REQ_TAIL.unpack_from(p, wire.RPC_TENSOR_SIZE)
        t = self._tensor(s, rt, RpcCmd.SET_TENSOR_HASH, need_buffer=True)
        if self.cache_dir is None:
            return wire.SET_TENSOR_HASH_RSP.pack(0)
        path = self.cache_dir / f"{h:016x}"
        try:
            data = path.read_bytes()
        except OSError:
            return wire.SET_TENSOR_HASH_RSP.pack(0)
        if wire.fnv_hash(data) != h:  # a damaged or foreign file is not the client's data
            log.warning("rpc-server: cache file %s does not hash to its name; ignored", path)
            return wire.SET_TENSOR_HASH_RSP.pack(0)
        raw = self._raw(t, offset, len(data), RpcCmd.SET_TENSOR_HASH)
        if data:
            tensor_set(raw, np.frombuffer(data, dtype=np.uint8))
        return wire.SET_TENSOR_HASH_RSP.pack(1)

    def _graph_compute(self, s: Session, p: bytearray) -> None:
        try:
            device, node_ids, rts = wire.unpack_graph(p)
        except RpcError as e:
            raise Malformed(str(e)) from None
        backend = self._backend(device, RpcCmd.GRAPH_COMPUTE)
        by_id: dict[int, RpcTensor] = {}
        for rt in rts:
            if rt.id == 0 or rt.id in by_id:
                raise Malformed(f"GRAPH_COMPUTE: tensor id {rt.id:#x} is {'null' if rt.id == 0 else 'repeated'}")
            by_id[rt.id] = rt
        made: dict[int, Tensor] = {}
        for nid in node_ids:
            if nid not in by_id:
                raise Malformed(f"GRAPH_COMPUTE: node id {nid:#x} is not among the {len(rts)} tensors")
            self._make(s, nid, by_id, made)
        nodes: list[Tensor] = []
        seen: set[int] = set()
        for nid in node_ids:
            t = made[nid]
            if nid in seen:
                raise Malformed(f"GRAPH_COMPUTE: node '{t.name}' is listed twice")
            seen.add(nid)
            # ggml's backends compute the nodes ggml_build_forward_expand marked, and nothing for views
            if not t.flags & TensorFlag.COMPUTE or t.op == GGMLOp.NONE or t.op in VIEW_OPS:
                continue
            for j, src in enumerate((t, *t.src)):
                if src is not None and src.data is None:
                    what = "it" if j == 0 else f"its src[{j - 1}] '{src.name}'"
                    raise Malformed(f"GRAPH_COMPUTE: node '{t.name}' ({t.op.name}): {what} has no memory")
            check_node(t)
            nodes.append(t)
        old = s.graphs.pop(device, None)
        if old is not None:
            self._free_plan(old)
        room = None if self.mem_limit is None else self.mem_limit - self.mem_used
        cost = graph_cost(nodes, self.budget, room)
        graph = Graph(max(len(nodes), 1))
        graph.nodes = nodes
        try:
            if self.fallback and not all(backend.supports_op(n) for n in nodes):
                room = None if room is None else room - cost.temp_bytes
                plan: Any = plan_fallback(nodes, backend, self.host_cpu, self.budget, room)
                self._log_fallback(backend, plan)
            else:
                plan = backend.graph_plan_create(graph)
        except GGMLError as e:
            raise Malformed(f"GRAPH_COMPUTE on '{backend.name()}': {e}") from None
        extra = plan.temp_bytes if isinstance(plan, FallbackPlan) else 0
        sg = StoredGraph(backend, graph, plan, cost.temp_bytes + extra)
        self.mem_used += sg.temp_bytes
        s.graphs[device] = sg  # (stored first: a failed compute closes the connection, which frees it)
        self._compute(backend, sg)

    def _make(self, s: Session, root: int, by_id: dict[int, RpcTensor], made: dict[int, Tensor]) -> None:
        """create_node without recursion; a tensor reached again while it is being made is a cycle."""
        building: set[int] = set()
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            tid, state = stack.pop()
            if tid in made:
                continue
            rt = by_id.get(tid)
            if rt is None:
                raise Malformed(f"GRAPH_COMPUTE: tensor id {tid:#x} is referenced but not sent")
            deps = [x for x in (*rt.src, rt.view_src) if x]
            if state == 0:
                if tid in building:
                    raise Malformed(f"GRAPH_COMPUTE: tensor '{rt.name_str}' depends on itself (a cycle)")
                building.add(tid)
                stack.append((tid, 1))
                for d in reversed(deps):
                    if d not in made:
                        if d in building:
                            raise Malformed(f"GRAPH_COMPUTE: tensor '{rt.name_str}' is in a cycle through "
                                            f"'{by_id[d].name_str}'")
                        stack.append((d, 0))
                continue
            t = self._tensor(s, rt, RpcCmd.GRAPH_COMPUTE)
            for i, x in enumerate(rt.src):
                t.src[i] = made[x] if x else None
            if rt.view_src:
                v = made[rt.view_src]
                if v.buffer is not t.buffer or (t.data is not None and v.data is not None
                                                and t.data != v.data + rt.view_offs):
                    raise Malformed(f"GRAPH_COMPUTE: view '{t.name}' is not at its source '{v.name}' plus "
                                    f"view_offs {rt.view_offs}")
                t.view_src = v
            building.discard(tid)
            made[tid] = t

    def host_cpu(self) -> Backend:
        """The host CPU backend that computes what a served backend lacks (made when first asked for)."""
        if self._host_cpu is None:
            from pyggml.ggml_backend.registry import init_backend, set_n_threads

            self._host_cpu = init_backend("cpu")
            if self.host_threads is not None:
                set_n_threads(self._host_cpu, self.host_threads)
        return self._host_cpu

    def _log_fallback(self, backend: Backend, plan: FallbackPlan) -> None:
        for node in plan.lacking:
            op = op_desc(node)
            if op not in self.fell_back:
                self.fell_back.add(op)
                log.warning("rpc-server: '%s' does not compute op %s (node '%s'); such nodes run on the host "
                            "CPU ('%s')", backend.name(), op, node.name, self.host_cpu().name())

    def _compute(self, backend: Backend, sg: StoredGraph) -> None:
        try:
            sg.compute()
            backend.synchronize()
        except Exception as e:
            node = _failing_node(e, sg.graph)
            raise Malformed(f"'{backend.name()}' cannot compute the graph{node}: {type(e).__name__}: {e}") from None

    def _free_plan(self, sg: StoredGraph) -> None:
        sg.free()
        self.mem_used -= sg.temp_bytes

    def _drop_graphs(self, s: Session) -> None:
        for sg in s.graphs.values():
            self._free_plan(sg)
        s.graphs.clear()


class _Reader:
    """A client's bytes through one buffer (commands sent together cost one receive); a message must be whole
    by its deadline, and a payload grows as received, never from its announced size."""

    CHUNK = 64 * 1024  # what one receive asks for while reading commands
    LARGE_CHUNK = 1 << 20  # what one receive asks for in the middle of a large payload

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray()
        self.pos = 0
        self.deadline = 0.0
        self.allowed = 0.0
        self._large: bytearray | None = None

    def start(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.allowed = seconds

    def extend(self, seconds: float) -> None:
        self.deadline += seconds
        self.allowed += seconds

    def next_command(self, idle_timeout: float | None) -> int | None:
        """The next command byte, or None when the client left; _Idle when none comes within `idle_timeout`
        seconds (None: no limit)."""
        if self.pos == len(self.buf):
            self.conn.settimeout(idle_timeout)
            try:
                got = self._receive()
            except TimeoutError:
                raise _Idle(f"no message for {idle_timeout:g} s") from None
            if not got:
                return None
        cmd = self.buf[self.pos]
        self.pos += 1
        return cmd

    def _receive(self) -> int:
        if self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        chunk = self.conn.recv(self.CHUNK)
        self.buf += chunk
        return len(chunk)

    def _wait(self, what: str, got: int, n: int) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Malformed(f"{what}: {got} of {n} bytes came within {self.allowed:g} s")
        self.conn.settimeout(left)

    def read(self, n: int, what: str) -> bytearray:
        """Exactly n bytes of the message `what`: Malformed when they do not come before the deadline,
        EOFError when the client leaves first."""
        buf, pos = self.buf, self.pos
        if len(buf) - pos >= n:
            self.pos = pos + n
            return buf[pos:pos + n]
        out = buf[pos:]
        buf.clear()
        self.pos = 0
        try:
            while len(out) < n:
                rest = n - len(out)
                self._wait(what, len(out), n)
                if rest >= self.CHUNK:  # received in large pieces, kept as they come
                    if self._large is None:
                        self._large = bytearray(self.LARGE_CHUNK)
                    k = self.conn.recv_into(self._large, min(rest, self.LARGE_CHUNK))
                    out += memoryview(self._large)[:k]
                else:  # a small rest: received with whatever follows it
                    k = min(self._receive(), rest)
                    out += memoryview(self.buf)[:k]
                    self.pos = k
                if k == 0:
                    raise EOFError(f"{what}: the client left after {len(out)} of {n} bytes")
        except TimeoutError:
            raise Malformed(f"{what}: {len(out)} of {n} bytes came within {self.allowed:g} s") from None
        return out


def _keepalive(conn: socket.socket) -> None:
    """TCP keepalive on `conn`: a client whose machine went away is found gone."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE, strict=True):
        option = getattr(socket, name, None)
        if option is not None:
            conn.setsockopt(socket.IPPROTO_TCP, option, value)


def _failing_node(e: Exception, graph: Graph) -> str:
    """' (node i 'name', OP)' when the error names a node of the graph, else ''."""
    text = str(e)
    for i, n in enumerate(graph.nodes):
        if n.name and f"'{n.name}'" in text:
            return f" at node {i} '{n.name}' ({n.op.name})"
    ops = sorted({n.op.name for n in graph.nodes})
    return f" (ops: {', '.join(ops)})"


def start_server(endpoint: str, cache_dir: str | None, n_threads: int, n_devices: int,
                 devices: list[Any]) -> None:
    """ggml_backend_rpc_start_server: serve `devices` (pyggml devices) on endpoint "HOST:PORT", forever."""
    from pyggml.backends.rpc.connection import parse_endpoint
    from pyggml.ggml_backend.registry import set_n_threads

    host, port, _ = parse_endpoint(endpoint)
    backends = []
    for dev in devices[:n_devices]:
        b = dev.init_backend(None)
        set_n_threads(b, n_threads)
        backends.append(b)
    RpcServer(backends, host, port, cache_dir=cache_dir).serve_forever()
