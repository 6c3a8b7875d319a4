"""pyggml's RPC server: malformed input closes only that connection (logged, with why) and the server keeps
serving; a client's buffers go when it does; the memory limit; the hash cache; fuzzed messages; the
`pyggml rpc-server` command."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rpc_util import wait_for

from pyggml import Context
from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc import wire
from pyggml.backends.rpc.client import rpc_init
from pyggml.backends.rpc.connection import close_all, connect
from pyggml.backends.rpc.server import RpcServer
from pyggml.backends.rpc.wire import RpcCmd, RpcConnectionError, RpcTensor
from pyggml.core.errors import OutOfMemoryError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.ggml_backend.buffer import BufferUsage
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32
LOG = "pyggml.backends.rpc.server"


class Raw:
    """A client speaking the protocol by hand, for messages no real client sends."""

    def __init__(self, endpoint: str, hello: bool = True) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        if hello:
            assert self.request(RpcCmd.HELLO, bytes(24), 28)[:3] == bytes([7, 0, 0])

    def send(self, cmd: int, payload: bytes, size: int | None = None) -> None:
        self.sock.sendall(struct.pack("<BQ", cmd, len(payload) if size is None else size) + payload)

    def recv(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(len(out))
            out += chunk
        return out

    def request(self, cmd: int, payload: bytes, n: int) -> bytes:
        self.send(cmd, payload)
        (size,) = struct.unpack("<Q", self.recv(8))
        assert size == n
        return self.recv(n)

    def closed(self) -> bool:
        """True once the server closed the connection (a byte sent or EOF within 5 s)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def alloc(self, size: int) -> tuple[int, int]:
        remote, _ = wire.ALLOC_BUFFER_RSP.unpack(self.request(RpcCmd.ALLOC_BUFFER, wire.ALLOC_BUFFER_REQ.pack(0, size),
                                                              16))
        (base,) = struct.unpack("<Q", self.request(RpcCmd.BUFFER_GET_BASE, struct.pack("<Q", remote), 8))
        return remote, base


def f32(buffer: int, data: int, n: int, id: int = 1, **kw: object) -> RpcTensor:
    return RpcTensor(id=id, type=0, buffer=buffer, ne=(n, 1, 1, 1), nb=(4, 4 * n, 4 * n, 4 * n), data=data,
                     **kw)  # type: ignore[arg-type]


def good_client_works(endpoint: str) -> None:
    backend = rpc_init(endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 8).set_name("a")
    out = ctx.scale(a, 3.0).set_name("out")
    buf = alloc_ctx_tensors(ctx, backend)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    tensor_set_numpy(a, np.arange(8, dtype=np.float32))
    backend.graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(out), 3 * np.arange(8, dtype=np.float32))
    buf.free()
    close_all()


