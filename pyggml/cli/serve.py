"""`pyggml serve [MODEL] [--host H] [--port P] [-np N] [-c N] [--api-key KEY]`: an OpenAI-compatible server.

As llama-server: `-np` slots decode together, sharing the `-c` cells of one KV cache
(`-c / -np` each); /v1/chat/completions, /v1/completions, /v1/models, /health. It
binds 127.0.0.1 unless --host says otherwise (with a warning: the API has no
other protection than --api-key). Without MODEL it serves the built-in model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from pyggml.cli._common import (
    CLIError,
    add_backend_options,
    add_check_finite,
    add_debug,
    add_flash_attn,
    builtin_model_path,
    check_model_path,
    init_backends,
    plan_from_args,
    positive_int,
)

DEFAULT_SLOTS = 4
MAX_DEFAULT_SLOT_CTX = 1024
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a GGUF model over the OpenAI API (the built-in one without MODEL)",
                       description="An OpenAI-compatible HTTP server (as llama-server): /v1/chat/completions, "
                                   "/v1/completions (streamed with server-sent events or not), /v1/models, /health. "
                                   "-np slots decode in one batch a step and share the -c cells of the KV cache. "
                                   "Needs starlette and uvicorn (pip install 'pyggml[serve]').")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL.gguf",
                   help="a GGUF model file (default: the built-in model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    p.add_argument("-np", "--parallel", type=positive_int, default=DEFAULT_SLOTS, metavar="N",
                   help=f"slots: requests decoded together (default: {DEFAULT_SLOTS}); more wait in a queue")
    p.add_argument("-c", "--ctx", type=positive_int, default=None, metavar="N",
                   help=f"KV cache cells shared by the slots (default: -np times the model's training context, "
                        f"at most {MAX_DEFAULT_SLOT_CTX} a slot)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (default: no key)")
    p.add_argument("--alias", default=None, metavar="NAME", help="the model's name in the API (default: the file's)")
    add_backend_options(p)
    add_check_finite(p)
    add_flash_attn(p)
    add_debug(p)
    return p


def host_warning(host: str, api_key: str | None) -> str | None:
    """What to say when `host` is not this machine's loopback address (None when it is)."""
    if host in LOOPBACK:
        return None
    return (f"listening on {host}: other machines can reach the model"
            + ("" if api_key else " without any key (give --api-key)"))


def run(args: argparse.Namespace, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    try:
        import uvicorn

        from pyggml.serve.app import create_app
    except ImportError as e:
        raise CLIError(f"pyggml serve needs starlette and uvicorn ({e}); pip install 'pyggml[serve]'") from None
    from pyggml.gguf.reader import read_gguf
    from pyggml.models import HParams, load
    from pyggml.serve.engine import Engine

    if not 0 < args.port < 65536:
        raise CLIError(f"--port must be in [1, 65535], got {args.port}")
    path = builtin_model_path() if args.model is None else check_model_path(args.model)
    plan = plan_from_args(args)
    gf = read_gguf(path)
    try:
        n_ctx_train = HParams.from_gguf(gf).n_ctx_train
    finally:
        gf.close()
    n_ctx = args.ctx or args.parallel * min(n_ctx_train, MAX_DEFAULT_SLOT_CTX)
    if n_ctx // args.parallel < 2:
        raise CLIError(f"-c {n_ctx} over -np {args.parallel} slots leaves fewer than 2 cells a slot")
    warning = host_warning(args.host, args.api_key)
    if warning:
        print(f"pyggml serve: warning: {warning}", file=err)
    objs = init_backends(plan.names, args.threads)
    model = load(path, objs, n_ctx=n_ctx, **plan.load_kwargs(objs), progress=err.isatty(),
                 check_finite=args.check_finite, flash_attn=args.flash_attn)
    engine = Engine(model, n_slots=args.parallel)
    try:
        engine.start()
        app = create_app(engine, model_name=args.alias, api_key=args.api_key)
        print(f"pyggml serve: {path.name} on http://{args.host}:{args.port}/v1 "
              f"({args.parallel} slots of {engine.slot_ctx} tokens)", file=err)
        # streams still open at Ctrl-C get a few seconds, not forever
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        engine.stop()
        model.free()
    return 0
