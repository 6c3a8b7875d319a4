"""The ASGI app (Starlette): OpenAI's /v1/chat/completions, /v1/completions, /v1/models and /v1/embeddings,
/health, and llama-server's other endpoints (`endpoints`, `embeddings`); one log line per request
(`request_log`).

The event loop never runs model code: templates, tokenization and compiling a request's grammar or JSON schema
go to Starlette's thread pool (no lock: the tokenizer's caches take concurrent use), decoding to the engine's
thread, whose events come back through
an asyncio queue per request (`loop.call_soon_threadsafe`). A client that goes away cancels its request, which
frees its slot.

Clients are kept apart: with `api_key` (one key or several) every route, /health too, needs one of them as
`Authorization: Bearer KEY`, compared in constant time; the bearer token a request presents (any, without
`api_key`) names its cache namespace, so a slot's cached prompt is reused, and reported as `cached_tokens`,
only for requests presenting the same token (no token: one shared namespace). Bodies are `application/json`
only, read within `read_timeout` seconds; a prompt that cannot fit a slot is refused from its size before it
is tokenized where the vocab allows (`Tokenizer.min_tokens`); the messages' strings never become special
tokens unless `special_in_content` (`ChatTemplate.prompt_parts`). `guard.Guard` checks Host and Origin first.
A chat's template gets the server's `template_kwargs` and the request's `chat_template_kwargs` over them; the
reply of a template that thinks has its reasoning apart (`reasoning_content`, `pyggml.models.reasoning`) unless
the reasoning format is "none".
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pyggml.core.errors import GGMLError
from pyggml.models.reasoning import ReasoningSplit, template_thinks, thinking_forced_open
from pyggml.models.tool_calls import ToolCall, ToolFormat
from pyggml.serve.embeddings import Embeddings
from pyggml.serve.endpoints import Endpoints, generation_settings
from pyggml.serve.engine import Engine, EngineStoppedError, Event, GenRequest, QueueFullError
from pyggml.serve.guard import Guard
from pyggml.serve.limits import HEADER_TIMEOUT, MAX_BODY
from pyggml.serve.options import ServerOptions
from pyggml.serve.protocol import (
    Params,
    RequestError,
    chat_logprobs,
    check_content_type,
    chunk,
    completion_logprobs,
    decode_body,
    error_body,
    new_id,
    parse_request,
    response,
    usage,
)
from pyggml.serve.reply import ReplySplit
from pyggml.serve.request_log import RequestLog, note_tokens

EVENT_WAIT = 0.5  # seconds between checks that a non-streaming client is still there


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class Server:
    """The state the routes share: the engine, the model's name and chat template, the API keys, the limits."""

    def __init__(self, engine: Engine, model_name: str | None = None, api_key: str | Sequence[str] | None = None,
                 max_body: int = MAX_BODY, request_timeout: float = 600.0, read_timeout: float = HEADER_TIMEOUT,
                 special_in_content: bool = False, options: ServerOptions | None = None) -> None:
        from pyggml.models.chat import ChatTemplate
        from pyggml.models.pooling import check_pooling
        from pyggml.models.reasoning import check_reasoning_format

        self.options = options or ServerOptions()
        check_reasoning_format(self.options.reasoning_format, "the reasoning format")
        self.engine = engine
        self.model = engine.model
        self.model_name = model_name or Path(getattr(self.model.file, "name", "model")).stem
        keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
        self.api_keys = [k.encode("utf-8") for k in keys]
        self.max_body = max_body
        self.request_timeout = request_timeout  # a request's whole life (a bound, not a deadline users see)
        self.read_timeout = read_timeout  # seconds for a request's body
        self.special_in_content = special_in_content  # parse special tokens in messages too (llama.cpp's way)
        self.template = ChatTemplate.from_model(self.model, self.options.chat_template,
                                                self.options.chat_template_name)
        self.thinks = template_thinks(self.template.source)
        self.tool_format = ToolFormat.of(self.template)
        self.default_grammar = self.options.grammar  # (kind, spec, option): the constraint of requests that bring none
        self.eog = frozenset(self.model.tokenizer.eog_ids)
        self.created = int(time.time())
        # embeddings with the server's pooling (--pooling, else the file's); checked now: "rank" cannot be served
        self.pooling = (check_pooling(self.options.pooling or self.model.pooling_type, "the pooling")
                        if self.options.embeddings else None)
        self.metrics: Any = None
        if self.options.metrics:
            from pyggml.serve.metrics import Metrics

            self.metrics = Metrics(engine)

    # --- the request's way in ---

    def check_key(self, request: Request) -> str:
        """The request's cache namespace (a digest of its bearer token, "" without one), once its token is
        one of the API keys (when there are keys): each key compared in constant time, all of them."""
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        given = token.strip().encode("latin-1") if scheme.lower() == "bearer" else b""  # the header's own bytes
        if self.api_keys:
            match = False
            for key in self.api_keys:
                match |= hmac.compare_digest(given, key)
            if not match:
                raise RequestError("invalid API key (give it as 'Authorization: Bearer KEY')", status=401,
                                   code="invalid_api_key")
        return hashlib.sha256(given).hexdigest() if given else ""

    async def read_json(self, request: Request) -> Any:
        check_content_type(request.headers.get("content-type"))
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.max_body:
            raise RequestError(f"the request body is {size} bytes, the limit {self.max_body}", status=413,
                               code="request_too_large")
        data = bytearray()
        try:
            async with asyncio.timeout(self.read_timeout):
                async for part in request.stream():
                    data += part
                    if len(data) > self.max_body:
                        raise RequestError(f"the request body is over the limit of {self.max_body} bytes",
                                           status=413, code="request_too_large")
        except TimeoutError:
            raise RequestError(f"the request body did not arrive within {self.read_timeout:g} s ({len(data)} bytes "
                               f"came)", status=408, code="request_timeout") from None
        return decode_body(bytes(data))

    def check_fits(self, text: str, param: str) -> None:
        """Refuse a prompt text that cannot fit a slot, from its size, before it is tokenized."""
        n = self.model.tokenizer.min_tokens(text)
        if n >= self.engine.slot_ctx:
            size = len(text.encode("utf-8", "surrogatepass"))
            raise RequestError(f"the prompt is at least {n} tokens ({size} bytes), a slot's context "
                               f"{self.engine.slot_ctx}: no room for an answer", param=param,
                               code="context_length_exceeded")

    def template_kwargs(self, p: Params) -> dict[str, Any]:
        """The chat template's variables: the server's, the request's `chat_template_kwargs` over them."""
        return {**self.options.template_kwargs, **p.template_kwargs}

    def chat_inputs(self, p: Params) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and variables the chat template renders: the tools and their polyfills
        (`ToolFormat.template_inputs`), the template's variables."""
        kwargs = self.template_kwargs(p)
        if p.tools:
            kwargs["tools"] = p.tools
        return self.tool_format.template_inputs(p.messages, p.tools, p.tool_choice), kwargs

    def chat_prompt(self, p: Params) -> str:
        """The chat's prompt text, as the chat route tokenizes it (/apply-template's answer)."""
        messages, kwargs = self.chat_inputs(p)
        try:
            return self.template.prompt(messages, add_generation_prompt=True, **kwargs)
        except GGMLError as e:
            raise RequestError(f"the chat template failed on these messages: {e}", param="messages") from None

    def prompt_ids(self, p: Params) -> list[int]:
        """The prompt's token ids (in a worker thread: templates and tokenizers are model code)."""
        from pyggml.models.chat import SpecialTextError, check_special_text

        tokenizer = self.model.tokenizer
        if p.kind == "chat":
            messages, kwargs = self.chat_inputs(p)
            try:
                if self.special_in_content:
                    parts = [(self.template.prompt(messages, add_generation_prompt=True, **kwargs), True)]
                else:
                    check_special_text(p.tools, "tools", tokenizer)  # the template writes them as its own text
                    parts = self.template.prompt_parts(messages, tokenizer, add_generation_prompt=True, **kwargs)
            except SpecialTextError as e:
                raise RequestError(str(e), param=e.field) from None
            except GGMLError as e:
                raise RequestError(f"the chat template failed on these messages: {e}", param="messages") from None
            self.check_fits("".join(text for text, _ in parts), "messages")
            return tokenizer.encode_parts(parts)
        if isinstance(p.prompt, str):
            self.check_fits(p.prompt, "prompt")
            return tokenizer.encode(p.prompt, True, True)  # a completion's prompt is the client's whole text
        n_vocab = self.model.hparams.n_vocab
        bad = [t for t in p.prompt if not 0 <= t < n_vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is out of the vocabulary (n_vocab {n_vocab})",
                               param="prompt")
        return list(p.prompt)

    def grammar(self, p: Params, ids: Sequence[int] = ()) -> Any:
        """The request's constraint as a new `GrammarMatcher` (None without one), compiled in a worker thread:
        a schema can take milliseconds. A grammar that does not compile is a 400 naming its field."""
        from pyggml.models.grammar import Grammar, GrammarError

        tokenizer = self.model.tokenizer
        if self.calls_tools(p):  # the tools' syntax, with the response format's JSON where no call comes
            response = None
            if p.grammar is not None:
                response = {"type": "object"} if p.grammar[0] == "json_object" else p.grammar[1]
            try:
                tools = self.tool_format.grammar(tokenizer, p.tools, p.tool_choice, p.parallel_tool_calls, response,
                                                 think_open=self.think_open(p, ids) is True)
            except GrammarError as e:
                raise RequestError(str(e), param=p.grammar_param or "tools", code="invalid_grammar") from None
            return None if tools is None else tools.matcher()
        if p.grammar is None and self.default_grammar is not None:
            kind, spec, option = self.default_grammar
            p.grammar, p.grammar_param = (kind, spec), option
        if p.grammar is None:
            return None
        kind, spec = p.grammar
        try:
            if kind == "gbnf":
                grammar = Grammar.from_gbnf(tokenizer, spec, p.grammar_param)
            elif kind == "json_object":
                grammar = Grammar.json_object(tokenizer, p.grammar_param)
            else:
                grammar = Grammar.from_json_schema(tokenizer, spec, p.grammar_param)
            return grammar.matcher()
        except GrammarError as e:
            raise RequestError(str(e), param=p.grammar_param, code="invalid_grammar") from None

    def logit_bias(self, p: Params) -> dict[int, float]:
        """The request's logit bias by token id: a text's bias goes to each of its tokens (llama-server)."""
        tokenizer = self.model.tokenizer
        n_vocab = self.model.hparams.n_vocab
        out: dict[int, float] = {}
        for key, bias in p.logit_bias:
            ids = [key] if isinstance(key, int) else tokenizer.encode(key, add_special=False)
            for t in ids:
                if not 0 <= t < n_vocab:
                    raise RequestError(f"logit_bias token id {t} is out of the vocabulary (n_vocab {n_vocab})",
                                       param="logit_bias")
                out[t] = bias
        return out

    def prepare(self, p: Params) -> tuple[list[int], Any, dict[int, float]]:
        """The prompt's ids, the grammar's matcher and the logit bias (in a worker thread: model code)."""
        ids = self.prompt_ids(p)
        return ids, self.grammar(p, ids), self.logit_bias(p)

    def gen_request(self, p: Params, ids: list[int], namespace: str = "", grammar: Any = None,
                    logit_bias: dict[int, float] | None = None) -> GenRequest:
        from pyggml.models.sampling import Sampler

        room = self.engine.slot_ctx - len(ids)
        if room < 1:
            raise RequestError(f"the prompt is {len(ids)} tokens, a slot's context {self.engine.slot_ctx}: no room "
                               f"for an answer", param="messages" if p.kind == "chat" else "prompt",
                               code="context_length_exceeded")
        max_tokens = p.max_tokens if p.max_tokens is not None else room
        if max_tokens > room:
            raise RequestError(f"max_tokens {max_tokens} + {len(ids)} prompt tokens exceed a slot's context of "
                               f"{self.engine.slot_ctx} tokens", param="max_tokens", code="context_length_exceeded")
        sampler = Sampler(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                          repeat_penalty=p.repeat_penalty, repeat_last_n=64, seed=p.seed,
                          presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                          logit_bias=logit_bias, grammar=grammar)
        return GenRequest(prompt=ids, max_tokens=max_tokens, sampler=sampler, stop=p.stop,
                          eog_ids=frozenset() if p.ignore_eos else self.eog, namespace=namespace,
                          cache_prompt=p.cache_prompt, n_probs=p.n_probs)

    def logprobs(self, p: Params, probs: list[Any], offset: int = 0) -> dict[str, Any] | None:
        """The `logprobs` object of `probs` (None when the request asked for none); `offset`: the characters of
        the completions answer before these tokens."""
        if p.n_probs is None:
            return None
        piece = self.model.tokenizer.token_to_bytes
        if p.kind == "chat":
            return chat_logprobs(probs, lambda t: piece(t, True))
        return completion_logprobs(probs, lambda t: piece(t, True), self.prompt_chars(p) + offset)

    def prompt_chars(self, p: Params) -> int:
        """The characters of a completions prompt (where the answer's text_offset starts)."""
        return len(p.prompt) if isinstance(p.prompt, str) else len(self.model.tokenizer.decode(p.prompt))

    def start(self, req: GenRequest, stream: bool = True) -> asyncio.Queue[Event]:
        """Queue `req` on the engine; its events arrive in the returned queue (on this event loop). Without
        `stream` the text comes in one event just before the end: a wake-up of the event loop per token (and
        its turn at the GIL, beside the decode loop) would serve nobody."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        pieces: list[str] = []  # the text held back (the engine's thread only)
        probs: list[Any] = []  # and its tokens' logprobs

        def post(e: Event) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, e)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

        def sink(e: Event) -> None:  # the engine's thread
            if not stream and e.kind == "text":
                pieces.append(e.text)
                probs.extend(e.probs)
                return
            if pieces:
                post(Event("text", text="".join(pieces), probs=probs[:]))
                pieces.clear()
                probs.clear()
            post(e)

        req.sink = sink
        try:
            self.engine.submit(req)
        except QueueFullError as e:
            raise RequestError(str(e), status=503, type="server_error", code="queue_full") from None
        except EngineStoppedError as e:
            raise RequestError(str(e), status=503, type="server_error", code="unavailable") from None
        return events

    def calls_tools(self, p: Params) -> bool:
        """Whether the reply may call the request's tools (its calls are parsed, `tool_choice` not "none")."""
        return p.kind == "chat" and bool(p.tools) and p.tool_choice.mode != "none"

    def reply_split(self, p: Params, ids: Sequence[int], stream: bool) -> ReplySplit | None:
        """How a chat reply is split (None: it stays whole): its reasoning apart unless the template does not
        think or the format is "none" ("deepseek-legacy": the content keeps it all; streamed, inline only), its
        tool calls parsed when it may call the request's tools."""
        tools = self.tool_format.parser() if self.calls_tools(p) else None
        legacy = (p.reasoning_format or self.options.reasoning_format) == "deepseek-legacy"
        forced_open = self.think_open(p, ids)
        reasoning = None
        if forced_open is not None and not (legacy and stream):
            reasoning = ReasoningSplit(forced_open=forced_open)
        if reasoning is None and tools is None:
            return None
        return ReplySplit(reasoning, tools, legacy=legacy and reasoning is not None)

    def think_open(self, p: Params, ids: Sequence[int]) -> bool | None:
        """Whether the chat's prompt ends inside a thinking block the template opened; None: the reply's
        reasoning is not split (not a chat, a template that does not think, the format "none")."""
        fmt = p.reasoning_format or self.options.reasoning_format
        if p.kind != "chat" or fmt == "none" or not self.thinks:
            return None
        tok = self.model.tokenizer  # the prompt's end: long enough for the tag in single bytes and whitespace
        tail = b"".join(tok.token_to_bytes(t, special=True) for t in ids[-16:]).decode("utf-8", errors="replace")
        return thinking_forced_open(tail)

    # --- routes ---

    async def completions(self, request: Request, kind: str) -> Response:
        try:
            namespace = self.check_key(request)
            p = parse_request(await self.read_json(request), kind)
            ids, grammar, bias = await run_in_threadpool(self.prepare, p)
            req = self.gen_request(p, ids, namespace, grammar, bias)
            req.info = generation_settings(p)
            events = self.start(req, stream=p.stream)
        except RequestError as e:
            return _error(e)
        rid = new_id(kind)
        name = self.model_name  # the model that answers, whatever the request named
        split = self.reply_split(p, ids, p.stream)
        if p.stream:
            return StreamingResponse(self.stream(req, events, p, rid, name, request.scope, split),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            text: list[str] = []
            probs: list[Any] = []
            deadline = time.monotonic() + self.request_timeout
            next_check = time.monotonic() + EVENT_WAIT
            while True:
                try:
                    e = await asyncio.wait_for(events.get(), EVENT_WAIT)
                except TimeoutError:
                    e = None
                now = time.monotonic()
                if now >= next_check:  # also while tokens come: they come for a client that may be gone
                    next_check = now + EVENT_WAIT
                    if await request.is_disconnected() or now > deadline:
                        req.cancel()
                        return Response(status_code=499)
                if e is None:
                    continue
                probs += e.probs
                if e.kind == "text":
                    text.append(e.text)
                elif e.kind == "error":
                    return JSONResponse(error_body(e.message, "server_error"), status_code=500)
                else:
                    use = usage(e.prompt_tokens, e.completion_tokens, e.cached_tokens)
                    note_tokens(request.scope, prompt=e.prompt_tokens, completion=e.completion_tokens,
                                cached=e.cached_tokens)
                    content, reasoning, calls = "".join(text), "", []
                    if split is not None:
                        pieces = split.feed(content) + split.flush()
                        reasoning = "".join(t for k, t in pieces if k == "reasoning")
                        content = "".join(t for k, t in pieces if k == "content")
                        calls = [c for k, c in pieces if k == "call"]
                    finish = "tool_calls" if calls and e.finish_reason == "stop" else e.finish_reason
                    return JSONResponse(response(kind, rid, name, content, finish, use, reasoning,
                                                 self.logprobs(p, probs), calls))
        finally:
            req.cancel()  # a no-op after the end; frees the slot when this coroutine was cancelled

    async def stream(self, req: GenRequest, events: asyncio.Queue[Event], p: Params, rid: str,
                     name: str, scope: Any = None, split: ReplySplit | None = None) -> AsyncIterator[str]:
        def sse(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        calls: list[ToolCall] = []

        def pieces(kinds: list[tuple[str, Any]], logprobs: dict[str, Any] | None = None) -> Iterator[str]:
            """A split reply's deltas (a tool call's whole, with its index); the tokens' `logprobs` go with the
            first (alone when the split held all back)."""
            if not kinds and logprobs is not None:
                yield sse(chunk(p.kind, rid, name, None, logprobs=logprobs))
            for i, (what, v) in enumerate(kinds):
                lp = logprobs if i == 0 else None
                if what == "call":
                    yield sse(chunk(p.kind, rid, name, None, logprobs=lp, call=(len(calls), v)))
                    calls.append(v)
                else:
                    yield sse(chunk(p.kind, rid, name, v, logprobs=lp) if what == "content"
                              else chunk(p.kind, rid, name, None, reasoning=v, logprobs=lp))

        try:
            if p.kind == "chat":
                yield sse(chunk(p.kind, rid, name, "", role=True))
            deadline = time.monotonic() + self.request_timeout
            offset = 0  # the answer's characters sent (the completions logprobs' text_offset)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    yield sse(error_body("the request took too long", "server_error"))
                    break
                try:
                    e = await asyncio.wait_for(events.get(), remaining)
                except TimeoutError:
                    continue
                logprobs = self.logprobs(p, e.probs, offset)
                if e.kind == "text":
                    if split is None:
                        yield sse(chunk(p.kind, rid, name, e.text, logprobs=logprobs))
                    else:
                        for line in pieces(split.feed(e.text), logprobs):
                            yield line
                    offset += sum(len(x) for x in (logprobs or {}).get("tokens", ()))
                elif e.kind == "error":
                    yield sse(error_body(e.message, "server_error"))
                    break
                else:
                    if split is not None:
                        for line in pieces(split.flush()):
                            yield line
                    use = usage(e.prompt_tokens, e.completion_tokens, e.cached_tokens)
                    if scope is not None:
                        note_tokens(scope, prompt=e.prompt_tokens, completion=e.completion_tokens,
                                    cached=e.cached_tokens)
                    finish = e.finish_reason if e.finish_reason != "cancelled" else "stop"
                    if calls and finish == "stop":
                        finish = "tool_calls"
                    yield sse(chunk(p.kind, rid, name, None if p.kind == "chat" else "", finish_reason=finish,
                                    use=None if p.include_usage else use, logprobs=logprobs if e.probs else None))
                    if p.include_usage:
                        yield sse(chunk(p.kind, rid, name, None, use=use, no_choice=True))
                    break
            yield "data: [DONE]\n\n"
        finally:
            req.cancel()  # the client went away (or the answer is over: then nothing happens)

    async def chat_completions(self, request: Request) -> Response:
        return await self.completions(request, "chat")

    async def text_completions(self, request: Request) -> Response:
        return await self.completions(request, "completion")

    def model_card(self) -> dict[str, Any]:
        """The served model as OpenAI's model object (llama-server's `meta` beside)."""
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "pyggml",
                "meta": {"n_ctx": self.model.n_ctx, "n_slots": len(self.engine.slots), "slot_ctx": self.engine.slot_ctx,
                         "n_vocab": self.model.hparams.n_vocab, "n_embd": self.model.hparams.n_embd}}

    async def models(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except RequestError as e:
            return _error(e)
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def health(self, request: Request) -> Response:
        try:
            self.check_key(request)  # llama-server leaves /health open; its counters tell of others' requests
        except RequestError as e:
            return _error(e)
        alive = self.engine.thread is not None and self.engine.thread.is_alive()
        body = {"status": "ok" if alive else "error", "slots_idle": len(self.engine.slots) - self.engine.busy_slots(),
                "slots_processing": self.engine.busy_slots(), "requests_waiting": self.engine.waiting(),
                "steps": self.engine.n_steps, "step_tokens": self.engine.decode_tokens,
                "decode_seconds": round(self.engine.decode_seconds, 6), "requests_done": self.engine.n_done,
                "requests_cancelled": self.engine.n_cancelled, "prompts_reused": self.engine.n_prompt_reused,
                "graphs_built": getattr(self.model, "n_graphs_built", None)}
        return JSONResponse(body, status_code=200 if alive else 503)


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return _error(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug, not the client's fault: still OpenAI's error object (the traceback goes to the log)."""
    logging.getLogger(__name__).error("serve: internal error", exc_info=exc)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500)


def create_app(engine: Engine, model_name: str | None = None, api_key: str | Sequence[str] | None = None,
               max_body: int = MAX_BODY, *, host: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
               cors_origins: Iterable[str] = (), read_timeout: float = HEADER_TIMEOUT,
               special_in_content: bool = False, options: ServerOptions | None = None) -> Starlette:
    """The Starlette app serving `engine` (already started or not: requests wait for its thread): Host must be
    `host` (the bound address), a local name or one of `allowed_hosts` ("*": any); requests from web pages only
    from `cors_origins`; `options`: llama-server's other features (`ServerOptions`); the rest as `Server`."""
    s = Server(engine, model_name, api_key, max_body, read_timeout=read_timeout,
               special_in_content=special_in_content, options=options)
    more, embed = Endpoints(s), Embeddings(s)
    routes = [
        Route("/v1/chat/completions", s.chat_completions, methods=["POST"]),
        Route("/chat/completions", s.chat_completions, methods=["POST"]),
        Route("/v1/completions", s.text_completions, methods=["POST"]),
        Route("/completions", s.text_completions, methods=["POST"]),
        Route("/v1/models", s.models, methods=["GET"]),
        Route("/models", s.models, methods=["GET"]),
        Route("/health", s.health, methods=["GET"]),
        Route("/v1/models/{model:path}", more.model, methods=["GET"]),
        Route("/models/{model:path}", more.model, methods=["GET"]),
        Route("/v1/embeddings", embed.oai, methods=["POST"]),
        Route("/embeddings", embed.native, methods=["POST"]),
        Route("/tokenize", more.tokenize, methods=["POST"]),
        Route("/detokenize", more.detokenize, methods=["POST"]),
        Route("/apply-template", more.apply_template, methods=["POST"]),
        Route("/props", more.props, methods=["GET"]),
        Route("/slots", more.slots, methods=["GET"]),
        Route("/metrics", more.metrics, methods=["GET"]),
    ]
    guard = Middleware(Guard, bound_host=host, allowed_hosts=list(allowed_hosts), cors_origins=list(cors_origins))
    app = Starlette(routes=routes, middleware=[Middleware(RequestLog), guard],
                    exception_handlers={RequestError: _request_error, HTTPException: _http_error,
                                        Exception: _internal_error})
    app.state.server = s
    return app
