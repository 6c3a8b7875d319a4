"""`pyggml bench MODEL.gguf [-p 128] [-n 32] [-r 3]`: prompt and generation speed, like llama-bench.

What llama-bench measures and this repeats: `pp<P>` evaluates a batch of P
random tokens on an empty cache (prompt processing), `tg<N>` decodes N tokens
one at a time after a BOS token (text generation); one untimed warm-up run of
each test first (it plans graphs and touches the mapped weights), then `-r`
timed repetitions, reported as mean ± standard deviation of tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

import numpy as np

from pyggml.cli._common import (
    CLIError,
    add_backend_options,
    add_check_finite,
    add_debug,
    add_flash_attn,
    check_model_path,
    fmt_bytes,
    fmt_count,
    init_backends,
    non_negative_int,
    plan_from_args,
    positive_int,
    table,
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="measure prompt and generation tokens/s (like llama-bench)",
                       description="Measure prompt processing (pp: a batch of P random tokens) and text generation "
                                   "(tg: N tokens one by one) in tokens/s, as mean ± std over repetitions after a "
                                   "warm-up run, like llama.cpp's llama-bench.")
    p.add_argument("model", metavar="MODEL.gguf", help="a LLaMA-family GGUF file")
    p.add_argument("-p", "--n-prompt", type=non_negative_int, default=128, metavar="P",
                   help="prompt tokens of the pp test, 0 skips it (default: 128)")
    p.add_argument("-n", "--n-gen", type=non_negative_int, default=32, metavar="N",
                   help="generated tokens of the tg test, 0 skips it (default: 32)")
    p.add_argument("-r", "--repetitions", type=positive_int, default=3, metavar="R",
                   help="timed repetitions of each test (default: 3)")
    p.add_argument("--batch", type=positive_int, default=512, metavar="B",
                   help="batch size of prompt processing (default: 512)")
    add_backend_options(p)
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random tokens (default: 0)")
    add_check_finite(p)
    add_flash_attn(p)
    add_debug(p)
    return p


def _time_pp(model: Any, tokens: np.ndarray) -> float:
    model.reset()
    t0 = time.perf_counter()
    model.eval_last(tokens)
    return time.perf_counter() - t0


def _time_tg(model: Any, first: int, tokens: np.ndarray) -> float:
    """llama-bench's test_gen: decode `first`, then one token at a time (the next ids are random,
    so the time does not depend on what the model writes)."""
    model.reset()
    t0 = time.perf_counter()
    model.eval_last([first])
    for tok in tokens[:-1]:
        model.eval_last([int(tok)])
    return time.perf_counter() - t0


def _backend_names(model: Any) -> str:
    """The backend column: the names in order joined by '+', a run of one name as NAME×K ("CPU×3+Torch(cpu)")
    so that many backends stay readable."""
    runs: list[list[Any]] = []
    for b in model.backends:
        if runs and runs[-1][0] == b.name():
            runs[-1][1] += 1
        else:
            runs.append([b.name(), 1])
    return "+".join(name if k == 1 else f"{name}×{k}" for name, k in runs)


def _layer_counts(model: Any) -> str:
    """The layers of each backend, in --backend order, as llama-bench writes a split: "1/1/2"."""
    return "/".join(str(sum(x is b for x in model.layer_backend)) for b in model.backends)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up per call: tests and callers swap sys.stdout
    err = err or sys.stderr
    from pyggml.models import load

    path = check_model_path(args.model)
    if args.n_prompt == 0 and args.n_gen == 0:
        raise CLIError("nothing to measure: -p and -n are both 0")
    plan = plan_from_args(args)  # the options' syntax, before anything is loaded
    objs = init_backends(plan.names, args.threads)
    n_ctx = max(args.n_prompt, args.n_gen, 1)
    model = load(path, objs, n_ctx=n_ctx, **plan.load_kwargs(objs), n_batch=min(args.batch, n_ctx),
                 progress=err.isatty(), check_finite=args.check_finite, flash_attn=args.flash_attn)
    try:
        rng = np.random.default_rng(args.seed)
        n_vocab = model.hparams.n_vocab
        bos = model.token_bos()
        first = bos if bos is not None else int(rng.integers(n_vocab))
        tests: list[tuple[str, int, Any]] = []
        if args.n_prompt:
            tests.append((f"pp{args.n_prompt}", args.n_prompt,
                          lambda: _time_pp(model, rng.integers(0, n_vocab, args.n_prompt))))
        if args.n_gen:
            tests.append((f"tg{args.n_gen}", args.n_gen,
                          lambda: _time_tg(model, first, rng.integers(0, n_vocab, args.n_gen))))
        n_params = sum(t.nelements() for t in model.file)
        n_bytes = sum(t.nbytes for t in model.file)
        threads = ",".join(str(b.n_threads) for b in model.backends if hasattr(b, "n_threads")) or "-"
        # llama-bench adds a column for each placement option it was given; here: the layers of each backend
        # when there are several (whatever option placed them), and the overrides
        split = [_layer_counts(model)] if len(model.backends) > 1 else []
        ot = [",".join(args.override_tensor)] if args.override_tensor else []
        rows = [["model", "size", "params", "backend", *(["layers"] if split else []), "threads",
                 *(["ot"] if ot else []), "test", "t/s"]]
        for name, n, fn in tests:
            fn()  # warm-up: plans the graphs, pages the weights in
            rates = np.array([n / fn() for _ in range(args.repetitions)])
            std = float(rates.std(ddof=1)) if len(rates) > 1 else 0.0
            rows.append([model.file.name, fmt_bytes(n_bytes), fmt_count(n_params), _backend_names(model), *split,
                         threads, *ot, name, f"{rates.mean():.2f} ± {std:.2f}"])
        right = (1, 2, *range(4, 5 + len(split)))
        for line in table(rows, right=(*right, len(rows[0]) - 1)):
            print(line, file=out)
    finally:
        model.free()
    return 0