def _malformed(raw: Raw, case: str) -> None:
    if case == "unknown command":
        raw.send(200, b"")
    elif case == "wrong size":
        raw.send(RpcCmd.ALLOC_BUFFER, b"\0" * 5)
    elif case == "unknown buffer":
        raw.send(RpcCmd.BUFFER_GET_BASE, struct.pack("<Q", 0xDEAD0))
    elif case == "bad device":
        raw.send(RpcCmd.GET_ALIGNMENT, struct.pack("<I", 7))
    elif case == "second hello":
        raw.send(RpcCmd.HELLO, bytes(24))
    elif case == "set outside the buffer":
        remote, base = raw.alloc(64)
        t = f32(remote, base + 48, 4)
        raw.send(RpcCmd.SET_TENSOR, wire.pack_set_tensor(t.pack(), 0, 8, bytes(16)))
    elif case == "tensor outside the buffer":
        remote, base = raw.alloc(64)
        raw.send(RpcCmd.GET_TENSOR, f32(remote, base, 32).pack() + struct.pack("<QQ", 0, 4))
    elif case == "bad type":
        remote, base = raw.alloc(64)
        t = f32(remote, base, 4)
        t.type = 99
        raw.send(RpcCmd.GET_TENSOR, t.pack() + struct.pack("<QQ", 0, 4))
    elif case == "oversized set":
        raw.send(RpcCmd.SET_TENSOR, b"", size=2**62)
    elif case == "cycle":
        remote, base = raw.alloc(64)
        a = f32(remote, base, 4, id=1, op=2, src=(2,) + (0,) * 9, flags=16)
        b = f32(remote, base + 16, 4, id=2, op=2, src=(1,) + (0,) * 9, flags=16)
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [1], [a.pack(), b.pack()]))
    elif case == "missing node":
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [5], [RpcTensor(id=1).pack()]))
    elif case == "more nodes than tensors":
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [1, 2], [RpcTensor(id=1).pack()]))
    elif case == "bad view":
        remote, base = raw.alloc(64)
        a = f32(remote, base, 4, id=1)
        v = f32(remote, base + 8, 2, id=2, op=37, view_src=1, view_offs=4, flags=16)  # 4 != 8
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), v.pack()]))
    elif case == "recompute without graph":
        raw.send(RpcCmd.GRAPH_RECOMPUTE, struct.pack("<I", 0))
    elif case == "unsupported op":
        remote, base = raw.alloc(64)
        a = f32(remote, base, 4, id=1)
        c = f32(remote, base + 16, 4, id=2, op=92, src=(1,) + (0,) * 9, flags=16)  # MAP_CUSTOM1
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [a.pack(), c.pack()]))
    elif case == "truncated":
        raw.send(RpcCmd.GET_DEVICE_MEMORY, b"\0\0", size=4)
        raw.sock.shutdown(socket.SHUT_WR)
    else:
        raise AssertionError(case)


