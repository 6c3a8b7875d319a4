"""The OpenAI API's requests and responses: checking a request's fields, building the JSON objects.

Sampling: OpenAI's fields with OpenAI's defaults (temperature 1, top_p 1), and llama-server's extra ones
with llama-server's (top_k 40, min_p 0.05, repeat_penalty 1, ignore_eos, cache_prompt). Structured output:
`response_format` (json_object, json_schema), llama-server's `grammar` (GBNF) and `json_schema`, one of them a
request. `logprobs`/`top_logprobs` (chat), `logprobs` (completions), llama-server's `n_probs`, and `logit_bias`
(OpenAI's {"token id": bias} or llama-server's [[token id or text, bias or false], ...]). A chat's `tools`,
`tool_choice` and `parallel_tool_calls` (pyggml.models.tool_calls), its messages' `tool_calls` and `role: "tool"`
results; a reply's calls as `message.tool_calls` (a streamed call's delta whole). A field pyggml does not
implement is refused naming it (400), as are `n` > 1, `best_of` > 1, `suffix` and `echo`; OpenAI's hints that
do not change an answer (`user`, `metadata`, `store`, ... : HINTS) are accepted and ignored. A body is JSON
(`application/json`, UTF-8) or refused before anything reads it (415); JSON Python parses but no model should
see (NaN, nesting past `MAX_DEPTH`, a lone surrogate, integers past Python's digit limit) is a 400 naming where.
Errors are OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyggml.models.tool_calls import (
    ToolCall,
    ToolChoice,
    ToolsError,
    check_message_tool_calls,
    check_tool_choice,
    check_tools,
)
from pyggml.serve.engine import ServeError, TokenProb

MAX_STOP = 4  # as OpenAI
MAX_DEPTH = 64  # JSON nesting: OpenAI's bodies need a handful of levels, tool schemas a few dozen
MAX_INT_DIGITS = 100  # a JSON integer's digits (seeds and token ids need 20)
JSON_MEDIA_TYPE = "application/json"
MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs
MAX_LOGIT_BIAS = 100.0  # as OpenAI: a bias in [-100, 100]

# the fields each endpoint implements; OpenAI's hints that change no answer are accepted and ignored
COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "stop", "stream",
    "stream_options", "n", "logit_bias", "response_format",
    # llama-server's
    "top_k", "min_p", "repeat_penalty", "ignore_eos", "grammar", "json_schema", "n_probs", "cache_prompt",
})
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                               "chat_template_kwargs", "reasoning_format", "tools", "tool_choice",
                               "parallel_tool_calls"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "best_of", "suffix", "echo"}
HINTS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                   "safety_identifier"})
STREAM_OPTIONS = frozenset({"include_usage"})
STREAM_HINTS = frozenset({"include_obfuscation"})
JSON_SCHEMA_KEYS = frozenset({"name", "description", "schema", "strict"})


class RequestError(ServeError, ValueError):
    """A request the API refuses: its status, OpenAI's error type, the field at fault and a code."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def check_content_type(value: str | None) -> None:
    """Refuse a body that is not `application/json` (a charset parameter may say utf-8): the types a web
    page may POST without a CORS preflight (text/plain, forms) never reach the model."""
    media, _, params = (value or "").partition(";")
    charset = "utf-8"
    for param in params.split(";"):
        name, _, v = param.partition("=")
        if name.strip().lower() == "charset":
            charset = v.strip().strip('"').lower()
    if media.strip().lower() != JSON_MEDIA_TYPE or charset not in ("utf-8", "utf8"):
        raise RequestError(f"the request body must be {JSON_MEDIA_TYPE} (UTF-8), got Content-Type {value!r}",
                           status=415, code="unsupported_media_type")


