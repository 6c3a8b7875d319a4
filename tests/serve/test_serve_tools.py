"""Tool calling through the real `openai` client, on SmolLM2: with Qwen 2.5's template (a tools-capable one) a
round trip (a call, its result in a `tool` message, the final answer), streamed and not; with SmolLM2's own
ChatML template (llama.cpp's generic format) `tool_choice: "required"`, a named function and parallel calls
give calls that parse and validate; bad tool fields are 400s naming them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from serve_util import Running, start_server

from pyggml.models.tool_calls import GENERIC_INSTRUCTION, TOOLS_INSTRUCTION
from pyggml.serve.options import ServerOptions

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = "18 C and sunny"
MAX_TOKENS = 48


# as `pyggml serve` loads (batch-invariant): a request's answer does not depend on what its slot cached
SERVE_DEFAULTS = {"batch_invariant": True}


@pytest.fixture(scope="module")
def qwen(smollm2_path: Path, llamacpp_models: Path) -> Iterator[Running]:
    """SmolLM2 with Qwen 2.5 Instruct's template: tools in the system turn, `<tool_call>` calls, `tool` results."""
    pytest.importorskip("llguidance")
    name = "Qwen-Qwen2.5-7B-Instruct.jinja"
    source = (llamacpp_models / "templates" / name).read_text(encoding="utf-8")
    yield from start_server(n_slots=2, n_ctx=2048, model_path=smollm2_path, load_options=SERVE_DEFAULTS,
                            options=ServerOptions(chat_template=source, chat_template_name=name))


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[Running]:
    """SmolLM2 with its own template, which writes no tools: llama.cpp's generic format."""
    pytest.importorskip("llguidance")
    yield from start_server(n_slots=2, n_ctx=2048, model_path=smollm2_path, load_options=SERVE_DEFAULTS)


def client(server: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120.0)


def ask(server: Running, messages: list[dict[str, Any]], stream: bool, **fields: Any) -> dict[str, Any]:
    """The reply as one message {content, tool_calls, finish_reason}; streamed, put together from its deltas by
    their index as OpenAI's clients do (a call's id and name come once, its arguments in pieces)."""
    args = {"model": "m", "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, **fields}
    c = client(server)
    if not stream:
        choice = c.chat.completions.create(**args).choices[0]
        m = choice.message
        calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments} for t in m.tool_calls or ()]
        return {"content": m.content, "tool_calls": calls, "finish_reason": choice.finish_reason}
    content: list[str] = []
    calls_by_index: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in c.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for t in delta.tool_calls or ():
            call = calls_by_index.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = t.id or call["id"]
            call["name"] = (t.function.name if t.function else None) or call["name"]
            call["arguments"] += (t.function.arguments if t.function else None) or ""
        finish = chunk.choices[0].finish_reason or finish
    calls = [calls_by_index[i] for i in sorted(calls_by_index)]
    return {"content": "".join(content) or None, "tool_calls": calls, "finish_reason": finish}


