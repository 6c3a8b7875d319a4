"""pyggml's RPC server against hostile clients: nodes its kernels cannot take are typed refusals, a graph's work
and temporaries are bounded before it computes, a payload holds only the bytes that came, every connection has
a deadline, and neither idle connections nor running out of descriptors stop the server or end it."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rpc_util import wait_for
from test_server import LOG, Raw, f32, good_client_works

from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc import wire
from pyggml.backends.rpc.connection import close_all
from pyggml.backends.rpc.server import Malformed, RpcServer
from pyggml.backends.rpc.wire import RpcCmd, RpcTensor
from pyggml.core.errors import GGMLError
from pyggml.core.work import MAX_TEMP_BYTES, WorkBudget

ROOT = Path(__file__).resolve().parents[3]
COMPUTE = 16  # TensorFlag.COMPUTE
ADD, MUL_MAT, GET_ROWS_BACK, ARANGE = 2, 29, 41, 67
I32 = 26


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def srcs(*ids: int) -> tuple[int, ...]:
    return ids + (0,) * (10 - len(ids))


def node(id: int, buffer: int, data: int, ne: tuple[int, ...], nb: tuple[int, ...], op: int,
         src: tuple[int, ...] = (), params: tuple[int, ...] = (), type: int = 0) -> RpcTensor:
    return RpcTensor(id=id, type=type, buffer=buffer, ne=ne, nb=nb, data=data, op=op, flags=COMPUTE,
                     src=srcs(*src), op_params=params + (0,) * (16 - len(params)), name=f"n{id}".encode())


def refused(raw: Raw, caplog: pytest.LogCaptureFixture, text: str) -> str:
    """The connection closed by the server and its warning containing `text` (returned): a refusal by a check,
    not by an accident of the code (which logs an ERROR)."""
    assert raw.closed()
    assert wait_for(lambda: text in caplog.text), caplog.text[-2000:]
    line = next(r.getMessage() for r in caplog.records if r.name == LOG and text in r.getMessage())
    accidents = [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno >= logging.ERROR]
    assert not accidents, accidents
    return line


# --- nodes no kernel can take: typed refusals ---


def _missing_source(raw: Raw) -> None:
    remote, base = raw.alloc(256)
    a = f32(remote, base, 4, id=1)
    c = node(2, remote, base + 16, (4, 1, 1, 1), (4, 16, 16, 16), ADD, src=(1,))
    raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), c.pack()]))


def _get_rows_back_one_source(raw: Raw) -> None:
    remote, base = raw.alloc(256)
    a = f32(remote, base, 4, id=1)
    c = node(2, remote, base + 16, (4, 1, 1, 1), (4, 16, 16, 16), GET_ROWS_BACK, src=(1,))
    raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), c.pack()]))


def _extra_source(raw: Raw) -> None:
    remote, base = raw.alloc(256)
    a = f32(remote, base, 4, id=1)
    c = node(2, remote, base + 16, (4, 1, 1, 1), (4, 16, 16, 16), ADD, src=(1, 1, 1))
    raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), c.pack()]))


def _arange(stop: float) -> object:
    def send(raw: Raw) -> None:
        remote, base = raw.alloc(256)
        c = node(1, remote, base, (4, 1, 1, 1), (4, 16, 16, 16), ARANGE,
                 params=(f32_bits(0.0), f32_bits(stop), f32_bits(1.0)))
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [1], [c.pack()]))
    return send


def _alloc_size_past_64_bits(raw: Raw) -> None:
    t = RpcTensor(id=1, type=0, ne=(2**32 - 1,) * 4, nb=(2**32 - 1,) * 4, name=b"huge")
    raw.send(RpcCmd.GET_ALLOC_SIZE, struct.pack("<I", 0) + t.pack() + wire.NULL_TENSOR * 10)


UNCLEAR = {
    "missing source": (_missing_source, "ArgumentError: node 'n2' (ADD) has no src[1]: ADD takes 2 sources"),
    "GET_ROWS_BACK with one source": (_get_rows_back_one_source,
                                      "ArgumentError: node 'n2' (GET_ROWS_BACK) has no src[1]"),
    "a source beyond the op's": (_extra_source, "ArgumentError: node 'n2' (ADD) has a src[2] '': ADD takes 2 sources"),
    "ARANGE to NaN": (_arange(float("nan")), "ArgumentError: node 'n1' (ARANGE): the count of start=0.0, "
                                             "stop=nan, step=1.0 is nan, not a finite count"),
    "ARANGE to inf": (_arange(float("inf")), "stop=inf, step=1.0 is inf, not a finite count"),
    "ARANGE past its node": (_arange(1e30), "is 1000000015047466219876688855040, the node has 4 elements"),
    "GET_ALLOC_SIZE past 64 bits": (_alloc_size_past_64_bits, f"GET_ALLOC_SIZE: tensor 'huge' ([4294967295, "
                                    f"4294967295, 4294967295, 4294967295], nb [4294967295, 4294967295, 4294967295, "
                                    f"4294967295]) needs {4 + 4 * (2**32 - 2) * (2**32 - 1)} bytes"),
}


@pytest.mark.parametrize("case", list(UNCLEAR))
def test_nodes_no_kernel_can_take_are_typed_refusals(server: RpcServer, case: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    send, text = UNCLEAR[case]
    raw = Raw(server.endpoint)
    send(raw)  # type: ignore[operator]
    line = refused(raw, caplog, text)
    assert re.search(r"client 127\.0\.0\.1:\d+: [A-Z_]+: ", line)  # the client, then the command
    good_client_works(server.endpoint)


# --- work and temporaries bounded before computing ---


def test_a_zero_stride_add_of_4e15_elements_is_refused_before_computing(server: RpcServer,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """64 bytes seen as [16, 65535, 65535, 65535] through zero strides: 4.5e15 additions under the server's lock
    if computed. Refused from the shape alone; a client connected meanwhile keeps its buffer, and the same
    client, connecting again, is served."""
    caplog.set_level(logging.INFO, logger=LOG)
    bystander = Raw(server.endpoint)
    b_remote, b_base = bystander.alloc(64)
    bystander.send(RpcCmd.SET_TENSOR, wire.pack_set_tensor(f32(b_remote, b_base, 4).pack(), 0, 0,
                                                            np.arange(4, dtype=np.float32).tobytes()))
    raw = Raw(server.endpoint)
    remote, base = raw.alloc(64)
    ne, nb = (16, 65535, 65535, 65535), (4, 0, 0, 0)
    a = RpcTensor(id=1, type=0, buffer=remote, ne=ne, nb=nb, data=base, name=b"a")
    c = node(2, remote, base, ne, nb, ADD, src=(1, 1))
    raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), c.pack()]))
    line = refused(raw, caplog, "LimitExceededError")
    assert f"has {16 * 65535**3} elements" in line and "'n2' (ADD)" in line
    got = bystander.request(RpcCmd.GET_TENSOR, f32(b_remote, b_base, 4).pack() + struct.pack("<QQ", 0, 16), 16)
    assert np.frombuffer(got, np.float32).tolist() == [0, 1, 2, 3]
    good_client_works(server.endpoint)


def _mul_mat_zero_stride(raw: Raw, remote: int, base: int, k: int, n: int) -> RpcTensor:
    """In a buffer of 8k + 4n bytes: src0 [k, 1] and src1 [k, n] with nb1 = 0 (k floats seen n times), dst [1, n];
    src0 all 1, src1 0..k-1. The MUL_MAT node sent."""
    w = f32(remote, base, k, id=1)
    x = RpcTensor(id=2, type=0, buffer=remote, ne=(k, n, 1, 1), nb=(4, 0, 0, 0), data=base + 4 * k, name=b"x")
    out = node(3, remote, base + 8 * k, (1, n, 1, 1), (4, 4, 4 * n, 4 * n), MUL_MAT, src=(1, 2))
    raw.send(RpcCmd.SET_TENSOR, wire.pack_set_tensor(w.pack(), 0, 0, np.ones(k, np.float32).tobytes()))
    raw.send(RpcCmd.SET_TENSOR, wire.pack_set_tensor(f32(remote, base + 4 * k, k).pack(), 0, 0,
                                                      np.arange(k, dtype=np.float32).tobytes()))
    raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [3], [w.pack(), x.pack(), out.pack()]))
    return out


def test_a_mul_mat_over_a_zero_stride_src1_is_refused_past_its_temporaries(server: RpcServer,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """src1 with nb1 = 0 over 172 KiB, seen as 7670 columns: the kernel would copy it whole as float32 (1.35 GB,
    kept while the client stays). Past the temporaries' ceiling: refused, naming the node and the bytes."""
    caplog.set_level(logging.INFO, logger=LOG)
    k, n = 44032, 7670
    assert 4 * k * n > MAX_TEMP_BYTES
    raw = Raw(server.endpoint)
    _mul_mat_zero_stride(raw, *raw.alloc(8 * k + 4 * n), k, n)
    line = refused(raw, caplog, "LimitExceededError")
    assert f"'n3' (MUL_MAT) takes the graph's temporaries to {4 * k * n} bytes" in line
    assert f"more than the {MAX_TEMP_BYTES} bytes a graph may hold" in line
    assert wait_for(lambda: server.mem_used == 0)
    good_client_works(server.endpoint)


