"""The per-token traffic, with real sockets on 127.0.0.1 (both servers where a server computes).

GRAPH_RECOMPUTE only for a graph the server holds as it is: a plan (what the scheduler computes) is serialized
once and sent again as GRAPH_RECOMPUTE, without being serialized again, while its tensors stay where they were;
a graph that changed (a shape, an op_params word, a tensor's address, a freed buffer) is sent again in full, and
every result equals the CPU's. Small commands without an answer (a step's input copies) wait for the next
command sent at once and cross with it, their bytes kept; pyggml's server reads them through one buffer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from pyggml import Context
from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc import client, wire
from pyggml.backends.rpc.client import RPCBackend, RPCPlan, rpc_init
from pyggml.backends.rpc.connection import DEFER_MAX, Connection
from pyggml.backends.rpc.wire import RpcCmd
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.sched import BackendSched
from pyggml.testing import alloc_ctx_tensors

F32 = GGMLType.F32
N = 16


@pytest.fixture
def serializations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times the client serialized a graph (the count in a one-element list)."""
    count = [0]
    real: Callable[..., Any] = client._serialize_graph

    def counting(*args: Any) -> Any:
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(client, "_serialize_graph", counting)
    yield count


class Twin:
    """out = scale(view(a)[:n] * b[:n], s) over `backend`'s memory, with a spare tensor to move `out` into."""

    def __init__(self, backend: Backend, av: np.ndarray, bv: np.ndarray) -> None:
        self.ctx = Context(mem_size=1 << 20, no_alloc=True)
        ctx = self.ctx
        self.a = ctx.new_tensor_1d(F32, N).set_name("a")
        self.b = ctx.new_tensor_1d(F32, N).set_name("b")
        self.spare = ctx.new_tensor_1d(F32, N).set_name("spare")
        self.x = ctx.view_1d(self.a, N, 0).set_name("x")
        self.m = ctx.mul(self.x, self.b).set_name("m")
        self.out = ctx.scale(self.m, 2.0).set_name("out")
        self.buf = alloc_ctx_tensors(ctx, backend)
        self.graph = ctx.new_graph()
        self.graph.build_forward_expand(self.out)
        tensor_set_numpy(self.a, av)
        tensor_set_numpy(self.b, bv)

    def shrink(self, n: int) -> None:
        """The view and everything after it n elements long (the same memory)."""
        for t in (self.x, self.m, self.out):
            t.ne[0] = n
            t.nb[1] = t.nb[2] = t.nb[3] = 4 * n
        self.b.ne[0] = n  # (mul's operands have one shape)
        self.b.nb[1] = self.b.nb[2] = self.b.nb[3] = 4 * n

    def move_out(self, buffer: Buffer | None = None) -> None:
        """`out` written at the spare tensor's address, or at the start of another buffer."""
        if buffer is None:
            self.out.data = self.spare.data
        else:
            self.out.buffer, self.out.data = buffer, buffer.get_base()

    def result(self) -> np.ndarray:
        return tensor_get_numpy(self.out).copy()


def _pair(endpoint: str) -> tuple[RPCBackend, Twin, Twin]:
    rng = np.random.default_rng(5)
    av, bv = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    backend = rpc_init(endpoint)
    return backend, Twin(backend, av, bv), Twin(cpu_init(1), av, bv)


def _same(rpc: Twin, cpu: Twin) -> None:
    got, want = rpc.result(), cpu.result()
    assert np.abs(want).max() > 0.1
    np.testing.assert_array_equal(got, want)


