"""Structured output, logprobs and logit_bias through the real `openai` client, on SmolLM2-135M-Instruct.

One server (4 slots, batch-invariant kernels) for the module: the 20 JSON schemas go 4 at a time, so
constrained sequences share decode batches, each with its own mask, and a free request beside constrained ones
answers as it does alone."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from serve_util import Running, start_server

import pyggml.models as pm
from pyggml.serve.options import ServerOptions

GRAMMARS = Path(__file__).resolve().parent.parent / "data" / "grammars"
ANSWER_TOKENS = 64  # enough for each schema's answer below (its strings are bounded: a small model may ramble)

S = {"type": "string", "maxLength": 32}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}


def obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An object schema as OpenAI's strict mode wants it: every property required unless said, no other."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# what to ask for, and the schema: nested objects, arrays, enums, required and optional fields, bounded numbers
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person", obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("a product for sale", obj({"name": S, "price": {"type": "number", "minimum": 0, "maximum": 10000},
                                "in_stock": BOOL})),
    ("your favourite color", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("up to three fruits", {"type": "array", "items": S, "minItems": 1, "maxItems": 3}),
    ("a user account", obj({"user": obj({"id": {"type": "integer", "minimum": 1, "maximum": 99999}, "email": S})})),
    ("a movie title, with or without a subtitle", obj({"title": S, "subtitle": S}, ["title"])),
    ("points on a grid", {"type": "array", "items": obj({"x": INT, "y": INT}), "minItems": 1, "maxItems": 3}),
    ("the weather today", obj({"temperature": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60},
                               "sunny": BOOL})),
    ("a rating of a restaurant", obj({"rating": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": S},
                                     ["rating"])),
    ("a task", obj({"done": BOOL, "note": {"type": ["string", "null"], "maxLength": 32}})),
    ("a versioned list of numbers", obj({"version": {"const": "1.0"},
                                         "values": {"type": "array", "items": INT, "maxItems": 4}})),
    ("a value that is a number or a word", obj({"value": {"anyOf": [INT, S]}})),
    ("an event date", obj({"event": S, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})),
    ("a short code", obj({"code": {"type": "string", "minLength": 3, "maxLength": 6}})),
    ("nested digits", obj({"a": obj({"b": obj({"c": {"type": "array", "maxItems": 3,
                                                       "items": {"type": "integer", "minimum": 0, "maximum": 9}}})})})),
    ("tags of an article", obj({"tags": {"type": "array", "items": {"enum": ["news", "sports", "tech"]},
                                         "minItems": 1, "maxItems": 3}})),
    ("a shipping address", {"type": "object", "properties": {"to": {"$ref": "#/$defs/addr"}}, "required": ["to"],
                            "additionalProperties": False,
                            "$defs": {"addr": obj({"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})}}),
    ("an answer: yes, no or maybe", {"type": "string", "enum": ["yes", "no", "maybe"]}),
    ("a number between 10 and 20", {"type": "integer", "minimum": 10, "maximum": 20}),
    ("a book", obj({"title": S, "authors": {"type": "array", "items": S, "minItems": 1, "maxItems": 2},
                    "year": {"type": "integer", "minimum": 1800, "maximum": 2025},
                    "genre": {"enum": ["novel", "poetry", "essay"]}})),
]


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[Running]:
    pytest.importorskip("llguidance")
    # batch-invariant kernels: an answer does not depend on the requests decoded beside it (nor on its cached prompt)
    yield from start_server(n_slots=4, n_ctx=1024, model_path=smollm2_path, load_options={"batch_invariant": True})


@pytest.fixture(scope="module")
def client(smol: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol.url + "/v1", api_key="none", max_retries=0, timeout=120.0)


def ask(client: openai.OpenAI, text: str, max_tokens: int = ANSWER_TOKENS, **kw: Any) -> Any:
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], temperature=0,
                                          max_tokens=max_tokens, **kw)


def test_json_schemas_give_json_their_schema_validates(client: openai.OpenAI) -> None:
    def one(item: tuple[str, dict[str, Any]]) -> tuple[str, str]:
        what, schema = item
        r = ask(client, f"Give {what} as JSON.", response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
        assert r.choices[0].finish_reason == "stop", (what, r.choices[0].message.content)
        return what, r.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # 4 slots: constrained sequences batched together
        answers = list(pool.map(one, SCHEMAS))
    for (what, text), (_, schema) in zip(answers, SCHEMAS, strict=True):
        jsonschema.validate(json.loads(text), schema)  # raises (with the place) when invalid
        assert what  # each schema answered


def test_json_object_and_llama_server_json_schema(client: openai.OpenAI) -> None:
    r = ask(client, "Describe a cat.", response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = obj({"ok": BOOL})
    r = ask(client, "Is it fine?", extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    c = client.completions.create(model="m", prompt="A cat as JSON:", max_tokens=ANSWER_TOKENS, temperature=0,
                                  extra_body={"json_schema": obj({"name": S, "lives": {"type": "integer",
                                                                                       "maximum": 9}})})
    assert set(json.loads(c.choices[0].text)) == {"name", "lives"}


def test_constrained_and_free_sequences_share_batches(client: openai.OpenAI, smol: Running) -> None:
    """A free request decoded beside constrained ones answers as it does alone (the masks are per sequence)."""
    prompt = "Write a short poem about the sea."
    alone = ask(client, prompt, max_tokens=24).choices[0].message.content
    steps = smol.engine.n_steps
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        person = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMAS[0][1]}}
        jobs = [pool.submit(ask, client, "Give a person as JSON.", 40, response_format=person) for _ in range(2)]
        free = pool.submit(ask, client, prompt, 24)
        together = free.result().choices[0].message.content
        for j in jobs:
            assert isinstance(json.loads(j.result().choices[0].message.content), dict)
    assert smol.engine.n_steps - steps < 24 + 2 * 40  # the requests shared steps
    assert together == alone and not together.lstrip().startswith("{")


def test_grammar_yes_or_no(client: openai.OpenAI) -> None:
    for question in ("Is the sky blue?", "Is fire cold?", "Do fish fly? Explain at length."):
        r = ask(client, question, max_tokens=8, extra_body={"grammar": 'root ::= "yes" | "no"'})
        assert r.choices[0].message.content in ("yes", "no") and r.choices[0].finish_reason == "stop"
    for temperature in (0.7, 1.5):  # sampled too: the mask comes before the draw
        r = client.completions.create(model="m", prompt="Answer:", max_tokens=8, temperature=temperature, seed=3,
                                      extra_body={"grammar": 'root ::= "yes" | "no"', "top_k": 0, "min_p": 0})
        assert r.choices[0].text in ("yes", "no")


# grammars of llama.cpp's grammars/ folder, with something to ask for (japanese and c are compiled only: see
# tests/models/test_grammar.py)
GBNF_ASKS = {"json": "Give a JSON object describing a cat.", "json_arr": "Give a JSON list of two fruits.",
             "list": "List three fruits, one per line.", "chess": "Write the first moves of a chess game in PGN.",
             "english": "Say hello in one short sentence."}


def test_gbnf_files_constrain_a_64_token_generation(client: openai.OpenAI, smollm2_path: Path) -> None:
    """Each answer is accepted by llama.cpp's own grammar engine: every token, and as a whole sentence of the
    grammar when the answer ended (not cut by max_tokens)."""
    from pyggml.testing.gbnf_oracle import gbnf_accepts
    from pyggml.testing.llamacpp import NoCompilerError

    def one(name: str) -> Any:
        return ask(client, GBNF_ASKS[name], max_tokens=64, extra_body={"grammar": (GRAMMARS / f"{name}.gbnf")
                                                                       .read_text()}).choices[0]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = dict(zip(GBNF_ASKS, pool.map(one, GBNF_ASKS), strict=True))
    try:
        for name, choice in answers.items():
            [acc] = gbnf_accepts(smollm2_path, (GRAMMARS / f"{name}.gbnf").read_text(), [choice.message.content])
            assert acc.tokens > 0 and acc.prefix, (name, choice.message.content, acc)
            assert acc.complete == (choice.finish_reason == "stop"), (name, choice.message.content, acc)
    except NoCompilerError:
        pytest.skip("no C/C++ compiler to build llama.cpp's grammar engine")
    assert sum(c.finish_reason == "stop" for c in answers.values()) >= 2  # some answers end inside 64 tokens


def test_bad_grammars_and_schemas_are_400s_naming_the_field(client: openai.OpenAI) -> None:
    cases = [({"extra_body": {"grammar": "root ::= undefined-rule"}}, "grammar"),
             ({"extra_body": {"grammar": 'root ::= "unterminated'}}, "grammar"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
              "response_format"),
             ({"extra_body": {"json_schema": {"type": "string", "format": "no-such-format"}}}, "json_schema"),
             ({"response_format": {"type": "json_object"}, "extra_body": {"grammar": 'root ::= "a"'}},
              "response_format")]  # two constraints: the second named
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, "Hi", max_tokens=4, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_logprobs_of_greedy_tokens_are_model_evals_log_softmax(client: openai.OpenAI, smol: Running,
                                                              smollm2_path: Path) -> None:
    prompt = smol.model.tokenizer.encode("The capital of France is", add_special=False)
    r = client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0, logprobs=5,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == 8 and all(len(t) == 5 for t in lp.top_logprobs)
    ref_model = pm.load(smollm2_path, n_ctx=64, progress=False, n_threads=1, batch_invariant=True)
    try:
        tok = ref_model.tokenizer
        gen = [tok.encode(t, add_special=False) for t in lp.tokens]
        ids = [g[0] for g in gen]
        assert all(len(g) == 1 for g in gen) and "".join(lp.tokens) == r.choices[0].text
        want = _log_softmax(ref_model.eval(prompt + ids[:-1])[len(prompt) - 1:])
    finally:
        ref_model.free()
    for i, t in enumerate(ids):
        assert ids[i] == int(np.argmax(want[i]))  # greedy
        np.testing.assert_allclose(lp.token_logprobs[i], want[i, t], atol=1e-5)
        top = np.argsort(-want[i], kind="stable")[:5]
        assert list(lp.top_logprobs[i]) == [tok.token_to_piece(int(j), True) for j in top]
        np.testing.assert_allclose(list(lp.top_logprobs[i].values()), want[i, top], atol=1e-5)
    assert lp.text_offset[0] == len(tok.decode(prompt)) and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_streamed_and_not(client: openai.OpenAI) -> None:
    r = ask(client, "Hi", max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content and len(content) == 6
    for c in content:
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.top_logprobs[-1].logprob
        assert c.logprob == c.top_logprobs[0].logprob and bytes(c.bytes).decode() == c.token  # greedy: the top one
    stream = ask(client, "Hi", max_tokens=6, logprobs=True, top_logprobs=3, stream=True)
    streamed = [c for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    assert [(c.token, round(c.logprob, 5)) for c in streamed] == [(c.token, round(c.logprob, 5)) for c in content]
    # llama-server's n_probs gives the same entries; a constrained answer's logprobs are the masked distribution's
    r = ask(client, "Is the sky blue?", max_tokens=4, extra_body={"n_probs": 4, "grammar": 'root ::= "yes" | "no"'})
    [entry] = r.choices[0].logprobs.content
    assert {t.token for t in entry.top_logprobs} <= {"yes", "no", "y", "n", "ye"}  # only what the grammar allows
    assert abs(sum(np.exp(t.logprob) for t in entry.top_logprobs) - 1) < 1e-3 or len(entry.top_logprobs) == 4


def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI, smol: Running) -> None:
    tok = smol.model.tokenizer
    prompt = "The capital of France is"
    plain = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0, logprobs=2)
    first, second = list(plain.choices[0].logprobs.top_logprobs[0])
    assert plain.choices[0].text == first
    [first_id] = tok.encode(first, add_special=False)
    for bias in ({str(first_id): -100}, [[first_id, False]], [[first, False]]):  # OpenAI's map; llama-server's lists
        r = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                      extra_body={"logit_bias": bias})
        assert r.choices[0].text == second, bias
        assert first not in r.choices[0].logprobs.top_logprobs[0]  # the banned token left the distribution
    [forced] = tok.encode(" banana", add_special=False)
    r = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0.8, seed=1,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == " banana"
    for bad in ({"": 1}, {str(tok.n_vocab): 1}, {"5": 101}, {"5": "high"}, [[5]]):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=prompt, max_tokens=1, extra_body={"logit_bias": bad})
        assert e.value.body["param"] == "logit_bias", bad


def test_a_seeded_request_answers_the_same_with_and_without_its_cached_prompt(client: openai.OpenAI) -> None:
    """cache_prompt false (llama-server's field) evaluates the whole prompt; with batch-invariant kernels the
    answer drawn at temperature 1 from the same seed is the one the cached prompt gives."""
    kw: dict[str, Any] = {"max_tokens": 24, "temperature": 1.0, "seed": 1234, "top_k": 0, "min_p": 0}
    messages = [{"role": "user", "content": "Tell me something surprising about octopuses."}]
    cold = client.chat.completions.create(model="m", messages=messages, extra_body={**kw, "cache_prompt": False})
    warm = client.chat.completions.create(model="m", messages=messages, extra_body=kw)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens == cold.usage.prompt_tokens - 1  # all but the last
    assert warm.choices[0].message.content == cold.choices[0].message.content
    other = client.chat.completions.create(model="m", messages=messages, extra_body={**kw, "seed": 4321})
    assert other.choices[0].message.content != cold.choices[0].message.content  # the seed is what decides


def test_the_servers_grammar_constrains_the_requests_that_bring_none() -> None:
    """`pyggml serve --grammar` (llama-server's): the built-in model's server answers yes or no unless a request
    brings its own constraint."""
    pytest.importorskip("llguidance")
    options = ServerOptions(grammar=("gbnf", 'root ::= "yes" | "no"', "--grammar"))
    for running in start_server(n_slots=2, n_ctx=256, options=options):
        c = openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0, timeout=60.0)
        for temperature in (0.0, 1.0):
            r = c.completions.create(model="m", prompt="Is it?", max_tokens=8, temperature=temperature, seed=2)
            assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
        r = c.completions.create(model="m", prompt="Is it?", max_tokens=8, temperature=0,
                                 extra_body={"grammar": 'root ::= "maybe"'})
        assert r.choices[0].text == "maybe"
