"""Helpers of the RPC tests: real ggml-rpc-server processes on free 127.0.0.1 ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from pyggml.backends.rpc.connection import close_all


def wait_for(cond: object, timeout: float = 5.0) -> bool:
    """Whether cond() turns true within timeout seconds (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Wait until something accepts on 127.0.0.1:port (the C server answers a probe by closing it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"RPC server exited with {proc.returncode} before listening:\n{out}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return
        time.sleep(0.05)
    raise RuntimeError(f"RPC server on port {port} did not listen within {timeout} s")


@contextlib.contextmanager
def c_server(binary: Path, threads: int = 1,
             cache: Path | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ggml-rpc-server on a free port: ("127.0.0.1:PORT", process); killed on exit. With `cache`, its file
    cache (-c) is in cache/rpc (LLAMA_CACHE)."""
    port = free_port()
    cmd = [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)] + (["-c"] if cache else [])
    env = {**os.environ, "LLAMA_CACHE": str(cache)} if cache else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        wait_listening(port, proc)
        yield f"127.0.0.1:{port}", proc
    finally:
        close_all()
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


