"""Chat: a GGUF file's `tokenizer.chat_template` rendered as transformers 5.x renders it (chat_template_utils, in
jinja2's sandbox), tokenized as llama.cpp's chat tools do, replies ending at an end-of-generation token.

Unlike llama.cpp, the messages' own strings stay text: "<|im_end|><|im_start|>system" in a message is no new turn.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import secrets
import sys
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from pyggml.core.errors import ArgumentError, GGMLError

if TYPE_CHECKING:
    from pyggml.models.model import Model
    from pyggml.models.tokenizer import Tokenizer

# llama.cpp's CHATML_TEMPLATE_SRC (common/chat.cpp): its template when the file names none
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
TEMPLATE_KEY = "tokenizer.chat_template"
DEFAULT_MAX_TOKENS = 256
# names a caller's extra template variables may not take: the renderer's own and its methods' parameters
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents", "name", "source",
                                "tokenizer", "special_in_content", "self"})


class ChatTemplateError(GGMLError, ValueError):
    """A chat template does not compile or fails to render (names the template, the problem and its line)."""


class SpecialTextError(ArgumentError):
    """A special token's text where it cannot stay text (a role, a key, a string the template changes)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class ConversationTooLongError(ArgumentError):
    """A conversation's prompt leaves no room for a reply in the model's context (names both sizes)."""


# --- transformers' _cached_compile_jinja_template ---


def _raise_exception(message: str) -> None:
    import jinja2.exceptions

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # jinja's tojson escapes for HTML; a filter's generator (`tools | map(...)`) is the list it yields
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=lambda v: list(v) if isinstance(v, Iterator) else _unserializable(v))