def test_a_changed_graph_is_sent_again_not_recomputed(endpoint: str) -> None:
    """graph_compute without a plan compares the bytes: each change below is a GRAPH_COMPUTE."""
    backend, r, c = _pair(endpoint)
    cpu = cpu_init(1)
    spare_buf = backend.alloc_buffer(4 * N)
    cpu_spare = cpu.alloc_buffer(4 * N)

    def step(change: Callable[[Twin], None] | None, recomputed: bool) -> None:
        if change is not None:
            change(r)
            change(c)
        computes, recomputes = backend.n_computes, backend.n_recomputes
        backend.graph_compute(r.graph)
        cpu.graph_compute(c.graph)
        assert (backend.n_computes - computes, backend.n_recomputes - recomputes) == \
            ((0, 1) if recomputed else (1, 0))
        _same(r, c)

    step(None, recomputed=False)
    step(None, recomputed=True)
    step(lambda t: t.out.set_op_params_f32(0, 5.0), recomputed=False)  # scale's factor
    step(None, recomputed=True)
    step(lambda t: t.shrink(N // 2), recomputed=False)
    step(lambda t: t.move_out(), recomputed=False)  # within its buffer
    step(lambda t: t.move_out(spare_buf if t is r else cpu_spare), recomputed=False)  # into another buffer
    step(None, recomputed=True)
    for b in (r.buf, c.buf, spare_buf, cpu_spare):
        b.free()


def test_a_plan_is_serialized_once_and_again_only_when_it_moved(endpoint: str, serializations: list[int]) -> None:
    backend, r, c = _pair(endpoint)
    other = Twin(backend, np.ones(N, np.float32), np.ones(N, np.float32))  # (made first: it frees a probe buffer)
    plan = backend.graph_plan_create(r.graph)
    assert isinstance(plan, RPCPlan) and serializations[0] == 1
    cpu = cpu_init(1)
    cpu.graph_compute(c.graph)

    def compute(recomputed: bool, serialized: int) -> None:
        computes, recomputes, before = backend.n_computes, backend.n_recomputes, serializations[0]
        backend.graph_plan_compute(plan)
        backend.synchronize()
        assert (backend.n_computes - computes, backend.n_recomputes - recomputes) == \
            ((0, 1) if recomputed else (1, 0))
        assert serializations[0] - before == serialized
        _same(r, c)

    compute(recomputed=False, serialized=0)  # the bytes made by graph_plan_create
    for _ in range(3):
        compute(recomputed=True, serialized=0)
    # another graph computed on the device in between: the plan's bytes go again in full
    backend.graph_compute(other.graph)
    compute(recomputed=False, serialized=0)
    # a tensor that moved: serialized again, sent in full
    r.move_out()
    c.move_out()
    cpu.graph_compute(c.graph)
    compute(recomputed=False, serialized=1)
    compute(recomputed=True, serialized=0)
    # a freed buffer (whose id a plan may name, and whose address a new buffer may take): serialized again
    other.buf.free()
    compute(recomputed=False, serialized=1)
    compute(recomputed=True, serialized=0)
    backend.graph_plan_free(plan)
    for b in (r.buf, c.buf):
        b.free()


def _sched_graph(ctx: Context, n: int) -> tuple[Tensor, Tensor, Tensor, Graph]:
    """x (an input) -> mul(x, x) -> scale 0.5 -> add x; the mul pinned to the RPC backend and the add to the CPU by
    the caller."""
    x = ctx.new_tensor_2d(F32, 8, n).set_name("x")
    x.set_input()
    m = ctx.mul(x, x).set_name("m")
    out = ctx.add(ctx.scale(m, 0.5), x).set_name("out")
    out.set_output()
    g = Graph(64)
    g.build_forward_expand(out)
    return x, m, out, g


def test_the_scheduler_reusing_a_graph_recomputes_and_a_new_shape_is_sent(endpoint: str,
                                                                          serializations: list[int]) -> None:
    """Over [rpc, cpu]: a graph computed again (llama.cpp's graph reuse) is GRAPH_RECOMPUTE without serializing;
    a graph of another shape is sent in full; the results are the CPU's."""
    backend = rpc_init(endpoint)
    cpu = cpu_init(1)
    sched = BackendSched([backend, cpu], graph_size=64)
    rng = np.random.default_rng(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    try:
        for n in (4, 4, 2):  # the second graph has the first one's shape, the third another
            x, m, out, g = _sched_graph(ctx, n)
            sched.reset()
            sched.set_tensor_backend(m, backend)
            sched.set_tensor_backend(out, cpu)
            sched.alloc_graph(g)
            assert sched.n_splits >= 2
            computes, before = backend.n_computes, serializations[0]
            for _ in range(3):
                xv = rng.standard_normal((n, 8)).astype(np.float32)
                tensor_set_numpy(x, xv)
                sched.graph_compute(g)
                np.testing.assert_allclose(tensor_get_numpy(out), xv * xv * 0.5 + xv, rtol=1e-6)
            # one plan per allocation: serialized once, sent once (a new graph's ids differ), then recomputed
            assert serializations[0] - before == 1
            assert backend.n_computes - computes == 1
    finally:
        sched.free()


# --- the small commands of a step cross together ---


class Recorder:
    """A fake server on 127.0.0.1: answers HELLO, then records every byte that comes (with when it came)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.got = bytearray()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            need = wire.CMD_HEADER.size + wire.HELLO_REQ.size
            hello = b""
            while len(hello) < need:
                hello += conn.recv(need - len(hello))
            conn.sendall(wire.frame_response(wire.pack_hello_rsp()))
            while chunk := conn.recv(1 << 20):
                with self.lock:
                    self.got += chunk

    def received(self, wait: float = 0.3) -> bytes:
        time.sleep(wait)
        with self.lock:
            return bytes(self.got)


@pytest.mark.slow
def test_deferred_commands_wait_for_the_next_one_sent_and_keep_their_bytes() -> None:
    rec = Recorder()
    conn = Connection(rec.endpoint)
    try:
        data = bytearray(b"input-1")
        conn.send(RpcCmd.SET_TENSOR, b"head", data, defer=True)
        data[:] = b"changed"  # the caller reuses its buffer at once: the queued command kept its bytes
        conn.send(RpcCmd.MEMSET_TENSOR, b"m" * 10, defer=True)
        assert rec.received() == b""  # nothing sent yet
        assert conn.bytes_sent == 9 + 24 + 2 * 9 + 11 + 10  # HELLO, then the two (counted as given)
        conn.send(RpcCmd.GRAPH_RECOMPUTE, b"\0\0\0\0")  # not deferred: the queue goes with it, in order
        want = (wire.frame_request(RpcCmd.SET_TENSOR, b"headinput-1")
                + wire.frame_request(RpcCmd.MEMSET_TENSOR, b"m" * 10)
                + wire.frame_request(RpcCmd.GRAPH_RECOMPUTE, b"\0\0\0\0"))
        assert rec.received() == want
        # a deferred command above DEFER_MAX (weights) goes at once; flush() sends what waits
        big = bytes(range(256)) * (DEFER_MAX // 256 + 1)
        conn.send(RpcCmd.SET_TENSOR, big, defer=True)
        assert rec.received() == want + wire.frame_request(RpcCmd.SET_TENSOR, big)
        conn.send(RpcCmd.FREE_BUFFER, b"8bytes!!", defer=True)
        conn.flush()
        assert rec.received().endswith(wire.frame_request(RpcCmd.FREE_BUFFER, b"8bytes!!"))
        conn.send(RpcCmd.BUFFER_CLEAR, b"9 bytes!!", defer=True)
    finally:
        conn.close()  # what waits is sent before the socket closes
    rec.thread.join(timeout=5)
    assert bytes(rec.got).endswith(wire.frame_request(RpcCmd.BUFFER_CLEAR, b"9 bytes!!"))


def test_the_server_reads_messages_together_or_byte_by_byte() -> None:
    """pyggml's server reads through one buffer: commands that come in one piece, and a message that comes a
    byte at a time, are served alike."""
    from pyggml.backends.rpc.server import RpcServer

    server = RpcServer([cpu_init(1)], "127.0.0.1", 0).start()
    try:
        host, port = server.endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(wire.frame_request(RpcCmd.HELLO, bytes(24)) + wire.frame_request(RpcCmd.DEVICE_COUNT)
                      + wire.frame_request(RpcCmd.GET_ALIGNMENT, wire.GET_ALIGNMENT_REQ.pack(0)))
            for byte in wire.frame_request(RpcCmd.GET_MAX_SIZE, wire.GET_MAX_SIZE_REQ.pack(0)):
                s.sendall(bytes([byte]))
                time.sleep(0.01)
            want = 8 + 28 + 8 + 4 + 8 + 8 + 8 + 8
            got = b""
            while len(got) < want:
                chunk = s.recv(want - len(got))
                assert chunk
                got += chunk
        assert got[8:11] == bytes([7, 0, 0])
        assert wire.DEVICE_COUNT_RSP.unpack(got[44:48]) == (1,)
        assert wire.GET_ALIGNMENT_RSP.unpack(got[56:64])[0] > 0
        assert wire.GET_MAX_SIZE_RSP.unpack(got[72:80])[0] > 0
        assert server.counts["GET_MAX_SIZE"] == 1
    finally:
        server.close()


def test_a_decode_step_is_its_inputs_a_recompute_and_one_read(builtin_greedy_tokens: list[int]) -> None:
    """The built-in model placed as llama.cpp places a split (the CPU last, holding the graph's inputs; the token
    embeddings on the CPU; the first layers on the server): after the first steps, each decode step sends the
    server its input copies and GRAPH_RECOMPUTE and reads back one tensor, no synchronizing request (the
    backend's I/O is ordered: the scheduler does not wait on it before a copy), and the tokens are the CPU's."""
    import pyggml.models as pm
    from pyggml.backends.rpc.connection import close_all, connect
    from pyggml.backends.rpc.server import RpcServer
    from pyggml.models.builtin import builtin_model_path

    server = RpcServer([cpu_init(1)], "127.0.0.1", 0).start()
    try:
        rpc, cpu = rpc_init(server.endpoint), cpu_init(1)
        assert rpc.io_ordered() and not cpu.io_ordered()
        model = pm.load(builtin_model_path(), backends=[rpc, cpu], n_layers_on=[2],
                        override_tensor=[("^token_embd", cpu)], n_ctx=64, progress=False)
        try:
            ids = model.tokenize("The module")
            assert list(model.generate(ids, 8, stop_at_eos=False)) == builtin_greedy_tokens
            model.reset()
            list(model.generate(ids, 2, stop_at_eos=False))
            conn = connect(server.endpoint)
            counts = dict(server.counts)
            flushes = 0
            flush = conn._flush

            def counting(cmd: RpcCmd) -> None:
                nonlocal flushes
                flushes += bool(conn._out)
                flush(cmd)

            conn._flush = counting  # type: ignore[method-assign]
            steps = 4
            for _ in range(steps):
                model.eval_last([7])
            assert not conn._out
            time.sleep(0.2)  # (the server counts a command after serving it)
            sent = {k: v - counts.get(k, 0) for k, v in server.counts.items() if v != counts.get(k, 0)}
            n_inputs = [len(s.inputs) for s in model.runner.sched.splits if s.backend is rpc]
            assert n_inputs and sent == {"SET_TENSOR": steps * sum(n_inputs), "GRAPH_RECOMPUTE": steps * len(n_inputs),
                                         "GET_TENSOR": steps}
            assert flushes == 2 * steps  # the inputs with the graph, then the read
        finally:
            model.free()
    finally:
        close_all()
        server.close()


def test_the_server_checks_a_repeated_small_set_or_get_once_until_a_buffer_is_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pyggml's server keeps the checked range of a small SET_TENSOR / GET_TENSOR by its request's bytes (a decode
    step sends the same ones each time); freeing a buffer forgets them, so a request naming the freed buffer is
    refused as before (the connection closed)."""
    from pyggml.backends.rpc.server import RpcServer
    from pyggml.backends.rpc.wire import RpcTensor

    checks = [0]
    real = RpcServer._tensor

    def counting(self: RpcServer, *args: Any, **kw: Any) -> Tensor:
        checks[0] += 1
        return real(self, *args, **kw)

    monkeypatch.setattr(RpcServer, "_tensor", counting)
    server = RpcServer([cpu_init(1)], "127.0.0.1", 0).start()
    host, port = server.endpoint.rsplit(":", 1)

    def request(s: socket.socket, cmd: RpcCmd, payload: bytes, n: int | None) -> bytes:
        s.sendall(wire.frame_request(cmd, payload))
        if n is None:
            return b""
        got = b""
        while len(got) < 8 + n:
            chunk = s.recv(8 + n - len(got))
            assert chunk, "the server closed the connection"
            got += chunk
        return got[8:]

    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            request(s, RpcCmd.HELLO, bytes(24), 28)
            remote, _ = wire.ALLOC_BUFFER_RSP.unpack(request(s, RpcCmd.ALLOC_BUFFER, wire.ALLOC_BUFFER_REQ.pack(0, 64),
                                                             16))
            (base,) = wire.BUFFER_GET_BASE_RSP.unpack(request(s, RpcCmd.BUFFER_GET_BASE,
                                                              wire.BUFFER_GET_BASE_REQ.pack(remote), 8))
            rt = RpcTensor(id=1, type=0, buffer=remote, ne=(4, 1, 1, 1), nb=(4, 16, 16, 16), data=base,
                           name=b"t").pack()
            get = rt + wire.GET_TENSOR_REQ_TAIL.pack(0, 16)
            for i in range(3):
                values = np.arange(4, dtype=np.float32) + i
                request(s, RpcCmd.SET_TENSOR, rt + wire.SET_TENSOR_HEAD_TAIL.pack(0, 0) + values.tobytes(), None)
                assert request(s, RpcCmd.GET_TENSOR, get, 16) == values.tobytes()
            assert checks[0] == 2  # the first SET_TENSOR and the first GET_TENSOR
            request(s, RpcCmd.FREE_BUFFER, wire.FREE_BUFFER_REQ.pack(remote), None)
            request(s, RpcCmd.SET_TENSOR, rt + wire.SET_TENSOR_HEAD_TAIL.pack(0, 0) + bytes(16), None)
            assert s.recv(1) == b""  # refused: the buffer is not the client's any more
    finally:
        server.close()
