"""Graphs for allocator tests and benchmarks: a LLaMA-like forward pass built from core ops only.

`build_llama_graph` makes the graph llama.cpp of late 2023 builds for one
batch (token embedding by GET_ROWS, RMS_NORM, Q/K/V by MUL_MAT, ROPE, the new
K and V copied into views of a KV cache, attention over cache views with
SOFT_MAX ext and a causal mask, SwiGLU feed-forward, the output head), with
no model file: weights and the KV cache are leafs without memory, to be
placed by `place_weights` (fake addresses for measuring, or a real buffer
with random values for computing). It exists so that the allocators can be
measured on the graph shape they are made for, at any size: a measure
allocator touches no memory, so llama-7B dimensions cost nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyggml.alloc.tensor_allocator import MEASURE_BASE, SIZE_MAX, MeasureBuffer, TensorAllocator, aligned_offset
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.backend import Backend

__all__ = ["LlamaDims", "build_llama_graph", "llama_input_values", "place_weights"]

ROPE_MODE_NORMAL = 0


@dataclass(frozen=True)
class LlamaDims:
    """Dimensions of a LLaMA-like model (defaults small; llama-7B is LlamaDims.llama_7b())."""

    n_layers: int = 2
    n_tokens: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_vocab: int = 100
    n_ctx: int = 16

    @staticmethod
    def llama_7b(n_layers: int = 32, n_tokens: int = 512, n_ctx: int = 512) -> LlamaDims:
        return LlamaDims(n_layers, n_tokens, 4096, 32, 32, 11008, 32000, n_ctx)


def graph_size(n_layers: int) -> int:
    """Nodes (and leafs) a graph of `n_layers` needs: about 40 nodes and 20 leafs a layer."""
    return max(512, 64 * n_layers + 64)


def build_llama_graph(ctx: Context, n_layers: int, n_tokens: int, n_embd: int = 64, n_head: int = 4,
                      n_head_kv: int | None = None, n_ff: int = 128, n_vocab: int = 100, n_ctx: int = 16,
                      n_past: int = 0, n_kv: int | None = None, wtype: GGMLType = GGMLType.F32,
                      kv_type: GGMLType = GGMLType.F32,
                      eps: float = 1e-5) -> tuple[Graph, dict[str, Tensor], list[Tensor]]:
    """The forward graph of `n_tokens` tokens at positions n_past.., as llama.cpp builds it.

    Returns (graph, inputs, weights): inputs are "tokens" (I32 [n_tokens]),
    "pos" (I32 [n_tokens]), "kq_mask" (F32 [n_kv, n_tokens]) and "logits"
    (the output node); weights are every weight and the per-layer KV cache
    tensors (k_cache-i, v_cache-i), none with memory yet. Attention reads
    cells 0..n_kv (default n_ctx, llama.cpp's worst case for measuring).
    """
    if n_head_kv is None:
        n_head_kv = n_head
    if n_embd % n_head or n_head % n_head_kv:
        raise ArgumentError(f"build_llama_graph: n_embd {n_embd} must be a multiple of n_head {n_head}, "
                            f"and n_head a multiple of n_head_kv {n_head_kv}")
    if n_kv is None:
        n_kv = n_ctx
    if not n_past + n_tokens <= n_kv <= n_ctx:
        raise ArgumentError(f"build_llama_graph: n_kv {n_kv} must cover n_past {n_past} + n_tokens {n_tokens} "
                            f"and fit n_ctx {n_ctx}")
    head_dim = n_embd // n_head
    n_embd_gqa = head_dim * n_head_kv
    weights: list[Tensor] = []

    def weight(type_: GGMLType, ne: list[int], name: str) -> Tensor:
        t = ctx.new_tensor(type_, ne).set_name(name)
        weights.append(t)
        return t

    gf = ctx.new_graph(graph_size(n_layers))
    tokens = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_tokens").set_input()
    pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_pos").set_input()
    mask = ctx.new_tensor_2d(GGMLType.F32, n_kv, n_tokens).set_name("KQ_mask").set_input()
    kq_scale = 1.0 / math.sqrt(head_dim)

    tok_embd = weight(wtype, [n_embd, n_vocab], "token_embd.weight")
    x = ctx.get_rows(tok_embd, tokens).set_name("inp_embd")
    for il in range(n_layers):
        attn_norm = weight(GGMLType.F32, [n_embd], f"blk.{il}.attn_norm.weight")
        wq = weight(wtype, [n_embd, n_embd], f"blk.{il}.attn_q.weight")
        wk = weight(wtype, [n_embd, n_embd_gqa], f"blk.{il}.attn_k.weight")
        wv = weight(wtype, [n_embd, n_embd_gqa], f"blk.{il}.attn_v.weight")
        wo = weight(wtype, [n_embd, n_embd], f"blk.{il}.attn_output.weight")
        ffn_norm = weight(GGMLType.F32, [n_embd], f"blk.{il}.ffn_norm.weight")
        w_gate = weight(wtype, [n_embd, n_ff], f"blk.{il}.ffn_gate.weight")
        w_up = weight(wtype, [n_embd, n_ff], f"blk.{il}.ffn_up.weight")
        w_down = weight(wtype, [n_ff, n_embd], f"blk.{il}.ffn_down.weight")
        k_cache = weight(kv_type, [n_ctx * n_embd_gqa], f"k_cache-{il}")
        v_cache = weight(kv_type, [n_ctx * n_embd_gqa], f"v_cache-{il}")
        es = k_cache.nb[0]

        inp_sa = x
        cur = ctx.mul(ctx.rms_norm(x, eps), attn_norm).set_name(f"attn_norm-{il}")

        # self-attention
        q = ctx.mul_mat(wq, cur).set_name(f"Qcur-{il}")
        k = ctx.mul_mat(wk, cur).set_name(f"Kcur-{il}")
        v = ctx.mul_mat(wv, cur).set_name(f"Vcur-{il}")
        q = ctx.rope(ctx.reshape_3d(q, head_dim, n_head, n_tokens), pos, head_dim, ROPE_MODE_NORMAL, 0)
        q.set_name(f"Qcur-rope-{il}")
        k = ctx.rope(ctx.reshape_3d(k, head_dim, n_head_kv, n_tokens), pos, head_dim, ROPE_MODE_NORMAL, 0)
        k.set_name(f"Kcur-rope-{il}")

        # store K and V^T in the cache at cells n_past..
        k_view = ctx.view_1d(k_cache, n_tokens * n_embd_gqa, es * n_embd_gqa * n_past)
        k_view.set_name(f"k_cache_view-{il}")
        v_t = ctx.transpose(ctx.reshape_2d(v, n_embd_gqa, n_tokens))
        v_view = ctx.view_2d(v_cache, n_tokens, n_embd_gqa, es * n_ctx, es * n_past)
        v_view.set_name(f"v_cache_view-{il}")
        gf.build_forward_expand(ctx.cpy(k, k_view))
        gf.build_forward_expand(ctx.cpy(v_t, v_view))

        q = ctx.permute(q, 0, 2, 1, 3)  # [head_dim, n_tokens, n_head]
        keys = ctx.view_3d(k_cache, head_dim, n_kv, n_head_kv, es * n_embd_gqa, es * head_dim, 0)
        keys.set_name(f"k-{il}")
        kq = ctx.mul_mat(keys, q).set_name(f"kq-{il}")  # [n_kv, n_tokens, n_head]
        kq = ctx.soft_max_ext(kq, mask, kq_scale).set_name(f"kq_soft_max-{il}")
        values = ctx.view_3d(v_cache, n_kv, head_dim, n_head_kv, es * n_ctx, es * n_ctx * head_dim, 0)
        values.set_name(f"v-{il}")
        kqv = ctx.mul_mat(values, kq).set_name(f"kqv-{il}")  # [head_dim, n_tokens, n_head]
        cur = ctx.cont_2d(ctx.permute(kqv, 0, 2, 1, 3), n_embd, n_tokens).set_name(f"kqv_merged-{il}")
        cur = ctx.mul_mat(wo, cur).set_name(f"attn_out-{il}")
        ffn_inp = ctx.add(cur, inp_sa).set_name(f"ffn_inp-{il}")

        # feed-forward (SwiGLU)
        cur = ctx.mul(ctx.rms_norm(ffn_inp, eps), ffn_norm).set_name(f"ffn_norm-{il}")
        up = ctx.mul_mat(w_up, cur).set_name(f"ffn_up-{il}")
        gate = ctx.silu(ctx.mul_mat(w_gate, cur)).set_name(f"ffn_silu-{il}")
        cur = ctx.mul_mat(w_down, ctx.mul(gate, up)).set_name(f"ffn_out-{il}")
        x = ctx.add(cur, ffn_inp).set_name(f"l_out-{il}")

    output_norm = weight(GGMLType.F32, [n_embd], "output_norm.weight")
    output = weight(wtype, [n_embd, n_vocab], "output.weight")
    cur = ctx.mul(ctx.rms_norm(x, eps), output_norm).set_name("result_norm")
    logits = ctx.mul_mat(output, cur).set_name("result_output").set_output()
    gf.build_forward_expand(logits)
    inputs = {"tokens": tokens, "pos": pos, "kq_mask": mask, "logits": logits}
    return gf, inputs, weights


def llama_input_values(inputs: dict[str, Tensor], n_past: int = 0, n_vocab: int = 100,
                       seed: int = 0) -> dict[str, np.ndarray]:
    """Values for the graph's inputs: random tokens, positions n_past.., a causal mask over the n_kv cells."""
    tokens, mask = inputs["tokens"], inputs["kq_mask"]
    n_tokens, n_kv = tokens.ne[0], mask.ne[0]
    rng = np.random.default_rng(seed)
    pos = np.arange(n_past, n_past + n_tokens, dtype=np.int32)
    kq = np.zeros((n_tokens, n_kv), dtype=np.float32)
    cells = np.arange(n_kv)
    kq[cells[None, :] > pos[:, None]] = -np.inf
    return {
        "tokens": rng.integers(0, n_vocab, n_tokens).astype(np.int32),
        "pos": pos,
        "kq_mask": kq,
    }


def place_weights(weights: list[Tensor], backend: Backend | None = None, seed: int = 0) -> TensorAllocator:
    """Give the weights memory outside any compute buffer, as a model file's weights have it.

    Without a backend they get fake addresses from a measure allocator (no
    memory: for measuring graphs of any size). With one, they go one after
    another into a new buffer of it (the allocator owns it: `free()` releases
    it), filled with small random values, the KV cache with zeros.
    Returns the weights' allocator.
    """
    if backend is None:
        talloc = TensorAllocator(MeasureBuffer(MEASURE_BASE, SIZE_MAX // 2), buffer_owned=True, alignment=32,
                                 measure=True)
        talloc.buffer.name = "weights (measure)"
        for w in weights:
            talloc.alloc(w)
        return talloc

    from pyggml.ggml_backend.tensor_io import tensor_set_numpy

    probe = backend.alloc_buffer(1)
    try:
        align = probe.get_alignment()
        total = sum(aligned_offset(None, probe.get_alloc_size(w), align) for w in weights)
    finally:
        probe.free()
    talloc = TensorAllocator.new_from_backend(backend, total)
    talloc.buffer.name = "weights"
    rng = np.random.default_rng(seed)
    for w in weights:
        talloc.alloc(w)
        shape = tuple(reversed(w.ne[: w.n_dims()]))
        if w.name.startswith(("k_cache", "v_cache")):
            values = np.zeros(shape, dtype=np.float32)
        elif w.name.endswith("norm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape).astype(np.float32)
        else:
            values = (rng.standard_normal(shape) / math.sqrt(w.ne[0])).astype(np.float32)
        tensor_set_numpy(w, values)
    return talloc