def decode_body(data: bytes) -> Any:
    """The JSON value of a request body, checked (`check_json`); RequestError (400) for anything else."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def integer(digits: str) -> int:
        if len(digits) > MAX_INT_DIGITS + 1:  # the sign
            raise ValueError(f"an integer of {len(digits)} characters (at most {MAX_INT_DIGITS} digits)")
        return int(digits)

    try:
        body = json.loads(data, parse_constant=constant, parse_int=integer)
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, NaN, long integers
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    check_json(body)
    return body


def check_json(body: Any) -> None:
    """Refuse nesting past MAX_DEPTH and strings (values or keys) holding a lone surrogate, which JSON's
    \\uD800 escapes allow and UTF-8 does not: RequestError naming the field ("messages[0].content")."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(body, 0, ())]
    while stack:
        value, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels (in {_field(path[:1])!r})",
                               param=_field(path[:1]) or None, code="invalid_json")
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for k, v in value.items():
                _check_text(k, path, key=True)
                stack.append((v, depth + 1, (*path, k)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1, (*path, i)) for i, v in enumerate(value))


def _check_text(text: str, path: tuple[str | int, ...], key: bool = False) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        field = _field(path) or "the request body"
        where = f"{'a key of ' if key else ''}{field}"
        raise RequestError(f"{where} holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}): not "
                           f"UTF-8 text", param=_field(path) or None, code="invalid_text") from None


def _field(path: tuple[str | int, ...]) -> str:
    """A JSON path as OpenAI's `param` writes one: messages[0].content."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


@dataclass
class Params:
    """What a request asks for, checked: the prompt (chat messages or text/ids) and how to sample."""

    kind: str  # "chat" or "completion"
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | list[int] = ""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    model: str = ""
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs (over the server's)
    reasoning_format: str | None = None  # None: the server's --reasoning-format
    # the constraint: ("gbnf", text), ("json_schema", schema) or ("json_object", None), and the field it came from
    grammar: tuple[str, Any] | None = None
    grammar_param: str = ""
    logit_bias: list[tuple[int | str, float]] = field(default_factory=list)  # a text: each of its tokens
    n_probs: int | None = None  # logprobs: the top n alternatives of each token (0: the token's own only)
    cache_prompt: bool = True
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's function tools (pyggml.models.tool_calls)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = False  # llama-server's default: one call a reply


def _number(body: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise RequestError(f"'{name}' must be a number in [{lo}, {hi}], got {v!r}", param=name)
    return float(v)


def _int(body: dict[str, Any], name: str, lo: int, default: int | None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise RequestError(f"'{name}' must be an integer >= {lo}, got {v!r}", param=name)
    return v


def _bool(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be a boolean, got {v!r}", param=name)
    return v


def _refuse_unknown(body: dict[str, Any], kind: str) -> None:
    """A 400 naming the first field (with a value) that this endpoint does not implement."""
    known = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    for name, value in body.items():
        if value is not None and name not in known and name not in HINTS:
            raise RequestError(f"'{name}' is not supported by pyggml serve's "
                               f"{'chat completions' if kind == 'chat' else 'completions'}", param=name,
                               code="unsupported_parameter")
    so = body.get("stream_options")
    if isinstance(so, dict):
        for name, value in so.items():
            if value is not None and name not in STREAM_OPTIONS and name not in STREAM_HINTS:
                raise RequestError(f"'stream_options.{name}' is not supported", param=f"stream_options.{name}",
                                   code="unsupported_parameter")


def _grammar(body: dict[str, Any]) -> tuple[tuple[str, Any] | None, str]:
    """The one constraint of `grammar`, `json_schema` and `response_format`, and its field."""
    found: list[tuple[tuple[str, Any], str]] = []
    g = body.get("grammar")
    if g is not None:
        if not isinstance(g, str):
            raise RequestError("'grammar' must be a string (GBNF)", param="grammar")
        if g.strip():  # llama-server: an empty grammar is none
            found.append((("gbnf", g), "grammar"))
    js = body.get("json_schema")
    if js is not None:
        if not isinstance(js, dict | bool):
            raise RequestError("'json_schema' must be a JSON schema (an object)", param="json_schema")
        found.append((("json_schema", js), "json_schema"))
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise RequestError("'response_format' must be an object", param="response_format")
        rtype = rf.get("type")
        extra = sorted(set(rf) - {"type", "json_schema", "schema"})
        if extra:
            raise RequestError(f"'response_format.{extra[0]}' is not supported", param=f"response_format.{extra[0]}")
        if rtype == "json_object":  # llama-server: a "schema" beside it constrains further
            schema = rf.get("schema")
            if schema is not None and not isinstance(schema, dict):
                raise RequestError("'response_format.schema' must be an object", param="response_format.schema")
            found.append((("json_object", None) if schema is None else ("json_schema", schema), "response_format"))
        elif rtype == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict):
                raise RequestError("'response_format.json_schema' must be an object with the 'schema'",
                                   param="response_format.json_schema")
            extra = sorted(set(spec) - JSON_SCHEMA_KEYS)
            if extra:
                raise RequestError(f"'response_format.json_schema.{extra[0]}' is not supported",
                                   param=f"response_format.json_schema.{extra[0]}")
            schema = spec.get("schema", {})  # none: any JSON value
            if not isinstance(schema, dict | bool):
                raise RequestError("'response_format.json_schema.schema' must be a JSON schema (an object)",
                                   param="response_format.json_schema.schema")
            found.append((("json_schema", schema), "response_format"))
        elif rtype != "text":
            raise RequestError(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {rtype!r}",
                               param="response_format.type")
    if len(found) > 1:
        raise RequestError(f"'{found[0][1]}' and '{found[1][1]}' both constrain the answer: give one",
                           param=found[1][1])
    return (found[0][0], found[0][1]) if found else (None, "")


def _tools(body: dict[str, Any], p: Params) -> None:
    """`tools`, `tool_choice` and `parallel_tool_calls`; a GBNF grammar beside tools that may be called is refused
    (llama-server's rule: the tools' syntax is the grammar), a JSON response format is the reply's when no call."""
    try:
        tools = body.get("tools")
        p.tools = check_tools(tools) if tools is not None else []
        choice = body.get("tool_choice")
        if choice is not None and not p.tools:
            raise RequestError("'tool_choice' needs 'tools'", param="tool_choice")
        p.tool_choice = check_tool_choice(choice, p.tools)
    except ToolsError as e:
        raise RequestError(str(e), param=e.field) from None
    p.parallel_tool_calls = _bool(body, "parallel_tool_calls")
    if p.tools and p.tool_choice.mode != "none" and p.grammar is not None:
        if p.grammar[0] == "gbnf":
            raise RequestError("'grammar' cannot be combined with 'tools' (the tools' syntax is the grammar)",
                               param="grammar")
        if p.tool_choice.mode == "required":
            raise RequestError(f"'{p.grammar_param}' cannot be combined with a required tool call",
                               param=p.grammar_param)


