"""pyggml serve under bad requests, clients that leave mid-stream, and load: every error is OpenAI's error
object with a 4xx status, a client that disconnects frees its slot, nothing is lost, the server goes on."""

from __future__ import annotations

import concurrent.futures
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_util import API_KEY, Running, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LOAD_REQUESTS = 200
LOAD_CLIENTS = 8
LOAD_TIME_LIMIT = 150.0  # about 8 s on 2 idle cores; the bound is for a machine shared with others


def _post(server: Running, path: str, body: Any, headers: dict[str, str] | None = None,
          raw: bytes | None = None) -> httpx.Response:
    return httpx.post(server.url + path, content=raw if raw is not None else json.dumps(body).encode(),
                      headers={"Content-Type": "application/json", **(AUTH if headers is None else headers)},
                      timeout=30)


def _is_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def _still_serving(client: openai.OpenAI) -> None:
    r = client.completions.create(model="m", prompt="The module", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1 or r.choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_bad_requests_get_error_objects(server: Running, client: openai.OpenAI) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    _is_error(_post(server, "/v1/chat/completions", None, raw=b'{"model": "m", "messages": ['), 400)
    _is_error(_post(server, "/v1/chat/completions", None, raw=b"\xff\xfe not json"), 400)
    _is_error(_post(server, "/v1/chat/completions", [1, 2]), 400)
    _is_error(_post(server, "/v1/chat/completions", {"model": "m"}), 400, "messages")
    _is_error(_post(server, "/v1/chat/completions", {**chat, "n": 2}), 400, "n")
    _is_error(_post(server, "/v1/completions", {"prompt": "a", "best_of": 3}), 400, "best_of")
    _is_error(_post(server, "/v1/completions", {"prompt": "a", "suffix": "b"}), 400, "suffix")
    _is_error(_post(server, "/v1/completions", {"prompt": ["a", "b"]}), 400, "prompt")
    _is_error(_post(server, "/v1/completions", {"prompt": [1, 10**9]}), 400, "prompt")
    _is_error(_post(server, "/v1/chat/completions", {**chat, "temperature": "hot"}), 400, "temperature")
    _is_error(_post(server, "/v1/chat/completions", {**chat, "max_tokens": 0}), 400, "max_tokens")
    _is_error(_post(server, "/v1/chat/completions", {**chat, "stop": ["a", "b", "c", "d", "e"]}), 400, "stop")
    # a prompt longer than a slot's context (128 tokens), and max_tokens past it
    err = _is_error(_post(server, "/v1/completions", {"prompt": "The module " * 200}), 400, "prompt")
    assert err["code"] == "context_length_exceeded"
    _is_error(_post(server, "/v1/completions", {"prompt": "The module", "max_tokens": 500}), 400, "max_tokens")
    # a body over the size limit (1 MiB)
    _is_error(_post(server, "/v1/completions", {"prompt": "x" * (1 << 20)}), 413)
    # unknown paths and methods
    _is_error(httpx.get(server.url + "/v1/nothing", headers=AUTH, timeout=10), 404)
    _is_error(httpx.get(server.url + "/v1/completions", headers=AUTH, timeout=10), 405)
    # the API key
    _is_error(_post(server, "/v1/chat/completions", chat, headers={}), 401)
    _is_error(_post(server, "/v1/chat/completions", chat, headers={"Authorization": "Bearer nope"}), 401)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=10)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], n=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"
    _still_serving(client)
    assert server.engine.busy_slots() == 0 and server.engine.waiting() == 0


@pytest.fixture(scope="module")
def slow_server() -> Iterator[Running]:
    """One slot, each step slowed down: a stream runs long enough to be left in the middle."""
    yield from start_server(n_slots=1, n_ctx=256, step_delay=0.02)


