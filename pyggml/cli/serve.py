"""`pyggml serve [MODEL] [--host H] [--port P] [-np N] [-c N] [--api-key KEY]`: an OpenAI-compatible server.

As llama-server: `-np` slots decode together, sharing the `-c` cells of one KV cache
(`-c / -np` each); /v1/chat/completions, /v1/completions, /v1/models, /health,
/tokenize, /detokenize, /apply-template, /props, /slots (off with --no-slots),
/metrics (with --metrics), /v1/embeddings and /embeddings (with --embeddings). It
binds 127.0.0.1 unless --host says otherwise (with a warning: the API has no
other protection than --api-key). Without MODEL it serves the built-in model.
Web pages are kept out (JSON bodies only, a Host allow-list, no CORS unless
--cors-origin), connections are bounded (--header-timeout, --max-connections).
Each request's line (client, method, path, status, tokens, seconds) goes to
stderr unless --log-disable.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from pyggml.cli._common import (
    GGUF_MODEL,
    CLIError,
    add_backend_options,
    add_chat_template,
    add_check_finite,
    add_ctx_size,
    add_debug,
    add_flash_attn,
    add_model,
    builtin_model_path,
    chat_template_args,
    check_model_path,
    context_size,
    load_model,
    plan_from_args,
    positive_int,
    read_hparams,
    settings_from_args,
    warn_context,
)
from pyggml.cli.run import add_grammar_options, compile_grammar, grammar_source
from pyggml.serve.limits import HEADER_TIMEOUT, MAX_CONNECTIONS

DEFAULT_SLOTS = 4
BATCH_INVARIANT = True  # --batch-invariant's default: it measured no slower at decoding (see the README)
MAX_DEFAULT_SLOT_CTX = 1024
LOOPBACK = ("127.0.0.1", "localhost", "::1")
POOLING_CHOICES = ("none", "mean", "cls", "last", "rank")  # llama.cpp's --pooling values (rank is refused here)
REASONING_CHOICES = ("none", "auto", "deepseek", "deepseek-legacy")  # llama.cpp's --reasoning-format values
EMBD_NORMALIZE = 2  # llama.cpp's --embd-normalize default: euclidean


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a GGUF model over the OpenAI API (the built-in one without MODEL)",
                       description="An OpenAI-compatible HTTP server (as llama-server): /v1/chat/completions, "
                                   "/v1/completions (streamed with server-sent events or not), /v1/models, /health, "
                                   "/v1/embeddings (--embeddings), /tokenize, /detokenize, /apply-template, /props, "
                                   "/slots, /metrics (--metrics). "
                                   "-np slots decode in one batch a step and share the -c cells of the KV cache. "
                                   "Needs starlette and uvicorn (pip install 'pyggml[serve]').")
    add_model(p, f"a {GGUF_MODEL} file (default: the built-in model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    p.add_argument("-np", "--parallel", type=positive_int, default=DEFAULT_SLOTS, metavar="N",
                   help=f"slots: requests decoded together (default: {DEFAULT_SLOTS}); more wait in a queue")
    add_ctx_size(p, f"-np times the model's training context, at most {MAX_DEFAULT_SLOT_CTX} a slot; the KV "
                    f"cache cells the slots share")
    p.add_argument("--api-key", default=None, metavar="KEY[,KEY...]",
                   help="require 'Authorization: Bearer KEY' on every route, /health too (llama-server leaves "
                        "/health open); several keys comma-separated. Each key is also a cache namespace: a "
                        "prompt cached for one key is not reused for another (default: no key)")
    p.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME[,NAME...]",
                   help="Host header names accepted besides the bound address, localhost, 127.0.0.1 and [::1] "
                        "(repeatable; '*' accepts any): other names get a 403, so a DNS-rebinding page is refused")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN[,ORIGIN...]",
                   help="web origins (https://app.example) whose pages may call the API: their preflights are "
                        "answered (repeatable; '*' any). Default: none, requests with an Origin get a 403 "
                        "(llama-server allows any origin)")
    p.add_argument("--allow-special-in-content", action="store_true",
                   help="parse special tokens ('<|im_end|>') written in chat messages as control tokens, as "
                        "llama-server does in the whole prompt (default: only the chat template's own are parsed, "
                        "a message's stay text)")
    p.add_argument("--header-timeout", type=positive_float, default=HEADER_TIMEOUT, metavar="SECONDS",
                   help=f"seconds a connection has to send a request's head, and then its body "
                        f"(default: {HEADER_TIMEOUT:g})")
    p.add_argument("--max-connections", type=positive_int, default=MAX_CONNECTIONS, metavar="N",
                   help=f"open connections at most: past it the longest idle one is closed (default: "
                        f"{MAX_CONNECTIONS})")
    p.add_argument("--alias", default=None, metavar="NAME", help="the model's name in the API (default: the file's)")
    add_grammar_options(p)  # llama-server's: the grammar of the requests that bring none
    add_backend_options(p)
    add_check_finite(p)
    add_flash_attn(p)
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=BATCH_INVARIANT,
                   help="a request's logits do not depend on the other requests decoded beside it nor on where "
                        "its KV cells sit: at temperature 0 a prompt gets the answer it gets alone (kernels that "
                        "reduce in one order whatever the batch, flash attention over a sequence's own cells; "
                        f"default: {'on' if BATCH_INVARIANT else 'off'}; not with -fa off)")
    add_chat_template(p)
    p.add_argument("--reasoning-format", default="auto", choices=REASONING_CHOICES, metavar="FORMAT",
                   help="a template that thinks (<think>...</think>): none leaves the reasoning in the content; "
                        "auto and deepseek put it in message.reasoning_content (streamed as its own deltas); "
                        "deepseek-legacy also keeps it, tags and all, in the content (default: auto); a request's "
                        "reasoning_format overrides it")
    p.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true",
                   help="serve /v1/embeddings and /embeddings (decoder models too: the output norm's hidden states)")
    p.add_argument("--pooling", default=None, choices=POOLING_CHOICES, metavar="{none,mean,cls,last}",
                   help="how embeddings pool a text's tokens (default: the file's pooling_type, none without one; "
                        "/v1/embeddings refuses none)")
    p.add_argument("--embd-normalize", type=embd_normalize, default=EMBD_NORMALIZE, metavar="N",
                   help=f"normalization of pooled embeddings: -1 none, 0 max absolute int16, 1 taxicab, 2 euclidean, "
                        f">2 p-norm (default: {EMBD_NORMALIZE}); a request's embd_normalize overrides it")
    p.add_argument("--metrics", action="store_true", help="serve /metrics (Prometheus text, llama-server's names)")
    p.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True,
                   help="serve /slots, each slot's state without the requests' text (default: on)")
    p.add_argument("--log-disable", action="store_true", help="no log line per request on stderr")
    add_debug(p)
    return p


def embd_normalize(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= -1, got {text!r}") from None
    if v < -1:
        raise argparse.ArgumentTypeError(f"expected an integer >= -1, got {text!r}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def host_warning(host: str, api_key: str | None) -> str | None:
    """What to say when `host` is not this machine's loopback address (None when it is)."""
    if host in LOOPBACK:
        return None
    return (f"listening on {host}: other machines can reach the model"
            + ("" if api_key else " without any key (give --api-key)"))


