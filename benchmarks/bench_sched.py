"""The scheduler's own time (split + alloc) per node, and its share of a whole compute.

A LLaMA-like graph (pyggml.testing.graphs, small dims) of 1 and 32 layers is
computed over two CPU backends through the Scheduler: the first half of the
layers (and the token embedding) in backend A's buffer, the rest (and the
output head) in B's, the inputs in A's compute buffer. Each run builds a new
graph, as llama.cpp does per batch. Reported per layer count (medians):

- split, alloc: the scheduler's passes + split, and the graph allocator
  (`Scheduler.stats`), per node of the graph;
- share: (split + alloc) / the whole `graph_compute`;
- peer: the same graph on one CPU backend without the scheduler (the graph
  allocator's `alloc_graph` into a measured buffer, then `graph_compute`),
  measured in the same run; `ratio` is sched graph_compute / peer (alloc +
  compute), i.e. what the scheduler (its passes, the copies, more
  graph_compute calls) costs on top of one backend.

    python benchmarks/bench_sched.py [--layers 1 32] [--repeats 7] [--tokens 32] [--embd 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend import tensor_set_numpy
from pyggml.backend.backend import Backend
from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.graph import graph_overhead
from pyggml.core.tensor import Tensor
from pyggml.sched import Scheduler
from pyggml.testing.graphs import build_llama_graph, graph_size, llama_input_values, place_weights


def layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    if name.startswith(("k_cache-", "v_cache-")):
        return int(name.split("-")[1])
    return None


class Bench:
    def __init__(self, n_layers: int, args: argparse.Namespace) -> None:
        self.n_layers = n_layers
        self.args = args
        self.dims = dict(n_layers=n_layers, n_tokens=args.tokens, n_embd=args.embd, n_head=8, n_head_kv=8,
                         n_ff=args.embd * 8 // 3, n_vocab=1000, n_ctx=args.tokens * 2)
        self.weights_ctx = self.new_ctx()
        _, _, weights = build_llama_graph(self.weights_ctx, **self.dims)
        self.weight_by_name = {w.name: w for w in weights}

    def new_ctx(self) -> Context:
        size = graph_size(self.n_layers)
        return Context(mem_size=4 * size * tensor_overhead() + graph_overhead(size), no_alloc=True)

    def graph(self):
        """A new graph over the placed weights (the builder's own weights are swapped for the placed ones)."""
        ctx = self.new_ctx()
        gf, inputs, weights = build_llama_graph(ctx, **self.dims)
        swap = {id(w): self.weight_by_name[w.name] for w in weights}
        for node in gf.nodes:
            for j, s in enumerate(node.src):
                if s is not None and id(s) in swap:
                    node.src[j] = swap[id(s)]
            if node.view_src is not None and id(node.view_src) in swap:
                node.view_src = swap[id(node.view_src)]
                if node.view_src.data is not None:
                    node.data = node.view_src.data + node.view_offs
        gf.leafs = [swap.get(id(t), t) for t in gf.leafs]
        return ctx, gf, inputs

    def place(self, backend_of: Callable[[Tensor], Backend]) -> list[TensorAllocator]:
        groups: dict[int, tuple[Backend, list[Tensor]]] = {}
        for w in self.weight_by_name.values():
            b = backend_of(w)
            groups.setdefault(id(b), (b, []))[1].append(w)
        return [place_weights(ws, b) for b, ws in groups.values()]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def run(n_layers: int, args: argparse.Namespace) -> None:
    bench = Bench(n_layers, args)
    a, b = cpu_init(args.threads), cpu_init(args.threads)
    half = max(1, n_layers // 2) if n_layers > 1 else 1

    def backend_of(w: Tensor) -> Backend:
        il = layer_of(w.name)
        if il is None:
            return a if w.name == "token_embd.weight" else b
        return a if il < half else b

    wallocs = bench.place(backend_of)
    sched = Scheduler([a, b])
    ctx, gf, inputs = bench.graph()
    talloc = sched.get_tallocr(a)
    for name in ("tokens", "pos", "kq_mask"):
        talloc.alloc(inputs[name])
    sched.init_measure(gf)

    split_t, alloc_t, total_t = [], [], []
    n_nodes = n_splits = 0
    for rep in range(args.repeats + 1):
        ctx, gf, inputs = bench.graph()
        talloc = sched.get_tallocr(a)
        values = llama_input_values(inputs, n_vocab=1000, seed=rep)
        for name, v in values.items():
            talloc.alloc(inputs[name])
            tensor_set_numpy(inputs[name], v)
        t0 = time.perf_counter()
        sched.graph_compute(gf)
        t = time.perf_counter() - t0
        if rep:  # the first is a warm-up
            split_t.append(sched.stats.split_time)
            alloc_t.append(sched.stats.alloc_time)
            total_t.append(t)
        n_nodes, n_splits = gf.n_nodes, sched.n_splits
    bytes_copied = sched.stats.bytes_copied
    sched.free()
    for w in wallocs:
        w.free()

    # the peer: one CPU backend, the graph allocator and graph_compute, no scheduler
    one = cpu_init(args.threads)
    bench = Bench(n_layers, args)  # new weights: the old ones keep their (freed) memory
    wallocs = bench.place(lambda w: one)
    ctx, gf, inputs = bench.graph()
    measure = TensorAllocator.new_measure_from_backend(one)
    for name in ("tokens", "pos", "kq_mask"):
        measure.alloc(inputs[name])
    GraphAllocator().alloc_graph(measure, gf)
    talloc = TensorAllocator.new_from_backend(one, measure.get_max_size())
    galloc = GraphAllocator()
    peer_alloc, peer_total = [], []
    for rep in range(args.repeats + 1):
        ctx, gf, inputs = bench.graph()
        talloc.reset()
        values = llama_input_values(inputs, n_vocab=1000, seed=rep)
        for name, v in values.items():
            talloc.alloc(inputs[name])
            tensor_set_numpy(inputs[name], v)
        t0 = time.perf_counter()
        galloc.alloc_graph(talloc, gf)
        t1 = time.perf_counter()
        one.graph_compute(gf)
        t2 = time.perf_counter()
        if rep:
            peer_alloc.append(t1 - t0)
            peer_total.append(t2 - t0)
    talloc.free()
    for w in wallocs:
        w.free()

    us = 1e6 / n_nodes
    split, alloc, total = median(split_t), median(alloc_t), median(total_t)
    p_alloc, p_total = median(peer_alloc), median(peer_total)
    print(f"{n_layers:2d} layers: {n_nodes} nodes, {n_splits} splits, {bytes_copied / 1024:.1f} KiB copied")
    print(f"    sched split {split * us:6.2f} us/node, alloc {alloc * us:6.2f} us/node, "
          f"together {(split + alloc) * us:6.2f} us/node = {(split + alloc) / total * 100:5.1f}% of graph_compute "
          f"({total * 1e3:.1f} ms)")
    print(f"    peer (1 backend, no sched): alloc {p_alloc * us:6.2f} us/node, alloc + compute "
          f"{p_total * 1e3:.1f} ms;  ratio sched/peer {total / p_total:5.2f}x, sched own time / peer alloc "
          f"{(split + alloc) / p_alloc:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"LLaMA-like graph, n_embd {args.embd}, {args.tokens} tokens, two CPU backends "
          f"({args.threads} thread(s) each), medians of {args.repeats} runs")
    for n in args.layers:
        run(n, args)


if __name__ == "__main__":
    main()
