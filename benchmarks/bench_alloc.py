"""Graph allocator on LLaMA-like graphs: peak bytes against the liveness lower bound and no reuse, and speed.

For each graph (llama-7B dimensions by default: measuring touches no memory,
so the size costs nothing) the graph allocator runs in measure mode, as
llama.cpp sizes its compute buffer. Figures:

- peak: the measured buffer size (max_size);
- lower bound: the largest total size of tensors alive at one node step in
  this node order (pyggml.alloc.report); peak/LB is the allocator's overhead;
- no reuse: the sum of the sizes of all non-view nodes, what a buffer needs
  when every node has memory of its own; no-reuse/peak is what reuse saves;
- time per node of `alloc_graph` (median of --repeats runs), with the peer
  measured in the same run: the same tensors placed one after another by the
  tensor allocator with no frees (the no-reuse plan), per node.

    python benchmarks/bench_alloc.py [--layers 1 8 32] [--tokens 1 512] [--repeats 5] [--small]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict

from pyggml.alloc import GraphAllocator, TensorAllocator, memory_report
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.testing.graphs import LlamaDims, build_llama_graph, place_weights

ALIGNMENT = 32  # the CPU backend's tensor alignment
MIB = 1024 * 1024


def graph_tensors(graph: Graph) -> list[Tensor]:
    """Every tensor the allocator may touch: nodes, their sources, and view sources."""
    seen: dict[int, Tensor] = {}
    for node in graph.nodes:
        for t in [node, *(s for s in node.src if s is not None)]:
            seen.setdefault(id(t), t)
            if t.view_src is not None:
                seen.setdefault(id(t.view_src), t.view_src)
    return list(seen.values())


class Fresh:
    """Puts a graph's intermediate tensors back to 'no memory' between timed runs."""

    def __init__(self, graph: Graph, keep: set[int]) -> None:
        self.state = [(t, t.view_src) for t in graph_tensors(graph) if id(t) not in keep]

    def reset(self) -> None:
        for t, view_src in self.state:
            t.data = None
            t.buffer = None
            t.view_src = view_src


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        times.append(fn())
    return statistics.median(times)


def bench_one(dims: LlamaDims, repeats: int) -> dict[str, float]:
    ctx = Context(mem_size=1 << 26, no_alloc=True)
    graph, inputs, weights = build_llama_graph(ctx, **asdict(dims))
    wtalloc = place_weights(weights)  # fake addresses, outside the compute buffer
    input_tensors = [inputs[n] for n in ("tokens", "pos", "kq_mask")]
    keep = {id(w) for w in weights}
    fresh = Fresh(graph, keep)
    no_reuse = sum(n.nbytes() for n in graph.nodes if n.view_src is None)
    owners = [n for n in graph.nodes if n.view_src is None]

    def run_galloc() -> float:
        fresh.reset()
        talloc = TensorAllocator.new_measure(ALIGNMENT)
        for t in input_tensors:
            talloc.alloc(t)  # inputs first, as llama.cpp allocates them
        galloc = GraphAllocator()
        t0 = time.perf_counter()
        galloc.alloc_graph(talloc, graph)
        return time.perf_counter() - t0

    def run_naive() -> float:
        fresh.reset()
        talloc = TensorAllocator.new_measure(ALIGNMENT)
        for t in input_tensors:
            talloc.alloc(t)
        t0 = time.perf_counter()
        for n in owners:
            talloc.alloc(n)
        for n in graph.nodes:
            if n.view_src is not None and n.data is None:
                n.data = n.view_src.data + n.view_offs
                n.buffer = n.view_src.buffer
        return time.perf_counter() - t0

    naive_s = median_time(run_naive, repeats)
    galloc_s = median_time(run_galloc, repeats)

    # the figures, from one more pass
    fresh.reset()
    talloc = TensorAllocator.new_measure(ALIGNMENT)
    for t in input_tensors:
        talloc.alloc(t)
    peak = GraphAllocator().alloc_graph(talloc, graph)
    report = memory_report(graph, talloc)
    assert report.peak == peak, (report.peak, peak)
    wtalloc.free()
    n_nodes = graph.n_nodes
    return {
        "nodes": n_nodes,
        "peak": peak,
        "lower_bound": report.lower_bound,
        "no_reuse": no_reuse,
        "galloc_us": galloc_s / n_nodes * 1e6,
        "naive_us": naive_s / n_nodes * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="small dimensions instead of llama-7B's")
    args = parser.parse_args()

    n_ctx = max(512, *args.tokens)
    kind = "small" if args.small else "llama-7B"
    print(f"graph allocator, {kind} dimensions, n_ctx = n_kv = {n_ctx}, alignment {ALIGNMENT}, "
          f"median of {args.repeats} runs")
    header = (f"{'layers':>6} {'tokens':>6} {'nodes':>6} {'peak MiB':>10} {'LB MiB':>10} {'peak/LB':>8} "
              f"{'no-reuse MiB':>13} {'no-reuse/peak':>13} {'us/node':>8} {'peer us/node':>12} {'ratio':>6}")
    print(header)
    for n_layers in args.layers:
        for n_tokens in args.tokens:
            if args.small:
                dims = LlamaDims(n_layers, n_tokens, 64, 4, 4, 160, 100, n_ctx)
            else:
                dims = LlamaDims.llama_7b(n_layers, n_tokens, n_ctx)
            r = bench_one(dims, args.repeats)
            print(f"{n_layers:>6} {n_tokens:>6} {r['nodes']:>6} {r['peak'] / MIB:>10.2f} "
                  f"{r['lower_bound'] / MIB:>10.2f} {r['peak'] / r['lower_bound']:>8.3f} "
                  f"{r['no_reuse'] / MIB:>13.2f} {r['no_reuse'] / r['peak']:>13.2f} "
                  f"{r['galloc_us']:>8.1f} {r['naive_us']:>12.1f} {r['galloc_us'] / r['naive_us']:>6.2f}")


if __name__ == "__main__":
    main()
