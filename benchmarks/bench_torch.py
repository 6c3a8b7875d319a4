"""The torch backend against the CPU backend, measured in the same run (same thread count for both).

(a) MUL_MAT GFLOP/s with 4096x4096 weights (F32 and BF16; --types for more)
    times 512 columns (a prompt) and 1 column (a mat-vec: decoding), each
    backend computing a graph plan made once; the torch backend's converted
    weights (BF16 widened to f32) come from its weight cache after the first
    call, as they do for a model's weights.
(b) A LLaMA block (TinyLlama-1.1B's layer: n_embd 2048, n_ff 5632, 32 heads,
    4 KV heads; one layer, a 256-token vocabulary so the block dominates) in
    F16, computed by the scheduler: on the CPU backend alone, and with the
    layer's weights and KV cache on the torch backend (embedding, output head
    and inputs on the CPU), for a prompt of --tokens tokens and for one
    decoded token. Skipped if pyggml.sched is missing.
(--sweep) BF16/F16 weights by src1 columns, the torch backend's native half
    matmul against the widened f32 path: this sets HALF_NATIVE_MAX_COLS.

Times are medians of --repeats runs, the peers taking turns in rounds.

    python benchmarks/bench_torch.py [--repeats 9] [--threads 2] [--tokens 512] [--sweep] [--no-llama]
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from pyggml.backends.cpu import cpu_init
from pyggml.backends.torch import torch_init
from pyggml.backends.torch.kernels import matmul as torch_matmul
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.graph import graph_overhead
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend, tensor_get_numpy, tensor_set, tensor_set_numpy
from pyggml.testing import alloc_ctx_tensors

M = K = 4096


def medians(fns: list[Callable[[], None]], repeats: int, rounds: int = 3) -> list[float]:
    """Median seconds of each function over `repeats` calls, in `rounds` blocks taking turns, after a warm-up."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    per_round = max(1, repeats // rounds)
    for _ in range(rounds):
        for fn, ts in zip(fns, times, strict=True):
            time.sleep(0.2)
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


# --- (a) MUL_MAT ---


class MatMul:
    """out = mul_mat(W, x) with W [K, M] of `wtype` and x [K, n] F32 on `backend`, as a plan."""

    def __init__(self, backend: Backend, wtype: GGMLType, n: int, w: np.ndarray, x: np.ndarray) -> None:
        self.backend = backend
        self.ctx = Context(mem_size=1 << 20, no_alloc=True)
        wt = self.ctx.new_tensor_2d(wtype, K, M).set_name("w")
        xt = self.ctx.new_tensor_2d(GGMLType.F32, K, n).set_name("x")
        self.out = self.ctx.mul_mat(wt, xt)
        self.buffer = alloc_ctx_tensors(self.ctx, backend)
        tensor_set_numpy(wt, w)
        tensor_set_numpy(xt, x[:n])
        g = self.ctx.new_graph()
        g.build_forward_expand(self.out)
        self.plan = backend.graph_plan_create(g)

    def __call__(self) -> None:
        self.backend.graph_plan_compute(self.plan)

    def result(self) -> np.ndarray:
        return tensor_get_numpy(self.out)

    def free(self) -> None:
        self.backend.graph_plan_free(self.plan)
        self.buffer.free()


