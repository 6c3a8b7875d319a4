"""MUL_MAT on the CPU kernels against numpy, measured in the same run (2 threads for both).

(b) F32 4096x4096 weights times 1, 8 and 512 columns: the MUL_MAT kernel
    against numpy `x @ W.T` into a preallocated out (GFLOP/s).
(c) Q8_0 and Q4_0 mat-vec (4096x4096, one column) against numpy mat-vec on
    the dequantized f32 weights: time and GB/s of weight bytes read (the
    quantized kernel reads 3.8x / 7.1x fewer bytes).
(--thread-sweep) the direct kernels' mat-vec on 1 thread against
    --threads threads by matrix size, which sets PARALLEL_MIN_WORK.
(--columns) SmolLM2-135M's decode products (Q4_1 1536x576, 576x1536,
    576x576 and 192x576, the Q8_0 49152x576 output) by src1 columns,
    N = 1, 2, 4, 8: what decoding N sequences in one batch costs in the
    direct kernels (alone: python benchmarks/bench_matmul.py --columns-only;
    --column-threads: the same products on 1 thread vs --threads; --cold: with
    the weights coming from memory, as in decoding).
(--shapes TYPES) mat-vec of SmolLM2-135M's decode shapes (1536x576, 576x1536,
    576x576, 192x576, 49152x576) for the comma-separated weight types, on 1
    thread and on --threads (alone: --shapes-only). K-quants only where the
    row length is a multiple of 256.
Also shown: the other weight types' mat-vec, 512 columns through the
dequantized-tile BLAS path, and (--sweep) the direct kernels against the
BLAS path by column count, which sets BLAS_MIN_COLS.

Each kernel is prepared once and computed many times, as a graph plan does;
times are medians of `--repeats` runs, ours and the peer's alternating.

    python benchmarks/bench_matmul.py [--repeats 15] [--threads 2] [--sweep] [--thread-sweep]
                                      [--columns | --columns-only | --column-threads [--cold]]
                                      [--shapes Q4_0,Q4_1 [--shapes-only]]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gguf
import numpy as np
from threadpoolctl import threadpool_limits

from pyggml.backends.cpu.kernels import KERNELS, ComputeParams, matmul
from pyggml.core import memory
from pyggml.core.context import Context
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType

M = K = 4096


def medians(fns: list[Callable[[], None]], repeats: int, rounds: int = 3) -> list[float]:
    """Median seconds of each function over `repeats` calls.

    The calls come in `rounds` blocks per function, the functions taking turns
    (so changes of machine load hit all alike), each block after a pause: BLAS
    and OpenMP worker threads spin for a while after a call, and the next block
    must not pay for the previous function's spinning threads.
    """
    for fn in fns:
        fn()  # warm up (numba compiles or loads its cache here)
    times: list[list[float]] = [[] for _ in fns]
    per_round = max(1, repeats // rounds)
    for _ in range(rounds):
        for fn, ts in zip(fns, times, strict=True):
            time.sleep(0.3)
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def weights(wtype: GGMLType, rng: np.random.Generator,
            shape: tuple[int, int] = (M, K)) -> tuple[np.ndarray, np.ndarray]:
    """(stored weights, their f32 values) for a matrix of `wtype` (4096x4096 unless `shape` says)."""
    m, k = shape
    w = rng.standard_normal((m, k), dtype=np.float32)
    if wtype == GGMLType.F32:
        return w, w
    if wtype == GGMLType.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    if wtype == GGMLType.BF16:
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32)
    qt = gguf.GGMLQuantizationType(int(wtype))
    try:
        raw = gguf.quants.quantize(w, qt)
    except NotImplementedError:  # gguf cannot make K-quants: random blocks with sane f16 scales
        bs, ts = TYPE_TRAITS[wtype].blck_size, TYPE_TRAITS[wtype].type_size
        raw = rng.integers(0, 256, (m, k // bs, ts), dtype=np.uint8)
        fields = {GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2),
                  GGMLType.Q6_K: (208,)}[wtype]
        for off in fields:
            d = rng.uniform(0.001, 0.01, raw.shape[:2]).astype(np.float16)
            raw[:, :, off:off + 2] = d.view(np.uint8).reshape(raw.shape[:2] + (2,))
        raw = raw.reshape(m, -1)
    return raw, gguf.quants.dequantize(raw, qt)


class Case:
    """One MUL_MAT node (weights x N columns) prepared through the kernel, plus its numpy peer."""

    def __init__(self, wtype: GGMLType, n: int, rng: np.random.Generator, n_threads: int,
                 shape: tuple[int, int] = (M, K), made: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`made`: (stored weights, their f32 values) of `shape` to use instead of `weights`' ones."""
        stored, self.wf = made if made is not None else weights(wtype, rng, shape)
        self.wtype, self.n = wtype, n
        m, k = shape
        self.ctx = Context(mem_size=stored.nbytes + 4 * k * n + 4 * m * n + (1 << 20), no_alloc=False)
        w = self.ctx.new_tensor_2d(wtype, k, m)
        w.numpy()[0, 0] = stored
        x = self.ctx.new_tensor_2d(GGMLType.F32, k, n)
        self.x = rng.standard_normal((n, k), dtype=np.float32)
        x.numpy()[0, 0] = self.x
        self.node: Tensor = self.ctx.mul_mat(w, x)
        srcs = [memory.tensor_view(s) if s is not None else None for s in self.node.src]
        self.compute = KERNELS[self.node.op](self.node, memory.tensor_view(self.node), srcs,
                                            ComputeParams(n_threads=n_threads))
        self.weight_bytes = stored.nbytes
        self.out = np.empty((n, m), np.float32)
        self.wt = self.wf.T

    def peer(self) -> None:
        np.matmul(self.x, self.wt, out=self.out)

    def check(self) -> float:
        """NMSE of the kernel's result against the peer's (f32 weights, unrounded src1)."""
        self.compute()
        self.peer()
        got = self.node.numpy()[0, 0]
        return float(np.sum((got - self.out) ** 2) / np.sum(self.out ** 2))

    def close(self) -> None:
        self.ctx.free()


