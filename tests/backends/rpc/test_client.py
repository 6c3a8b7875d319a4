"""pyggml's rpc client with the REAL ggml-rpc-server of llama.cpp 0c1e570: devices, buffers, tensor
set/get/copy/memset, graphs computed remotely equal the CPU's, GRAPH_RECOMPUTE, and a server that goes
away gives a typed error naming the endpoint, never a hang."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from rpc_util import c_server

from pyggml import Context
from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc import wire
from pyggml.backends.rpc.client import RPCBackend, RPCBuffer, is_rpc, rpc_get_device_memory, rpc_init
from pyggml.backends.rpc.connection import close_all, connect, parse_endpoint
from pyggml.backends.rpc.wire import RpcConnectionError
from pyggml.core.errors import ArgumentError, GGMLError
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import (
    init_backend,
    registry,
    tensor_copy,
    tensor_get,
    tensor_get_numpy,
    tensor_memset,
    tensor_set,
    tensor_set_numpy,
)
from pyggml.ggml_backend.buffer import BufferUsage
from pyggml.testing import alloc_ctx_tensors
from pyggml.testing.graphs import build_llama_graph, llama_input_values, place_weights

F32, F16, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.Q8_0
BUILTIN_PROMPT = "The module"  # tests/conftest.py's, which builtin_greedy_tokens continues


def test_endpoints_parse() -> None:
    assert parse_endpoint("127.0.0.1:50052") == ("127.0.0.1", 50052, None)
    assert parse_endpoint("rpc://127.0.0.1:50052/1") == ("127.0.0.1", 50052, 1)
    assert parse_endpoint("//localhost:7") == ("localhost", 7, None)
    for bad in ("127.0.0.1", "h:0", "h:70000", "h:p", ":5", "h:5/x"):
        with pytest.raises(ArgumentError, match="RPC endpoint"):
            parse_endpoint(bad)


def test_device_buffer_type_and_registry(endpoint: str) -> None:
    backend = init_backend(f"rpc://{endpoint}")
    assert isinstance(backend, RPCBackend) and is_rpc(backend) and not is_rpc(cpu_init(1))
    dev = backend.get_device()
    assert dev is not None and dev.name() == f"RPC0[{endpoint}]"
    free, total = dev.memory()
    assert 0 < free <= total
    assert rpc_get_device_memory(endpoint)[1] == total
    # the served CPU buffer type's alignment, asked over the wire: ggml's 32, pyggml's 64
    assert backend.get_alignment() in (32, 64)
    assert backend.get_max_size() == 2**64 - 1
    assert registry.reg_by_name("rpc").dev_count() >= 1
    with pytest.raises(ArgumentError, match="no device 5"):
        init_backend(f"rpc://{endpoint}/5")


def test_set_get_memset_clear_round_trips(endpoint: str, rng: np.random.Generator) -> None:
    backend = rpc_init(endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    a = ctx.new_tensor_2d(F32, 7, 5).set_name("a")
    h = ctx.new_tensor_1d(F16, 9).set_name("h")
    buf = alloc_ctx_tensors(ctx, backend)
    assert isinstance(buf, RPCBuffer) and not buf.is_host()
    va = rng.standard_normal((5, 7)).astype(np.float32)
    vh = rng.standard_normal(9).astype(np.float16)
    tensor_set_numpy(a, va)
    tensor_set_numpy(h, vh)
    np.testing.assert_array_equal(tensor_get_numpy(a), va)
    np.testing.assert_array_equal(tensor_get_numpy(h), vh)
    tensor_memset(a, 0, 4 * 7, 4 * 7)  # row 1
    want = va.copy()
    want[1] = 0
    np.testing.assert_array_equal(tensor_get_numpy(a), want)
    buf.clear(0)
    assert not tensor_get_numpy(a).any()
    buf.free()


def test_copies_on_the_server_and_through_the_host(endpoint: str, rng: np.random.Generator) -> None:
    backend, cpu = rpc_init(endpoint), cpu_init(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    src = ctx.new_tensor_1d(F32, 64).set_name("src")
    dst = ctx.new_tensor_1d(F32, 64).set_name("dst")
    buf = alloc_ctx_tensors(ctx, backend)
    ctx2 = Context(mem_size=1 << 20, no_alloc=True)
    host = ctx2.new_tensor_1d(F32, 64).set_name("host")
    hbuf = alloc_ctx_tensors(ctx2, cpu)
    v = rng.standard_normal(64).astype(np.float32)
    tensor_set_numpy(src, v)
    conn = connect(endpoint)
    sent = conn.bytes_sent
    tensor_copy(src, dst)  # COPY_TENSOR: no data crosses the wire
    assert conn.bytes_sent - sent == 9 + 2 * wire.RPC_TENSOR_SIZE
    np.testing.assert_array_equal(tensor_get_numpy(dst), v)
    tensor_copy(dst, host)
    np.testing.assert_array_equal(host.numpy().reshape(-1), v)
    host.numpy().reshape(-1)[:] = 2 * v
    tensor_copy(host, src)
    np.testing.assert_array_equal(tensor_get_numpy(src), 2 * v)
    buf.free()
    hbuf.free()


def _llama(backend: object, seed: int) -> tuple[np.ndarray, object]:
    """Logits of the test LLaMA graph computed on `backend` (weights and compute buffer there)."""
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    g, inputs, weights = build_llama_graph(ctx, n_layers=2, n_tokens=4, n_vocab=50)
    wt = place_weights(weights, backend, seed=7)  # type: ignore[arg-type]
    measure = TensorAllocator.new_measure_from_backend(backend)  # type: ignore[arg-type]
    for name in ("tokens", "pos", "kq_mask"):
        measure.alloc(inputs[name])
    need = GraphAllocator().alloc_graph(measure, g)
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    g, inputs, weights = build_llama_graph(ctx, n_layers=2, n_tokens=4, n_vocab=50)
    wt.free()
    wt = place_weights(weights, backend, seed=7)  # type: ignore[arg-type]
    buf = backend.alloc_buffer(need)  # type: ignore[attr-defined]
    talloc = TensorAllocator.new_from_buffer(buf)
    for name in ("tokens", "pos", "kq_mask"):
        talloc.alloc(inputs[name])
    GraphAllocator().alloc_graph(talloc, g)
    for name, v in llama_input_values(inputs, n_vocab=50, seed=seed).items():
        tensor_set_numpy(inputs[name], v)
    backend.graph_compute(g)  # type: ignore[attr-defined]
    out = tensor_get_numpy(inputs["logits"])
    return out, (g, inputs, buf, wt)


def test_a_graph_computed_remotely_equals_the_cpu(endpoint: str) -> None:
    backend = rpc_init(endpoint)
    got, (g, inputs, buf, wt) = _llama(backend, seed=3)
    ref, (_, _, rbuf, rwt) = _llama(cpu_init(1), seed=3)
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # the same graph again with its inputs written again (the allocator reused their memory): GRAPH_RECOMPUTE
    for name, v in llama_input_values(inputs, n_vocab=50, seed=3).items():
        tensor_set_numpy(inputs[name], v)
    n0 = backend.n_recomputes
    conn = connect(endpoint)
    sent = conn.bytes_sent
    backend.graph_compute(g)
    assert backend.n_recomputes == n0 + 1
    assert conn.bytes_sent - sent < 9 + 4 + 9 + 4 + 10  # GRAPH_RECOMPUTE, then the synchronizing request
    np.testing.assert_allclose(tensor_get_numpy(inputs["logits"]), ref, rtol=1e-4, atol=1e-5)
    for b in (buf, wt, rbuf, rwt):
        b.free()


def test_hash_path_for_large_weights(endpoint: str) -> None:
    """WEIGHTS over 10 MiB try SET_TENSOR_HASH first; a server without a cache says no, the data follows."""
    backend = rpc_init(endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_1d(F32, (wire.HASH_THRESHOLD // 4) + 16).set_name("big")
    buf = alloc_ctx_tensors(ctx, backend)
    buf.set_usage(BufferUsage.WEIGHTS)
    v = np.arange(w.ne[0], dtype=np.float32)
    conn = connect(endpoint)
    sent = conn.bytes_sent
    tensor_set_numpy(w, v)
    assert conn.bytes_sent - sent == 9 + wire.SET_TENSOR_HASH_REQ_SIZE + 9 + wire.SET_TENSOR_HEADER_SIZE + v.nbytes
    np.testing.assert_array_equal(tensor_get_numpy(w)[-5:], v[-5:])
    buf.free()


def test_quantized_rows_not_a_multiple_of_512_ask_the_server(endpoint: str) -> None:
    backend = rpc_init(endpoint)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    q = ctx.new_tensor_2d(Q8_0, 64, 3).set_name("q")
    assert backend.get_default_buffer_type().get_alloc_size(q) == q.nbytes()  # GET_ALLOC_SIZE
    buf = alloc_ctx_tensors(ctx, backend)  # INIT_TENSOR
    raw = np.arange(q.nbytes(), dtype=np.uint8) % 251
    tensor_set(q, raw)
    out = np.zeros_like(raw)
    tensor_get(q, out)
    np.testing.assert_array_equal(out, raw)
    buf.free()


def test_a_killed_server_gives_a_typed_error_and_frees(rpc_server_binary: Path) -> None:
    with c_server(rpc_server_binary) as (endpoint, proc):
        backend = rpc_init(endpoint)
        ctx = Context(mem_size=1 << 20, no_alloc=True)
        a = ctx.new_tensor_1d(F32, 16).set_name("a")
        out = ctx.scale(a, 2.0).set_name("out")
        buf = alloc_ctx_tensors(ctx, backend)
        g = ctx.new_graph()
        g.build_forward_expand(out)
        tensor_set_numpy(a, np.ones(16, np.float32))
        backend.graph_compute(g)
        assert (tensor_get_numpy(out) == 2).all()
        proc.kill()
        proc.wait(timeout=10)
        t0 = time.monotonic()
        with pytest.raises(RpcConnectionError, match=endpoint) as e:
            backend.graph_compute(g)
            tensor_get_numpy(out)
        assert isinstance(e.value, GGMLError)
        with pytest.raises(RpcConnectionError, match=endpoint):
            tensor_get_numpy(out)
        assert time.monotonic() - t0 < 10
        buf.free()  # nothing to send: the memory went with the server
        backend.free()
    with pytest.raises(RpcConnectionError, match=f"cannot connect to RPC server {endpoint}"):
        rpc_get_device_memory(endpoint)
    assert backend.get_device().memory() == (0, 0)  # a listing of devices goes on


def test_the_builtin_model_split_over_cpu_and_rpc_gives_the_greedy_tokens(
        endpoint: str, builtin_greedy_tokens: list[int]) -> None:
    import pyggml.models as pm
    from pyggml.models.builtin import builtin_model_path

    rpc = rpc_init(endpoint)
    model = pm.load(builtin_model_path(), backends=[cpu_init(1), rpc], n_layers_on=[2], n_ctx=64, progress=False)
    try:
        assert model.runner.sched.n_backends == 2
        tokens = list(model.generate(model.tokenize(BUILTIN_PROMPT), 8, stop_at_eos=False))
        assert tokens == builtin_greedy_tokens
        assert rpc.n_recomputes > 0  # decode steps after the first reuse the graph the server holds
    finally:
        model.free()


def test_pyggml_run_with_an_rpc_backend_writes_the_one_backend_text(endpoint: str) -> None:
    import contextlib
    import io

    from pyggml.cli.main import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        return code, out.getvalue(), err.getvalue()

    greedy = ["run", "-p", BUILTIN_PROMPT, "-n", "8", "--temp", "0", "--seed", "1"]
    code, one, err = run(greedy)
    assert code == 0, err
    code, split, err = run([*greedy, "--backend", "cpu", "--backend", f"rpc://{endpoint}", "--n-layers-on", "2",
                            "-v"])
    assert code == 0, err
    assert split == one
    assert f"layers 2..3: RPC0[{endpoint}]" in err


def test_the_c_api_names(endpoint: str) -> None:
    from pyggml import capi

    backend = capi.ggml_backend_rpc_init(endpoint, 0)
    assert capi.ggml_backend_is_rpc(backend) and not capi.ggml_backend_is_rpc(None)
    assert capi.ggml_backend_rpc_buffer_type(endpoint, 0) is backend.get_default_buffer_type()
    free, total = capi.ggml_backend_rpc_get_device_memory(endpoint, 0)
    assert 0 < free <= total
    reg = capi.ggml_backend_rpc_add_server(endpoint)
    assert reg is capi.ggml_backend_rpc_reg() and reg.name() == "rpc"
    assert any(d.name() == f"RPC0[{endpoint}]" for d in reg.devices())
    assert reg.get_proc_address("ggml_backend_rpc_start_server") is not None
    assert (capi.RPC_PROTO_MAJOR_VERSION, capi.RPC_PROTO_MINOR_VERSION) == (7, 0)


def test_a_server_of_another_version_is_refused_at_connect() -> None:
    import socket
    import threading

    from pyggml.backends.rpc.connection import Connection
    from pyggml.backends.rpc.wire import RpcVersionError

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:  # a server of protocol 8.1.0: reads HELLO, answers with its version
        conn, _ = listener.accept()
        with conn:
            conn.recv(9 + 24, socket.MSG_WAITALL)
            conn.sendall(wire.frame_response(wire.pack_hello_rsp(8, 1, 0)))
            conn.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(RpcVersionError, match=rf"127\.0\.0\.1:{port} speaks protocol 8\.1\.0"):
        Connection(f"127.0.0.1:{port}")
    t.join(timeout=5)
    listener.close()


def test_smollm2_split_over_cpu_and_rpc_gives_the_local_greedy_tokens(endpoint: str, smollm2_path: Path) -> None:
    """Half of SmolLM2's 30 layers on the server. 8 tokens: this prompt's 15th token has a top-2 margin of
    0.0009, which ggml's own CPU (the C server) rounds the other way than pyggml's."""
    import pyggml.models as pm

    def greedy(backends: list[object] | None, **kw: object) -> list[int]:
        model = pm.load(smollm2_path, n_ctx=64, progress=False, backends=backends, **kw)  # type: ignore[arg-type]
        try:
            return list(model.generate(model.tokenize("The capital of France is"), 8, stop_at_eos=False))
        finally:
            model.free()

    rpc = rpc_init(endpoint)
    assert greedy([cpu_init(1), rpc], n_layers_on=[15]) == greedy(None)
    assert rpc.n_recomputes >= 6


def test_a_model_whose_server_dies_raises_and_can_still_be_freed(rpc_server_binary: Path) -> None:
    import pyggml.models as pm
    from pyggml.models.builtin import builtin_model_path

    with c_server(rpc_server_binary) as (endpoint, proc):
        rpc = rpc_init(endpoint)
        model = pm.load(builtin_model_path(), backends=[cpu_init(1), rpc], n_layers_on=[2], n_ctx=64, progress=False)
        ids = model.tokenize(BUILTIN_PROMPT)
        assert len(list(model.generate(ids, 2, stop_at_eos=False))) == 2
        proc.kill()
        proc.wait(timeout=10)
        t0 = time.monotonic()
        with pytest.raises(RpcConnectionError, match=endpoint):
            list(model.generate(ids, 4, stop_at_eos=False))
        assert time.monotonic() - t0 < 10
        model.free()


def test_graph_serialization_order_and_leaves() -> None:
    """Tensors in the C client's order (each node after its sources and view source, each once), nodes
    flagged COMPUTE, and a leaf's own sources (the scheduler's link from an input copy to what it copies)
    left off the wire."""
    from pyggml.backends.rpc.client import serialize_graph

    ctx = Context(mem_size=1 << 20, no_alloc=True)
    upstream = ctx.new_tensor_1d(F32, 4).set_name("upstream")
    a = ctx.new_tensor_1d(F32, 4).set_name("a")
    a.src[0] = upstream  # as an input copy of the scheduler
    v = ctx.view_1d(a, 2, 8).set_name("v")
    b = ctx.add(a, a).set_name("b")
    c = ctx.mul(ctx.view_1d(b, 2, 0).set_name("bv"), v).set_name("c")
    nodes = [b, c.src[0], c]
    device, ids, tensors = wire.unpack_graph(serialize_graph(3, nodes, None))  # type: ignore[arg-type]
    assert device == 3 and ids == [id(n) for n in nodes]
    assert [t.name for t in tensors] == [b"a", b"b", b"bv", b"v", b"c"]
    by_name = {t.name: t for t in tensors}
    assert by_name[b"a"].src == (0,) * 10  # upstream does not travel
    assert by_name[b"v"].view_src == id(a) and by_name[b"v"].view_offs == 8
    assert [bool(t.flags & 16) for t in tensors] == [False, True, True, False, True]


def test_the_c_servers_cache_takes_pyggmls_hashes(rpc_server_binary: Path, tmp_path: Path) -> None:
    """ggml-rpc-server -c names its cache files by the FNV-1a of the bytes; pyggml's SET_TENSOR_HASH finds
    them the second time (a connection each: the C server serves one client at a time)."""
    v = np.random.default_rng(0).standard_normal(wire.HASH_THRESHOLD // 4 + 8).astype(np.float32)
    with c_server(rpc_server_binary, cache=tmp_path) as (endpoint, _):
        sent = []
        for _ in range(2):
            backend = rpc_init(endpoint)
            ctx = Context(mem_size=1 << 20, no_alloc=True)
            w = ctx.new_tensor_1d(F32, v.size).set_name("w")
            buf = alloc_ctx_tensors(ctx, backend)
            buf.set_usage(BufferUsage.WEIGHTS)
            conn = connect(endpoint)
            before = conn.bytes_sent
            tensor_set_numpy(w, v)
            sent.append(conn.bytes_sent - before)
            np.testing.assert_array_equal(tensor_get_numpy(w)[-8:], v[-8:])
            buf.free()
            close_all()
    assert [p.name for p in (tmp_path / "rpc").iterdir()] == [f"{wire.fnv_hash(v.tobytes()):016x}"]
    assert sent[0] > v.nbytes and sent[1] < 1000