def test_temporaries_count_against_the_memory_limit(caplog: pytest.LogCaptureFixture) -> None:
    """Within the limit the same product is computed (every column the same dot product) and its temporaries
    are held against --mem while the graph is stored; past what is left, it is refused."""
    caplog.set_level(logging.INFO, logger=LOG)
    limit = 4 << 20
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, mem_limit=limit).start() as server:
        raw = Raw(server.endpoint)
        k, n = 1024, 256  # src1 as float32: 1 MiB
        remote, base = raw.alloc(8 * k + 4 * n)
        buffers = server.mem_used
        out = _mul_mat_zero_stride(raw, remote, base, k, n)
        got = raw.request(RpcCmd.GET_TENSOR, out.pack() + struct.pack("<QQ", 0, 4 * n), 4 * n)
        assert np.frombuffer(got, np.float32).tolist() == [k * (k - 1) / 2] * n
        assert server.mem_used == buffers + 4 * k * n  # held while the graph is stored
        rsp = raw.request(RpcCmd.GET_DEVICE_MEMORY, struct.pack("<I", 0), 16)
        assert wire.GET_DEVICE_MEMORY_RSP.unpack(rsp) == (limit - buffers - 4 * k * n, limit)
        raw.sock.close()
        assert wait_for(lambda: server.mem_used == 0)
        raw = Raw(server.endpoint)
        k, n = 1024, 1024  # 4 MiB of temporaries: more than what the buffer leaves
        _mul_mat_zero_stride(raw, *raw.alloc(8 * k + 4 * n), k, n)
        line = refused(raw, caplog, "LimitExceededError")
        assert f"takes the graph's temporaries to {4 * k * n} bytes" in line and "left under the memory limit" in line
        assert wait_for(lambda: server.mem_used == 0)