def _logit_bias(body: dict[str, Any]) -> list[tuple[int | str, float]]:
    """OpenAI's {"token id": bias} or llama-server's [[token id or text, bias or false], ...] (false bans)."""
    lb = body.get("logit_bias")
    if lb is None:
        return []
    if isinstance(lb, dict):
        pairs = list(lb.items())
    elif isinstance(lb, list) and all(isinstance(x, list) and len(x) == 2 for x in lb):
        pairs = [(k, v) for k, v in lb]
    else:
        raise RequestError("'logit_bias' must be an object {token id: bias} or a list of [token, bias] pairs",
                           param="logit_bias")
    out: list[tuple[int | str, float]] = []
    for key, value in pairs:
        if isinstance(key, int) and not isinstance(key, bool):
            token: int | str = key
        elif isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        elif isinstance(key, str) and key:
            token = key  # a text: the bias goes to each of its tokens (llama-server)
        else:
            raise RequestError(f"'logit_bias' key {key!r} is not a token id or a text", param="logit_bias")
        if value is False:
            bias = -math.inf
        elif (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
              or abs(value) > MAX_LOGIT_BIAS):
            raise RequestError(f"'logit_bias' of {key!r} must be a number in [-{MAX_LOGIT_BIAS:g}, "
                               f"{MAX_LOGIT_BIAS:g}] or false, got {value!r}", param="logit_bias")
        else:
            bias = float(value)
        out.append((token, bias))
    return out


