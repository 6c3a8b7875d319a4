"""Decode products as a model streams them: many distinct weight matrices, one column each, pyggml's graph plan
(the graph runner, as a decode step runs them) against libggml's CPU backend in the same run.

N matrices of ROWSxLENGTH (more bytes than the L3 cache, so every product reads its weights from memory) times one
column; pyggml computes all N in one graph plan, libggml one graph per matrix. Medians of --repeats alternating
passes, GB/s of weights streamed. With --gguf FILE pyggml's matrices are FILE's tensors of that shape in place in
the file's mapping (as a loaded model's), libggml's copies in its own buffer: a model file's page cache held in
small folios costs its mapping TLB misses a fresh buffer does not pay.

    python benchmarks/bench_decode_stream.py [--types F16,BF16] [--shapes 5632x2048:16,2048x5632:16] [--threads 2]
        [--gguf random-tinyllama-1.1b-F16.gguf]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_half import half_weights

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_set
from pyggml.ggml_backend.tensor_alloc import tensor_alloc
from pyggml.gguf.reader import GGUFFile
from pyggml.testing import alloc_ctx_tensors, ggml_c

SHAPES = "2048x2048:40,5632x2048:16,2048x5632:16"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'ROWSxLENGTH:COUNT,...' as (rows, length, count)."""
    out = []
    for part in text.split(","):
        shape, _, count = part.strip().partition(":")
        m, _, k = shape.lower().partition("x")
        if not (m.isdigit() and k.isdigit() and count.isdigit()):
            raise SystemExit(f"--shapes: {part!r} is not ROWSxLENGTH:COUNT")
        out.append((int(m), int(k), int(count)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="F16,BF16")
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes(SHAPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--gguf", help="take pyggml's matrices from this file's mapping (tensors of the shape)")
    args = parser.parse_args()
    lib = ggml_c.load()
    buft = lib.ggml_backend_cpu_buffer_type()
    gf = GGUFFile(args.gguf) if args.gguf else None
    backend = cpu_init(args.threads)
    rng = np.random.default_rng(0)
    print(f"decode products of many matrices, {args.threads} threads, medians of {args.repeats} (ms, GB/s of "
          f"weights); ratio: libggml's time / pyggml's" + (f"; pyggml's weights in {gf.name}'s mapping" if gf else ""))
    print(f"{'type':>5} {'shape':>12} {'count':>5} {'libggml':>16} {'pyggml':>16} {'ratio':>6}")
    for wtype in (GGMLType[name.strip()] for name in args.types.split(",")):
        for m, k, count in args.shapes:
            nbytes = m * k * 2
            in_file = [] if gf is None else [i for i in gf.tensors.values() if i.type == wtype and i.nbytes == nbytes
                                             and list(i.ne[:2]) == [k, m]][:count]
            if gf is not None and len(in_file) < count:
                print(f"{wtype.name:>5} {m:>6}x{k:<5}: {gf.name} has {len(in_file)} such tensors, not {count}")
                continue
            ctx = Context(mem_size=1 << 24, no_alloc=True)
            x = ctx.new_tensor_2d(GGMLType.F32, k, 1)
            ws = [ctx.new_tensor_2d(wtype, k, m) for _ in range(count)]
            graph = ctx.new_graph()
            for w in ws:
                graph.build_forward_expand(ctx.mul_mat(w, x))
            raws = []
            if gf is not None:
                mapped = backend.buffer_from_host_ptr(gf.data, gf.data.nbytes, nbytes)
                for info, w in zip(in_file, ws, strict=True):
                    tensor_alloc(mapped, w, mapped.get_base() + info.offset)
                    raws.append(np.asarray(gf.data[info.offset:info.offset + nbytes]))
            alloc_ctx_tensors(ctx, backend)  # x and the products (and the weights without --gguf)
            xv = rng.standard_normal((1, k), dtype=np.float32)
            tensor_set(x, xv)
            theirs = []
            for i, w in enumerate(ws):
                if gf is None:
                    raws.append(half_weights(rng, wtype, m, k))
                    tensor_set(w, raws[i].view(np.uint16).reshape(m, k))
                theirs.append(ggml_c.MulMatInBuft(lib, buft, ggml_c.c_type(wtype), raws[i].reshape(m, -1), xv,
                                                  args.threads))
            del raws
            plan = backend.graph_plan_create(graph)
            try:
                backend.graph_plan_compute(plan)
                for t in theirs:
                    t.compute()
                t_c, t_o = [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for t in theirs:
                        t.compute()
                    t_c.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    backend.graph_plan_compute(plan)
                    t_o.append(time.perf_counter() - t0)
                c, o = float(np.median(t_c)), float(np.median(t_o))
                gb = count * nbytes / 1e9
                print(f"{wtype.name:>5} {m:>6}x{k:<5} {count:>5} {c * 1e3:>8.2f} {gb / c:>6.1f} GB/s "
                      f"{o * 1e3:>8.2f} {gb / o:>6.1f} GB/s {c / o:>5.2f}x")
            finally:
                for t in theirs:
                    t.free()
                backend.graph_plan_free(plan)
                ctx.free()


if __name__ == "__main__":
    main()
