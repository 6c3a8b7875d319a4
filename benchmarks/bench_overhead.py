"""Python overhead per node: a 1,000-node graph of 4-element ADDs computed through a plan.

The peer is the same numpy calls in a plain Python loop (`np.add(x, b, out=y)`
per node), measured in the same run. Per-node time of the plan minus the
peer's is what the backend adds on top of the kernels themselves (goal: at
most 5 us per node). Also shown: `graph_compute`, which makes a plan on every
call.

    python benchmarks/bench_overhead.py [--nodes 1000] [--repeats 21]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from timing import median_time

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set
from pyggml.testing import alloc_ctx_tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    n = args.nodes

    backend = cpu_init()
    ctx = Context(mem_size=(n + 16) * 1024, no_alloc=True)
    a = ctx.new_tensor_1d(GGMLType.F32, 4).set_name("a")
    b = ctx.new_tensor_1d(GGMLType.F32, 4).set_name("b")
    x = a
    for i in range(n):
        x = ctx.add(x, b).set_name(f"x{i}")
    graph = ctx.new_graph(size=n + 16)
    graph.build_forward_expand(x)
    assert graph.n_nodes == n
    alloc_ctx_tensors(ctx, backend)
    tensor_set(a, np.zeros(4, np.float32))
    tensor_set(b, np.ones(4, np.float32))

    t0 = time.perf_counter()
    plan = backend.graph_plan_create(graph)
    t_create = time.perf_counter() - t0
    t_plan = median_time(lambda: backend.graph_plan_compute(plan), args.repeats)
    assert np.array_equal(tensor_get_numpy(x), np.full(4, n, np.float32))
    t_graph = median_time(lambda: backend.graph_compute(graph), max(3, args.repeats // 4))

    # the peer: the same numpy calls in a plain loop
    xs = [np.zeros(4, np.float32) for _ in range(n + 1)]
    ones = np.ones(4, np.float32)

    def peer() -> None:
        for i in range(n):
            np.add(xs[i], ones, out=xs[i + 1])

    t_peer = median_time(peer, args.repeats)
    assert xs[n][0] == n

    us = 1e6 / n
    print(f"graph of {n} ADD nodes of 4 f32 elements, median of {args.repeats} runs")
    print(f"  plan compute      {t_plan * us:7.2f} us/node")
    print(f"  numpy loop (peer) {t_peer * us:7.2f} us/node")
    print(f"  overhead          {(t_plan - t_peer) * us:7.2f} us/node   (goal <= 5)")
    print(f"  ratio plan/peer   {t_plan / t_peer:7.2f}x")
    print(f"  graph_compute     {t_graph * us:7.2f} us/node   (plans on every call)")
    print(f"  plan create       {t_create * us:7.2f} us/node   (once)")


if __name__ == "__main__":
    main()
