"""Decode steps with the CPU graph runner's settings alternating step by step in one process (every CPU plan made
is regrouped for the step's setting), so a shared machine's load falls on each alike: per setting the median step,
and its ratio to "off" (no runner) measured in the same run.

    python benchmarks/bench_graph_runner.py --model PATH [--tokens 96] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pyggml.models as pm
from pyggml.backends.cpu import backend as cpu_backend
from pyggml.backends.cpu import plan as cpu_plan
from pyggml.models.sampling import Sampler

SETTINGS = ("off", "lead", "barrier")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=96, help="decode steps timed, all settings together")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    plans: list[cpu_plan.CPUPlan] = []
    create = cpu_backend.plan_create

    def recorded(*a: object) -> cpu_plan.CPUPlan:
        plans.append(create(*a))  # type: ignore[arg-type]
        return plans[-1]

    cpu_backend.plan_create = recorded  # type: ignore[assignment]
    model = pm.load(args.model, n_ctx=args.tokens + args.warmup + 9, n_threads=args.threads, progress=False)
    sampler = Sampler(seed=1)
    history = [1]
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    try:
        for i in range(args.warmup + args.tokens):
            setting = SETTINGS[i % len(SETTINGS)]
            for plan in plans:
                if plan.params.graph_runner != setting:
                    plan.params.graph_runner = setting
                    plan.runs, plan.run_nodes = cpu_plan.group_runs(plan.computes, plan.nodes, plan.params)
            t0 = time.perf_counter()
            logits = model.eval_last([history[-1]])
            dt = time.perf_counter() - t0
            history.append(int(sampler.sample(logits, history)))
            if i >= args.warmup:
                times[setting].append(dt)
    finally:
        model.free()
    off = statistics.median(times["off"])
    print(f"{args.model.name}, {args.threads} threads, {args.tokens} steps alternating {', '.join(SETTINGS)}")
    for s in SETTINGS:
        med = statistics.median(times[s])
        print(f"  {s:8s} {med * 1e3:8.2f} ms (min {min(times[s]) * 1e3:.2f})   x{off / med:.2f} the speed of off")


if __name__ == "__main__":
    main()
