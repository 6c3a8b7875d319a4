"""LLaMA: hyperparameters from GGUF metadata and the compute graph as llama.cpp builds it.

The graph (llama.cpp's `build_llama`, late 2023), for a batch of n_tokens
tokens at positions n_past.. with n_kv = n_past + n_tokens cells of cache:

    x = token_embd[tokens]                                  GET_ROWS
    for each layer:
        h = rms_norm(x) * attn_norm
        q = rope(wq @ h), k = rope(wk @ h), v = wv @ h       RoPE normal mode, the file's freq base/scale
        cache[n_past : n_past + n_tokens] = k, v             CPY into views of the KV cache
        a = softmax(K^T q * 1/sqrt(head_dim) + mask) V      GQA: each KV head serves n_head / n_head_kv heads
        x = x + wo @ a
        h = rms_norm(x) * ffn_norm
        x = x + w_down @ (silu(w_gate @ h) * (w_up @ h))     SwiGLU
    logits = output @ (rms_norm(x) * output_norm)           output = token_embd when the file has none (tied)

llama.cpp's converter permutes the rows of wq and wk (HF's rotate-half
layout to interleaved pairs), so RoPE's normal mode (pairs of adjacent
elements) is the right one for GGUF files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor
from pyggml.core.types import GGMLType
from pyggml.gguf.reader import GGUFFile
from pyggml.models.kv_cache import KVCache, KVWrite

LLAMA_ARCHS = ("llama",)
ROPE_MODE_NORMAL = 0


@dataclass(frozen=True)
class LlamaHParams:
    """llama.cpp's `llama_hparams` for the LLaMA architecture."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_rot: int
    f_norm_rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        """Width of K and V: n_head_kv heads of head_dim."""
        return self.head_dim * self.n_head_kv

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> LlamaHParams:
        """Read `llama.*` keys (raises GGUFError naming the file for an unsupported architecture,
        a missing key or inconsistent numbers)."""
        arch = gf.get("general.architecture", None)
        if arch not in LLAMA_ARCHS:
            raise GGUFError(f"'{gf.name}': unsupported architecture {arch!r} (supported: {', '.join(LLAMA_ARCHS)})")
        p = f"{arch}."
        n_embd = int(gf.get(p + "embedding_length"))
        n_head = int(gf.get(p + "attention.head_count"))
        n_head_kv = int(gf.get(p + "attention.head_count_kv", n_head))
        if n_head < 1 or n_embd % n_head:
            raise GGUFError(f"'{gf.name}': embedding_length {n_embd} is not a multiple of head_count {n_head}")
        if n_head_kv < 1 or n_head % n_head_kv:
            raise GGUFError(f"'{gf.name}': head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        if "token_embd.weight" in gf:
            n_vocab = int(gf.tensor("token_embd.weight").ne[1])
        else:
            n_vocab = len(gf.get("tokenizer.ggml.tokens"))
        scale = float(gf.get(p + "rope.scaling.factor", 0.0) or gf.get(p + "rope.scale_linear", 0.0) or 0.0)
        return cls(
            n_vocab=n_vocab,
            n_ctx_train=int(gf.get(p + "context_length", 2048)),
            n_embd=n_embd,
            n_layer=int(gf.get(p + "block_count")),
            n_ff=int(gf.get(p + "feed_forward_length")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_rot=int(gf.get(p + "rope.dimension_count", n_embd // n_head)),
            f_norm_rms_eps=float(gf.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            rope_freq_base=float(gf.get(p + "rope.freq_base", 10000.0)),
            rope_freq_scale=1.0 / scale if scale else 1.0,
        )


def tensor_names(hp: LlamaHParams, gf: GGUFFile | None = None) -> list[str]:
    """The tensors a LLaMA file holds, in llama.cpp's names (`output.weight` only if present)."""
    names = ["token_embd.weight", "output_norm.weight"]
    if gf is None or "output.weight" in gf:
        names.append("output.weight")
    for il in range(hp.n_layer):
        names += [f"blk.{il}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_norm", "ffn_gate", "ffn_down", "ffn_up")]
    return names


def layer_of(name: str) -> int | None:
    """The layer a tensor belongs to (`blk.<il>.`), or None for the input/output tensors."""
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return None


@dataclass
class LlamaInputs:
    """The graph's input tensors (set before computing) and its output."""

    tokens: Tensor  # I32 [n_tokens]
    pos: Tensor  # I32 [n_tokens]
    mask: Tensor  # F32 [n_kv, n_tokens]: 0 where a token sees a cell, -inf elsewhere
    logits: Tensor  # F32 [n_vocab, n_outputs]
    kv_writes: list[KVWrite]  # the CPY nodes storing this batch's K and V
    # per layer, the nodes built for it (views, reshapes and unnamed ones too): llama.cpp's scheduler puts
    # them on the layer's backend (ggml_backend_sched_set_node_backend), so that nodes without a weight
    # among their sources (kq, softmax, rope) do not go to the backend of the inputs (pos, mask)
    layer_nodes: list[list[Tensor]] = field(default_factory=list)


def build_llama(ctx: Context, hp: LlamaHParams, w: dict[str, Tensor], kv: KVCache, n_tokens: int,
                n_past: int, last_only: bool = False, n_kv: int | None = None) -> tuple[Graph, LlamaInputs]:
    """The graph of one batch: `n_tokens` tokens at positions n_past.., written to KV cells n_past..

    Attention reads cells 0..n_kv (default n_past + n_tokens; more is allowed, the mask hides
    cells a token must not see). `last_only` computes the logits of the last token only
    (generation needs no more).
    """
    if n_kv is None:
        n_kv = n_past + n_tokens
    if not n_past + n_tokens <= n_kv <= kv.n_ctx:
        raise ArgumentError(f"build_llama: n_kv {n_kv} must cover n_past {n_past} + n_tokens {n_tokens} "
                            f"and fit n_ctx {kv.n_ctx}")
    writes: list[KVWrite] = []
    head_dim, n_head, n_head_kv = hp.head_dim, hp.n_head, hp.n_head_kv
    eps = hp.f_norm_rms_eps
    gf = ctx.new_graph(graph_size(hp))

    tokens = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_tokens").set_input()
    pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_pos").set_input()
    mask = ctx.new_tensor_2d(GGMLType.F32, n_kv, n_tokens).set_name("KQ_mask").set_input()
    kq_scale = 1.0 / math.sqrt(head_dim)

    def rope(x: Tensor) -> Tensor:
        return ctx.rope_custom(x, pos, hp.n_rot, ROPE_MODE_NORMAL, 0, hp.n_ctx_train, hp.rope_freq_base,
                               hp.rope_freq_scale, 0.0, 1.0, 32.0, 1.0)

    x = ctx.get_rows(w["token_embd.weight"], tokens).set_name("inp_embd")
    layer_nodes: list[list[Tensor]] = []
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        first_tensor = len(ctx.tensors)
        inp_sa = x
        cur = ctx.mul(ctx.rms_norm(x, eps), w[b + "attn_norm.weight"]).set_name(f"attn_norm-{il}")

        # self-attention
        q = ctx.mul_mat(w[b + "attn_q.weight"], cur).set_name(f"Qcur-{il}")
        k = ctx.mul_mat(w[b + "attn_k.weight"], cur).set_name(f"Kcur-{il}")
        v = ctx.mul_mat(w[b + "attn_v.weight"], cur).set_name(f"Vcur-{il}")
        q = rope(ctx.reshape_3d(q, head_dim, n_head, n_tokens)).set_name(f"Qcur-rope-{il}")
        k = rope(ctx.reshape_3d(k, head_dim, n_head_kv, n_tokens)).set_name(f"Kcur-rope-{il}")
        writes += kv.store(ctx, gf, il, k, v, n_tokens, n_past)

        q = ctx.permute(q, 0, 2, 1, 3)  # [head_dim, n_tokens, n_head]
        keys = kv.k_view(ctx, il, n_kv, head_dim, n_head_kv).set_name(f"k-{il}")
        kq = ctx.mul_mat(keys, q).set_name(f"kq-{il}")  # [n_kv, n_tokens, n_head], KV heads broadcast (GQA)
        kq = ctx.soft_max_ext(kq, mask, kq_scale).set_name(f"kq_soft_max-{il}")
        values = kv.v_view(ctx, il, n_kv, head_dim, n_head_kv).set_name(f"v-{il}")
        kqv = ctx.mul_mat(values, kq).set_name(f"kqv-{il}")  # [head_dim, n_tokens, n_head]
        cur = ctx.cont_2d(ctx.permute(kqv, 0, 2, 1, 3), hp.n_embd, n_tokens).set_name(f"kqv_merged-{il}")
        cur = ctx.mul_mat(w[b + "attn_output.weight"], cur).set_name(f"attn_out-{il}")
        ffn_inp = ctx.add(cur, inp_sa).set_name(f"ffn_inp-{il}")

        # feed-forward (SwiGLU)
        cur = ctx.mul(ctx.rms_norm(ffn_inp, eps), w[b + "ffn_norm.weight"]).set_name(f"ffn_norm-{il}")
        up = ctx.mul_mat(w[b + "ffn_up.weight"], cur).set_name(f"ffn_up-{il}")
        gate = ctx.silu(ctx.mul_mat(w[b + "ffn_gate.weight"], cur)).set_name(f"ffn_silu-{il}")
        cur = ctx.mul_mat(w[b + "ffn_down.weight"], ctx.mul(gate, up)).set_name(f"ffn_out-{il}")
        x = ctx.add(cur, ffn_inp).set_name(f"l_out-{il}")
        layer_nodes.append([t for t in ctx.tensors[first_tensor:] if t.op != GGMLOp.NONE])

    if last_only and n_tokens > 1:
        x = ctx.view_2d(x, hp.n_embd, 1, x.nb[1], (n_tokens - 1) * x.nb[1]).set_name("last_token")
    cur = ctx.mul(ctx.rms_norm(x, eps), w["output_norm.weight"]).set_name("result_norm")
    head = w.get("output.weight", w["token_embd.weight"])  # tied embeddings when the file has no output
    logits = ctx.mul_mat(head, cur).set_name("result_output").set_output()
    gf.build_forward_expand(logits)
    return gf, LlamaInputs(tokens, pos, mask, logits, writes, layer_nodes)


def graph_size(hp: LlamaHParams) -> int:
    """Nodes + leafs a LLaMA graph needs at most (about 40 nodes and 25 leafs a layer)."""
    return max(2048, 96 * hp.n_layer + 64)