def test_a_client_leaving_mid_stream_frees_its_slot(slow_server: Running) -> None:
    engine = slow_server.engine
    body = {"model": "m", "prompt": "The module", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", slow_server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
        assert engine.busy_slots() == 1
    # the connection is closed: the slot is freed at the engine's next step, long before 200 tokens
    deadline = time.monotonic() + 10
    while engine.busy_slots() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.busy_slots() == 0 and engine.n_cancelled >= 1
    assert slow_server.model.seq_pos_max(0) == -1  # its cells were given back
    c = openai.OpenAI(base_url=slow_server.url + "/v1", api_key="none", max_retries=0, timeout=30)
    r2 = c.completions.create(model="m", prompt="The module", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    assert r2.usage.completion_tokens == 5


@pytest.mark.slow
def test_a_client_leaving_a_non_streamed_request_frees_its_slot(slow_server: Running) -> None:
    engine = slow_server.engine
    before = engine.n_cancelled
    body = {"model": "m", "prompt": "The module", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(slow_server.url + "/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
    deadline = time.monotonic() + 10  # the server looks every 0.5 s, far sooner than 200 slowed-down tokens
    while engine.n_cancelled == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.n_cancelled == before + 1
    while engine.busy_slots() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.busy_slots() == 0 and slow_server.model.seq_pos_max(0) == -1


@pytest.mark.slow
def test_load_nothing_lost(server: Running) -> None:
    """200 short requests from 8 clients (chat and completion, streamed and not): every one answered, well-formed."""
    rng = random.Random(0)
    words = ["The", "module", "file", "Return", "the", "path", "If", "a", "string", "list", "value", "error"]
    jobs = [(i, rng.choice(["chat", "completion"]), rng.random() < 0.5,
             " ".join(rng.choice(words) for _ in range(rng.randint(1, 8))), rng.randint(1, 6))
            for i in range(LOAD_REQUESTS)]
    clients = [openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
               for _ in range(LOAD_CLIENTS)]

    def one(job: tuple[int, str, bool, str, int]) -> tuple[int, int]:
        i, kind, stream, text, n = job
        c = clients[i % LOAD_CLIENTS]
        temp = 0.0 if i % 3 else 0.8
        if kind == "chat":
            args: dict[str, Any] = dict(model="m", messages=[{"role": "user", "content": text}], max_tokens=n,
                                        temperature=temp, seed=i)
            if stream:
                chunks = list(c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
                assert chunks[0].choices[0].delta.role == "assistant"
                assert chunks[-2].choices[0].finish_reason in ("stop", "length")
                use = chunks[-1].usage
            else:
                r = c.chat.completions.create(**args)
                assert r.choices[0].finish_reason in ("stop", "length")
                assert isinstance(r.choices[0].message.content, str)
                use = r.usage
        else:
            args = dict(model="m", prompt=text, max_tokens=n, temperature=temp, seed=i)
            if stream:
                chunks = list(c.completions.create(**args, stream=True))
                assert chunks[-1].choices[0].finish_reason in ("stop", "length")
                assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])
                return i, -1
            r = c.completions.create(**args)
            assert r.choices[0].finish_reason in ("stop", "length")
            use = r.usage
        assert use.prompt_tokens >= 1 and 0 <= use.completion_tokens <= n
        assert use.total_tokens == use.prompt_tokens + use.completion_tokens
        return i, use.completion_tokens

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(LOAD_CLIENTS) as pool:
        done = list(pool.map(one, jobs, timeout=LOAD_TIME_LIMIT))
    assert sorted(i for i, _ in done) == list(range(LOAD_REQUESTS))
    assert time.monotonic() - t0 < LOAD_TIME_LIMIT
    assert server.engine.busy_slots() == 0 and server.engine.waiting() == 0
    r = httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()
    assert r["slots_processing"] == 0 and r["requests_waiting"] == 0
    assert r["requests_done"] >= LOAD_REQUESTS and r["prompts_reused"] > 0  # chat prompts share their template


def test_an_internal_error_is_an_error_object_too(server: Running) -> None:
    from starlette.testclient import TestClient

    from pyggml.serve.app import create_app

    app = create_app(server.engine)  # a second app over the same engine, called in-process

    def broken(p: Any) -> list[int]:
        raise RuntimeError("boom")

    app.state.server.prompt_ids = broken
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as http:
        r = http.post("/v1/completions", json={"prompt": "The module", "max_tokens": 2})
    err = _is_error(r, 500)
    assert err["type"] == "server_error" and "boom" in err["message"]
    assert server.engine.busy_slots() == 0