@contextlib.contextmanager
def request_lines_to(err: TextIO, name: str) -> Iterator[None]:
    """The request log (logger `name`) written to `err` while the server runs."""
    logger = logging.getLogger(name)
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("pyggml serve: %(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # once, whatever the root logger does
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def run(args: argparse.Namespace, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    try:
        import uvicorn

        from pyggml.serve.app import create_app
        from pyggml.serve.guard import split_list
        from pyggml.serve.http import fds_needed, raise_fd_limit, server_config
    except ImportError as e:
        raise CLIError(f"pyggml serve needs starlette and uvicorn ({e}); pip install 'pyggml[serve]'") from None
    from pyggml.serve.engine import Engine
    from pyggml.serve.options import ServerOptions
    from pyggml.serve.request_log import LOGGER_NAME

    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be in [1, 65535], got {args.port}")
    api_keys = split_list([args.api_key]) if args.api_key is not None else []
    if args.api_key is not None and not api_keys:
        raise CLIError("--api-key is empty")
    if args.pooling == "rank":
        raise CLIError("--pooling rank needs a classifier head (a reranker model): not supported")
    if args.pooling is not None and not args.embeddings:
        raise CLIError("--pooling is for embeddings: give --embeddings too")
    chat_template = chat_template_args(args)
    grammar = grammar_source(args)
    options = ServerOptions(chat_template=chat_template.source, chat_template_name=chat_template.name,
                            template_kwargs=chat_template.kwargs, reasoning_format=args.reasoning_format,
                            embeddings=args.embeddings, pooling=args.pooling, embd_normalize=args.embd_normalize,
                            slots=args.slots, metrics=args.metrics, grammar=grammar)
    path = builtin_model_path() if args.model is None else check_model_path(args.model)
    plan = plan_from_args(args)
    settings = settings_from_args(args)
    if args.batch_invariant and args.flash_attn == "off":
        raise CLIError("-fa off cannot be batch-invariant (its attention is flash attention over a request's own "
                       "cells): give --no-batch-invariant with it")
    hp = read_hparams(path)
    n_ctx = context_size(args.ctx, hp.n_ctx_train, args.parallel * min(hp.n_ctx_train, MAX_DEFAULT_SLOT_CTX))
    warn_context(n_ctx // args.parallel, hp.n_ctx_train, "pyggml serve", err)
    if n_ctx // args.parallel < 2:
        raise CLIError(f"-c {n_ctx} over -np {args.parallel} slots leaves fewer than 2 cells a slot")
    warning = host_warning(args.host, args.api_key)
    if warning:
        print(f"pyggml serve: warning: {warning}", file=err)
    needed = fds_needed(args.max_connections)
    if raise_fd_limit(needed) < needed:
        print(f"pyggml serve: warning: the open-file limit is under the {needed} that --max-connections "
              f"{args.max_connections} may need (ulimit -n)", file=err)
    model = load_model(path, plan, settings, n_ctx, hp.n_layer, args.threads, err, "pyggml serve",
                       batch_invariant=args.batch_invariant, n_seq_max=args.parallel)
    engine = Engine(model, n_slots=args.parallel)
    try:
        if grammar is not None:
            compile_grammar(grammar, model.tokenizer)  # refused here, not at the first request
        engine.start()
        app = create_app(engine, model_name=args.alias, api_key=api_keys or None, host=args.host,
                         allowed_hosts=split_list(args.allowed_hosts), cors_origins=split_list(args.cors_origin),
                         read_timeout=args.header_timeout, special_in_content=args.allow_special_in_content,
                         options=options)
        print(f"pyggml serve: {path.name} on http://{args.host}:{args.port}/v1 "
              f"({args.parallel} slots of {engine.slot_ctx} tokens)", file=err)
        # streams still open at Ctrl-C get a few seconds, not forever
        server = uvicorn.Server(server_config(app, args.host, args.port, header_timeout=args.header_timeout,
                                              max_connections=args.max_connections, log_level="warning",
                                              timeout_graceful_shutdown=5))
        try:
            with contextlib.nullcontext() if args.log_disable else request_lines_to(err, LOGGER_NAME):
                server.run()
        except KeyboardInterrupt:
            pass  # uvicorn raises the Ctrl-C again once it has shut down (as uvicorn.run, a clean exit)
        if not server.started:
            raise CLIError(f"the server did not start on {args.host}:{args.port}")
    finally:
        engine.stop()
        model.free()
    return 0
