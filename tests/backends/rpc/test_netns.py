"""Two machines, as network namespaces this test makes (where it may: root and `ip netns`), each reached over
a veth link from this one: the real ggml-rpc-server on one, `pyggml rpc-server` on the other. The built-in
model split over the local CPU and both gives the one-backend greedy tokens; a machine cut off the network
(its link down, so nothing answers) ends in a typed error naming it, within the RPC timeout, and the model can
still be freed.

The addresses (10.231.N.0/30) exist only on links between this test's own namespaces and are removed with
them."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.backends.rpc.client import rpc_init
from pyggml.backends.rpc.connection import close_all, connect
from pyggml.backends.rpc.wire import RpcConnectionError

PORT = 50052
PROMPT = "The module"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def _machines(n: int) -> Iterator[list[tuple[str, str, str]]]:
    """n namespaces, each with a veth link to this one: (namespace, its address, this side's interface)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = os.getpid() % 100000
    made: list[tuple[str, str, str]] = []
    try:
        for i in range(1, n + 1):
            ns, here, there = f"pyggml-{tag}-{i}", f"pgh{tag}{i}", f"pgn{tag}{i}"
            try:
                _ip("netns", "add", ns)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot make a network namespace here: {e.stderr.decode().strip()}")
            made.append((ns, f"10.231.{i}.2", here))
            _ip("link", "add", here, "type", "veth", "peer", "name", there)
            _ip("link", "set", there, "netns", ns)
            _ip("addr", "add", f"10.231.{i}.1/30", "dev", here)
            _ip("link", "set", here, "up")
            for cmd in (("addr", "add", f"10.231.{i}.2/30", "dev", there), ("link", "set", there, "up"),
                        ("link", "set", "lo", "up")):
                _ip("netns", "exec", ns, "ip", *cmd)
        yield made
    finally:
        for ns, _, here in made:
            subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _wait_listening(addr: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"the server on {addr} exited with {proc.returncode}:\n{out[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((addr, PORT), timeout=1.0):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listened on {addr}:{PORT} within {timeout} s")


def test_two_machines_serve_layers_and_one_cut_off_is_named(rpc_server_binary: Path,
                                                            builtin_greedy_tokens: list[int]) -> None:
    import pyggml.models as pm
    from pyggml.models.builtin import builtin_model_path

    with _machines(2) as machines:
        (ns_c, addr_c, _), (ns_py, addr_py, link_py) = machines
        servers = [
            subprocess.Popen(["ip", "netns", "exec", ns_c, str(rpc_server_binary), "-H", addr_c, "-p", str(PORT),
                              "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            subprocess.Popen(["ip", "netns", "exec", ns_py, sys.executable, "-m", "pyggml.cli", "rpc-server",
                              "-H", addr_py, "-p", str(PORT), "-t", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        ]
        model = None
        try:
            _wait_listening(addr_c, servers[0])
            _wait_listening(addr_py, servers[1])
            far_c, far_py = rpc_init(f"{addr_c}:{PORT}"), rpc_init(f"{addr_py}:{PORT}")
            model = pm.load(builtin_model_path(), backends=[far_c, far_py, cpu_init(1)], n_layers_on=[1, 2],
                            n_ctx=64, progress=False)
            assert [sum(b is x for b in model.layer_backend) for x in (far_c, far_py)] == [1, 2]
            tokens = list(model.generate(model.tokenize(PROMPT), 8, stop_at_eos=False))
            assert tokens == builtin_greedy_tokens
            assert model.runner.sched.n_splits >= 3
            # a machine that stops answering is given up after 5 s (set only now: the first computes on the
            # pyggml server may compile its kernels, on a cold cache longer than that)
            connect(f"{addr_py}:{PORT}").set_timeout(5)
            # the second machine is cut off: its link goes down, nothing answers, nothing resets
            _ip("link", "set", link_py, "down")
            t0 = time.monotonic()
            with pytest.raises(RpcConnectionError, match=f"{addr_py}:{PORT}"):
                model.reset()
                list(model.generate(model.tokenize(PROMPT), 4, stop_at_eos=False))
            assert time.monotonic() - t0 < 60
        finally:
            if model is not None:
                model.free()
            close_all()
            for proc in servers:
                proc.kill()
                proc.wait(timeout=20)
                if proc.stdout:
                    proc.stdout.close()
