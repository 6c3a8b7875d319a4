"""Tool calling: OpenAI's `tools` rendered through a chat template, the template family's tool-call syntax as a
grammar, and replies parsed back into calls, as llama.cpp's common/chat.cpp (with minja's polyfills) does.

    fmt = ToolFormat.of(template)                                   # hermes, llama3 or generic
    messages, tools = fmt.template_inputs(messages, tools, choice)  # what the template renders
    grammar = fmt.grammar(tokenizer, tools, choice, parallel)       # None: the reply is free (auto, native syntax)
    parser = fmt.parser()                                           # feed(text) -> pieces, flush() -> pieces

Formats (llama.cpp's names):

- hermes (Hermes 2/3 Pro, Qwen 2.5, Qwen 3: templates that write `<tool_call>`): any text, then one or more
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- llama3 (Llama 3.1, 3.2, 3.3: templates with the `ipython` role): the reply is `{"name": ...,
  "parameters": {...}}` (one call).
- generic (any other template: SmolLM2's ChatML, Gemma's, Phi-3's): the reply is JSON under a JSON-schema
  grammar whatever `tool_choice` is: `{"tool_call": {"name", "arguments"}}` (`{"tool_calls": [{"name",
  "arguments", "id"}, ...]}` with parallel calls) or `{"response": "..."}`; the system message says so.

`tool_choice` "required" or a named function constrains the reply to calls (the named one's only) in the
format's syntax; "auto" lets a native format's reply be text or calls (parsed either way); "none" renders the
tools and parses nothing. A template's capabilities are probed as minja probes them (`TemplateCaps`): one
that does not write the tools it is given gets them in the system message (with an example call where one
renders), past calls it does not write become JSON content and tool results it does not write user messages
(`{"tool_response": ...}`), a system message it refuses goes into the first user message, and a template that
writes arguments as objects gets them as objects (OpenAI's messages carry them as JSON text).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyggml.core.errors import ArgumentError

if TYPE_CHECKING:
    from pyggml.models.chat import ChatTemplate
    from pyggml.models.grammar import Grammar
    from pyggml.models.tokenizer import Tokenizer

TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
# llama.cpp's generic format's instruction, and minja's for templates that do not write tools
GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                       "`response` reply to the user's request")
TOOLS_INSTRUCTION = "You can call any of the following tools to satisfy the user's requests: "
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
R1_CALLS_BEGIN, R1_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
R1_CALL_BEGIN, R1_SEP, R1_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
R1_ARGS_END = "\n```"
THINK_CLOSE = "</think>\n\n"  # how a reply closes the thinking block its prompt opened
ID_CHARS = string.ascii_letters + string.digits
NL = "\n"
JSON_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}  # the rest stand for themselves


class ToolsError(ArgumentError):
    """A tool definition, a tool choice or a tool call that is not OpenAI's shape; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call of a reply: its id, the function's name and its arguments as JSON text (OpenAI's shape)."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    """`tool_choice`: "none", "auto" or "required", and `name` when it names a function (mode "required")."""

    mode: str = "auto"
    name: str | None = None


def new_call_id() -> str:
    """A call's id: "call_" and 24 random letters and digits (OpenAI's look)."""
    return "call_" + "".join(secrets.choice(ID_CHARS) for _ in range(24))


# --- requests: the tools and the choice, checked ---


def check_tools(tools: Any, field: str = "tools") -> list[dict[str, Any]]:
    """OpenAI's `tools` (a list of {"type": "function", "function": {"name", "description"?, "parameters"?,
    "strict"?}}), checked: names as OpenAI allows them and unique, parameters a JSON schema object."""
    if not isinstance(tools, list):
        raise ToolsError(f"'{field}' must be a list of tools", field)
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{field}[{i}]"
        if not isinstance(tool, Mapping):
            raise ToolsError(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise ToolsError(f"{where}.type must be 'function' (the only kind of tool served), got "
                             f"{tool.get('type')!r}", f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise ToolsError(f"{where}.function must be an object", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise ToolsError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
                             f"{where}.function.name")
        if name in names:
            raise ToolsError(f"{where}.function.name {name!r} names two tools", f"{where}.function.name")
        names.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise ToolsError(f"{where}.function.description must be a string", f"{where}.function.description")
        params = fn.get("parameters")
        if params is not None and not (isinstance(params, Mapping) and params.get("type", "object") == "object"):
            raise ToolsError(f"{where}.function.parameters must be a JSON schema of an object",
                             f"{where}.function.parameters")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolsError(f"{where}.function.{unknown[0]} is not supported", f"{where}.function.{unknown[0]}")
    return [dict(t) for t in tools]


def check_tool_choice(choice: Any, tools: Sequence[Mapping[str, Any]], field: str = "tool_choice") -> ToolChoice:
    """OpenAI's `tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name"}} naming
    one of `tools`."""
    if choice is None:
        return ToolChoice()
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ToolsError(f"'{field}' must be one of {', '.join(TOOL_CHOICES)} or a function, got {choice!r}",
                             field)
        return ToolChoice(choice)
    fn = choice.get("function") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ToolsError(f"'{field}' must be a string or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                         field)
    if name not in tool_names(tools):
        raise ToolsError(f"{field} names the function {name!r}, which is not among the tools", f"{field}.function.name")
    return ToolChoice("required", name)


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def check_message_tool_calls(calls: Any, field: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` in OpenAI's shape: [{"id"?, "type": "function", "function": {"name",
    "arguments": JSON text (or an object)}}]."""
    if not isinstance(calls, list):
        raise ToolsError(f"{field} must be a list", field)
    out = []
    for j, call in enumerate(calls):
        where = f"{field}[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or call.get("type", "function") != "function":
            raise ToolsError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}",
                             where)
        if not isinstance(fn.get("name"), str):
            raise ToolsError(f"{where}.function.name must be a string", f"{where}.function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str | Mapping):
            raise ToolsError(f"{where}.function.arguments must be JSON text", f"{where}.function.arguments")
        if "id" in call and not isinstance(call["id"], str):
            raise ToolsError(f"{where}.id must be a string", f"{where}.id")
        out.append({**({"id": call["id"]} if "id" in call else {}), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


# --- the template's capabilities (minja's chat_template_caps) ---


@dataclasses.dataclass(frozen=True)
class TemplateCaps:
    """What a template writes: a system message, the tools, past calls (`object_arguments`: only when their
    arguments are objects; `parallel_tool_calls`: several in a message), tool results; `call_example`: the text of
    a call it writes after a user turn."""

    system_role: bool = True
    tools: bool = False
    tool_calls: bool = False
    tool_responses: bool = False
    object_arguments: bool = False
    parallel_tool_calls: bool = False
    call_example: str = ""

    def to_json(self) -> dict[str, bool]:
        """llama-server's `chat_template_caps` (its /props)."""
        return {"supports_tools": self.tools, "supports_tool_calls": self.tool_calls,
                "supports_tool_responses": self.tool_responses, "supports_system_role": self.system_role,
                "supports_parallel_tool_calls": self.parallel_tool_calls,
                "supports_object_arguments": self.object_arguments}


def template_caps(template: ChatTemplate) -> TemplateCaps:
    return _caps(template.source, template.bos_token, template.eos_token)


@functools.lru_cache(maxsize=32)
def _caps(source: str, bos: str, eos: str) -> TemplateCaps:
    from pyggml.models.chat import ChatTemplate, ChatTemplateError

    tmpl = ChatTemplate(source, "the chat template", bos, eos)

    def render(messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = False) -> str:
        # a template that loops over its tools unconditionally (Hermes 2 Pro's tool_use) gets an empty list
        for given in (tools, []) if tools is None else (tools,):
            try:
                return tmpl.render(messages, add_generation_prompt, tools=given)
            except (ChatTemplateError, ArgumentError):
                pass
        return ""

    user = {"role": "user", "content": "<User Needle>"}
    system_role = "<System Needle>" in render([{"role": "system", "content": "<System Needle>"}, user])
    tool = {"type": "function", "function": {"name": "some_tool", "description": "Some tool.", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string", "description": "Some argument."}},
        "required": ["arg"]}}}
    tools = "some_tool" in render([user], [tool])

    def calls_message(name: str, args: Any, n: int = 1) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1___", "type": "function", "function": {"name": f"{name}{k + 1 if n > 1 else ''}",
                                                                  "arguments": args}} for k in range(n)]}

    args = {"argument_needle": "print('Hello, World!')"}

    def writes_args(out: str) -> bool:
        return '"argument_needle":' in out or "'argument_needle':" in out

    as_text = writes_args(render([user, calls_message("ipython", json.dumps(args))]))
    as_object = writes_args(render([user, calls_message("ipython", args)]))
    tool_calls = as_text or as_object
    object_arguments = as_object and not as_text
    tool_responses = parallel = False
    if tool_calls:
        call_args: Any = args if object_arguments else json.dumps(args)
        out = render([user, calls_message("test_tool", call_args, 2)])
        parallel = "test_tool1" in out and "test_tool2" in out
        tool_responses = "Some response!" in render([user, calls_message("test_tool", call_args), {
            "role": "tool", "name": "test_tool", "content": "Some response!", "tool_call_id": "call_911_"}])
    example = "" if tools else _call_example(render, object_arguments, eos)
    return TemplateCaps(system_role, tools, tool_calls, tool_responses, object_arguments, parallel, example)


def _call_example(render: Callable[..., str], object_arguments: bool, eos: str) -> str:
    """The text a template writes for a call after a user turn (minja's tool_call_example), "" if none."""
    user = {"role": "user", "content": "Hey"}
    args = {"arg1": "some_value"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1___", "type": "function", "function": {
        "name": "tool_name", "arguments": args if object_arguments else json.dumps(args)}}]}
    prefix = render([user], add_generation_prompt=True)
    full = render([user, call])
    if not prefix or not full:
        return ""
    if eos:
        last = full.rfind(eos)
        if last >= 0 and (last == len(prefix) - len(eos) or (full.endswith("\n") and last == len(full) - len(eos) - 1)):
            full = full[:last]
    common = 0
    for i in range(min(len(prefix), len(full))):
        if prefix[i] != full[i]:
            break
        if prefix[i] != "<":  # a tag may open differently after a generation prompt (DeepSeek R1's <think>)
            common = i + 1
    example = full[common:]
    if eos and eos in example:  # the call ends the turn (what some templates write after it is not the call's)
        example = example[:example.index(eos)]
    return example if "tool_name" in example or "some_value" in example else ""


# --- the formats ---


def _add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` appended to the system message (a new one first if there is none), as minja's add_system."""
    if messages and messages[0].get("role") == "system":
        first = messages[0].get("content") or ""
        return [{"role": "system", "content": f"{first}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _arguments_object(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args  # minja leaves what does not parse as it is
    return args


class ToolFormat:
    """A template family's tool-call syntax (see the module's docstring); `ToolFormat.of` picks it."""

    name = "generic"
    args_key = "arguments"

    def __init__(self, caps: TemplateCaps) -> None:
        self.caps = caps

    @staticmethod
    def of(template: ChatTemplate) -> ToolFormat:
        """llama.cpp's choice by the template's text: `<tool_call>` (and no XML parameters: Qwen3-Coder's
        format is not served) Hermes, the `ipython` role Llama 3.x, `<｜tool▁calls▁begin｜>` DeepSeek R1,
        anything else generic."""
        caps = template_caps(template)
        src = template.source
        if HERMES_OPEN in src and "<parameter=" not in src:
            return HermesFormat(caps)
        if "<|start_header_id|>ipython<|end_header_id|>" in src:
            return Llama3Format(caps)
        if R1_CALLS_BEGIN in src:
            return DeepSeekR1Format(caps)
        return ToolFormat(caps)

    # rendering

    def template_inputs(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                        choice: ToolChoice) -> list[dict[str, Any]]:
        """The messages as the template gets them (minja's polyfills where the template lacks a capability,
        the generic format's instruction); the tools go to the template as they are."""
        caps = self.caps
        out = [dict(m) for m in messages]
        if tools and choice.mode != "none" and self.name == "generic":
            out = _add_system(out, GENERIC_INSTRUCTION)
        if tools and not caps.tools:
            example = f"\n\nExample tool call syntax:\n\n{caps.call_example}\n\n" if caps.call_example else ""
            out = _add_system(out, TOOLS_INSTRUCTION + json.dumps(list(tools), indent=2, ensure_ascii=False) + example)
        polyfilled = bool(tools) and not caps.tools
        rendered: list[dict[str, Any]] = []
        for m in out:
            m = dict(m)
            calls = m.get("tool_calls")
            if calls:
                if caps.object_arguments or not caps.tool_calls:
                    calls = [{**c, "function": {**c["function"], "arguments": _arguments_object(c["function"]
                                                                                                 ["arguments"])}}
                             for c in calls]
                    m["tool_calls"] = calls
                if not caps.tool_calls:
                    obj: dict[str, Any] = {"tool_calls": [
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"],
                         **({"id": c["id"]} if "id" in c else {})} for c in calls]}
                    if m.get("content"):
                        obj["content"] = m["content"]
                    m["content"] = json.dumps(obj, indent=2, ensure_ascii=False)
                    del m["tool_calls"]
                    polyfilled = True
            if m.get("role") == "tool" and not caps.tool_responses:
                response = {"content": m.get("content", "")}
                if "name" in m:
                    response["name"] = m.pop("name")
                if "tool_call_id" in m:
                    response["tool_call_id"] = m["tool_call_id"]
                m["role"] = "user"
                m["content"] = json.dumps({"tool_response": response}, indent=2, ensure_ascii=False)
                polyfilled = True
            rendered.append(m)
        if polyfilled and not caps.system_role:
            rendered = _merge_system(rendered)
        return rendered

    # the grammar

    def call_schema(self, tool: Mapping[str, Any], with_id: bool = False) -> dict[str, Any]:
        """The JSON schema of one call of `tool` in this format's JSON (name first, then the arguments)."""
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
        props: dict[str, Any] = {"name": {"type": "string", "const": fn["name"]}, self.args_key: params}
        required = ["name", self.args_key]
        if with_id:
            props["id"] = {"type": "string", "minLength": 4, "maxLength": 40}  # llama.cpp's minimum; bounded
            required.append("id")
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}

    def calls_schema(self, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                     with_id: bool = False) -> dict[str, Any]:
        chosen = [t for t in tools if choice.name is None or t["function"]["name"] == choice.name]
        schemas = [self.call_schema(t, with_id) for t in chosen]
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}

    free_auto = False  # whether "auto" leaves the reply free (a native syntax: text or calls, parsed)

    def grammar(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                parallel: bool = False, response_schema: Any = None, think_open: bool = False,
                what: str = "tools") -> Grammar | None:
        """The reply's grammar (None: free): calls in the format's syntax, or (choice "auto") the response
        format's JSON (`response_schema`; the generic format's is a text without one). `think_open`: the prompt
        ends inside a thinking block, which the reply closes first (`</think>`)."""
        from pyggml.models.grammar import Grammar, lark_literal

        if choice.mode == "none" or not tools or (choice.mode == "auto" and response_schema is None
                                                  and self.free_auto):
            return None
        prefix = lark_literal(tokenizer, THINK_CLOSE) + " " if think_open else ""
        rules = self.reply_lark(tokenizer, tools, choice, parallel, response_schema)
        return Grammar.from_lark(tokenizer, f"start: {prefix}reply\n{rules}", what)

    def reply_lark(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                   parallel: bool, response_schema: Any) -> str:
        """Lark rules of the reply (rule `reply`): generic, JSON always, a call or a response."""
        from pyggml.models.grammar import lark_json

        call = self.calls_schema(tools, choice, with_id=parallel)
        key = "tool_calls" if parallel else "tool_call"
        value = {"type": "array", "items": call, "minItems": 1} if parallel else call
        calls = {"type": "object", "properties": {key: value}, "required": [key], "additionalProperties": False}
        if choice.mode == "required":
            return f"reply: {lark_json(calls)}\n"
        response = {"type": "object", "properties": {"response": response_schema or {"type": "string"}},
                    "required": ["response"], "additionalProperties": False}
        return f"reply: {lark_json({'anyOf': [calls, response]})}\n"

    def parser(self) -> ReplyParser:
        return GenericParser()


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages folded into the next user message (a user message of their own before anything else),
    as minja does for templates that refuse the system role."""
    out: list[dict[str, Any]] = []
    pending = ""
    for m in messages:
        content = m.get("content")
        if m.get("role") == "system" and isinstance(content, str):
            pending = f"{pending}\n{content}" if pending else content
            continue
        if pending:
            if m.get("role") == "user" and isinstance(content, str):
                m = {**m, "content": pending + (f"\n{content}" if content else "")}
            else:
                out.append({"role": "user", "content": pending})
            pending = ""
        out.append(m)
    if pending:
        out.append({"role": "user", "content": pending})
    return out


class HermesFormat(ToolFormat):
    name = "hermes"
    free_auto = True

    def reply_lark(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                   parallel: bool, response_schema: Any) -> str:
        from pyggml.models.grammar import lark_json, lark_literal

        schema = lark_json(self.calls_schema(tools, choice))
        call = f"{lark_literal(tokenizer, HERMES_OPEN + NL)} {schema} {lark_literal(tokenizer, NL + HERMES_CLOSE)}"
        return _reply_rules(call, parallel, '"\\n"', choice, response_schema)

    def parser(self) -> ReplyParser:
        return HermesParser()


def _reply_rules(call: str, parallel: bool, separator: str, choice: ToolChoice, response_schema: Any,
                 around: tuple[str, str] = ("", "")) -> str:
    """The `reply` rule of a native syntax: `call`s (several with `separator` between when `parallel`, inside
    `around`), or the response format's JSON."""
    from pyggml.models.grammar import lark_json

    calls = f"call ({separator} call)*" if parallel else "call"
    calls = " ".join(x for x in (around[0], calls, around[1]) if x)
    reply = "calls" if choice.mode == "required" else f"calls | {lark_json(response_schema)}"
    return f"reply: {reply}\ncalls: {calls}\ncall: {call}\n"


class Llama3Format(ToolFormat):
    name = "llama3"
    args_key = "parameters"
    free_auto = True

    def reply_lark(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                   parallel: bool, response_schema: Any) -> str:
        from pyggml.models.grammar import lark_json

        # one call a turn: Llama 3's templates refuse more
        return _reply_rules(lark_json(self.calls_schema(tools, choice)), False, "", choice, response_schema)

    def parser(self) -> ReplyParser:
        return Llama3Parser()


class DeepSeekR1Format(ToolFormat):
    """DeepSeek R1 (and its Qwen and Llama distills): `<｜tool▁calls▁begin｜>` then calls
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + "\\n```json\\n" + arguments + "\\n```<｜tool▁call▁end｜>"
    one a line, then `<｜tool▁calls▁end｜>`."""

    name = "deepseek_r1"
    free_auto = True

    def reply_lark(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                   parallel: bool, response_schema: Any) -> str:
        from pyggml.models.grammar import lark_json, lark_literal

        chosen = [t for t in tools if choice.name is None or t["function"]["name"] == choice.name]
        alternatives = []
        for t in chosen:
            fn = t["function"]
            head = f"{R1_CALL_BEGIN}function{R1_SEP}{fn['name']}\n```json\n"
            params = fn.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
            alternatives.append(f"{lark_literal(tokenizer, head)} {lark_json(params)} "
                                f"{lark_literal(tokenizer, R1_ARGS_END + R1_CALL_END)}")
        around = (lark_literal(tokenizer, R1_CALLS_BEGIN), lark_literal(tokenizer, R1_CALLS_END))
        return _reply_rules(" | ".join(f"({a})" for a in alternatives), parallel, '"\\n"', choice,
                            response_schema, around)

    def parser(self) -> ReplyParser:
        return DeepSeekR1Parser()


# --- parsing replies ---

Piece = tuple[str, Any]  # ("content", text) or ("call", ToolCall)


def json_end(text: str, start: int) -> int | None:
    """The index past the JSON object or array that opens at `text[start]`, None while it is not closed (or
    `text[start]` opens none)."""
    if start >= len(text) or text[start] not in "{[":
        return None
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _call(obj: Any, args_key: str, call_id: str | None = None) -> ToolCall | None:
    """A call from a parsed JSON object {"name", args_key} (None if it is not one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj.get("type", "function") != "function":
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters")))
    if not isinstance(args, dict | str):
        return None
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    given = obj.get("id")
    return ToolCall(given if isinstance(given, str) and given else (call_id or new_call_id()), obj["name"], text)


class ReplyParser:
    """A reply's text in pieces as it is generated: `feed` gives what the text so far settles, `flush` the
    rest at the end (text that does not parse as a call is content)."""

    def __init__(self) -> None:
        self.buf = ""
        self.n_calls = 0
        self.ids: set[str] = set()  # the reply's call ids: a model that repeats one gets a fresh id instead
        self.after_call = False  # no text sent since the last call (_text_to_tag's formats)
        self.gap = ""  # the whitespace before a call's open tag, and the tag (_text_to_tag's formats)

    def feed(self, text: str) -> list[Piece]:
        raise NotImplementedError

    def flush(self) -> list[Piece]:
        raise NotImplementedError

    def _content(self, text: str, out: list[Piece]) -> None:
        if text:
            out.append(("content", text))

    def _text_to_tag(self, tag: str, out: list[Piece]) -> bool:
        """In text: send the text before `tag` and take the tag (its whitespace and the tag kept in `gap`, given
        back if no call follows): True; without the tag, send what cannot start it: False (the rest waits)."""
        if self.after_call:
            self.buf = self.buf.lstrip()
        i = self.buf.find(tag)
        if i >= 0:
            before = self.buf[:i].rstrip()
            self._text(before, out)
            self.gap = self.buf[len(before):i] + tag
            self.buf = self.buf[i + len(tag):]
            return True
        send = self.buf[:len(self.buf) - _partial_suffix(self.buf, tag)].rstrip()  # whitespace waits: a call may follow
        self._text(send, out)
        self.buf = self.buf[len(send):]
        return False

    def _emit(self, call: ToolCall, out: list[Piece]) -> None:
        if call.id in self.ids:
            call = dataclasses.replace(call, id=new_call_id())
        self.ids.add(call.id)
        self.n_calls += 1
        out.append(("call", call))


class HermesParser(ReplyParser):
    """Text, then `<tool_call>` JSON `</tool_call>` calls; the whitespace around calls is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.state = "text"  # "text", "call" (after <tool_call>), "close" (after a call's JSON)

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            if self.state == "text":
                if not self._text_to_tag(HERMES_OPEN, out):
                    return out
                self.state = "call"
                continue
            if self.state == "call":
                body = self.buf.lstrip()
                if not body:
                    return out
                end = json_end(body, 0)
                if end is None:
                    if body[0] != "{":  # not a call: the text is content
                        self._text(self.gap + self.buf, out)
                        self.buf, self.state = "", "text"
                    return out
                try:
                    call = _call(json.loads(body[:end]), "arguments")
                except json.JSONDecodeError:
                    call = None
                if call is None:
                    self._text(self.gap + self.buf[:len(self.buf) - len(body) + end], out)
                else:
                    self._emit(call, out)
                    self.after_call = True
                self.buf, self.state = body[end:], "close"
                continue
            rest = self.buf.lstrip()
            if rest.startswith(HERMES_CLOSE):
                self.buf, self.state = rest[len(HERMES_CLOSE):], "text"
                continue
            if rest and not HERMES_CLOSE.startswith(rest):
                self.buf, self.state = rest, "text"  # no closing tag: what follows is text again
                continue
            return out

    def _text(self, text: str, out: list[Piece]) -> None:
        if text:
            self.after_call = False
        self._content(text, out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        held, self.buf = self.buf, ""
        if self.state == "call":
            self._text(self.gap + held, out)  # an unfinished call stays text
        elif self.state == "text" and not self.after_call:
            self._text(held, out)
        self.state = "text"
        return out


class Llama3Parser(ReplyParser):
    """A reply that opens with `{` is a call (`{"name", "parameters"}`, or `"type": "function"` first), else
    text; calls may follow one another (whitespace or `;` between them)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = "start"  # "start" (whitespace so far), "call" (a JSON object opened), "text"

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            if self.state == "text":
                self._content(self.buf, out)
                self.buf = ""
                return out
            body = self.buf.lstrip() if self.state == "start" else self.buf.lstrip().lstrip(";").lstrip()
            if not body:
                return out
            if body[0] != "{":
                if self.state == "start" or self.n_calls == 0:
                    self.state = "text"
                else:
                    self.buf, self.state = body, "text"
                continue
            end = json_end(body, 0)
            if end is None:
                return out
            try:
                call = _call(json.loads(body[:end]), "parameters")
            except json.JSONDecodeError:
                call = None
            if call is None:  # JSON, not a call: the reply is text
                self.state = "text"
                continue
            self._emit(call, out)
            self.buf, self.state = body[end:], "call"

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        held, self.buf = self.buf, ""
        if held.strip() or (self.n_calls == 0 and held):
            self._content(held if self.n_calls == 0 else held.strip(), out)
        return out


class DeepSeekR1Parser(ReplyParser):
    """Text, then `<｜tool▁calls▁begin｜>` and calls (`DeepSeekR1Format`) until `<｜tool▁calls▁end｜>`; what does
    not parse is content."""

    HEAD = re.compile(re.escape(R1_CALL_BEGIN) + r"function" + re.escape(R1_SEP) + r"([^\n<]+)\n```json\n")
    MAX_HEAD = 256  # a head this long without its end is not one

    def __init__(self) -> None:
        super().__init__()
        self.state = "text"  # "text", "calls" (after <｜tool▁calls▁begin｜>)

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            if self.state == "text":
                if not self._text_to_tag(R1_CALLS_BEGIN, out):
                    return out
                self.state = "calls"
                continue
            body = self.buf.lstrip()
            if body.startswith(R1_CALLS_END):
                self.buf, self.state, self.after_call = body[len(R1_CALLS_END):], "text", True
                continue
            if not body or R1_CALLS_END.startswith(body) or R1_CALL_BEGIN.startswith(body):
                return out
            m = self.HEAD.match(body)
            if m is None:
                if body.startswith(R1_CALL_BEGIN) and len(body) < self.MAX_HEAD and "```json\n" not in body:
                    return out  # the head is still coming
                self._fail(out)
                continue
            end = json_end(body, m.end())
            if end is None:
                if body[m.end():m.end() + 1] not in ("", "{", "["):
                    self._fail(out)
                    continue
                return out
            close = body.find(R1_CALL_END, end)
            if close < 0:
                if len(body) - end > self.MAX_HEAD:
                    self._fail(out)
                    continue
                return out
            try:
                args = json.loads(body[m.end():end])
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict) or body[end:close].strip() not in ("```", ""):
                self._fail(out)
                continue
            self._emit(ToolCall(new_call_id(), m.group(1).strip(), json.dumps(args, ensure_ascii=False)), out)
            self.gap = ""
            self.buf = body[close + len(R1_CALL_END):]

    def _fail(self, out: list[Piece]) -> None:
        """What follows the calls' tag does not parse: it is text, the tag too."""
        self._text(self.gap + self.buf, out)
        self.buf, self.gap, self.state = "", "", "text"

    def _text(self, text: str, out: list[Piece]) -> None:
        if text:
            self.after_call = False
        self._content(text, out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        if self.state == "calls" and self.buf.strip():
            self._fail(out)  # an unfinished call stays text
        elif self.state == "text" and not self.after_call:
            self._text(self.buf, out)
        self.buf, self.state = "", "text"
        return out


RESPONSE_PREFIX = '{"response": "'  # the generic grammar's JSON starts so for a text response


def json_string_prefix(text: str) -> tuple[str, int, bool]:
    """The characters a JSON string's body `text` (after its opening quote) settles: (decoded text, characters
    consumed, whether the closing quote came). An escape not yet whole, or a high surrogate's, waits."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text):
            break
        e = text[i + 1]
        if e != "u":
            out.append(JSON_ESCAPES.get(e, e))
            i += 2
            continue
        if i + 6 > len(text):
            break
        code = int(text[i + 2:i + 6], 16)
        if 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves first
            if i + 12 > len(text):
                break
            low = int(text[i + 8:i + 12], 16)
            out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
            i += 12
            continue
        out.append(chr(code))
        i += 6
    return "".join(out), i, False


class GenericParser(ReplyParser):
    """The generic format's JSON: `{"response": ...}` is content (a text response streamed as it comes),
    `{"tool_call": ...}` or `{"tool_calls": [...]}` calls; a reply that is not such JSON is content."""

    def __init__(self) -> None:
        super().__init__()
        self.streaming = False  # inside a text response's string
        self.done = False

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        if self.done:
            return out
        if not self.streaming:
            body = self.buf.lstrip()
            if body.startswith(RESPONSE_PREFIX):
                self.buf, self.streaming = body[len(RESPONSE_PREFIX):], True
            elif RESPONSE_PREFIX.startswith(body):
                return out
        if self.streaming:
            decoded, used, closed = json_string_prefix(self.buf)
            self._content(decoded, out)
            self.buf = self.buf[used:]
            if closed:
                self.done, self.buf = True, ""
            return out
        body = self.buf.lstrip()
        end = json_end(body, 0)
        if end is not None:
            self._settle(body[:end], out)
            self.done, self.buf = True, ""
        return out

    def _settle(self, text: str, out: list[Piece]) -> None:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "response" in obj:
            r = obj["response"]
            self._content(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False), out)
            return
        calls = [obj.get("tool_call")] if isinstance(obj, dict) and "tool_call" in obj else (
            obj.get("tool_calls") if isinstance(obj, dict) else None)
        parsed = [_call(c, "arguments") for c in calls] if isinstance(calls, list) and calls else [None]
        if any(c is None for c in parsed):
            self._content(text, out)  # not the format's JSON: the text as it is
            return
        for c in parsed:
            assert c is not None
            self._emit(c, out)

    def flush(self) -> list[Piece]:
        out: list[Piece] = []
        held, self.buf = self.buf, ""
        if not self.done and not self.streaming:
            self._content(held, out)  # unfinished JSON (max_tokens): the text as it is
        return out
