"""/v1/embeddings (OpenAI's) and /embeddings (llama-server's own shape), served with --embeddings.

Each input (a string, token ids, or a list of either) is tokenized as llama-server tokenizes it (the vocab's
BOS/EOS added, special tokens parsed), takes a slot as a generation does and is evaluated for its hidden states
in a batch of embedding requests (`Engine`), pooled by the server's pooling (--pooling, else the file's) and
normalized by `embd_normalize` (the request's, else --embd-normalize: euclidean). /v1/embeddings refuses pooling
"none", as llama-server; /embeddings gives every token's vector then, unnormalized. `encoding_format` "base64"
(what the `openai` client asks for) sends each vector as its float32 little-endian bytes in base64.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pyggml.serve.engine import Event, GenRequest
from pyggml.serve.protocol import RequestError
from pyggml.serve.request_log import note_tokens

if TYPE_CHECKING:
    from pyggml.serve.app import Server

MAX_INPUTS = 2048  # inputs of one request, as OpenAI's limit
EVENT_WAIT = 0.5  # seconds between checks that the client is still there


def not_supported(what: str, flag: str) -> RequestError:
    """llama-server's answer to an endpoint its flags left off (501, not_supported_error)."""
    return RequestError(f"This server does not support {what}. Start it with `{flag}`", status=501,
                        type="not_supported_error", code="not_supported")


def parse_inputs(body: Any) -> tuple[list[str | list[int]], bool]:
    """The inputs of an embeddings body (`input`, or llama-server's `content`) and whether they came as
    `content` (which makes /v1/embeddings answer in /embeddings' shape, as llama-server)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "input" in body:
        value, name, is_content = body["input"], "input", False
    elif "content" in body:
        value, name, is_content = body["content"], "content", True
    else:
        raise RequestError('"input" or "content" must be provided', param="input")

    def ids(x: Any) -> bool:
        return isinstance(x, list) and len(x) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(value, str) or ids(value):
        items = [value]
    elif isinstance(value, list) and value and all(isinstance(x, str) or ids(x) for x in value):
        items = list(value)
    else:
        raise RequestError(f"'{name}' must be a string, a list of token ids, or a non-empty list of strings or "
                           f"of lists of token ids", param=name)
    if len(items) > MAX_INPUTS:
        raise RequestError(f"'{name}' has {len(items)} inputs, at most {MAX_INPUTS}", param=name)
    return items, is_content


def parse_options(body: dict[str, Any], default_normalize: int) -> tuple[bool, int]:
    """(base64 wanted, embd_normalize) of an embeddings body."""
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise RequestError(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", param="encoding_format")
    norm = body.get("embd_normalize", default_normalize)
    if isinstance(norm, bool) or not isinstance(norm, int) or not -1 <= norm <= 1000:
        raise RequestError(f"'embd_normalize' must be an integer in [-1, 1000] (-1 none, 0 max absolute, 1 "
                           f"taxicab, 2 euclidean, >2 p-norm), got {norm!r}", param="embd_normalize")
    return fmt == "base64", norm


def encode_vector(vec: np.ndarray, as_base64: bool) -> Any:
    v = np.asarray(vec, dtype="<f4")
    return base64.b64encode(v.tobytes()).decode("ascii") if as_base64 else v.tolist()


class Embeddings:
    """The two routes over a `Server` (its engine, tokenizer, keys and options)."""

    def __init__(self, server: Server) -> None:
        self.s = server

    async def oai(self, request: Request) -> Response:
        return await self.answer(request, oai=True)

    async def native(self, request: Request) -> Response:
        return await self.answer(request, oai=False)

    def tokenize(self, items: list[str | list[int]]) -> list[list[int]]:
        tok, n_vocab, room = self.s.model.tokenizer, self.s.model.hparams.n_vocab, self.s.engine.slot_ctx
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if tok.min_tokens(item) > room:  # refused from its size, before tokenizing
                    raise RequestError(f"input {i} is at least {tok.min_tokens(item)} tokens, a slot's context "
                                       f"{room}", param="input", code="context_length_exceeded")
                ids = tok.encode(item, True, True)
            else:
                bad = [t for t in item if not 0 <= t < n_vocab]
                if bad:
                    raise RequestError(f"input {i}: token id {bad[0]} is out of the vocabulary (n_vocab {n_vocab})",
                                       param="input")
                ids = list(item)
            if not ids:
                raise RequestError(f"input {i} has no tokens: input content cannot be empty", param="input")
            if len(ids) > room:
                raise RequestError(f"input {i} is {len(ids)} tokens, a slot's context {room}", param="input",
                                   code="context_length_exceeded")
            out.append(ids)
        return out

    async def answer(self, request: Request, oai: bool) -> Response:
        s = self.s
        namespace = s.check_key(request)
        if not s.options.embeddings:
            raise not_supported("embeddings", "--embeddings")
        assert s.pooling is not None
        body = await s.read_json(request)
        items, is_content = parse_inputs(body)
        oai = oai and not is_content  # "content" is llama-server's field: its own shape
        if oai and s.pooling == "none":
            raise RequestError("Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                               param="input")
        as_base64, norm = parse_options(body, s.options.embd_normalize)
        prompts = await run_in_threadpool(self.tokenize, items)
        reqs = [GenRequest(prompt=ids, max_tokens=0, namespace=namespace, pooling=s.pooling, embd_normalize=norm)
                for ids in prompts]
        queues: list[asyncio.Queue[Event]] = []
        try:
            for req in reqs:
                queues.append(s.start(req, stream=False))
            vectors = []
            for queue in queues:
                e = await self.wait(request, queue)
                if e is None:
                    return Response(status_code=499)
                if e.kind == "error":
                    raise RequestError(e.message, status=500, type="server_error")
                vectors.append(e.embedding)
        finally:
            for req in reqs:
                req.cancel()  # no-ops for the finished ones
        n_tokens = sum(len(p) for p in prompts)
        note_tokens(request.scope, prompt=n_tokens)
        if not oai:
            return JSONResponse([{"index": i, "embedding": [encode_vector(row, as_base64) for row in np.atleast_2d(v)]}
                                 for i, v in enumerate(vectors)])
        data = []
        for i, v in enumerate(vectors):
            item: dict[str, Any] = {"embedding": encode_vector(v, as_base64), "index": i, "object": "embedding"}
            if as_base64:
                item["encoding_format"] = "base64"
            data.append(item)
        return JSONResponse({"model": s.model_name, "object": "list",
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "data": data})

    async def wait(self, request: Request, queue: asyncio.Queue[Event]) -> Event | None:
        """The request's final event, or None when its client went away or it took too long."""
        deadline = time.monotonic() + self.s.request_timeout
        while True:
            try:
                e = await asyncio.wait_for(queue.get(), EVENT_WAIT)
            except TimeoutError:
                if await request.is_disconnected() or time.monotonic() > deadline:
                    return None
                continue
            if e.kind in ("done", "error"):
                if e.kind == "done" and e.embedding is None:  # dropped from the queue before it ran
                    return None
                return e