# SmolLM2-135M's decode products, (weight rows, row length): ffn_up/ffn_gate (Q4_1), ffn_down (Q4_1), attention
# q/o and k/v (Q4_1), the output (Q8_0, the tied token embedding)
SMOLLM2_SHAPES: tuple[tuple[GGMLType, tuple[int, int]], ...] = (
    (GGMLType.Q4_1, (1536, 576)), (GGMLType.Q4_1, (576, 1536)), (GGMLType.Q4_1, (576, 576)),
    (GGMLType.Q4_1, (192, 576)), (GGMLType.Q8_0, (49152, 576)),
)


def columns(rng: np.random.Generator, nt: int, repeats: int) -> None:
    """ms of SmolLM2's decode products by src1 columns (the cases alternating), and the time per column
    relative to one column's product."""
    cols = (1, 2, 4, 8)
    print(f"SmolLM2 decode products by src1 columns, {nt} threads, median of {repeats} runs (ms; "
          "in brackets: time / (N x time of N=1))")
    print(f"  {'type':>6} {'shape':>10} " + " ".join(f"{f'N={n}':>15}" for n in cols))
    for wtype, shape in SMOLLM2_SHAPES:
        cases = [Case(wtype, n, rng, nt, shape) for n in cols]
        ts = medians([c.compute for c in cases], repeats * 4)
        cells = [f"{t * 1e3:7.3f} [{t / (n * ts[0]):4.2f}]" for n, t in zip(cols, ts, strict=True)]
        print(f"  {wtype.name:>6} {f'{shape[0]}x{shape[1]}':>10} " + " ".join(f"{c:>15}" for c in cells))
        for c in cases:
            c.close()
    print()