def _unserializable(v: Any) -> Any:
    raise TypeError(f"Object of type {type(v).__name__} is not JSON serializable")


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template: builds dicts, no attribute access to the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("chat templates need jinja2 (pip install 'jinja2>=3.1.6')") from None

    class GenerationTag(jinja2.ext.Extension):
        """transformers' `{% generation %}` tag: the body renders unchanged."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Callable[[], str]) -> str:
            return caller()

    class TemplateNamespace(jinja2.utils.Namespace):
        """`namespace(...)` that refuses underscore names (they lead to CPython's internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja Namespace's trick: `self` may be a key
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    return _environment().from_string(source)


def compile_template(source: str, name: str = "chat template") -> Any:
    """The jinja2 Template of `source`, compiled once; ChatTemplateError naming `name` and the line."""
    if not isinstance(source, str):
        raise ArgumentError(f"{name}: a chat template is a string, got {type(source).__name__}")
    try:
        return _compile(source)
    except ChatTemplateError:
        raise
    except Exception as e:
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ChatTemplateError(f"{name} does not compile{where}: {_message(e)}") from None


def _message(e: BaseException) -> str:
    text = " ".join(str(getattr(e, "message", None) or e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _template_line(tb: Any) -> int | None:
    """The template line an exception was raised at (jinja's "<template>" traceback frames)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# --- transformers' _normalize_chat_messages, _plain_template_data, _alias_reasoning_fields


def _plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types (anything else becomes "<TypeName>")."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (the OpenAI SDK's messages)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages as templates see them: plain data, None values dropped, the reasoning under its usual names."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise ArgumentError(f"messages must be a list of dicts ({{'role': ..., 'content': ...}}), "
                            f"got {type(messages).__name__}")
    if not messages:
        raise ArgumentError("messages is empty: a chat needs at least one message")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if dataclasses.is_dataclass(m) and not isinstance(m, type):
            m = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
        elif not isinstance(m, Mapping) and callable(getattr(m, "model_dump", None)):
            m = m.model_dump()
        if not isinstance(m, Mapping):
            raise ArgumentError(f"messages[{i}] is a {type(m).__name__}, expected a dict with 'role' and 'content'")
        msg = _plain({k: v for k, v in m.items() if v is not None})
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:  # gpt-oss's templates read "thinking", the others "reasoning_content"
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def render_template(source: str, messages: Sequence[Any], *, add_generation_prompt: bool = False,
                    tools: Sequence[Any] | None = None, documents: Sequence[Any] | None = None,
                    name: str = "chat template", **kwargs: Any) -> str:
    """transformers' `render_jinja_template`; any template error raises ChatTemplateError naming the line."""
    template = compile_template(source, name)
    chat = template_messages(messages)
    if tools is not None:
        for i, t in enumerate(tools):
            if not isinstance(t, Mapping):  # transformers also takes functions; here the JSON schemas only
                raise ArgumentError(f"tools[{i}] is a {type(t).__name__}, expected a JSON schema (a dict)")
    if documents is not None:
        for i, d in enumerate(documents):
            if not isinstance(d, Mapping):
                raise ArgumentError(f"documents[{i}] is a {type(d).__name__}, expected a dict")
    try:
        return str(template.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                                   add_generation_prompt=add_generation_prompt, **_plain(kwargs)))
    except Exception as e:
        line = _template_line(sys.exc_info()[2])
        where = f" (line {line})" if line else ""
        raise ChatTemplateError(f"{name} failed to render{where}: {_message(e)}") from None


class ChatTemplate:
    """A chat template with its model's BOS/EOS texts and whether the vocab adds them itself."""

    def __init__(self, source: str, name: str = "chat template", bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, add_eos: bool = False, is_fallback: bool = False) -> None:
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.is_fallback = is_fallback
        compile_template(source, name)  # a broken template fails here, not at the first message

    @classmethod
    def from_model(cls, model: Model, source: str | None = None, name: str | None = None) -> ChatTemplate:
        """The file's template (else ChatML, as llama.cpp), or `source` as llama.cpp's --chat-template-file."""
        return cls.from_gguf(model.file, model.tokenizer, source, name)

    @classmethod
    def from_gguf(cls, gf: Any, tokenizer: Tokenizer, source: str | None = None,
                  name: str | None = None) -> ChatTemplate:
        from pyggml.models.metadata import read_str

        fname = getattr(gf, "name", "model")
        fallback = False
        if source is not None:
            name = name or "the given chat template"
        else:
            key = TEMPLATE_KEY
            for key in (TEMPLATE_KEY, TEMPLATE_KEY + ".tool_use"):  # llama.cpp's order
                source = read_str(gf, key, None)
                if source:
                    break
            fallback = not source
            if fallback:
                source, name = CHATML_TEMPLATE, f"chatml (llama.cpp's default: '{fname}' has no {TEMPLATE_KEY})"
            else:
                name = f"'{fname}' {key}"

        def text(tid: int | None) -> str:
            return tokenizer.token_to_piece(tid, special=True) if tid is not None else ""

        assert source is not None and name is not None
        return cls(source, name, text(tokenizer.bos_id), text(tokenizer.eos_id), tokenizer.add_bos_token,
                   tokenizer.add_eos_token, is_fallback=fallback)

    def render(self, messages: Sequence[Any], add_generation_prompt: bool = False, **kwargs: Any) -> str:
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        return render_template(self.source, messages, add_generation_prompt=add_generation_prompt, name=self.name,
                               **variables)

    def prompt(self, messages: Sequence[Any], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The rendering without the BOS/EOS texts the vocab adds itself (common_chat_template_direct_apply)."""
        text = self.render(messages, add_generation_prompt, **kwargs)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def prompt_parts(self, messages: Sequence[Any], tokenizer: Tokenizer, add_generation_prompt: bool = True,
                     **kwargs: Any) -> list[Part]:
        """`prompt` cut into (text, parse_special) parts, the messages' strings unparsed, found by rendering again
        with placeholders; where that fails, parsed whole unless a string holds special text (SpecialTextError)."""
        chat = template_messages(messages)
        strings, marked, placeholder = _mark_strings(chat, tokenizer, self.source)
        text = self.render(chat, add_generation_prompt, **kwargs)
        parts = None
        if strings:
            try:
                parts = _split_strings(text, self.render(marked, add_generation_prompt, **kwargs), strings,
                                       placeholder)
            except ChatTemplateError:
                parts = None  # the template looks into the strings
        elif text:
            parts = [(text, True)]
        if parts is None:
            for field, value in strings.values():
                found = tokenizer.special_text_in(value)
                if found is not None:
                    raise SpecialTextError(f"{field} holds the special token text {found!r}, and {self.name} changes "
                                           f"that string before writing it: it cannot be kept as text", field)
            parts = [(text, True)]
        if parts and parts[0][1] and self.add_bos and self.bos_token and parts[0][0].startswith(self.bos_token):
            parts[0] = (parts[0][0][len(self.bos_token):], True)
        if parts and parts[-1][1] and self.add_eos and self.eos_token and parts[-1][0].endswith(self.eos_token):
            parts[-1] = (parts[-1][0][:-len(self.eos_token)], True)
        return [p for p in parts if p[0]]

    def tokens(self, messages: Sequence[Any], tokenizer: Tokenizer, add_generation_prompt: bool = True,
               special_in_content: bool = False, **kwargs: Any) -> list[int]:
        """The prompt's ids; `special_in_content` parses special tokens in the messages too, as llama.cpp."""
        if special_in_content:
            return tokenizer.encode(self.prompt(messages, add_generation_prompt, **kwargs), True, True)
        return tokenizer.encode_parts(self.prompt_parts(messages, tokenizer, add_generation_prompt, **kwargs))

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name}, {len(self.source)} characters)"


Part = tuple[str, bool]  # a piece of prompt text and whether its special tokens are parsed
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"


def check_special_text(value: Any, field: str, tokenizer: Tokenizer) -> None:
    """SpecialTextError naming the first string or key of `value` holding a special token's text."""
    if isinstance(value, str):
        found = tokenizer.special_text_in(value)
        if found is not None:
            raise SpecialTextError(f"{field} holds the special token text {found!r}", field)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            check_special_text(k, f"{field} key {k!r}", tokenizer)
            check_special_text(v, f"{field}.{k}", tokenizer)
    elif isinstance(value, list | tuple):
        for j, v in enumerate(value):
            check_special_text(v, f"{field}[{j}]", tokenizer)


def _mark_strings(chat: list[dict[str, Any]], tokenizer: Tokenizer,
                  source: str) -> tuple[dict[str, tuple[str, str]], list[dict[str, Any]], re.Pattern[str]]:
    """The messages' strings replaced by placeholders holding a random nonce (no client can write one)."""
    nonce = secrets.token_hex(8)
    while nonce in source:
        nonce = secrets.token_hex(8)
    strings: dict[str, tuple[str, str]] = {}

    def check(value: str, field: str) -> None:
        check_special_text(value, field, tokenizer)

    def mark(value: Any, field: str) -> Any:
        if isinstance(value, str):
            if not value:
                return value  # templates test for empty strings; nothing to protect
            key = f"{_MARK_OPEN}{nonce}{len(strings):x}{_MARK_CLOSE}"
            strings[key] = (field, value)
            return key
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if isinstance(k, str):
                    check(k, f"{field} key {k!r}")
                out[k] = mark(v, f"{field}.{k}")
            return out
        if isinstance(value, list | tuple):
            return type(value)(mark(v, f"{field}[{j}]") for j, v in enumerate(value))
        return value

    marked: list[dict[str, Any]] = []
    for i, m in enumerate(chat):
        role = m.get("role")
        if isinstance(role, str):
            check(role, f"messages[{i}].role")
        marked.append({k: v if k == "role" else mark(v, f"messages[{i}].{k}") for k, v in m.items()})
        for k in m:
            if isinstance(k, str) and k != "role":
                check(k, f"messages[{i}] key {k!r}")
    return strings, marked, re.compile(f"({_MARK_OPEN}{nonce}[0-9a-f]+{_MARK_CLOSE})")


def _split_strings(text: str, marked_text: str, strings: Mapping[str, tuple[str, str]],
                   placeholder: re.Pattern[str]) -> list[Part] | None:
    """`text` cut into template text and strings by `marked_text`'s placeholders; None where they do not match."""
    pieces = placeholder.split(marked_text)
    parts: list[Part] = []
    pos = 0
    for j in range(0, len(pieces), 2):
        literal = pieces[j]
        if not text.startswith(literal, pos):
            return None
        parts.append((literal, True))
        pos += len(literal)
        if j + 1 == len(pieces):
            break
        entry = strings.get(pieces[j + 1])
        if entry is None:
            return None
        value = entry[1]
        after = pieces[j + 2]
        for candidate in dict.fromkeys((value, value.strip(), value.rstrip(), value.lstrip())):
            if text.startswith(candidate, pos) and text.startswith(after, pos + len(candidate)):
                parts.append((candidate, False))
                pos += len(candidate)
                break
        else:
            return None
    return parts if pos == len(text) else None


class ChatSession:
    """A conversation keeping its tokens in the model's KV cache, so a turn evaluates only what is new; it owns
    the cache while used (`forget` after evaluating anything else)."""

    def __init__(self, model: Model, system: str | None = None, template: ChatTemplate | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.template = template or ChatTemplate.from_model(model)
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
        self.cached: list[int] = []
        self.stop_reason: str | None = None  # "eog", "max_tokens" or "context"
        self.n_prompt = 0
        self.n_reused = 0
        self.tokens: list[int] = []
        self.special_in_content = False

    def forget(self) -> None:
        self.cached = []

    def prompt_tokens(self, messages: Sequence[Any] | None = None) -> list[int]:
        """The prompt ids for `messages` (default: the session's), the assistant's turn opened."""
        return self.template.tokens(self.messages if messages is None else messages, self.model.tokenizer,
                                    special_in_content=self.special_in_content, **self.template_kwargs)

    def send(self, text: str, max_tokens: int = DEFAULT_MAX_TOKENS,
             sampler: Any = None) -> Generator[str, None, None]:
        """Add a user message and stream the reply, which joins the messages when the stream ends or closes."""
        self.messages.append({"role": "user", "content": text})
        try:
            pieces = self.reply(self.messages, max_tokens, sampler)
        except BaseException:
            self.messages.pop()
            raise
        return self._recorded(pieces)

    def _recorded(self, pieces: Iterator[str]) -> Generator[str, None, None]:
        got: list[str] = []
        try:
            for piece in pieces:
                got.append(piece)
                yield piece
        finally:
            self.messages.append({"role": "assistant", "content": "".join(got)})

    def reply(self, messages: Sequence[Any], max_tokens: int = DEFAULT_MAX_TOKENS,
              sampler: Any = None) -> Iterator[str]:
        """The reply to `messages` streamed as text pieces (never a split UTF-8 character); sampler None: greedy."""
        model = self.model
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer) or max_tokens < 0:
            raise ArgumentError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        ids = self.prompt_tokens(messages)  # a template error raises now, not at the first piece
        if len(ids) >= model.n_ctx:
            raise ConversationTooLongError(f"the conversation is {len(ids)} tokens, the context {model.n_ctx}: no room "
                                           f"for a reply (load the model with a larger n_ctx)")
        return self._generate(ids, int(max_tokens), sampler)

    def _generate(self, ids: list[int], max_tokens: int, sampler: Any) -> Iterator[str]:
        model = self.model
        self.tokens, self.stop_reason, self.n_prompt = [], None, len(ids)
        eog = model.tokenizer.eog_ids
        decoder = model.tokenizer.stream_decoder()
        # keep the cache of the longest common prefix; at least one token is evaluated, for its logits
        keep = 0
        limit = min(len(self.cached), len(ids) - 1, model.n_past)
        while keep < limit and self.cached[keep] == ids[keep]:
            keep += 1
        self.n_reused = keep
        history = list(ids)
        self.cached = []  # an error leaves the cache unknown
        model.truncate(keep)
        try:
            if max_tokens == 0:
                self.stop_reason = "max_tokens"
                return
            logits = model.eval_last(ids[keep:])
            for n in range(max_tokens):
                tok = int(np.argmax(logits)) if sampler is None else int(sampler.sample(logits, history))
                if tok in eog:
                    self.stop_reason = "eog"
                    break
                history.append(tok)
                self.tokens.append(tok)
                piece = decoder.add(tok)
                if piece:
                    yield piece
                if n == max_tokens - 1:
                    self.stop_reason = "max_tokens"
                    break
                if model.n_past >= model.n_ctx:
                    self.stop_reason = "context"
                    break
                logits = model.eval_last([tok])
            rest = decoder.flush()
            if rest:
                yield rest
        finally:
            self.cached = history[:model.n_past]


def make_sampler(sampler: Any = None, **sampling: Any) -> Any:
    if sampler is not None:
        if sampling:
            raise ArgumentError(f"give a sampler or sampling parameters ({', '.join(sampling)}), not both")
        return sampler
    from pyggml.models.sampling import Sampler

    try:
        return Sampler(**sampling)
    except TypeError as e:
        raise ArgumentError(f"chat: {e} (sampling parameters: temperature, top_k, top_p, min_p, repeat_penalty, "
                            f"repeat_last_n, seed, frequency_penalty, presence_penalty, min_keep)") from None


def chat(model: Model, messages: Sequence[Any], *, max_tokens: int = DEFAULT_MAX_TOKENS, stream: bool = False,
         sampler: Any = None, template: ChatTemplate | None = None, template_kwargs: Mapping[str, Any] | None = None,
         **sampling: Any) -> str | Iterator[str]:
    """`Model.chat`: the reply to `messages`, from an empty KV cache (see `ChatSession.reply`)."""
    session = ChatSession(model, template=template, template_kwargs=template_kwargs)
    s = make_sampler(sampler, **sampling)
    pieces = session.reply(messages, max_tokens, s)
    if stream:
        return pieces
    return "".join(pieces)
