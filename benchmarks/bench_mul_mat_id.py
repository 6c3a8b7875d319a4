"""MUL_MAT_ID of quantized experts: pyggml's CPU kernel against libggml's in the same run.

The expert shapes of random_moe_model.py's qwen3moe (32 experts, 4 used a token; ffn_gate/up 512x1024, ffn_down
1024x512), times 1 token (decode) and 128 (a prompt) routed at random, both on --threads threads: libggml
(llama.cpp 0c1e570, `ggml_c.MulMatInBuft` with ids) and pyggml (the kernel prepared once as a graph plan does),
the experts where llama.cpp's default run holds them: Q4_K and Q4_0 in the CPU_REPACK buffer (repacked), Q8_0 and
Q6_K in host memory. Medians of --repeats runs, alternating; the results are checked equal to libggml's, bit for
bit, first.

    python benchmarks/bench_mul_mat_id.py [--repeats 20] [--threads 2] [--types Q8_0,Q4_K,Q6_K]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import medians

from pyggml.backends.cpu.kernels import KERNELS, ComputeParams
from pyggml.backends.cpu.repack import LAYOUTS
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.types import GGMLType, from_float
from pyggml.testing import ggml_c

N_AS, N_USED = 32, 4
SHAPES = ((512, 1024), (1024, 512))  # expert rows x row length: gate/up, down


class Ours:
    """pyggml's MUL_MAT_ID node of the experts `raw` (n_as, M, row bytes; held repacked or plain), prepared once."""

    def __init__(self, wtype: GGMLType, raw: np.ndarray, x: np.ndarray, ids: np.ndarray, threads: int,
                 repacked: bool) -> None:
        n_as, m = raw.shape[:2]
        n, k = x.shape[0], x.shape[2]
        self.ctx = Context(mem_size=raw.nbytes + x.nbytes + ids.nbytes + 4 * ids.size * m + (1 << 20))
        w = self.ctx.new_tensor_3d(wtype, k, m, n_as)
        rows = raw.reshape(n_as * m, -1)
        if repacked:
            marker, repack, _ = LAYOUTS[wtype]
            w.numpy()[0] = repack(rows).reshape(raw.shape)
            w.extra = marker
        else:
            w.numpy()[0] = raw
        xt = self.ctx.new_tensor_3d(GGMLType.F32, k, x.shape[1], n)
        xt.numpy()[0] = x
        it = self.ctx.new_tensor_2d(GGMLType.I32, ids.shape[1], n)
        it.numpy()[0, 0] = ids
        self.node = self.ctx.mul_mat_id(w, xt, it)
        srcs = [memory.tensor_view(s) if s is not None else None for s in self.node.src]
        self.compute = KERNELS[self.node.op](self.node, memory.tensor_view(self.node), srcs,
                                            ComputeParams(n_threads=threads))

    def result(self) -> np.ndarray:
        self.compute()
        return self.node.numpy()[0].copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", default="Q8_0,Q4_K,Q6_K")
    args = parser.parse_args()
    lib = ggml_c.load()
    bufts = {**ggml_c.extra_bufts(lib), "CPU": lib.ggml_backend_cpu_buffer_type()}
    rng = np.random.default_rng(0)
    print(f"MUL_MAT_ID, {N_AS} experts, {N_USED} used, {args.threads} threads, medians of {args.repeats} (ms); "
          "ratio: libggml's time / ours")
    print(f"{'type':>5} {'buffer':>10} {'expert':>10} {'tokens':>6} {'libggml':>9} {'pyggml':>9} {'ratio':>6}")
    for name in args.types.split(","):
        wtype = GGMLType[name]
        repacked = wtype in LAYOUTS
        buft = "CPU_REPACK" if repacked else "CPU"
        for m, k in SHAPES:
            raw = from_float(wtype, rng.standard_normal((N_AS, m, k)).astype(np.float32)).reshape(N_AS, m, -1)
            for n in (1, 128):
                x = rng.standard_normal((n, 1, k), dtype=np.float32)
                ids = np.stack([rng.permutation(N_AS)[:N_USED] for _ in range(n)]).astype(np.int32)
                theirs = ggml_c.MulMatInBuft(lib, bufts[buft], ggml_c.c_type(wtype), raw, x, args.threads, ids)
                ours = Ours(wtype, raw, x, ids, args.threads, repacked)
                try:
                    theirs.compute()
                    want = np.empty((n, N_USED, m), np.float32)
                    theirs.result(want)
                    assert theirs.held == repacked
                    assert np.array_equal(ours.result().view(np.uint32), want.view(np.uint32)), name
                    t_c, t_o = medians([theirs.compute, ours.compute], args.repeats)
                    print(f"{name:>5} {buft:>10} {m:>4}x{k:<5} {n:>6} {t_c * 1e3:>9.3f} {t_o * 1e3:>9.3f} "
                          f"{t_c / t_o:>5.2f}x")
                finally:
                    theirs.free()
                    ours.ctx.free()


if __name__ == "__main__":
    main()
