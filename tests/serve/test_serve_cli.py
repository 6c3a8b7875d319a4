"""`pyggml serve` as a user runs it: a child process on a free 127.0.0.1 port, the openai client, then SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from serve_util import free_port

from pyggml.cli.main import main
from pyggml.cli.serve import host_warning

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


def test_serve_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in ("--host", "--port", "-np", "-c", "--api-key"):
        assert option in out


def test_only_loopback_binds_quietly() -> None:
    assert host_warning("127.0.0.1", None) is None and host_warning("localhost", None) is None
    w = host_warning("0.0.0.0", None)
    assert w is not None and "0.0.0.0" in w and "--api-key" in w
    assert "--api-key" not in (host_warning("192.168.1.2", "k") or "")


def test_bad_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 1
    assert "--port" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_serves_the_builtin_model() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "serve", "--port", str(port), "-np", "2", "-c", "256",
                             "--api-key", "k"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health", headers={"Authorization": "Bearer k"}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list().data] == ["builtin-llama"]
        r = client.completions.create(model="builtin-llama", prompt="The module", max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens >= 1 and 1 <= r.usage.completion_tokens <= 8
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        err = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 0, err
    assert f"127.0.0.1:{port}" in err and "2 slots of 128 tokens" in err