def _n_probs(body: dict[str, Any], kind: str) -> int | None:
    """How many alternatives each token's logprobs entry lists (None: no logprobs)."""
    lp = body.get("logprobs")
    n: int | None = None
    if kind == "chat":
        if lp is not None and not isinstance(lp, bool):
            raise RequestError(f"'logprobs' must be a boolean, got {lp!r}", param="logprobs")
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
                raise RequestError(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}",
                                   param="top_logprobs")
            if not lp:
                raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if lp:
            n = top or 0
    elif lp is not None:
        if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS:
            raise RequestError(f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {lp!r}",
                               param="logprobs")
        n = lp
    n_probs = _int(body, "n_probs", 0, None)
    if n_probs:  # llama-server's: the same entries, n_probs alternatives each
        if n_probs > MAX_TOP_LOGPROBS:
            raise RequestError(f"'n_probs' must be at most {MAX_TOP_LOGPROBS}, got {n_probs}", param="n_probs")
        n = max(n or 0, n_probs)
    return n


def _refuse_meaning_changers(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"'n' must be 1: pyggml serve gives one choice per request, got {n!r}", param="n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise RequestError(f"'best_of' is not supported (got {best_of!r})", param="best_of")
    if body.get("suffix"):
        raise RequestError("'suffix' (insertion) is not supported", param="suffix")
    if body.get("echo"):
        raise RequestError("'echo' is not supported", param="echo")


def _message_text(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise RequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise RequestError(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
    content = m.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):  # content parts: the text ones, joined (images and audio are refused)
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise RequestError(f"messages[{i}].content[{j}]: only text parts are supported",
                                   param=f"messages[{i}].content")
            parts.append(p["text"])
        text = "".join(parts)
    else:
        raise RequestError(f"messages[{i}].content must be a string or a list of parts",
                           param=f"messages[{i}].content")
    out = {"role": role, "content": text}
    for key in ("name", "tool_call_id", "reasoning_content"):  # templates may read them
        if key in m and m[key] is not None:
            if not isinstance(m[key], str):
                raise RequestError(f"messages[{i}].{key} must be a string", param=f"messages[{i}].{key}")
            out[key] = m[key]
    if m.get("tool_calls") is not None:
        try:
            out["tool_calls"] = check_message_tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        except ToolsError as e:
            raise RequestError(str(e), param=e.field) from None
    return out


def parse_request(body: Any, kind: str) -> Params:
    """Check a decoded JSON body of /v1/chat/completions (`kind` "chat") or /v1/completions ("completion")."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _refuse_unknown(body, kind)
    _refuse_meaning_changers(body)
    p = Params(kind=kind)
    model = body.get("model", "")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    p.model = model or ""
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list", param="messages")
        p.messages = [_message_text(m, i) for i, m in enumerate(msgs)]
        p.template_kwargs, p.reasoning_format = chat_options(body)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # one prompt in a list
        if isinstance(prompt, str):
            p.prompt = prompt
        elif (isinstance(prompt, list) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            p.prompt = list(prompt)
        else:
            raise RequestError("'prompt' must be a string or a list of token ids (one prompt per request)",
                               param="prompt")
    mt = _int(body, "max_completion_tokens", 1, None)
    p.max_tokens = mt if mt is not None else _int(body, "max_tokens", 1, None)
    p.temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    p.top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if p.top_p == 0.0:
        p.top_p = 1e-9  # OpenAI's top_p 0: the most likely token only
    p.presence_penalty = _number(body, "presence_penalty", -2.0, 2.0, 0.0)
    p.frequency_penalty = _number(body, "frequency_penalty", -2.0, 2.0, 0.0)
    # llama-server's extra sampling fields, with its defaults: top_k 40 also spares sorting the whole vocabulary
    # for each token (a sizeable share of a decode step; top_k 0 asks for it)
    p.top_k = int(_int(body, "top_k", 0, 40) or 0)
    p.min_p = _number(body, "min_p", 0.0, 1.0, 0.05)
    p.repeat_penalty = _number(body, "repeat_penalty", 1e-6, 10.0, 1.0)
    p.ignore_eos = _bool(body, "ignore_eos")
    p.seed = _int(body, "seed", 0, None)
    if p.seed is not None:
        p.seed %= 2**63  # numpy's generator takes any non-negative integer; keep it bounded
    stop = body.get("stop")
    if stop is None:
        p.stop = []
    elif isinstance(stop, str):
        p.stop = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop) and len(stop) <= MAX_STOP:
        p.stop = [x for x in stop if x]
    else:
        raise RequestError(f"'stop' must be a string or a list of at most {MAX_STOP} strings", param="stop")
    p.stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise RequestError("'stream_options' must be an object", param="stream_options")
        p.include_usage = bool(so.get("include_usage", False))
    p.grammar, p.grammar_param = _grammar(body)
    if kind == "chat":
        _tools(body, p)
    p.logit_bias = _logit_bias(body)
    p.n_probs = _n_probs(body, kind)
    cache = body.get("cache_prompt")
    p.cache_prompt = True if cache is None else _bool(body, "cache_prompt")
    return p


def chat_options(body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """llama-server's `chat_template_kwargs` (an object: more template variables) and `reasoning_format`."""
    from pyggml.models.chat import RESERVED_VARIABLES
    from pyggml.models.reasoning import REASONING_FORMATS

    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    reserved = sorted(RESERVED_VARIABLES.intersection(kwargs))
    if reserved:
        raise RequestError(f"chat_template_kwargs.{reserved[0]} is not a variable a request may set",
                           param=f"chat_template_kwargs.{reserved[0]}")
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise RequestError(f"chat_template_kwargs.enable_thinking must be a boolean, got {kwargs['enable_thinking']!r}",
                           param="chat_template_kwargs.enable_thinking")
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise RequestError(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}, got {fmt!r}",
                           param="reasoning_format")
    return kwargs, fmt


# --- responses ---

def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def chat_logprobs(probs: Sequence[TokenProb], piece: Callable[[int], bytes]) -> dict[str, Any]:
    """OpenAI's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None};
    `piece` gives a token's bytes."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        b = piece(token)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}

    return {"content": [{**entry(p.token, p.logprob), "top_logprobs": [entry(t, lp) for t, lp in p.top]}
                        for p in probs], "refusal": None}


def completion_logprobs(probs: Sequence[TokenProb], piece: Callable[[int], bytes], offset: int) -> dict[str, Any]:
    """OpenAI's completions `logprobs`: tokens, token_logprobs, top_logprobs ({token: logprob}) and text_offset
    (characters from the start of the prompt's text, `offset` where the answer starts)."""
    tokens, offsets = [], []
    for p in probs:
        offsets.append(offset)
        tokens.append(piece(p.token).decode("utf-8", errors="replace"))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [p.logprob for p in probs],
            "top_logprobs": [{piece(t).decode("utf-8", errors="replace"): lp for t, lp in p.top} for p in probs],
            "text_offset": offsets}


def response(kind: str, rid: str, model: str, text: str, finish_reason: str | None,
             use: dict[str, Any], reasoning: str = "", logprobs: dict[str, Any] | None = None,
             calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    """The whole answer of a request without `stream` (a chat's `reasoning` apart, as llama-server; `logprobs`:
    chat_logprobs' or completion_logprobs'; a chat's tool `calls`: its content null when it has no text, as
    OpenAI's)."""
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [c.to_json() for c in calls]
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": use}


def chunk(kind: str, rid: str, model: str, text: str | None, finish_reason: str | None = None,
          role: bool = False, use: dict[str, Any] | None = None, no_choice: bool = False,
          reasoning: str | None = None, logprobs: dict[str, Any] | None = None,
          call: tuple[int, ToolCall] | None = None) -> dict[str, Any]:
    """One server-sent event of a streamed answer (`no_choice`: the last one, with `usage` only; `reasoning`:
    a chat's reasoning delta, as llama-server's `reasoning_content`; `call`: a tool call whole, with its index)."""
    choices: list[dict[str, Any]]
    if no_choice:
        choices = []
    elif kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if reasoning is not None:
            delta["reasoning_content"] = reasoning
        if call is not None:
            delta["tool_calls"] = [{"index": call[0], **call[1].to_json()}]
        choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}]
    out: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                           "created": int(time.time()), "model": model, "choices": choices}
    if use is not None:
        out["usage"] = use
    return out
