"""Where a decode step's time goes outside the products: a model decodes N tokens one at a time, each step timed
by part, medians over the steps printed.

Parts of a step (ms, medians over the steps; the parts' medians need not add up to the step's):

- `runner calls`: the graph runner's calls (kernels.graph_runner) beyond its steps, which are timed in native code
  (the cycle counter) and counted under the parts below: a product's last step under `products`, the steps
  before it (src1 converted, MUL_MAT_ID's routing) under `mul_mat prep`, the other nodes' under `other kernels`;
- `products`: the MUL_MAT and MUL_MAT_ID jobs in native code, on the caller and the kernel threads (from the job's
  start on the caller to its last item done), and those nodes computed on the caller alone;
- `mul_mat prep`: the rest of a threaded product node's compute: src1 quantized, copied or routed, and its Python;
- `hand-offs`: posting a threaded product to the kernel threads and waking them (POOL.run around the job);
- `other kernels`: every other node's compute (for one token these are small: mostly their Python dispatch);
- `node loop`: the graph compute's Python between the nodes (the plan's checks, the loop);
- `model`: the step outside the graph compute (the batch's inputs, the scheduler, the logits);
- `sampler`: the default `Sampler` on the step's logits.

`outside products` is the step's share outside `products`. Per op kind: calls and ms per step, us per call (a
node in a graph runner's run: its steps' native time). PYGGML_CPU_GRAPH_RUNNER=0 profiles the step without the
runner; "barrier" runs are timed whole, as kind RUNNER.

    python benchmarks/profile_decode_step.py [--model PATH] [--tokens 32] [--threads 2] [--ctx N] [--kv-type f16]

The default model is the random LLaMA at TinyLlama-1.1B's shapes in Q4_0 (random_1b_model.py's F16 file made
into Q4_0 by bench_vs_llamacpp.py); a machine shared with other jobs moves absolute times: read the shares.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

import pyggml.models as pm
from pyggml.backends.cpu import backend as cpu_backend
from pyggml.backends.cpu import plan as cpu_plan
from pyggml.backends.cpu.kernels import matmul
from pyggml.backends.cpu.kernels.atomics import cycle_counter
from pyggml.backends.cpu.kernels.graph_runner import LEAD, GraphRun
from pyggml.ggml_backend import tensor_get_numpy, tensor_set
from pyggml.models.sampling import Sampler
from pyggml.testing import llamacpp

Replay = dict[str, tuple[int, float]]
PRODUCT_OPS = ("MUL_MAT", "MUL_MAT_ID")  # nodes whose native jobs count as `products`
RUNNER = "RUNNER"  # the op kind of a run of nodes the graph runner computes in one native call
PARTS = ("products", "runner calls", "mul_mat prep", "hand-offs", "other kernels", "node loop", "model", "sampler")


class StepTimes:
    """One step's seconds by part, and each node's by op kind (a threaded product's hand-off and prep apart)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self.ops: dict[str, list[float]] = collections.defaultdict(list)
        self.handoffs: list[float] = []
        self.preps: list[float] = []
        self.run_nodes: list[int] = []  # the nodes of each run the graph runner computed
        self.graph = 0.0


class Probe:
    """Hooks on the CPU backend's plan compute and on MUL_MAT's POOL that only take timestamps (a few per node);
    `close_step` sorts them into the step's parts."""

    def __init__(self) -> None:
        self.pool_run = matmul.POOL.run
        matmul.POOL.run = self._pool_run  # type: ignore[method-assign]
        cpu_backend.plan_compute = self._plan_compute
        # per plan compute: its runs' nodes, its timestamps, the graph runner's per step (cycles)
        self.runs: list[tuple[list[list[Any]], list[float], list[tuple[tuple[int, ...], np.ndarray] | None]]] = []
        self.cycle_seconds = 1 / cycles_per_second()
        self.pool: list[float] = []  # per POOL.run: its start, the job's start and end, its end

    def _timed(self, native: Callable[..., None]) -> Callable[..., None]:
        marks = self.pool

        def timed(*args: Any) -> None:
            marks.append(time.perf_counter())
            native(*args)
            marks.append(time.perf_counter())

        return timed

    def _pool_run(self, shared: Callable[..., object], desc: np.ndarray, n_workers: int) -> None:
        marks = self.pool
        marks.append(time.perf_counter())
        self.pool_run(self._timed(shared), desc, n_workers)  # `shared`: the job's share on the caller
        marks.append(time.perf_counter())

    def _plan_compute(self, plan: cpu_plan.CPUPlan) -> None:
        clock = time.perf_counter
        stamps = [clock()]
        computes = cpu_plan.plan_computes(plan)
        stamps.append(clock())
        native: list[tuple[tuple[int, ...], np.ndarray] | None] = []
        for fn in computes:
            cycles = fn.record() if isinstance(fn, GraphRun) and fn.mode == LEAD else None
            fn()
            stamps.append(clock())
            if isinstance(fn, GraphRun):  # "barrier" runs untimed inside: no steps
                seconds = np.zeros(0) if cycles is None else np.diff(cycles) * self.cycle_seconds
                native.append(((), seconds) if cycles is None else (fn.node_steps, seconds))
            else:
                native.append(None)
        self.runs.append((plan.run_nodes, stamps, native))

    def close_step(self) -> StepTimes:
        """The timestamps since the last call as a StepTimes (model and sampler left to the caller)."""
        step = StepTimes()
        pool = self.pool
        starts = pool[0::4]
        p = 0
        for run_nodes, stamps, native in self.runs:
            step.graph += stamps[-1] - stamps[0]
            for nodes, timed, t0, t1 in zip(run_nodes, native, stamps[1:-1], stamps[2:], strict=True):
                dt = t1 - t0
                if timed is not None:
                    self._runner_nodes(step, nodes, *timed, dt)
                    continue
                node = nodes[0]
                step.ops[node.op.name].append(dt)
                while p < len(starts) and starts[p] < t0:  # posted outside any node's compute
                    p += 1
                pooled = job = 0.0
                while p < len(starts) and starts[p] < t1:  # the hand-offs inside this node's compute
                    run0, job0, job1, run1 = pool[4 * p:4 * p + 4]
                    pooled += run1 - run0
                    job += job1 - job0
                    p += 1
                if node.op.name not in PRODUCT_OPS:
                    step.parts["other kernels"] += dt
                    continue
                step.parts["products"] += job if pooled else dt
                if pooled:
                    step.handoffs.append(pooled - job)
                    step.preps.append(dt - pooled)
        step.parts["hand-offs"] = sum(step.handoffs)
        step.parts["mul_mat prep"] = sum(step.preps)
        step.parts["node loop"] = (step.graph - sum(sum(times) for times in step.ops.values() if times)
                                   - step.parts["runner calls"] + sum(step.ops.get(RUNNER, [])))
        self.runs, self.pool = [], []
        return step

    @staticmethod
    def _runner_nodes(step: StepTimes, nodes: list[Any], counts: tuple[int, ...], seconds: np.ndarray,
                      dt: float) -> None:
        """A graph runner's run: each node's steps timed in native code (a product's last step the product, the
        ones before it src1's conversion), the rest of the call `runner calls`."""
        step.run_nodes.append(len(nodes))
        step.parts["runner calls"] += dt - float(seconds.sum())
        if not counts:
            step.ops[RUNNER].append(dt)
            return
        at = 0
        for node, n in zip(nodes, counts, strict=True):
            node_seconds = seconds[at:at + n]
            at += n
            step.ops[node.op.name].append(float(node_seconds.sum()))
            if node.op.name in PRODUCT_OPS:
                step.parts["products"] += float(node_seconds[-1])
                step.preps.append(float(node_seconds[:-1].sum()))
            else:
                step.parts["other kernels"] += float(node_seconds.sum())

    def replay_step(self, model: Any, token: int, repeats: int) -> Replay:
        """One more step, each node computed `repeats` times in a row as it comes (its inputs as the step has
        them): per op kind, nodes and the sum of their medians (s). The node's data hot in this core's caches, no
        other node between: its cost alone. The nodes' results are put back after each untimed, so a node that
        writes into its source (an in-place ADD) computes the same sum every time."""
        out: Replay = {}
        clock = time.perf_counter

        def plan_compute(plan: cpu_plan.CPUPlan) -> None:
            for nodes, fn in zip(plan.run_nodes, cpu_plan.plan_computes(plan), strict=True):
                node = nodes[0] if len(nodes) == 1 and not isinstance(fn, GraphRun) else None
                before = [(n, tensor_get_numpy(n).copy()) for n in nodes]
                times = []
                for _ in range(repeats):
                    for n, values in before:
                        tensor_set(n, values)
                    t = clock()
                    fn()
                    times.append(clock() - t)
                kind = RUNNER if node is None else node.op.name
                n, total = out.get(kind, (0, 0.0))
                out[kind] = (n + 1, total + statistics.median(times))

        cpu_backend.plan_compute = plan_compute
        try:
            model.eval_last([token])
        finally:
            cpu_backend.plan_compute = self._plan_compute
        return out


@njit
def _cycles() -> int:
    return cycle_counter()


def cycles_per_second() -> float:
    """The cycle counter's rate, against perf_counter over 50 ms."""
    _cycles()
    c0, t0 = _cycles(), time.perf_counter()
    time.sleep(0.05)
    return (_cycles() - c0) / (time.perf_counter() - t0)


def default_model() -> Path:
    return llamacpp.paths().root / "variants" / "random-tinyllama-1.1b-Q4_0.gguf"


def profile(path: Path, n_tokens: int, n_threads: int, n_warmup: int, replays: int, n_ctx: int | None = None,
            kv_type: str = "f32") -> tuple[list[tuple[float, StepTimes]], Replay]:
    """The timed steps (seconds, parts), then the last step's nodes replayed (Probe.replay; {} with 0 replays)."""
    model = pm.load(path, n_ctx=n_ctx or n_tokens + n_warmup + 9, n_threads=n_threads, kv_type=kv_type,
                    progress=False)
    probe = Probe()
    sampler = Sampler(seed=1)
    history = [1]
    steps: list[tuple[float, StepTimes]] = []
    try:
        for i in range(n_warmup + n_tokens):
            t0 = time.perf_counter()
            logits = model.eval_last([history[-1]])
            t1 = time.perf_counter()
            history.append(int(sampler.sample(logits, history)))
            t2 = time.perf_counter()
            step = probe.close_step()
            step.parts["sampler"] = t2 - t1
            step.parts["model"] = (t1 - t0) - step.graph
            if i >= n_warmup:
                steps.append((t2 - t0, step))
        replayed = probe.replay_step(model, history[-1], replays) if replays else {}
    finally:
        model.free()
    return steps, replayed


def report(steps: list[tuple[float, StepTimes]], replayed: Replay) -> None:
    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    def us(values: list[float]) -> float:
        return statistics.median(values) * 1e6 if values else 0.0

    totals = [t for t, _ in steps]
    print(f"step: {ms(totals):.2f} ms (median of {len(steps)}; min {min(totals) * 1e3:.2f}, "
          f"max {max(totals) * 1e3:.2f})")
    for part in PARTS:
        print(f"  {part:16s} {ms([s.parts[part] for _, s in steps]):8.3f} ms")
    outside = [1 - s.parts["products"] / t for t, s in steps]
    print(f"outside products: {statistics.median(outside) * 100:.1f}% of the step (median of the steps' shares)")
    runs = [len(s.run_nodes) for _, s in steps]
    print(f"graph runner: {statistics.median(runs):.0f} runs per step, "
          f"{statistics.median([sum(s.run_nodes) for _, s in steps]):.0f} nodes in them")
    handoffs = [h for _, s in steps for h in s.handoffs]
    preps = [p for _, s in steps for p in s.preps]
    print(f"threaded products: {len(handoffs) / len(steps):.0f} per step; per product (median of all): "
          f"hand-off {us(handoffs):.1f} us, prep {us(preps):.1f} us")
    print("per op kind: calls per step, ms per step (median of the steps), us per call (median of all calls)"
          + ("; one more step with each node repeated: ms, us per call" if replayed else ""))
    kinds = sorted({op for _, s in steps for op in s.ops}, key=lambda op: -ms([sum(s.ops[op]) for _, s in steps]))
    for op in kinds:
        calls = statistics.median(len(s.ops[op]) for _, s in steps)
        alone = ""
        if op in replayed:
            n, total = replayed[op]
            alone = f"   {total * 1e3:8.3f} {total / n * 1e6:9.1f}"
        print(f"  {op:12s} {calls:6.0f} {ms([sum(s.ops[op]) for _, s in steps]):8.3f} "
              f"{us([t for _, s in steps for t in s.ops[op]]):9.1f}{alone}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the random 1B in Q4_0)")
    parser.add_argument("--tokens", type=int, default=32, help="decode steps timed (default 32)")
    parser.add_argument("--warmup", type=int, default=3, help="decode steps before the timed ones (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=None,
                        help="the context, as -c (default: the steps' tokens and a few more)")
    parser.add_argument("--kv-type", default="f32", help="the KV cache's type, as -ctk and -ctv (default f32)")
    parser.add_argument("--replays", type=int, default=50,
                        help="times each node of one more step is computed in a row (default 50; 0: none)")
    args = parser.parse_args()
    path = args.model or default_model()
    print(f"{path.name}, {args.threads} threads, {args.tokens} tokens"
          + (f", context {args.ctx}" if args.ctx else "") + f", KV {args.kv_type}")
    report(*profile(path, args.tokens, args.threads, args.warmup, args.replays, args.ctx, args.kv_type))


if __name__ == "__main__":
    main()
