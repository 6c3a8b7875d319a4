"""The CPU kernels' long fuzz: --graphs random graphs (100,000 by default) over every op the CPU backend has
a kernel for, computed in --jobs worker processes between guard bytes (see `pyggml.testing.op_fuzz`).

Graph i of --seed is the same graph on every machine: a finding prints its graph's index, op, op_params,
shapes and strides, which `python benchmarks/fuzz_ops.py --seed S --replay I` computes again in this process
(under a debugger, say). Progress every --every graphs (graphs done, their outcomes, the findings so far);
at the end the counts of outcomes, the ops fuzzed and computed, and the findings grouped by kind, op,
exception and the innermost pyggml frame. Exits 1 if there is a finding.

    python benchmarks/fuzz_ops.py [--graphs 100000] [--seed 0] [--start 0] [--jobs 2] [--timeout 120]
    python benchmarks/fuzz_ops.py --seed 0 --replay 1234
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from pyggml.testing.op_fuzz import BATCH_INVARIANT_ENV, Summary, replay, run_fuzz


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="the first graph's index")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a graph may take before it is a hang")
    ap.add_argument("--every", type=int, default=5000, help="graphs between progress lines")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="the workers' CPU backend batch-invariant (pyggml serve's kernels)")
    ap.add_argument("--replay", type=int, default=None, help="compute this graph here and print it")
    args = ap.parse_args()
    if args.batch_invariant:
        os.environ[BATCH_INVARIANT_ENV] = "1"  # the workers inherit it
    if args.replay is not None:
        spec, outcome = replay(args.seed, args.replay)
        print(spec.describe())
        print(outcome)
        return
    t0 = time.monotonic()
    shown = [0]

    def progress(s: Summary) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
        print(f"{s.graphs}/{args.graphs} graphs, {time.monotonic() - t0:.0f} s: {counts}", flush=True)
        for f in s.findings[shown[0]:]:
            print(f"  finding: graph {f['i']} {f['status']} {f.get('op', '?')} {f.get('exc', '')} "
                  f"{f.get('frame', '')}: {f.get('message', '')[:200]}", flush=True)
        shown[0] = len(s.findings)

    summary = run_fuzz(args.seed, args.graphs, start=args.start, jobs=args.jobs, timeout=args.timeout,
                       progress=progress, progress_every=args.every)
    print(f"graphs {args.start}..{args.start + args.graphs - 1} of seed {args.seed}, {args.jobs} workers, "
          f"{time.monotonic() - t0:.0f} s")
    summary.report(sys.stdout)
    sys.exit(1 if summary.findings else 0)


if __name__ == "__main__":
    main()