def check_call(call: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """A well-formed call of one of `names`: an id, arguments valid under its tool's schema."""
    assert call["id"] and call["name"] in names, call
    tool = next(t for t in TOOLS if t["function"]["name"] == call["name"])
    args = json.loads(call["arguments"])
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def apply_template(server: Running, body: dict[str, Any]) -> str:
    r = httpx.post(server.url + "/apply-template", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["prompt"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_round_trip_on_a_tools_template(qwen: Running, stream: bool) -> None:
    """The call (forced by tool_choice), its result back in a `tool` message, then the final answer."""
    first = ask(qwen, ASK, stream, tools=TOOLS, tool_choice="required")
    assert first["finish_reason"] == "tool_calls" and not first["content"]
    assert len(first["tool_calls"]) == 1
    call = first["tool_calls"][0]
    assert call["id"].startswith("call_")
    args = check_call(call, {"get_weather", "get_time"})
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    # the template gets the call in its syntax and the result in its tool turn
    prompt = apply_template(qwen, {"messages": history, "tools": TOOLS})
    assert (f'<|im_start|>assistant\n<tool_call>\n{{"name": "{call["name"]}", "arguments": {json.dumps(args)}}}\n'
            f'</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n'
            f'<|im_start|>assistant\n') in prompt
    assert json.dumps(WEATHER) in prompt  # the tools, as the template writes them
    final = ask(qwen, history, stream, tools=TOOLS)
    assert final["tool_calls"] == [] and final["finish_reason"] in ("stop", "length")
    assert isinstance(final["content"], str) and final["content"].strip()
    assert final == ask(qwen, history, not stream, tools=TOOLS)  # streamed or not, the same answer


def test_a_named_function_on_a_tools_template(qwen: Running) -> None:
    got = ask(qwen, ASK, False, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c["name"] for c in got["tool_calls"]] == ["get_time"]
    check_call(got["tool_calls"][0], {"get_time"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_yields_a_call_on_smollm2s_own_template(smol: Running, stream: bool) -> None:
    got = ask(smol, ASK, stream, tools=TOOLS, tool_choice="required")
    assert got["finish_reason"] == "tool_calls" and not got["content"] and len(got["tool_calls"]) == 1
    check_call(got["tool_calls"][0], {"get_weather", "get_time"})


def test_named_and_parallel_calls_on_smollm2s_own_template(smol: Running) -> None:
    named = ask(smol, ASK, False, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c["name"] for c in named["tool_calls"]] == ["get_time"]
    check_call(named["tool_calls"][0], {"get_time"})
    both = ask(smol, [{"role": "user", "content": "The weather in Paris and the time in UTC?"}], True,
               tools=TOOLS, tool_choice="required", parallel_tool_calls=True, max_tokens=256,
               presence_penalty=1.0)  # greedy, the small model repeats calls until max_tokens
    assert both["finish_reason"] == "tool_calls" and both["tool_calls"], both
    for call in both["tool_calls"]:
        check_call(call, {"get_weather", "get_time"})
    assert len({c["id"] for c in both["tool_calls"]}) == len(both["tool_calls"])


def test_the_generic_format_tells_the_model_and_auto_gives_json(smol: Running) -> None:
    prompt = apply_template(smol, {"messages": ASK, "tools": TOOLS})
    assert GENERIC_INSTRUCTION in prompt and TOOLS_INSTRUCTION + json.dumps(TOOLS, indent=2) in prompt
    none = apply_template(smol, {"messages": ASK, "tools": TOOLS, "tool_choice": "none"})
    assert GENERIC_INSTRUCTION not in none and TOOLS_INSTRUCTION in none
    got = ask(smol, ASK, False, tools=TOOLS)  # auto: a call or a response, either way parsed
    if got["tool_calls"]:
        check_call(got["tool_calls"][0], {"get_weather", "get_time"})
    else:
        assert isinstance(got["content"], str) and not got["content"].startswith('{"response"')


def test_props_show_the_templates_capabilities(qwen: Running, smol: Running) -> None:
    caps = httpx.get(qwen.url + "/props", timeout=30).json()["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"] and caps["supports_parallel_tool_calls"]
    caps = httpx.get(smol.url + "/props", timeout=30).json()["chat_template_caps"]
    assert not caps["supports_tools"] and not caps["supports_tool_calls"] and caps["supports_system_role"]


def test_tool_choice_none_parses_nothing(qwen: Running) -> None:
    plain = ask(qwen, ASK, False, tools=TOOLS, tool_choice="none", max_tokens=12)
    assert plain["tool_calls"] == [] and plain["finish_reason"] in ("stop", "length")
    assert isinstance(plain["content"], str)


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "grammar": 'root ::= "x"'}, "grammar"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "description": "a<|im_start|>b"}}]},
     "tools[0].function.description"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": 1}}]}]},
     "messages[1].tool_calls[0].function.name"),
])
def test_bad_tool_fields_are_400s_naming_them(smol: Running, fields: dict[str, Any], param: str) -> None:
    body = {"model": "m", "messages": ASK, "max_tokens": 4, **fields}
    r = httpx.post(smol.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
