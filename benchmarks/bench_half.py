"""MUL_MAT of F32, F16 and BF16 matrices: pyggml's CPU kernels against libggml's product in the same run.

TinyLlama-1.1B's shapes (weight rows x row length: 2048x2048 attention, 5632x2048 ffn_gate/up), or --shapes
(SmolLM2's output matrix: 49152x576), times 1 column (decode) and 128 (a prompt), both on --threads threads:
libggml (llama.cpp 0c1e570, its CPU buffer and backend, `ggml_c.MulMatInBuft`) and pyggml (the kernel prepared
once as a graph plan does, at libggml's x86 level). Medians of --repeats runs, the two alternating; whether the
results are libggml's bit for bit is printed beside them.

    python benchmarks/bench_half.py [--repeats 20] [--threads 2] [--shapes 2048x2048,49152x576] [--types F32]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul import medians
from bench_repack import Ours

from pyggml.core.types import GGMLType
from pyggml.testing import ggml_c

SHAPES = ((2048, 2048), (5632, 2048))


def half_weights(rng: np.random.Generator, wtype: GGMLType, m: int, k: int) -> np.ndarray:
    """Random rows of `wtype` as raw bytes (m, k times the type's size)."""
    v = rng.standard_normal((m, k), dtype=np.float32) * np.float32(0.02)
    if wtype == GGMLType.F32:
        return v.view(np.uint8)
    bits = v.astype(np.float16).view(np.uint16) if wtype == GGMLType.F16 else (v.view(np.uint32) >> 16).astype(
        np.uint16)
    return bits.view(np.uint8)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'MxK,...' as (rows, row length) pairs."""
    shapes = []
    for part in text.split(","):
        m, _, k = part.strip().lower().partition("x")
        if not (m.isdigit() and k.isdigit()):
            raise SystemExit(f"--shapes: {part!r} is not ROWSxLENGTH")
        shapes.append((int(m), int(k)))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", type=parse_shapes, default=list(SHAPES), help="ROWSxLENGTH,... (default: "
                        + ",".join(f"{m}x{k}" for m, k in SHAPES) + ")")
    parser.add_argument("--types", default="F32,F16,BF16")
    args = parser.parse_args()
    lib = ggml_c.load()
    buft = lib.ggml_backend_cpu_buffer_type()
    rng = np.random.default_rng(0)
    print(f"F32/F16/BF16 MUL_MAT, {args.threads} threads, medians of {args.repeats} (ms); ratio: libggml's time / ours")
    print(f"{'type':>5} {'shape':>10} {'cols':>5} {'libggml':>9} {'pyggml':>9} {'ratio':>6} {'bits':>5}")
    for wtype in (GGMLType[name.strip()] for name in args.types.split(",")):
        for m, k in args.shapes:
            raw = half_weights(rng, wtype, m, k)
            for n in (1, 128):
                x = rng.standard_normal((n, k), dtype=np.float32)
                theirs = ggml_c.MulMatInBuft(lib, buft, ggml_c.c_type(wtype), raw, x, args.threads)
                values = raw.view({GGMLType.F32: np.float32, GGMLType.F16: np.float16}.get(wtype, np.uint16))
                ours = Ours(wtype, values, x, args.threads, repacked=False)
                try:
                    theirs.compute()
                    want = np.empty((n, m), np.float32)
                    theirs.result(want)
                    same = np.array_equal(ours.result().view(np.uint32), want.view(np.uint32))
                    t_c, t_o = medians([theirs.compute, ours.compute], args.repeats)
                    print(f"{wtype.name:>5} {m:>5}x{k:<5} {n:>4} {t_c * 1e3:>9.3f} {t_o * 1e3:>9.3f} "
                          f"{t_c / t_o:>5.2f}x {'equal' if same else 'differ':>6}")
                finally:
                    theirs.free()
                    ours.ctx.free()


if __name__ == "__main__":
    main()
