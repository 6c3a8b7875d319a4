"""`pyggml serve` as a user runs it: a child process on a free 127.0.0.1 port, the openai client, then SIGINT; its
llama-server flags (embeddings, metrics, chat template file and kwargs) and their refusals."""

from __future__ import annotations

import io
import logging
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
from pyggml.cli.serve import host_warning, request_lines_to

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
def test_the_command_serves_the_builtin_model(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}{{ greeting }}")
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "serve", "--port", str(port), "-np", "2", "-c", "256",
                             "--api-key", "k", "--embeddings", "--pooling", "last", "--metrics",
                             "--chat-template-file", str(template), "--chat-template-kwargs", '{"greeting": "hi"}'],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        auth = {"Authorization": "Bearer k"}
        prompt = httpx.post(url + "/apply-template", headers=auth, timeout=10,
                            json={"messages": [{"role": "user", "content": "Hello"}]}).json()["prompt"]
        assert prompt == "[user] Hello hi"  # the file's template with the command line's variables
        vec = client.embeddings.create(model="m", input="The module").data[0].embedding
        assert len(vec) == 256
        metrics = httpx.get(url + "/metrics", headers=auth, timeout=10)
        assert metrics.status_code == 200 and "llamacpp:tokens_predicted_total" in metrics.text
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
    # a line per request, as it went
    assert err.count(" POST /v1/completions 200 prompt=") == 1
    assert err.count(" GET /v1/models 401 ") == 1 and err.count(" POST /v1/embeddings 200 prompt=") == 1
    assert err.count(" POST /apply-template 200 ") == 1 and err.count(" GET /metrics 200 ") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: expected a JSON object"),
    (["--chat-template-kwargs", "{x"], "--chat-template-kwargs: not JSON"),
    (["--chat-template-kwargs", '{"messages": []}'], "'messages' is not a variable the command line may set"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "--chat-template-file: cannot read"),
    (["--embeddings", "--pooling", "rank"], "--pooling rank needs a classifier head"),
    (["--pooling", "mean"], "--pooling is for embeddings: give --embeddings too"),
])
def test_flags_refused_before_loading(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *args]) == 1
    assert message in capsys.readouterr().err


def test_bad_flag_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--embd-normalize", "-2"], ["--reasoning-format", "loud"], ["--pooling", "max"]):
        with pytest.raises(SystemExit) as e:
            main(["serve", *args])
        assert e.value.code == 2
        assert args[0] in capsys.readouterr().err


def test_request_lines_go_to_stderr_while_serving() -> None:
    err = io.StringIO()
    logger = logging.getLogger("pyggml.serve.requests")
    with request_lines_to(err, logger.name):
        logger.info("127.0.0.1:5 GET /props 200 0.001s")
    logger.info("after")  # the handler is gone with the server
    assert err.getvalue() == "pyggml serve: 127.0.0.1:5 GET /props 200 0.001s\n"