def test_a_graphs_work_is_bounded_by_a_configurable_budget(caplog: pytest.LogCaptureFixture) -> None:
    """Three ADDs of 1024 elements, each node's work 3072: a budget of 9000 is passed at the third node (9216),
    named with the numbers; 10000 computes the graph."""
    caplog.set_level(logging.INFO, logger=LOG)
    n = 1024
    for budget, computed in ((9000, False), (10000, True)):
        with RpcServer([cpu_init(1)], "127.0.0.1", 0, budget=WorkBudget(work=budget)).start() as server:
            raw = Raw(server.endpoint)
            remote, base = raw.alloc(16 * n)
            ne, nb = (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n)
            a = RpcTensor(id=1, type=0, buffer=remote, ne=ne, nb=nb, data=base, name=b"a")
            raw.send(RpcCmd.SET_TENSOR, wire.pack_set_tensor(a.pack(), 0, 0, np.ones(n, np.float32).tobytes()))
            nodes = [node(i + 2, remote, base + 4 * n * (i + 1), ne, nb, ADD, src=(i + 1, i + 1)) for i in range(3)]
            raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2, 3, 4], [a.pack()] + [x.pack() for x in nodes]))
            if computed:
                got = raw.request(RpcCmd.GET_TENSOR, nodes[2].pack() + struct.pack("<QQ", 0, 4 * n), 4 * n)
                assert (np.frombuffer(got, np.float32) == 8).all()
            else:
                line = refused(raw, caplog, "LimitExceededError")
                assert f"node 2 'n4' (ADD) takes the graph's work to 9216 (this node 3072), more than its budget " \
                       f"of {budget}" in line
            raw.sock.close()