def bench_matmul(tb: Backend, cpu: Backend, types: list[GGMLType], repeats: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((M, K), dtype=np.float32) / 64
    x = rng.standard_normal((512, K), dtype=np.float32)
    print(f"(a) MUL_MAT, {M}x{K} weights, GFLOP/s (median of {repeats})")
    print(f"    {'weights':<8} {'columns':>7}  {'torch':>16}  {'CPU':>16}  torch/CPU  NMSE(torch vs CPU)")
    for wtype in types:
        for n in (512, 1):
            ours, peer = MatMul(tb, wtype, n, w, x), MatMul(cpu, wtype, n, w, x)
            t_ours, t_peer = medians([ours, peer], repeats if n > 1 else 3 * repeats)
            a, b = ours.result().astype(np.float64), peer.result().astype(np.float64)
            nmse = float(np.sum((a - b) ** 2) / np.sum(b**2))
            flops = 2.0 * M * K * n
            print(f"    {wtype.name:<8} {n:>7}  {flops / t_ours / 1e9:>7.1f} ({t_ours * 1e3:>6.1f} ms)  "
                  f"{flops / t_peer / 1e9:>7.1f} ({t_peer * 1e3:>6.1f} ms)  {t_peer / t_ours:>8.2f}x  {nmse:.1e}")
            ours.free()
            peer.free()


def sweep(tb: Backend, repeats: int) -> None:
    """Native half matmul vs widened f32 on the torch backend, by columns (sets HALF_NATIVE_MAX_COLS)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((M, K), dtype=np.float32) / 64
    x = rng.standard_normal((32, K), dtype=np.float32)
    saved = torch_matmul.HALF_NATIVE_MAX_COLS
    print("(sweep) torch backend, half weights: native half matmul vs widened to f32 (ms, median)")
    try:
        for wtype in (GGMLType.BF16, GGMLType.F16):
            for n in (1, 2, 3, 4, 6, 8, 16):
                torch_matmul.HALF_NATIVE_MAX_COLS = 1 << 30
                native = MatMul(tb, wtype, n, w, x)
                torch_matmul.HALF_NATIVE_MAX_COLS = 0
                widened = MatMul(tb, wtype, n, w, x)
                t_n, t_w = medians([native, widened], repeats)
                print(f"    {wtype.name:<5} n={n:>2}: native {t_n * 1e3:7.2f}  widened {t_w * 1e3:7.2f}  "
                      f"{'native' if t_n < t_w else 'widened'} wins")
                native.free()
                widened.free()
    finally:
        torch_matmul.HALF_NATIVE_MAX_COLS = saved


# --- (b) a LLaMA block through the scheduler ---


def bench_llama(tb: Backend, cpu_a: Backend, cpu_b: Backend, cpu_c: Backend, n_tokens: int,
                repeats: int) -> None:
    try:
        from pyggml.seed import Scheduler
    except ImportError:
        print("(b) skipped: pyggml.sched is not available")
        return
    from pyggml.models.kv_cache import KVCache
    from pyggml.models.llama import LlamaHParams, build_llama, graph_size, layer_of, tensor_names

    hp = LlamaHParams(n_vocab=256, n_ctx_train=2048, n_embd=2048, n_layer=1, n_ff=5632, n_head=32, n_head_kv=4,
                      n_rot=64, f_norm_rms_eps=1e-5, rope_freq_base=10000.0, rope_freq_scale=1.0)
    n_ctx = n_tokens + 8
    wtype = GGMLType.F16
    e, f, kv = hp.n_embd, hp.n_ff, hp.n_embd_gqa
    shapes = {"token_embd": [e, hp.n_vocab], "output_norm": [e], "output": [e, hp.n_vocab], "attn_norm": [e],
              "attn_q": [e, e], "attn_k": [e, kv], "attn_v": [e, kv], "attn_output": [e, e], "ffn_norm": [e],
              "ffn_gate": [e, f], "ffn_up": [e, f], "ffn_down": [f, e]}
    rng = np.random.default_rng(2)
    values = {n: (rng.standard_normal(shapes[n.split(".")[-2]][::-1], dtype=np.float32)
                  / math.sqrt(shapes[n.split(".")[-2]][0]) + (1.0 if "norm" in n else 0.0)) for n in tensor_names(hp)}

    class Setup:
        def __init__(self, backends: list[Backend], layer: Backend, host: Backend, pin: bool = False) -> None:
            self.pin = pin
            self.layer = layer
            self.buffers = []
            self.w = {}
            groups: dict[int, tuple[Backend, list[str]]] = {}
            for name in tensor_names(hp):
                b = layer if layer_of(name) is not None else host
                groups.setdefault(id(b), (b, []))[1].append(name)
            for b, names in groups.values():
                ctx = Context(mem_size=32 * tensor_overhead(), no_alloc=True)
                for name in names:
                    shape = shapes[name.split(".")[-2]]
                    self.w[name] = ctx.new_tensor(GGMLType.F32 if "norm" in name else wtype, shape).set_name(name)
                self.buffers.append(alloc_ctx_tensors(ctx, b))
                for name in names:
                    tensor_set_numpy(self.w[name], values[name])
            self.kv = KVCache(1, n_ctx, kv, [layer], GGMLType.F16)
            self.host = host
            self.sched = Scheduler(backends)
            ctx, g, ins, _ = self.graph(n_tokens, 0)  # the prompt graph: the largest one computed
            talloc = self.sched.get_tallocr(host)
            for t in ins:
                talloc.alloc(t)
            self.sched.init_measure(g)
            ctx.free()
            self.logits: np.ndarray | None = None

        def graph(self, n: int, n_past: int) -> tuple:
            size = graph_size(hp)
            ctx = Context(mem_size=size * tensor_overhead() + graph_overhead(size), no_alloc=True)
            g, inp = build_llama(ctx, hp, self.w, self.kv, n, n_past, set_rows=False, glu=False)
            if self.pin:
                # as llama.cpp's per-layer callback: every node from the layer's first named node to its last
                # runs on the layer's backend (else ROPE and SOFT_MAX follow their CPU inputs pos and mask)
                idx = [i for i, t in enumerate(g.nodes) if re.search(r"-0( |$)", t.name)]
                for t in g.nodes[min(idx): max(idx) + 1]:
                    self.sched.set_node_backend(t, self.layer)
            return ctx, g, [inp.tokens, inp.pos, inp.mask], inp.logits

        def step(self, n: int, n_past: int) -> None:
            ctx, g, (tok, pos, mask), logits = self.graph(n, n_past)
            talloc = self.sched.get_tallocr(self.host)
            for t in (tok, pos, mask):
                talloc.alloc(t)
            p = np.arange(n_past, n_past + n, dtype=np.int32)
            tensor_set(tok, (np.arange(n) * 7 % hp.n_vocab).astype(np.int32))
            tensor_set(pos, p)
            tensor_set(mask, np.where(np.arange(n_past + n)[None, :] <= p[:, None], 0.0, -np.inf).astype(np.float32))
            self.sched.graph_compute(g)
            self.logits = tensor_get_numpy(logits)
            ctx.free()

        def free(self) -> None:
            self.sched.free()
            self.kv.free()
            for b in self.buffers:
                b.free()

    cpu_only = Setup([cpu_a], cpu_a, cpu_a)
    split = Setup([tb, cpu_b], tb, cpu_b)
    pinned = Setup([tb, cpu_c], tb, cpu_c, pin=True)
    print(f"(b) LLaMA block (TinyLlama-1.1B layer, F16 weights, F16 KV cache) through the scheduler, "
          f"ms (median of {repeats}); torch+CPU: the scheduler's own assignment, and the layer pinned")
    for label, n, n_past in ((f"prompt of {n_tokens} tokens", n_tokens, 0), ("one decoded token", 1, n_tokens)):
        setups = [cpu_only, split, pinned]
        times = medians([lambda s=s, n=n, p=n_past: s.step(n, p) for s in setups], repeats)
        line = f"    {label:<22} CPU alone {times[0] * 1e3:8.1f}"
        for name, s, t in (("torch+CPU", split, times[1]), ("pinned", pinned, times[2])):
            a, b = s.logits.astype(np.float64), cpu_only.logits.astype(np.float64)
            nmse = float(np.sum((a - b) ** 2) / np.sum(b**2))
            line += (f" | {name} {t * 1e3:8.1f} (CPU/this {times[0] / t:4.2f}x, {s.sched.n_splits} splits, "
                     f"NMSE {nmse:.0e})")
        print(line)
    for s in (cpu_only, split, pinned):
        s.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--types", default="F32,BF16", help="weight types for (a), e.g. F32,BF16,F16,Q8_0,Q4_0")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    args = ap.parse_args()
    tb = torch_init(n_threads=args.threads)
    cpu = cpu_init(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, torch backend: {tb.name()}, "
          f"fast BF16 matmul: {tb.half_is_fast(torch.bfloat16)}, fast F16 matmul: {tb.half_is_fast(torch.float16)}")
    if args.sweep:
        sweep(tb, args.repeats)
    bench_matmul(tb, cpu, [GGMLType[t.strip().upper()] for t in args.types.split(",")], args.repeats)
    if not args.no_llama:
        bench_llama(tb, cpu, cpu_init(args.threads), cpu_init(args.threads), args.tokens, args.repeats)


if __name__ == "__main__":
    main()
