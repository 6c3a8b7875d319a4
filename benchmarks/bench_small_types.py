"""Decode and prompt products of the ternary, 1-bit, 2-bit and NVFP4 weight types against Q4_K, in the same run.

Mat-vec (one src1 column, a decode step's product) and 512 columns (a prompt's, through the dequantized-tile BLAS
path) of TQ2_0, TQ1_0, Q1_0, Q2_0 and NVFP4 weight matrices, each timed beside a Q4_K matrix of the same shape:
the ratio is the type's time over Q4_K's (below 1: faster). The weights are Gaussian values quantized by
pyggml.core.quants (ggml's bytes); times are medians of alternating runs (bench_matmul.medians).

    python benchmarks/bench_small_types.py [--repeats 30] [--threads 2] [--shape 4096x4096] [--no-prompt]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import Case, medians
from threadpoolctl import threadpool_limits

from pyggml.core import quants
from pyggml.core.types import GGMLType

T = GGMLType
PEER = T.Q4_K
TYPES = (T.TQ2_0, T.TQ1_0, T.Q1_0, T.Q2_0, T.NVFP4)


def made(wtype: GGMLType, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stored weights, their f32 values) of `values` quantized to `wtype`."""
    raw = quants.from_float(wtype, values)
    return raw, quants.to_float(wtype, raw)


def compare(values: np.ndarray, n: int, threads: int, repeats: int, rng: np.random.Generator) -> None:
    """Each type's product of n columns against Q4_K's, alternating, on `threads` threads."""
    shape = values.shape
    peer = Case(PEER, n, rng, threads, shape, made(PEER, values))
    print(f"  {'type':>6} {'ms':>9} {'Q4_K ms':>9} {'ratio':>6} {'NMSE':>9}")
    for wtype in TYPES:
        case = Case(wtype, n, rng, threads, shape, made(wtype, values))
        err = case.check()
        ours, theirs = medians([case.compute, peer.compute], repeats)
        print(f"  {wtype.name:>6} {ours * 1e3:9.3f} {theirs * 1e3:9.3f} {ours / theirs:6.2f} {err:9.1e}")
        case.close()
    peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", default="4096x4096", help="weight rows x row length (a multiple of 256)")
    parser.add_argument("--no-prompt", action="store_true", help="only the mat-vec")
    args = parser.parse_args()
    m, k = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    values = rng.standard_normal((m, k), dtype=np.float32)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        for threads in sorted({1, args.threads}):
            print(f"mat-vec (decode), {m}x{k}, {threads} thread(s), median of {args.repeats} runs; ratio = time / "
                  "Q4_K's")
            compare(values, 1, threads, args.repeats, rng)
            print()
        if not args.no_prompt:
            print(f"512 columns (prompt), {m}x{k}, {args.threads} thread(s), median of {max(3, args.repeats // 6)} "
                  "runs; ratio = time / Q4_K's")
            compare(values, 512, args.threads, max(3, args.repeats // 6), rng)


if __name__ == "__main__":
    main()
