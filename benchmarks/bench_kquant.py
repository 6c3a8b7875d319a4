"""MUL_MAT of K-quant matrices: pyggml's CPU kernels against libggml's CPU backend in the same run.

Q4_K (repacked, as both CPU_REPACK buffers hold it), Q5_K and Q6_K (plain: libggml's tiled matmul for prompts, its
vec_dot rows for decode) at TinyLlama-1.1B's shapes (weight rows x row length: 2048x2048, 5632x2048, 2048x5632)
times 1 column (decode) and 128 (a prompt), both on --threads threads, numerics "x86". Medians of --repeats runs,
the two alternating; the results are checked equal to libggml's, bit for bit, first. Run it with
OMP_WAIT_POLICY=passive (libggml's spinning OpenMP threads slow every alternate run otherwise).

    OMP_WAIT_POLICY=passive python benchmarks/bench_kquant.py [--repeats 20] [--threads 2] [--types Q5_K,Q6_K]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import medians
from bench_repack import SHAPES, Ours

from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.testing import ggml_c

TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
# the byte offsets of each type's f16 scales in its super-block (random bytes elsewhere are valid blocks)
HALF_OFFSETS = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,)}


def k_weights(rng: np.random.Generator, wtype: GGMLType, m: int, k: int) -> np.ndarray:
    """m random rows of `wtype` (k values each) as raw bytes, their f16 scales small and finite."""
    size = TYPE_TRAITS[wtype].type_size
    raw = rng.integers(0, 256, (m, k // 256, size), dtype=np.uint8)
    for at in HALF_OFFSETS[wtype]:
        d = rng.uniform(0.001, 0.01, (m, k // 256)).astype(np.float16)
        raw[:, :, at:at + 2] = d.view(np.uint8).reshape(m, k // 256, 2)
    return raw.reshape(m, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", default=",".join(t.name for t in TYPES))
    parser.add_argument("--cols", default="1,128")
    args = parser.parse_args()
    lib = ggml_c.load()
    bufts = {True: ggml_c.extra_bufts(lib)["CPU_REPACK"], False: lib.ggml_backend_cpu_buffer_type()}
    rng = np.random.default_rng(0)
    print(f"K-quant MUL_MAT, {args.threads} threads, medians of {args.repeats} (ms); ratio: libggml's time / ours")
    print(f"{'type':>5} {'shape':>10} {'cols':>5} {'libggml':>9} {'pyggml':>9} {'ratio':>6}")
    for wtype in (GGMLType[name] for name in args.types.split(",")):
        repacked = wtype == GGMLType.Q4_K
        for m, k in SHAPES:
            raw = k_weights(rng, wtype, m, k)
            for n in (int(c) for c in args.cols.split(",")):
                x = rng.standard_normal((n, k), dtype=np.float32)
                theirs = ggml_c.MulMatInBuft(lib, bufts[repacked], ggml_c.c_type(wtype), raw, x, args.threads)
                ours = Ours(wtype, raw, x, args.threads, repacked=repacked)
                try:
                    theirs.compute()
                    want = np.empty((n, m), np.float32)
                    theirs.result(want)
                    assert np.array_equal(ours.result().view(np.uint32), want.view(np.uint32)), (wtype.name, m, k, n)
                    t_c, t_o = medians([theirs.compute, ours.compute], args.repeats)
                    print(f"{wtype.name:>5} {m:>5}x{k:<5} {n:>4} {t_c * 1e3:>9.3f} {t_o * 1e3:>9.3f} "
                          f"{t_c / t_o:>5.2f}x", flush=True)
                finally:
                    theirs.free()
                    ours.ctx.free()


if __name__ == "__main__":
    main()
