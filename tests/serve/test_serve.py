"""pyggml serve through the real `openai` client: chat and completions, streamed and not, usage, stop strings,
concurrent clients, prompt-prefix reuse, greedy output equal to Model.generate."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import openai
import pytest
from serve_util import API_KEY, Running

import pyggml.models as pm
from pyggml.models.builtin import builtin_model_path
from pyggml.models.chat import ChatTemplate

AUTH = {"Authorization": f"Bearer {API_KEY}"}  # /health too needs the key
PROMPTS = ["The module", "If the file", "Return the", "Convert the path", "The optional argument", "Create a new",
           "This function", "Raise an error"]


@pytest.fixture(scope="module")
def reference() -> Any:
    """A model of our own (the server's belongs to its engine thread)."""
    m = pm.load(builtin_model_path(), n_ctx=128, progress=False)
    yield m
    m.free()


def _greedy_text(model: pm.Model, prompt_ids: list[int], n: int) -> tuple[str, int]:
    """Model.generate's greedy answer as the server gives it: text up to EOS (not included), its token count."""
    model.reset()
    dec = model.tokenizer.stream_decoder()
    text, count = "", 0
    for tok in model.generate(prompt_ids, n):
        if tok in model.tokenizer.eog_ids:
            break
        text += dec.add(tok)
        count += 1
    return text + dec.flush(), count


def test_health_and_models(server: Running, client: openai.OpenAI) -> None:
    r = httpx.get(server.url + "/health", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    models = client.models.list().data
    assert [m.id for m in models] == ["builtin-llama"]


def test_health_counts_the_decode_work(server: Running, client: openai.OpenAI) -> None:
    """/health's step_tokens and decode_seconds (what bench_serve reads): one request alone evaluates its prompt
    after the cached prefix, then each token it samples but the last, in steps that took some time."""
    before = httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()
    got = client.completions.create(model="m", prompt="Return the number of", max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    after = httpx.get(server.url + "/health", headers=AUTH, timeout=10).json()
    use = got.usage
    assert use.completion_tokens == 6
    evaluated = use.prompt_tokens - use.prompt_tokens_details.cached_tokens + use.completion_tokens - 1
    assert after["step_tokens"] - before["step_tokens"] == evaluated
    assert after["steps"] - before["steps"] >= use.completion_tokens  # one step per sampled token at least
    assert after["decode_seconds"] > before["decode_seconds"]


def test_completion_greedy_equals_generate(client: openai.OpenAI, reference: pm.Model) -> None:
    for prompt in PROMPTS[:3]:
        want, n = _greedy_text(reference, reference.tokenize(prompt), 24)
        got = client.completions.create(model="builtin-llama", prompt=prompt, max_tokens=24, temperature=0)
        assert got.object == "text_completion" and len(got.choices) == 1
        assert got.choices[0].text == want
        assert got.usage.prompt_tokens == len(reference.tokenize(prompt))
        assert got.usage.completion_tokens == n
        assert got.usage.total_tokens == got.usage.prompt_tokens + n
        assert got.choices[0].finish_reason == ("length" if n == 24 else "stop")
        # streamed: the same text in pieces, then [DONE] (the client stops there)
        pieces = list(client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in pieces) == want
        assert pieces[-1].choices[0].finish_reason == got.choices[0].finish_reason
        assert all(c.choices[0].finish_reason is None for c in pieces[:-1])


@pytest.mark.slow
def test_chat_streamed_and_not(client: openai.OpenAI, reference: pm.Model) -> None:
    messages = [{"role": "system", "content": "You write docstrings."}, {"role": "user", "content": "Return the"}]
    ids = reference.tokenize(ChatTemplate.from_model(reference).prompt(messages), True, True)
    want, n = _greedy_text(reference, ids, 16)
    got = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), n)
    chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n
    assert chunks[-1].usage.prompt_tokens == len(ids)
    # the same messages again: the slot's cached prompt is reused (all of it but the last token)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ids) - 1


def test_stop_string_ends_the_answer(client: openai.OpenAI, reference: pm.Model) -> None:
    full, _ = _greedy_text(reference, reference.tokenize(PROMPTS[0]), 24)
    stop = full[10:14]
    assert stop and full.find(stop) >= 1
    for stream in (False, True):
        if stream:
            parts = list(client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                                   stop=[stop, "never-said"], stream=True))
            text, finish = "".join(p.choices[0].text for p in parts), parts[-1].choices[0].finish_reason
        else:
            got = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                            stop=[stop, "never-said"])
            text, finish = got.choices[0].text, got.choices[0].finish_reason
        assert text == full[:full.find(stop)]
        assert finish == "stop"


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def ask() -> str:
        r = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=12, temperature=0.9, top_p=0.95,
                                      seed=1234, presence_penalty=0.5, frequency_penalty=0.2)
        return r.choices[0].text

    assert ask() == ask()


@pytest.mark.slow
def test_concurrent_clients_get_their_own_answers(client: openai.OpenAI, reference: pm.Model) -> None:
    want = {p: _greedy_text(reference, reference.tokenize(p), 16)[0] for p in PROMPTS}

    def ask(prompt: str) -> str:
        c = openai.OpenAI(base_url=client.base_url, api_key=API_KEY, max_retries=0, timeout=30.0)
        return c.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # 8 clients, 4 slots: half of them wait in the queue
        got = dict(zip(PROMPTS, pool.map(ask, PROMPTS), strict=True))
    assert got == want


def test_hints_are_accepted_and_unimplemented_fields_refused_by_name(client: openai.OpenAI) -> None:
    """OpenAI's hints (user, metadata, store, ...) change no answer and are accepted; a field pyggml does not
    implement is a 400 naming it, never silently ignored."""
    r = client.chat.completions.create(
        model="whatever", messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], max_tokens=3,
        temperature=0, user="me", metadata={"k": "v"}, store=False, service_tier="auto", prompt_cache_key="c",
        safety_identifier="s", n=1, response_format={"type": "text"}, stream_options=None)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 3
    refused = {"functions": [{"name": "f"}], "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text"],
               "prediction": {"type": "content", "content": "x"}, "typical_p": 0.5, "mirostat": 2,
               "dry_multiplier": 0.8}
    for name, value in refused.items():
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           extra_body={name: value})
        assert e.value.body["param"] == name and name in e.value.body["message"], name
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="Hi", max_tokens=2, stream=True,
                                  stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert e.value.body["param"] == "stream_options.continuous_usage_stats"
