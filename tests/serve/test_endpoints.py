"""llama-server's other endpoints over real HTTP on 127.0.0.1, in its shapes: /tokenize, /detokenize,
/apply-template, /props, /slots, /metrics (parsed by prometheus_client), /v1/models/{id}, /v1/embeddings and
/embeddings (the `openai` client's base64 too), the request log's line per request, chat_template_kwargs and the
reasoning of a template that thinks apart in reasoning_content (whole and streamed)."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_util import API_KEY, Running, serving, start_server

import pyggml.models as pm
from pyggml.models.builtin import builtin_model_path
from pyggml.serve.app import create_app
from pyggml.serve.embeddings import encode_vector
from pyggml.serve.options import ServerOptions
from pyggml.serve.request_log import LOGGER_NAME

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Qwen3's way in a few lines: the assistant's turn opens a thinking block, or an empty one without thinking
THINK_TEMPLATE = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}{%- endif -%}")
MESSAGES = [{"role": "user", "content": "Return the path of the module"}]


@pytest.fixture(scope="module")
def full() -> Iterator[Running]:
    """Every feature on: embeddings (mean pooling), metrics, a template that thinks."""
    options = ServerOptions(embeddings=True, pooling="mean", metrics=True, chat_template=THINK_TEMPLATE,
                            chat_template_name="the test's template")
    yield from start_server(n_slots=2, n_ctx=512, api_key=API_KEY, options=options)


@pytest.fixture(scope="module")
def plain() -> Iterator[Running]:
    """The defaults, one slot, slow steps (a request is caught in its slot)."""
    yield from start_server(n_slots=1, n_ctx=256, api_key=API_KEY, step_delay=0.02)


@pytest.fixture(scope="module")
def reference() -> Iterator[pm.Model]:
    m = pm.load(builtin_model_path(), n_ctx=256, progress=False)
    yield m
    m.free()


def _client(server: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30.0)


def _post(server: Running, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=30)


def _get(server: Running, path: str) -> httpx.Response:
    return httpx.get(server.url + path, headers=AUTH, timeout=30)


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param
    return err


# --- /tokenize, /detokenize ---

def test_tokenize(full: Running, reference: pm.Model) -> None:
    tok = reference.tokenizer
    text = "á café</s>"
    r = _post(full, "/tokenize", {"content": text})
    assert r.status_code == 200 and set(r.json()) == {"tokens"}
    assert r.json()["tokens"] == tok.encode(text, False, True)  # llama-server's defaults: no BOS, specials parsed
    assert r.json()["tokens"][-1] == tok.eos_id
    with_bos = _post(full, "/tokenize", {"content": text, "add_special": True, "parse_special": False}).json()
    assert with_bos["tokens"] == tok.encode(text, True, False) and with_bos["tokens"][0] == tok.bos_id
    pieces = _post(full, "/tokenize", {"content": "á café", "with_pieces": True}).json()["tokens"]
    ids = tok.encode("á café", False, True)
    assert [p["id"] for p in pieces] == ids
    # a byte token's piece is its byte as a list (not UTF-8 alone), the others their text
    assert [195] in [p["piece"] for p in pieces] and [161] in [p["piece"] for p in pieces]
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert joined == b"".join(tok.token_to_bytes(t) for t in ids)
    mixed = _post(full, "/tokenize", {"content": ["The", 7, "file"], "add_special": True}).json()["tokens"]
    assert mixed == tok.encode("The", True, True) + [7] + tok.encode("file", False, True)


def test_tokenize_refuses_bad_input(full: Running) -> None:
    _error(_post(full, "/tokenize", {"content": {"a": 1}}), 400, "content")
    _error(_post(full, "/tokenize", {"content": 5}), 400, "content")
    _error(_post(full, "/tokenize", {"content": ["a", None]}), 400, "content")
    assert _post(full, "/tokenize", {}).json() == {"tokens": []}
    _error(_post(full, "/tokenize", {"content": ["a", 10**6]}), 400, "content")
    _error(_post(full, "/tokenize", {"content": "a", "with_pieces": "yes"}), 400, "with_pieces")
    _error(_post(full, "/tokenize", [1, 2]), 400)


def test_detokenize(full: Running, reference: pm.Model) -> None:
    ids = reference.tokenize("Return the file")  # BOS first: written, as llama-server writes special tokens
    r = _post(full, "/detokenize", {"tokens": ids})
    assert r.status_code == 200
    assert r.json() == {"content": "<s> Return the file"}
    assert _post(full, "/detokenize", {"tokens": []}).json() == {"content": ""}
    _error(_post(full, "/detokenize", {"tokens": [1, -3]}), 400, "tokens")
    _error(_post(full, "/detokenize", {"tokens": "1 2"}), 400, "tokens")


# --- /apply-template, chat_template_kwargs, reasoning ---

def test_apply_template_takes_the_kwargs(full: Running) -> None:
    r = _post(full, "/apply-template", {"messages": MESSAGES})
    assert r.status_code == 200
    assert r.json() == {"prompt": "<|im_start|>user\nReturn the path of the module<|im_end|>\n"
                                  "<|im_start|>assistant\n<think>\n"}
    off = _post(full, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}})
    assert off.json()["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    _error(_post(full, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": "x"}), 400,
           "chat_template_kwargs")
    _error(_post(full, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": "no"}}),
           400, "chat_template_kwargs.enable_thinking")
    _error(_post(full, "/apply-template", {"messages": []}), 400, "messages")
    for key in ("messages", "add_generation_prompt", "tools", "name", "tokenizer", "self"):  # not 500s
        _error(_post(full, "/apply-template", {"messages": MESSAGES, "chat_template_kwargs": {key: 1}}), 400,
               f"chat_template_kwargs.{key}")
        _error(_post(full, "/v1/chat/completions", {"messages": MESSAGES, "chat_template_kwargs": {key: 1}}), 400,
               f"chat_template_kwargs.{key}")


def _greedy(full: Running, body: dict[str, Any]) -> str:
    """The reply's raw text: the completion of /apply-template's prompt."""
    prompt = _post(full, "/apply-template", body).json()["prompt"]
    out = _client(full).completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0)
    return out.choices[0].text


def test_reasoning_goes_to_reasoning_content(full: Running) -> None:
    client = _client(full)
    raw = _greedy(full, {"messages": MESSAGES})
    assert raw.strip() and "</think>" not in raw
    # the template opened the thinking block: the whole reply is reasoning
    msg = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0).choices[0].message
    assert msg.content == ""
    assert msg.model_extra["reasoning_content"] == raw.strip()
    # streamed: reasoning deltas only
    deltas = [c.choices[0].delta for c in client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=12, temperature=0, stream=True) if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == raw.strip()
    assert "".join(d.content or "" for d in deltas) == ""
    # "none" (the request's): the reply whole in the content; "deepseek-legacy": in both
    none = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0,
                                          extra_body={"reasoning_format": "none"}).choices[0].message
    assert none.content == raw and "reasoning_content" not in (none.model_extra or {})
    legacy = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0,
                                            extra_body={"reasoning_format": "deepseek-legacy"}).choices[0].message
    assert legacy.content == raw and legacy.model_extra["reasoning_content"] == raw.strip()
    _error(_post(full, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_format": "loud"}), 400,
           "reasoning_format")


def test_chat_template_kwargs_turn_thinking_off(full: Running) -> None:
    body = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    raw = _greedy(full, body)
    assert not raw.lstrip().startswith("<think>")
    msg = _client(full).chat.completions.create(model="m", messages=MESSAGES, max_tokens=12, temperature=0,
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert msg.choices[0].message.content == raw
    assert "reasoning_content" not in (msg.choices[0].message.model_extra or {})


# --- /props, /slots, /v1/models/{id} ---

def test_props(full: Running) -> None:
    r = _get(full, "/props")
    assert r.status_code == 200
    props = r.json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["top_k"] == 40
    assert props["chat_template"] == THINK_TEMPLATE
    assert props["bos_token"] == "<s>" and props["eos_token"] == "</s>"
    assert props["model_path"] == "builtin-llama.gguf"
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}


def test_slots_show_the_request_in_its_slot(plain: Running) -> None:
    idle = _get(plain, "/slots")
    assert idle.status_code == 200
    assert [(s["id"], s["is_processing"], s["n_ctx"]) for s in idle.json()] == [(0, False, 256)]
    with httpx.stream("POST", plain.url + "/v1/completions", headers=AUTH, timeout=30,
                      json={"prompt": "The module", "max_tokens": 40, "temperature": 0.5, "seed": 3, "stream": True,
                            "ignore_eos": True}) as stream:
        lines = stream.iter_lines()
        while not next(lines).startswith("data: {"):  # the first token came: the request holds the slot
            pass
        busy = _get(plain, "/slots").json()
        assert busy[0]["is_processing"] is True
        assert busy[0]["params"]["temperature"] == 0.5 and busy[0]["params"]["n_predict"] == 40
        assert 1 <= busy[0]["next_token"]["n_decoded"] <= 40
        assert busy[0]["next_token"]["n_remain"] == 40 - busy[0]["next_token"]["n_decoded"]
        assert "prompt" not in busy[0] and "The module" not in str(busy)  # never a request's text
        full_err = _get(plain, "/slots?fail_on_no_slot=1")
        _error(full_err, 503)
        for _ in lines:
            pass
    assert _get(plain, "/slots?fail_on_no_slot=1").status_code == 200


def test_model_by_id(full: Running) -> None:
    client = _client(full)
    got = client.models.retrieve("builtin-llama")
    assert got.id == "builtin-llama" and got.object == "model" and got.owned_by == "pyggml"
    with pytest.raises(openai.NotFoundError, match="'gpt-4' does not exist"):
        client.models.retrieve("gpt-4")


def test_endpoints_their_flags_left_off(plain: Running) -> None:
    for path, flag in (("/metrics", "--metrics"), ("/v1/embeddings", "--embeddings"), ("/embeddings", "--embeddings")):
        r = _get(plain, path) if path == "/metrics" else _post(plain, path, {"input": "a"})
        err = _error(r, 501)
        assert err["type"] == "not_supported_error" and flag in err["message"]
    assert httpx.get(plain.url + "/props", timeout=10).status_code == 401  # the key guards every route
    with serving(create_app(plain.engine, api_key=API_KEY, options=ServerOptions(slots=False))) as url:  # --no-slots
        err = _error(httpx.get(url + "/slots", headers=AUTH, timeout=10), 501)
        assert "--slots" in err["message"]


# --- /metrics ---

def _metrics(server: Running) -> dict[str, float]:
    r = _get(server, "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_parse_and_count(full: Running) -> None:
    before = _metrics(full)
    names = {"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
             "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total", "llamacpp:n_tokens_max",
             "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing",
             "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode", "llamacpp:prompt_tokens_cached_total"}
    assert names <= set(before)
    got = _client(full).completions.create(model="m", prompt="Convert the path of the", max_tokens=7, temperature=0,
                                           extra_body={"ignore_eos": True})
    after = _metrics(full)
    use = got.usage
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 7
    evaluated = use.prompt_tokens - use.prompt_tokens_details.cached_tokens
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == evaluated
    assert after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"] >= 7
    assert after["llamacpp:prompt_seconds_total"] > before["llamacpp:prompt_seconds_total"]
    assert after["llamacpp:predicted_tokens_seconds"] > 0  # tokens/s of the window since the last scrape
    assert after["llamacpp:n_tokens_max"] >= use.prompt_tokens + 7
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0
    assert _metrics(full)["llamacpp:predicted_tokens_seconds"] == 0  # nothing since the last scrape


# --- embeddings ---

def test_embeddings_through_the_openai_client(full: Running, reference: pm.Model) -> None:
    texts = ["Return the path", "The module of the file is read", "x"]
    got = _client(full).embeddings.create(model="m", input=texts)  # the client asks for base64
    assert got.object == "list" and got.model == "builtin-llama"
    assert [d.index for d in got.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in got.data])
    want = reference.embed(texts, pooling="mean")
    # computed beside each other in one batch: the F16 weights' products round a little differently
    np.testing.assert_allclose(vectors, want, atol=1e-4)
    assert (np.sum(vectors * want, axis=1) > 0.99999).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(len(reference.tokenize(t)) for t in texts)
    floats = _post(full, "/v1/embeddings", {"input": texts, "encoding_format": "float"}).json()
    np.testing.assert_allclose(np.array([d["embedding"] for d in floats["data"]]), vectors, atol=1e-4)


def test_base64_is_the_float32_bytes() -> None:
    vec = np.array([0.1, -2.5, 3e-8, 7.0], dtype=np.float32)
    text = encode_vector(vec, True)
    assert np.array_equal(np.frombuffer(base64.b64decode(text), dtype="<f4"), vec)
    assert encode_vector(vec, False) == vec.tolist()


def test_embeddings_shapes_and_options(full: Running, reference: pm.Model) -> None:
    ids = reference.tokenize("Create a new")
    raw = _post(full, "/v1/embeddings", {"input": ids, "embd_normalize": -1}).json()["data"][0]["embedding"]
    want = reference.embed(ids, pooling="mean", embd_normalize=-1)
    np.testing.assert_allclose(raw, want, rtol=1e-3, atol=1e-4)
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3  # not normalized
    native = _post(full, "/embeddings", {"input": ["Create a new", ids]})
    assert native.status_code == 200
    body = native.json()
    assert [item["index"] for item in body] == [0, 1] and len(body[0]["embedding"]) == 1  # pooled: one vector
    np.testing.assert_allclose(body[0]["embedding"][0], body[1]["embedding"][0], rtol=1e-5, atol=1e-6)
    content = _post(full, "/v1/embeddings", {"content": "Create a new"}).json()  # llama-server's field: its shape
    assert isinstance(content, list) and content[0]["index"] == 0
    _error(_post(full, "/v1/embeddings", {"input": "a", "encoding_format": "hex"}), 400, "encoding_format")
    _error(_post(full, "/v1/embeddings", {"input": {"text": "a"}}), 400, "input")
    _error(_post(full, "/v1/embeddings", {"input": []}), 400, "input")
    _error(_post(full, "/v1/embeddings", {"model": "m"}), 400, "input")
    _error(_post(full, "/v1/embeddings", {"input": [5, 10**6]}), 400, "input")
    err = _error(_post(full, "/v1/embeddings", {"input": "word " * 400}), 400, "input")
    assert err["code"] == "context_length_exceeded"
    _error(_post(full, "/v1/embeddings", {"input": "a", "embd_normalize": "2"}), 400, "embd_normalize")


# --- the request log ---

def test_a_log_line_per_request(full: Running, caplog: pytest.LogCaptureFixture) -> None:
    client = _client(full)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        _get(full, "/props")
        _post(full, "/tokenize", {"content": 3})  # refused: logged with its status
        got = client.completions.create(model="m", prompt="The module", max_tokens=5, temperature=0,
                                        extra_body={"ignore_eos": True})
        list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0, stream=True))
        httpx.get(full.url + "/nowhere", headers=AUTH, timeout=10)
        deadline = time.monotonic() + 10
        while len(caplog.records) < 5 and time.monotonic() < deadline:  # written once each answer has gone
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert len(lines) == 5, lines
    assert " GET /props 200 " in lines[0]
    assert " POST /tokenize 400 " in lines[1]
    use = got.usage
    assert (f" POST /v1/completions 200 prompt={use.prompt_tokens} completion=5 "
            f"cached={use.prompt_tokens_details.cached_tokens} ") in lines[2]
    assert " POST /v1/chat/completions 200 prompt=" in lines[3] and " completion=4 " in lines[3]
    assert " GET /nowhere 404 " in lines[4]
    assert all(line.startswith("127.0.0.1:") and line.endswith("s") for line in lines)
