"""LLaMA: hyperparameters from GGUF metadata and the compute graph as llama.cpp builds it.

The graph (llama.cpp's `build_llama` in today's idiom), for a batch of n_tokens
tokens at positions n_past.. reading n_kv cells of cache (the model pads n_kv
as llama.cpp: to a multiple of 256, at most n_ctx):

    x = token_embd[tokens]                                  GET_ROWS
    for each layer:
        h = rms_norm(x) * attn_norm
        q = rope(wq @ h), k = rope(wk @ h), v = wv @ h       RoPE normal mode, the file's freq base/scale
        cache[k_idxs], cache[v_idxs] = k, v                  SET_ROWS, the cells by index inputs
        a = softmax(K^T q * 1/sqrt(head_dim) + mask) V      GQA: each KV head serves n_head / n_head_kv heads;
                                                            FLASH_ATTN_EXT with `flash_attn`
        x = x + wo @ a
        h = rms_norm(x) * ffn_norm
        x = x + w_down @ swiglu(w_gate @ h, w_up @ h)         GLU SWIGLU (split)
    logits = output @ (rms_norm(x) * output_norm)           output = token_embd when the file has none (tied)

llama.cpp's converter permutes the rows of wq and wk (HF's rotate-half
layout to interleaved pairs), so RoPE's normal mode (pairs of adjacent
elements) is the right one for GGUF files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.ops.attention import flash_attn_ext_set_prec
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import GGMLType
from pyggml.gguf.reader import GGUFFile
from pyggml.models.kv_cache import KVCache
from pyggml.models.metadata import INT32_MAX, ModelFileError, gguf_type, read_float, read_int, read_str

LLAMA_ARCHS = ("llama",)
ROPE_MODE_NORMAL = 0


def _n_vocab(gf: GGUFFile) -> int:
    """llama.cpp's n_vocab: the length of the tokenizer's token list, else the rows of token_embd."""
    key = "tokenizer.ggml.tokens"
    found = gguf_type(gf, key)
    if found is not None:
        if found != "ARRAY of STRING":
            raise ModelFileError(f"'{gf.name}': '{key}' has GGUF type {found}, expected ARRAY of STRING")
        field = gf.get_field(key)
        data = getattr(field, "data", None)  # the gguf reader's element indices: the length without decoding
        n = len(data) if isinstance(data, list) else len(gf.get(key))
        if not 1 <= n <= INT32_MAX:
            raise ModelFileError(f"'{gf.name}': '{key}' has {n} tokens, the vocabulary needs 1..{INT32_MAX}")
        return n
    ne = gf.tensor("token_embd.weight").ne if "token_embd.weight" in gf else ()
    if len(ne) < 2 or ne[1] < 1:
        raise ModelFileError(f"'{gf.name}': n_vocab is unknown: '{key}' is missing and tensor 'token_embd.weight' "
                             + (f"has ne={list(ne)}" if "token_embd.weight" in gf else "is missing"))
    return int(ne[1])


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
        """Read and check the `llama.*` keys: each of its GGUF type (any integer type for counts,
        FLOAT32/FLOAT64 for the others) and in range; heads that divide the embedding, KV heads that
        divide the heads, RoPE dimensions even and within a head. Raises ModelFileError (a ModelError
        and a GGUFError) naming the file, the key and the value, or the type found and the one expected."""
        arch = read_str(gf, "general.architecture")
        if arch not in LLAMA_ARCHS:
            raise ModelFileError(f"'{gf.name}': unsupported architecture {arch!r} (supported: "
                                 f"{', '.join(LLAMA_ARCHS)})")
        p = f"{arch}."
        n_embd = read_int(gf, p + "embedding_length")
        n_head = read_int(gf, p + "attention.head_count")
        n_head_kv = read_int(gf, p + "attention.head_count_kv", n_head)
        if n_embd % n_head:
            raise ModelFileError(f"'{gf.name}': '{p}embedding_length' = {n_embd} is not a multiple of "
                                 f"'{p}attention.head_count' = {n_head}")
        if n_head % n_head_kv:
            raise ModelFileError(f"'{gf.name}': '{p}attention.head_count' = {n_head} is not a multiple of "
                                 f"'{p}attention.head_count_kv' = {n_head_kv}")
        head_dim = n_embd // n_head
        n_rot = read_int(gf, p + "rope.dimension_count", head_dim)
        if n_rot > head_dim:
            raise ModelFileError(f"'{gf.name}': '{p}rope.dimension_count' = {n_rot} is more than the head size "
                                 f"{head_dim} (embedding_length {n_embd} / head_count {n_head})")
        if n_rot % 2:
            raise ModelFileError(f"'{gf.name}': '{p}rope.dimension_count' = {n_rot} must be even (RoPE turns pairs)")
        # 0 (or absent) means no scaling, as in llama.cpp
        scale = read_float(gf, p + "rope.scaling.factor", 0.0, allow_zero=True) \
            or read_float(gf, p + "rope.scale_linear", 0.0, allow_zero=True)
        return cls(
            n_vocab=_n_vocab(gf),
            n_ctx_train=read_int(gf, p + "context_length", 2048),
            n_embd=n_embd,
            n_layer=read_int(gf, p + "block_count"),
            n_ff=read_int(gf, p + "feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_rot=n_rot,
            f_norm_rms_eps=read_float(gf, p + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_freq_base=read_float(gf, p + "rope.freq_base", 10000.0),
            rope_freq_scale=1.0 / scale if scale else 1.0,
        )


def expected_shapes(hp: LlamaHParams, with_output: bool = True) -> dict[str, tuple[tuple[int, ...], str]]:
    """The `ne` each tensor of a LLaMA file must have, and the hyper-parameters it is made of."""
    e, f, v, kv = hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_embd_gqa
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "token_embd.weight": ((e, v), "n_embd, n_vocab"), "output_norm.weight": ((e,), "n_embd")}
    if with_output:
        out["output.weight"] = ((e, v), "n_embd, n_vocab")
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        out.update({
            b + "attn_norm.weight": ((e,), "n_embd"), b + "attn_q.weight": ((e, e), "n_embd, n_embd"),
            b + "attn_k.weight": ((e, kv), "n_embd, n_embd_gqa"), b + "attn_v.weight": ((e, kv), "n_embd, n_embd_gqa"),
            b + "attn_output.weight": ((e, e), "n_embd, n_embd"), b + "ffn_norm.weight": ((e,), "n_embd"),
            b + "ffn_gate.weight": ((e, f), "n_embd, n_ff"), b + "ffn_down.weight": ((f, e), "n_ff, n_embd"),
            b + "ffn_up.weight": ((e, f), "n_embd, n_ff")})
    return out


def check_tensors(hp: LlamaHParams, gf: GGUFFile) -> list[str]:
    """The names of the tensors to load, each checked to be in `gf` with the shape the hyper-parameters
    give (trailing 1s aside), before any memory is taken; ModelFileError naming the tensor, its `ne`
    and the expected one otherwise."""
    shapes = expected_shapes(hp, "output.weight" in gf)
    for name, (want, made_of) in shapes.items():
        if name not in gf:
            raise ModelFileError(f"'{gf.name}': tensor '{name}' is missing (the hyper-parameters want ne="
                                 f"{list(want)}, [{made_of}]; {len(list(gf))} tensors in the file)")
        ne = tuple(gf.tensor(name).ne)
        pad = max(len(ne), len(want))
        if ne + (1,) * (pad - len(ne)) != want + (1,) * (pad - len(want)):
            raise ModelFileError(f"'{gf.name}': tensor '{name}' has ne={list(ne)}, the hyper-parameters want "
                                 f"{list(want)} ([{made_of}])")
    return list(shapes)


def tensor_names(hp: LlamaHParams, gf: GGUFFile | None = None) -> list[str]:
    """The tensors a LLaMA file holds, in llama.cpp's names (`output.weight` only if present)."""
    return list(expected_shapes(hp, gf is None or "output.weight" in gf))


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
    mask: Tensor  # F32 [n_kv, n_tokens] (F16 with flash attention): 0 where a token sees a cell, -inf elsewhere
    logits: Tensor  # F32 [n_vocab, n_outputs]
    k_idxs: Tensor | None  # I64 [n_tokens]: the K cache rows (cells) this batch goes to (None: CPY idiom)
    v_idxs: Tensor | None  # I64 [n_tokens] or [n_embd_gqa * n_tokens] (V transposed): the V cache rows
    kv_writes: list[Tensor]  # the SET_ROWS (or CPY) nodes storing this batch's K and V
    # per layer, the nodes built for it (views, reshapes and unnamed ones too): where a non-finite value
    # starts is named by layer
    layer_nodes: list[list[Tensor]] = field(default_factory=list)
    # (layer, node) of each layer's RMS_NORMs ("norm-<il>", as llama.cpp names them): the model pins them to
    # the layer's backend, as llama.cpp's graph callback does, else the scheduler leaves a layer's first norm
    # on the previous layer's backend and copies both the residual and its norm
    norms: list[tuple[int, Tensor]] = field(default_factory=list)