# --- messages: memory and time ---


SERVER_SCRIPT = """
import resource, sys
from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc.server import Malformed, RpcServer
import logging
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
nofile = int(sys.argv[1])
if nofile:
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
server = RpcServer([cpu_init(1)], "127.0.0.1", 0, max_connections=int(sys.argv[2]), hello_timeout=float(sys.argv[3]))
print(server.port, flush=True)
server.serve_forever()
"""


class ServerProcess:
    """An RPC server in a child process (RSS and descriptors of its own), its log in a file (a pipe nobody reads
    would stop it once full)."""

    def __init__(self, log: Path, nofile: int = 0, max_connections: int = 32, hello_timeout: float = 5.0) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(nofile), str(max_connections),
                                          str(hello_timeout)], stdout=subprocess.PIPE, stderr=err, env=env)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.endpoint = f"127.0.0.1:{self.port}"

    def read_log(self) -> str:
        return self.log.read_text(errors="replace")

    def rss(self) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("VmRSS:"))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.mark.slow
def test_a_256_mb_announcement_holds_only_the_bytes_sent(tmp_path: Path) -> None:
    """Three clients, each with a 256 MiB buffer, announce a SET_TENSOR filling it and send 1 MiB of it: the
    server's RSS grows by about the bytes sent, not by the 768 MiB announced; it was reading them (it says so
    when they leave)."""
    server = ServerProcess(tmp_path / "server.log")
    try:
        good_client_works(server.endpoint)  # the server's own warm-up (kernels, first graph)
        size, sent = 256 << 20, 1 << 20
        conns = [Raw(server.endpoint) for _ in range(3)]
        buffers = [raw.alloc(size) for raw in conns]
        before = server.rss()
        for raw, (remote, base) in zip(conns, buffers, strict=True):
            header = wire.pack_set_tensor(f32(remote, base, size // 4).pack(), 0, 0, b"")
            raw.send(RpcCmd.SET_TENSOR, header + bytes(sent), size=len(header) + size)
        grown = []
        for _ in range(40):  # sampled while the three wait for the rest
            time.sleep(0.02)
            grown.append(server.rss() - before)
        for raw in conns:
            raw.sock.close()
        announced = wire.SET_TENSOR_HEADER_SIZE + size
        assert wait_for(lambda: server.read_log().count(f"the client left after {wire.SET_TENSOR_HEADER_SIZE + sent} "
                                                        f"of {announced} bytes") == 3, 10), server.read_log()[-2000:]
        assert max(grown) < 3 * sent + (32 << 20), grown  # far below the 768 MiB announced
        good_client_works(server.endpoint)
    finally:
        server.close()


@pytest.fixture
def quick() -> Iterator[RpcServer]:
    s = RpcServer([cpu_init(1)], "127.0.0.1", 0, hello_timeout=0.3, idle_timeout=0.6, message_timeout=0.3).start()
    try:
        yield s
    finally:
        close_all()
        s.close()


def _drip(raw: Raw, data: bytes, pause: float) -> int:
    """Send `data` a byte at a time, `pause` seconds apart, until the server closes: the bytes sent."""
    for i in range(len(data)):
        try:
            raw.sock.sendall(data[i:i + 1])
        except OSError:
            return i
        time.sleep(pause)
    return len(data)


def test_a_connection_without_hello_is_closed(quick: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(quick.endpoint, hello=False)
    refused(raw, caplog, "HELLO: 0 of 9 bytes came within 0.3 s")
    good_client_works(quick.endpoint)


def test_hello_sent_a_byte_at_a_time_has_a_total_deadline(quick: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    """Each byte comes well within the deadline of the one before; the whole HELLO does not."""
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(quick.endpoint, hello=False)
    sent = _drip(raw, wire.frame_request(RpcCmd.HELLO, bytes(24)), 0.1)
    assert sent < 33
    refused(raw, caplog, "came within 0.3 s")


def test_an_idle_client_is_closed(quick: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(quick.endpoint)
    assert raw.request(RpcCmd.DEVICE_COUNT, b"", 4) == struct.pack("<I", 1)
    assert raw.closed()
    assert wait_for(lambda: "no message for 0.6 s; closing the connection" in caplog.text)


@pytest.mark.slow
def test_an_idle_client_holding_buffers_is_kept(quick: RpcServer) -> None:
    """Its buffers are its state (llama.cpp's client cannot reconnect): twice the idle timeout, then served."""
    raw = Raw(quick.endpoint)
    remote, base = raw.alloc(64)
    time.sleep(2 * 0.6)
    assert raw.request(RpcCmd.BUFFER_GET_BASE, struct.pack("<Q", remote), 8) == struct.pack("<Q", base)


def test_a_message_has_a_total_deadline(quick: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(quick.endpoint)
    sent = _drip(raw, wire.frame_request(RpcCmd.GET_ALIGNMENT, struct.pack("<I", 0)), 0.1)
    assert sent < 13
    line = refused(raw, caplog, "came within 0.3 s")
    assert "GET_ALIGNMENT: " in line
    good_client_works(quick.endpoint)


@pytest.mark.slow
def test_an_answer_the_client_does_not_read_has_a_deadline() -> None:
    """1 MiB answered to a client that reads nothing: given up after message_timeout plus a second per MiB."""
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, message_timeout=0.2) as server:
        mine, theirs = socket.socketpair()
        with mine, theirs, pytest.raises(Malformed, match="an answer of 1048576 bytes was not taken within 1.2 s"):
            server._send(mine, bytes(1 << 20))


# --- connections ---


# a client process that opens argv[2] connections to port argv[1], says how many, and holds them until stdin closes
IDLE_CLIENTS = """
import socket, sys
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) for _ in range(int(sys.argv[2]))]
print(len(held), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_2000_idle_connections_neither_stop_nor_end_the_server(caplog: pytest.LogCaptureFixture) -> None:
    """Another process holds 2000 connections open without a word. Past max_connections they are closed as they
    come (logged), those let in go at the HELLO timeout; the accept loop runs on, and a good client is served
    while the 2000 are held."""
    caplog.set_level(logging.INFO, logger=LOG)
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, max_connections=8, hello_timeout=0.5).start() as server:
        idle = subprocess.Popen([sys.executable, "-c", IDLE_CLIENTS, str(server.port), "2000"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        try:
            assert idle.stdout is not None and idle.stdout.readline() == b"2000\n"
            assert wait_for(lambda: server.n_refused + server.n_connections == 2000)
            assert server.n_refused > 0 and "refused: 8 connections are open (the most allowed)" in caplog.text
            assert wait_for(lambda: len(server._clients) == 0)  # those let in: no HELLO in time
            assert server._accept_thread is not None and server._accept_thread.is_alive()
            good_client_works(server.endpoint)
            assert idle.poll() is None  # (the 2000 still held)
        finally:
            idle.communicate(timeout=30)


class _AcceptFails:
    """A listening socket whose accept() raises the given errnos first (then the real one's results)."""

    def __init__(self, sock: socket.socket, errnos: list[int]) -> None:
        self.sock = sock
        self.errnos = errnos

    def accept(self) -> tuple[socket.socket, object]:
        if self.errnos:
            code = self.errnos.pop(0)
            raise OSError(code, os.strerror(code))
        return self.sock.accept()

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_accept_failures_for_want_of_descriptors_are_retried(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    with RpcServer([cpu_init(1)], "127.0.0.1", 0) as server:
        server.sock = _AcceptFails(server.sock, [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ECONNABORTED])
        server.start()
        good_client_works(server.endpoint)
        assert server._accept_thread is not None and server._accept_thread.is_alive()
        assert "cannot accept a connection: [Errno 24]" in caplog.text and "[Errno 105]" in caplog.text


def test_an_accept_loop_that_ends_otherwise_raises() -> None:
    """Not closed, the loop ends only by raising: `pyggml rpc-server` then exits non-zero, never 0."""
    with RpcServer([cpu_init(1)], "127.0.0.1", 0) as server:
        server.sock = _AcceptFails(server.sock, [errno.EBADF])
        with pytest.raises(GGMLError, match=f"accepting on {server.endpoint} failed: .*Bad file descriptor"):
            server.serve_forever()


@pytest.mark.slow
def test_running_out_of_descriptors_does_not_end_the_server(tmp_path: Path) -> None:
    """The server's process limited to 64 descriptors, 120 connections without HELLO (within its listen backlog):
    accept() fails with EMFILE (logged), the server goes on, frees the idle ones at the HELLO timeout, and serves
    a good client."""
    server = ServerProcess(tmp_path / "server.log", nofile=64, max_connections=10_000, hello_timeout=0.5)
    idle = []
    try:
        for _ in range(120):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))
            idle.append(s)
        assert wait_for(lambda: "[Errno 24] Too many open files" in server.read_log(), 10), server.read_log()[-2000:]
        raw = Raw(server.endpoint, hello=False)
        raw.sock.settimeout(30)  # served once the server accepts it, behind what is queued before it
        assert raw.request(RpcCmd.HELLO, bytes(24), 28)[:3] == bytes([7, 0, 0])
        assert raw.request(RpcCmd.DEVICE_COUNT, b"", 4) == struct.pack("<I", 1)
        assert server.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        server.close()


def test_the_limits_options(tmp_path: Path) -> None:
    import argparse

    from pyggml.backends.rpc import server as rpc
    from pyggml.cli import rpc_server
    from pyggml.core import work

    parser = argparse.ArgumentParser(prog="pyggml")
    rpc_server.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rpc-server"])
    assert (args.max_connections, args.hello_timeout, args.timeout, args.message_timeout) == (
        rpc.DEFAULT_MAX_CONNECTIONS, rpc.DEFAULT_HELLO_TIMEOUT, rpc.DEFAULT_IDLE_TIMEOUT, rpc.DEFAULT_MESSAGE_TIMEOUT)
    assert (args.max_work, args.max_node_elements, args.max_temp) == (work.MAX_GRAPH_WORK, work.MAX_NODE_ELEMENTS,
                                                                      work.MAX_TEMP_BYTES)
    args = parser.parse_args(["rpc-server", "-to", "0", "--max-work", "2^40", "--max-node-elements", "1e9",
                              "--max-temp", "64M", "--max-connections", "4", "--hello-timeout", "0.5"])
    assert (args.timeout, args.max_work, args.max_node_elements, args.max_temp, args.max_connections,
            args.hello_timeout) == (None, 2**40, 10**9, 64 << 20, 4, 0.5)
    for bad in ("0", "-3", "1.5", "x", "1e400", "2^x"):
        with pytest.raises(argparse.ArgumentTypeError):
            rpc_server.count(bad)
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            rpc_server.seconds(bad)
    assert rpc_server.seconds_or_never("0.00") is None and rpc_server.seconds_or_never("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError):
        rpc_server.seconds_or_never("-1")
