"""`pyggml chat [MODEL.gguf]`: talk with a model, turn by turn, the replies streamed.

Each line read from stdin is a user message; the reply streams to stdout and ends with a newline. The
conversation (an optional `--system` message first) is rendered with the file's chat template at every
turn (ChatML where the file has none, as llama.cpp), and the KV cache of what the last turn evaluated is
kept (`pyggml.models.chat.ChatSession`). A reply stops at the template's end-of-turn token, after
`-n` tokens, or when the context is full (Ctrl-C on a terminal stops a reply, the chat goes on). EOF or
`/exit` ends the chat; a summary goes to stderr.
On a terminal a "> " prompt is shown; piped (`printf 'Hi\\nBye\\n' | pyggml chat M.gguf`) stdout has the
replies only. Without MODEL it chats with the built-in model, which was not trained to chat.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import time
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
    n_predict,
    plan_from_args,
    read_hparams,
    settings_from_args,
    warn_context,
)
from pyggml.cli.run import add_grammar_options, add_sampling_options, compile_grammar, grammar_source, make_sampler

DEFAULT_MAX_TOKENS = 256
MAX_DEFAULT_CTX = 2048  # a conversation's history needs more room than run's prompt
EXIT_COMMANDS = ("/exit", "/quit")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("chat", help="chat with a GGUF model, interactively (the built-in one without MODEL)",
                       description="Chat with a GGUF model: each line of stdin is a user message, the reply "
                                   "streams to stdout. The file's chat template (tokenizer.chat_template; "
                                   "ChatML without one, as llama.cpp) renders the conversation, the reply stops "
                                   "at its end-of-turn token. EOF (Ctrl-D) or /exit ends the chat.")
    add_model(p, f"a {GGUF_MODEL} file (default: the built-in model, which was not trained to chat)")
    p.add_argument("-p", "--prompt", default=None, metavar="TEXT",
                   help="the first user message, answered before stdin is read (as llama-cli's -p)")
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None, metavar="TEXT",
                   help="a system message to start the conversation")
    add_chat_template(p)
    p.add_argument("-n", "--n-predict", "--predict", "--max-tokens", dest="max_tokens", type=n_predict,
                   default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"most tokens of a reply, -1 no limit (default: {DEFAULT_MAX_TOKENS}); it ends earlier at "
                        f"the end of the model's turn or when the context is full")
    add_ctx_size(p, f"the model's training context, at most {MAX_DEFAULT_CTX}; the whole conversation's")
    add_backend_options(p)
    add_sampling_options(p)
    add_grammar_options(p)
    add_check_finite(p)
    add_flash_attn(p)
    add_debug(p)
    return p


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        inp: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap them
    err = err or sys.stderr
    inp = inp or sys.stdin
    from pyggml.models.chat import ChatSession, ChatTemplate, ConversationTooLongError

    path = builtin_model_path() if args.model is None else check_model_path(args.model)
    plan = plan_from_args(args)
    settings = settings_from_args(args)
    chat_template = chat_template_args(args)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    sampler = make_sampler(args, seed)
    grammar = grammar_source(args)
    hp = read_hparams(path)  # the header only: the training context gives the default -c
    n_ctx = context_size(args.ctx, hp.n_ctx_train, min(hp.n_ctx_train, MAX_DEFAULT_CTX))
    warn_context(n_ctx, hp.n_ctx_train, "pyggml chat", err)
    max_tokens = args.max_tokens if args.max_tokens >= 0 else n_ctx  # -1: until the turn ends or the context is full

    model = load_model(path, plan, settings, n_ctx, hp.n_layer, args.threads, err, "pyggml chat")
    try:
        template = ChatTemplate.from_model(model, chat_template.source, chat_template.name)
        session = ChatSession(model, system=args.system, template=template, template_kwargs=chat_template.kwargs)
        if grammar is not None:
            sampler.grammar = compile_grammar(grammar, model.tokenizer).matcher()
        interactive = inp.isatty()
        read = _line_reader(inp, out, interactive)
        if template.is_fallback:
            print(f"note: '{path.name}' has no chat template: chatting in ChatML (llama.cpp's default), which "
                  f"the model may not know", file=err)
        if interactive:
            print(f"chatting with {path.name} (context {n_ctx} tokens); /exit or Ctrl-D ends", file=err)
        turns = n_gen = n_eval = n_reused = 0
        t_gen = 0.0
        first = args.prompt  # -p: the first message, then stdin's
        while True:
            if first is not None:
                text, first = first, None
                if interactive:
                    print(f"> {text}", file=out)  # as if typed, as llama-cli echoes it
            else:
                text = read()
            if text is None:  # EOF
                break
            if text.strip() in EXIT_COMMANDS:
                break
            if not text.strip():
                continue
            if grammar is not None:
                sampler.grammar.reset()  # each reply follows the grammar from its start
            try:
                pieces = session.send(text, max_tokens, sampler)
            except ConversationTooLongError as e:
                raise CLIError(f"{e} (raise -c/--ctx-size)") from None
            t0 = time.perf_counter()
            try:
                for piece in pieces:
                    out.write(piece)
                    out.flush()
            except KeyboardInterrupt:
                if not interactive:
                    raise
                pieces.close()  # Ctrl-C on a terminal stops the reply, as llama-cli: the chat goes on
                print(" (interrupted)", file=err)
            t_gen += time.perf_counter() - t0
            out.write("\n")
            out.flush()
            turns += 1
            n_gen += len(session.tokens)
            n_eval += session.n_prompt - session.n_reused
            n_reused += session.n_reused
            if session.stop_reason == "context":
                print(f"(the reply filled the context of {n_ctx} tokens: the chat ends here; raise -c/--ctx-size)",
                      file=err)
                break
        print(f"{turns} turn(s), seed {seed}: {n_eval} prompt tokens evaluated ({n_reused} kept in the cache from "
              f"earlier turns), {n_gen} generated in {t_gen:.2f} s", file=err)
    finally:
        model.free()
    return 0


def _line_reader(inp: TextIO, out: TextIO, interactive: bool) -> Any:
    """A function giving the next line without its newline, None at EOF. On a terminal: input() after a
    "> " prompt, with line editing and history where the readline module exists."""
    if interactive and inp is sys.stdin and out is sys.stdout:
        try:
            importlib.import_module("readline")  # loading it gives input() line editing and history
        except ImportError:
            pass

        def read_tty() -> str | None:
            try:
                return input("> ")
            except EOFError:
                print(file=out)
                return None

        return read_tty

    def read() -> str | None:
        if interactive:
            out.write("> ")
            out.flush()
        line = inp.readline()
        if not line:
            if interactive:
                out.write("\n")
            return None
        return line.rstrip("\r\n")

    return read