def column_threads(rng: np.random.Generator, nt: int, repeats: int, cold: bool = False) -> None:
    """us of SmolLM2's decode products by src1 columns on 1 thread and on nt threads (PARALLEL_MIN_WORK forced
    2^62 and 0, alternating): where threads pay off, for matmul._direct_work. `cold`: each timed call runs
    the product over enough distinct weight matrices (>= 48 MB, more than the L3 cache) in turn, so that the
    weights come from memory, as in decoding."""
    cols = (1, 2, 3, 4)
    where = "weights from memory" if cold else "weights in cache"
    print(f"SmolLM2 decode products, {where}, 1 thread vs {nt}, median of {repeats * 10} runs (us: 1 thread / "
          f"{nt}; _direct_work's choice starred)")
    print(f"  {'type':>6} {'shape':>10} " + " ".join(f"{f'N={n}':>15}" for n in cols))
    saved_work = matmul.PARALLEL_MIN_WORK
    for wtype, shape in SMOLLM2_SHAPES:
        cells = []
        for n in cols:
            groups = []
            for min_work in (1 << 62, 0):
                matmul.PARALLEL_MIN_WORK = min_work
                first = Case(wtype, n, rng, nt, shape)
                copies = max(1, -(-(48 << 20) // first.weight_bytes)) if cold else 1
                groups.append([first] + [Case(wtype, n, rng, nt, shape) for _ in range(copies - 1)])
            matmul.PARALLEL_MIN_WORK = saved_work

            def calls(group: list[Case]) -> Callable[[], None]:
                def run() -> None:
                    for c in group:
                        c.compute()
                return run

            one, many = (t / len(groups[0]) for t in medians([calls(g) for g in groups], repeats * 10))
            threaded = matmul._direct_work(int(wtype), shape[0], shape[1], 1, n) >= saved_work
            cells.append(f"{one * 1e6:.0f}{'' if threaded else '*'}/{many * 1e6:.0f}{'*' if threaded else ''}")
            for c in (c for g in groups for c in g):
                c.close()
        print(f"  {wtype.name:>6} {f'{shape[0]}x{shape[1]}':>10} " + " ".join(f"{c:>15}" for c in cells))
    print()


DECODE_SHAPES = ((1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576))


def shapes(rng: np.random.Generator, names: str, nt: int, repeats: int) -> None:
    """us of one-column products of SmolLM2's decode shapes, the types alternating, 1 and nt threads."""
    wtypes = [GGMLType[name.strip()] for name in names.split(",")]
    for threads in sorted({1, nt}):
        print(f"SmolLM2 decode shapes, mat-vec, {threads} thread(s), median of {repeats * 4} runs (us)")
        print(f"  {'shape':>10} " + " ".join(f"{t.name:>8}" for t in wtypes))
        for shape in DECODE_SHAPES:
            cases = [Case(t, 1, rng, threads, shape) for t in wtypes
                     if shape[1] % TYPE_TRAITS[t].blck_size == 0]
            ts = iter(medians([c.compute for c in cases], repeats * 4))
            cells = [f"{next(ts) * 1e6:8.1f}" if shape[1] % TYPE_TRAITS[t].blck_size == 0 else f"{'-':>8}"
                     for t in wtypes]
            print(f"  {f'{shape[0]}x{shape[1]}':>10} " + " ".join(cells))
            for c in cases:
                c.close()
        print()


def gflops(n: int, t: float) -> float:
    return 2.0 * M * K * n / t / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sweep", action="store_true", help="direct kernels vs BLAS path by column count")
    parser.add_argument("--thread-sweep", action="store_true", help="mat-vec on 1 vs --threads threads by size")
    parser.add_argument("--columns", action="store_true", help="SmolLM2's decode products by src1 columns")
    parser.add_argument("--columns-only", action="store_true", help="only --columns")
    parser.add_argument("--column-threads", action="store_true",
                        help="only SmolLM2's decode products by src1 columns on 1 thread vs --threads")
    parser.add_argument("--cold", action="store_true", help="--column-threads with the weights coming from memory")
    parser.add_argument("--shapes", default="", help="SmolLM2's decode shapes for these types (Q4_0,Q4_1)")
    parser.add_argument("--shapes-only", action="store_true", help="only --shapes")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    nt = args.threads

    with threadpool_limits(limits=nt, user_api="blas"):
        if args.column_threads:
            column_threads(rng, nt, args.repeats, args.cold)
            return
        if args.shapes:
            shapes(rng, args.shapes, nt, args.repeats)
            if args.shapes_only:
                return
        if args.columns or args.columns_only:
            columns(rng, nt, args.repeats)
            if args.columns_only:
                return
        print(f"MUL_MAT, {M}x{K} weights, {nt} threads, median of {args.repeats} runs; peer: numpy (OpenBLAS)")
        print()
        print("(b) F32 weights: kernel vs numpy x @ W.T into a preallocated out")
        print(f"  {'columns':>8} {'kernel ms':>10} {'GFLOP/s':>9} {'numpy ms':>10} {'GFLOP/s':>9} {'ratio':>7}")
        for n in (1, 8, 512):
            case = Case(GGMLType.F32, n, rng, nt)
            ours, peer = medians([case.compute, case.peer], args.repeats)
            print(f"  {n:>8} {ours * 1e3:10.3f} {gflops(n, ours):9.1f} {peer * 1e3:10.3f} {gflops(n, peer):9.1f}"
                  f" {peer / ours:6.2f}x")
            case.close()
        print("  (ratio = numpy time / kernel time; > 1 means the kernel is faster)")
        print()

        print("(c) mat-vec (1 column): kernel on the stored weights vs numpy on dequantized f32 weights")
        print(f"  {'type':>6} {'kernel ms':>10} {'GB/s':>7} {'numpy ms':>10} {'GB/s':>7} {'ratio':>7} {'NMSE':>9}")
        for wtype in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_1, GGMLType.Q5_0,
                      GGMLType.Q5_1, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K):
            case = Case(wtype, 1, rng, nt)
            err = case.check()
            ours, peer = medians([case.compute, case.peer], args.repeats)
            print(f"  {wtype.name:>6} {ours * 1e3:10.3f} {case.weight_bytes / ours / 1e9:7.1f} {peer * 1e3:10.3f}"
                  f" {M * K * 4 / peer / 1e9:7.1f} {peer / ours:6.2f}x {err:9.1e}")
            case.close()
        print("  (GB/s of weight bytes read; NMSE vs the f32 product, i.e. the src1 rounding ggml does)")
        print()

        print("512 columns (prompt): dequantized tiles + BLAS vs numpy GEMM on f32 weights")
        print(f"  {'type':>6} {'kernel ms':>10} {'GFLOP/s':>9} {'numpy ms':>10} {'GFLOP/s':>9} {'ratio':>7}")
        for wtype in (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K):
            case = Case(wtype, 512, rng, nt)
            ours, peer = medians([case.compute, case.peer], max(3, args.repeats // 3))
            print(f"  {wtype.name:>6} {ours * 1e3:10.3f} {gflops(512, ours):9.1f} {peer * 1e3:10.3f}"
                  f" {gflops(512, peer):9.1f} {peer / ours:6.2f}x")
            case.close()

        if args.sweep:
            print()
            print("direct kernels vs dequantized tiles + BLAS, by columns (ms; thresholds: "
                  f"BLAS_MIN_COLS={matmul.BLAS_MIN_COLS})")
            saved = matmul.BLAS_MIN_COLS
            print(f"  {'type':>6} {'columns':>8} {'direct':>9} {'BLAS':>9}")
            for wtype in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
                for n in (2, 4, 8, 16, 32):
                    row = []
                    for min_cols in (10**9, 1):
                        matmul.BLAS_MIN_COLS = min_cols
                        case = Case(wtype, n, rng, nt)
                        row.append(medians([case.compute], max(3, args.repeats // 3))[0])
                        case.close()
                    print(f"  {wtype.name:>6} {n:>8} {row[0] * 1e3:9.3f} {row[1] * 1e3:9.3f}")
            matmul.BLAS_MIN_COLS = saved

        if args.thread_sweep:
            print()
            print(f"mat-vec on 1 thread vs {nt} by size (us; PARALLEL_MIN_WORK={matmul.PARALLEL_MIN_WORK} "
                  "multiply-adds)")
            saved_work = matmul.PARALLEL_MIN_WORK
            print(f"  {'type':>6} {'shape':>10} {'work':>9} {'1 thread':>9} {f'{nt} threads':>10} {'ratio':>6}")
            for wtype in (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0):
                for m, k in ((256, 256), (1024, 256), (768, 768), (1024, 1024), (2048, 768), (2048, 2048)):
                    cases = []
                    for min_work in (1 << 62, 0):
                        matmul.PARALLEL_MIN_WORK = min_work
                        cases.append(Case(wtype, 1, rng, nt, (m, k)))
                    one, many = medians([c.compute for c in cases], args.repeats * 10)
                    for c in cases:
                        c.close()
                    print(f"  {wtype.name:>6} {f'{m}x{k}':>10} {m * k:9d} {one * 1e6:9.1f} {many * 1e6:10.1f}"
                          f" {one / many:5.2f}x")
            matmul.PARALLEL_MIN_WORK = saved_work


if __name__ == "__main__":
    main()