def build_llama(ctx: Context, hp: LlamaHParams, w: dict[str, Tensor], kv: KVCache, n_tokens: int,
                n_past: int, last_only: bool = False, n_kv: int | None = None,
                flash_attn: bool = False, set_rows: bool = False, glu: bool = False) -> tuple[Graph, LlamaInputs]:
    """The graph of one batch: `n_tokens` tokens at positions n_past.., written to the KV cells the index
    inputs name (n_past.. as `kv.k_idxs` / `kv.v_idxs` give them).

    Attention reads cells 0..n_kv (default n_past + n_tokens; more is allowed, the mask hides
    cells a token must not see). `last_only` computes the logits of the last token only
    (generation needs no more). `flash_attn` computes attention with FLASH_ATTN_EXT (F16 mask, F32
    accumulators), which needs a cache whose V is not transposed (`kv.v_trans` False). `set_rows` writes
    K and V by SET_ROWS through I64 index inputs, `glu` computes SwiGLU by GLU (today's idiom, what `Model`
    builds where its backends compute them); without them (the default, for callers that set only tokens,
    positions and mask) the 2023 idiom: KV writes by CPY into views at n_past, SwiGLU as SILU and MUL.
    """
    if n_kv is None:
        n_kv = n_past + n_tokens
    if not n_past + n_tokens <= n_kv <= kv.n_ctx:
        raise ArgumentError(f"build_llama: n_kv {n_kv} must cover n_past {n_past} + n_tokens {n_tokens} "
                            f"and fit n_ctx {kv.n_ctx}")
    writes: list[Tensor] = []
    head_dim, n_head, n_head_kv = hp.head_dim, hp.n_head, hp.n_head_kv
    eps = hp.f_norm_rms_eps
    gf = ctx.new_graph(graph_size(hp))

    tokens = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_tokens").set_input()
    pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_pos").set_input()
    if flash_attn == kv.v_trans:
        raise ArgumentError(f"build_llama: flash_attn={flash_attn} needs a KV cache with v_trans={not flash_attn}")
    mask_type = GGMLType.F16 if flash_attn else GGMLType.F32
    mask = ctx.new_tensor_2d(mask_type, n_kv, n_tokens).set_name("KQ_mask").set_input()
    k_idxs: Tensor | None = None
    v_idxs: Tensor | None = None
    if set_rows:
        k_idxs = ctx.new_tensor_1d(GGMLType.I64, n_tokens).set_name("inp_k_idxs").set_input()
        n_v_idxs = n_tokens * hp.n_embd_gqa if kv.v_trans else n_tokens
        v_idxs = ctx.new_tensor_1d(GGMLType.I64, n_v_idxs).set_name("inp_v_idxs").set_input()
    kq_scale = 1.0 / math.sqrt(head_dim)

    def rope(x: Tensor) -> Tensor:
        return ctx.rope_ext(x, pos, None, hp.n_rot, ROPE_MODE_NORMAL, hp.n_ctx_train, hp.rope_freq_base,
                            hp.rope_freq_scale, 0.0, 1.0, 32.0, 1.0)

    x = ctx.get_rows(w["token_embd.weight"], tokens).set_name("inp_embd")
    layer_nodes: list[list[Tensor]] = []
    norms: list[tuple[int, Tensor]] = []
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        first_tensor = len(ctx.tensors)
        inp_sa = x
        norm = ctx.rms_norm(x, eps).set_name(f"norm-{il}")
        norms.append((il, norm))
        cur = ctx.mul(norm, w[b + "attn_norm.weight"]).set_name(f"attn_norm-{il}")

        # self-attention
        q = ctx.mul_mat(w[b + "attn_q.weight"], cur).set_name(f"Qcur-{il}")
        k = ctx.mul_mat(w[b + "attn_k.weight"], cur).set_name(f"Kcur-{il}")
        v = ctx.mul_mat(w[b + "attn_v.weight"], cur).set_name(f"Vcur-{il}")
        q = rope(ctx.reshape_3d(q, head_dim, n_head, n_tokens)).set_name(f"Qcur-rope-{il}")
        k = rope(ctx.reshape_3d(k, head_dim, n_head_kv, n_tokens)).set_name(f"Kcur-rope-{il}")
        if k_idxs is not None and v_idxs is not None:
            writes += kv.store(ctx, gf, il, k, v, n_tokens, k_idxs, v_idxs)
        else:
            writes += kv.store_cpy(ctx, gf, il, k, v, n_tokens, n_past)

        q = ctx.permute(q, 0, 2, 1, 3)  # [head_dim, n_tokens, n_head]
        keys = kv.k_view(ctx, il, n_kv, head_dim, n_head_kv).set_name(f"k-{il}")
        values = kv.v_view(ctx, il, n_kv, head_dim, n_head_kv).set_name(f"v-{il}")
        if flash_attn:
            kqv = ctx.flash_attn_ext(q, keys, values, mask, kq_scale).set_name(f"fattn-{il}")
            flash_attn_ext_set_prec(kqv, Prec.F32)
            cur = ctx.reshape_2d(kqv, hp.n_embd, n_tokens).set_name(f"kqv_merged-{il}")  # [head_dim, n_head, n_tokens]
        else:
            kq = ctx.mul_mat(keys, q).set_name(f"kq-{il}")  # [n_kv, n_tokens, n_head], KV heads broadcast (GQA)
            kq = ctx.soft_max_ext(kq, mask, kq_scale).set_name(f"kq_soft_max-{il}")
            kqv = ctx.mul_mat(values, kq).set_name(f"kqv-{il}")  # [head_dim, n_tokens, n_head]
            cur = ctx.cont_2d(ctx.permute(kqv, 0, 2, 1, 3), hp.n_embd, n_tokens).set_name(f"kqv_merged-{il}")
        cur = ctx.mul_mat(w[b + "attn_output.weight"], cur).set_name(f"attn_out-{il}")
        ffn_inp = ctx.add(cur, inp_sa).set_name(f"ffn_inp-{il}")

        # feed-forward (SwiGLU)
        norm = ctx.rms_norm(ffn_inp, eps).set_name(f"norm-{il}")
        norms.append((il, norm))
        cur = ctx.mul(norm, w[b + "ffn_norm.weight"]).set_name(f"ffn_norm-{il}")
        up = ctx.mul_mat(w[b + "ffn_up.weight"], cur).set_name(f"ffn_up-{il}")
        gate = ctx.mul_mat(w[b + "ffn_gate.weight"], cur).set_name(f"ffn_gate-{il}")
        if glu:
            cur = ctx.swiglu_split(gate, up).set_name(f"ffn_swiglu-{il}")
        else:
            cur = ctx.mul(ctx.silu(gate).set_name(f"ffn_silu-{il}"), up)
        cur = ctx.mul_mat(w[b + "ffn_down.weight"], cur).set_name(f"ffn_out-{il}")
        x = ctx.add(cur, ffn_inp).set_name(f"l_out-{il}")
        layer_nodes.append([t for t in ctx.tensors[first_tensor:] if t.op != GGMLOp.NONE])

    if last_only and n_tokens > 1:
        x = ctx.view_2d(x, hp.n_embd, 1, x.nb[1], (n_tokens - 1) * x.nb[1]).set_name("last_token")
    cur = ctx.mul(ctx.rms_norm(x, eps), w["output_norm.weight"]).set_name("result_norm")
    head = w.get("output.weight", w["token_embd.weight"])  # tied embeddings when the file has no output
    logits = ctx.mul_mat(head, cur).set_name("result_output").set_output()
    gf.build_forward_expand(logits)
    return gf, LlamaInputs(tokens, pos, mask, logits, k_idxs, v_idxs, writes, layer_nodes, norms)


def graph_size(hp: LlamaHParams) -> int:
    """Nodes + leafs a LLaMA graph needs at most (about 40 nodes and 25 leafs a layer)."""
    return max(2048, 96 * hp.n_layer + 64)
