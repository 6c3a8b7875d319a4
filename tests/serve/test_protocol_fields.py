"""The request fields of structured output, logprobs, logit_bias and cache_prompt, checked without a model; a field
pyggml does not implement is refused by name, OpenAI's hints are not."""

from __future__ import annotations

from typing import Any

import pytest

from pyggml.serve.engine import TokenProb
from pyggml.serve.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    HINTS,
    RequestError,
    chat_logprobs,
    completion_logprobs,
    parse_request,
)

MSG = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> Any:
    return parse_request({"messages": MSG, **fields}, "chat")


def completion(**fields: Any) -> Any:
    return parse_request({"prompt": "Hi", **fields}, "completion")


def refused(param: str, make: Any, **fields: Any) -> str:
    with pytest.raises(RequestError) as e:
        make(**fields)
    assert e.value.param == param and e.value.status == 400, (fields, e.value.param, e.value.message)
    return e.value.message


@pytest.mark.parametrize("name", ["functions", "function_call", "audio", "modalities", "prediction",
                                  "reasoning_effort", "web_search_options", "verbosity", "typical_p", "mirostat",
                                  "dry_multiplier", "samplers", "no_such_field"])
def test_an_unimplemented_field_is_refused_by_name(name: str) -> None:
    message = refused(name, chat, **{name: "x"})
    assert f"'{name}'" in message
    refused(name, completion, **{name: 1})


@pytest.mark.parametrize("name", ["tools", "tool_choice", "parallel_tool_calls"])
def test_tool_fields_are_a_chats_only(name: str) -> None:
    message = refused(name, completion, **{name: []})
    assert f"'{name}'" in message and "completions" in message


def test_hints_and_nulls_are_accepted() -> None:
    hints = {"user": "u", "metadata": {"a": "b"}, "store": True, "service_tier": "auto", "prompt_cache_key": "k",
             "prompt_cache_retention": "24h", "safety_identifier": "s"}
    assert set(hints) == HINTS
    chat(**hints)
    completion(**hints)
    chat(tools=None, logprobs=None, response_format=None, grammar=None)  # null: the field's absence
    chat(stream=True, stream_options={"include_usage": True, "include_obfuscation": False})
    refused("stream_options.continuous_usage_stats", chat, stream=True,
            stream_options={"continuous_usage_stats": True})


def test_each_endpoint_has_its_own_fields() -> None:
    refused("top_logprobs", completion, top_logprobs=2)  # chat's
    refused("messages", completion, messages=MSG)
    refused("echo", chat, echo=False)  # completions'
    assert "max_completion_tokens" in CHAT_FIELDS and "max_completion_tokens" not in COMPLETION_FIELDS


def test_response_format_grammar_and_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(response_format={"type": "text"}).grammar is None
    p = chat(response_format={"type": "json_object"})
    assert (p.grammar, p.grammar_param) == (("json_object", None), "response_format")
    assert chat(response_format={"type": "json_object", "schema": schema}).grammar == ("json_schema", schema)
    p = chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True,
                                                                      "description": "d"}})
    assert p.grammar == ("json_schema", schema)
    assert chat(response_format={"type": "json_schema", "json_schema": {"name": "n"}}).grammar == ("json_schema", {})
    p = completion(grammar='root ::= "a"')
    assert (p.grammar, p.grammar_param) == (("gbnf", 'root ::= "a"'), "grammar")
    assert completion(grammar="").grammar is None  # llama-server: an empty grammar is none
    assert chat(json_schema=schema).grammar == ("json_schema", schema)
    refused("response_format.type", chat, response_format={"type": "xml"})
    refused("response_format.json_schema", chat, response_format={"type": "json_schema"})
    refused("response_format.json_schema.extra", chat, response_format={"type": "json_schema",
                                                                         "json_schema": {"schema": {}, "extra": 1}})
    refused("response_format.other", chat, response_format={"type": "json_object", "other": 1})
    refused("response_format", chat, response_format="json")
    refused("grammar", chat, grammar=["root ::= x"])
    refused("json_schema", chat, json_schema="{}")
    message = refused("json_schema", chat, grammar='root ::= "a"', json_schema=schema)
    assert "'grammar' and 'json_schema'" in message


def test_logprobs_fields() -> None:
    assert chat().n_probs is None and chat(logprobs=False).n_probs is None
    assert chat(logprobs=True).n_probs == 0
    assert chat(logprobs=True, top_logprobs=5).n_probs == 5
    assert completion(logprobs=3).n_probs == 3 and completion(logprobs=0).n_probs == 0
    assert chat(n_probs=4).n_probs == 4 and completion(n_probs=0).n_probs is None  # llama-server's: 0 is none
    refused("top_logprobs", chat, top_logprobs=2)  # without logprobs, as OpenAI
    refused("top_logprobs", chat, logprobs=True, top_logprobs=21)
    refused("logprobs", chat, logprobs=1)
    refused("logprobs", completion, logprobs=True)
    refused("logprobs", completion, logprobs=-1)
    refused("n_probs", chat, n_probs=100)


def test_logit_bias_forms() -> None:
    assert chat(logit_bias={"5": 2.5, "7": -100}).logit_bias == [(5, 2.5), (7, -100.0)]
    assert chat(logit_bias=[[5, 1], ["hello", False]]).logit_bias == [(5, 1.0), ("hello", float("-inf"))]
    assert chat(logit_bias={"hello": 1}).logit_bias == [("hello", 1.0)]  # a text: its tokens (llama-server)
    for bad in ({"5": 100.5}, {"5": "1"}, {"5": True}, {"": 1}, [[5]], [5, 1], "5:1", {"5": float("nan")}):
        refused("logit_bias", chat, logit_bias=bad)


def test_cache_prompt() -> None:
    assert chat().cache_prompt and not chat(cache_prompt=False).cache_prompt
    refused("cache_prompt", chat, cache_prompt="no")


def test_logprobs_objects() -> None:
    pieces = {1: b"He", 2: b"llo", 3: b"\xe2\x82", 4: b" w"}
    probs = [TokenProb(1, -0.5, [(1, -0.5), (4, -1.5)]), TokenProb(3, -2.0, [])]
    c = chat_logprobs(probs, pieces.__getitem__)
    assert c["refusal"] is None
    assert c["content"][0] == {"token": "He", "logprob": -0.5, "bytes": [72, 101], "top_logprobs": [
        {"token": "He", "logprob": -0.5, "bytes": [72, 101]}, {"token": " w", "logprob": -1.5, "bytes": [32, 119]}]}
    assert c["content"][1]["bytes"] == [0xE2, 0x82] and c["content"][1]["token"] == "\ufffd"  # a part of a character
    o = completion_logprobs([probs[0], TokenProb(2, -0.1, [(2, -0.1)])], pieces.__getitem__, offset=10)
    assert o == {"tokens": ["He", "llo"], "token_logprobs": [-0.5, -0.1],
                 "top_logprobs": [{"He": -0.5, " w": -1.5}, {"llo": -0.1}], "text_offset": [10, 12]}
