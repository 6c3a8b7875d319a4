"""llama-server's other endpoints, in its shapes: /tokenize, /detokenize, /apply-template, /props, /slots,
/metrics, and OpenAI's /v1/models/{model}.

- POST /tokenize `{"content": text or [text or id, ...], "add_special": false, "parse_special": true,
  "with_pieces": false}` -> `{"tokens": [id, ...]}`, or `[{"id", "piece"}, ...]` with pieces (a piece is its
  text, or its bytes as a list of integers where they are not UTF-8 alone).
- POST /detokenize `{"tokens": [id, ...]}` -> `{"content": text}` (each token's text, special ones written).
- POST /apply-template: a chat body (`messages`, `tools`, `chat_template_kwargs`) -> `{"prompt": text}`, the text
  the chat route tokenizes.
- GET /props: the default generation settings, slots, model, chat template and its capabilities, BOS/EOS texts,
  endpoints on.
- GET /slots (off with --no-slots): each slot's state and its request's settings, never its text; with
  `?fail_on_no_slot=1` a 503 when no slot is idle.
- GET /metrics (with --metrics): `pyggml.serve.metrics`.
- GET /v1/models/{model}: the served model, or a 404 naming the model asked for.
An endpoint its flag left off answers 501 (llama-server's not_supported_error); every one needs the API key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import pyggml
from pyggml.serve.embeddings import not_supported
from pyggml.serve.protocol import Params, RequestError, parse_request

if TYPE_CHECKING:
    from pyggml.serve.app import Server

# the defaults a request gets (protocol.parse_request's: OpenAI's, and llama-server's for its own fields)
DEFAULT_PARAMS = Params(kind="chat")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be a boolean, got {v!r}", param=name)
    return v


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def piece_json(piece: bytes) -> str | list[int]:
    """A token's piece as llama-server writes it: its text if its bytes are UTF-8, else the bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def generation_settings(p: Params) -> dict[str, Any]:
    """A request's settings under llama-server's names (/props' defaults, /slots' per request)."""
    return {"n_predict": -1 if p.max_tokens is None else p.max_tokens, "seed": p.seed,
            "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "repeat_last_n": 64, "repeat_penalty": p.repeat_penalty, "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty, "ignore_eos": p.ignore_eos, "stream": p.stream,
            "n_probs": 0, "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"]}


class Endpoints:
    """The routes over a `Server`."""

    def __init__(self, server: Server) -> None:
        self.s = server

    async def tokenize(self, request: Request) -> Response:
        self.s.check_key(request)
        body = _object(await self.s.read_json(request))
        add_special = _flag(body, "add_special", False)
        parse_special = _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        content = body.get("content", [])  # none: no tokens, as llama-server
        if not isinstance(content, str | list):
            raise RequestError("'content' must be a string or a list of strings and token ids", param="content")
        parts = content if isinstance(content, list) else [content]
        n_vocab = self.s.model.hparams.n_vocab
        for i, part in enumerate(parts):
            if isinstance(part, bool) or not isinstance(part, str | int):
                raise RequestError("'content' must be a string or a list of strings and token ids", param="content")
            if isinstance(part, int) and not 0 <= part < n_vocab:
                raise RequestError(f"content[{i}]: token id {part} is out of the vocabulary (n_vocab {n_vocab})",
                                   param="content")
        tok = self.s.model.tokenizer

        def run() -> list[Any]:
            ids: list[int] = []
            for i, part in enumerate(parts):  # llama-server's tokenize_mixed: BOS only before a first text
                ids += [part] if isinstance(part, int) else tok.encode(part, add_special and i == 0, parse_special)
            if not with_pieces:
                return ids
            return [{"id": t, "piece": piece_json(tok.token_to_bytes(t, special=True))} for t in ids]

        tokens = await run_in_threadpool(run)
        return JSONResponse({"tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        self.s.check_key(request)
        body = _object(await self.s.read_json(request))
        tokens = body.get("tokens", [])
        n_vocab = self.s.model.hparams.n_vocab
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise RequestError("'tokens' must be a list of token ids", param="tokens")
        bad = [t for t in tokens if not 0 <= t < n_vocab]
        if bad:
            raise RequestError(f"token id {bad[0]} is out of the vocabulary (n_vocab {n_vocab})", param="tokens")
        tok = self.s.model.tokenizer
        text = b"".join(tok.token_to_bytes(t, special=True) for t in tokens).decode("utf-8", errors="replace")
        return JSONResponse({"content": text})

    async def apply_template(self, request: Request) -> Response:
        self.s.check_key(request)
        p = parse_request(await self.s.read_json(request), "chat")
        prompt = await run_in_threadpool(self.s.chat_prompt, p)
        return JSONResponse({"prompt": prompt})

    async def props(self, request: Request) -> Response:
        s = self.s
        s.check_key(request)
        tok = s.model.tokenizer

        def text(tid: int | None) -> str:
            return tok.token_to_piece(tid, special=True) if tid is not None else ""

        return JSONResponse({
            "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": s.engine.slot_ctx, "speculative": False,
                                            "is_processing": False, "params": generation_settings(DEFAULT_PARAMS)},
            "total_slots": len(s.engine.slots),
            "model_alias": s.model_name,
            "model_path": getattr(s.model.file, "name", ""),  # the file's name, not where it sits
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": s.options.slots,
            "endpoint_props": False,
            "endpoint_metrics": s.options.metrics,
            "chat_template": s.template.source,
            "chat_template_caps": s.tool_format.caps.to_json(),
            "bos_token": text(tok.bos_id),
            "eos_token": text(tok.eos_id),
            "build_info": f"pyggml {pyggml.__version__}",
            "is_sleeping": False,
        })

    async def slots(self, request: Request) -> Response:
        s = self.s
        s.check_key(request)
        if not s.options.slots:
            raise not_supported("slots endpoint", "--slots")
        out = []
        for slot in list(s.engine.slots):  # read while the engine runs: a snapshot of plain values
            req = slot.req
            busy = req is not None
            n_decoded = slot.n_gen if busy else 0
            out.append({"id": slot.id, "id_task": slot.task, "n_ctx": s.engine.slot_ctx, "speculative": False,
                        "is_processing": busy, "params": dict(req.info) if busy else {},
                        "next_token": {"has_next_token": busy, "has_new_line": False,
                                       "n_remain": req.max_tokens - n_decoded if busy else -1,
                                       "n_decoded": n_decoded}})
        if request.query_params.get("fail_on_no_slot") and all(x["is_processing"] for x in out):
            raise RequestError("no slot available", status=503, type="unavailable_error", code="unavailable")
        return JSONResponse(out)

    async def metrics(self, request: Request) -> Response:
        from pyggml.serve.metrics import CONTENT_TYPE

        s = self.s
        s.check_key(request)
        if s.metrics is None:
            raise not_supported("metrics endpoint", "--metrics")
        return Response(s.metrics.render(), media_type=CONTENT_TYPE)

    async def model(self, request: Request) -> Response:
        s = self.s
        s.check_key(request)
        name = request.path_params["model"]
        if name != s.model_name:
            raise RequestError(f"The model '{name}' does not exist", param="model", status=404,
                               code="model_not_found")
        return JSONResponse(s.model_card())
