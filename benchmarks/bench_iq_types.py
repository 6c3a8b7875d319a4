"""Decode products of the lattice IQ types against Q4_K of the same shape, measured in the same run.

For each type of --types: MUL_MAT of a --shape weight matrix (default 2048x2048) times one column on --threads
threads, by the CPU kernels, prepared once and computed many times as a graph plan does; Q4_K's product of the same
shape is the peer. The cases alternate in rounds; times are medians. Printed: ms per product and the ratio to Q4_K
(the aim: 1.5 or less), and GB/s of weight bytes read. With --ggml, the same products by libggml (llama.cpp 0c1e570's
CPU backend through ctypes, pyggml.testing.ggml_c; one graph of --ggml-products products per call, to make the
call's setup small), for ggml's own ratio to Q4_K.

    python benchmarks/bench_iq_types.py [--repeats 60] [--threads 2] [--shape 2048x2048] [--types IQ2_XXS,...]
                                        [--ggml] [--ggml-products 32]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import medians

from pyggml.backends.cpu.kernels import KERNELS, ComputeParams
from pyggml.core import memory, quants
from pyggml.core.context import Context
from pyggml.core.quants_iq import IQ_TYPES
from pyggml.core.types import GGMLType
from pyggml.testing.random_blocks import random_blocks

PEER = GGMLType.Q4_K


class Product:
    """One MUL_MAT node (an m x k matrix of `wtype` times one column) prepared through the CPU kernel."""

    def __init__(self, wtype: GGMLType, m: int, k: int, n_threads: int, rng: np.random.Generator) -> None:
        if wtype in IQ_TYPES:
            raw = random_blocks(wtype, (m, k), rng)
        else:
            raw = quants.from_float(wtype, rng.standard_normal((m, k)).astype(np.float32))
        self.weight_bytes = raw.nbytes
        self.ctx = Context(mem_size=raw.nbytes + 4 * k + 4 * m + (1 << 20), no_alloc=False)
        w = self.ctx.new_tensor_2d(wtype, k, m)
        w.numpy()[0, 0] = raw
        x = self.ctx.new_tensor_2d(GGMLType.F32, k, 1)
        x.numpy()[0, 0] = rng.standard_normal((1, k)).astype(np.float32)
        node = self.ctx.mul_mat(w, x)
        srcs = [memory.tensor_view(s) if s is not None else None for s in node.src]
        self.compute = KERNELS[node.op](node, memory.tensor_view(node), srcs, ComputeParams(n_threads=n_threads))

    def close(self) -> None:
        self.ctx.free()


class GGMLProducts:
    """`count` products of one m x k matrix of `wtype` (each times its own column) as one graph computed by libggml."""

    def __init__(self, wtype: GGMLType, m: int, k: int, count: int, n_threads: int, rng: np.random.Generator) -> None:
        from pyggml.testing import ggml_c

        raw = random_blocks(wtype, (m, k), rng) if wtype in IQ_TYPES else \
            quants.from_float(wtype, rng.standard_normal((m, k)).astype(np.float32))
        self.ctx = Context(mem_size=raw.nbytes + count * (4 * k + 4 * m + 1024) + (1 << 20), no_alloc=False)
        w = self.ctx.new_tensor_2d(wtype, k, m)
        w.numpy()[0, 0] = raw
        nodes = []
        for _ in range(count):
            x = self.ctx.new_tensor_2d(GGMLType.F32, k, 1)
            x.numpy()[0, 0] = rng.standard_normal((1, k)).astype(np.float32)
            nodes.append(self.ctx.mul_mat(w, x))
        self.lib, self.n_threads, self.count = ggml_c.load(), n_threads, count
        self.plan = ggml_c._plan(nodes, nodes[-1:], "bench_iq_types")
        self.out = np.zeros(4 * m, np.uint8)

    def compute(self) -> None:
        from pyggml.testing import ggml_c

        ggml_c._compute(self.lib, self.plan, self.n_threads, self.out)

    def close(self) -> None:
        self.ctx.free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", default="2048x2048", help="rows x row length (a multiple of 256)")
    parser.add_argument("--types", default=",".join(t.name for t in IQ_TYPES))
    parser.add_argument("--ggml", action="store_true", help="also libggml's products, for ggml's own ratio")
    parser.add_argument("--ggml-products", type=int, default=32)
    args = parser.parse_args()
    m, k = (int(v) for v in args.shape.split("x"))
    types = [GGMLType[name.strip().upper()] for name in args.types.split(",")]
    rng = np.random.default_rng(0)
    products = [Product(t, m, k, args.threads, rng) for t in (PEER, *types)]
    times = medians([p.compute for p in products], args.repeats)
    print(f"MUL_MAT {m}x{k} times 1 column, {args.threads} threads, median of {args.repeats} runs, alternating")
    print(f"  {'type':>8} {'ms':>8} {'/ Q4_K':>7} {'GB/s':>6}")
    for t, p, s in zip((PEER, *types), products, times, strict=True):
        print(f"  {t.name:>8} {s * 1e3:8.3f} {s / times[0]:7.2f} {p.weight_bytes / s / 1e9:6.1f}")
    for p in products:
        p.close()
    if not args.ggml:
        return
    peers = [GGMLProducts(t, m, k, args.ggml_products, args.threads, rng) for t in (PEER, *types)]
    times = [t / args.ggml_products for t in medians([p.compute for p in peers], max(5, args.repeats // 4))]
    print(f"libggml: the same, {args.ggml_products} products per graph (ms per product)")
    print(f"  {'type':>8} {'ms':>8} {'/ Q4_K':>7}")
    for t, s in zip((PEER, *types), times, strict=True):
        print(f"  {t.name:>8} {s * 1e3:8.3f} {s / times[0]:7.2f}")
    for p in peers:
        p.close()


if __name__ == "__main__":
    main()
