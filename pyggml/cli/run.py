"""`pyggml run [MODEL.gguf] -p PROMPT -n N`: generate text and report how fast and how big.

Like llama.cpp's `llama-cli`: the prompt and the generated text stream to
stdout as the tokens come; the figures (load time, prompt and generation
tokens/s, memory per backend, with --verbose the scheduler's split plan) go to
stderr, so `pyggml run > out.txt` keeps only the text. Without MODEL it runs
the model shipped inside the package.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any, TextIO

from pyggml.cli._common import (
    GGUF_MODEL,
    CLIError,
    add_backend_options,
    add_check_finite,
    add_ctx_size,
    add_debug,
    add_flash_attn,
    add_model,
    builtin_model_path,
    check_model_path,
    context_size,
    finite_float,
    fmt_bytes,
    load_model,
    n_predict,
    non_negative_int,
    plan_from_args,
    read_hparams,
    settings_from_args,
    table,
    warn_context,
)

DEFAULT_PROMPT = "The module"  # how the built-in model's documents start most often
DEFAULT_N_PREDICT = 64
MAX_DEFAULT_CTX = 512


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help=f"generate text with a {GGUF_MODEL} (the built-in one without MODEL)",
                       description=f"Generate text with a {GGUF_MODEL}: stream it, then print load time, "
                                   "prompt and generation tokens/s and memory per backend (on stderr). Without "
                                   "MODEL it runs the small model shipped with pyggml (trained on the docstrings "
                                   "of Python's standard library).")
    add_model(p, f"a {GGUF_MODEL} file (default: the built-in model)")
    p.add_argument("-p", "--prompt", default=None, help=f"the prompt (default: {DEFAULT_PROMPT!r} for the built-in "
                                                        f"model, the BOS token alone for a file)")
    p.add_argument("-n", "--n-predict", "--predict", type=n_predict, default=DEFAULT_N_PREDICT, metavar="N",
                   help=f"tokens to generate, -1 no limit (default: {DEFAULT_N_PREDICT}); it stops earlier at the "
                        f"end-of-text token or when the context is full")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on after end-of-generation tokens, until -n tokens or a full context (llama.cpp's "
                        "--ignore-eos)")
    add_ctx_size(p, f"the model's training context, at most {MAX_DEFAULT_CTX}")
    add_backend_options(p)
    add_sampling_options(p)
    add_grammar_options(p)
    add_check_finite(p)
    add_flash_attn(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print the model, the scheduler's split plan and the compute memory report")
    add_debug(p)
    return p


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """--temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed (run's and chat's)."""
    p.add_argument("--temp", "--temperature", type=finite_float, default=0.8,
                   help="temperature; <= 0 is greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="keep the K most likely tokens, 0 keeps all (default: 40)")
    p.add_argument("--top-p", type=finite_float, default=0.95, help="nucleus sampling threshold (default: 0.95)")
    p.add_argument("--min-p", type=finite_float, default=0.05,
                   help="drop tokens below min-p times the top probability (default: 0.05)")
    p.add_argument("--repeat-penalty", type=finite_float, default=1.0,
                   help="penalty of the last 64 tokens, 1.0 is off (default: 1.0, llama.cpp's)")
    p.add_argument("-s", "--seed", type=non_negative_int, default=None,
                   help="sampling seed (default: random, printed)")


def add_grammar_options(p: argparse.ArgumentParser) -> None:
    """--grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file (llama.cpp's; run's, chat's, serve's)."""
    p.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="a GBNF grammar (llama.cpp's grammars/ syntax, start rule 'root') the output must follow")
    p.add_argument("--grammar-file", default=None, metavar="FILE", help="read the --grammar from FILE")
    p.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="a JSON schema the output must follow (JSON text; {} for any JSON object)")
    p.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE", help="read the --json-schema from FILE")


def grammar_source(args: argparse.Namespace) -> tuple[str, Any, str] | None:
    """The grammar the options give: ("gbnf", text, option) or ("json_schema", schema, option), files read and
    JSON parsed; None without one. CLIError naming the option for a file that cannot be read, bad JSON or two
    grammars."""
    given = [(name, getattr(args, name.lstrip("-").replace("-", "_"), None))
             for name in ("--grammar", "--grammar-file", "--json-schema", "--json-schema-file")]
    given = [(name, value) for name, value in given if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise CLIError(f"{given[0][0]} and {given[1][0]} both constrain the output: give one")
    name, text = given[0]
    if name.endswith("-file"):
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"{name}: cannot read '{text}': {e}") from None
    if name.startswith("--grammar"):
        return "gbnf", text, name
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise CLIError(f"{name}: not JSON: {e}") from None
    return ("json_object", None, name) if schema == {} else ("json_schema", schema, name)  # llama.cpp: {} an object


def compile_grammar(source: tuple[str, Any, str], tokenizer: Any) -> Any:
    """The `Grammar` of grammar_source's answer for `tokenizer`'s vocabulary (CLIError naming the option)."""
    from pyggml.models.grammar import Grammar, GrammarError

    kind, spec, name = source
    try:
        if kind == "gbnf":
            return Grammar.from_gbnf(tokenizer, spec, name)
        if kind == "json_object":
            return Grammar.json_object(tokenizer, name)
        return Grammar.from_json_schema(tokenizer, spec, name)
    except GrammarError as e:
        raise CLIError(str(e)) from None


def make_sampler(args: argparse.Namespace, seed: int) -> Any:
    """The sampler of the options; None (the model's greedy argmax) for --temp <= 0 with no penalty."""
    try:
        from pyggml.models.sampling import Sampler
    except ImportError:
        if args.temp <= 0:
            return None
        raise CLIError("sampling needs pyggml.models.sampling, which is missing here; use --temp 0") from None
    if args.top_k < 0:
        raise CLIError(f"--top-k must be >= 0, got {args.top_k}")
    if not 0.0 < args.top_p <= 1.0:
        raise CLIError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        raise CLIError(f"--min-p must be in [0, 1], got {args.min_p}")
    if args.repeat_penalty <= 0:
        raise CLIError(f"--repeat-penalty must be > 0, got {args.repeat_penalty}")
    return Sampler(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                   repeat_penalty=args.repeat_penalty, repeat_last_n=64, seed=seed)


def split_plan(model: Any) -> list[str]:
    """The plan in words: which layers sit on which backend, then the scheduler's splits of the last graph
    (which backend computes which nodes, what is copied in) and whether it was reused."""
    lines: list[str] = []
    runs: list[tuple[str, int, int]] = []
    for il, b in enumerate(model.layer_backend):
        name = _backend_label(model, b)
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1], il)
        else:
            runs.append((name, il, il))
    lines.append(f"layers: {len(runs)} part(s) over {len({id(b) for b in model.backends})} backend(s)")
    for name, a, b in runs:
        lines.append(f"  layers {a}..{b}: {name}")
    output = getattr(model, "output_backend", None)
    if output is not None and output is not model.layer_backend[-1]:  # a tensor split can put it apart
        lines.append(f"  output layer: {_backend_label(model, output)}")
    sched = model.runner.sched
    splits = list(sched.splits)
    lines.append(f"scheduler: {len(splits)} split(s) of the last graph over {len(sched.backends)} backend(s); "
                 f"{model.n_graphs_built} graph(s) built, the other batches reused one")
    for i, split in enumerate(splits):
        name = _backend_label(model, split.backend)
        names = ", ".join(t.name or "?" for t in split.inputs[:6])
        more = f", ... ({len(split.inputs)} in all)" if len(split.inputs) > 6 else ""
        lines.append(f"  split {i}: {name}, nodes {split.i_start}..{split.i_end}"
                     + (f", {len(split.inputs)} input(s) copied in: {names}{more}" if split.inputs else ""))
    if not splits:
        lines.append("  (no graph computed yet)")
    return lines


