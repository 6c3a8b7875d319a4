"""MUL_MAT of a repacked Q4_K matrix: pyggml's CPU kernels against libggml's CPU_REPACK product in the same run.

TinyLlama-1.1B's shapes (weight rows x row length: 2048x2048 attention, 5632x2048 ffn_gate/up, 2048x5632
ffn_down) times 1 column (decode) and 128 (a prompt), both on --threads threads: libggml (llama.cpp 0c1e570,
`ggml_c.MulMatInBuft`, the weight written into its CPU_REPACK buffer type) and pyggml (the weight repacked as its
CPU_REPACK buffer holds it, the kernel prepared once as a graph plan does); also pyggml's plain Q4_K (vec_dot's
row loops, or BLAS on dequantized tiles for prompts). Medians of --repeats runs, the three alternating; the
results are checked equal to libggml's, bit for bit, first.

    python benchmarks/bench_repack.py [--repeats 20] [--threads 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import medians

from pyggml.backends.cpu.kernels import KERNELS, ComputeParams
from pyggml.backends.cpu.repack import LAYOUTS
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.testing import ggml_c

SHAPES = ((2048, 2048), (5632, 2048), (2048, 5632))


class Ours:
    """pyggml's MUL_MAT node of the weight rows `raw` (held repacked or plain) times x, prepared once."""

    def __init__(self, wtype: GGMLType, raw: np.ndarray, x: np.ndarray, threads: int, repacked: bool) -> None:
        m, (n, k) = raw.shape[0], x.shape
        self.ctx = Context(mem_size=raw.nbytes + 4 * (k + m) * n + (1 << 20), no_alloc=False)
        w = self.ctx.new_tensor_2d(wtype, k, m)
        if repacked:
            marker, repack, _ = LAYOUTS[wtype]
            w.numpy()[0, 0] = repack(raw)
            w.extra = marker
        else:
            w.numpy()[0, 0] = raw
        xt = self.ctx.new_tensor_2d(GGMLType.F32, k, n)
        xt.numpy()[0, 0] = x
        self.node = self.ctx.mul_mat(w, xt)
        srcs = [memory.tensor_view(s) if s is not None else None for s in self.node.src]
        self.compute = KERNELS[self.node.op](self.node, memory.tensor_view(self.node), srcs,
                                            ComputeParams(n_threads=threads))

    def result(self) -> np.ndarray:
        self.compute()
        return self.node.numpy()[0, 0].copy()


def q4_K_weights(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    raw = rng.integers(0, 256, (m, k // 256, 144), dtype=np.uint8)
    d = rng.uniform(0.001, 0.01, (m, k // 256, 2)).astype(np.float16)
    raw[:, :, :4] = d.view(np.uint8).reshape(m, k // 256, 4)
    return raw.reshape(m, -1)


def bench_args(doc: str) -> argparse.Namespace:
    """--repeats and --threads of a libggml-against-pyggml product benchmark described by `doc`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def main() -> None:
    args = bench_args(__doc__)
    lib = ggml_c.load()
    buft = ggml_c.extra_bufts(lib)["CPU_REPACK"]
    rng = np.random.default_rng(0)
    print(f"Q4_K MUL_MAT, {args.threads} threads, medians of {args.repeats} (ms); ratio: libggml's time / ours")
    print(f"{'shape':>10} {'cols':>5} {'libggml':>9} {'repacked':>9} {'ratio':>6} {'plain':>9} {'ratio':>6}")
    for m, k in SHAPES:
        raw = q4_K_weights(rng, m, k)
        for n in (1, 128):
            x = rng.standard_normal((n, k), dtype=np.float32)
            theirs = ggml_c.MulMatInBuft(lib, buft, ggml_c.c_type(GGMLType.Q4_K), raw, x, args.threads)
            repacked = Ours(GGMLType.Q4_K, raw, x, args.threads, repacked=True)
            plain = Ours(GGMLType.Q4_K, raw, x, args.threads, repacked=False)
            try:
                theirs.compute()
                want = np.empty((n, m), np.float32)
                theirs.result(want)
                assert theirs.held and np.array_equal(repacked.result().view(np.uint32), want.view(np.uint32))
                t_c, t_r, t_p = medians([theirs.compute, repacked.compute, plain.compute], args.repeats)
                print(f"{m:>5}x{k:<5} {n:>4} {t_c * 1e3:>9.3f} {t_r * 1e3:>9.3f} {t_c / t_r:>5.2f}x "
                      f"{t_p * 1e3:>9.3f} {t_c / t_p:>5.2f}x")
            finally:
                theirs.free()
                repacked.ctx.free()
                plain.ctx.free()


if __name__ == "__main__":
    main()
