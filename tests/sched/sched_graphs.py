"""Graphs of the scheduler tests: a small graph worked out by hand, and a small LLaMA block
(attention without KV cache, SwiGLU feed-forward).

Weights go to the backend `weight_backend(name)` picks, each in one buffer per
backend; the graph's inputs (x, pos, mask) are left without memory for the
caller to place. `compute_on_one_backend` is the reference: the same block
on one CPU backend with the graph allocator, no scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set, tensor_set_numpy
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.seed import Scheduler

N_EMBD, N_HEAD, N_FF = 8, 2, 16
HEAD_DIM = N_EMBD // N_HEAD
EPS = 1e-5

WEIGHT_SHAPES = {
    "attn_norm": [N_EMBD], "wq": [N_EMBD, N_EMBD], "wk": [N_EMBD, N_EMBD], "wv": [N_EMBD, N_EMBD],
    "wo": [N_EMBD, N_EMBD], "ffn_norm": [N_EMBD], "w_gate": [N_EMBD, N_FF], "w_up": [N_EMBD, N_FF],
    "w_down": [N_FF, N_EMBD],
}


@dataclass
class Weights:
    tensors: dict[str, Tensor]
    values: dict[str, np.ndarray]
    buffers: list[Buffer]

    def free(self) -> None:
        for b in self.buffers:
            b.free()


def make_weights(weight_backend: Callable[[str], Backend], seed: int = 7) -> Weights:
    rng = np.random.default_rng(seed)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    tensors: dict[str, Tensor] = {}
    values: dict[str, np.ndarray] = {}
    by_backend: dict[int, tuple[Backend, list[Tensor]]] = {}
    for name, ne in WEIGHT_SHAPES.items():
        t = ctx.new_tensor(GGMLType.F32, ne).set_name(name)
        tensors[name] = t
        values[name] = (rng.standard_normal(list(reversed(ne))) * (1.0 if len(ne) == 1 else 0.4)).astype(np.float32)
        b = weight_backend(name)
        by_backend.setdefault(id(b), (b, []))[1].append(t)
    buffers = []
    for backend, ts in by_backend.values():
        buffer = backend.alloc_buffer(sum(t.nbytes() + 64 for t in ts))
        talloc = TensorAllocator.new_from_buffer(buffer)
        for t in ts:
            talloc.alloc(t)
            tensor_set_numpy(t, values[t.name])
        buffers.append(buffer)
    return Weights(tensors, values, buffers)


@dataclass
class Block:
    ctx: Context
    graph: Graph
    x: Tensor
    pos: Tensor
    mask: Tensor
    out: Tensor

    @property
    def inputs(self) -> list[Tensor]:
        return [self.x, self.pos, self.mask]


def build_block(w: dict[str, Tensor], n_tokens: int, graph_size: int = 2048) -> Block:
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    x = ctx.new_tensor_2d(GGMLType.F32, N_EMBD, n_tokens).set_name("x").set_input()
    pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("pos").set_input()
    mask = ctx.new_tensor_2d(GGMLType.F32, n_tokens, n_tokens).set_name("mask").set_input()

    cur = ctx.mul(ctx.rms_norm(x, EPS).set_name("norm"), w["attn_norm"]).set_name("attn_norm-0")
    q = ctx.mul_mat(w["wq"], cur).set_name("Qcur")
    k = ctx.mul_mat(w["wk"], cur).set_name("Kcur")
    v = ctx.mul_mat(w["wv"], cur).set_name("Vcur")
    q = ctx.rope(ctx.reshape_3d(q, HEAD_DIM, N_HEAD, n_tokens).set_name("Qr"), pos, HEAD_DIM, 0).set_name("Qrope")
    k = ctx.rope(ctx.reshape_3d(k, HEAD_DIM, N_HEAD, n_tokens).set_name("Kr"), pos, HEAD_DIM, 0).set_name("Krope")
    q = ctx.permute(q, 0, 2, 1, 3).set_name("Q")
    k = ctx.permute(k, 0, 2, 1, 3).set_name("K")
    kq = ctx.mul_mat(k, q).set_name("kq")
    kq = ctx.soft_max_ext(kq, mask, 1.0 / math.sqrt(HEAD_DIM)).set_name("kq_soft_max")
    vt = ctx.cont(ctx.permute(ctx.reshape_3d(v, HEAD_DIM, N_HEAD, n_tokens).set_name("Vr"), 1, 2, 0, 3)
                  .set_name("Vp")).set_name("Vt")
    kqv = ctx.mul_mat(vt, kq).set_name("kqv")
    merged = ctx.cont_2d(ctx.permute(kqv, 0, 2, 1, 3).set_name("kqv_p"), N_EMBD, n_tokens).set_name("kqv_merged")
    attn_out = ctx.mul_mat(w["wo"], merged).set_name("attn_out")
    ffn_inp = ctx.add(attn_out, x).set_name("ffn_inp")
    cur = ctx.mul(ctx.rms_norm(ffn_inp, EPS).set_name("norm_ffn"), w["ffn_norm"]).set_name("ffn_norm-0")
    up = ctx.mul_mat(w["w_up"], cur).set_name("ffn_up")
    gate = ctx.silu(ctx.mul_mat(w["w_gate"], cur).set_name("ffn_gate")).set_name("ffn_silu")
    down = ctx.mul_mat(w["w_down"], ctx.mul(gate, up).set_name("ffn_par")).set_name("ffn_out")
    out = ctx.add(down, ffn_inp).set_name("l_out").set_output()
    graph = ctx.new_graph(graph_size)
    graph.build_forward_expand(out)
    return Block(ctx, graph, x, pos, mask, out)


def input_values(n_tokens: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tokens, N_EMBD)).astype(np.float32)
    pos = np.arange(n_tokens, dtype=np.int32)
    mask = np.triu(np.full((n_tokens, n_tokens), -np.inf, dtype=np.float32), 1)
    return x, pos, mask


def set_inputs(block: Block, values: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    for t, v in zip(block.inputs, values, strict=True):
        tensor_set_numpy(t, v)


def compute_on_one_backend(backend: Backend, n_tokens: int, values: tuple[np.ndarray, np.ndarray, np.ndarray],
                           seed: int = 7) -> np.ndarray:
    """The block on `backend` alone: weights, inputs and intermediates in its buffers."""
    weights = make_weights(lambda name: backend, seed)
    block = build_block(weights.tensors, n_tokens)
    buffer = backend.alloc_buffer(1 << 16)
    try:
        talloc = TensorAllocator.new_from_buffer(buffer)
        for t in block.inputs:
            talloc.alloc(t)
        set_inputs(block, values)
        GraphAllocator().alloc_graph(talloc, block.graph)
        backend.graph_compute(block.graph)
        return tensor_get_numpy(block.out)
    finally:
        buffer.free()
        weights.free()


def split_table(sched: Scheduler) -> list[tuple[object, int, int, list[str]]]:
    return [(s.backend, s.i_start, s.i_end, [t.name for t in s.inputs]) for s in sched.splits]


class SmallGraph:
    def __init__(self, w: object) -> None:
        self.ctx = ctx = Context(mem_size=1 << 20, no_alloc=True)
        self.x = ctx.new_tensor_2d(GGMLType.F32, 4, 2).set_name("x")
        self.x2 = ctx.new_tensor_2d(GGMLType.F32, 6, 1).set_name("x2")
        self.y = ctx.mul_mat(w, self.x).set_name("y")
        self.r = ctx.relu(self.y).set_name("r")
        self.rr = ctx.reshape_2d(self.r, 6, 1).set_name("rr")
        self.m = ctx.mul(self.rr, self.x2).set_name("m")
        self.yr = ctx.reshape_2d(self.y, 6, 1).set_name("yr")
        self.out = ctx.add(self.m, self.yr).set_name("out")
        self.graph = ctx.new_graph()
        self.graph.build_forward_expand(self.out)


def small_run(sched: Scheduler, w: object, input_backend: object, rng: np.random.Generator | None):
    g = SmallGraph(w)
    talloc = sched.get_tallocr(input_backend)
    talloc.alloc(g.x)
    talloc.alloc(g.x2)
    if rng is None:
        sched.init_measure(g.graph)
        return g, None, None
    X = rng.standard_normal((2, 4)).astype(np.float32)
    X2 = rng.standard_normal((1, 6)).astype(np.float32)
    tensor_set(g.x, X)
    tensor_set(g.x2, X2)
    sched.graph_compute(g.graph)
    return g, X, X2


def run_block(sched: Scheduler, weights: object, n_tokens: int, input_backend: object,
              values: tuple | None):
    """Build a new block graph, place its inputs in the scheduler's buffer of `input_backend`, then
    init_measure (values None) or set the inputs and compute."""
    block = build_block(weights.tensors, n_tokens)
    talloc = sched.get_tallocr(input_backend)
    for t in block.inputs:
        talloc.alloc(t)
    if values is None:
        sched.init_measure(block.graph)
    else:
        set_inputs(block, values)
        sched.graph_compute(block.graph)
    return block