def _backend_label(model: Any, backend: Any) -> str:
    """"<name>#<index>" as model.memory() names the backends (two CPU backends stay apart)."""
    for i, b in enumerate(model.backends):
        if b is backend:
            return f"{b.name()}#{i}"
    return str(backend.name())


def print_memory(model: Any, out: TextIO) -> None:
    """Each backend's bytes, and the types of the KV cache it holds (llama.cpp's "K (f16), V (f16)")."""
    rows = [["backend", "weights", "KV cache", "KV types", "compute", "total"]]
    kv_types = f"K ({model.kv.type_k.name.lower()}), V ({model.kv.type_v.name.lower()})"
    for name, m in model.memory().items():
        total = m["weights"] + m["kv_cache"] + m["compute"]
        rows.append([name, fmt_bytes(m["weights"]), fmt_bytes(m["kv_cache"]), kv_types if m["kv_cache"] else "",
                     fmt_bytes(m["compute"]), fmt_bytes(total)])
    for line in table(rows, right=(1, 2, 4, 5)):
        print(line, file=out)


class TextStream:
    """Prints the text of a growing token list as it grows: decoding the whole list each time keeps
    SentencePiece's spaces and multi-byte characters (split over byte tokens) right."""

    def __init__(self, model: Any, prompt_ids: list[int], out: TextIO) -> None:
        self.model = model
        self.ids = list(prompt_ids)
        self.base = model.detokenize(self.ids)
        self.printed = 0
        self.out = out

    def add(self, tok: int) -> None:
        self.ids.append(tok)
        text = self.model.detokenize(self.ids)[len(self.base):]
        if text.endswith("\ufffd"):
            return  # an incomplete UTF-8 character: wait for its other bytes
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap sys.stdout
    err = err or sys.stderr
    builtin = args.model is None
    path = builtin_model_path() if builtin else check_model_path(args.model)
    plan = plan_from_args(args)  # the options' syntax, before anything is loaded
    settings = settings_from_args(args)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    sampler = make_sampler(args, seed)
    grammar = grammar_source(args)

    hp = read_hparams(path)  # the header only: the training context gives the default -c
    n_ctx = context_size(args.ctx, hp.n_ctx_train, min(hp.n_ctx_train, MAX_DEFAULT_CTX))
    warn_context(n_ctx, hp.n_ctx_train, "pyggml run", err)

    t0 = time.perf_counter()
    model = load_model(path, plan, settings, n_ctx, hp.n_layer, args.threads, err, "pyggml run",
                       args.verbose)
    t_load = time.perf_counter() - t0
    try:
        if grammar is not None:
            sampler.grammar = compile_grammar(grammar, model.tokenizer).matcher()
        model.runner.report_memory = args.verbose
        t0 = time.perf_counter()
        _warm_up(model)
        t_warm = time.perf_counter() - t0
        prompt = args.prompt if args.prompt is not None else (DEFAULT_PROMPT if builtin else "")
        prompt_ids = model.tokenize(prompt)
        if not prompt_ids:
            raise CLIError("the prompt has no tokens (and the model adds no BOS token); give one with -p")
        if len(prompt_ids) >= n_ctx:
            raise CLIError(f"the prompt has {len(prompt_ids)} tokens, the context only {n_ctx} (raise -c/--ctx-size)")
        if args.verbose:
            hp = model.hparams
            print(f"model: {path} ({model.file.file_size / 2**20:.2f} MiB), n_layer {hp.n_layer}, n_embd {hp.n_embd}, "
                  f"n_head {hp.n_head}/{hp.n_head_kv}, n_vocab {hp.n_vocab}, n_ctx {n_ctx}", file=err)
            print(f"backends: {', '.join(_backend_label(model, b) for b in model.backends)}; layers: "
                  + ", ".join(f"{i}:{_backend_label(model, b)}" for i, b in enumerate(model.layer_backend)), file=err)
            err.writelines(f"{_backend_label(model, b)}: {b.describe()}\n" for b in model.backends if b.describe())
            if model.overridden:
                moved = [f"{name}:{_backend_label(model, b)}" for name, b in model.overridden.items()]
                more = f", ... ({len(moved)} in all)" if len(moved) > 6 else ""
                print(f"placed by --override-tensor: {', '.join(moved[:6])}{more}", file=err)
        out.write(prompt)
        out.flush()
        stream = TextStream(model, prompt_ids, out)
        n_gen = 0
        t_first = t_end = t_start = time.perf_counter()
        limit = args.n_predict if args.n_predict >= 0 else n_ctx  # -1: until the end of text or a full context
        for tok in model.generate(prompt_ids, limit, sampler, stop_at_eos=not args.ignore_eos):
            if n_gen == 0:
                t_first = time.perf_counter()  # the prompt's evaluation and the first sample
            n_gen += 1
            stream.add(tok)
        t_end = time.perf_counter()
        out.write("\n")
        out.flush()

        n_prompt = len(prompt_ids)
        t_prompt = (t_first if n_gen else t_end) - t_start
        n_eval = max(0, n_gen - 1)  # each token after the first was evaluated before the next was sampled
        t_eval = t_end - t_first if n_gen else 0.0
        stop = ""
        if n_gen < limit:
            stop = " (end of text)" if model.n_past < n_ctx else " (context full)"
        print("", file=err)
        print(f"seed: {seed}   sampling: temp {args.temp}, top-k {args.top_k}, top-p {args.top_p}, "
              f"min-p {args.min_p}, repeat-penalty {args.repeat_penalty}", file=err)
        print(f"load time:  {t_load * 1000:9.1f} ms   (+ {t_warm * 1000:.1f} ms warm-up)", file=err)
        print(f"prompt:     {t_prompt * 1000:9.1f} ms / {n_prompt:4d} tokens ({_rate(n_prompt, t_prompt)} tokens/s)",
              file=err)
        print(f"generation: {t_eval * 1000:9.1f} ms / {n_eval:4d} tokens ({_rate(n_eval, t_eval)} tokens/s)"
              f"   {n_gen} generated{stop}", file=err)
        print_memory(model, err)
        if args.verbose:
            for line in split_plan(model):
                print(line, file=err)
            for report in getattr(model.runner, "memory_reports", []):
                print(f"compute memory of the largest graph: {report.summary()}", file=err)
    finally:
        model.free()
    return 0


def _warm_up(model: Any) -> None:
    """llama.cpp's warm-up: one batch and one single-token decode before anything is timed, so the
    figures leave out what happens once (compiling kernels, paging the mapped weights in)."""
    first = model.token_bos() or 0
    if model.n_ctx >= 3:
        model.eval_last([first, first])
        model.eval_last([first])
    model.reset()


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:8.2f}" if n and seconds > 0 else "     n/a"