CASES = {
    "unknown command": "unknown command 200",
    "wrong size": "ALLOC_BUFFER of 5 bytes, expected 12",
    "unknown buffer": "buffer 0xdead0 is not one of this client's",
    "bad device": "device 7 does not exist",
    "second hello": "HELLO after the handshake",
    "set outside the buffer": "outside its buffer",
    "tensor outside the buffer": "is outside its buffer",
    "bad type": "type 99, not a ggml type",
    "oversized set": "SET_TENSOR of 4611686018427387904 bytes",
    "cycle": "cycle",
    "missing node": "node id 0x5 is not among the 1 tensors",
    "more nodes than tensors": "2 nodes, more than its 1 tensors",
    "bad view": "is not at its source",
    "recompute without graph": "holds no graph",
    "unsupported op": "MAP_CUSTOM1",
    "truncated": "connection lost",
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_input_closes_that_connection_and_says_why(server: RpcServer, case: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    bystander = rpc_init(server.endpoint)  # another client, connected before and served after
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    keep = ctx.new_tensor_1d(F32, 4).set_name("keep")
    kbuf = alloc_ctx_tensors(ctx, bystander)
    tensor_set_numpy(keep, np.ones(4, np.float32))
    raw = Raw(server.endpoint)
    _malformed(raw, case)
    assert raw.closed()
    deadline = time.monotonic() + 5
    while CASES[case] not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert CASES[case] in caplog.text
    np.testing.assert_array_equal(tensor_get_numpy(keep), np.ones(4, np.float32))
    kbuf.free()
    good_client_works(server.endpoint)


def test_the_first_message_must_be_hello(server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(server.endpoint, hello=False)
    raw.send(RpcCmd.DEVICE_COUNT, b"")
    assert raw.closed()
    raw = Raw(server.endpoint, hello=False)
    raw.send(RpcCmd.HELLO, bytes(20))
    assert raw.closed()
    time.sleep(0.05)
    assert "not HELLO" in caplog.text and "HELLO of 20 bytes" in caplog.text
    good_client_works(server.endpoint)


def test_a_client_that_goes_frees_its_buffers(server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG)
    raw = Raw(server.endpoint)
    raw.alloc(4096)
    raw.alloc(1024)
    assert server.mem_used >= 5120
    raw.sock.close()
    assert wait_for(lambda: server.mem_used == 0)
    assert wait_for(lambda: "2 buffer(s) freed" in caplog.text)
    assert "connected" in caplog.text


def test_the_memory_limit() -> None:
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, mem_limit=1 << 20).start() as server:
        backend = rpc_init(server.endpoint)
        free, total = backend.get_device().memory()
        assert total == 1 << 20 and free == 1 << 20
        buf = backend.alloc_buffer(600_000)
        assert backend.get_device().memory()[0] == (1 << 20) - 600_000
        with pytest.raises(OutOfMemoryError, match="could not allocate a buffer of 600000 bytes"):
            backend.alloc_buffer(600_000)
        buf.free()
        backend.alloc_buffer(600_000).free()
        close_all()


def test_the_hash_cache_skips_sending_weights_again(tmp_path: Path) -> None:
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, cache_dir=tmp_path).start() as server:
        v = np.random.default_rng(0).standard_normal(wire.HASH_THRESHOLD // 4 + 8).astype(np.float32)
        sent = []
        for _ in range(2):
            backend = rpc_init(server.endpoint)
            ctx = Context(mem_size=1 << 20, no_alloc=True)
            w = ctx.new_tensor_1d(F32, v.size).set_name("w")
            buf = alloc_ctx_tensors(ctx, backend)
            buf.set_usage(BufferUsage.WEIGHTS)
            conn = connect(server.endpoint)
            before = conn.bytes_sent
            tensor_set_numpy(w, v)
            sent.append(conn.bytes_sent - before)
            np.testing.assert_array_equal(tensor_get_numpy(w), v)
            buf.free()
            close_all()  # a new connection: as a model loaded again later
        assert sent[0] > v.nbytes and sent[1] < 1000
        assert [p.name for p in tmp_path.iterdir()] == [f"{wire.fnv_hash(v.tobytes()):016x}"]


def test_a_closed_server_gives_the_client_a_typed_error() -> None:
    server = RpcServer([cpu_init(1)], "127.0.0.1", 0).start()
    backend = rpc_init(server.endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    buf = alloc_ctx_tensors(ctx, backend)
    server.close()
    with pytest.raises(RpcConnectionError, match=server.endpoint):
        tensor_set_numpy(a, np.ones(4, np.float32))
        tensor_get_numpy(a)
    buf.free()
    close_all()


def _good_messages(remote: int, base: int) -> list[bytes]:
    """Valid messages about a client's 256-byte buffer at `base` (id `remote`): what the fuzzer mutates."""
    t = f32(remote, base, 4)
    return [
        wire.frame_request(RpcCmd.ALLOC_BUFFER, wire.ALLOC_BUFFER_REQ.pack(0, 64)),
        wire.frame_request(RpcCmd.GET_TENSOR, t.pack() + struct.pack("<QQ", 0, 16)),
        wire.frame_request(RpcCmd.SET_TENSOR, wire.pack_set_tensor(t.pack(), 0, 0, bytes(16))),
        wire.frame_request(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [2], [
            f32(remote, base, 4, id=1).pack(),
            f32(remote, base + 16, 4, id=2, op=2, src=(1, 1) + (0,) * 8, flags=16).pack()])),
        wire.frame_request(RpcCmd.GRAPH_RECOMPUTE, struct.pack("<I", 0)),
        wire.frame_request(RpcCmd.COPY_TENSOR, t.pack() + f32(remote, base + 64, 4).pack()),
        wire.frame_request(RpcCmd.MEMSET_TENSOR, t.pack() + struct.pack("<QQB", 0, 16, 1)),
        wire.frame_request(RpcCmd.GET_ALLOC_SIZE, struct.pack("<I", 0) + t.pack() + wire.NULL_TENSOR * 10),
        wire.frame_request(RpcCmd.BUFFER_CLEAR, struct.pack("<QB", remote, 0)),
        wire.frame_request(RpcCmd.INIT_TENSOR, t.pack()),
    ]


@pytest.mark.slow
def test_fuzzed_messages_never_stop_the_server(server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    """Random and mutated messages for a bounded time, each connection with a buffer of its own to aim at;
    then a good client is served and no client's memory is left behind."""
    rng = np.random.default_rng(int(os.environ.get("PYGGML_FUZZ_SEED", "1")))
    deadline = time.monotonic() + 3.0
    n = 0
    while time.monotonic() < deadline:
        raw = Raw(server.endpoint)
        good = _good_messages(*raw.alloc(256))
        raw.sock.settimeout(2)
        msgs = []
        for _ in range(int(rng.integers(1, 4))):
            if rng.random() < 0.2:
                msgs.append(rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes())
                continue
            msg = bytearray(good[int(rng.integers(len(good)))])
            if rng.random() < 0.8:
                for _ in range(int(rng.integers(1, 6))):
                    msg[int(rng.integers(len(msg)))] = int(rng.integers(256))
            if rng.random() < 0.15:
                msg = msg[: int(rng.integers(1, len(msg)))]
            msgs.append(bytes(msg))
        try:
            raw.sock.sendall(b"".join(msgs))
            raw.sock.shutdown(socket.SHUT_WR)
            while raw.sock.recv(65536):
                pass
        except OSError:  # the server closed first: what a malformed message earns
            pass
        raw.sock.close()
        n += 1
    assert n > 20
    good_client_works(server.endpoint)
    assert wait_for(lambda: server.mem_used == 0)
    # every message was refused by a check (a warning that says why), none by an accident of the code
    accidents = [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno >= logging.ERROR]
    assert not accidents, accidents[:5]


@pytest.mark.slow
def test_the_pyggml_rpc_server_command(tmp_path: Path) -> None:
    from rpc_util import free_port, wait_listening

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "rpc-server", "-p", str(port), "-t", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc, timeout=60)
        good_client_works(f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert f"listening on 127.0.0.1:{port}" in out.decode()
    assert "connected" in err.decode() and "buffer(s) freed" in err.decode()


def test_a_torch_backend_served(rng: np.random.Generator) -> None:
    pytest.importorskip("torch")
    from pyggml.ggml_backend.registry import init_backend

    with RpcServer([init_backend("torch")], "127.0.0.1", 0).start() as server:
        backend = rpc_init(server.endpoint)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        w = ctx.new_tensor_2d(F32, 16, 8).set_name("w")
        x = ctx.new_tensor_2d(F32, 16, 3).set_name("x")
        out = ctx.add(ctx.mul_mat(w, x), ctx.new_tensor_2d(F32, 8, 3).set_name("b")).set_name("out")
        b = out.src[1]
        buf = alloc_ctx_tensors(ctx, backend)
        vw, vx, vb = (rng.standard_normal(tuple(reversed(t.ne[:2]))).astype(np.float32) for t in (w, x, b))
        for t, v in ((w, vw), (x, vx), (b, vb)):
            tensor_set_numpy(t, v)
        g = ctx.new_graph()
        g.build_forward_expand(out)
        backend.graph_compute(g)
        np.testing.assert_allclose(tensor_get_numpy(out), vx @ vw.T + vb, rtol=1e-5, atol=1e-5)
        assert server.counts["GRAPH_COMPUTE"] == 1
        buf.free()
        close_all()


def test_a_silent_server_times_out_with_a_typed_error() -> None:
    from pyggml.backends.rpc.connection import Connection

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def serve() -> None:  # answers HELLO, then says nothing
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.recv(9 + 24, socket.MSG_WAITALL)
        conn.sendall(wire.frame_response(wire.pack_hello_rsp()))

    import threading

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    conn = Connection(f"127.0.0.1:{port}", timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(RpcConnectionError, match=rf"127\.0\.0\.1:{port} went away: no answer within 0\.5 s "
                                                 r"\(during DEVICE_COUNT\)"):
        conn.request(RpcCmd.DEVICE_COUNT, b"", 4)
    assert time.monotonic() - t0 < 3
    with pytest.raises(RpcConnectionError, match="unusable"):
        conn.request(RpcCmd.DEVICE_COUNT, b"", 4)
    for c in accepted:
        c.close()
    listener.close()


def test_an_impossible_buffer_is_the_clients_out_of_memory(server: RpcServer) -> None:
    backend = rpc_init(server.endpoint)
    with pytest.raises(OutOfMemoryError, match=f"RPC server {server.endpoint}: device 0 could not allocate"):
        backend.alloc_buffer(2**60)
    good_client_works(server.endpoint)


def test_a_graph_with_memory_elsewhere_is_refused_before_sending(server: RpcServer) -> None:
    from pyggml.backends.rpc.wire import RpcError

    backend = rpc_init(server.endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("on_cpu")
    cbuf = alloc_ctx_tensors(ctx, cpu_init(1))
    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    out = ctx2.scale(a, 2.0).set_name("out")
    rbuf = alloc_ctx_tensors(ctx2, backend)
    g = ctx2.new_graph()
    g.build_forward_expand(out)
    with pytest.raises(RpcError, match="tensor 'on_cpu' \\(NONE\\) has its memory in buffer 'CPU', not on that server"):
        backend.graph_compute(g)
    assert server.counts["GRAPH_COMPUTE"] == 0
    cbuf.free()
    rbuf.free()


def test_a_server_that_dies_in_the_middle_of_a_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server goes while it computes (its backend takes a second): the client's wait for the graph
    ends with a typed error naming the server, in about the time the server took to go."""
    import threading

    slow = cpu_init(1)
    compute = type(slow).graph_plan_compute

    def slow_compute(self: object, plan: object) -> None:
        time.sleep(1.0)
        compute(self, plan)  # type: ignore[arg-type]

    monkeypatch.setattr(type(slow), "graph_plan_compute", slow_compute)
    server = RpcServer([slow], "127.0.0.1", 0).start()
    backend = rpc_init(server.endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    out = ctx.scale(a, 2.0).set_name("out")
    buf = alloc_ctx_tensors(ctx, backend)
    g = ctx.new_graph()
    g.build_forward_expand(out)
    threading.Timer(0.3, server.close).start()
    t0 = time.monotonic()
    with pytest.raises(RpcConnectionError, match=f"{server.endpoint} went away.*during GET_ALIGNMENT"):
        backend.graph_compute(g)  # GRAPH_COMPUTE, then the synchronizing request the dying server never answers
    assert time.monotonic() - t0 < 5
    buf.free()
    close_all()


@pytest.mark.slow
def test_random_nodes_are_computed_or_refused(server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    """Nodes of common ops with random types, shapes and op params, each tensor inside the client's buffer:
    the server's backend computes each or refuses it (a warning naming the op), and stays up."""
    from pyggml.core.types import TYPE_TRAITS

    rng = np.random.default_rng(3)
    ops = [2, 7, 14, 15, 20, 22, 24, 25, 29, 32, 34, 35, 40, 42, 46, 48, 64, 69, 74, 91, 100]
    types = [0, 1, 2, 8, 24, 26, 30]  # F32 F16 Q4_0 Q8_0 I8 I32 BF16
    deadline = time.monotonic() + 2.0
    n = 0
    while time.monotonic() < deadline:
        raw = Raw(server.endpoint)
        remote, base = raw.alloc(4096)
        ts = []
        for i in (1, 2, 3):
            ty = int(rng.choice(types))
            tr = TYPE_TRAITS[ty]
            ne = [32 if tr.blck_size > 1 else int(rng.integers(1, 9))] + [int(x) for x in rng.integers(1, 5, 3)]
            nb = [tr.type_size, tr.type_size * ne[0] // tr.blck_size]
            nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
            size = nb[3] * ne[3]
            if size > 1024:
                ne, nb, size = [ne[0], 1, 1, 1], [nb[0], nb[1], nb[1], nb[1]], nb[1]
            ts.append(RpcTensor(id=i, type=ty, buffer=remote, ne=tuple(ne), nb=tuple(nb), data=base + 1024 * (i - 1)))
        ts[2].op, ts[2].flags, ts[2].src = int(rng.choice(ops)), 16, (1, 2) + (0,) * 8
        ts[2].op_params = tuple(int(x) for x in rng.integers(-3, 4, 16))
        raw.send(RpcCmd.GRAPH_COMPUTE, wire.pack_graph(0, [3], [t.pack() for t in ts]))
        try:
            raw.request(RpcCmd.GET_ALIGNMENT, struct.pack("<I", 0), 8)  # computed: the server answers
        except (EOFError, OSError):
            pass  # refused: the connection is closed
        raw.sock.close()
        n += 1
    assert n > 20
    good_client_works(server.endpoint)
    accidents = [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno >= logging.ERROR]
    assert not accidents, accidents[:5]


def test_a_model_loads_again_from_the_servers_cache(tmp_path: Path, smollm2_path: Path) -> None:
    """SmolLM2's output layer (its 17 MiB tied embedding) on the server: the second load of the model
    takes the weight from the server's cache instead of sending it."""
    import pyggml.models as pm

    with RpcServer([cpu_init(1)], "127.0.0.1", 0, cache_dir=tmp_path).start() as server:
        sent = []
        for _ in range(2):
            rpc = rpc_init(server.endpoint)
            conn = connect(server.endpoint)
            before = conn.bytes_sent
            model = pm.load(smollm2_path, backends=[cpu_init(1), rpc], n_layers_on=[0], n_ctx=32, progress=False)
            sent.append(conn.bytes_sent - before)
            model.free()
            close_all()
        assert len(list(tmp_path.iterdir())) >= 1
        assert sent[0] - sent[1] > 10 * 1024 * 1024


def test_two_devices_served() -> None:
    with RpcServer([cpu_init(1), cpu_init(1)], "127.0.0.1", 0).start() as server:
        b0, b1 = rpc_init(server.endpoint, 0), rpc_init(server.endpoint, 1)
        assert [b0.name(), b1.name()] == [f"RPC0[{server.endpoint}]", f"RPC1[{server.endpoint}]"]
        for backend in (b0, b1):
            ctx = Context(mem_size=1 << 20, no_alloc=True)
            a = ctx.new_tensor_1d(F32, 4).set_name("a")
            out = ctx.scale(a, 2.0).set_name("out")
            buf = alloc_ctx_tensors(ctx, backend)
            g = ctx.new_graph()
            g.build_forward_expand(out)
            tensor_set_numpy(a, np.ones(4, np.float32))
            backend.graph_compute(g)
            assert (tensor_get_numpy(out) == 2).all()
            buf.free()
        close_all()


def test_the_commands_options_parse() -> None:
    import argparse

    from pyggml.cli.main import build_parser
    from pyggml.cli.rpc_server import parse_size, port_number

    assert parse_size("4096") == 4096 and parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("2GB") == 2 * 10**9
    for bad in ("", "-1", "0", "12X", "M"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
    assert port_number("0") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        port_number("70000")
    args = build_parser().parse_args(["rpc-server", "-b", "cpu", "-b", "torch", "--mem", "1G", "-c", "/tmp/x"])
    assert (args.backend, args.host, args.port, args.mem, args.cache) == (["cpu", "torch"], "127.0.0.1", 50052,
                                                                          1 << 30, "/tmp/x")


def test_a_server_restarted_on_the_port_is_asked_again() -> None:
    """The answers a buffer type keeps (max size, alignment) belong to the connection they came on: a server
    started on the same port after the first is gone is asked again, not taken for the first."""
    with RpcServer([cpu_init(1)], "127.0.0.1", 0, mem_limit=1 << 20).start() as first:
        endpoint, port = first.endpoint, first.port
        assert rpc_init(endpoint).get_default_buffer_type().get_max_size() == 1 << 20
        close_all()
    with RpcServer([cpu_init(1)], "127.0.0.1", port, mem_limit=3 << 20).start() as second:
        assert second.endpoint == endpoint
        buft = rpc_init(endpoint).get_default_buffer_type()
        assert buft.get_max_size() == 3 << 20
        rpc_init(endpoint).alloc_buffer(2 << 20).free()
        close_all()


def test_a_server_restarted_with_other_devices_is_listed_again() -> None:
    """The devices of an endpoint are counted again once the connection they were counted on is gone: a server
    of two devices started on the port a one-device server left serves its second device."""
    with RpcServer([cpu_init(1)], "127.0.0.1", 0).start() as first:
        endpoint, port = first.endpoint, first.port
        assert rpc_init(endpoint, 0).name() == f"RPC0[{endpoint}]"
        close_all()
    with RpcServer([cpu_init(1), cpu_init(1)], "127.0.0.1", port).start():
        b1 = rpc_init(endpoint, 1)
        assert b1.name() == f"RPC1[{endpoint}]"
        b1.alloc_buffer(1024).free()
        close_all()
